//! Operator actions: resend a dispatch, resolve PUBLISH_UNKNOWN, cancel (§4.15–§4.17).
use super::prelude::*;

v1_operation! {
    post "/v1/runs/{run_id}/dispatches/{dispatch_id}/resend", "Resend a DEAD or SENT dispatch; no body.",
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)"), ("dispatch_id" = String, Path, description = "dispatch UUID")],
    ok = [ledger::ResendOutcome];
    pub async fn resend_dispatch(
        State(s): State<AppState>,
        c: OperatorCaller,
        req: Request,
    ) -> ApiResult<ResendOutcome> {
        let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
        let run_id = input.run_id();
        let dispatch_id = input.dispatch_id();
        input.problems.check()?;
        Ok(Json(
            s.0.ledger
                .resend_dispatch(run_id, dispatch_id, &c.0.actor())
                .await?,
        ))
    }
}

v1_operation! {
    post "/v1/runs/{run_id}/publish-unknown/resolve", "Resolve PUBLISH_UNKNOWN.",
    request_body = [crate::bodies::ResolveBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::StatusChange];
    pub async fn resolve_publish_unknown(
        State(s): State<AppState>,
        c: OperatorCaller,
        req: Request,
    ) -> ApiResult<StatusChange> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let body = input.with_body(requests::resolution).flatten();
        input.problems.check()?;
        let (resolution, reason) = body.expect("validated");
        Ok(Json(
            s.0.ledger
                .resolve_publish_unknown(run_id, resolution, &reason, &c.0.actor(), None)
                .await?,
        ))
    }
}

v1_operation! {
    post "/v1/runs/{run_id}/cancel", "Cancel a run.",
    request_body = [crate::bodies::CancelBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::CancelOutcome];
    pub async fn cancel_run(
        State(s): State<AppState>,
        c: OperatorCaller,
        req: Request,
    ) -> ApiResult<CancelOutcome> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let reason = input.with_body(requests::reason);
        input.problems.check()?;
        Ok(Json(
            s.0.ledger
                .cancel_run(run_id, &reason.expect("validated"), &c.0.actor(), None)
                .await?,
        ))
    }
}

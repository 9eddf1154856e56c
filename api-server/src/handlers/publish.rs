//! Publish: claim and result (§4.12, §4.13).
use super::prelude::*;

v1_operation! {
    post "/v1/runs/{run_id}/publish/claim", "Claim the publish.",
    request_body = [crate::bodies::PublishClaimBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::PublishClaim];
    pub async fn claim_publish(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<PublishClaim> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let token = input.with_body(requests::publish_token);
        input.problems.check()?;
        Ok(Json(
            s.0.ledger
                .claim_publish(run_id, token.expect("validated"))
                .await?,
        ))
    }
}

v1_operation! {
    post "/v1/runs/{run_id}/publish/result", "Report the publish outcome.",
    request_body = [crate::bodies::PublishResultBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::StatusChange];
    pub async fn publish_result(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<StatusChange> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let body = input.with_body(requests::publish_result).flatten();
        input.problems.check()?;
        let r = body.expect("validated");
        Ok(Json(
            s.0.ledger
                .publish_result(
                    run_id,
                    r.token,
                    r.outcome,
                    r.error_code.as_deref(),
                    &r.message,
                )
                .await?,
        ))
    }
}

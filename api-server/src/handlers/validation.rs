//! Validation: start, metrics, the stage and target verdicts (§4.9–§4.11, §4.14, §4.21).
use super::prelude::*;

v1_operation! {
    post "/v1/runs/{run_id}/validation/start", "Start stage validation; acknowledges the dispatch.",
    request_body = [crate::bodies::ValidationStartBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::StartOutcome];
    pub async fn start_validation(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<StartOutcome> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let body = input.with_body(requests::validation_start);
        input.problems.check()?;
        let (dispatch_id, node) = body.expect("validated");
        Ok(Json(
            s.0.ledger
                .start_validation(run_id, dispatch_id, &node)
                .await?,
        ))
    }
}

v1_operation! {
    post "/v1/runs/{run_id}/validations", "Store STAGING or TARGET metrics.",
    request_body = [crate::bodies::MetricsBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::MetricsRecorded];
    pub async fn store_metrics(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<MetricsRecorded> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let body = input.with_body(requests::metrics).flatten();
        input.problems.check()?;
        let (stage, version, items) = body.expect("validated");
        Ok(Json(
            s.0.ledger
                .store_metrics(run_id, stage, &version, &items)
                .await?,
        ))
    }
}

v1_operation! {
    get "/v1/runs/{run_id}/validations", "Stored metrics.",
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [crate::bodies::MetricList];
    pub async fn list_metrics(
        State(s): State<AppState>,
        _c: ReadCaller,
        req: Request,
    ) -> ApiResult<crate::bodies::MetricList> {
        let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
        let run_id = input.run_id();
        input.problems.check()?;
        Ok(Json(crate::bodies::MetricList {
            metrics: s.0.ledger.metrics(run_id).await?,
        }))
    }
}

v1_operation! {
    post "/v1/runs/{run_id}/stage-validated", "Judge the STAGING metrics; no body.",
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::StageVerdict];
    pub async fn stage_validated(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<StageVerdict> {
        let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
        let run_id = input.run_id();
        input.problems.check()?;
        Ok(Json(s.0.ledger.stage_validated(run_id).await?))
    }
}

v1_operation! {
    post "/v1/runs/{run_id}/success", "Judge the TARGET metrics and finish.",
    request_body = [crate::bodies::SuccessBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::SuccessVerdict];
    pub async fn succeed(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<SuccessVerdict> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let target_count = input.with_body(requests::success);
        input.problems.check()?;
        Ok(Json(
            s.0.ledger.succeed(run_id, target_count.flatten()).await?,
        ))
    }
}

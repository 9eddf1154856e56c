//! Runs: create, list, read, manifest, stage failure, events (§4.1–§4.5, §4.22).
use super::prelude::*;

v1_operation! {
    post "/v1/runs", "Create a run.",
    request_body = [crate::bodies::CreateRunBody],
    ok = [ledger::CreatedRun];
    pub async fn create_run(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<CreatedRun> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let new_run = input.with_body(requests::create_run);
        input.problems.check()?;
        Ok(Json(
            s.0.ledger.create_run(&new_run.expect("validated")).await?,
        ))
    }
}

v1_operation! {
    get "/v1/runs", "List runs, newest first.",
    params = [("jobKey" = Option<String>, Query), ("businessKey" = Option<String>, Query), ("status" = Option<String>, Query), ("limit" = Option<i64>, Query, minimum = 1, maximum = 500)],
    ok = [Vec<ledger::RunSummary>];
    pub async fn list_runs(
        State(s): State<AppState>,
        _c: ReadCaller,
        req: Request,
    ) -> ApiResult<Vec<ledger::RunSummary>> {
        let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
        let filter = requests::run_filter(&input.query, &mut input.problems);
        input.problems.check()?;
        Ok(Json(s.0.ledger.list_runs(&filter).await?))
    }
}

v1_operation! {
    get "/v1/runs/{run_id}", "Run detail with partitions and dispatches.",
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::RunDetail];
    pub async fn run_detail(
        State(s): State<AppState>,
        _c: ReadCaller,
        req: Request,
    ) -> ApiResult<ledger::RunDetail> {
        let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
        let run_id = input.run_id();
        input.problems.check()?;
        Ok(Json(s.0.ledger.run_detail(run_id).await?))
    }
}

v1_operation! {
    post "/v1/runs/{run_id}/manifest", "Register the manifest.",
    request_body = [crate::bodies::ManifestBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::ManifestOutcome];
    pub async fn register_manifest(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<ManifestOutcome> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let manifest = input.with_body(requests::manifest);
        input.problems.check()?;
        Ok(Json(
            s.0.ledger
                .register_manifest(run_id, &manifest.expect("validated"))
                .await?,
        ))
    }
}

v1_operation! {
    post "/v1/runs/{run_id}/fail", "Non-partition stage failure.",
    request_body = [crate::bodies::RunFailBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::RunFailOutcome];
    pub async fn fail_run(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<RunFailOutcome> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let failure = input.with_body(requests::run_failure).flatten();
        input.problems.check()?;
        Ok(Json(
            s.0.ledger
                .fail_run(run_id, &failure.expect("validated"))
                .await?,
        ))
    }
}

v1_operation! {
    get "/v1/runs/{run_id}/events", "Event timeline, oldest first.",
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)"), ("limit" = Option<i64>, Query, minimum = 1, maximum = 1000)],
    ok = [crate::bodies::EventList];
    pub async fn run_events(
        State(s): State<AppState>,
        _c: ReadCaller,
        req: Request,
    ) -> ApiResult<crate::bodies::EventList> {
        let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
        let run_id = input.run_id();
        let limit = requests::query_int(&input.query, "limit", 1, 1000, 200, &mut input.problems);
        input.problems.check()?;
        Ok(Json(crate::bodies::EventList {
            events: s.0.ledger.run_events(run_id, limit).await?,
        }))
    }
}

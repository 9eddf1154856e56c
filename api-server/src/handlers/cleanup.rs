//! PG-70's cleanup: candidates and records (§4.18, §4.19).
use super::prelude::*;

v1_operation! {
    get "/v1/cleanup/candidates", "Runs due for cleanup.",
    params = [("jobKey" = Option<String>, Query), ("limit" = Option<i64>, Query, minimum = 1, maximum = 500)],
    ok = [crate::bodies::CandidateList];
    pub async fn cleanup_candidates(
        State(s): State<AppState>,
        _c: ReadCaller,
        req: Request,
    ) -> ApiResult<crate::bodies::CandidateList> {
        let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
        let job_key = requests::query_job_key(&input.query, &mut input.problems);
        let limit = requests::query_int(&input.query, "limit", 1, 500, 50, &mut input.problems);
        input.problems.check()?;
        Ok(Json(crate::bodies::CandidateList {
            runs: s
                .0
                .ledger
                .cleanup_candidates(job_key.as_deref(), limit)
                .await?,
        }))
    }
}

v1_operation! {
    post "/v1/runs/{run_id}/cleanup", "Record a cleanup.",
    request_body = [crate::bodies::CleanupBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")],
    ok = [ledger::CleanupRecorded];
    pub async fn record_cleanup(
        State(s): State<AppState>,
        c: ReadCaller,
        req: Request,
    ) -> ApiResult<ledger::CleanupRecorded> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let body = input.with_body(requests::cleanup_report);
        input.problems.check()?;
        let (table, path) = body.expect("validated");
        let actor = (c.0.role == Role::Operator).then(|| c.0.actor());
        Ok(Json(
            s.0.ledger
                .record_cleanup(run_id, table.as_deref(), path.as_deref(), actor.as_ref())
                .await?,
        ))
    }
}

//! Partitions: claim, chunk report, final failure (§4.6–§4.8).
use super::prelude::*;

v1_operation! {
    post "/v1/runs/{run_id}/partitions/{partition_id}/claim", "Claim a partition.",
    request_body = [crate::bodies::ClaimBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)"), ("partition_id" = String, Path, description = "4 digits or NULL")],
    ok = [ledger::ClaimOutcome];
    pub async fn claim_partition(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<ClaimOutcome> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let pid = input.partition_id();
        let claim = input.with_body(requests::claim);
        input.problems.check()?;
        let (token, worker) = claim.expect("validated");
        Ok(Json(
            s.0.ledger
                .claim_partition(run_id, &pid, token, &worker)
                .await?,
        ))
    }
}

v1_operation! {
    post "/v1/runs/{run_id}/partitions/{partition_id}/chunks", "Chunk report.",
    request_body = [crate::bodies::ChunkBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)"), ("partition_id" = String, Path, description = "4 digits or NULL")],
    ok = [ledger::ChunkOutcome];
    pub async fn report_chunk(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<ChunkOutcome> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let pid = input.partition_id();
        let report = input.with_body(requests::chunk);
        input.problems.check()?;
        let report = report.expect("validated")?;
        let outcome = s.0.ledger.report_chunk(run_id, &pid, &report).await?;
        s.0.metrics.chunk_report(outcome.result);
        Ok(Json(outcome))
    }
}

v1_operation! {
    post "/v1/runs/{run_id}/partitions/{partition_id}/fail", "Final partition failure.",
    request_body = [crate::bodies::PartitionFailBody],
    params = [("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)"), ("partition_id" = String, Path, description = "4 digits or NULL")],
    ok = [ledger::PartitionFailOutcome];
    pub async fn fail_partition(
        State(s): State<AppState>,
        _c: NifiCaller,
        req: Request,
    ) -> ApiResult<PartitionFailOutcome> {
        let mut input = Input::read(&s, req, BodyMode::Json).await?;
        let run_id = input.run_id();
        let pid = input.partition_id();
        let failure = input.with_body(requests::partition_failure);
        input.problems.check()?;
        Ok(Json(
            s.0.ledger
                .fail_partition(run_id, &pid, &failure.expect("validated"))
                .await?,
        ))
    }
}

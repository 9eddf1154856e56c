//! `POST /v1/runs/{run_id}/partitions/{partition_id}/chunks` (CONTRACT §4.7, §5.3): record a chunk,
//! judge the partition with the chunk gate, and complete the extraction exactly once.
//!
//! Reports hold the run row FOR KEY SHARE so that reports of sibling partitions never wait for each
//! other; a verdict that ends the run rolls back and re-runs under FOR UPDATE (§5.3 rule 6).
use super::claim::parse_run_status;
use super::transition::{ErrorFields, transition_locked};
use crate::error::{LedgerError, Result};
use crate::event::{Event, Level};
use crate::functions::ReportChunkOutcome;
use crate::run_lock::run_lock_key;
use crate::status::{PartitionStatus, RunStatus};
use crate::store::Ledger;
use crate::transactions::{alone, transaction};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct ChunkReport {
    pub claim_token: Uuid,
    pub chunk_index: i32,
    pub chunk_count: i32,
    pub fragment_identifier: Option<String>,
    pub hdfs_path: String,
    pub record_count: i64,
    pub byte_count: Option<i64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ChunkOutcome {
    pub recorded: bool,
    pub partition_status: PartitionStatus,
    pub run_status: RunStatus,
    pub received_chunks: i64,
    pub chunk_count: i32,
    pub validation_scheduled: bool,
    /// How the report was counted (`lca_chunk_reports_total{result}`); not part of the response.
    #[serde(skip)]
    pub result: ChunkResult,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkResult {
    Progress,
    Ignored,
    PartitionSuccess,
    RunComplete,
    Failed,
}

impl ChunkResult {
    pub fn as_str(self) -> &'static str {
        match self {
            ChunkResult::Progress => "progress",
            ChunkResult::Ignored => "ignored",
            ChunkResult::PartitionSuccess => "partition_success",
            ChunkResult::RunComplete => "run_complete",
            ChunkResult::Failed => "failed",
        }
    }
}

/// What `nifi_ops.report_chunk_v2` answers (ledger/functions/report_chunk_v2.sql): the whole
/// report, §4.7 steps 2–9 and the completion, decided in the one statement.
#[derive(sqlx::FromRow)]
struct ReportedChunk {
    outcome: ReportChunkOutcome,
    partition_status: Option<String>,
    /// The run's status read after the run and partition locks were granted (what the report
    /// decides on and answers; `nifi_ops.claim_partition_v2` says why), or as the decision left it.
    run_status: Option<String>,
    files: Option<i64>,
    /// The gate's mismatch (MISMATCH).
    gate_message: Option<String>,
    lock_wait_seconds: f64,
}

/// The ids of what a decision writes, chosen before the first attempt and sent again with every
/// repeat: a repeat that finds its own PARTITION_SUCCESS stored is answered as that decision.
struct DecisionIds {
    success_event: Uuid,
    dispatch: Uuid,
    extracted_event: Uuid,
}

impl DecisionIds {
    fn new() -> Self {
        DecisionIds {
            success_event: Uuid::now_v7(),
            dispatch: super::dispatch::new_dispatch_id(),
            extracted_event: Uuid::now_v7(),
        }
    }
}

/// How the report holds its run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Holding {
    /// Nothing yet: the function takes the shared lock itself, in its own statement.
    Nothing,
    /// The caller's transaction holds the run FOR UPDATE and fails the partition on MISMATCH.
    Exclusive,
}

/// SQLSTATE of `nifi_ops.report_chunk_v2` when the run left EXTRACTING under its shared lock: the
/// statement undid everything, decide under the exclusive lock.
const LEFT_EXTRACTING: &str = "LC001";

async fn call_report_chunk(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    pid: &str,
    r: &ChunkReport,
    holding: Holding,
    ids: &DecisionIds,
) -> Result<ReportedChunk> {
    let (k1, k2) = run_lock_key(run_id);
    let rec: ReportedChunk = sqlx::query_as(
        "SELECT outcome::text AS outcome, partition_status, run_status, files, gate_message, lock_wait_seconds \
           FROM nifi_ops.report_chunk_v2($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
    )
    .bind(run_id)
    .bind(pid)
    .bind(r.claim_token)
    .bind(r.chunk_index)
    .bind(r.chunk_count)
    .bind(&r.fragment_identifier)
    .bind(&r.hdfs_path)
    .bind(r.record_count)
    .bind(r.byte_count)
    .bind(k1)
    .bind(k2)
    .bind(holding == Holding::Exclusive)
    .bind(ids.success_event)
    .bind(ids.dispatch)
    .bind(ids.extracted_event)
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| match &e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some(LEFT_EXTRACTING) => {
            LedgerError::Escalate
        }
        _ => e.into(),
    })?;
    Ok(rec)
}

impl ReportedChunk {
    /// The refusals and the escalation as errors; what the report decided otherwise.
    fn decided(self) -> Result<ReportedChunk> {
        match self.outcome {
            ReportChunkOutcome::RunNotFound => Err(LedgerError::RunNotFound),
            ReportChunkOutcome::PartitionNotFound => Err(LedgerError::PartitionNotFound),
            ReportChunkOutcome::ClaimMismatch => Err(LedgerError::ClaimMismatch),
            ReportChunkOutcome::HdfsPathOutsideRun => Err(LedgerError::HdfsPathOutsideRun),
            ReportChunkOutcome::Conflict => Err(LedgerError::ChunkConflict),
            ReportChunkOutcome::Escalate => Err(LedgerError::Escalate),
            ReportChunkOutcome::Recorded
            | ReportChunkOutcome::Mismatch
            | ReportChunkOutcome::PartitionSuccess
            | ReportChunkOutcome::RunComplete => Ok(self),
        }
    }

    /// The answer, for every outcome but MISMATCH (which the caller's transaction goes on to
    /// decide).
    fn answer(&self, r: &ChunkReport) -> Result<ChunkOutcome> {
        let corrupt = || LedgerError::Corrupt("report_chunk statuses".into());
        let part = self.partition_status.as_deref().ok_or_else(corrupt)?;
        let partition_status = PartitionStatus::parse(part)
            .ok_or_else(|| LedgerError::Corrupt(format!("partition status {part}")))?;
        let run_status = parse_run_status(self.run_status.as_deref().ok_or_else(corrupt)?)?;
        let result = match self.outcome {
            ReportChunkOutcome::PartitionSuccess => ChunkResult::PartitionSuccess,
            ReportChunkOutcome::RunComplete => ChunkResult::RunComplete,
            _ if run_status == RunStatus::Extracting
                && partition_status == PartitionStatus::Running =>
            {
                ChunkResult::Progress
            }
            // Recorded only: late chunks still count for cleanup accounting.
            _ => ChunkResult::Ignored,
        };
        Ok(ChunkOutcome {
            recorded: true,
            partition_status,
            run_status,
            received_chunks: self.files.unwrap_or_default(),
            chunk_count: r.chunk_count,
            validation_scheduled: result == ChunkResult::RunComplete,
            result,
        })
    }
}

impl Ledger {
    pub async fn report_chunk(
        &self,
        run_id: Uuid,
        pid: &str,
        r: &ChunkReport,
    ) -> Result<ChunkOutcome> {
        if r.chunk_index >= r.chunk_count {
            return Err(LedgerError::ChunkIndexOutOfRange);
        }
        let ids = DecisionIds::new();
        match self.report_chunk_alone(run_id, pid, r, &ids).await {
            Err(LedgerError::Escalate) => {
                transaction!(self, |conn| self
                    .report_chunk_exclusive(conn, run_id, pid, r))
            }
            other => other,
        }
    }

    /// The report in one round trip (`nifi_ops.report_chunk_v2` on its own is one statement, hence
    /// one transaction), whatever it decides, but a gate mismatch: that fails the run, which only
    /// the run's exclusive lock may (`Escalate`, nothing written).
    ///
    /// Retried like a transaction on a deadlock or a serialization failure, and on a lost
    /// connection: unlike a BEGIN, this statement may have committed before its connection was
    /// lost, and that is safe to repeat, since a report is idempotent (the replay finds its chunk
    /// stored as sent, writes nothing and answers the state, which NiFi's own retries rely on), and
    /// the repeat of a decision is answered as that decision (`DecisionIds`).
    async fn report_chunk_alone(
        &self,
        run_id: Uuid,
        pid: &str,
        r: &ChunkReport,
        ids: &DecisionIds,
    ) -> Result<ChunkOutcome> {
        let rec = alone!(self, |conn| call_report_chunk(
            conn,
            run_id,
            pid,
            r,
            Holding::Nothing,
            ids
        ))?;
        // One observation per report, refused ones included: a report that escalates is
        // observed by its transaction's run lock.
        if rec.outcome != ReportChunkOutcome::Escalate
            && let Some(o) = &self.lock_wait
        {
            o.observe(rec.lock_wait_seconds);
        }
        rec.decided()?.answer(r)
    }

    /// The report under the run's exclusive lock, in a transaction: after a gate mismatch, which
    /// fails the partition and the run here (§5.3 rule 6).
    async fn report_chunk_exclusive(
        &self,
        conn: &mut sqlx::PgConnection,
        run_id: Uuid,
        pid: &str,
        r: &ChunkReport,
    ) -> Result<ChunkOutcome> {
        let run = self.lock_run_timed(conn, run_id).await?;
        // Fresh ids: a transaction that did not commit wrote none of them; the success's event is
        // this transaction's witness should its COMMIT's answer be lost.
        let ids = DecisionIds {
            success_event: Event::id_of_commit(),
            ..DecisionIds::new()
        };
        let rec = call_report_chunk(conn, run_id, pid, r, Holding::Exclusive, &ids)
            .await?
            .decided()?;
        if rec.outcome != ReportChunkOutcome::Mismatch {
            return rec.answer(r);
        }
        let text = rec
            .gate_message
            .as_deref()
            .ok_or_else(|| LedgerError::Corrupt("gate mismatch without a message".into()))?;
        self.partition_mismatched(conn, &run, pid, text).await?;
        Ok(ChunkOutcome {
            recorded: true,
            partition_status: PartitionStatus::Failed,
            run_status: RunStatus::FailedExtract,
            received_chunks: rec.files.unwrap_or_default(),
            chunk_count: r.chunk_count,
            validation_scheduled: false,
            result: ChunkResult::Failed,
        })
    }

    /// Gate mismatch, written only under the run row's FOR UPDATE (§5.3 rule 6).
    async fn partition_mismatched(
        &self,
        conn: &mut sqlx::PgConnection,
        run: &crate::run_lock::RunRow,
        pid: &str,
        text: &str,
    ) -> Result<()> {
        super::partition_fail::partition_failed(
            conn,
            run.run_id,
            pid,
            "ROW_COUNT_MISMATCH",
            Some(text),
        )
        .await?;
        Event::new(Level::Error, "PARTITION_FAILED")
            .run(run)
            .partition(pid)
            .code("ROW_COUNT_MISMATCH")
            .message(text)
            .insert(conn)
            .await?;
        let run_message = format!("partition {pid}: {text}");
        let end = (
            RunStatus::FailedExtract,
            ErrorFields::Set {
                stage: "PARTITION_GATE",
                code: "ROW_COUNT_MISMATCH",
                message: &run_message,
            },
        );
        let aborted =
            transition_locked(conn, run.run_id, RunStatus::Extracting, end.0, end.1).await?;
        Event::new(Level::Error, "RUN_FAILED")
            .run(run)
            .partition(pid)
            .code("ROW_COUNT_MISMATCH")
            .message(&run_message)
            .details(json!({"stage": "PARTITION_GATE", "from": RunStatus::Extracting, "to": RunStatus::FailedExtract}))
            .aborted(aborted)
            .insert(conn)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ChunkResult;

    /// The values of `lca_chunk_reports_total`'s `result` label (CONTRACT §9.1): dashboards and
    /// alerts select on them.
    #[test]
    fn chunk_results_are_the_metric_labels_of_the_contract() {
        let labels: Vec<&str> = [
            ChunkResult::Progress,
            ChunkResult::Ignored,
            ChunkResult::PartitionSuccess,
            ChunkResult::RunComplete,
            ChunkResult::Failed,
        ]
        .into_iter()
        .map(ChunkResult::as_str)
        .collect();
        assert_eq!(
            labels,
            [
                "progress",
                "ignored",
                "partition_success",
                "run_complete",
                "failed"
            ]
        );
    }
}

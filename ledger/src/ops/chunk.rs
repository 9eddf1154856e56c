//! `POST /v1/runs/{run_id}/partitions/{partition_id}/chunks` (CONTRACT §4.7, §5.3): record a chunk,
//! judge the partition with the chunk gate, and complete the extraction exactly once.
//!
//! Reports hold the run row FOR KEY SHARE so that reports of sibling partitions never wait for each
//! other; a verdict that ends the run rolls back and re-runs under FOR UPDATE (§5.3 rule 6).
use super::claim::parse_run_status;
use super::complete::complete_extraction;
use super::transition::{ErrorFields, transition_locked};
use crate::error::{LedgerError, Result};
use crate::event::{Event, Level};
use crate::gate::{ChunkAggregate, GateVerdict, gate_due, judge_chunk_gate};
use crate::status::{PartitionStatus, RunStatus};
use crate::store::{Ledger, RunLock, alone, run_lock_key, transaction};
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

/// What `nifi_ops.record_chunk` answers (migration `20261203000011`): §4.7 steps 2–8, the
/// checks, the write and the partition's aggregate with this chunk.
#[derive(sqlx::FromRow)]
struct RecordedChunk {
    /// RUN_NOT_FOUND, PARTITION_NOT_FOUND, CLAIM_MISMATCH, HDFS_PATH_OUTSIDE_RUN, DECIDE or RECORDED.
    outcome: String,
    partition_status: Option<String>,
    /// The run's status read after the run and partition locks were granted (what the report
    /// decides on and answers; `nifi_ops.claim_partition` says why).
    run_status: Option<String>,
    expected_row_count: Option<i64>,
    /// The chunk was new, or differs from the stored one (a conflict once the partition is done).
    changed: Option<bool>,
    files: Option<i64>,
    lo: Option<i32>,
    hi: Option<i32>,
    rows_sum: Option<String>,
    bytes_sum: Option<String>,
    distinct_counts: Option<i64>,
    lock_wait_seconds: f64,
}

/// How `nifi_ops.record_chunk` is asked to run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Recording {
    /// On its own (autocommit): it takes the run lock itself, and answers DECIDE, writing
    /// nothing, when the report needs a decision.
    Alone,
    /// Inside the caller's transaction, which holds the run lock and decides on the answer.
    InDecision,
}

const RECORD_CHUNK: &str = "SELECT outcome, partition_status, run_status, expected_row_count, changed, files, lo, hi, \
        rows_sum, bytes_sum, distinct_counts, lock_wait_seconds \
   FROM nifi_ops.record_chunk($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";

async fn record_chunk(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    pid: &str,
    r: &ChunkReport,
    how: Recording,
) -> Result<RecordedChunk> {
    let (k1, k2) = run_lock_key(run_id);
    let rec: RecordedChunk = sqlx::query_as(RECORD_CHUNK)
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
        .bind(how == Recording::InDecision)
        .bind(how == Recording::InDecision)
        .fetch_one(&mut *conn)
        .await?;
    match rec.outcome.as_str() {
        "RECORDED" | "DECIDE" => Ok(rec),
        "RUN_NOT_FOUND" => Err(LedgerError::RunNotFound),
        "PARTITION_NOT_FOUND" => Err(LedgerError::PartitionNotFound),
        "CLAIM_MISMATCH" => Err(LedgerError::ClaimMismatch),
        "HDFS_PATH_OUTSIDE_RUN" => Err(LedgerError::HdfsPathOutsideRun),
        other => Err(LedgerError::Corrupt(format!(
            "record_chunk outcome {other}"
        ))),
    }
}

impl RecordedChunk {
    fn statuses(&self) -> Result<(PartitionStatus, RunStatus)> {
        let corrupt = || LedgerError::Corrupt("record_chunk statuses".into());
        let part = self.partition_status.as_deref().ok_or_else(corrupt)?;
        let part = PartitionStatus::parse(part)
            .ok_or_else(|| LedgerError::Corrupt(format!("partition status {part}")))?;
        let run = parse_run_status(self.run_status.as_deref().ok_or_else(corrupt)?)?;
        Ok((part, run))
    }

    fn aggregate(&self) -> Result<ChunkAggregate> {
        let corrupt = |what: &str| LedgerError::Corrupt(format!("chunk aggregate {what}"));
        Ok(ChunkAggregate {
            files: self.files.ok_or_else(|| corrupt("files"))?,
            lo: self.lo,
            hi: self.hi,
            rows: self
                .rows_sum
                .as_deref()
                .and_then(|r| r.parse().ok())
                .ok_or_else(|| corrupt("rows"))?,
            bytes: self
                .bytes_sum
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(|_| corrupt("bytes"))?,
            distinct_counts: self.distinct_counts.ok_or_else(|| corrupt("counts"))?,
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
        // A partition of one chunk is decided by its only report: trying it alone first would
        // cost a statement (locks taken, nothing written) before the deciding transaction.
        if r.chunk_count > 1
            && let Some(answer) = self.report_chunk_alone(run_id, pid, r).await?
        {
            return Ok(answer);
        }
        match transaction!(self, |conn| self.report_chunk_once(
            conn,
            run_id,
            pid,
            r,
            RunLock::Shared
        )) {
            Err(LedgerError::Escalate) => {
                transaction!(self, |conn| self.report_chunk_once(
                    conn,
                    run_id,
                    pid,
                    r,
                    RunLock::Exclusive
                ))
            }
            other => other,
        }
    }

    /// A report that decides nothing (progress, or recorded only), in one round trip:
    /// `nifi_ops.record_chunk` on its own is one statement, hence one transaction. `None` when
    /// the report needs a decision (it then wrote nothing).
    ///
    /// Retried like a transaction on a deadlock or a serialization failure, and on a lost
    /// connection: unlike a BEGIN, this statement may have committed before its connection was
    /// lost, and that is safe to repeat, since a report is idempotent (the replay finds its chunk
    /// stored as sent, writes nothing and answers the state), which NiFi's own retries rely on.
    async fn report_chunk_alone(
        &self,
        run_id: Uuid,
        pid: &str,
        r: &ChunkReport,
    ) -> Result<Option<ChunkOutcome>> {
        let rec = alone!(self, |conn| record_chunk(
            conn,
            run_id,
            pid,
            r,
            Recording::Alone
        ))?;
        // One observation per report: a report that goes on to decide is observed by its
        // transaction's run lock.
        if rec.outcome == "DECIDE" {
            return Ok(None);
        }
        if let Some(o) = &self.lock_wait {
            o.observe(rec.lock_wait_seconds);
        }
        let (partition_status, run_status) = rec.statuses()?;
        Ok(Some(ChunkOutcome {
            recorded: true,
            partition_status,
            run_status,
            received_chunks: rec.files.unwrap_or_default(),
            chunk_count: r.chunk_count,
            validation_scheduled: false,
            result: if run_status == RunStatus::Extracting
                && partition_status == PartitionStatus::Running
            {
                ChunkResult::Progress
            } else {
                ChunkResult::Ignored
            },
        }))
    }

    async fn report_chunk_once(
        &self,
        conn: &mut sqlx::PgConnection,
        run_id: Uuid,
        pid: &str,
        r: &ChunkReport,
        mode: RunLock,
    ) -> Result<ChunkOutcome> {
        let run = self.lock_run_timed(conn, run_id, mode).await?;
        // §4.7 steps 2–8 as `report_chunk_alone` runs them, now inside this transaction and
        // whatever the gate says.
        let rec = record_chunk(conn, run_id, pid, r, Recording::InDecision).await?;
        let (part_status, run_status) = rec.statuses()?;
        if part_status == PartitionStatus::Success && rec.changed != Some(false) {
            return Err(LedgerError::ChunkConflict);
        }
        let agg = rec.aggregate()?;
        let mut out = ChunkOutcome {
            recorded: true,
            partition_status: part_status,
            run_status,
            received_chunks: agg.files,
            chunk_count: r.chunk_count,
            validation_scheduled: false,
            result: ChunkResult::Progress,
        };
        if run_status != RunStatus::Extracting || part_status != PartitionStatus::Running {
            // Recorded only: late chunks still count for cleanup accounting.
            out.result = ChunkResult::Ignored;
        } else if gate_due(&agg, r.chunk_count.into()) {
            let expected_rows = rec
                .expected_row_count
                .ok_or_else(|| LedgerError::Corrupt("expected rows".into()))?;
            match judge_chunk_gate(&agg, r.chunk_count.into(), expected_rows) {
                GateVerdict::Success => {
                    self.partition_succeeded(conn, &run, pid, r, &agg, &mut out)
                        .await?
                }
                GateVerdict::Mismatch(_) if mode == RunLock::Shared => {
                    return Err(LedgerError::Escalate);
                }
                GateVerdict::Mismatch(text) => {
                    self.partition_mismatched(conn, &run, pid, &text).await?;
                    out.partition_status = PartitionStatus::Failed;
                    out.run_status = RunStatus::FailedExtract;
                    out.result = ChunkResult::Failed;
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    async fn partition_succeeded(
        &self,
        conn: &mut sqlx::PgConnection,
        run: &crate::store::RunRow,
        pid: &str,
        r: &ChunkReport,
        agg: &ChunkAggregate,
        out: &mut ChunkOutcome,
    ) -> Result<()> {
        let rows = i64::try_from(agg.rows).map_err(|_| LedgerError::Corrupt("rows".into()))?;
        let bytes = agg.bytes.map(|b| i64::try_from(b).unwrap_or(i64::MAX));
        // The SUCCESS, its event and the pin of an unfinished sibling, in one round trip
        // (`nifi_ops.partition_success`, migration 20261204000014): completion without a queue on
        // the run row (issue 30 item 3; spec/model/completion.pml checks it statement by
        // statement, and the function keeps the statements). A success that pins a sibling is not
        // the last (the sibling's report takes it FOR UPDATE and waits for this one to commit, so
        // its success sees this one) and leaves without touching the run row: siblings' successes
        // do not queue on it.
        let event_id = Event::id_of_commit();
        let (won, pinned): (bool, bool) = sqlx::query_as(
            "SELECT won, pinned FROM nifi_ops.partition_success($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(run.run_id)
        .bind(pid)
        .bind(r.claim_token)
        .bind(rows)
        .bind(agg.files as i32)
        .bind(bytes)
        .bind(event_id)
        .bind(&run.job_key)
        .bind(&run.business_key)
        .fetch_one(&mut *conn)
        .await?;
        if !won {
            return Err(LedgerError::Corrupt(
                "partition changed under its row lock".into(),
            ));
        }
        out.partition_status = PartitionStatus::Success;
        out.result = ChunkResult::PartitionSuccess;
        if pinned {
            return Ok(());
        }
        // None pinned: this success may be the last. It takes the run row's write lock, which
        // serializes the successes that may be last (and only those) without upgrading our KEY
        // SHARE lock (§5.3 rule 3). The recount runs in a statement of its own, whose snapshot is
        // taken after this one's wait: it sees every success committed before (two last successes
        // each skip the other's partition, held FOR UPDATE, and the second to get the run row
        // sees the first).
        let status: Option<String> = sqlx::query_scalar(
            "SELECT status FROM nifi_ops.load_run WHERE run_id = $1 AND status = 'EXTRACTING' FOR NO KEY UPDATE",
        )
        .bind(run.run_id)
        .fetch_optional(&mut *conn)
        .await?;
        if status.is_none() {
            // The run left EXTRACTING although we hold it FOR KEY SHARE: decide under FOR UPDATE.
            return Err(LedgerError::Escalate);
        }
        if complete_extraction(conn, run).await? {
            out.run_status = RunStatus::ExtractedValidated;
            out.validation_scheduled = true;
            out.result = ChunkResult::RunComplete;
        }
        Ok(())
    }

    /// Gate mismatch, written only under the run row's FOR UPDATE (§5.3 rule 6).
    async fn partition_mismatched(
        &self,
        conn: &mut sqlx::PgConnection,
        run: &crate::store::RunRow,
        pid: &str,
        text: &str,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE nifi_ops.load_partition SET status = 'FAILED', error_code = 'ROW_COUNT_MISMATCH', error_message = $3, \
                completed_at = clock_timestamp(), heartbeat_at = clock_timestamp() \
              WHERE run_id = $1 AND partition_id = $2",
        )
        .bind(run.run_id)
        .bind(pid)
        .bind(text)
        .execute(&mut *conn)
        .await?;
        sqlx::query("UPDATE nifi_ops.load_run SET failed_partition_count = failed_partition_count + 1 WHERE run_id = $1")
            .bind(run.run_id)
            .execute(&mut *conn)
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

//! `POST /v1/runs/{run_id}/partitions/{partition_id}/chunks` (CONTRACT §4.7, §5.3): record a chunk,
//! judge the partition with the chunk gate, and complete the extraction exactly once.
//!
//! Reports hold the run row FOR KEY SHARE so that reports of sibling partitions never wait for each
//! other; a verdict that ends the run rolls back and re-runs under FOR UPDATE (§5.3 rule 6).
use super::claim::{lock_partition, parse_run_status};
use super::complete::complete_extraction;
use super::transition::{ErrorFields, transition_locked};
use crate::error::{LedgerError, LedgerResult};
use crate::event::{Event, Level};
use crate::gate::{ChunkAggregate, GateVerdict, gate_due, judge_chunk_gate};
use crate::status::{PartitionStatus, RunStatus};
use crate::store::{Ledger, RunLock, run_heartbeat_cte, transaction};
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

/// The run directory check (§4.7 step 4): below `<hdfs_run_path>/`, no `..` segment.
pub fn path_inside_run(run_path: Option<&str>, hdfs_path: &str) -> bool {
    // One file, one spelling: `p//f`, `p/./f` and a trailing `/` name the same file (or a
    // directory) under another string, which would let one file be recorded as several chunks.
    run_path
        .and_then(|root| hdfs_path.strip_prefix(root))
        .and_then(|rest| rest.strip_prefix('/'))
        .is_some_and(|rel| {
            !rel.is_empty()
                && rel
                    .split('/')
                    .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        })
}

/// The recorded chunk and its partition's aggregate (§4.7 steps 6–8).
#[derive(sqlx::FromRow)]
struct ChunkRow {
    /// The chunk was new, or differs from the stored one (a conflict once the partition is done).
    changed: bool,
    files: i64,
    lo: Option<i32>,
    hi: Option<i32>,
    rows: String,
    bytes: Option<String>,
    distinct_counts: i64,
    /// The run's status, read after the run and partition locks were granted (what the report
    /// decides on and answers, see `claim::run_status_after_locks`).
    run_status: String,
}

impl Ledger {
    pub async fn report_chunk(
        &self,
        run_id: Uuid,
        pid: &str,
        r: &ChunkReport,
    ) -> LedgerResult<ChunkOutcome> {
        if r.chunk_index >= r.chunk_count {
            return Err(LedgerError::ChunkIndexOutOfRange);
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

    async fn report_chunk_once(
        &self,
        conn: &mut sqlx::PgConnection,
        run_id: Uuid,
        pid: &str,
        r: &ChunkReport,
        mode: RunLock,
    ) -> LedgerResult<ChunkOutcome> {
        let run = self.lock_run_timed(conn, run_id, mode).await?;
        let part = lock_partition(conn, run_id, pid).await?;
        if part.claim_token != Some(r.claim_token) {
            return Err(LedgerError::ClaimMismatch);
        }
        if !path_inside_run(run.hdfs_run_path.as_deref(), &r.hdfs_path) {
            return Err(LedgerError::HdfsPathOutsideRun);
        }
        // One round trip records the chunk, refreshes the partition's heartbeat, refreshes the
        // run's heartbeat in §5.3 rule 5's form (skipped when fresh or write-locked, never
        // waiting; for a progress report this is the last statement) and reads the partition's
        // aggregate as it is with this chunk (the other WRITTEN chunks, which the partition row
        // lock keeps still, plus this one: a statement does not see its own writes). It also
        // reads the run's status: its snapshot follows every lock wait of the report, so the
        // status is the one the waits left (the run row of the first statement may be older,
        // `claim::run_status_after_locks`).
        // An identical replay writes nothing: no upsert (ON CONFLICT DO UPDATE locks the row even
        // when its WHERE is false), no new partition row version.
        // The partition's heartbeat is written at most once a second (the stale rule counts in
        // minutes; each write is a row version, HOT since no index holds the column), and not by
        // a chunk that completes the set: that one decides the partition, whose SUCCESS or
        // FAILED update writes the heartbeat itself (or, when the run or the partition no longer
        // takes chunks, the heartbeat is not read again). Likewise the run's heartbeat is then
        // refreshed by the success's pin statement, not here.
        let a: ChunkRow = sqlx::query_as(concat!(
            "WITH prior AS ( \
                SELECT fragment_identifier, fragment_count, hdfs_path, record_count, byte_count, status FROM nifi_ops.load_file \
                 WHERE run_id = $1 AND partition_id = $2 AND chunk_index = $3), \
             same AS ( \
                SELECT 1 FROM prior WHERE (fragment_identifier, fragment_count, hdfs_path, record_count, byte_count, status) \
                    IS NOT DISTINCT FROM ($4, $5, $6, $7, $8, 'WRITTEN')), \
             stored AS ( \
                INSERT INTO nifi_ops.load_file (run_id, partition_id, chunk_index, fragment_identifier, fragment_count, \
                  hdfs_path, record_count, byte_count) SELECT $1, $2, $3, $4, $5, $6, $7, $8 \
                 WHERE NOT EXISTS (SELECT 1 FROM same) \
                ON CONFLICT (run_id, partition_id, chunk_index) DO UPDATE SET \
                  fragment_identifier = EXCLUDED.fragment_identifier, fragment_count = EXCLUDED.fragment_count, \
                  hdfs_path = EXCLUDED.hdfs_path, record_count = EXCLUDED.record_count, byte_count = EXCLUDED.byte_count, \
                  status = 'WRITTEN', updated_at = clock_timestamp() \
                RETURNING 1), \
             chunks AS ( \
                SELECT chunk_index, fragment_count, record_count, byte_count FROM nifi_ops.load_file \
                 WHERE run_id = $1 AND partition_id = $2 AND status = 'WRITTEN' AND chunk_index <> $3 \
                UNION ALL SELECT $3, $5, $7, $8), \
             beat AS ( \
                UPDATE nifi_ops.load_partition SET heartbeat_at = clock_timestamp() \
                 WHERE run_id = $1 AND partition_id = $2 AND NOT EXISTS (SELECT 1 FROM same) \
                   AND (heartbeat_at IS NULL OR heartbeat_at < clock_timestamp() - interval '1 second') \
                   AND (SELECT count(*) FROM chunks) < $5 RETURNING 1), \
", run_heartbeat_cte!("(SELECT count(*) FROM chunks) < $5"), " \
             SELECT NOT EXISTS (SELECT 1 FROM prior WHERE fragment_count = $5 AND hdfs_path = $6 \
                                   AND record_count = $7 AND byte_count IS NOT DISTINCT FROM $8) AS changed, \
                    count(*) AS files, min(chunk_index) AS lo, max(chunk_index) AS hi, \
                    COALESCE(sum(record_count), 0)::text AS rows, sum(byte_count)::text AS bytes, \
                    count(DISTINCT fragment_count) AS distinct_counts, \
                    (SELECT status FROM nifi_ops.load_run WHERE run_id = $1) AS run_status \
               FROM chunks"
        ))
        .bind(run_id)
        .bind(pid)
        .bind(r.chunk_index)
        .bind(&r.fragment_identifier)
        .bind(r.chunk_count)
        .bind(&r.hdfs_path)
        .bind(r.record_count)
        .bind(r.byte_count)
        .fetch_one(&mut *conn)
        .await?;
        let part_status = part.status()?;
        if part_status == PartitionStatus::Success && a.changed {
            return Err(LedgerError::ChunkConflict);
        }
        let corrupt = |what: &str| LedgerError::Corrupt(format!("chunk aggregate {what}"));
        let agg = ChunkAggregate {
            files: a.files,
            lo: a.lo,
            hi: a.hi,
            rows: a.rows.parse().map_err(|_| corrupt("rows"))?,
            bytes: a
                .bytes
                .map(|b| b.parse())
                .transpose()
                .map_err(|_| corrupt("bytes"))?,
            distinct_counts: a.distinct_counts,
        };
        let run_status = parse_run_status(&a.run_status)?;
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
            match judge_chunk_gate(&agg, r.chunk_count.into(), part.expected_row_count) {
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
    ) -> LedgerResult<()> {
        let rows = i64::try_from(agg.rows).map_err(|_| LedgerError::Corrupt("rows".into()))?;
        let bytes = agg.bytes.map(|b| i64::try_from(b).unwrap_or(i64::MAX));
        let won = sqlx::query(
            "UPDATE nifi_ops.load_partition SET status = 'SUCCESS', actual_row_count = $4, file_count = $5, \
                fragment_count = $5, byte_count = $6, completed_at = clock_timestamp(), heartbeat_at = clock_timestamp() \
              WHERE run_id = $1 AND partition_id = $2 AND status = 'RUNNING' AND claim_token = $3",
        )
        .bind(run.run_id)
        .bind(pid)
        .bind(r.claim_token)
        .bind(rows)
        .bind(agg.files as i32)
        .bind(bytes)
        .execute(&mut *conn)
        .await?
        .rows_affected()
            == 1;
        if !won {
            return Err(LedgerError::Corrupt(
                "partition changed under its row lock".into(),
            ));
        }
        Event::new(Level::Info, "PARTITION_SUCCESS")
            .run(run)
            .partition(pid)
            .rows(Some(rows))
            .details(json!({"files": agg.files, "bytes": bytes}))
            .insert(conn)
            .await?;
        out.partition_status = PartitionStatus::Success;
        out.result = ChunkResult::PartitionSuccess;
        // Completion without a queue on the run row (issue 30 item 3; spec/model/completion.pml
        // checks it statement by statement). The success pins one unfinished sibling partition,
        // the first after its own (then before it), that no other transaction holds: `FOR KEY
        // SHARE SKIP LOCKED` skips a row a report or claim holds FOR UPDATE, and re-checks a row
        // updated since the statement's snapshot on its newest version. The pinned sibling cannot
        // be decided before this transaction commits (its report takes it FOR UPDATE and waits),
        // so its success will see this one: this one is not the last, and leaves without touching
        // the run row. Siblings' successes therefore do not queue on it. The run's heartbeat is
        // refreshed here in §5.3 rule 5's form (the chunk statement left it to the decision).
        let pinned: bool = sqlx::query_scalar(concat!(
            "WITH after AS ( \
                SELECT 1 FROM nifi_ops.load_partition \
                 WHERE run_id = $1 AND partition_id > $2 AND status IN ('PENDING', 'RUNNING', 'RETRY') \
                 ORDER BY partition_id LIMIT 1 FOR KEY SHARE SKIP LOCKED), \
             before AS ( \
                SELECT 1 FROM nifi_ops.load_partition \
                 WHERE run_id = $1 AND partition_id < $2 AND status IN ('PENDING', 'RUNNING', 'RETRY') \
                   AND NOT EXISTS (SELECT 1 FROM after) \
                 ORDER BY partition_id LIMIT 1 FOR KEY SHARE SKIP LOCKED), ",
            run_heartbeat_cte!(),
            " SELECT EXISTS (SELECT 1 FROM after) OR EXISTS (SELECT 1 FROM before)"
        ))
        .bind(run.run_id)
        .bind(pid)
        .fetch_one(&mut *conn)
        .await?;
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
    ) -> LedgerResult<()> {
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
    use super::*;

    #[test]
    fn chunk_paths_must_stay_below_the_run_directory() {
        let root = Some("/data/J/run_id=1");
        assert!(path_inside_run(
            root,
            "/data/J/run_id=1/p=0000/part-0.parquet"
        ));
        assert!(path_inside_run(root, "/data/J/run_id=1/x"));
        assert!(!path_inside_run(root, "/data/J/run_id=1"));
        assert!(!path_inside_run(root, "/data/J/run_id=10/x"));
        assert!(!path_inside_run(root, "/data/J/run_id=1/../run_id=2/x"));
        assert!(!path_inside_run(None, "/data/J/run_id=1/x"));
        // Aliases of one file, and the run directory itself, are refused.
        for alias in [
            "/data/J/run_id=1/p//f",
            "/data/J/run_id=1/p/./f",
            "/data/J/run_id=1/./p/f",
            "/data/J/run_id=1//p/f",
            "/data/J/run_id=1/",
            "/data/J/run_id=1/p/",
        ] {
            assert!(!path_inside_run(root, alias), "{alias}");
        }
        assert!(path_inside_run(root, "/data/J/run_id=1/p/f"));
    }
}

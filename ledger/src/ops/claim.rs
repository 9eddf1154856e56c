//! `POST /v1/runs/{run_id}/partitions/{partition_id}/claim` (CONTRACT §4.6): the partition row
//! lock decides ownership; the run row is only held FOR KEY SHARE.
use crate::error::{LedgerError, LedgerResult};
use crate::event::{Event, Level};
use crate::status::{PartitionStatus, RunStatus};
use crate::store::{Ledger, RunLock, run_heartbeat_cte, transaction};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ClaimOutcome {
    pub claimed: bool,
    pub run_status: RunStatus,
    pub partition_status: PartitionStatus,
    pub attempt: i32,
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct PartitionLockRow {
    pub status: String,
    /// The run's status, read by the statement that locks the partition: after the run locks were
    /// granted, so it is the status as every run-changing operation left it (the run row read
    /// under `FOR KEY SHARE` may be older, see [`run_status_after_locks`]).
    pub run_status: String,
    pub claim_token: Option<Uuid>,
    pub attempt_count: i32,
}

impl PartitionLockRow {
    pub fn status(&self) -> LedgerResult<PartitionStatus> {
        PartitionStatus::parse(&self.status)
            .ok_or_else(|| LedgerError::Corrupt(format!("partition status {}", self.status)))
    }

    pub fn run_status(&self) -> LedgerResult<RunStatus> {
        parse_run_status(&self.run_status)
    }
}

pub(crate) fn parse_run_status(s: &str) -> LedgerResult<RunStatus> {
    RunStatus::parse(s).ok_or_else(|| LedgerError::Corrupt(format!("run status {s}")))
}

/// The run's status read by a statement of its own, once every lock the caller waited for is
/// held. A report or claim answers (and decides on) this, never the row its first statement read:
/// that statement's snapshot predates its waits, and `FOR KEY SHARE` locks the version it saw
/// without re-reading it when the newer one came from a non-key update — which is how the report
/// that completes the extraction changes the status (§5.3 rule 3). A report of the same
/// partition that waited for that report's partition lock would otherwise answer `EXTRACTING`
/// for an EXTRACTED_VALIDATED run. (A run-changing operation takes the row `FOR UPDATE` before
/// updating it, which PostgreSQL records as a key update, so `FOR KEY SHARE` does follow those;
/// the status is re-read all the same, not left to that detail.)
pub(crate) async fn run_status_after_locks(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
) -> LedgerResult<RunStatus> {
    let status: String =
        sqlx::query_scalar("SELECT status FROM nifi_ops.load_run WHERE run_id = $1")
            .bind(run_id)
            .fetch_one(&mut *conn)
            .await?;
    parse_run_status(&status)
}

pub(crate) async fn lock_partition(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    pid: &str,
) -> LedgerResult<PartitionLockRow> {
    sqlx::query_as(
        "SELECT status, claim_token, attempt_count, \
                (SELECT status FROM nifi_ops.load_run WHERE run_id = $1) AS run_status \
           FROM nifi_ops.load_partition WHERE run_id = $1 AND partition_id = $2 FOR UPDATE",
    )
    .bind(run_id)
    .bind(pid)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(LedgerError::PartitionNotFound)
}

impl Ledger {
    pub async fn claim_partition(
        &self,
        run_id: Uuid,
        pid: &str,
        token: Uuid,
        worker: &str,
    ) -> LedgerResult<ClaimOutcome> {
        transaction!(self, |conn| async {
            let run = self.lock_run_timed(conn, run_id, RunLock::Shared).await?;
            let part = lock_partition(conn, run_id, pid).await?;
            // Decided on the status read after the run locks (no run-changing operation can
            // follow until this transaction ends); the run row `run` is only its identity.
            let run_status = part.run_status()?;
            let status = part.status()?;
            if run_status != RunStatus::Extracting {
                return Ok(ClaimOutcome {
                    claimed: false,
                    run_status,
                    partition_status: status,
                    attempt: part.attempt_count,
                });
            }
            if status == PartitionStatus::Running && part.claim_token == Some(token) {
                // The same worker again: its previous answer was lost.
                sqlx::query("UPDATE nifi_ops.load_partition SET heartbeat_at = clock_timestamp() WHERE run_id = $1 AND partition_id = $2")
                    .bind(run_id)
                    .bind(pid)
                    .execute(&mut *conn)
                    .await?;
                return Ok(ClaimOutcome {
                    claimed: true,
                    run_status,
                    partition_status: status,
                    attempt: part.attempt_count,
                });
            }
            if !matches!(status, PartitionStatus::Pending | PartitionStatus::Retry) {
                // The partition may have been waited for behind the report that completed the
                // run (a SUCCESS partition): its status is answered as that report left it. (While
                // this claim holds an unfinished partition, no completion can happen: the other
                // answers are EXTRACTING.)
                return Ok(ClaimOutcome {
                    claimed: false,
                    run_status: run_status_after_locks(conn, run_id).await?,
                    partition_status: status,
                    attempt: part.attempt_count,
                });
            }
            let (attempt,): (i32,) = sqlx::query_as(
                "UPDATE nifi_ops.load_partition SET status = 'RUNNING', claim_token = $3, worker_node = $4, \
                    attempt_count = attempt_count + 1, started_at = COALESCE(started_at, clock_timestamp()), \
                    heartbeat_at = clock_timestamp(), error_code = NULL, error_message = NULL \
                  WHERE run_id = $1 AND partition_id = $2 RETURNING attempt_count",
            )
            .bind(run_id)
            .bind(pid)
            .bind(token)
            .bind(worker)
            .fetch_one(&mut *conn)
            .await?;
            if status == PartitionStatus::Retry {
                // The reissue reached a worker: its dispatches are acknowledged (§6.6).
                sqlx::query(
                    "UPDATE nifi_ops.load_dispatch SET status = 'ACKED', acked_at = clock_timestamp() \
                      WHERE run_id = $1 AND partition_id = $2 AND dispatch_type = 'REISSUE_PARTITION' AND status <> 'ACKED'",
                )
                .bind(run_id)
                .bind(pid)
                .execute(&mut *conn)
                .await?;
            }
            Event::new(Level::Info, "PARTITION_STARTED")
                .run(&run)
                .partition(pid)
                .details(json!({"workerNode": worker, "attempt": attempt}))
                .insert(conn)
                .await?;
            // The run's heartbeat refresh (§4.6 step 5, §5.3 rule 5's non-waiting form) comes
            // last: taken earlier, its row lock would be held across the REISSUE acknowledgement
            // (which can wait behind a sweeper tick), and the run's other reports behind it.
            sqlx::query(concat!(
                "WITH ",
                run_heartbeat_cte!(),
                " SELECT count(*) FROM run_beat"
            ))
            .bind(run_id)
            .execute(&mut *conn)
            .await?;
            Ok(ClaimOutcome {
                claimed: true,
                run_status,
                partition_status: PartitionStatus::Running,
                attempt,
            })
        })
    }
}

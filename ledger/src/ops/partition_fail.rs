//! `POST /v1/runs/{run_id}/partitions/{partition_id}/fail` (CONTRACT §4.8): the owner's final word
//! on its partition, which ends an extracting run.
use super::transition::{ErrorFields, transition_locked};
use crate::error::{LedgerError, Result};
use crate::event::{Event, Level};
use crate::status::{PartitionStatus, RunStatus, is_snapshot_failure};
use crate::store::Ledger;
use crate::text::{cut, message};
use crate::transactions::transaction;
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct PartitionFailure {
    pub claim_token: Uuid,
    pub error_stage: String,
    pub error_class: String,
    pub error_code: String,
    pub message: String,
    pub attempt: Option<i32>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PartitionFailOutcome {
    pub partition_status: PartitionStatus,
    pub run_status: RunStatus,
    pub changed: bool,
}

/// The partition row under its lock, which orders its claim, reports and failure.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct PartitionLockRow {
    pub status: String,
    pub claim_token: Option<Uuid>,
}

impl PartitionLockRow {
    pub fn status(&self) -> Result<PartitionStatus> {
        PartitionStatus::parse(&self.status)
            .ok_or_else(|| LedgerError::Corrupt(format!("partition status {}", self.status)))
    }
}

/// Called under the run's exclusive lock, whose `FOR UPDATE` row is current: the run's status is
/// read from it, not here.
pub(crate) async fn lock_partition(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    pid: &str,
) -> Result<PartitionLockRow> {
    sqlx::query_as(
        "SELECT status, claim_token FROM nifi_ops.load_partition \
          WHERE run_id = $1 AND partition_id = $2 FOR UPDATE",
    )
    .bind(run_id)
    .bind(pid)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(LedgerError::PartitionNotFound)
}

impl Ledger {
    pub async fn fail_partition(
        &self,
        run_id: Uuid,
        pid: &str,
        f: &PartitionFailure,
    ) -> Result<PartitionFailOutcome> {
        transaction!(self, |conn| async {
            let run = self.lock_run_timed(conn, run_id).await?;
            let part = lock_partition(conn, run_id, pid).await?;
            if part.claim_token != Some(f.claim_token) {
                return Err(LedgerError::ClaimMismatch);
            }
            let run_status = run.status()?;
            let status = part.status()?;
            match status {
                PartitionStatus::Failed | PartitionStatus::Aborted => {
                    return Ok(PartitionFailOutcome {
                        partition_status: status,
                        run_status,
                        changed: false,
                    });
                }
                PartitionStatus::Running => {}
                other => {
                    return Err(LedgerError::PartitionStatusMismatch {
                        partition_status: other,
                    });
                }
            }
            partition_failed(
                conn,
                run_id,
                pid,
                &cut(&f.error_code, 100),
                message(&f.message).as_deref(),
            )
            .await?;
            let stage = cut(&f.error_stage, 80);
            Event::new(Level::Error, "PARTITION_FAILED")
                .run(&run)
                .partition(pid)
                .error_class(&f.error_class)
                .code(&f.error_code)
                .message(&f.message)
                .attempt(f.attempt)
                .details(json!({"stage": stage, "attempt": f.attempt}))
                .insert(conn)
                .await?;
            let mut out = PartitionFailOutcome {
                partition_status: PartitionStatus::Failed,
                run_status,
                changed: true,
            };
            if run_status == RunStatus::Extracting {
                let to = if is_snapshot_failure(&f.error_code, &f.error_class) {
                    RunStatus::FailedSnapshotExpired
                } else {
                    RunStatus::FailedExtract
                };
                let error = ErrorFields::Set {
                    stage: &f.error_stage,
                    code: &f.error_code,
                    message: &f.message,
                };
                let aborted = transition_locked(conn, run_id, run_status, to, error).await?;
                Event::new(Level::Error, "RUN_FAILED")
                    .run(&run)
                    .partition(pid)
                    .code(&f.error_code)
                    .message(&format!("partition {pid}: {}", f.message))
                    .details(json!({"stage": stage, "from": run_status, "to": to}))
                    .aborted(aborted)
                    .insert(conn)
                    .await?;
                out.run_status = to;
            }
            Ok(out)
        })
    }
}

/// A RUNNING partition's failure, under the run row's FOR UPDATE: the partition FAILED with its
/// error and the run's failed count. The one writer of both, for a `/fail` and for the gate's
/// mismatch (`ops::chunk`); what the failure does to the run is the caller's.
pub(super) async fn partition_failed(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    pid: &str,
    code: &str,
    message: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "UPDATE nifi_ops.load_partition SET status = 'FAILED', error_code = $3, error_message = $4, \
            completed_at = clock_timestamp(), heartbeat_at = clock_timestamp() \
          WHERE run_id = $1 AND partition_id = $2",
    )
    .bind(run_id)
    .bind(pid)
    .bind(code)
    .bind(message)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "UPDATE nifi_ops.load_run SET failed_partition_count = failed_partition_count + 1 WHERE run_id = $1",
    )
    .bind(run_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

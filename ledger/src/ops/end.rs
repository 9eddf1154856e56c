//! Ending (or blocking) a run: the status CAS and, in the same transaction, the [v1-ext] closing
//! of unfinished partitions and pending dispatches (CONTRACT §2.2).
use crate::error::LedgerResult;
use crate::status::RunStatus;
use crate::store::notify_run;
use crate::text::{cut, message};
use sqlx::PgConnection;
use uuid::Uuid;

pub(crate) struct RunEnd<'a> {
    pub to: RunStatus,
    pub stage: &'a str,
    pub code: &'a str,
    pub message: &'a str,
}

/// CAS `from` → `end.to` with the error fields; `None` when the CAS lost, else the number of
/// partitions closed as ABORTED. The caller writes the event.
pub(crate) async fn end_run(
    conn: &mut PgConnection,
    run_id: Uuid,
    from: RunStatus,
    end: RunEnd<'_>,
) -> LedgerResult<Option<u64>> {
    let changed = sqlx::query(
        "UPDATE nifi_ops.load_run SET status = $3, error_stage = $4, error_code = $5, error_message = $6, \
            completed_at = CASE WHEN $7 THEN clock_timestamp() ELSE completed_at END, \
            heartbeat_at = clock_timestamp(), version_no = version_no + 1 \
          WHERE run_id = $1 AND status = $2",
    )
    .bind(run_id)
    .bind(from.as_str())
    .bind(end.to.as_str())
    .bind(cut(end.stage, 80))
    .bind(cut(end.code, 100))
    .bind(message(end.message))
    .bind(end.to.is_terminal())
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if changed == 0 {
        return Ok(None);
    }
    let mut aborted = 0;
    if end.to.aborts_partitions() {
        aborted = sqlx::query(
            "UPDATE nifi_ops.load_partition SET status = 'ABORTED', completed_at = clock_timestamp(), \
                heartbeat_at = clock_timestamp(), error_code = $2, error_message = 'run ended: ' || $2 \
              WHERE run_id = $1 AND status IN ('PENDING', 'RUNNING', 'RETRY')",
        )
        .bind(run_id)
        .bind(end.to.as_str())
        .execute(&mut *conn)
        .await?
        .rows_affected();
    }
    if end.to.is_terminal() {
        let reason = if end.to == RunStatus::Cancelled {
            "run cancelled".to_string()
        } else {
            format!("run ended: {}", end.to)
        };
        sqlx::query(
            "UPDATE nifi_ops.load_dispatch SET status = 'DEAD', last_error = $2 \
              WHERE run_id = $1 AND status IN ('PENDING', 'SENT')",
        )
        .bind(run_id)
        .bind(reason)
        .execute(&mut *conn)
        .await?;
    }
    notify_run(conn, run_id).await?;
    Ok(Some(aborted))
}

//! Every run status change (CONTRACT §2.1–§2.2): the CAS on the expected status, `heartbeat_at`,
//! `version_no`, `completed_at` on entering a terminal status, the NOTIFY (§3.9: the LoadRun
//! mirror's wake-up, sent by the CAS statement itself, one round trip fewer), and — in the same
//! transaction — the [v1-ext] closing of unfinished partitions and pending dispatches.
use crate::error::{LedgerError, Result};
use crate::status::RunStatus;
use crate::text::{cut, message};
use sqlx::PgConnection;
use uuid::Uuid;

/// What happens to `error_stage`, `error_code` and `error_message`.
pub(crate) enum ErrorFields<'a> {
    Keep,
    Clear,
    Set {
        stage: &'a str,
        code: &'a str,
        message: &'a str,
    },
}

/// CAS `from` → `to`; `None` when the CAS lost, else the number of partitions closed as ABORTED.
/// The caller writes the event. Leaving EXTRACTING stores `success_partition_count` from a recount
/// (partition successes do not write it, issue 30 item 3; no partition becomes SUCCESS afterwards,
/// and every caller holds the run FOR UPDATE, so no success is in flight).
pub(crate) async fn transition(
    conn: &mut PgConnection,
    run_id: Uuid,
    from: RunStatus,
    to: RunStatus,
    error: ErrorFields<'_>,
) -> Result<Option<u64>> {
    let (mode, stage, code, msg) = match error {
        ErrorFields::Keep => ("keep", None, None, None),
        ErrorFields::Clear => ("clear", None, None, None),
        ErrorFields::Set {
            stage,
            code,
            message: m,
        } => (
            "set",
            Some(cut(stage, 80)),
            Some(cut(code, 100)),
            message(m),
        ),
    };
    let changed = sqlx::query(
        "UPDATE nifi_ops.load_run SET status = $3, \
            error_stage = CASE $4 WHEN 'keep' THEN error_stage WHEN 'clear' THEN NULL ELSE $5 END, \
            error_code = CASE $4 WHEN 'keep' THEN error_code WHEN 'clear' THEN NULL ELSE $6 END, \
            error_message = CASE $4 WHEN 'keep' THEN error_message WHEN 'clear' THEN NULL ELSE $7 END, \
            completed_at = CASE WHEN $8 THEN clock_timestamp() ELSE completed_at END, \
            heartbeat_at = clock_timestamp(), version_no = version_no + 1, \
            success_partition_count = CASE WHEN $2 = 'EXTRACTING' THEN (SELECT count(*) FROM nifi_ops.load_partition p \
                WHERE p.run_id = $1 AND p.status = 'SUCCESS') ELSE success_partition_count END \
          WHERE run_id = $1 AND status = $2 \
          RETURNING pg_notify('load_run', $1::text)",
    )
    .bind(run_id)
    .bind(from.as_str())
    .bind(to.as_str())
    .bind(mode)
    .bind(stage)
    .bind(code)
    .bind(msg)
    .bind(to.is_terminal())
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if changed == 0 {
        return Ok(None);
    }
    let mut aborted = 0;
    if to.aborts_partitions() {
        aborted = sqlx::query(
            "UPDATE nifi_ops.load_partition SET status = 'ABORTED', completed_at = clock_timestamp(), \
                heartbeat_at = clock_timestamp(), error_code = $2, error_message = 'run ended: ' || $2 \
              WHERE run_id = $1 AND status IN ('PENDING', 'RUNNING', 'RETRY')",
        )
        .bind(run_id)
        .bind(to.as_str())
        .execute(&mut *conn)
        .await?
        .rows_affected();
    }
    if to.is_terminal() {
        let reason = if to == RunStatus::Cancelled {
            "run cancelled".to_string()
        } else {
            format!("run ended: {to}")
        };
        sqlx::query("UPDATE nifi_ops.load_dispatch SET status = 'DEAD', last_error = $2 WHERE run_id = $1 AND status IN ('PENDING', 'SENT')")
            .bind(run_id)
            .bind(reason)
            .execute(&mut *conn)
            .await?;
    }
    Ok(Some(aborted))
}

/// A transition that cannot lose because the caller holds the run row FOR UPDATE and checked it.
pub(crate) async fn transition_locked(
    conn: &mut PgConnection,
    run_id: Uuid,
    from: RunStatus,
    to: RunStatus,
    error: ErrorFields<'_>,
) -> Result<u64> {
    transition(conn, run_id, from, to, error)
        .await?
        .ok_or_else(|| LedgerError::Corrupt("run changed under FOR UPDATE".into()))
}

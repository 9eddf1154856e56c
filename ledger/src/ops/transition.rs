//! Every run status change (CONTRACT §2.1–§2.2): the CAS on the expected status, `heartbeat_at`,
//! `version_no`, `completed_at` on entering a terminal status, the NOTIFY (§3.9: the LoadRun
//! mirror's wake-up, sent at commit, only when the CAS won), and — in the same transaction — the
//! [v1-ext] closing of unfinished partitions and pending dispatches: one statement,
//! `nifi_ops.transition`, which reads what a transition does from the state machine's table
//! (`crate::machine`).
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
    // `nifi_ops.transition` (ledger/functions/), the CAS's one copy, which the validation
    // start runs server-side too; what entering `to` does is read from `nifi_ops.run_transition`
    // (crate::machine), and a pair not in it is refused there (SQLSTATE LC002).
    let (changed, aborted): (bool, i64) = sqlx::query_as(
        "SELECT changed, aborted FROM nifi_ops.transition($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(run_id)
    .bind(from.as_str())
    .bind(to.as_str())
    .bind(mode)
    .bind(stage)
    .bind(code)
    .bind(msg)
    .fetch_one(&mut *conn)
    .await?;
    if !changed {
        return Ok(None);
    }
    Ok(Some(u64::try_from(aborted).unwrap_or_default()))
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

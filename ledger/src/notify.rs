//! The two NOTIFY channels, sent inside the deciding transaction (delivered at its commit).
use crate::error::Result;
use sqlx::PgConnection;
use uuid::Uuid;

/// `pg_notify('load_run', <run_id>)`: every run status change tells the LoadRun mirror (§3.9).
pub(crate) async fn notify_run(conn: &mut PgConnection, run_id: Uuid) -> Result<()> {
    sqlx::query("SELECT pg_notify('load_run', $1)")
        .bind(run_id.to_string())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// `pg_notify('load_dispatch', …)`: wakes the dispatcher when the transaction commits (§6.1).
pub(crate) async fn notify_dispatch(conn: &mut PgConnection, payload: &str) -> Result<()> {
    sqlx::query("SELECT pg_notify('load_dispatch', $1)")
        .bind(payload)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

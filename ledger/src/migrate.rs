//! Schema migrations (CONTRACT §1): embedded from `migrations/`, serialized across processes.
use crate::error::LedgerResult;
use sqlx::Connection;
use sqlx::postgres::PgConnection;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Applies every pending migration. Safe to run twice and from several processes at once: besides
/// sqlx's own lock, the whole run holds a session advisory lock of its own, taken before sqlx
/// creates its bookkeeping table (concurrent `CREATE TABLE IF NOT EXISTS` can collide).
pub async fn run_migrations(url: &str) -> LedgerResult<()> {
    let mut conn = PgConnection::connect(url).await?;
    sqlx::query("SELECT pg_advisory_lock(hashtext('load_control_migrate'))")
        .execute(&mut conn)
        .await?;
    let result = MIGRATOR.run(&mut conn).await;
    sqlx::query("SELECT pg_advisory_unlock(hashtext('load_control_migrate'))")
        .execute(&mut conn)
        .await?;
    result.map_err(|e| match e {
        sqlx::migrate::MigrateError::Execute(e) => e.into(),
        other => crate::error::LedgerError::Database(sqlx::Error::Migrate(Box::new(other))),
    })?;
    conn.close().await?;
    Ok(())
}

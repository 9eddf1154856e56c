//! Schema migrations (CONTRACT §1): embedded from `migrations/`, serialized across processes, and
//! the schema version they produce written for every process to check (`crate::schema`).
use crate::error::{LedgerError, Result};
use crate::schema::{SCHEMA_VERSION, SUPPORTED_SCHEMA, SchemaMismatch, read_version};
use sqlx::Connection;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgConnection;

pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Who `migrate` says wrote the schema version.
const WRITTEN_BY: &str = concat!("load-control ", env!("CARGO_PKG_VERSION"));

/// Applies every pending migration and raises the schema version to [`SCHEMA_VERSION`] (never
/// lowers it); returns the database's schema version afterwards. Safe to run twice and from several
/// processes at once: besides sqlx's own lock, the whole run holds a session advisory lock of its
/// own, taken before sqlx creates its bookkeeping table (concurrent `CREATE TABLE IF NOT EXISTS`
/// can collide).
///
/// Migrations applied by a newer release are ignored (sqlx would otherwise refuse them as
/// missing): an older binary migrating a newer schema it runs on — a rollback's hook — succeeds and
/// changes nothing. One that does not run on it is refused before anything is applied, with
/// `SchemaUnsupported` naming both versions.
pub async fn run_migrations(url: &str) -> Result<i32> {
    let mut conn = PgConnection::connect(url).await?;
    sqlx::query("SELECT pg_advisory_lock(hashtext('load_control_migrate'))")
        .execute(&mut conn)
        .await?;
    let result = migrate_locked(&mut conn).await;
    sqlx::query("SELECT pg_advisory_unlock(hashtext('load_control_migrate'))")
        .execute(&mut conn)
        .await?;
    let version = result?;
    conn.close().await?;
    Ok(version)
}

async fn migrate_locked(conn: &mut PgConnection) -> Result<i32> {
    let before = read_version(conn).await?;
    if before > *SUPPORTED_SCHEMA.end() {
        return Err(LedgerError::SchemaUnsupported(SchemaMismatch {
            database: before,
            supported: SUPPORTED_SCHEMA,
        }));
    }
    let mut migrator = Migrator::with_migrations(MIGRATOR.iter().cloned().collect());
    migrator.set_ignore_missing(true);
    migrator.run(&mut *conn).await.map_err(|e| match e {
        sqlx::migrate::MigrateError::Execute(e) => e.into(),
        other => LedgerError::Database(sqlx::Error::Migrate(Box::new(other))),
    })?;
    // Raised only: a binary of an older schema version (within its range) leaves it as it is.
    sqlx::query(
        "INSERT INTO nifi_ops.schema_version (version, written_by) VALUES ($1, $2) \
         ON CONFLICT (singleton) DO UPDATE \
            SET version = EXCLUDED.version, written_by = EXCLUDED.written_by, written_at = clock_timestamp() \
          WHERE schema_version.version < EXCLUDED.version",
    )
    .bind(SCHEMA_VERSION)
    .bind(WRITTEN_BY)
    .execute(&mut *conn)
    .await?;
    let after = read_version(conn).await?;
    tracing::info!(
        event = "schema_version",
        before,
        after,
        binary = SCHEMA_VERSION,
        "ledger schema version"
    );
    Ok(after)
}

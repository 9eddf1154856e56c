//! Schema migrations: embedded from `migrations/`, serialized across processes, and
//! the schema version they produce written for every process to check (`crate::schema`).
use crate::error::{LedgerError, Result};
use crate::schema::{SCHEMA_VERSION, SUPPORTED_SCHEMA, SchemaMismatch, read_version};
use sqlx::Connection;
use sqlx::migrate::{MigrateError, Migration, Migrator};
use sqlx::postgres::PgConnection;
use std::time::Duration;

pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// `application_name` of the migrating session.
pub const APPLICATION_NAME: &str = "load-control migrate";

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
    run_migrations_as(&crate::Dsn::new(url)).await
}

/// [`run_migrations`] with the password of `dsn`'s password file.
pub async fn run_migrations_as(dsn: &crate::Dsn) -> Result<i32> {
    run_migrations_granting(dsn, None).await
}

/// The privileges of the role the pods connect as, whatever its name: [`RUNTIME_GRANTS`] with
/// `{role}` the role.
pub const RUNTIME_GRANTS: &str = include_str!("runtime_grants.sql");

/// [`run_migrations_as`], then, when `runtime_role` names one, [`RUNTIME_GRANTS`] to that role,
/// under the same lock (two GRANTs on one object at once fail with "tuple concurrently
/// updated"). A role that does not exist is refused, naming it.
pub async fn run_migrations_granting(dsn: &crate::Dsn, runtime_role: Option<&str>) -> Result<i32> {
    // Named apart from the serving pool's "load-control": an operator (or the upgrade test)
    // tells the migration's lock waits from NiFi's in pg_stat_activity.
    let mut conn = dsn
        .connect_shaped(|o| o.application_name(APPLICATION_NAME))
        .await?;
    // Polled, not waited for: a session waiting in `pg_advisory_lock` is a transaction in flight,
    // which a CREATE INDEX CONCURRENTLY of the holder waits for, while it waits for the holder's
    // lock (a deadlock, seen with four migrators at once).
    let mut announced = false;
    while !sqlx::query_scalar::<_, bool>(
        "SELECT pg_try_advisory_lock(hashtext('load_control_migrate'))",
    )
    .fetch_one(&mut conn)
    .await?
    {
        if !announced {
            tracing::info!(
                event = "migration_waiting",
                "another migrate is running; waiting for it"
            );
            announced = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut result = migrate_locked(&mut conn).await;
    if let (Ok(_), Some(role)) = (&result, runtime_role)
        && let Err(e) = grant_runtime_role(&mut conn, role).await
    {
        result = Err(e);
    }
    sqlx::query("SELECT pg_advisory_unlock(hashtext('load_control_migrate'))")
        .execute(&mut conn)
        .await?;
    let version = result?;
    conn.close().await?;
    Ok(version)
}

async fn grant_runtime_role(conn: &mut PgConnection, role: &str) -> Result<()> {
    let quoted: Option<String> =
        sqlx::query_scalar("SELECT quote_ident(rolname) FROM pg_roles WHERE rolname = $1")
            .bind(role)
            .fetch_optional(&mut *conn)
            .await?;
    let Some(quoted) = quoted else {
        return Err(LedgerError::Database(sqlx::Error::Configuration(
            format!(
                "database.runtime_role {role:?} is not a role of this PostgreSQL: create it \
                 (CREATE ROLE ... LOGIN) or name the role the pods connect as"
            )
            .into(),
        )));
    };
    sqlx::query("SET lock_timeout = 0")
        .execute(&mut *conn)
        .await?;
    let mut tx = conn.begin().await?;
    for statement in RUNTIME_GRANTS
        .lines()
        .filter(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
        .split(";\n")
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let statement = statement.trim_end_matches(';').replace("{role}", &quoted);
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *tx)
            .await?;
    }
    crate::functions::grant_server_functions(&mut tx, &quoted).await?;
    tx.commit().await?;
    tracing::info!(
        event = "runtime_role_granted",
        role,
        "granted the runtime privileges to {role}"
    );
    Ok(())
}

/// How long a statement of a migration waits for a table lock before it gives up: while an ACCESS
/// EXCLUSIVE request waits (an ADD COLUMN, a trigger, behind a `pg_dump` or a long report), every
/// NiFi write to the table queues behind it, so the wait is kept short and retried instead.
const LOCK_TIMEOUT: &str = "1s";
/// Pause between two attempts of a migration whose lock wait timed out: the writers that queued
/// behind it go through meanwhile.
const LOCK_RETRY_PAUSE: Duration = Duration::from_secs(2);
/// Attempts before `migrate` gives up on a lock (about five minutes).
const LOCK_ATTEMPTS: u32 = 100;

/// Applies the last of `prefix` when it is pending (the earlier ones are applied already), online:
/// a transactional migration's lock waits end after [`LOCK_TIMEOUT`] and are retried; a
/// `-- no-transaction` one (one CONCURRENTLY statement, which blocks no write) waits as long as it
/// must. An index that a failed CONCURRENTLY build left INVALID is dropped first, so the build runs
/// again instead of `IF NOT EXISTS` keeping the broken index.
async fn apply_one(conn: &mut PgConnection, prefix: &[Migration]) -> Result<()> {
    let this = prefix.last().expect("a migration");
    let mut migrator = Migrator::with_migrations(prefix.to_vec());
    migrator.set_ignore_missing(true);
    let mut attempt = 0;
    loop {
        attempt += 1;
        drop_invalid_indexes(conn).await?;
        let timeout = if this.no_tx { "0" } else { LOCK_TIMEOUT };
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SET lock_timeout = '{timeout}'"
        )))
        .execute(&mut *conn)
        .await?;
        match migrator.run(&mut *conn).await {
            Ok(()) => return Ok(()),
            Err(e) if lock_timed_out(&e) && attempt < LOCK_ATTEMPTS => {
                tracing::warn!(
                    event = "migration_lock_wait",
                    migration = this.version,
                    attempt,
                    "migration {} {} waited {LOCK_TIMEOUT} for a table lock (a long reader or \
                     writer holds it) and gave way to the queries queued behind it; trying again",
                    this.version,
                    this.description
                );
                tokio::time::sleep(LOCK_RETRY_PAUSE).await;
            }
            Err(e) => {
                return Err(match e {
                    MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _) => e.into(),
                    other => LedgerError::Database(sqlx::Error::Migrate(Box::new(other))),
                });
            }
        }
    }
}

/// SQLSTATE 55P03 (lock_not_available): the migration's lock wait reached `lock_timeout`.
fn lock_timed_out(e: &MigrateError) -> bool {
    let db = match e {
        MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _) => e.as_database_error(),
        _ => None,
    };
    db.and_then(|d| d.code()).as_deref() == Some("55P03")
}

/// Drops the INVALID indexes of schema `nifi_ops`: what a CONCURRENTLY build that failed (a
/// deadlock, a cancelled hook) leaves behind, unused by queries but written by every insert.
async fn drop_invalid_indexes(conn: &mut PgConnection) -> Result<()> {
    let invalid: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
           JOIN pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname = 'nifi_ops' AND NOT i.indisvalid",
    )
    .fetch_all(&mut *conn)
    .await?;
    for name in invalid {
        tracing::warn!(event = "invalid_index_dropped", index = %name, "dropping the INVALID index {name} a failed build left, to build it again");
        sqlx::query("SET lock_timeout = 0")
            .execute(&mut *conn)
            .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP INDEX CONCURRENTLY IF EXISTS nifi_ops.\"{}\"",
            name.replace('"', "\"\"")
        )))
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

async fn migrate_locked(conn: &mut PgConnection) -> Result<i32> {
    let before = read_version(conn).await?;
    if before > *SUPPORTED_SCHEMA.end() {
        return Err(LedgerError::SchemaUnsupported(SchemaMismatch {
            database: before,
            supported: SUPPORTED_SCHEMA,
        }));
    }
    let all: Vec<Migration> = MIGRATOR.iter().cloned().collect();
    for upto in 0..all.len() {
        apply_one(conn, &all[..=upto]).await?;
    }
    sqlx::query("RESET lock_timeout")
        .execute(&mut *conn)
        .await?;
    crate::functions::apply_server_functions(conn).await?;
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

//! The PostgreSQL store: pool, whole-transaction retries (CONTRACT §3.9) and run locking (§3.10,
//! §5.3). Every operation in `ops` runs through `transaction!` and takes its locks through here.
use crate::connections::{DatabaseFault, Retirement};
use crate::error::{LedgerError, Result};
use crate::status::RunStatus;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use std::time::{Duration, Instant};
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct LedgerConfig {
    /// Attempts per transaction on 40P01/40001, the first included (`database.tx_attempts`).
    pub tx_attempts: u32,
    /// `jobs.require_registered`: creating a run needs a non-removed `load_job` row.
    pub require_registered: bool,
    /// Global retention and stale thresholds; jobs may override them (§10.3).
    pub thresholds: crate::settings::Thresholds,
    /// `cleanup.max_batch`: cap of cleanup candidates and of the monitor's `cleanupDue`.
    pub cleanup_max_batch: i64,
    /// `dispatch.lease`: a leased outbox row is taken again after this long (§6.3).
    pub dispatch_lease: std::time::Duration,
    /// `database.pool_max_lifetime`: no pooled connection is used after this age.
    pub pool_max_lifetime: std::time::Duration,
    /// `cleanup.history_batch` and `cleanup.history_archive` (§7.2 rule 7); the retention itself
    /// is `thresholds.history_retention`.
    pub history: crate::settings::HistorySettings,
    /// `database.password_file`: the password of the pool's connections, read again every
    /// `dsn::PASSWORD_RECHECK` (a rotation needs no restart).
    pub password_file: Option<std::path::PathBuf>,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            tx_attempts: 3,
            require_registered: false,
            thresholds: Default::default(),
            cleanup_max_batch: 200,
            dispatch_lease: std::time::Duration::from_secs(60),
            pool_max_lifetime: std::time::Duration::from_secs(600),
            history: Default::default(),
            password_file: None,
        }
    }
}

/// Observes how long partition calls wait for the run row (`lca_run_lock_wait_seconds`).
pub trait LockWaitObserver: Send + Sync {
    fn observe(&self, seconds: f64);
}

#[derive(Clone)]
pub struct Ledger {
    pub(crate) pool: PgPool,
    pub(crate) config: LedgerConfig,
    pub(crate) lock_wait: Option<std::sync::Arc<dyn LockWaitObserver>>,
    pub(crate) retirement: Retirement,
    /// The last reading of the schema version (`crate::schema`).
    pub(crate) schema: crate::schema::SchemaGate,
    /// The installation this process belongs to and the claim it last found (`ops::owner`).
    pub(crate) owner: crate::ops::owner::OwnerGate,
    /// How often the pool took a new password from `database.password_file`.
    pub(crate) password_reloads: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The task that keeps the pool's password equal to the file's, ended with the last clone.
    password_refresh: Option<std::sync::Arc<PasswordRefresh>>,
}

/// Ends the password refresh task when dropped (it holds the pool, which would outlive the ledger).
struct PasswordRefresh(tokio::task::AbortHandle);

impl Drop for PasswordRefresh {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Ledger {
    pub fn new(pool: PgPool, config: LedgerConfig) -> Self {
        Self::with_retirement(pool, config, Retirement::default())
    }

    fn with_retirement(pool: PgPool, config: LedgerConfig, retirement: Retirement) -> Self {
        Ledger {
            pool,
            config,
            lock_wait: None,
            retirement,
            schema: Default::default(),
            owner: Default::default(),
            password_reloads: Default::default(),
            password_refresh: None,
        }
    }

    pub fn with_lock_wait_observer(mut self, o: std::sync::Arc<dyn LockWaitObserver>) -> Self {
        self.lock_wait = Some(o);
        self
    }

    /// Opens a pool of `size` connections (+ `overflow` opened on demand and closed when idle):
    /// the lazy pool, and one connection made now, so that an unreachable database is an error.
    pub async fn connect(
        url: &str,
        size: u32,
        overflow: u32,
        config: LedgerConfig,
    ) -> Result<Self> {
        let ledger = Self::connect_lazy(url, size, overflow, config)?;
        drop(ledger.pool.acquire().await?);
        Ok(ledger)
    }

    /// The same pool, connecting in the background: a database that is not there yet (a process
    /// started before it, a failover) is waited out, never a reason to exit. Only a malformed URL
    /// is an error. Every operation meanwhile fails as the database being unavailable.
    pub fn connect_lazy(url: &str, size: u32, overflow: u32, config: LedgerConfig) -> Result<Self> {
        let retirement = Retirement::default();
        let dsn = crate::dsn::Dsn::new(url).with_password_file(config.password_file.clone());
        // Read once: the pool's options and the refresh task start from the same password.
        let password = dsn.file_password().map_err(|e| {
            sqlx::Error::Configuration(format!("database.password_file: {e}").into())
        })?;
        let connect = Self::connect_options(&dsn, password.as_deref())?;
        let pool =
            Self::pool_options(size, overflow, &config, &retirement).connect_lazy_with(connect);
        let mut ledger = Ledger::with_retirement(pool, config, retirement);
        if dsn.password_file.is_some()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let task = runtime.spawn(crate::dsn::keep_password_fresh(
                ledger.pool.clone(),
                dsn,
                password,
                Self::connect_options,
                ledger.password_reloads.clone(),
            ));
            ledger.password_refresh =
                Some(std::sync::Arc::new(PasswordRefresh(task.abort_handle())));
        }
        Ok(ledger)
    }

    /// The pool's connections: the URL, the password file's password, named `load-control`.
    fn connect_options(
        dsn: &crate::dsn::Dsn,
        password: Option<&str>,
    ) -> std::result::Result<PgConnectOptions, sqlx::Error> {
        Ok(dsn.options_with(password)?.application_name("load-control"))
    }

    /// A retired or too old connection is closed when acquired or released. (A new connection is
    /// not tested for writes: sqlx would retry such a refusal until `acquire_timeout`, so every
    /// request would wait 10 s for its 503; a write refused on it retires it at once instead.)
    fn pool_options(
        size: u32,
        overflow: u32,
        config: &LedgerConfig,
        retirement: &Retirement,
    ) -> PgPoolOptions {
        let on_acquire = retirement.clone();
        let on_release = retirement.clone();
        // No ping before each acquire (one round trip per transaction, issue 30): a connection
        // whose server went away is found out by its BEGIN instead (`Ledger::begin`). The `size`
        // connections stay open and warm (no idle timeout: sqlx's reaper would close and reopen
        // them after every lull, forking backends and preparing statements again); overflow
        // connections, and every connection, are renewed at `pool_max_lifetime`.
        PgPoolOptions::new()
            .min_connections(size)
            .max_connections(size + overflow)
            .acquire_timeout(Duration::from_secs(10))
            .test_before_acquire(false)
            .idle_timeout(None)
            .max_lifetime(config.pool_max_lifetime)
            .before_acquire(move |_, meta| {
                let keep = !on_acquire.is_retired(meta.age);
                Box::pin(async move { Ok(keep) })
            })
            .after_release(move |_, meta| {
                let keep = !on_release.is_retired(meta.age);
                Box::pin(async move { Ok(keep) })
            })
    }

    /// A transaction on a live connection. The pool hands connections out untested, so a
    /// connection whose server went away since (a restart, a failover, a terminated backend)
    /// fails its BEGIN: nothing ran on it, so every connection of that server is retired and
    /// BEGIN is tried again on a new one, at most `BEGIN_ATTEMPTS` times in all.
    pub(crate) async fn begin(
        &self,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        const BEGIN_ATTEMPTS: u32 = 3;
        let mut attempt = 1;
        loop {
            match self.pool.begin().await {
                Err(e) if attempt < BEGIN_ATTEMPTS && connection_lost(&e) => {
                    tracing::info!(event = "db_connection_lost", error = %e, "a pooled connection was closed by its server; retrying on a new one");
                    self.retirement.retire_all(DatabaseFault::of(&e));
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// `e` says a statement's connection was closed by its server (a restart, a failover, a
    /// terminated backend): every connection of that server is retired, and the caller may try
    /// again on a new one.
    pub(crate) fn lost_connection(&self, e: &LedgerError) -> bool {
        match e {
            LedgerError::Database(db) if connection_lost(db) => {
                tracing::info!(event = "db_connection_lost", error = %db, "a pooled connection was closed by its server; retrying on a new one");
                self.retirement.retire_all(DatabaseFault::of(db));
                true
            }
            _ => false,
        }
    }

    /// Whether attempt `attempt` of a transaction (or of a statement run alone) that failed with
    /// `e` is to be made again: a deadlock or a serialization failure, after a backoff; a lost
    /// connection too when `lost_connection_too` (a statement alone may have committed, which
    /// only a repeatable statement may try again). Otherwise the error is observed (its server
    /// retired when it cannot take writes) and stands.
    pub(crate) async fn again_after(
        &self,
        e: &LedgerError,
        attempt: u32,
        lost_connection_too: bool,
    ) -> bool {
        if attempt < self.config.tx_attempts {
            if lost_connection_too && self.lost_connection(e) {
                return true;
            }
            if e.is_retryable() {
                tracing::warn!(event = "tx_retry", attempt, error = %e, "transaction retried");
                tokio::time::sleep(Ledger::backoff(attempt)).await;
                return true;
            }
        }
        self.observe_error(e);
        false
    }

    /// Retires the pool's connections when `e` says their server cannot take writes now.
    pub(crate) fn observe_error(&self, e: &LedgerError) {
        let fault = match e {
            LedgerError::Database(db) => DatabaseFault::of(db),
            LedgerError::Unwritable(_) => DatabaseFault::ReadOnly,
            _ => return,
        };
        if fault.retires_connections() {
            self.retirement.retire_all(fault);
        }
    }

    /// Whether a transaction whose COMMIT failed committed all the same. When the server ends a
    /// connection during COMMIT (a terminated backend, a restart), the commit may have happened:
    /// PostgreSQL keeps a commit whose wait for a synchronous standby was cut short ("the
    /// transaction has already committed locally"). Answering that as an error would tell NiFi a
    /// decision did not happen when it did, and a decision such as a validation start or a stage
    /// verdict is not repeatable (its replay is refused), so the run would wait for a person.
    /// The transaction's last event is its witness: visible from a new connection (on whichever
    /// server the address now names, a standby included, where only committed rows are visible),
    /// the transaction committed. Looked for a few times (a standby may not have replayed it yet),
    /// then the error stands: the outcome is unknown, as before.
    pub(crate) async fn committed_after_all(&self, e: &sqlx::Error, marker: Option<Uuid>) -> bool {
        let Some(event_id) = marker else {
            return false;
        };
        if !connection_lost(e) {
            return false;
        }
        self.retirement.retire_all(DatabaseFault::of(e));
        const LOOKS: u32 = 5;
        for look in 1..=LOOKS {
            let seen: std::result::Result<bool, sqlx::Error> = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM nifi_ops.load_event WHERE event_id = $1)",
            )
            .bind(event_id)
            .fetch_one(&self.pool)
            .await;
            if let Ok(true) = seen {
                tracing::warn!(event = "commit_confirmed", error = %e, %event_id, looks = look,
                    "the connection was lost during COMMIT; the transaction's event is there, so it committed");
                return true;
            }
            if look < LOOKS {
                tokio::time::sleep(Ledger::backoff(look)).await;
            }
        }
        tracing::warn!(event = "commit_unknown", error = %e, %event_id,
            "the connection was lost during COMMIT and the transaction's event was not found: answered as failed");
        false
    }

    /// Connections closed because their server could not take writes (a metric).
    pub fn connections_retired(&self) -> u64 {
        self.retirement.retired_total()
    }

    /// How often the pool took a new password from `database.password_file` since it started.
    pub fn password_reloads(&self) -> u64 {
        self.password_reloads
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Readiness (§4.23, **[v1-ext]** "can write"): one transaction that writes a WAL record and
    /// commits, so it waits for a synchronous standby exactly as a real write would, and fails
    /// on a read-only server or one in recovery. Writes no row: the record is a transactional
    /// logical-decoding message (a transaction id alone writes no WAL, and PostgreSQL does not
    /// make such a commit wait for a standby). The caller bounds it in time.
    ///
    /// First of all, the database's schema version is read and judged (`crate::schema`): a binary
    /// that does not run on it is not ready, whatever the server.
    pub async fn write_check(&self) -> Result<()> {
        self.check_schema().await?;
        let outcome: Result<()> = async {
            let mut tx = self.begin().await?;
            if let Some(why) = server_takes_writes(&mut tx).await? {
                return Err(LedgerError::Unwritable(why));
            }
            sqlx::query("SELECT pg_logical_emit_message(true, 'load-control-readyz', '')")
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        }
        .await;
        if let Err(e) = &outcome {
            self.observe_error(e);
        }
        outcome
    }

    pub fn config(&self) -> &LedgerConfig {
        &self.config
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// `SELECT 1`, for readiness probes.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub(crate) fn backoff(attempt: u32) -> Duration {
        Duration::from_millis(50 << (attempt - 1).min(6))
    }
}

/// The connection itself is gone (its server closed it, or the socket broke), not the statement
/// refused: `Ledger::begin` may take another connection.
fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("57P01" | "57P02")),
        _ => false,
    }
}

/// `None` when the server behind `conn` takes writes, else what it is (a standby, read-only).
async fn server_takes_writes(conn: &mut PgConnection) -> Result<Option<String>, sqlx::Error> {
    let (recovery, read_only): (bool, String) =
        sqlx::query_as("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")
            .fetch_one(&mut *conn)
            .await?;
    Ok(if recovery {
        Some("is a standby in recovery".to_string())
    } else if read_only == "on" {
        Some("is read-only".to_string())
    } else {
        None
    })
}

/// Runs `$body` (an expression using `$conn: &mut PgConnection`) in one READ COMMITTED transaction:
/// commit on `Ok`, roll back on `Err`, and re-run the whole body on a deadlock or serialization
/// failure, up to `tx_attempts` attempts (50 ms, 100 ms, … between them). Nothing is begun when
/// this binary does not run on the database's schema version (`SchemaUnsupported`).
macro_rules! transaction {
    ($ledger:expr, |$conn:ident| $body:expr) => {{
        let ledger: &$crate::store::Ledger = $ledger;
        let mut attempt: u32 = 0;
        loop {
            // Nothing is begun by a binary that does not run on the schema (`crate::schema`).
            if attempt == 0
                && let Err(e) = ledger.admit_write().await
            {
                break Err(e);
            }
            attempt += 1;
            let outcome: $crate::error::LedgerResult<_> = $crate::store::COMMIT_MARKER
                .scope(std::cell::Cell::new(None), async {
                    let mut tx = ledger.begin().await?;
                    let value = {
                        let $conn: &mut sqlx::PgConnection = &mut *tx;
                        let body: $crate::error::LedgerResult<_> = $body.await;
                        body?
                    };
                    match tx.commit().await {
                        Ok(()) => Ok(value),
                        Err(e) => {
                            let marker = $crate::store::COMMIT_MARKER.with(|m| m.get());
                            if ledger.committed_after_all(&e, marker).await {
                                Ok(value)
                            } else {
                                Err(e.into())
                            }
                        }
                    }
                })
                .await;
            let e = match outcome {
                Ok(value) => break Ok(value),
                Err(e) => e,
            };
            if !ledger.again_after(&e, attempt, false).await {
                break Err(e);
            }
        }
    }};
}
pub(crate) use transaction;

tokio::task_local! {
    /// The id of the last event the running [`transaction!`] inserted (`Event::insert`): the row
    /// that tells whether the transaction committed when its COMMIT got no answer.
    pub(crate) static COMMIT_MARKER: std::cell::Cell<Option<Uuid>>;
}

/// `$body` on a pooled connection without BEGIN: one statement on its own is its own
/// transaction, so a decision that a server-side function makes whole (a chunk report's
/// progress, a claim) costs one round trip. Retried like [`transaction!`] on a deadlock or a
/// serialization failure, and also on a lost connection: unlike a BEGIN, such a statement may
/// have committed before its connection was lost, so only a statement whose repetition finds
/// its own write and answers the same may run here.
macro_rules! alone {
    ($ledger:expr, |$conn:ident| $body:expr) => {{
        let ledger: &$crate::store::Ledger = $ledger;
        let mut attempt: u32 = 0;
        loop {
            if attempt == 0
                && let Err(e) = ledger.admit_write().await
            {
                break Err(e);
            }
            attempt += 1;
            let outcome: $crate::error::LedgerResult<_> = async {
                let mut pooled = ledger.pool.acquire().await?;
                let $conn: &mut sqlx::PgConnection = &mut pooled;
                $body.await
            }
            .await;
            let e = match outcome {
                Ok(value) => break Ok(value),
                Err(e) => e,
            };
            if !ledger.again_after(&e, attempt, true).await {
                break Err(e);
            }
        }
    }};
}
pub(crate) use alone;

/// The run key of the fairness lock (§5.3): a 64-bit hash of the run id, used in the two-int4
/// advisory key space, which the leader and sweeper locks (`hashtext`, bigint space) never share.
pub(crate) fn run_lock_key(run_id: Uuid) -> (i32, i32) {
    let b = run_id.as_u128();
    let h = (b >> 64) as u64 ^ b as u64;
    ((h >> 32) as i32, h as i32)
}

/// The run columns every operation decides on.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct RunRow {
    pub run_id: Uuid,
    pub job_key: String,
    pub business_key: String,
    pub status: String,
    pub source_count: Option<i64>,
    pub publish_token: Option<Uuid>,
    pub parameters: sqlx::types::Json<serde_json::Value>,
}

pub(crate) const RUN_COLUMNS: &str =
    "run_id, job_key, business_key, status, source_count, publish_token, parameters";

static EXCLUSIVE_RUN_LOCK: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {RUN_COLUMNS} FROM nifi_ops.load_run, pg_advisory_xact_lock($2, $3) \
          WHERE run_id = $1 FOR UPDATE OF load_run"
    )
});

impl RunRow {
    pub fn status(&self) -> Result<RunStatus> {
        RunStatus::parse(&self.status)
            .ok_or_else(|| LedgerError::Corrupt(format!("run status {}", self.status)))
    }
}

impl Ledger {
    /// A read-only snapshot of one run's rows (§3.9: multi-statement reads see one state);
    /// `RunNotFound` when the run does not exist.
    pub(crate) async fn run_snapshot(
        &self,
        run_id: Uuid,
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        let mut tx = self.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        let exists: Option<(i32,)> =
            sqlx::query_as("SELECT 1 FROM nifi_ops.load_run WHERE run_id = $1")
                .bind(run_id)
                .fetch_optional(&mut *tx)
                .await?;
        exists.ok_or(LedgerError::RunNotFound)?;
        Ok(tx)
    }

    /// `lock_run` for partition calls (claims, chunk reports, partition failures), whose wait is
    /// `lca_run_lock_wait_seconds`.
    pub(crate) async fn lock_run_timed(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
    ) -> Result<RunRow> {
        let started = Instant::now();
        let row = self.lock_run(conn, run_id).await;
        if let Some(o) = &self.lock_wait {
            o.observe(started.elapsed().as_secs_f64());
        }
        row
    }

    /// The sweeper's lock (§3.10): never waits for a run an API request holds; `None` when busy
    /// (or missing, or no longer in `status`).
    pub(crate) async fn try_lock_run(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        status: &str,
    ) -> Result<Option<RunRow>> {
        // The status first, without a lock: the tick's locks last until it commits, so a run that
        // has moved on must not be held (its reports would wait for the whole tick).
        let in_status: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM nifi_ops.load_run WHERE run_id = $1 AND status = $2)",
        )
        .bind(run_id)
        .bind(status)
        .fetch_one(&mut *conn)
        .await?;
        if !in_status {
            return Ok(None);
        }
        // The locks are taken under a savepoint: when there is nothing to do after all (the run
        // moved on between the check and the lock, its row is held by a report, its partition was
        // refreshed), rolling back to it lets both go at once instead of at the tick's end.
        sqlx::query("SAVEPOINT sweeper_run_lock")
            .execute(&mut *conn)
            .await?;
        let (k1, k2) = run_lock_key(run_id);
        let (got,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_xact_lock($1, $2)")
            .bind(k1)
            .bind(k2)
            .fetch_one(&mut *conn)
            .await?;
        let row: Option<RunRow> = if got {
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT {RUN_COLUMNS} FROM nifi_ops.load_run WHERE run_id = $1 AND status = $2 FOR UPDATE SKIP LOCKED"
            )))
            .bind(run_id)
            .bind(status)
            .fetch_optional(&mut *conn)
            .await?
        } else {
            None
        };
        if row.is_none() {
            self.let_go_of_run(conn).await?;
        }
        Ok(row)
    }

    /// After [`Self::try_lock_run`] found nothing to do: its locks are released now.
    pub(crate) async fn let_go_of_run(&self, conn: &mut PgConnection) -> Result<()> {
        sqlx::query("ROLLBACK TO SAVEPOINT sweeper_run_lock")
            .execute(&mut *conn)
            .await?;
        sqlx::query("RELEASE SAVEPOINT sweeper_run_lock")
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// After [`Self::try_lock_run`] and the work done under it: the locks stay until the tick ends.
    pub(crate) async fn keep_run(&self, conn: &mut PgConnection) -> Result<()> {
        sqlx::query("RELEASE SAVEPOINT sweeper_run_lock")
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// Locks the run exclusively (fair advisory lock, then the row FOR UPDATE: everything that
    /// changes or ends the run, §3.10, §5.3 rule 2) and reads it; `RunNotFound` when missing.
    pub(crate) async fn lock_run(&self, conn: &mut PgConnection, run_id: Uuid) -> Result<RunRow> {
        let (k1, k2) = run_lock_key(run_id);
        // One round trip: the advisory lock is taken while the row is read, and the row lock
        // (LockRows, above the join) only after it. The row may have been read from a snapshot
        // older than the advisory wait; `FOR UPDATE` follows the update chain and re-checks the
        // newest version, so its columns are current. (Reports and claims hold the run shared, in
        // their server-side functions, and re-read the status after their locks:
        // `nifi_ops.claim_partition`, migration 20261204000013, says why.)
        let row: Option<RunRow> = sqlx::query_as(sqlx::AssertSqlSafe(EXCLUSIVE_RUN_LOCK.as_str()))
            .bind(run_id)
            .bind(k1)
            .bind(k2)
            .fetch_optional(&mut *conn)
            .await?;
        row.ok_or(LedgerError::RunNotFound)
    }
}

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

/// The effective settings of every job with a valid override, plus the same as parallel arrays for
/// `unnest(...)` in SQL (job keys; success, failed retention; stale, validation-stale seconds).
/// Jobs without one are absent: the global values apply to them.
pub(crate) struct JobThresholds {
    pub by_job: std::collections::HashMap<String, crate::settings::Thresholds>,
    pub jobs: Vec<String>,
    pub success: Vec<f64>,
    pub failed: Vec<f64>,
    pub stale: Vec<f64>,
    pub validation_stale: Vec<f64>,
}

impl JobThresholds {
    /// The smallest value of `pick` over the global settings and every job's: the widest net a
    /// sweeper rule casts in SQL before judging each run by its own job's value.
    pub fn min_of(
        &self,
        global: &crate::settings::Thresholds,
        pick: impl Fn(&crate::settings::Thresholds) -> std::time::Duration,
    ) -> std::time::Duration {
        self.by_job
            .values()
            .map(&pick)
            .fold(pick(global), std::cmp::min)
    }

    /// The effective settings of `job`.
    pub fn of<'a>(
        &'a self,
        job: &str,
        global: &'a crate::settings::Thresholds,
    ) -> &'a crate::settings::Thresholds {
        self.by_job.get(job).unwrap_or(global)
    }
}

impl Ledger {
    /// Reads the non-removed `load_job` settings now, so a change applies from the next request.
    pub(crate) async fn job_thresholds(&self, conn: &mut PgConnection) -> Result<JobThresholds> {
        let rows: Vec<(String, sqlx::types::Json<serde_json::Value>)> = sqlx::query_as(
            "SELECT job_key, settings FROM nifi_ops.load_job WHERE removed_at IS NULL AND settings <> '{}'::jsonb",
        )
        .fetch_all(&mut *conn)
        .await?;
        let mut t = JobThresholds {
            by_job: Default::default(),
            jobs: vec![],
            success: vec![],
            failed: vec![],
            stale: vec![],
            validation_stale: vec![],
        };
        for (job, settings) in rows {
            match crate::settings::effective(
                &self.config.thresholds,
                &settings.0,
                self.config.dispatch_lease,
            ) {
                Ok(e) => {
                    t.jobs.push(job.clone());
                    t.success.push(e.success_retention.as_secs_f64());
                    t.failed.push(e.failed_retention.as_secs_f64());
                    t.stale.push(e.stale.as_secs_f64());
                    t.validation_stale.push(e.validation_stale.as_secs_f64());
                    t.by_job.insert(job, e);
                }
                Err(why) => {
                    tracing::warn!(event = "job_settings_invalid", job_key = %job, reason = %why, "job settings ignored")
                }
            }
        }
        Ok(t)
    }
}

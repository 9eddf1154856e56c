//! The PostgreSQL store: the ledger's pool, its connections' lifecycle and the retry decisions
//! (CONTRACT §3.9). Transactions are `transactions`, run locks `run_lock`, NOTIFY `notify`.
use crate::connections::{DatabaseFault, Retirement, connection_lost};
use crate::error::{LedgerError, Result};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use std::time::Duration;

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
    pub(crate) owner: crate::owner::OwnerGate,
    /// The highest epoch and ledger clock this process has seen (`ops::continuity`).
    pub(crate) continuity: std::sync::Arc<crate::continuity::Continuity>,
    /// The pool's password following `database.password_file` (none without one).
    pub(crate) password: Option<std::sync::Arc<crate::dsn::PoolPassword>>,
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
            continuity: Default::default(),
            password: None,
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
        drop(ledger.acquire().await?);
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
            let password = std::sync::Arc::new(crate::dsn::PoolPassword::new(
                ledger.pool.clone(),
                dsn,
                password,
                Self::connect_options,
            ));
            ledger.password = Some(password.clone());
            let task = runtime.spawn(crate::dsn::keep_password_fresh(password));
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
            let password = self.password_generation();
            match self.pool.begin().await {
                Err(e) if attempt < BEGIN_ATTEMPTS && connection_lost(&e) => {
                    tracing::info!(event = "db_connection_lost", error = %e, "a pooled connection was closed by its server; retrying on a new one");
                    self.retirement.retire_all(DatabaseFault::of(&e));
                    attempt += 1;
                }
                Err(e)
                    if attempt < BEGIN_ATTEMPTS
                        && self.password_taken_after(&e, password).await =>
                {
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// A pooled connection, for one statement on its own (`alone!`); see [`Ledger::begin`].
    pub(crate) async fn acquire(
        &self,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, sqlx::Error> {
        let password = self.password_generation();
        match self.pool.acquire().await {
            Err(e) if self.password_taken_after(&e, password).await => self.pool.acquire().await,
            other => other,
        }
    }

    /// Which password the pool has (how many it took before it).
    fn password_generation(&self) -> u64 {
        self.password.as_ref().map_or(0, |p| p.generation())
    }

    /// `e` is PostgreSQL refusing the password the pool had at `generation`, and the pool has
    /// taken the file's newer one since, or takes it now (a rotation reached PostgreSQL before
    /// this process took the file's new password): the caller may try again, once. A password
    /// refused for any other reason costs no second attempt, and a burst of refusals one check.
    async fn password_taken_after(&self, e: &sqlx::Error, generation: u64) -> bool {
        match &self.password {
            Some(password) if crate::dsn::password_refused(e) => {
                password.follow_file(password.checks()).await;
                password.generation() != generation
            }
            _ => false,
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

    /// Connections closed because their server could not take writes (a metric).
    pub fn connections_retired(&self) -> u64 {
        self.retirement.retired_total()
    }

    /// How often the pool took a new password from `database.password_file` since it started.
    pub fn password_reloads(&self) -> u64 {
        self.password_generation()
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
        sqlx::query("SELECT 1")
            .execute(&mut *self.acquire().await?)
            .await?;
        Ok(())
    }

    pub(crate) fn backoff(attempt: u32) -> Duration {
        Duration::from_millis(50 << (attempt - 1).min(6))
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

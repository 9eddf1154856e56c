//! Run locks (CONTRACT §3.10, §5.3): the fair advisory lock and the row lock of everything that
//! changes or ends a run, the sweeper's lock that never waits, and the run columns decided on.
use crate::error::{LedgerError, Result};
use crate::status::RunStatus;
use crate::store::Ledger;
use sqlx::PgConnection;
use std::time::Instant;
use uuid::Uuid;

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
        // `nifi_ops.claim_partition_v2` says why.)
        let row: Option<RunRow> = sqlx::query_as(sqlx::AssertSqlSafe(EXCLUSIVE_RUN_LOCK.as_str()))
            .bind(run_id)
            .bind(k1)
            .bind(k2)
            .fetch_optional(&mut *conn)
            .await?;
        row.ok_or(LedgerError::RunNotFound)
    }
}

/// The run's heartbeat, written by a decision that holds its lock (the sweeper's reissue, a
/// validation's metrics): at once and whatever the status, unlike a NiFi report's
/// (`nifi_ops.beat_run`, at most once a second and never waiting).
pub(crate) async fn beat_locked_run(conn: &mut PgConnection, run_id: Uuid) -> Result<()> {
    sqlx::query("UPDATE nifi_ops.load_run SET heartbeat_at = clock_timestamp() WHERE run_id = $1")
        .bind(run_id)
        .execute(conn)
        .await?;
    Ok(())
}

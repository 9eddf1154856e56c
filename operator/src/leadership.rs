//! Who may run the dispatcher and sweeper. Each acquisition bumps the ledger's fencing epoch
//! (CONTRACT §7.1); the Kubernetes Lease implementation comes with the operator issue, this one is
//! the standalone mode's PostgreSQL advisory lock held on a dedicated connection.
use ledger::{Fence, Ledger};
use sqlx::{Connection, PgConnection};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Fixed by the contract (§7.1): how often a follower tries again.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

pub trait Leadership: Send {
    /// Waits until this process leads, then bumps the epoch and returns the fence.
    fn acquire(&mut self) -> impl std::future::Future<Output = anyhow::Result<Fence>> + Send;
    /// Resolves when leadership is lost (the lock's connection died, the lease expired).
    fn lost(&mut self) -> impl std::future::Future<Output = ()> + Send;
    /// Gives leadership up (on shutdown, or after being fenced).
    fn release(&mut self) -> impl std::future::Future<Output = ()> + Send;
}

/// `pg_advisory_lock(hashtext('load_control_leader'))` on a dedicated connection: the lock lives
/// exactly as long as that session.
pub struct AdvisoryLockLeadership {
    dsn: ledger::Dsn,
    ledger: Ledger,
    holder: String,
    conn: Option<PgConnection>,
}

impl AdvisoryLockLeadership {
    pub fn new(dsn: impl Into<ledger::Dsn>, ledger: Ledger, holder: String) -> Self {
        AdvisoryLockLeadership {
            dsn: dsn.into(),
            ledger,
            holder,
            conn: None,
        }
    }

    async fn try_lock(&mut self) -> anyhow::Result<bool> {
        if self.conn.is_none() {
            self.conn = Some(self.dsn.connect().await?);
        }
        let conn = self.conn.as_mut().expect("connected above");
        let got: Result<(bool,), _> =
            sqlx::query_as("SELECT pg_try_advisory_lock(hashtext('load_control_leader'))")
                .fetch_one(&mut *conn)
                .await;
        match got {
            Ok((got,)) => Ok(got),
            Err(e) => {
                self.conn = None;
                Err(e.into())
            }
        }
    }
}

impl Leadership for AdvisoryLockLeadership {
    async fn acquire(&mut self) -> anyhow::Result<Fence> {
        loop {
            match self.try_lock().await {
                Ok(true) => match self.ledger.acquire_epoch(&self.holder).await {
                    Ok(fence) => return Ok(fence),
                    // A database that cannot take writes now (a read-only standby behind a
                    // moving address, recovery, a failover): wait it out, never exit. The lock
                    // is given back so that the session it lives on is not trusted.
                    Err(e) => {
                        epoch_refused(
                            &e,
                            "holding the leader lock but cannot bump the epoch; releasing it and retrying",
                        );
                        self.release().await;
                    }
                },
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(event = "leader_lock_error", error = %e, "cannot reach the database for the leader lock")
                }
            }
            tokio::time::sleep(RETRY_PERIOD).await;
        }
    }

    async fn lost(&mut self) {
        loop {
            tokio::time::sleep(RETRY_PERIOD).await;
            let Some(conn) = self.conn.as_mut() else {
                return;
            };
            if tokio::time::timeout(RETRY_PERIOD, sqlx::query("SELECT 1").execute(&mut *conn))
                .await
                .map_or(true, |r| r.is_err())
            {
                // The session (and with it the lock) is gone, or cannot be trusted any more.
                self.conn = None;
                return;
            }
        }
    }

    async fn release(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            let _ = sqlx::query("SELECT pg_advisory_unlock(hashtext('load_control_leader'))")
                .execute(&mut conn)
                .await;
            let _ = conn.close().await;
        }
    }
}

/// Logs why an epoch could not be bumped. Another installation owning the ledger is an error an
/// operator must act on (two releases on one database): logged at error level with both
/// installations and what to do, at most once per [`OWNED_LOG_EVERY`] (the refusal is retried every
/// retry period); anything else is a warning.
pub fn epoch_refused(e: &ledger::LedgerError, what: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    if let ledger::LedgerError::OwnedByOther(c) = e {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = LAST.load(Ordering::Relaxed);
        if last == 0 || now.saturating_sub(last) >= OWNED_LOG_EVERY.as_secs() {
            LAST.store(now.max(1), Ordering::Relaxed);
            tracing::error!(event = "ledger_owned_by_other", owner = %c.owner, ours = %c.ours,
                database = %c.database, error = %e,
                "not leading: another load-control release owns this ledger database; retrying until its claim goes stale");
        }
    } else {
        tracing::warn!(event = "leader_epoch_error", error = %e, "{what}");
    }
}

/// How often the refusal of [`epoch_refused`] is logged again while it lasts.
pub const OWNED_LOG_EVERY: Duration = Duration::from_secs(30);

/// `hostname:pid` plus a random suffix, so two processes never share an identity.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| {
            std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "localhost".into())
        });
    format!(
        "{host}:{}-{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    )
}

/// How a fenced write tells the leadership loop that this process was deposed. It carries the
/// refused epoch, and only a refusal of the epoch currently held makes the loop resign: a late
/// refusal of an older epoch (a transaction still in flight when leadership changed hands) is no
/// news, and nothing is left behind to make a fresh leader resign at once.
#[derive(Clone)]
pub struct Deposed(Arc<watch::Sender<i64>>);

impl Default for Deposed {
    fn default() -> Deposed {
        Deposed(Arc::new(watch::channel(0).0))
    }
}

impl Deposed {
    /// A write under `epoch` was refused by the fence.
    pub fn report(&self, epoch: i64) {
        self.0.send_if_modified(|highest| {
            let newer = epoch > *highest;
            if newer {
                *highest = epoch;
            }
            newer
        });
    }

    /// Resolves once a write under `epoch` (or a later one) has been refused.
    pub async fn wait(&self, epoch: i64) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|highest| *highest >= epoch).await;
    }
}

#[cfg(test)]
mod deposed_tests {
    use super::Deposed;
    use std::time::Duration;

    async fn resolves(d: &Deposed, epoch: i64) -> bool {
        tokio::time::timeout(Duration::from_millis(50), d.wait(epoch))
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn only_a_refusal_of_the_held_epoch_deposes() {
        let d = Deposed::default();
        assert!(!resolves(&d, 1).await, "nothing refused yet");
        d.report(1);
        assert!(resolves(&d, 1).await, "epoch 1 was refused");
        // A stale refusal of epoch 1 arriving after epoch 2 was won leaves no permit behind.
        assert!(!resolves(&d, 2).await, "the new leader of epoch 2 stays");
        d.report(1);
        assert!(
            !resolves(&d, 2).await,
            "a late refusal of an older epoch is no news"
        );
        d.report(2);
        assert!(resolves(&d, 2).await);
    }
}

//! Who may run the dispatcher and sweeper. Each acquisition bumps the ledger's fencing epoch
//! (CONTRACT §7.1); the Kubernetes Lease implementation comes with the operator issue, this one is
//! the standalone mode's PostgreSQL advisory lock held on a dedicated connection.
use crate::metrics::Metrics;
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

/// How often the leader advances the ledger's clock (`ledger::ops::continuity`): a restore from
/// backup under a running leader is noticed within this long.
pub const LEDGER_CLOCK_EVERY: Duration = Duration::from_secs(2);

/// While leading: advances the ledger's clock and refreshes this installation's claim on the
/// ledger, each on its own, every [`LEDGER_CLOCK_EVERY`] (or [`Ledger::owner_refresh_every`] when
/// shorter). Resolves
/// only when leading must stop: the ledger went back (restored from backup), the claim was lost
/// (another installation took the ledger over after ours went stale), or a write was fenced;
/// other errors (the database away) are retried, as the renew deadline of the leadership itself
/// governs those.
pub async fn keep_watch(ledger: &Ledger, fence: &Fence, deposed: &Deposed) -> ledger::LedgerError {
    let every = ledger
        .owner_refresh_every()
        .map_or(LEDGER_CLOCK_EVERY, |o| o.min(LEDGER_CLOCK_EVERY));
    loop {
        tokio::time::sleep(every).await;
        let clock = ledger.advance_clock(fence).await.map(|_| ());
        let claim = ledger.refresh_owner(fence).await;
        for outcome in [clock, claim] {
            match outcome {
                Ok(()) => {}
                Err(
                    e @ (ledger::LedgerError::OwnedByOther(_) | ledger::LedgerError::WentBack(_)),
                ) => return e,
                Err(e @ ledger::LedgerError::Fenced { .. }) => {
                    deposed.report(fence.epoch);
                    return e;
                }
                Err(e) => {
                    tracing::warn!(event = "ledger_watch_error", error = %e, "advancing the ledger's clock or refreshing its claim failed; retrying")
                }
            }
        }
    }
}

/// How long, after a restore, the dispatcher and sweeper wait at most for the LoadRuns' comparison.
pub const COMPARISON_LIMIT: Duration = Duration::from_secs(120);

/// What a leader publishes: `all` (the Kubernetes tasks) at once on acquiring; `deciding` (the
/// dispatcher and sweeper) at the same time, except after an acquisition that found the ledger
/// gone back (restored from backup): then only once the LoadRun mirror has compared every LoadRun
/// with the ledger under this epoch (`compared`), so that a run the LoadRuns had shown published
/// is held before a VALIDATE_RUN dispatch of the restored outbox can start its publish again.
/// Standalone (`compared` None) there are no LoadRuns to compare.
pub struct Fences {
    pub all: watch::Sender<Option<Fence>>,
    pub deciding: watch::Sender<Option<Fence>>,
    pub compared: Option<watch::Receiver<i64>>,
}

/// Competes for leadership until `release` is sent, publishing the fences while leading. Losing
/// leadership (the Lease's renew deadline passed, the lock's session died, a write was fenced,
/// the ledger went back) withdraws them: every leader task stops acting at once, and acts again
/// only under the fence of a new acquisition, with a new epoch.
pub async fn lead<L: Leadership>(
    mut leadership: L,
    ledger: Ledger,
    mut fences: Fences,
    mut release: watch::Receiver<bool>,
    deposed: Deposed,
    metrics: Arc<Metrics>,
) -> anyhow::Result<()> {
    loop {
        let went_back_before = ledger.went_back_count();
        let fence = tokio::select! {
            f = leadership.acquire() => f?,
            _ = release.wait_for(|s| *s) => break,
        };
        tracing::info!(event = "leader_acquired", epoch = fence.epoch, holder = %fence.holder, "this process leads");
        let went_back = ledger.went_back_count() > went_back_before;
        metrics.ledger_went_back_to(ledger.went_back_count());
        metrics.leading(true);
        let _ = fences.all.send(Some(fence.clone()));
        let open_decisions = async {
            if let (true, Some(compared)) = (went_back, fences.compared.as_mut()) {
                tracing::warn!(
                    event = "decisions_held",
                    epoch = fence.epoch,
                    "the ledger went back: the dispatcher and sweeper wait until every LoadRun was compared with it"
                );
                let waited = tokio::time::timeout(
                    COMPARISON_LIMIT,
                    compared.wait_for(|e| *e >= fence.epoch),
                )
                .await;
                if waited.is_ok() {
                    tracing::info!(
                        event = "decisions_resumed",
                        epoch = fence.epoch,
                        "every LoadRun was compared with the restored ledger: the dispatcher and sweeper resume"
                    );
                } else {
                    // A LoadRun that cannot be mirrored must not stop every decision for ever.
                    tracing::error!(
                        event = "decisions_resumed_uncompared",
                        epoch = fence.epoch,
                        limit_s = COMPARISON_LIMIT.as_secs(),
                        "not every LoadRun could be compared with the restored ledger in time (see loadrun_mirror_run_error): the dispatcher and sweeper resume; check the runs of those LoadRuns by hand"
                    );
                }
            }
            let _ = fences.deciding.send(Some(fence.clone()));
            std::future::pending::<()>().await
        };
        let stop = tokio::select! {
            _ = open_decisions => unreachable!("pending for ever"),
            _ = leadership.lost() => { tracing::warn!(event = "leader_lost", epoch = fence.epoch, "leadership lost"); false }
            _ = deposed.wait(fence.epoch) => { tracing::warn!(event = "leader_lost", epoch = fence.epoch, "fenced by a newer epoch"); false }
            e = keep_watch(&ledger, &fence, &deposed) => {
                if let ledger::LedgerError::WentBack(found) = &e {
                    tracing::error!(event = "ledger_went_back", epoch = fence.epoch,
                        seen_tick = found.seen_tick, ledger_tick = found.ledger_tick,
                        seen_epoch = found.seen_epoch, ledger_epoch = found.ledger_epoch,
                        "{found}: every leader task stops now; leading again under a new epoch, whose \
                         tasks read the ledger afresh (docs/operations.md, \"After a restore\")");
                } else {
                    epoch_refused(&e, "leadership lost");
                    tracing::warn!(event = "leader_lost", epoch = fence.epoch, error = %e, "the ledger's claim was lost");
                }
                false
            }
            _ = release.wait_for(|s| *s) => true,
        };
        let _ = fences.deciding.send(None);
        let _ = fences.all.send(None);
        metrics.leading(false);
        metrics.ledger_went_back_to(ledger.went_back_count());
        if stop {
            break;
        }
        leadership.release().await;
    }
    leadership.release().await;
    tracing::info!(event = "leader_released", "leadership released");
    Ok(())
}

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

//! Which installation owns the ledger (issue 27 item 5: two releases sharing one ledger database
//! are refused). The leader epoch row is global, so two installations on one database would fence
//! each other for ever and each dispatcher would lease the other's dispatches. One row,
//! `nifi_ops.ledger_owner`, names the installation whose leader last claimed the ledger; it is
//! claimed in the transaction that bumps the epoch ([`Ledger::acquire_epoch`]) and refreshed while
//! leading ([`Ledger::refresh_owner`]). A leader of another installation that finds a claim
//! refreshed within its staleness window bumps nothing and does not lead
//! ([`LedgerError::OwnedByOther`]); a stale claim (that release uninstalled) is taken over.
//! Times are the database's clock, so no two nodes' clocks are compared.
use super::leader::{Fence, check_fence};
use crate::error::{LedgerError, Result};
use crate::store::{Ledger, transaction};
use sqlx::PgConnection;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The shortest staleness window: a claim refreshed less than this long ago is never taken over.
pub const MIN_OWNER_STALE: Duration = Duration::from_secs(60);

/// How long a claim outlives its last refresh when nothing says otherwise: 3 × the leader lease's
/// duration, at least [`MIN_OWNER_STALE`]. The operator and the api-server of one release derive
/// it from the same lease duration, so they agree on when another release's claim is fresh.
pub fn default_owner_stale(lease_duration: Duration) -> Duration {
    (lease_duration * 3).max(MIN_OWNER_STALE)
}

/// This process's installation and what it last found of another's claim.
#[derive(Debug, Clone, Default)]
pub(crate) struct OwnerGate {
    /// None: this process claims nothing (tools, tests, the api-server) and is never refused.
    installation: Option<Installation>,
    conflict: Arc<Mutex<Option<OwnerConflict>>>,
}

#[derive(Debug, Clone)]
struct Installation {
    name: String,
    stale_after: Duration,
}

impl OwnerGate {
    fn set(&self, conflict: Option<OwnerConflict>) {
        *self.conflict.lock().unwrap_or_else(|p| p.into_inner()) = conflict;
    }
}

/// The ledger is owned by another installation whose claim is fresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerConflict {
    /// The installation that owns the ledger, e.g. `team-a/load-control-leader`.
    pub owner: String,
    /// Its leader when it last claimed.
    pub holder: String,
    /// This process's installation.
    pub ours: String,
    /// Seconds since the owner last refreshed its claim.
    pub refreshed_s_ago: u64,
    /// After how long without a refresh the claim is taken over.
    pub stale_after_s: u64,
    /// The ledger database (as the server names it).
    pub database: String,
}

impl std::fmt::Display for OwnerConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "two load-control releases share the ledger database {:?}: release {} (leader {}, claim \
             refreshed {} s ago) owns it, and this release {} does not lead, dispatch or sweep; \
             give each release its own database, or uninstall the other release (its claim is \
             taken over {} s after its last refresh)",
            self.database,
            self.owner,
            self.holder,
            self.refreshed_s_ago,
            self.ours,
            self.stale_after_s
        )
    }
}

impl std::error::Error for OwnerConflict {}

impl Ledger {
    /// This process belongs to `installation` (under Kubernetes `<namespace>/<lease name>`,
    /// standalone the configured name): its leader claims the ledger for it, and is refused while
    /// another installation's claim was refreshed less than `stale_after` ago (at least
    /// [`MIN_OWNER_STALE`] outside tests: the caller chooses).
    pub fn with_installation(mut self, installation: &str, stale_after: Duration) -> Self {
        self.owner = OwnerGate {
            installation: Some(Installation {
                name: installation.to_string(),
                stale_after,
            }),
            conflict: Default::default(),
        };
        self
    }

    /// How often a leader refreshes its claim: a quarter of the staleness window (at least 1 s);
    /// None without an installation.
    pub fn owner_refresh_every(&self) -> Option<Duration> {
        self.owner
            .installation
            .as_ref()
            .map(|i| (i.stale_after / 4).max(Duration::from_secs(1)))
    }

    /// What the last claim, refresh or [`Ledger::check_owner`] found: another installation's
    /// fresh claim, or None.
    pub fn owner_conflict(&self) -> Option<OwnerConflict> {
        self.owner
            .conflict
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the claim now (readiness): `OwnedByOther` while another installation's claim is
    /// fresh. No claim, our own, or a stale one: Ok.
    pub async fn check_owner(&self) -> Result<()> {
        let Some(ours) = &self.owner.installation else {
            return Ok(());
        };
        let mut conn = self.pool.acquire().await?;
        let found = foreign_claim(&mut conn, ours).await;
        self.remember(found)
    }

    fn remember(&self, found: Result<Option<OwnerConflict>>) -> Result<()> {
        match found {
            Ok(conflict) => {
                self.owner.set(conflict.clone());
                conflict.map_or(Ok(()), |c| Err(LedgerError::OwnedByOther(c)))
            }
            Err(e) => Err(e),
        }
    }

    /// While leading: the claim's time is refreshed (fenced). Refused when another installation
    /// took the ledger over meanwhile (our claim had gone stale).
    pub async fn refresh_owner(&self, fence: &Fence) -> Result<()> {
        let Some(ours) = self.owner.installation.clone() else {
            return Ok(());
        };
        let found = transaction!(self, |conn| async {
            check_fence(conn, fence).await?;
            claim(conn, &ours, &fence.holder).await
        });
        self.remember(found)
    }
}

/// Inside the epoch bump's transaction: claims the ledger for our installation (a new claim, our
/// own, or a stale one taken over), or returns the fresh foreign claim (nothing written).
pub(crate) async fn claim_in_tx(
    ledger: &Ledger,
    conn: &mut PgConnection,
    holder: &str,
) -> Result<()> {
    let Some(ours) = &ledger.owner.installation else {
        return Ok(());
    };
    let found = claim(conn, ours, holder).await;
    ledger.remember(found)
}

async fn claim(
    conn: &mut PgConnection,
    ours: &Installation,
    holder: &str,
) -> Result<Option<OwnerConflict>> {
    let claimed: Option<(String,)> = sqlx::query_as(
        "INSERT INTO nifi_ops.ledger_owner AS o (singleton, installation, holder, claimed_at) \
              VALUES (true, $1, $2, clock_timestamp()) \
         ON CONFLICT (singleton) DO UPDATE \
                SET installation = EXCLUDED.installation, holder = EXCLUDED.holder, \
                    claimed_at = clock_timestamp() \
              WHERE o.installation = EXCLUDED.installation \
                 OR o.claimed_at < clock_timestamp() - make_interval(secs => $3) \
         RETURNING o.installation",
    )
    .bind(&ours.name)
    .bind(holder)
    .bind(ours.stale_after.as_secs_f64())
    .fetch_optional(&mut *conn)
    .await?;
    if claimed.is_some() {
        return Ok(None);
    }
    foreign_claim(conn, ours).await
}

async fn foreign_claim(
    conn: &mut PgConnection,
    ours: &Installation,
) -> Result<Option<OwnerConflict>> {
    let row: Option<(String, String, f64, String)> = sqlx::query_as(
        "SELECT installation, holder, \
                extract(epoch FROM clock_timestamp() - claimed_at)::float8, current_database()::text \
           FROM nifi_ops.ledger_owner \
          WHERE installation <> $1 AND claimed_at >= clock_timestamp() - make_interval(secs => $2)",
    )
    .bind(&ours.name)
    .bind(ours.stale_after.as_secs_f64())
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|(owner, holder, ago, database)| OwnerConflict {
        owner,
        holder,
        ours: ours.name.clone(),
        refreshed_s_ago: ago.max(0.0) as u64,
        stale_after_s: ours.stale_after.as_secs(),
        database,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three lease durations, never under a minute: what the operator and the api-server of one
    /// release both derive from the lease, so that they agree on when a claim is stale.
    #[test]
    fn the_default_staleness_is_three_leases_and_at_least_a_minute() {
        let s = Duration::from_secs;
        assert_eq!(default_owner_stale(s(15)), s(60));
        assert_eq!(default_owner_stale(s(20)), s(60));
        assert_eq!(default_owner_stale(s(30)), s(90));
        assert_eq!(default_owner_stale(s(100)), s(300));
    }

    /// A leader refreshes its claim four times per staleness window, so one missed refresh never
    /// lets another release take the ledger over, and never more than once a second (a zero
    /// period would be a loop of writes). cargo-mutants: `Some(Default::default())` survived.
    #[tokio::test]
    async fn a_claim_is_refreshed_four_times_per_staleness_window_and_at_most_once_a_second() {
        let s = Duration::from_secs;
        let ledger = Ledger::connect_lazy(
            "postgres://nobody@127.0.0.1:1/none",
            1,
            0,
            crate::store::LedgerConfig::default(),
        )
        .unwrap();
        assert_eq!(ledger.owner_refresh_every(), None, "no installation");
        assert_eq!(
            ledger
                .clone()
                .with_installation("ns/lease", s(60))
                .owner_refresh_every(),
            Some(s(15))
        );
        assert_eq!(
            ledger
                .with_installation("ns/lease", s(2))
                .owner_refresh_every(),
            Some(s(1))
        );
    }
}

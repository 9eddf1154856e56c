//! Which installation owns the ledger (issue 27 item 5: two releases sharing one ledger database
//! are refused). The leader epoch row is global, so two installations on one database would fence
//! each other for ever and each dispatcher would lease the other's dispatches. One row,
//! `nifi_ops.ledger_owner`, names the installation whose leader last claimed the ledger; it is
//! claimed in the transaction that bumps the epoch ([`Ledger::acquire_epoch`]) and refreshed while
//! leading ([`Ledger::refresh_owner`]). A leader of another installation that finds a claim
//! refreshed within its staleness window bumps nothing and does not lead
//! ([`LedgerError::OwnedByOther`]); a stale claim (that release uninstalled) is taken over.
//! Times are the database's clock, so no two nodes' clocks are compared.
use super::fence::{Fence, check_fence};
use crate::error::{LedgerError, Result};
use crate::owner::{Installation, OwnerConflict, OwnerGate};
use crate::store::Ledger;
use crate::transactions::transaction;
use sqlx::PgConnection;
use std::time::Duration;

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
        let mut conn = self.acquire().await?;
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

//! Which installation owns the ledger, as this process knows it: the types the store keeps and
//! the error it refuses with. The claim itself is read and written by `ops::owner`.
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
    pub(crate) installation: Option<Installation>,
    pub(crate) conflict: Arc<Mutex<Option<OwnerConflict>>>,
}

#[derive(Debug, Clone)]
pub(crate) struct Installation {
    pub(crate) name: String,
    pub(crate) stale_after: Duration,
}

impl OwnerGate {
    pub(crate) fn set(&self, conflict: Option<OwnerConflict>) {
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
}

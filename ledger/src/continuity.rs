//! What this process knows of the ledger's past, and what it found when the ledger went back: the
//! types the store keeps. Read and written by `ops::continuity`, which says why.
use std::sync::atomic::{AtomicI64, AtomicU64};

/// What this process has seen of the ledger's past, shared by every clone of one `Ledger`.
#[derive(Debug, Default)]
pub(crate) struct Continuity {
    /// The highest fencing epoch known to have been issued.
    pub(crate) highest_epoch: AtomicI64,
    /// The highest `ledger_clock.tick` seen committed.
    pub(crate) highest_tick: AtomicI64,
    /// How often the ledger was found to have gone back.
    pub(crate) went_back: AtomicU64,
}

/// What was found when the ledger went back: what this process had seen, and what the ledger
/// holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WentBack {
    pub seen_tick: i64,
    pub ledger_tick: i64,
    pub seen_epoch: i64,
    pub ledger_epoch: i64,
}

impl std::fmt::Display for WentBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the ledger went back: its clock is at {} (this process saw {} committed), its leader \
             epoch at {} (issued up to {}); the database was restored to an earlier point, or failed \
             over to a standby that lacked commits",
            self.ledger_tick, self.seen_tick, self.ledger_epoch, self.seen_epoch
        )
    }
}

//! A ledger that went back (issue 40 item 6): a restore from backup to an earlier point, or a
//! failover to a standby that lacked commits. The leader's fencing epoch and everything it decided
//! are then ahead of the ledger, and two things must hold anyway:
//!
//! * **an epoch is never issued twice**: the acquisition takes the epoch above both the row's and
//!   the highest this process (or, under Kubernetes, the Lease) has seen, so a deposed leader still
//!   holding an epoch issued before the restore never passes the fence of a later leader;
//! * **the leader notices**: `nifi_ops.ledger_clock` is a counter the leader advances, fenced,
//!   every few seconds and at every acquisition. A process remembers the highest value it saw
//!   committed; the counter found lower than that, or the epoch row lower than the epoch held,
//!   is [`LedgerError::WentBack`]. The leader then stops deciding, and leads again only under a
//!   new epoch, whose tasks read the ledger afresh (the mirror moves its LoadRuns back to what the
//!   ledger holds).
//!
//! The memory is this process's (shared by its clones of the ledger) plus what the caller feeds
//! in with [`Ledger::remember_epoch`] and [`Ledger::set_known_clock`] (the Lease's annotations):
//! standalone processes that all restart after a restore know nothing of the time before it, and
//! the acquisition falls back to the row's epoch + 1, as before.
use super::fence::{Fence, check_fence};
use crate::continuity::WentBack;
use crate::error::{LedgerError, Result};
use crate::store::Ledger;
use crate::transactions::transaction;
use sqlx::PgConnection;
use std::sync::atomic::Ordering;

impl Ledger {
    /// An epoch known to have been issued (e.g. read from the Lease): never issued again.
    pub fn remember_epoch(&self, epoch: i64) {
        self.continuity
            .highest_epoch
            .fetch_max(epoch, Ordering::SeqCst);
    }

    /// The clock value the last leader saw committed (read from the Lease when taking it over):
    /// replaces this process's own memory, which may predate a restore that leader accepted.
    pub fn set_known_clock(&self, tick: i64) {
        self.continuity.highest_tick.store(tick, Ordering::SeqCst);
    }

    /// The highest epoch and clock value this process knows of, for the Lease's annotations.
    pub fn continuity_marks(&self) -> (i64, i64) {
        (
            self.continuity.highest_epoch.load(Ordering::SeqCst),
            self.continuity.highest_tick.load(Ordering::SeqCst),
        )
    }

    /// How often this process, acquiring an epoch, found the ledger gone back (a metric).
    pub fn went_back_count(&self) -> u64 {
        self.continuity.went_back.load(Ordering::Relaxed)
    }

    /// While leading: advances the clock, fenced. [`LedgerError::WentBack`] when the clock (or
    /// the epoch row) is below what this process saw; then nothing is written.
    pub async fn advance_clock(&self, fence: &Fence) -> Result<i64> {
        let tick = transaction!(self, |conn| async {
            match check_fence(conn, fence).await {
                Err(LedgerError::Fenced {
                    ours,
                    current: Some(current),
                }) if current < ours => {
                    let ledger_tick = read_clock(conn).await?;
                    return Err(self.went_back(ledger_tick, current));
                }
                other => other?,
            }
            let ledger_tick = read_clock(conn).await?;
            if ledger_tick < self.continuity_marks().1 {
                return Err(self.went_back(ledger_tick, fence.epoch));
            }
            tick(conn).await
        })?;
        self.continuity
            .highest_tick
            .fetch_max(tick, Ordering::SeqCst);
        Ok(tick)
    }

    fn went_back(&self, ledger_tick: i64, ledger_epoch: i64) -> LedgerError {
        // Counted by the acquisition that follows, which finds the same (once per restore).
        let (seen_epoch, seen_tick) = self.continuity_marks();
        LedgerError::WentBack(WentBack {
            seen_tick,
            ledger_tick,
            seen_epoch,
            ledger_epoch,
        })
    }
}

/// Inside the epoch acquisition's transaction, with the epoch row locked: the epoch to issue (above
/// the row's and every epoch this process knows of) and the clock advanced. The ledger found gone
/// back is logged (`ledger_went_back`), counted and accepted: the new leader reads it afresh.
pub(crate) async fn acquisition_in_tx(
    ledger: &Ledger,
    conn: &mut PgConnection,
    row_epoch: Option<i64>,
) -> Result<(i64, i64)> {
    let (seen_epoch, seen_tick) = ledger.continuity_marks();
    let ledger_tick = read_clock(conn).await?;
    let row = row_epoch.unwrap_or(0);
    // A ledger with neither an epoch nor a clock is new (an installation on an empty database,
    // the Lease kept from an earlier one): nothing went back.
    let new_ledger = row_epoch.is_none() && ledger_tick == 0;
    if !new_ledger && (ledger_tick < seen_tick || row < seen_epoch) {
        ledger.continuity.went_back.fetch_add(1, Ordering::Relaxed);
        let found = WentBack {
            seen_tick,
            ledger_tick,
            seen_epoch,
            ledger_epoch: row,
        };
        tracing::error!(
            event = "ledger_went_back",
            seen_tick,
            ledger_tick,
            seen_epoch,
            ledger_epoch = row,
            "{found}; taking a new epoch above every one issued and reading the ledger afresh: runs \
             decided after the restore point are no longer in it (docs/operations.md, \"After a restore\")"
        );
    }
    let epoch = row.max(seen_epoch) + 1;
    let tick = tick(conn).await?;
    Ok((epoch, tick))
}

/// Called after the acquisition committed: what it issued and advanced is now the memory (the
/// clock's memory may go down to the restored value: the ledger was accepted as it is).
pub(crate) fn acquired(ledger: &Ledger, epoch: i64, tick: i64) {
    ledger.remember_epoch(epoch);
    ledger.continuity.highest_tick.store(tick, Ordering::SeqCst);
}

/// The clock's value (0 before its first tick), its row locked.
async fn read_clock(conn: &mut PgConnection) -> Result<i64> {
    let row: Option<(i64,)> =
        sqlx::query_as("SELECT tick FROM nifi_ops.ledger_clock WHERE singleton FOR UPDATE")
            .fetch_optional(&mut *conn)
            .await?;
    Ok(row.map_or(0, |r| r.0))
}

async fn tick(conn: &mut PgConnection) -> Result<i64> {
    let (tick,): (i64,) = sqlx::query_as(
        "INSERT INTO nifi_ops.ledger_clock AS c (singleton, tick) VALUES (true, 1) \
         ON CONFLICT (singleton) DO UPDATE SET tick = c.tick + 1, ticked_at = clock_timestamp() \
         RETURNING tick",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(tick)
}

//! The sweeper (CONTRACT §7.2): periodic recovery for what no request will ever report — stale
//! partitions, run deadlines, unacknowledged dispatches, stale validations and publishes, event
//! retention. One fenced transaction per tick; each rule in its own savepoint so one failing rule
//! does not stop the others. The rules that end or reissue work are in `recovery`, the ones that
//! watch and retain in `watch`, the statements they plan with in `queries`.
mod queries;
mod recovery;
mod watch;

use super::fence::{Fence, check_fence};
use crate::error::Result;
use crate::store::Ledger;
use crate::transactions::transaction;
pub use queries::*;
use std::collections::BTreeMap;

/// What one tick did: non-zero action counters by rule name (`lca_sweeper_actions_total{rule}`),
/// DEAD dispatches by type (`lca_dispatch_total{result="dead"}`), and rules that failed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SweepReport {
    pub actions: BTreeMap<&'static str, u64>,
    pub dead_by_type: BTreeMap<String, u64>,
    pub rule_errors: Vec<(&'static str, String)>,
    /// The tick's transactions: more than one when it held [`RUNS_HELD_PER_TRANSACTION`] runs
    /// and went on in another.
    pub transactions: u32,
    /// The most runs one of them held to its commit (each a subtransaction with an xid).
    pub most_held: usize,
}

/// Runs one tick transaction holds at most (each under a savepoint that took its locks and wrote,
/// hence a subtransaction with an xid of its own). PostgreSQL caches 64 subtransaction ids per
/// backend (`PGPROC_MAX_CACHED_SUBXIDS`); past that every snapshot taken anywhere in the database
/// while the tick runs must look transactions up in `pg_subtrans`. With the rules' own savepoints
/// (6) the tick stays below the cache; what is left goes on in the next transaction of the tick.
pub const RUNS_HELD_PER_TRANSACTION: usize = 48;

/// How many transactions one tick may take (a bound on a loop, not a limit anyone should meet:
/// 48 × 100 runs acted on in one tick).
const TRANSACTIONS_PER_TICK: u32 = 100;

#[derive(Default)]
struct Counts {
    actions: BTreeMap<&'static str, u64>,
    dead_by_type: BTreeMap<String, u64>,
    /// Runs this rule holds to the end of the transaction (kept savepoints).
    held: usize,
    /// How many more it may hold in this transaction.
    room: usize,
    /// A candidate was left because the transaction was full.
    deferred: bool,
}

impl Counts {
    fn with_room(room: usize) -> Counts {
        Counts {
            room,
            ..Counts::default()
        }
    }

    fn add(&mut self, rule: &'static str, n: u64) {
        if n > 0 {
            *self.actions.entry(rule).or_default() += n;
        }
    }

    /// False (and the rest deferred to the tick's next transaction) when this transaction holds
    /// as many runs as it may.
    fn may_hold_another(&mut self) -> bool {
        if self.held >= self.room {
            self.deferred = true;
            return false;
        }
        true
    }
}

const RULES: [&str; 6] = [
    "stale_partitions",
    "run_deadline",
    "unacked_dispatches",
    "stale_alert",
    "publish_stale",
    "event_retention",
];

/// Seconds, for `make_interval(secs => …)`.
fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

impl Ledger {
    /// One tick. `None` when another sweeper holds the tick lock (nothing done).
    pub async fn sweep(&self, fence: &Fence) -> Result<Option<SweepReport>> {
        let mut report = SweepReport::default();
        loop {
            let Some(round) = self.sweep_transaction(fence).await? else {
                if report.transactions == 0 {
                    return Ok(None);
                }
                // Another sweeper took the tick lock between two of this tick's transactions:
                // what is left is its to do.
                break;
            };
            report.transactions += 1;
            for (k, v) in round.report.actions {
                *report.actions.entry(k).or_default() += v;
            }
            for (k, v) in round.report.dead_by_type {
                *report.dead_by_type.entry(k).or_default() += v;
            }
            report.rule_errors.extend(round.report.rule_errors);
            report.most_held = report.most_held.max(round.report.most_held);
            if !round.deferred || report.transactions >= TRANSACTIONS_PER_TICK {
                break;
            }
        }
        // Rule 7 (history retention) after the tick's transactions, in short ones of its own.
        self.history_into(fence, &mut report).await?;
        Ok(Some(report))
    }

    /// One transaction of a tick: rules 1–6, holding at most [`RUNS_HELD_PER_TRANSACTION`] runs.
    async fn sweep_transaction(&self, fence: &Fence) -> Result<Option<SweepRound>> {
        transaction!(self, |conn| async {
            check_fence(conn, fence).await?;
            let (got,): (bool,) = sqlx::query_as(
                "SELECT pg_try_advisory_xact_lock(hashtext('load_control_sweeper'))",
            )
            .fetch_one(&mut *conn)
            .await?;
            if !got {
                return Ok(None);
            }
            let jobs = self.job_thresholds(conn).await?;
            let mut report = SweepReport::default();
            let (mut held, mut deferred) = (0, false);
            for (i, rule) in RULES.iter().enumerate() {
                sqlx::query(sqlx::AssertSqlSafe(format!("SAVEPOINT sweeper_rule_{i}")))
                    .execute(&mut *conn)
                    .await?;
                let mut counts = Counts::with_room(RUNS_HELD_PER_TRANSACTION - held);
                let result = match i {
                    0 => self.rule_stale_partitions(conn, &jobs, &mut counts).await,
                    1 => self.rule_run_deadline(conn, &jobs, &mut counts).await,
                    2 => self.rule_unacked_dispatches(conn, &jobs, &mut counts).await,
                    3 => self.rule_stale_alert(conn, &jobs, &mut counts).await,
                    4 => self.rule_publish_stale(conn, &jobs, &mut counts).await,
                    _ => self.rule_event_retention(conn, &jobs, &mut counts).await,
                };
                match result {
                    Ok(()) => {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "RELEASE SAVEPOINT sweeper_rule_{i}"
                        )))
                        .execute(&mut *conn)
                        .await?;
                        // A rolled-back rule's subtransactions are gone with it; a kept one's
                        // stay until the commit.
                        held += counts.held;
                        deferred |= counts.deferred;
                        for (k, v) in counts.actions {
                            *report.actions.entry(k).or_default() += v;
                        }
                        for (k, v) in counts.dead_by_type {
                            *report.dead_by_type.entry(k).or_default() += v;
                        }
                    }
                    Err(e) if e.is_retryable() => return Err(e),
                    Err(e) => {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "ROLLBACK TO SAVEPOINT sweeper_rule_{i}"
                        )))
                        .execute(&mut *conn)
                        .await?;
                        tracing::error!(event = "sweeper_rule_error", rule, error = %e, "sweeper rule failed; its changes were rolled back");
                        report.rule_errors.push((rule, e.to_string()));
                    }
                }
            }
            report.most_held = held;
            Ok(Some(SweepRound { report, deferred }))
        })
    }
}

/// What one transaction of a tick did, and whether it left runs for the next one.
struct SweepRound {
    report: SweepReport,
    deferred: bool,
}

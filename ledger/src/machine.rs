//! The run state machine as one table (CONTRACT §2.2): every status change a run may make, and
//! what entering its target status does. This table is the source; the other two places that need
//! it are generated from it and held equal by `ledger/tests/run_machine.rs`:
//!
//! * the database's `nifi_ops.run_transition` (migration `20261205000019`, rows from
//!   [`sql_rows`]), which `nifi_ops.transition` reads and which the trigger
//!   `tr_load_run_transition_allowed` enforces on every UPDATE of `load_run.status`, a hand-written
//!   one included (SQLSTATE [`TRANSITION_REFUSED`]);
//! * the spin model's `RUN_TRANSITION(a, b)` (`spec/model/run_transitions.pml`, from
//!   [`promela`]), asserted after every modelled transaction (`@property transitions`).
use crate::status::RunStatus::{self, *};

/// SQLSTATE raised by the database for a status change that is not in [`RUN_TRANSITIONS`].
pub const TRANSITION_REFUSED: &str = "LC002";

/// Every `(from, to)` of §2.2, in the contract's order. A run is created CREATED; nothing else
/// moves it.
pub const RUN_TRANSITIONS: &[(RunStatus, RunStatus)] = &[
    (Created, Extracting),
    (Created, FailedManifest),
    (Created, TimedOut),
    (Extracting, TimedOut),
    (Extracting, ExtractedValidated),
    (Extracting, FailedExtract),
    (Extracting, FailedSnapshotExpired),
    (ExtractedValidated, StageValidating),
    (StageValidating, StagingValidated),
    (StageValidating, FailedStageValidation),
    (StagingValidated, Publishing),
    (StagingValidated, FailedPublish),
    (Publishing, Published),
    (Publishing, FailedPublish),
    (Publishing, PublishUnknown),
    (PublishUnknown, Published),
    (PublishUnknown, FailedPublish),
    (Published, Success),
    (Published, FailedTargetValidation),
    // [v1-ext] an operator's cancel (§4.17): never once publishing has begun.
    (Created, Cancelled),
    (Extracting, Cancelled),
    (ExtractedValidated, Cancelled),
    (StageValidating, Cancelled),
    (StagingValidated, Cancelled),
    // [v1-ext] the ledger went back (a restore from backup) to before a publish the LoadRun had
    // shown: held for a person to decide (`Ledger::run_went_back`), never published again
    // on its own. The statuses a cancel may leave, as anything before PUBLISHING may lead to one.
    (Created, PublishUnknown),
    (Extracting, PublishUnknown),
    (ExtractedValidated, PublishUnknown),
    (StageValidating, PublishUnknown),
    (StagingValidated, PublishUnknown),
];

/// What entering `to` does, the same from every `from` (§2.1–§2.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entering {
    /// `completed_at` is set: the run is never left again.
    pub terminal: bool,
    /// Unfinished partitions become ABORTED (every failure class but TIMED_OUT, whose sweeper
    /// rule closes them as TIMED_OUT itself).
    pub aborts_partitions: bool,
    /// `last_error` of the PENDING and SENT dispatches settled as DEAD, when it settles them (any
    /// terminal status): how the dispatcher and the alerts tell them from dispatches that died.
    pub settled_dispatch_error: Option<String>,
}

/// What entering `to` does.
pub fn entering(to: RunStatus) -> Entering {
    let terminal = to.is_terminal();
    Entering {
        terminal,
        aborts_partitions: terminal && to != Success && to != TimedOut,
        settled_dispatch_error: terminal.then(|| match to {
            Cancelled => "run cancelled".to_string(),
            _ => format!("run ended: {to}"),
        }),
    }
}

/// The SQL condition "the DEAD dispatch `$d` of the run `$r` raises the DISPATCH_DEAD alert": not
/// one its run's end settled (its `last_error` one of [`Entering::settled_dispatch_error`], spelled
/// as patterns so that it implies the predicate of the partial index `ix_load_dispatch_dead_alert`)
/// and not of a CANCELLED run. The monitor's alert, the LoadJob's `deadDispatches` count and the
/// history retention's "an operator still has to look at it" all mean this.
macro_rules! alerting_dead_dispatch {
    ($d:literal, $r:literal) => {
        concat!(
            "(",
            $d,
            ".status = 'DEAD' AND COALESCE(",
            $d,
            ".last_error, '') NOT LIKE 'run ended: %' \
             AND COALESCE(",
            $d,
            ".last_error, '') <> 'run cancelled' AND ",
            $r,
            ".status <> 'CANCELLED')"
        )
    };
}
pub(crate) use alerting_dead_dispatch;

/// Whether §2.2 has `from` → `to`.
pub fn allowed(from: RunStatus, to: RunStatus) -> bool {
    RUN_TRANSITIONS.contains(&(from, to))
}

/// The `VALUES` rows of `nifi_ops.run_transition`: (from_status, to_status, terminal,
/// aborts_partitions, settled_dispatch_error), one per line, in [`RUN_TRANSITIONS`]'s order.
pub fn sql_rows() -> String {
    let rows: Vec<String> = RUN_TRANSITIONS
        .iter()
        .map(|&(from, to)| {
            let e = entering(to);
            let settled = e
                .settled_dispatch_error
                .map_or("NULL".to_string(), |s| format!("'{s}'"));
            format!(
                "    ('{from}', '{to}', {}, {}, {settled})",
                e.terminal, e.aborts_partitions
            )
        })
        .collect();
    rows.join(",\n")
}

/// `spec/model/run_transitions.pml`: the model's `RUN_TRANSITION(a, b)`.
pub fn promela() -> String {
    let mut out = String::from(
        "/* Generated from ledger/src/machine.rs (RUN_TRANSITIONS): do not edit. Regenerate with\n   \
         LC_REGENERATE=1 cargo test -p load-control-ledger --test run_machine; that test fails\n   \
         while this file is stale. */\n#define RUN_TRANSITION(a, b) ( \\\n",
    );
    let lines: Vec<String> = RUN_TRANSITIONS
        .iter()
        .map(|(from, to)| format!("    ((a) == {from} && (b) == {to})"))
        .collect();
    out.push_str(&lines.join(" || \\\n"));
    out.push_str(")\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_statuses_are_never_left_and_every_status_is_reached() {
        for &(from, to) in RUN_TRANSITIONS {
            assert!(
                !from.is_terminal(),
                "{from} → {to} leaves a terminal status"
            );
            assert_ne!(from, to);
        }
        for s in RunStatus::ALL {
            assert!(
                *s == Created || RUN_TRANSITIONS.iter().any(|&(_, to)| to == *s),
                "{s} is never entered"
            );
        }
        let mut pairs = RUN_TRANSITIONS.to_vec();
        pairs.sort();
        pairs.dedup();
        assert_eq!(pairs.len(), RUN_TRANSITIONS.len(), "a pair listed twice");
    }

    #[test]
    fn publishing_states_are_never_cancelled_and_fail_pairs_are_transitions() {
        for s in [Publishing, Published, PublishUnknown] {
            assert!(!allowed(s, Cancelled));
        }
        for &from in RunStatus::ALL {
            for &to in RunStatus::ALL {
                if crate::status::fail_transition_allowed(from, to) {
                    assert!(allowed(from, to), "/fail {from} → {to} is not a transition");
                }
            }
        }
    }

    /// `alerting_dead_dispatch!` spells the settled markers as patterns: every marker of the table
    /// must be one of them, or a settled dispatch would raise an alert.
    #[test]
    fn every_settled_marker_is_one_the_alert_condition_knows() {
        for s in RunStatus::ALL {
            if let Some(m) = entering(*s).settled_dispatch_error {
                assert!(m.starts_with("run ended: ") || m == "run cancelled", "{m}");
            }
        }
        assert_eq!(
            alerting_dead_dispatch!("d", "r"),
            "(d.status = 'DEAD' AND COALESCE(d.last_error, '') NOT LIKE 'run ended: %' \
             AND COALESCE(d.last_error, '') <> 'run cancelled' AND r.status <> 'CANCELLED')"
        );
    }

    #[test]
    fn entering_names_the_settled_dispatches() {
        assert_eq!(
            entering(Cancelled).settled_dispatch_error.as_deref(),
            Some("run cancelled")
        );
        assert_eq!(
            entering(TimedOut),
            Entering {
                terminal: true,
                aborts_partitions: false,
                settled_dispatch_error: Some("run ended: TIMED_OUT".into())
            }
        );
        assert_eq!(
            entering(PublishUnknown),
            Entering {
                terminal: false,
                aborts_partitions: false,
                settled_dispatch_error: None
            }
        );
    }
}

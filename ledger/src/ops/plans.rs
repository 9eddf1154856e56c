//! The periodic and listing statements of the ledger, by name, with representative parameters:
//! what `tests/plans.rs` EXPLAINs on a ledger with a year of history to prove that each is bounded
//! by an index (issue 26). The SQL is the very text the operations run (their `const`s and
//! `static`s), never a copy.
use super::{cleanup, dispatch, jobs, monitor, read, sweeper};

/// One statement and how the code runs it.
#[derive(Debug, Clone)]
pub struct PlannedQuery {
    pub name: &'static str,
    pub sql: &'static str,
    /// `(type, SQL literal)` of `$1`, `$2`, …: typical values.
    pub params: Vec<(&'static str, &'static str)>,
    /// The code runs it as a named (cached) prepared statement, which a pooled connection may
    /// switch to a generic plan; `false` for unnamed statements, always planned with their values.
    pub generic: bool,
}

fn q(
    name: &'static str,
    sql: &'static str,
    params: &[(&'static str, &'static str)],
    generic: bool,
) -> PlannedQuery {
    PlannedQuery {
        name,
        sql,
        params: params.to_vec(),
        generic,
    }
}

/// `$1..$7` of `JOB_CTE` + `DUE`: one job with its own settings, the default globals.
const THRESHOLDS: [(&str, &str); 7] = [
    ("text[]", "'{JOB_1}'"),
    ("float8[]", "'{172800}'"),
    ("float8[]", "'{1209600}'"),
    ("float8[]", "'{3600}'"),
    ("float8[]", "'{3600}'"),
    ("float8", "604800"),
    ("float8", "2592000"),
];

fn with_thresholds(rest: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    THRESHOLDS.iter().chain(rest).copied().collect()
}

const SINCE: (&str, &str) = ("timestamptz", "clock_timestamp() - interval '24 hours'");
const JOB: (&str, &str) = ("text", "'JOB_3'");
const RUN: (&str, &str) = ("uuid", "'00000000-0000-0000-0000-000000000001'");
/// Rule 6's due runs and their cutoffs: ten, what comes due between two ticks once the rule has
/// caught up (a tick takes at most a thousand while it catches up, when reading the run table
/// whole may well be the cheaper plan; the planner is left to choose then).
const RUNS: (&str, &str) = (
    "uuid[]",
    "array_fill('00000000-0000-0000-0000-000000000001'::uuid, ARRAY[10])",
);
const CUTOFFS: (&str, &str) = (
    "timestamptz[]",
    "array_fill(now() - interval '90 days', ARRAY[10])",
);

/// Every statement that runs periodically (monitor, gauges, sweeper, dispatcher) or lists history.
pub fn catalogue() -> Vec<PlannedQuery> {
    let mut v = vec![
        q(
            "monitor.active_runs",
            monitor::ACTIVE_RUNS.as_str(),
            &[],
            false,
        ),
        q(
            "monitor.recent_runs",
            monitor::RECENT_RUNS.as_str(),
            &[SINCE],
            false,
        ),
        q("monitor.dispatches", monitor::DISPATCH_COUNTS, &[], false),
        q("gauges.dispatches", monitor::DISPATCH_COUNTS, &[], true),
        q("gauges.runs", dispatch::RUN_COUNTS, &[], true),
        q(
            "runs.list",
            read::LIST_RUNS,
            &[("text", "NULL"), ("text", "NULL"), ("bigint", "100")],
            false,
        ),
        q(
            "runs.list_by_business_key",
            read::LIST_RUNS,
            &[("text", "'BK_77'"), ("text", "NULL"), ("bigint", "50")],
            false,
        ),
        q(
            "runs.list_of_job",
            read::LIST_RUNS_OF_JOB,
            &[
                ("text", "'JOB_1'"),
                ("text", "NULL"),
                ("text", "NULL"),
                ("bigint", "100"),
            ],
            false,
        ),
        q(
            "jobs.active_count",
            jobs::JOB_ACTIVE_COUNT.as_str(),
            &[JOB],
            true,
        ),
        q(
            "jobs.active_run",
            jobs::JOB_ACTIVE_RUN.as_str(),
            &[JOB],
            true,
        ),
        q("jobs.last_run", jobs::JOB_LAST_RUN.as_str(), &[JOB], true),
        q(
            "jobs.recent_counts",
            jobs::JOB_RECENT_COUNTS.as_str(),
            &[JOB],
            true,
        ),
        q(
            "mirror.first_page",
            jobs::MIRRORED_RUNS_FIRST,
            &[("bigint", "100")],
            true,
        ),
        q(
            "mirror.next_page",
            jobs::MIRRORED_RUNS_AFTER,
            &[
                ("bigint", "100"),
                ("timestamptz", "clock_timestamp() - interval '2 days'"),
                RUN,
            ],
            true,
        ),
        q(
            "dispatch.lease",
            dispatch::LEASE,
            &[("bigint", "20"), ("float8", "60"), ("bigint", "8")],
            true,
        ),
        q(
            "sweeper.stale_partitions",
            sweeper::STALE_PARTITION_RUNS,
            &[("float8", "3600")],
            true,
        ),
        q(
            "sweeper.stale_partitions_of_run",
            sweeper::STALE_PARTITION_DUE,
            &[RUN, ("float8", "5400")],
            true,
        ),
        q(
            "sweeper.stale_partitions_lock",
            sweeper::STALE_PARTITIONS_LOCK,
            &[RUN, ("float8", "5400")],
            true,
        ),
        q(
            "sweeper.run_deadline",
            sweeper::DEADLINE_RUNS,
            &[("float8", "21600")],
            true,
        ),
        q(
            "sweeper.unacked_dispatches",
            sweeper::UNACKED_DISPATCHES,
            &[("float8", "600")],
            true,
        ),
        q(
            "sweeper.stale_alert",
            sweeper::STALE_ALERT_DUE,
            &[
                THRESHOLDS[0],
                THRESHOLDS[4],
                ("float8", "7200"),
                ("float8", "3600"),
                ("float8", "7200"),
            ],
            true,
        ),
        q(
            "sweeper.publish_stale",
            sweeper::PUBLISH_STALE_RUNS,
            &[("float8", "7200")],
            true,
        ),
        q(
            "sweeper.event_retention_runs",
            sweeper::EVENT_RETENTION_RUNS,
            &[
                ("text[]", "'{JOB_1}'"),
                ("float8[]", "'{2592000}'"),
                ("float8", "7776000"),
                ("float8", "2592000"),
                ("bigint", "1000"),
            ],
            true,
        ),
        q(
            "sweeper.event_retention",
            sweeper::EVENT_RETENTION,
            &[RUNS, CUTOFFS],
            true,
        ),
        q(
            "sweeper.event_retention_mark",
            sweeper::EVENT_RETENTION_MARK,
            &[RUNS, CUTOFFS],
            true,
        ),
    ];
    for (name, sql, rest) in [
        (
            "monitor.cleanup_due",
            cleanup::DUE_COUNT.as_str(),
            vec![("bigint", "200"), ("float8", "172800")],
        ),
        (
            "monitor.alerts",
            monitor::ALERTS.as_str(),
            vec![
                ("float8", "5400"),
                ("float8", "7200"),
                ("bigint", "100"),
                SINCE,
            ],
        ),
        (
            "cleanup.candidates",
            cleanup::CANDIDATES.as_str(),
            vec![("bigint", "50"), ("float8", "172800")],
        ),
        (
            "cleanup.candidates_max_batch",
            cleanup::CANDIDATES.as_str(),
            vec![("bigint", "200"), ("float8", "172800")],
        ),
        (
            "cleanup.candidates_of_job",
            cleanup::CANDIDATES_OF_JOB.as_str(),
            vec![("text", "'JOB_2'"), ("bigint", "50"), ("float8", "172800")],
        ),
    ] {
        v.push(PlannedQuery {
            name,
            sql,
            params: with_thresholds(&rest),
            generic: false,
        });
    }
    v
}

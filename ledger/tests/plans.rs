//! Issue 26, "the ledger at one year": every periodic and listing statement (monitor summary,
//! gauges, run listing, cleanup candidates, the sweeper's selections and event retention, the
//! dispatcher's lease scan) is bounded by an index. A ledger with a year of history is filled in
//! SQL (tests/plans_fill.sql: 2,000 runs, 100,000 partitions, 200,000 files, 150,000 events),
//! analysed, and the plan of each statement — the very SQL the operations run, from
//! `ledger::ops::plans::catalogue()` — is read from `EXPLAIN (FORMAT JSON)` of a prepared
//! statement, with a custom plan and, for statements the code runs as named prepared statements,
//! with the generic plan a pooled connection switches to.
use ledger::ops::plans::catalogue;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;
use testkit::TestDb;

const HISTORY: [&str; 6] = [
    "load_run",
    "load_partition",
    "load_file",
    "load_event",
    "load_dispatch",
    "load_validation",
];

/// Statements whose ORDER BY … LIMIT an index serves: no Sort at all.
/// (At `cleanup.max_batch` = 200 the planner may rather sort the due window, which the partial
/// index and the end-time bound limit: checked as any other plan.)
const ORDERED_BY_INDEX: [&str; 4] = [
    "runs.list",
    "runs.list_by_business_key",
    "cleanup.candidates",
    "jobs.last_run",
];

/// Statements for one run: every history scan is a lookup by the run's key.
const BY_RUN: [&str; 2] = [
    "sweeper.stale_partitions_of_run",
    "sweeper.stale_partitions_lock",
];

/// Bounds that must appear as an Index Cond (not a Filter) in a statement's plan: a scan with only
/// `status = 'PENDING'` as its condition still reads every PENDING row when nothing is due.
const REQUIRED_BOUNDS: [(&str, &str); 13] = [
    // Rule 4 (issue 43 item 3): the alerts of the longest window one range, not a probe per stuck
    // run; the stuck runs one range of their covering index, not every stuck run.
    ("sweeper.stale_alert", "event_time > (statement_timestamp()"),
    (
        "sweeper.stale_alert",
        "heartbeat_at < (statement_timestamp()",
    ),
    (
        "jobs.recent_counts",
        "COALESCE(completed_at, heartbeat_at) >=",
    ),
    ("dispatch.lease", "next_attempt_at <= statement_timestamp()"),
    ("dispatch.lease", "leased_epoch <"),
    (
        "monitor.recent_runs",
        "COALESCE(completed_at, heartbeat_at) >=",
    ),
    ("monitor.alerts", "COALESCE(completed_at, heartbeat_at) >="),
    ("monitor.alerts", "event_time >="),
    ("sweeper.event_retention", "event_time <"),
    ("sweeper.event_retention", "run_id ="),
    ("sweeper.event_retention_runs", "events_kept_from <"),
    ("sweeper.event_retention_mark", "run_id ="),
    (
        "monitor.cleanup_due",
        "COALESCE(completed_at, heartbeat_at) <",
    ),
];

struct Indexes {
    /// index name → table name, for the history tables.
    table: BTreeMap<String, String>,
    partial: BTreeSet<String>,
}

fn walk(
    node: &Value,
    limited: bool,
    under_sort: bool,
    ix: &Indexes,
    out: &mut Vec<String>,
    scans: &mut Vec<(String, String)>,
) {
    let kind = node["Node Type"].as_str().unwrap_or_default();
    let relation = node["Relation Name"].as_str().map(str::to_string);
    let index = node["Index Name"].as_str().map(str::to_string);
    let table = relation
        .clone()
        .or_else(|| index.as_ref().and_then(|i| ix.table.get(i).cloned()));
    let history = table.as_deref().is_some_and(|t| HISTORY.contains(&t));
    if history && kind != "Bitmap Heap Scan" {
        let t = table.clone().unwrap();
        let cond = node["Index Cond"].as_str().unwrap_or_default().to_string();
        scans.push((kind.to_string(), cond.clone()));
        let whole = match kind {
            "Seq Scan" => Some(format!("Seq Scan on {t}")),
            "Index Scan" | "Index Only Scan" | "Bitmap Index Scan" => {
                let i = index.clone().unwrap_or_default();
                (cond.is_empty() && !ix.partial.contains(&i) && !limited).then(|| {
                    format!("{kind} of all of {i} on {t} (no Index Cond, not partial, no LIMIT)")
                })
            }
            _ => None,
        };
        if let Some(w) = whole {
            out.push(if under_sort {
                format!("Sort over the whole of {t}: {w}")
            } else {
                w
            });
        }
    }
    let children = node["Plans"].as_array().cloned().unwrap_or_default();
    for child in &children {
        let outer = child["Parent Relationship"].as_str() == Some("Outer");
        let keeps_limit = match kind {
            "Limit" => true,
            "Subquery Scan" | "Result" | "LockRows" | "Memoize" | "Incremental Sort" | "Append" => {
                limited
            }
            "Nested Loop" | "Merge Join" => limited && outer,
            _ => false,
        };
        let sorts = under_sort || kind == "Sort";
        walk(child, keeps_limit, sorts, ix, out, scans);
    }
}

fn sorts(node: &Value) -> usize {
    (node["Node Type"] == "Sort") as usize
        + node["Plans"]
            .as_array()
            .map_or(0, |c| c.iter().map(sorts).sum())
}

/// EXPLAINs every statement of the catalogue whose name `only` accepts; the failures, described,
/// and how many plans were checked.
async fn check(
    conn: &mut sqlx::PgConnection,
    ix: &Indexes,
    phase: &str,
    only: impl Fn(&str) -> bool,
) -> (Vec<String>, usize) {
    let mut failures = Vec::new();
    let mut checked = 0;
    for p in catalogue().into_iter().filter(|p| only(p.name)) {
        let types: Vec<&str> = p.params.iter().map(|(t, _)| *t).collect();
        let args: Vec<String> = p
            .params
            .iter()
            .map(|(t, v)| format!("({v})::{t}"))
            .collect();
        let prepare = if types.is_empty() {
            format!("PREPARE q AS {}", p.sql)
        } else {
            format!("PREPARE q ({}) AS {}", types.join(", "), p.sql)
        };
        sqlx::raw_sql(sqlx::AssertSqlSafe(prepare))
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", p.name));
        let modes: &[&str] = if p.generic {
            &["force_custom_plan", "force_generic_plan"]
        } else {
            &["force_custom_plan"]
        };
        for mode in modes {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("SET plan_cache_mode = {mode}")))
                .execute(&mut *conn)
                .await
                .unwrap();
            let execute = if args.is_empty() {
                "EXPLAIN (FORMAT JSON) EXECUTE q".to_string()
            } else {
                format!("EXPLAIN (FORMAT JSON) EXECUTE q({})", args.join(", "))
            };
            let (plan,): (Value,) = sqlx::query_as(sqlx::AssertSqlSafe(execute))
                .fetch_one(&mut *conn)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", p.name));
            let root = &plan[0]["Plan"];
            let mut problems = Vec::new();
            let mut scans = Vec::new();
            walk(root, false, false, ix, &mut problems, &mut scans);
            if ORDERED_BY_INDEX.contains(&p.name) && sorts(root) > 0 {
                problems.push("a Sort where the index serves ORDER BY … LIMIT".into());
            }
            for (_, bound) in REQUIRED_BOUNDS.iter().filter(|(n, _)| *n == p.name) {
                if !scans.iter().any(|(_, cond)| cond.contains(bound)) {
                    problems.push(format!("no index condition {bound:?}"));
                }
            }
            if BY_RUN.contains(&p.name) {
                for (kind, cond) in &scans {
                    if !cond.contains("run_id =") {
                        problems.push(format!("{kind} not by the run's key ({cond:?})"));
                    }
                }
            }
            checked += 1;
            if !problems.is_empty() {
                failures.push(format!(
                    "{} [{mode}{phase}]:\n    {}\n{}",
                    p.name,
                    problems.join("\n    "),
                    serde_json::to_string_pretty(root).unwrap()
                ));
            }
        }
        sqlx::raw_sql("DEALLOCATE q")
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    (failures, checked)
}

#[tokio::test]
async fn periodic_and_listing_statements_are_bounded_by_indexes() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    let started = Instant::now();
    // The test vacuums and analyses itself: an autovacuum worker analysing one table meanwhile
    // holds a snapshot that keeps VACUUM from setting the visibility map of the others.
    for t in HISTORY {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE nifi_ops.{t} SET (autovacuum_enabled = off)"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }
    sqlx::raw_sql(include_str!("plans_fill.sql"))
        .execute(&mut conn)
        .await
        .unwrap();
    // As autovacuum leaves an insert-only history: statistics current, visibility map set. A
    // snapshot held in this database at that moment can keep VACUUM from setting it: vacuum
    // again until it has (a condition, bounded, not a fixed wait).
    sqlx::raw_sql("ANALYZE").execute(&mut conn).await.unwrap();
    for attempt in 0.. {
        sqlx::raw_sql("VACUUM").execute(&mut conn).await.unwrap();
        let (unset,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'nifi_ops'::regnamespace AND relkind = 'r' \
               AND relpages > 0 AND relallvisible < relpages",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        if unset == 0 || attempt == 80 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let fill = started.elapsed();
    let (partitions, events): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM nifi_ops.load_partition), (SELECT count(*) FROM nifi_ops.load_event)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(
        partitions >= 99_000 && events >= 150_000,
        "{partitions} {events}"
    );
    let rows: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT c.relname::text, t.relname::text, i.indpred IS NOT NULL FROM pg_index i \
           JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid \
           JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = 'nifi_ops'",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let ix = Indexes {
        table: rows
            .iter()
            .map(|(i, t, _)| (i.clone(), t.clone()))
            .collect(),
        partial: rows
            .iter()
            .filter(|r| r.2)
            .map(|(i, _, _)| i.clone())
            .collect(),
    };
    let (vm,): (String,) = sqlx::query_as(
        "SELECT string_agg(relname || ' ' || relpages || '/' || relallvisible, ', ') FROM pg_class \
          WHERE relnamespace = 'nifi_ops'::regnamespace AND relkind = 'r'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();

    let (mut failures, checked) = check(&mut conn, &ix, "", |_| true).await;
    // Statistics from a quiet hour: ANALYZE saw no RUNNING partition, while many are running now.
    // The per-run selections must still go by the run's key, not filter every RUNNING partition
    // of ix_load_partition_live by run_id.
    sqlx::raw_sql(
        "CREATE TEMP TABLE running AS SELECT run_id, partition_id FROM nifi_ops.load_partition WHERE status = 'RUNNING'; \
         UPDATE nifi_ops.load_partition SET status = 'SUCCESS' WHERE status = 'RUNNING'; \
         ANALYZE nifi_ops.load_partition; \
         UPDATE nifi_ops.load_partition p SET status = 'RUNNING' FROM running r \
          WHERE p.run_id = r.run_id AND p.partition_id = r.partition_id",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let (aged, _) = check(&mut conn, &ix, ", aged statistics", |n| {
        n.starts_with("sweeper.") || n.starts_with("mirror.")
    })
    .await;
    failures.extend(aged);
    let names: Vec<String> = failures
        .iter()
        .map(|f| f.lines().next().unwrap_or_default().to_string())
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {checked} plans read history without an index bound (fill {fill:?}; pages/all-visible {vm}): {names:#?}\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(checked >= 25, "{checked}");
    assert!(fill.as_secs() < 60, "the fill took {fill:?}");
}

/// Issue 30: no index repeats the leading column of its table's primary key (plain, non-unique,
/// non-partial btree): the primary key already serves those lookups, and each such index costs
/// an insert per row and per non-HOT update. `ix_load_partition_status` and
/// `ix_load_file_partition_status` were such indexes (dropped by migration 20261203000006).
#[tokio::test]
async fn no_index_repeats_the_primary_key_lead() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    let repeats: Vec<(String, String)> = sqlx::query_as(
        "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) \
           FROM pg_index i \
           JOIN pg_class c ON c.oid = i.indrelid \
           JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'nifi_ops' \
           JOIN pg_index pk ON pk.indrelid = i.indrelid AND pk.indisprimary \
           JOIN pg_class ic ON ic.oid = i.indexrelid \
           JOIN pg_am am ON am.oid = ic.relam AND am.amname = 'btree' \
          WHERE NOT i.indisprimary AND NOT i.indisunique AND i.indpred IS NULL \
            AND i.indkey[0] <> 0 AND i.indkey[0] = pk.indkey[0] \
          ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(
        repeats.is_empty(),
        "indexes leading with their primary key's first column: {repeats:?}"
    );
    let (gone,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_indexes WHERE schemaname = 'nifi_ops' \
            AND indexname IN ('ix_load_partition_status', 'ix_load_file_partition_status')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(gone, 0, "the duplicate indexes stay dropped");
}

/// Issue 26: every foreign key of the ledger has an index leading with its columns, in order
/// (partial indexes count: the check's equality implies `IS NOT NULL`). Without one, deleting a
/// referenced row (history retention, §7.2 rule 7, deletes runs) scans the referencing table
/// once per row: `load_run.retry_of_run_id` had none, and each run deleted read every run.
#[tokio::test]
async fn every_foreign_key_has_an_index() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    let bare: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.conrelid::regclass::text, pg_get_constraintdef(c.oid) \
           FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace AND n.nspname = 'nifi_ops' \
          WHERE c.contype = 'f' \
            AND NOT EXISTS (SELECT 1 FROM pg_index i \
                             WHERE i.indrelid = c.conrelid \
                               AND (i.indkey::int2[])[0:cardinality(c.conkey) - 1] = c.conkey) \
          ORDER BY 1, 2",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(bare.is_empty(), "foreign keys without an index: {bare:?}");
    let (checked,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace \
          WHERE n.nspname = 'nifi_ops' AND c.contype = 'f'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(
        checked >= 5,
        "the ledger's foreign keys were found: {checked}"
    );
}

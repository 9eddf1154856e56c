//! The aged-ledger scenario (issue 26 item 3): the same figures on the ledger as it is (minutes
//! old) and after a fill in SQL of a given age (`aged_fill.sql`), in one sitting, same binaries:
//! every hot request under the lifecycle load, the monitor summary, run listing with and without a
//! job, cleanup candidates, one sweeper tick and one lease scan, the database size, and the
//! buffer pages each of those reads touches (the cause of a ratio, in pages); then history and
//! event retention are let catch up and the size is taken again.
use super::client::percentiles;
use super::scenarios::{Sizes, lifecycle};
use super::{Bench, JOB_KEY};
use anyhow::Context;
use serde_json::{Map, Value, json};
use std::time::{Duration, Instant};

/// How old the aged ledger is, and how much is measured.
#[derive(Clone, Debug)]
pub struct AgedSizes {
    pub runs: usize,
    pub partitions: usize,
    pub files: usize,
    pub days: u32,
    /// `cleanup.history_retention` for the catch-up, days.
    pub retention_days: u32,
    /// Lifecycle clients in each phase.
    pub clients: usize,
    /// Samples of each probe (HTTP reads, sweeper ticks, lease scans) per phase.
    pub samples: usize,
    /// The statements PostgreSQL spent most time on during each phase's lifecycle (needs
    /// load-bench `--statements`).
    pub statements: bool,
}

impl AgedSizes {
    /// Small enough for a run of well under a minute (release binaries).
    pub fn default_for(quick: bool) -> AgedSizes {
        if quick {
            AgedSizes {
                runs: 60,
                partitions: 4,
                files: 2,
                days: 30,
                retention_days: 10,
                clients: 4,
                samples: 5,
                statements: false,
            }
        } else {
            AgedSizes {
                runs: 1_000,
                partitions: 20,
                files: 3,
                days: 365,
                retention_days: 180,
                clients: 16,
                samples: 50,
                statements: false,
            }
        }
    }
}

/// The holder name of this process's epoch while it measures the sweeper and the dispatcher.
const HOLDER: &str = "load-bench-aged";

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Database size (bytes) and rows of each history table.
async fn sizes(b: &Bench) -> anyhow::Result<Value> {
    let mut db = b.db().await?;
    let (bytes,): (i64,) = sqlx::query_as("SELECT pg_database_size(current_database())")
        .fetch_one(&mut db)
        .await?;
    let mut rows = Map::new();
    for t in [
        "load_run",
        "load_partition",
        "load_file",
        "load_validation",
        "load_dispatch",
        "load_event",
    ] {
        let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM nifi_ops.{t}"
        )))
        .fetch_one(&mut db)
        .await?;
        rows.insert(t.into(), n.into());
    }
    // Free space inside the history tables (reusable by new rows: what a retention pass leaves),
    // when the pgstattuple extension is there.
    let free: Option<(Option<f64>,)> = if sqlx::raw_sql(
        "CREATE EXTENSION IF NOT EXISTS pgstattuple",
    )
    .execute(&mut db)
    .await
    .is_ok()
    {
        sqlx::query_as(
            "SELECT sum((pgstattuple_approx(c.oid)).approx_free_space)::float8 FROM pg_class c \
               JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'nifi_ops' AND c.relkind = 'r'",
        )
        .fetch_optional(&mut db)
        .await
        .ok()
        .flatten()
    } else {
        None
    };
    let free = free.and_then(|(f,)| f);
    Ok(
        json!({"database_bytes": bytes, "database_mb": round2(bytes as f64 / 1048576.0),
              "table_free_mb": free.map(|f| round2(f / 1048576.0)), "rows": rows}),
    )
}

/// `VACUUM ANALYZE` of the ledger, as autovacuum leaves a table that stopped changing.
async fn vacuum(b: &Bench) -> anyhow::Result<()> {
    vacuum_ledger(&mut b.db().await?).await
}

/// `VACUUM (ANALYZE)` of the ledger's tables: what autovacuum would have done on a ledger that
/// grew over a year.
pub async fn vacuum_ledger(db: &mut sqlx::PgConnection) -> anyhow::Result<()> {
    sqlx::raw_sql(
        "VACUUM (ANALYZE) nifi_ops.load_run, nifi_ops.load_partition, nifi_ops.load_file, \
                   nifi_ops.load_validation, nifi_ops.load_dispatch, nifi_ops.load_event",
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Writes `aged_fill.sql` at these sizes in one transaction (the tables as every release since
/// 0.1.0 has them): the fill of the aged benchmark and of the upgrade at age.
pub async fn fill_ledger(db: &mut sqlx::PgConnection, a: &AgedSizes) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.runs > 0 && a.partitions > 0 && a.files > 0 && a.days > 0,
        "the aged ledger needs at least one run, partition, file and day"
    );
    let sql = include_str!("aged_fill.sql")
        .replace("__RUNS__", &a.runs.to_string())
        .replace("__PARTS__", &a.partitions.to_string())
        .replace("__FILES__", &a.files.to_string())
        .replace("__DAYS__", &a.days.to_string());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("BEGIN;\n{sql}\nCOMMIT;")))
        .execute(db)
        .await
        .context("the aged fill")?;
    Ok(())
}

/// Fills the ledger to its age in one transaction; `{scenario: aged_fill, …}`.
pub async fn fill(b: &Bench, a: &AgedSizes) -> anyhow::Result<Value> {
    let t0 = Instant::now();
    let mut db = b.db().await?;
    fill_ledger(&mut db, a).await?;
    let fill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    vacuum(b).await?;
    // The fill's dirty pages written out now, not by a checkpoint during the aged phase.
    sqlx::raw_sql("CHECKPOINT").execute(&mut db).await?;
    let (statuses,): (Value,) = sqlx::query_as(
        "SELECT COALESCE(jsonb_object_agg(status, n), '{}') FROM (SELECT status, count(*) AS n \
           FROM nifi_ops.load_run WHERE business_key LIKE 'aged-%' GROUP BY status) s",
    )
    .fetch_one(&mut db)
    .await?;
    let (cleaned,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM nifi_ops.load_run WHERE business_key LIKE 'aged-%' AND cleaned_at IS NOT NULL",
    )
    .fetch_one(&mut db)
    .await?;
    let mut line = json!({"scenario": "aged_fill", "runs": a.runs, "partitions_per_run": a.partitions,
        "files_per_partition": a.files, "days": a.days, "fill_s": round2(fill_s),
        "vacuum_analyze_s": round2(t1.elapsed().as_secs_f64()), "statuses": statuses,
        "cleaned": cleaned});
    line["after"] = sizes(b).await?;
    Ok(line)
}

/// `n` sequential GETs of `path`: their latencies (ms).
async fn probe(b: &Bench, kind: &'static str, path: &str, n: usize) -> anyhow::Result<Value> {
    let c = b.client.fresh();
    for _ in 0..n {
        c.get_operator(kind, path).await?;
    }
    Ok(percentiles(&c.stats.samples(kind)))
}

/// Waits (bounded) until the operator leads again after this process held the epoch.
async fn operator_leads(b: &Bench, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let holder: Option<(String,)> =
            sqlx::query_as("SELECT holder FROM nifi_ops.leader_epoch LIMIT 1")
                .fetch_optional(&mut b.db().await?)
                .await?;
        if holder.is_some_and(|(h,)| h != HOLDER) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the operator did not lead again within {limit:?}: {}",
            b.operator.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A ledger of this process with the bench's thresholds and `history_retention`.
async fn ledger(b: &Bench, history_days: Option<u32>) -> anyhow::Result<ledger::Ledger> {
    let mut config = ledger::LedgerConfig::default();
    config.thresholds.history_retention =
        history_days.map(|d| Duration::from_secs(u64::from(d) * 86400));
    Ok(ledger::Ledger::connect(&b.db_url, 4, 0, config).await?)
}

/// Runs `work` with the operator stopped and this process the only leader (a ledger of its own,
/// history retention off as in the rest of the phase, and its fence); then the operator is
/// started again and leads before this returns `work`'s result.
async fn as_the_only_leader<T>(
    b: &mut Bench,
    work: impl AsyncFnOnce(&Bench, &ledger::Ledger, &ledger::Fence) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    b.operator.stop();
    let measured = async {
        let l = ledger(b, None).await?;
        let fence = l.acquire_epoch(HOLDER).await?;
        work(b, &l, &fence).await
    }
    .await;
    b.operator.start()?;
    operator_leads(b, Duration::from_secs(30)).await?;
    measured
}

/// One sweeper tick and one lease scan, `n` each, timed in this process as the only leader.
async fn sweeper_and_lease(b: &mut Bench, n: usize) -> anyhow::Result<(Value, Value)> {
    as_the_only_leader(b, async |_, l, fence| {
        let (mut ticks, mut scans) = (vec![], vec![]);
        for _ in 0..n {
            let t = Instant::now();
            l.sweep(fence)
                .await?
                .context("another sweeper held the tick lock")?;
            ticks.push(t.elapsed().as_secs_f64() * 1000.0);
            let t = Instant::now();
            let leased = l.lease_dispatches(fence, 64).await?;
            scans.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(leased.is_empty(), "a dispatch was due: {leased:?}");
        }
        Ok((percentiles(&ticks), percentiles(&scans)))
    })
    .await
}

/// Calls of each figure whose pages are counted (the counts are per call; ten smooth out a
/// sweeper tick that does more than the others).
const PAGE_SAMPLES: usize = 10;

/// Counters of the ledger's tables and indexes: (heap or index pages hit, read) by relation.
type PageCounters = std::collections::HashMap<String, (i64, i64)>;

async fn page_counters(db: &mut sqlx::PgConnection) -> anyhow::Result<PageCounters> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT 'table ' || relname, COALESCE(heap_blks_hit, 0), COALESCE(heap_blks_read, 0) \
           FROM pg_statio_user_tables WHERE schemaname = 'nifi_ops' \
         UNION ALL \
         SELECT 'index ' || indexrelname, COALESCE(idx_blks_hit, 0), COALESCE(idx_blks_read, 0) \
           FROM pg_statio_user_indexes WHERE schemaname = 'nifi_ops'",
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|(r, h, d)| (r, (h, d))).collect())
}

/// What `calls` calls of one figure touched, per call: the shared buffer pages of every top-level
/// statement of the ledger's database (pg_stat_statements: hit in shared buffers, read from the
/// OS; a nested statement's pages are in its caller's), the five costliest statements,
/// and the relations whose pages were touched (pg_statio, after the statistics flush), largest
/// first. Everything else on the database is stopped meanwhile (the operator).
async fn pages_of(
    b: &Bench,
    calls: usize,
    work: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<Value> {
    let mut db = b.db().await?;
    tokio::time::sleep(super::scenarios::STATS_FLUSH).await;
    let before = page_counters(&mut db).await?;
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&mut db)
        .await?;
    work.await?;
    tokio::time::sleep(super::scenarios::STATS_FLUSH).await;
    let after = page_counters(&mut db).await?;
    let per_call = |n: i64| round2(n as f64 / calls as f64);
    let statements: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 120), calls, shared_blks_hit, shared_blks_read \
           FROM pg_stat_statements WHERE toplevel AND query NOT LIKE '%pg_stat%' \
            AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
          ORDER BY shared_blks_hit + shared_blks_read DESC",
    )
    .fetch_all(&mut db)
    .await?;
    let (hit, read) = statements
        .iter()
        .fold((0, 0), |(h, r), s| (h + s.2, r + s.3));
    let mut touched: Vec<(String, i64, i64)> = after
        .iter()
        .map(|(rel, (h, r))| {
            let (h0, r0) = before.get(rel).copied().unwrap_or_default();
            (rel.clone(), h - h0, r - r0)
        })
        .filter(|(_, h, r)| h + r > 0)
        .collect();
    touched.sort_by_key(|(_, h, r)| -(h + r));
    Ok(json!({
        "calls": calls,
        "shared_pages_hit_per_call": per_call(hit),
        "shared_pages_read_per_call": per_call(read),
        "statements": statements.iter().take(5).map(|(q, c, h, r)| json!({
            "query": q, "calls": c, "pages_hit_per_call": per_call(*h), "pages_read_per_call": per_call(*r)
        })).collect::<Vec<_>>(),
        "relations": touched.iter().take(8).map(|(rel, h, r)| json!({
            "relation": rel, "pages_hit_per_call": per_call(*h), "pages_read_per_call": per_call(*r)
        })).collect::<Vec<_>>(),
    }))
}

/// The pages each read, sweeper tick and lease scan touches in this phase (`aged_pages`): the
/// cause of an aged/fresh ratio, measured before anything is changed for it.
async fn pages(b: &mut Bench, name: &str, n: usize) -> anyhow::Result<Value> {
    let figures = as_the_only_leader(b, async |b, l, fence| {
        let mut figures = Map::new();
        for (figure, kind, path) in [
            (
                "monitor_summary",
                "monitor",
                "/v1/monitor/summary".to_string(),
            ),
            ("runs_list", "runs", "/v1/runs?limit=100".to_string()),
            (
                "runs_list_of_job",
                "runs_job",
                format!("/v1/runs?jobKey={JOB_KEY}&limit=100"),
            ),
            (
                "cleanup_candidates",
                "candidates",
                "/v1/cleanup/candidates?limit=100".to_string(),
            ),
        ] {
            let work = async { probe(b, kind, &path, n).await.map(|_| ()) };
            figures.insert(figure.into(), pages_of(b, n, work).await?);
        }
        let ticks = async {
            for _ in 0..n {
                l.sweep(fence)
                    .await?
                    .context("another sweeper held the tick lock")?;
            }
            Ok(())
        };
        figures.insert("sweeper_tick".into(), pages_of(b, n, ticks).await?);
        let scans = async {
            for _ in 0..n {
                l.lease_dispatches(fence, 64).await?;
            }
            Ok(())
        };
        figures.insert("lease_scan".into(), pages_of(b, n, scans).await?);
        Ok(figures)
    })
    .await?;
    Ok(json!({"scenario": "aged_pages", "phase": name, "figures": figures}))
}

/// Aged ÷ fresh of the pages each figure touches per call (`aged_pages_ratio`).
fn page_ratios(fresh: &Value, aged: &Value) -> Value {
    let mut out = Map::new();
    if let Some(figures) = aged["figures"].as_object() {
        for (figure, a) in figures {
            let f = &fresh["figures"][figure];
            let total = |v: &Value| {
                v["shared_pages_hit_per_call"].as_f64().unwrap_or(0.0)
                    + v["shared_pages_read_per_call"].as_f64().unwrap_or(0.0)
            };
            let ratio = (total(f) > 0.0).then(|| round2(total(a) / total(f)));
            out.insert(
                figure.clone(),
                json!({"fresh_pages_per_call": round2(total(f)), "aged_pages_per_call": round2(total(a)), "ratio": ratio}),
            );
        }
    }
    json!({"scenario": "aged_pages_ratio", "figures": out})
}

/// One phase: the lifecycle, then the reads, the sweeper and the dispatcher, then the size.
/// `{figure: {p50, p99, …}}` for the ratios, and the phase's line.
async fn phase(
    b: &mut Bench,
    s: &Sizes,
    a: &AgedSizes,
    name: &str,
) -> anyhow::Result<(Map<String, Value>, Value, Option<Value>)> {
    eprintln!(
        "load-bench: aged scenario, {name} phase: lifecycle at {} clients",
        a.clients
    );
    if a.statements {
        super::scenarios::statements(b, "start", 0).await?;
    }
    let life = lifecycle(b, s, a.clients, None).await?;
    let statements = if a.statements {
        Some(
            super::scenarios::statements(b, &format!("aged scenario, {name} lifecycle"), 15)
                .await?,
        )
    } else {
        None
    };
    anyhow::ensure!(
        life["finished"] == true && life["errors"] == 0,
        "the {name} lifecycle did not finish cleanly: {life}"
    );
    let mut figures = Map::new();
    if let Some(kinds) = life["latency_ms"].as_object() {
        for (k, v) in kinds {
            figures.insert(format!("lifecycle_{k}"), v.clone());
        }
    }
    figures.insert(
        "dispatch_latency".into(),
        life["dispatch_latency_ms"].clone(),
    );
    eprintln!("load-bench: aged scenario, {name} phase: reads, sweeper, lease scan");
    let n = a.samples;
    figures.insert(
        "monitor_summary".into(),
        probe(b, "monitor", "/v1/monitor/summary", n).await?,
    );
    figures.insert(
        "runs_list".into(),
        probe(b, "runs", "/v1/runs?limit=100", n).await?,
    );
    figures.insert(
        "runs_list_of_job".into(),
        probe(
            b,
            "runs_job",
            &format!("/v1/runs?jobKey={JOB_KEY}&limit=100"),
            n,
        )
        .await?,
    );
    figures.insert(
        "cleanup_candidates".into(),
        probe(b, "candidates", "/v1/cleanup/candidates?limit=100", n).await?,
    );
    if a.statements {
        super::scenarios::statements(b, "start", 0).await?;
    }
    let (tick, lease) = sweeper_and_lease(b, n).await?;
    let statements = match statements {
        Some(life) if a.statements => Some(
            json!({"scenario": "aged_statements", "phase": name, "lifecycle": life,
            "sweeper_and_lease": super::scenarios::statements(b, &format!("aged scenario, {name} sweeper ticks and lease scans"), 10).await?}),
        ),
        other => other,
    };
    figures.insert("sweeper_tick".into(), tick);
    figures.insert("lease_scan".into(), lease);
    let line = json!({"scenario": "aged_phase", "phase": name, "clients": a.clients,
        "lifecycle": {"runs": life["runs"], "partitions": life["partitions"], "chunks": life["chunks"],
                      "wall_s": life["wall_s"], "requests_per_s": life["requests_per_s"],
                      "chunk_reports_per_s": life["chunk_reports_per_s"],
                      "cpu_ms_per_request": life["cpu_ms_per_request"],
                      "cpu_utilisation": life["cpu_utilisation"]},
        "latency_ms": figures, "size": sizes(b).await?});
    Ok((figures, line, statements))
}

/// aged/fresh of p50 and p99 for every figure both phases have; the figures over `target`.
pub fn ratios(fresh: &Map<String, Value>, aged: &Map<String, Value>, target: f64) -> Value {
    let mut out = Map::new();
    let mut over = vec![];
    for (k, f) in fresh {
        let Some(g) = aged.get(k) else { continue };
        let mut r = Map::new();
        for p in ["p50", "p99"] {
            if let (Some(x), Some(y)) = (f[p].as_f64(), g[p].as_f64()) {
                let ratio = if x > 0.0 { round2(y / x) } else { f64::NAN };
                r.insert(format!("fresh_{p}"), x.into());
                r.insert(format!("aged_{p}"), y.into());
                r.insert(
                    format!("{p}_ratio"),
                    json!(ratio.is_finite().then_some(ratio)),
                );
                if ratio > target && !over.contains(k) {
                    over.push(k.clone());
                }
            }
        }
        out.insert(k.clone(), Value::Object(r));
    }
    json!({"scenario": "aged_ratio", "target": target, "figures": out, "over_target": over})
}

/// History and event retention catch up (`retention_days`), one sweeper tick after another
/// (bounded in count and time), then the database is vacuumed and its size taken.
async fn retention(b: &mut Bench, a: &AgedSizes, s: &Sizes) -> anyhow::Result<Value> {
    let before = sizes(b).await?;
    b.operator.stop();
    let l = ledger(b, Some(a.retention_days)).await?;
    let fence = l.acquire_epoch(HOLDER).await?;
    let (mut ticks, mut runs_deleted, mut events_deleted) = (vec![], 0u64, 0u64);
    let t0 = Instant::now();
    let caught_up = loop {
        if ticks.len() >= 100_000 || t0.elapsed() > s.timeout {
            break false;
        }
        let t = Instant::now();
        let report = l
            .sweep(&fence)
            .await?
            .context("another sweeper held the tick lock")?;
        ticks.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            report.rule_errors.is_empty(),
            "a sweeper rule failed: {:?}",
            report.rule_errors
        );
        let runs = report.actions.get("history_deleted").copied().unwrap_or(0);
        let events = report.actions.get("events_deleted").copied().unwrap_or(0);
        runs_deleted += runs;
        events_deleted += events;
        if runs == 0 && events == 0 {
            break true;
        }
    };
    let catch_up_s = t0.elapsed().as_secs_f64();
    drop(l);
    let t1 = Instant::now();
    vacuum(b).await?;
    let vacuum_s = t1.elapsed().as_secs_f64();
    let after = sizes(b).await?;
    let (kept_older,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM nifi_ops.load_run WHERE cleaned_at IS NOT NULL \
            AND COALESCE(completed_at, heartbeat_at) < now() - make_interval(days => $1)",
    )
    .bind(a.retention_days as i32)
    .fetch_one(&mut b.db().await?)
    .await?;
    Ok(
        json!({"scenario": "aged_retention", "history_retention_days": a.retention_days,
        "caught_up": caught_up, "ticks": ticks.len(), "catch_up_s": round2(catch_up_s),
        "tick_ms": percentiles(&ticks), "runs_deleted": runs_deleted, "events_deleted": events_deleted,
        // Runs rule 7 keeps however old (an undelivered dispatch: the fill's alerting DEAD ones).
        "cleaned_runs_older_than_retention_left": kept_older, "vacuum_s": round2(vacuum_s),
        "before": before, "after": after,
        "size_ratio": round2(after["database_bytes"].as_f64().unwrap_or(0.0)
            / before["database_bytes"].as_f64().unwrap_or(1.0).max(1.0))}),
    )
}

/// The whole scenario, its JSON lines to `emit` as they are known (fresh phase, fill, aged phase,
/// ratios, retention). The operator is left stopped.
pub async fn aged(
    b: &mut Bench,
    s: &Sizes,
    a: &AgedSizes,
    emit: &dyn Fn(&Value),
) -> anyhow::Result<()> {
    // Warm-up, not measured: connections, caches and plans as the aged phase will find them.
    lifecycle(b, s, a.clients, None).await?;
    let (fresh, line, st) = phase(b, s, a, "fresh").await?;
    emit(&line);
    st.iter().for_each(emit);
    let fresh_pages = pages(b, "fresh", a.samples.min(PAGE_SAMPLES)).await?;
    emit(&fresh_pages);
    eprintln!(
        "load-bench: aged scenario: filling {} runs × {} partitions × {} files over {} days",
        a.runs, a.partitions, a.files, a.days
    );
    emit(&fill(b, a).await?);
    let (aged, line, st) = phase(b, s, a, "aged").await?;
    emit(&line);
    st.iter().for_each(emit);
    let aged_pages = pages(b, "aged", a.samples.min(PAGE_SAMPLES)).await?;
    emit(&aged_pages);
    emit(&ratios(&fresh, &aged, 1.2));
    emit(&page_ratios(&fresh_pages, &aged_pages));
    eprintln!(
        "load-bench: aged scenario: history retention of {} days catching up",
        a.retention_days
    );
    emit(&retention(b, a, s).await?);
    Ok(())
}

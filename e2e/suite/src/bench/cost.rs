//! Issue 43 item 2: what one chunk report costs PostgreSQL, by kind of report, to set beside the
//! least the contract needs (docs/benchmarks.md). One client sends one report at a time, with the
//! operator stopped, so that the figures are a report's own work and nothing waits for a lock or
//! a connection. Three phases over the same runs: the reports that record a chunk (every chunk
//! but a partition's last), those that decide a partition (its last chunk: PARTITION_SUCCESS,
//! a sibling still unfinished) and those that complete a run (the last partition's last chunk:
//! RUN_COMPLETE). For each phase, per report: the round trips and the statements PostgreSQL ran
//! inside the function (`pg_stat_statements.track = all` for the phase), the row versions by
//! table (inserted, updated, HOT) and the index entries they added, the WAL of the report's
//! statement and of the whole cluster, the statement's execution time, and PostgreSQL's and the
//! api-server's CPU.
use super::Bench;
use super::client::percentiles;
use super::scenarios::{HOT_TABLES, STATS_FLUSH, claim, create_run, report_chunk};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;
use uuid::Uuid;

/// The tables a chunk report can write: the hot path's.
const TABLES: &[&str] = HOT_TABLES;

/// How the cost scenario is sized.
#[derive(Clone, Debug)]
pub struct CostSizes {
    pub runs: usize,
    pub partitions: usize,
    pub chunks: usize,
}

impl CostSizes {
    pub fn default_for(quick: bool) -> CostSizes {
        if quick {
            CostSizes {
                runs: 3,
                partitions: 3,
                chunks: 3,
            }
        } else {
            CostSizes {
                runs: 40,
                partitions: 8,
                chunks: 4,
            }
        }
    }
}

/// (inserted, updated, HOT-updated) rows so far, by table.
async fn row_counters(
    db: &mut sqlx::PgConnection,
) -> anyhow::Result<HashMap<String, (i64, i64, i64)>> {
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
          WHERE schemaname = 'nifi_ops' AND relname = ANY($1)",
    )
    .bind(TABLES)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(t, i, u, h)| (t, (i, u, h)))
        .collect())
}

/// Each B-tree index of the tables (BRIN keeps no entry per row): (table, index, predicate).
async fn indexes(
    db: &mut sqlx::PgConnection,
) -> anyhow::Result<Vec<(String, String, Option<String>)>> {
    Ok(sqlx::query_as(
        "SELECT t.relname::text, x.relname::text, pg_get_expr(i.indpred, i.indrelid) \
           FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid JOIN pg_class x ON x.oid = i.indexrelid \
           JOIN pg_namespace n ON n.oid = t.relnamespace JOIN pg_am a ON a.oid = x.relam \
          WHERE n.nspname = 'nifi_ops' AND t.relname = ANY($1) AND a.amname = 'btree' \
          ORDER BY 1, 2",
    )
    .bind(TABLES)
    .fetch_all(db)
    .await?)
}

/// A statement of `pg_stat_statements`: (text, top level, calls, total execution ms, WAL
/// records, WAL bytes, full-page images).
type StatementRow = (String, bool, i64, f64, i64, i64, i64);

/// What a phase starts from.
struct Start {
    rows: HashMap<String, (i64, i64, i64)>,
    xid: i64,
    lsn: String,
    cpu: (f64, f64),
    at: Instant,
}

/// `flush`: wait until the backends that ran before have flushed their table counters (after a
/// phase's `finish`, which waited already, only this connection has run since).
async fn start(b: &Bench, db: &mut sqlx::PgConnection, flush: bool) -> anyhow::Result<Start> {
    if flush {
        tokio::time::sleep(STATS_FLUSH).await;
    }
    let rows = row_counters(db).await?;
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&mut *db)
        .await?;
    let (xid, lsn): (i64, String) = sqlx::query_as(
        "SELECT (txid_current() & 4294967295)::int8, pg_current_wal_insert_lsn()::text",
    )
    .fetch_one(&mut *db)
    .await?;
    Ok(Start {
        rows,
        xid,
        lsn,
        cpu: b.cpu(),
        at: Instant::now(),
    })
}

/// The phase's figures per report.
async fn finish(
    b: &Bench,
    db: &mut sqlx::PgConnection,
    s: Start,
    phase: &str,
    latencies: &[f64],
) -> anyhow::Result<Value> {
    let wall = s.at.elapsed().as_secs_f64();
    let cpu = b.cpu();
    let n = latencies.len().max(1) as f64;
    let per = |v: f64| (v / n * 100.0).round() / 100.0;
    let (wal_bytes,): (i64,) =
        sqlx::query_as("SELECT (pg_current_wal_insert_lsn() - $1::pg_lsn)::int8")
            .bind(&s.lsn)
            .fetch_one(&mut *db)
            .await?;
    // Every statement of the bench database in the phase is the reports' (the operator is
    // stopped; this connection's own are on another database or excluded by text).
    let statements: Vec<StatementRow> = sqlx::query_as(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 140), toplevel, calls, total_exec_time, \
                wal_records, wal_bytes::int8, wal_fpi \
           FROM pg_stat_statements \
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
            AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_current_wal%' \
          ORDER BY total_exec_time DESC",
    )
    .fetch_all(&mut *db)
    .await?;
    let top: Vec<_> = statements.iter().filter(|s| s.1).collect();
    let nested: Vec<_> = statements.iter().filter(|s| !s.1).collect();
    let sum =
        |v: &[&StatementRow], f: fn(&StatementRow) -> f64| v.iter().map(|s| f(s)).sum::<f64>();
    let report = top.iter().find(|s| s.0.contains("report_chunk"));
    tokio::time::sleep(STATS_FLUSH).await;
    let after = row_counters(db).await?;
    let mut tables = BTreeMap::new();
    let all_indexes = indexes(db).await?;
    for t in TABLES {
        let (i1, u1, h1) = after.get(*t).copied().unwrap_or_default();
        let (i0, u0, h0) = s.rows.get(*t).copied().unwrap_or_default();
        let (ins, upd, hot) = (i1 - i0, u1 - u0, h1 - h0);
        if ins + upd == 0 {
            continue;
        }
        // A new version that is not HOT enters every index whose predicate it satisfies. The
        // predicates are read on the rows as the phase left them (their xmin is the phase's):
        // the share of those that satisfy each partial index.
        let versions = (ins + upd - hot) as f64;
        // `t` and the predicates are the ledger's own (TABLES, pg_index), never input.
        let (phase_rows,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM nifi_ops.{t} WHERE xmin::text::int8 >= $1"
        )))
        .bind(s.xid)
        .fetch_one(&mut *db)
        .await?;
        let mut entered = vec![];
        let mut entries = 0.0;
        for (_, index, predicate) in all_indexes.iter().filter(|(table, _, _)| table == t) {
            let share = match predicate {
                None => 1.0,
                Some(p) => {
                    let (matching,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                        "SELECT count(*) FROM nifi_ops.{t} WHERE xmin::text::int8 >= $1 AND ({p})"
                    )))
                    .bind(s.xid)
                    .fetch_one(&mut *db)
                    .await?;
                    if phase_rows == 0 {
                        0.0
                    } else {
                        matching as f64 / phase_rows as f64
                    }
                }
            };
            if share > 0.0 && versions > 0.0 {
                entered.push(index.clone());
                entries += versions * share;
            }
        }
        tables.insert(
            (*t).to_string(),
            json!({"inserted": per(ins as f64), "updated": per(upd as f64), "hot": per(hot as f64),
                   "index_entries": per(entries), "indexes_entered": entered}),
        );
    }
    Ok(json!({
        "scenario": "cost", "phase": phase, "reports": latencies.len(),
        "latency_ms": percentiles(latencies),
        "round_trips_per_report": per(sum(&top, |s| s.2 as f64)),
        "statements_inside_per_report": per(sum(&nested, |s| s.2 as f64)),
        "statement_exec_ms_per_report": report.map(|r| (r.3 / r.2.max(1) as f64 * 1000.0).round() / 1000.0),
        "inside": nested.iter().take(12).map(|s| json!({"query": s.0, "calls_per_report": per(s.2 as f64),
            "mean_us": (s.3 / s.2.max(1) as f64 * 1000.0).round()})).collect::<Vec<_>>(),
        "rows_per_report": tables,
        "wal_per_report": {
            "statement_records": per(sum(&top, |s| s.4 as f64)),
            "statement_bytes": per(sum(&top, |s| s.5 as f64)),
            "statement_fpi": per(sum(&top, |s| s.6 as f64)),
            // The commit records too, and any checkpoint's full pages.
            "cluster_bytes": per(wal_bytes as f64),
        },
        "cpu_ms_per_report": {
            "postgresql": per((cpu.1 - s.cpu.1) * 1000.0),
            "api_server": per((cpu.0 - s.cpu.0) * 1000.0),
        },
        "reports_per_s": (latencies.len() as f64 / wall).round(),
    }))
}

/// `ALTER SYSTEM <change>` and a reload, which reaches the api-server's open connections before
/// their next statement.
async fn track_statements(db: &mut sqlx::PgConnection, change: &'static str) -> anyhow::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!("ALTER SYSTEM {change}")))
        .execute(&mut *db)
        .await?;
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut *db)
        .await?;
    Ok(())
}

/// The three phases, one JSON line each. They run twice, on runs of their own: first as they
/// run in production (`pg_stat_statements.track = top`: the CPU, execution time, WAL and rows),
/// then with `track = all`, for the statements inside the function only (counting them costs
/// each nested statement some microseconds, charged to the report's execution time).
pub async fn cost(b: &Bench, sizes: &CostSizes) -> anyhow::Result<Vec<Value>> {
    let mut db = b.db().await?;
    // A `-c` on PostgreSQL's command line (load-bench --statements) outranks ALTER SYSTEM: the
    // first pass would count nested statements, and pay for it.
    let (track, source): (String, String) = sqlx::query_as(
        "SELECT setting, source FROM pg_settings WHERE name = 'pg_stat_statements.track'",
    )
    .fetch_one(&mut db)
    .await?;
    anyhow::ensure!(
        track == "top",
        "the cost scenario measures its first pass with pg_stat_statements.track = top, and it is \
         {track} (from the {source}): run it without --statements"
    );
    let plain = phases(b, &mut db, sizes).await?;
    track_statements(&mut db, "SET pg_stat_statements.track = 'all'").await?;
    let counted = phases(b, &mut db, sizes).await;
    track_statements(&mut db, "RESET pg_stat_statements.track").await?;
    Ok(plain
        .into_iter()
        .zip(counted?)
        .map(|(mut line, counted)| {
            // Zero unless the first pass counted nested statements too (it must not).
            line["statements_inside_first_pass"] = line["statements_inside_per_report"].clone();
            for key in ["statements_inside_per_report", "inside"] {
                line[key] = counted[key].clone();
            }
            line["statement_exec_ms_per_report_counting_inside"] =
                counted["statement_exec_ms_per_report"].clone();
            line
        })
        .collect())
}

async fn phases(
    b: &Bench,
    db: &mut sqlx::PgConnection,
    sizes: &CostSizes,
) -> anyhow::Result<Vec<Value>> {
    let c = b.client.fresh();
    let rows = 1000u64;
    let chunks = sizes.chunks.max(2);
    let mut runs = vec![];
    for r in 0..sizes.runs {
        let (run, path, parts) = create_run(
            &c,
            &format!("cost-{r}-{}", Uuid::new_v4().simple()),
            sizes.partitions.max(2),
            rows * chunks as u64,
        )
        .await?;
        let mut claimed = vec![];
        for (pid, _) in parts {
            let token = Uuid::new_v4();
            claim(&c, run, &pid, token).await?;
            claimed.push((pid, token));
        }
        runs.push((run, path, claimed));
    }
    let mut lines = vec![];
    // Recording: every chunk but each partition's last.
    let s = start(b, db, true).await?;
    let mut latencies = vec![];
    for (run, path, parts) in &runs {
        for (pid, token) in parts {
            for i in 0..chunks - 1 {
                let t = Instant::now();
                let a = report_chunk(&c, *run, pid, path, *token, i, chunks, rows).await?;
                latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                anyhow::ensure!(
                    a["partitionStatus"] == "RUNNING",
                    "recording report answered {a}"
                );
            }
        }
    }
    lines.push(finish(b, db, s, "recording", &latencies).await?);
    // Deciding: each partition's last chunk, but the run's last partition.
    let s = start(b, db, false).await?;
    let mut latencies = vec![];
    for (run, path, parts) in &runs {
        for (pid, token) in &parts[..parts.len() - 1] {
            let t = Instant::now();
            let a = report_chunk(&c, *run, pid, path, *token, chunks - 1, chunks, rows).await?;
            latencies.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(
                a["partitionStatus"] == "SUCCESS" && a["validationScheduled"] != true,
                "deciding report answered {a}"
            );
        }
    }
    lines.push(finish(b, db, s, "deciding", &latencies).await?);
    // Completing: the last partition's last chunk.
    let s = start(b, db, false).await?;
    let mut latencies = vec![];
    for (run, path, parts) in &runs {
        let (pid, token) = parts.last().expect("two partitions at least");
        let t = Instant::now();
        let a = report_chunk(&c, *run, pid, path, *token, chunks - 1, chunks, rows).await?;
        latencies.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            a["validationScheduled"] == true,
            "completing report answered {a}"
        );
    }
    lines.push(finish(b, db, s, "completing", &latencies).await?);
    Ok(lines)
}

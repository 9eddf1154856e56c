//! The ledger's rows after a request, read with plain SQL (every column, as JSON; numeric
//! columns as exact text), and their comparison with the model's rows.
use super::compare::{Cell, Diff, Row, Window, row_diff};
use super::model::{Model, RowExt};
use serde_json::{Map, Value};
use sqlx::PgConnection;
use std::collections::BTreeMap;
use uuid::Uuid;

pub const TABLES: [&str; 6] = [
    "load_run",
    "load_partition",
    "load_file",
    "load_validation",
    "load_dispatch",
    "load_event",
];

/// Columns the implementation adds for its own bookkeeping, outside the contract's tables (§1):
/// `load_run.events_kept_from` (event-retention progress, docs/operations.md) and
/// `load_dispatch.leased_epoch` (the dispatcher's fencing). Not compared; every other column
/// that is not the contract's is a difference.
const IMPLEMENTATION_COLUMNS: [&str; 2] = ["events_kept_from", "leased_epoch"];

#[derive(Debug, Default)]
pub struct Snapshot {
    /// Rows of the sequence's runs (and of any run of its job), per table.
    pub rows: BTreeMap<&'static str, Vec<Map<String, Value>>>,
    /// Rows of each table in the whole ledger.
    pub totals: [i64; 6],
}

/// numeric(38,0) columns are read as text: JSON numbers would lose digits.
fn select(table: &str) -> String {
    let extra = match table {
        "load_run" => {
            " || jsonb_build_object('snapshot_scn', t.snapshot_scn::text, 'source_min_split', t.source_min_split::text, 'source_max_split', t.source_max_split::text)"
        }
        "load_partition" => {
            " || jsonb_build_object('lower_bound', t.lower_bound::text, 'upper_bound', t.upper_bound::text)"
        }
        _ => "",
    };
    let job = if table == "load_run" {
        " OR t.job_key = $2"
    } else {
        ""
    };
    format!(
        "SELECT coalesce(jsonb_agg(to_jsonb(t){extra}), '[]')::text FROM nifi_ops.{table} t \
         WHERE (t.run_id = ANY($1){job}) AND $2::text IS NOT NULL"
    )
}

pub async fn read(conn: &mut PgConnection, runs: &[Uuid], job: &str) -> anyhow::Result<Snapshot> {
    let mut snap = Snapshot::default();
    for table in TABLES {
        let text: String = sqlx::query_scalar(sqlx::AssertSqlSafe(select(table)))
            .bind(runs)
            .bind(job)
            .fetch_one(&mut *conn)
            .await?;
        let mut rows: Vec<Map<String, Value>> = serde_json::from_str(&text)?;
        for r in &mut rows {
            for col in IMPLEMENTATION_COLUMNS {
                r.remove(col);
            }
        }
        snap.rows.insert(table, rows);
    }
    let counts: (i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM nifi_ops.load_run), (SELECT count(*) FROM nifi_ops.load_partition), \
         (SELECT count(*) FROM nifi_ops.load_file), (SELECT count(*) FROM nifi_ops.load_validation), \
         (SELECT count(*) FROM nifi_ops.load_dispatch), (SELECT count(*) FROM nifi_ops.load_event)",
    )
    .fetch_one(&mut *conn)
    .await?;
    snap.totals = [counts.0, counts.1, counts.2, counts.3, counts.4, counts.5];
    Ok(snap)
}

fn learn(row: &mut Row, learned: Vec<(&'static str, Cell)>) {
    for (c, v) in learned {
        row.insert(c, v);
    }
}

fn key_of(row: &Map<String, Value>, cols: &[&str]) -> String {
    cols.iter()
        .map(|c| match row.get(*c) {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => "?".into(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn model_key(row: &Row, cols: &[&str]) -> String {
    cols.iter()
        .map(|c| match row.val(c) {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Rows matched by a natural key (every key column known to the model).
fn keyed<'a>(
    table: &str,
    cols: &[&str],
    model: impl Iterator<Item = &'a mut Row>,
    actual: &[&Map<String, Value>],
    w: Window,
) -> Result<(), Diff> {
    let mut by_key: BTreeMap<String, &Map<String, Value>> =
        actual.iter().map(|r| (key_of(r, cols), *r)).collect();
    for row in model {
        let key = model_key(row, cols);
        let what = format!("{table}[{key}]");
        let Some(a) = by_key.remove(&key) else {
            return Err(Diff::new(what, "a row", "<no row>"));
        };
        let learned = row_diff(&what, row, a, w)?;
        learn(row, learned);
    }
    match by_key.into_iter().next() {
        Some((key, a)) => Err(Diff::new(
            format!("{table}[{key}]"),
            "<no row>",
            Value::Object(a.clone()),
        )),
        None => Ok(()),
    }
}

/// Rows whose id the server generates: known ones by id, new ones by `sort` columns.
fn generated<'a>(
    table: &str,
    id: &'static str,
    sort: &[&str],
    model: impl Iterator<Item = &'a mut Row>,
    actual: &[&Map<String, Value>],
    w: Window,
) -> Result<(), Diff> {
    let mut by_id: BTreeMap<String, &Map<String, Value>> =
        actual.iter().map(|r| (key_of(r, &[id]), *r)).collect();
    let mut fresh = Vec::new();
    for row in model {
        if matches!(row.get(id), Some(Cell::Val(_))) {
            let key = model_key(row, &[id]);
            let what = format!("{table}[{key} {}]", model_key(row, sort));
            let Some(a) = by_id.remove(&key) else {
                return Err(Diff::new(what, "a row", "<no row>"));
            };
            let learned = row_diff(&what, row, a, w)?;
            learn(row, learned);
        } else {
            fresh.push(row);
        }
    }
    let mut new_actual: Vec<&Map<String, Value>> = by_id.into_values().collect();
    new_actual.sort_by_key(|r| key_of(r, sort));
    fresh.sort_by_key(|r| model_key(r, sort));
    let names = |v: Vec<String>| format!("[{}]", v.join(", "));
    if new_actual.len() != fresh.len()
        || new_actual
            .iter()
            .zip(&fresh)
            .any(|(a, m)| key_of(a, sort) != model_key(m, sort))
    {
        return Err(Diff::new(
            format!(
                "{table} (rows written by this request, by {})",
                sort.join("/")
            ),
            names(fresh.iter().map(|m| model_key(m, sort)).collect()),
            names(new_actual.iter().map(|a| key_of(a, sort)).collect()),
        ));
    }
    for (row, a) in fresh.into_iter().zip(new_actual) {
        let what = format!("{table}[{}]", key_of(a, sort));
        let learned = row_diff(&what, row, a, w)?;
        learn(row, learned);
    }
    Ok(())
}

/// Every row of the sequence's runs against the model; learned values are written back.
pub fn compare(model: &mut Model, snap: &Snapshot, w: Window) -> Result<(), Diff> {
    let of = |table: &str, run: &Uuid| -> Vec<&Map<String, Value>> {
        let id = run.to_string();
        snap.rows[table]
            .iter()
            .filter(|r| r.get("run_id").and_then(Value::as_str) == Some(id.as_str()))
            .collect()
    };
    let known: Vec<String> = model.runs.iter().map(|r| r.id.to_string()).collect();
    if let Some(stray) = snap.rows["load_run"].iter().find(|r| {
        !known
            .iter()
            .any(|k| Some(k.as_str()) == r.get("run_id").and_then(Value::as_str))
    }) {
        return Err(Diff::new(
            "load_run (a run of this job)",
            "<no row>",
            Value::Object(stray.clone()),
        ));
    }
    for rs in &mut model.runs {
        let id = rs.id;
        keyed(
            "load_run",
            &["run_id"],
            std::iter::once(&mut rs.row),
            &of("load_run", &id),
            w,
        )?;
        keyed(
            "load_partition",
            &["run_id", "partition_id"],
            rs.partitions.values_mut(),
            &of("load_partition", &id),
            w,
        )?;
        keyed(
            "load_file",
            &["run_id", "partition_id", "chunk_index"],
            rs.files.values_mut(),
            &of("load_file", &id),
            w,
        )?;
        keyed(
            "load_validation",
            &["run_id", "stage", "metric_name", "query_version"],
            rs.validations.iter_mut().map(|(r, _)| r),
            &of("load_validation", &id),
            w,
        )?;
        generated(
            "load_dispatch",
            "dispatch_id",
            &["dispatch_type", "partition_id"],
            rs.dispatches.iter_mut(),
            &of("load_dispatch", &id),
            w,
        )?;
        generated(
            "load_event",
            "event_id",
            &["event_name", "partition_id"],
            rs.events.iter_mut(),
            &of("load_event", &id),
            w,
        )?;
    }
    Ok(())
}

/// Rows the model holds, per table (for the whole-ledger count check).
pub fn model_counts(model: &Model) -> [i64; 6] {
    let mut n = [0i64; 6];
    for r in &model.runs {
        n[0] += 1;
        n[1] += r.partitions.len() as i64;
        n[2] += r.files.len() as i64;
        n[3] += r.validations.len() as i64;
        n[4] += r.dispatches.len() as i64;
        n[5] += r.events.len() as i64;
    }
    n
}

//! Comparison of the real system with the model: answers (exact JSON) and ledger rows (cells that
//! may be exact values, timestamps written "now" by the request under test, or ids the server
//! generates and the model learns).
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A timestamp cell. `Now` is a value written by the request being checked: it must lie within
/// that request's wall-clock window (the database runs on this machine, so its
/// `clock_timestamp()` and our clock are the same clock). After a successful comparison the
/// actual value is learned and held fixed (`At`), so a later unexpected rewrite is caught.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ts {
    At(DateTime<Utc>),
    Now,
    /// Either unchanged or written now: the run heartbeat refresh of chunk reports and claims,
    /// which the contract lets skip (§5.3 rule 5: less than 1 s old, or the row locked).
    NowOrKeep(DateTime<Utc>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Val(Value),
    Ts(Ts),
    /// A uuid the server generates: shape checked, then learned. `true`: it must be a random
    /// (v4) one, as §1.5 says of `dispatch_id`; §1.6 names no version for `event_id`.
    NewUuid(bool),
    /// An identity value (validation_id): a positive integer, then learned.
    NewSerial,
    /// Not compared, with a reason given where it is used (the stored
    /// `success_partition_count` while a run is EXTRACTING, §5.4).
    Unchecked,
}

pub type Row = BTreeMap<&'static str, Cell>;

/// The wall-clock window of one request, widened by a small slack for the microsecond
/// truncation of PostgreSQL timestamps.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

impl Window {
    fn contains(&self, t: DateTime<Utc>) -> bool {
        let slack = chrono::Duration::milliseconds(2);
        t >= self.from - slack && t <= self.to + slack
    }
}

/// The first difference found: where, what was expected, what was there.
#[derive(Debug)]
pub struct Diff {
    pub field: String,
    pub expected: String,
    pub actual: String,
}

impl Diff {
    pub fn new(field: impl Into<String>, expected: impl ToString, actual: impl ToString) -> Diff {
        Diff {
            field: field.into(),
            expected: expected.to_string(),
            actual: actual.to_string(),
        }
    }
}

/// RFC 3339 as the API writes datetimes (§3.4: UTC, `Z`, chrono's AutoSi fraction).
pub fn api_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

pub fn parse_time(v: &Value) -> Option<DateTime<Utc>> {
    v.as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// A lower-case hyphenated random (v4) UUID, as §3.4 and §1 require of generated ids.
pub fn is_uuid_v4(s: &str) -> bool {
    is_uuid(s, true)
}

/// A lower-case hyphenated UUID (of version 4 when `v4`).
pub fn is_uuid(s: &str, v4: bool) -> bool {
    match uuid::Uuid::parse_str(s) {
        Ok(u) => u.hyphenated().to_string() == s && (!v4 || u.get_version_num() == 4),
        Err(_) => false,
    }
}

/// Exact JSON equality with the path of the first difference. Object keys must be the same
/// set (a missing documented field or an undocumented extra one are both differences).
pub fn json_diff(path: &str, expected: &Value, actual: &Value) -> Option<Diff> {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, ev) in e {
                match a.get(k) {
                    None => return Some(Diff::new(format!("{path}.{k}"), ev, "<absent>")),
                    Some(av) => {
                        if let Some(d) = json_diff(&format!("{path}.{k}"), ev, av) {
                            return Some(d);
                        }
                    }
                }
            }
            a.iter()
                .find(|(k, _)| !e.contains_key(*k))
                .map(|(k, av)| Diff::new(format!("{path}.{k}"), "<absent>", av))
        }
        (Value::Array(e), Value::Array(a)) => {
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                if let Some(d) = json_diff(&format!("{path}[{i}]"), ev, av) {
                    return Some(d);
                }
            }
            (e.len() != a.len()).then(|| {
                Diff::new(
                    format!("{path} (length)"),
                    format!("{} items: {expected}", e.len()),
                    format!("{} items: {actual}", a.len()),
                )
            })
        }
        _ => (expected != actual).then(|| Diff::new(path, expected, actual)),
    }
}

/// Compares one model row with one actual row (a JSON object of every column). On success
/// returns the cells to learn (timestamps written now, generated ids).
pub fn row_diff(
    what: &str,
    model: &Row,
    actual: &Map<String, Value>,
    window: Window,
) -> Result<Vec<(&'static str, Cell)>, Diff> {
    let mut learned = Vec::new();
    for (col, cell) in model {
        let field = format!("{what}.{col}");
        let Some(a) = actual.get(*col) else {
            return Err(Diff::new(field, "a column", "<no such column>"));
        };
        match cell {
            Cell::Val(e) => {
                if let Some(d) = json_diff(&field, e, a) {
                    return Err(d);
                }
            }
            Cell::Unchecked => {}
            Cell::NewUuid(v4) => match a.as_str() {
                Some(s) if is_uuid(s, *v4) => learned.push((*col, Cell::Val(a.clone()))),
                _ => {
                    return Err(Diff::new(
                        field,
                        if *v4 {
                            "a generated uuid v4"
                        } else {
                            "a generated uuid"
                        },
                        a,
                    ));
                }
            },
            Cell::NewSerial => match a.as_i64() {
                Some(n) if n > 0 => learned.push((*col, Cell::Val(a.clone()))),
                _ => return Err(Diff::new(field, "a positive identity value", a)),
            },
            Cell::Ts(ts) => {
                let Some(t) = parse_time(a) else {
                    return Err(Diff::new(field, ts_text(ts, window), a));
                };
                let ok = match ts {
                    Ts::At(e) => *e == t,
                    Ts::Now => window.contains(t),
                    Ts::NowOrKeep(e) => *e == t || window.contains(t),
                };
                if !ok {
                    return Err(Diff::new(field, ts_text(ts, window), api_time(t)));
                }
                if !matches!(ts, Ts::At(_)) {
                    learned.push((*col, Cell::Ts(Ts::At(t))));
                }
            }
        }
    }
    if let Some(extra) = actual.keys().find(|k| !model.contains_key(k.as_str())) {
        return Err(Diff::new(
            format!("{what}.{extra}"),
            "<no such column in the contract>",
            &actual[extra],
        ));
    }
    Ok(learned)
}

fn ts_text(ts: &Ts, w: Window) -> String {
    let now = format!(
        "a timestamp written by this request (between {} and {})",
        api_time(w.from),
        api_time(w.to)
    );
    match ts {
        Ts::At(t) => format!("{} (unchanged)", api_time(*t)),
        Ts::Now => now,
        Ts::NowOrKeep(t) => format!("{} (unchanged) or {now}", api_time(*t)),
    }
}

/// The text of a model cell for messages.
pub fn cell_text(c: &Cell) -> String {
    match c {
        Cell::Val(v) => v.to_string(),
        Cell::Ts(Ts::At(t)) => api_time(*t),
        other => format!("{other:?}"),
    }
}

//! The model's state: the contract's rows (§1) of every run a sequence created, as cells the
//! comparison understands, and the effects that several operations share (a run status change,
//! §2.1; the end of a run with its ABORTED partitions and DEAD dispatches, §2.2; events, §8).
//! Written from CONTRACT.md, not from the ledger's code.
use super::compare::{Cell, Row, Ts};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use uuid::Uuid;

pub const ACTIVE: [&str; 8] = [
    "CREATED",
    "EXTRACTING",
    "EXTRACTED_VALIDATED",
    "STAGE_VALIDATING",
    "STAGING_VALIDATED",
    "PUBLISHING",
    "PUBLISHED",
    "PUBLISH_UNKNOWN",
];
/// §2.1 cleanup class "failed" (TIMED_OUT and CANCELLED included).
pub const FAILED_CLASS: [&str; 8] = [
    "FAILED_MANIFEST",
    "FAILED_EXTRACT",
    "FAILED_STAGE_VALIDATION",
    "FAILED_PUBLISH",
    "FAILED_TARGET_VALIDATION",
    "FAILED_SNAPSHOT_EXPIRED",
    "TIMED_OUT",
    "CANCELLED",
];
pub const ALL_STATUSES: [&str; 17] = [
    "CREATED",
    "EXTRACTING",
    "EXTRACTED_VALIDATED",
    "STAGE_VALIDATING",
    "STAGING_VALIDATED",
    "PUBLISHING",
    "PUBLISHED",
    "PUBLISH_UNKNOWN",
    "SUCCESS",
    "FAILED_MANIFEST",
    "FAILED_EXTRACT",
    "FAILED_STAGE_VALIDATION",
    "FAILED_PUBLISH",
    "FAILED_TARGET_VALIDATION",
    "FAILED_SNAPSHOT_EXPIRED",
    "TIMED_OUT",
    "CANCELLED",
];

pub fn is_active(s: &str) -> bool {
    ACTIVE.contains(&s)
}
pub fn is_terminal(s: &str) -> bool {
    !is_active(s)
}

/// Reading and writing cells by column name.
pub trait RowExt {
    fn val(&self, col: &str) -> &Value;
    fn text(&self, col: &str) -> Option<String> {
        self.val(col).as_str().map(str::to_string)
    }
    fn int(&self, col: &str) -> Option<i64> {
        self.val(col).as_i64()
    }
    fn put(&mut self, col: &'static str, v: impl Into<Value>);
    fn now(&mut self, col: &'static str);
    /// The skippable run heartbeat refresh of §5.3 rule 5.
    fn now_or_keep(&mut self, col: &'static str);
    fn time(&self, col: &str) -> Option<DateTime<Utc>>;
}

static NULL: Value = Value::Null;

impl RowExt for Row {
    fn val(&self, col: &str) -> &Value {
        match self.get(col) {
            Some(Cell::Val(v)) => v,
            _ => &NULL,
        }
    }
    fn put(&mut self, col: &'static str, v: impl Into<Value>) {
        self.insert(col, Cell::Val(v.into()));
    }
    fn now(&mut self, col: &'static str) {
        self.insert(col, Cell::Ts(Ts::Now));
    }
    fn now_or_keep(&mut self, col: &'static str) {
        let next = match self.get(col) {
            Some(Cell::Ts(Ts::At(t))) => Ts::NowOrKeep(*t),
            Some(Cell::Ts(other)) => *other,
            _ => Ts::Now,
        };
        self.insert(col, Cell::Ts(next));
    }
    fn time(&self, col: &str) -> Option<DateTime<Utc>> {
        match self.get(col) {
            Some(Cell::Ts(Ts::At(t))) => Some(*t),
            _ => None,
        }
    }
}

/// A row with every column NULL (the contract's columns, nothing else).
pub fn blank(cols: &[&'static str]) -> Row {
    cols.iter().map(|c| (*c, Cell::Val(Value::Null))).collect()
}

pub const RUN_COLS: [&str; 31] = [
    "run_id",
    "job_key",
    "business_key",
    "status",
    "snapshot_scn",
    "source_count",
    "source_null_split_count",
    "source_min_split",
    "source_max_split",
    "expected_partition_count",
    "success_partition_count",
    "failed_partition_count",
    "extracted_count",
    "staging_count",
    "target_count",
    "hdfs_run_path",
    "stage_table_name",
    "publish_token",
    "retry_of_run_id",
    "version_no",
    "parameters",
    "started_at",
    "heartbeat_at",
    "extract_completed_at",
    "publish_started_at",
    "published_at",
    "completed_at",
    "error_stage",
    "error_code",
    "error_message",
    "cleaned_at",
];
pub const PARTITION_COLS: [&str; 20] = [
    "run_id",
    "partition_id",
    "lower_bound",
    "upper_bound",
    "upper_inclusive",
    "is_null_partition",
    "status",
    "expected_row_count",
    "actual_row_count",
    "fragment_count",
    "file_count",
    "byte_count",
    "attempt_count",
    "claim_token",
    "worker_node",
    "started_at",
    "heartbeat_at",
    "completed_at",
    "error_code",
    "error_message",
];
pub const FILE_COLS: [&str; 12] = [
    "run_id",
    "partition_id",
    "chunk_index",
    "fragment_identifier",
    "fragment_count",
    "hdfs_path",
    "record_count",
    "byte_count",
    "checksum",
    "status",
    "written_at",
    "updated_at",
];
pub const VALIDATION_COLS: [&str; 11] = [
    "validation_id",
    "run_id",
    "stage",
    "metric_name",
    "expected_value",
    "actual_value",
    "tolerance",
    "result",
    "query_version",
    "details",
    "measured_at",
];
pub const DISPATCH_COLS: [&str; 12] = [
    "dispatch_id",
    "run_id",
    "dispatch_type",
    "partition_id",
    "status",
    "attempt_count",
    "next_attempt_at",
    "last_http_status",
    "last_error",
    "created_at",
    "sent_at",
    "acked_at",
];
pub const EVENT_COLS: [&str; 21] = [
    "event_id",
    "event_time",
    "event_level",
    "event_name",
    "run_id",
    "job_key",
    "business_key",
    "partition_id",
    "chunk_index",
    "process_group",
    "processor_name",
    "processor_id",
    "node_id",
    "attempt_no",
    "row_count",
    "byte_count",
    "duration_ms",
    "error_class",
    "error_code",
    "message",
    "details",
];

/// Everything the ledger holds about one run.
#[derive(Clone, Debug)]
pub struct RunState {
    pub id: Uuid,
    pub row: Row,
    pub partitions: BTreeMap<String, Row>,
    pub files: BTreeMap<(String, i64), Row>,
    /// With the request number that last measured each (for "the most recently measured").
    pub validations: Vec<(Row, usize)>,
    pub dispatches: Vec<Row>,
    pub events: Vec<Row>,
}

impl RunState {
    pub fn status(&self) -> String {
        self.row.text("status").unwrap_or_default()
    }

    /// SUCCESS partition rows: what readers report while the run is EXTRACTING (§5.4).
    pub fn success_rows(&self) -> i64 {
        self.partitions
            .values()
            .filter(|p| p.text("status").as_deref() == Some("SUCCESS"))
            .count() as i64
    }

    /// A new `load_event` row of this run written by load-control (§8).
    pub fn event(&self, name: &str, level: &str) -> Row {
        let mut e = blank(&EVENT_COLS);
        e.insert("event_id", Cell::NewUuid(false));
        e.now("event_time");
        e.put("event_level", level);
        e.put("event_name", name);
        e.put("run_id", self.id.to_string());
        e.put("job_key", self.row.val("job_key").clone());
        e.put("business_key", self.row.val("business_key").clone());
        e.put("process_group", "LOAD_CONTROL_API");
        e.put("processor_name", name.to_lowercase());
        e.put("details", json!({}));
        e
    }

    pub fn push_event(&mut self, e: Row) {
        self.events.push(e);
    }

    /// §2.1: a CAS to `to`: heartbeat now, version + 1, completed_at when terminal. Leaving
    /// EXTRACTING makes the stored success count exact again (§5.4, "every transition out of
    /// EXTRACTING recounts it").
    pub fn change_status(&mut self, to: &str) {
        let r = &mut self.row;
        let v = r.int("version_no").unwrap_or(0);
        r.put("status", to);
        r.put("version_no", v + 1);
        r.now("heartbeat_at");
        if is_terminal(to) {
            r.now("completed_at");
        }
        self.sync_success_count();
    }

    pub fn sync_success_count(&mut self) {
        if self.status() == "EXTRACTING" {
            // §5.4 "completion without a queue": not exact while EXTRACTING; readers count rows.
            self.row.insert("success_partition_count", Cell::Unchecked);
        } else {
            let n = self.success_rows();
            self.row.put("success_partition_count", n);
        }
    }

    /// §2.2 [v1-ext]: a run entering a terminal status other than SUCCESS and TIMED_OUT aborts
    /// its unfinished partitions; every terminal status settles PENDING/SENT dispatches. Returns
    /// the number of partitions aborted.
    pub fn end_effects(&mut self, status: &str, cancelled: bool) -> i64 {
        let mut aborted = 0;
        if status != "SUCCESS" && status != "TIMED_OUT" {
            for p in self.partitions.values_mut() {
                let s = p.text("status").unwrap_or_default();
                if ["PENDING", "RUNNING", "RETRY"].contains(&s.as_str()) {
                    p.put("status", "ABORTED");
                    p.now("completed_at");
                    p.now("heartbeat_at");
                    p.put("error_code", status);
                    p.put("error_message", format!("run ended: {status}"));
                    aborted += 1;
                }
            }
        }
        for d in &mut self.dispatches {
            let s = d.text("status").unwrap_or_default();
            if s == "PENDING" || s == "SENT" {
                d.put("status", "DEAD");
                d.put(
                    "last_error",
                    if cancelled {
                        "run cancelled".to_string()
                    } else {
                        format!("run ended: {status}")
                    },
                );
            }
        }
        self.sync_success_count();
        aborted
    }

    pub fn dispatch_id(&self, ty: &str) -> Option<Uuid> {
        self.dispatches
            .iter()
            .find(|d| d.text("dispatch_type").as_deref() == Some(ty))
            .and_then(|d| d.text("dispatch_id"))
            .and_then(|s| Uuid::parse_str(&s).ok())
    }

    /// The stored metrics of `stage`, most recently measured last.
    pub fn metrics_of(&self, stage: &str) -> Vec<&Row> {
        let mut v: Vec<&(Row, usize)> = self
            .validations
            .iter()
            .filter(|(r, _)| r.text("stage").as_deref() == Some(stage))
            .collect();
        v.sort_by_key(|(_, step)| *step);
        v.into_iter().map(|(r, _)| r).collect()
    }
}

/// Cut to `n` Unicode characters (§1.1, §1.6, §3.3 [v1-ext]).
pub fn cut(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// A message column: cut to 2000 characters, the empty string stored as NULL (§1.1).
pub fn message_value(s: &str) -> Value {
    if s.is_empty() {
        Value::Null
    } else {
        json!(cut(s, 2000))
    }
}

/// The expected answer: status and the whole JSON body.
#[derive(Clone, Debug)]
pub struct Expected {
    pub status: u16,
    pub body: Value,
}

pub fn ok(body: Value) -> Expected {
    Expected { status: 200, body }
}

/// The common error body of §3.7 (`details` omitted when empty).
pub fn error(
    status: u16,
    code: &str,
    message: &str,
    details: Option<Value>,
    request_id: &str,
) -> Expected {
    let mut body = json!({"code": code, "message": message, "requestId": request_id});
    if let Some(d) = details {
        body["details"] = d;
    }
    Expected { status, body }
}

/// The model: every run of one sequence, and the identities the test's tokens carry.
#[derive(Clone, Debug)]
pub struct Model {
    pub job: String,
    pub runs: Vec<RunState>,
    pub nifi_identity: String,
    pub operator_identity: String,
    /// `cleanup.success_retention` is long in the test's configuration: SUCCESS runs are never
    /// due, runs of the failed class are due at once (`failed_retention` 0).
    pub success_due: bool,
}

impl Model {
    pub fn new(job: &str, nifi_identity: &str, operator_identity: &str) -> Model {
        Model {
            job: job.to_string(),
            runs: Vec::new(),
            nifi_identity: nifi_identity.into(),
            operator_identity: operator_identity.into(),
            success_due: false,
        }
    }

    pub fn run_id(&self, t: super::request::Target) -> Uuid {
        match t {
            super::request::Target::Run(i) => self.runs[i].id,
            super::request::Target::Missing(u) => u,
        }
    }

    /// The due predicate of §4.18 with the test's retentions.
    pub fn due(&self, r: &RunState) -> bool {
        let s = r.status();
        matches!(r.row.get("cleaned_at"), Some(Cell::Val(Value::Null)))
            && (FAILED_CLASS.contains(&s.as_str()) || (s == "SUCCESS" && self.success_due))
    }
}

//! LoadJob and LoadRun (group `loadcontrol.io`, version `v1beta1`, namespaced; `v1alpha1` is
//! served beside it with the same schema, see [`crate::SERVED_EARLIER`]).
// Each `printcolumn(...)` of the derive repeats `type_ = …`, which this lint takes for a duplicate.
#![allow(clippy::duplicated_attributes)]
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// `90m`, `2h`, `3d`, a number of seconds, or ISO-8601 (`PT90M`, `P3D`) — CONTRACT §10.1.
const DURATION: &str = r"^([0-9]+(\.[0-9]+)?[smhd]?|P([0-9]+W)?([0-9]+D)?(T([0-9]+H)?([0-9]+M)?([0-9]+(\.[0-9]+)?S)?)?)$";

fn duration_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "pattern": DURATION, "description": "duration: 90m, 2h, 3d, seconds, or ISO-8601 (PT90M, P3D)"})
}

/// `conditions` as a map-list keyed by `type`, so server-side apply merges one condition at a time.
fn conditions_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = generator.subschema_for::<Vec<Condition>>();
    s.insert("x-kubernetes-list-type".into(), json!("map"));
    s.insert("x-kubernetes-list-map-keys".into(), json!(["type"]));
    s
}

/// A condition in the shape of `metav1.Condition` (the same fields, formats and limits).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    #[schemars(length(max = 316))]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(extend("enum" = ["True", "False", "Unknown"]))]
    pub status: String,
    /// A CamelCase word saying why.
    #[schemars(
        regex(pattern = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
        length(min = 1, max = 1024)
    )]
    pub reason: String,
    #[schemars(length(max = 32768))]
    pub message: String,
    /// When the status last changed (RFC 3339).
    #[schemars(extend("format" = "date-time"))]
    pub last_transition_time: String,
    /// The object's generation this condition was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
}

/// The configuration's `recovery.mode`, defined once in the ledger that applies it.
pub use ledger::settings::RecoveryMode;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NifiSpec {
    /// PG-05 base URL for this job's dispatches: scheme, host and port without a path
    /// (https://nifi.example:9443); PG-05 answers 404 under a path, so one is refused unless
    /// the operator's nifi.receiver_path_allowed is true.
    #[schemars(regex(pattern = r"^https?://"))]
    pub receiver_url: Option<String>,
    #[schemars(range(min = 0.1, max = 3600.0))]
    pub timeout_seconds: Option<f64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySpec {
    pub mode: Option<RecoveryMode>,
    #[schemars(range(min = 1))]
    pub max_attempts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub stale: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub extract_query_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub run_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub validation_stale: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub publish_stale: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DispatchSpec {
    #[schemars(range(min = 1))]
    pub max_attempts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub backoff_min: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub backoff_max: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub ack_timeout: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CleanupSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub success_retention: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub failed_retention: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub event_retention: Option<String>,
}

/// One load definition (source table → target table) and its settings.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "loadcontrol.io",
    version = "v1beta1",
    kind = "LoadJob",
    namespaced,
    status = "LoadJobStatus",
    shortname = "lj",
    category = "loadcontrol",
    doc = "A load definition; its settings and suspend flag are written into the ledger's load_job table.",
    printcolumn(name = "JobKey", type_ = "string", json_path = ".spec.jobKey"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Suspended", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(
        name = "Active",
        type_ = "string",
        json_path = ".status.activeRun.status"
    ),
    printcolumn(name = "Last", type_ = "string", json_path = ".status.lastRun.status"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct LoadJobSpec {
    #[x_kube(validation = Rule::new("self == oldSelf").message("jobKey is immutable"))]
    #[schemars(regex(pattern = r"^[A-Z0-9_]{1,200}$"))]
    pub job_key: String,
    pub description: Option<String>,
    /// New runs are refused with 409 JOB_SUSPENDED while true.
    #[serde(default)]
    pub suspend: bool,
    pub nifi: Option<NifiSpec>,
    pub recovery: Option<RecoverySpec>,
    pub dispatch: Option<DispatchSpec>,
    pub cleanup: Option<CleanupSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunRef {
    pub name: String,
    pub run_id: String,
    pub business_key: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
// Missing fields default: a status written by an older (or newer) operator still reads.
#[serde(rename_all = "camelCase", default)]
pub struct RecentCounts {
    pub succeeded: i64,
    pub failed: i64,
    /// CANCELLED is not a failure.
    pub cancelled: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
// Missing fields default: a status written by an older (or newer) operator still reads.
#[serde(rename_all = "camelCase", default)]
pub struct LoadJobStatus {
    pub observed_generation: Option<i64>,
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub active_runs: i64,
    pub active_run: Option<RunRef>,
    pub last_run: Option<RunRef>,
    #[serde(default)]
    pub recent: RecentCounts,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct CancelRequest {
    #[schemars(length(min = 5, max = 2000))]
    pub reason: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub enum ResolutionOutcome {
    #[serde(rename = "PUBLISHED")]
    Published,
    #[serde(rename = "FAILED_PUBLISH")]
    FailedPublish,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct ResolutionRequest {
    pub outcome: ResolutionOutcome,
    #[schemars(length(min = 5, max = 2000))]
    pub reason: String,
}

/// One ledger run, mirrored by the operator; `cancel` and `resolution` are operator requests.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "loadcontrol.io",
    version = "v1beta1",
    kind = "LoadRun",
    namespaced,
    status = "LoadRunStatus",
    shortname = "lr",
    category = "loadcontrol",
    doc = "One load run as the ledger records it. Write spec.cancel or spec.resolution to act on it.",
    printcolumn(name = "Job", type_ = "string", json_path = ".spec.jobKey"),
    printcolumn(
        name = "BusinessKey",
        type_ = "string",
        json_path = ".spec.businessKey"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Partitions",
        type_ = "string",
        json_path = ".status.partitionsSummary"
    ),
    printcolumn(
        name = "Rows",
        type_ = "integer",
        json_path = ".status.counts.extracted"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct LoadRunSpec {
    #[x_kube(validation = Rule::new("self == oldSelf").message("jobKey is immutable"))]
    #[schemars(regex(pattern = r"^[A-Z0-9_]{1,200}$"))]
    pub job_key: String,
    #[x_kube(validation = Rule::new("self == oldSelf").message("businessKey is immutable"))]
    #[schemars(regex(pattern = r"^[0-9A-Za-z_.:\-]{1,200}$"))]
    pub business_key: String,
    #[x_kube(validation = Rule::new("self == oldSelf").message("runId is immutable"))]
    #[schemars(regex(
        pattern = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
    ))]
    pub run_id: String,
    pub cancel: Option<CancelRequest>,
    pub resolution: Option<ResolutionRequest>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
// Missing fields default: a status written by an older (or newer) operator still reads.
#[serde(rename_all = "camelCase", default)]
pub struct RunCounts {
    pub source: Option<i64>,
    pub extracted: i64,
    pub staging: Option<i64>,
    pub target: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
// Missing fields default: a status written by an older (or newer) operator still reads.
#[serde(rename_all = "camelCase", default)]
pub struct PartitionCounts {
    pub expected: i64,
    pub succeeded: i64,
    pub running: i64,
    pub pending: i64,
    pub retry: i64,
    pub failed: i64,
    pub timed_out: i64,
    pub aborted: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
// Missing fields default: a status written by an older (or newer) operator still reads.
#[serde(rename_all = "camelCase", default)]
pub struct RunError {
    pub stage: Option<String>,
    pub code: Option<String>,
    pub message: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
// Missing fields default: a status written by an older (or newer) operator still reads.
#[serde(rename_all = "camelCase", default)]
pub struct DispatchCounts {
    pub pending: i64,
    pub sent: i64,
    pub dead: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
// Missing fields default: a status written by an older (or newer) operator still reads.
#[serde(rename_all = "camelCase", default)]
pub struct LoadRunStatus {
    /// The ledger run status.
    pub phase: String,
    pub snapshot_scn: Option<String>,
    pub hdfs_run_path: Option<String>,
    pub stage_table: Option<String>,
    pub counts: RunCounts,
    pub partitions: PartitionCounts,
    /// `succeeded/expected`, for the printer column.
    pub partitions_summary: String,
    pub started_at: Option<String>,
    pub completed_at: Option<String>,
    pub error: Option<RunError>,
    pub dispatches: DispatchCounts,
    /// The ledger's `version_no` this status reflects. It never goes back: the API server refuses
    /// a status older than the one stored, so a deposed or stalled leader cannot regress a
    /// LoadRun even for a moment.
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= oldSelf",
        "message": "ledgerVersion never goes back: this status is older than the one stored (a deposed leader's write?)"
    }]))]
    pub ledger_version: i64,
    #[serde(default)]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The LoadRun's generation (its spec: cancel, resolution) this status has seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[cfg(test)]
mod status_tests {
    use super::*;

    #[test]
    fn a_status_missing_newer_fields_still_reads() {
        let run: LoadRunStatus =
            serde_json::from_value(serde_json::json!({"phase": "SUCCESS"})).unwrap();
        assert_eq!(
            (run.phase.as_str(), run.ledger_version, run.counts.extracted),
            ("SUCCESS", 0, 0)
        );
        let job: LoadJobStatus = serde_json::from_value(
            serde_json::json!({"activeRuns": 1, "recent": {"succeeded": 2}}),
        )
        .unwrap();
        assert_eq!(
            (job.active_runs, job.recent.succeeded, job.recent.cancelled),
            (1, 2, 0)
        );
    }
}

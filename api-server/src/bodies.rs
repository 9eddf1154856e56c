//! The bodies as the OpenAPI document declares them. Request bodies are parsed leniently
//! (`crate::input`), so their schemas are declared here once, with the contract's camelCase names,
//! patterns and limits; responses are the ledger's own types, in the lists below.
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// The common error body (docs/api.md, "Errors"); `code` comes first.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorDoc {
    #[schema(example = "RUN_STATUS_MISMATCH")]
    pub code: String,
    pub message: String,
    pub request_id: String,
    /// Omitted when empty.
    #[schema(value_type = Object, required = false)]
    pub details: Option<Value>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateRunBody {
    #[schema(pattern = r"^[A-Z0-9_]{1,200}$")]
    pub job_key: String,
    #[schema(pattern = r"^[0-9A-Za-z_.:\-]{1,200}$")]
    pub business_key: String,
    #[schema(pattern = r"^/[A-Za-z0-9_.=/\-]{1,1499}$")]
    pub hdfs_root: String,
    #[schema(pattern = r"^[A-Za-z_][A-Za-z0-9_]{0,60}$")]
    pub stage_table_prefix: String,
    #[schema(default = false, nullable = false)]
    pub allow_empty_source: Option<bool>,
    #[schema(value_type = Object, required = false, default = json!({}))]
    pub parameters: Option<Value>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManifestPartitionBody {
    #[schema(pattern = r"^([0-9]{4}|NULL)$")]
    pub partition_id: String,
    #[schema(pattern = r"^-?[0-9]{1,38}$")]
    pub lower_bound: Option<String>,
    #[schema(pattern = r"^-?[0-9]{1,38}$")]
    pub upper_bound: Option<String>,
    #[schema(default = false, nullable = false)]
    pub upper_inclusive: Option<bool>,
    #[schema(default = false, nullable = false)]
    pub is_null_partition: Option<bool>,
    #[schema(minimum = 0)]
    pub expected_row_count: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManifestBody {
    #[schema(pattern = r"^-?[0-9]{1,38}$")]
    pub snapshot_scn: Option<String>,
    #[schema(minimum = 0)]
    pub source_count: i64,
    #[schema(minimum = 0, default = 0, nullable = false)]
    pub source_null_split_count: Option<i64>,
    #[schema(pattern = r"^-?[0-9]{1,38}$")]
    pub source_min_split: Option<String>,
    #[schema(pattern = r"^-?[0-9]{1,38}$")]
    pub source_max_split: Option<String>,
    #[schema(minimum = 1, maximum = 10000)]
    pub planned_partition_count: i64,
    #[schema(value_type = Object, required = false, default = json!({}))]
    pub source_metrics: Option<Value>,
    #[schema(max_length = 50, default = "v1", nullable = false)]
    pub source_metrics_version: Option<String>,
    #[schema(min_items = 1, max_items = 10000)]
    pub partitions: Vec<ManifestPartitionBody>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunFailBody {
    pub expected_status: ledger::RunStatus,
    pub fail_status: ledger::RunStatus,
    #[schema(max_length = 100)]
    pub error_stage: String,
    #[schema(max_length = 100)]
    pub error_code: String,
    #[schema(max_length = 2000, default = "", nullable = false)]
    pub message: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimBody {
    pub claim_token: uuid::Uuid,
    #[schema(min_length = 1, max_length = 200)]
    pub worker_node: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChunkBody {
    pub claim_token: uuid::Uuid,
    #[schema(minimum = 0)]
    pub chunk_index: i64,
    #[schema(minimum = 1, maximum = 1000000)]
    pub chunk_count: i64,
    #[schema(max_length = 100)]
    pub fragment_identifier: Option<String>,
    #[schema(min_length = 1, max_length = 1500)]
    pub hdfs_path: String,
    #[schema(minimum = 0)]
    pub record_count: i64,
    #[schema(minimum = 0)]
    pub byte_count: Option<i64>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PartitionFailBody {
    pub claim_token: uuid::Uuid,
    #[schema(max_length = 100)]
    pub error_stage: String,
    #[schema(max_length = 100)]
    pub error_class: String,
    #[schema(max_length = 100)]
    pub error_code: String,
    #[schema(max_length = 2000, default = "", nullable = false)]
    pub message: Option<String>,
    #[schema(minimum = 0, maximum = 2147483647)]
    pub attempt: Option<i64>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValidationStartBody {
    pub dispatch_id: uuid::Uuid,
    #[schema(max_length = 200, default = "", nullable = false)]
    pub node: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricBody {
    #[schema(pattern = r"^[A-Za-z0-9_.:\-]{1,150}$")]
    pub metric_name: String,
    #[schema(max_length = 2000)]
    pub expected_value: Option<String>,
    #[schema(max_length = 2000)]
    pub actual_value: Option<String>,
    #[schema(max_length = 100)]
    pub tolerance: Option<String>,
    #[schema(pattern = "^(PASS|FAIL|WARN)$")]
    pub result: String,
    #[schema(value_type = Object, required = false, default = json!({}))]
    pub details: Option<Value>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsBody {
    #[schema(pattern = "^(STAGING|TARGET)$")]
    pub stage: String,
    #[schema(max_length = 50, default = "v1", nullable = false)]
    pub query_version: Option<String>,
    #[schema(min_items = 1, max_items = 500)]
    pub metrics: Vec<MetricBody>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublishClaimBody {
    pub publish_token: uuid::Uuid,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublishResultBody {
    pub publish_token: uuid::Uuid,
    #[schema(pattern = "^(PUBLISHED|FAILED_PUBLISH|PUBLISH_UNKNOWN)$")]
    pub outcome: String,
    #[schema(max_length = 100)]
    pub error_code: Option<String>,
    #[schema(max_length = 2000, default = "", nullable = false)]
    pub message: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SuccessBody {
    #[schema(minimum = 0)]
    pub target_count: Option<i64>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolveBody {
    #[schema(pattern = "^(PUBLISHED|FAILED_PUBLISH)$")]
    pub resolution: String,
    #[schema(min_length = 5, max_length = 2000)]
    pub reason: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CancelBody {
    #[schema(min_length = 5, max_length = 2000)]
    pub reason: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CleanupBody {
    #[schema(max_length = 300)]
    pub dropped_table: Option<String>,
    #[schema(pattern = r"^/[A-Za-z0-9_.=/\-]{1,1499}$")]
    pub deleted_path: Option<String>,
}

/// `GET /v1/runs/{run_id}/validations`.
#[derive(Serialize, ToSchema)]
pub struct MetricList {
    pub metrics: Vec<ledger::MetricView>,
}

/// `GET /v1/cleanup/candidates`.
#[derive(Serialize, ToSchema)]
pub struct CandidateList {
    pub runs: Vec<ledger::CleanupCandidate>,
}

/// `GET /v1/runs/{run_id}/events`.
#[derive(Serialize, ToSchema)]
pub struct EventList {
    pub events: Vec<ledger::EventView>,
}

//! The OpenAPI 3 document (CONTRACT §4.24), generated from the handlers' `#[utoipa::path]`
//! annotations and the body types below; served unauthenticated at `/openapi.json`.
//!
//! Request bodies are parsed leniently (crate::input), so their schemas are declared here once, with
//! the contract's camelCase names, patterns and limits; responses are the ledger's own types.
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{Server, extensions::ExtensionsBuilder};
use utoipa::{Modify, OpenApi, ToSchema};

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

/// Which roles each operation accepts (§3.6), by operation id (the handler's name).
pub const ROLES: &[(&str, &[&str])] = &[
    ("create_run", &["nifi"]),
    ("register_manifest", &["nifi"]),
    ("fail_run", &["nifi"]),
    ("claim_partition", &["nifi"]),
    ("report_chunk", &["nifi"]),
    ("fail_partition", &["nifi"]),
    ("start_validation", &["nifi"]),
    ("store_metrics", &["nifi"]),
    ("stage_validated", &["nifi"]),
    ("claim_publish", &["nifi"]),
    ("publish_result", &["nifi"]),
    ("succeed", &["nifi"]),
    ("list_runs", &["nifi", "operator"]),
    ("run_detail", &["nifi", "operator"]),
    ("list_metrics", &["nifi", "operator"]),
    ("run_events", &["nifi", "operator"]),
    ("cleanup_candidates", &["nifi", "operator"]),
    ("record_cleanup", &["nifi", "operator"]),
    ("monitor_summary", &["nifi", "operator"]),
    ("resend_dispatch", &["operator"]),
    ("resolve_publish_unknown", &["operator"]),
    ("cancel_run", &["operator"]),
    ("healthz", &[]),
    ("readyz", &[]),
    ("metrics", &[]),
    ("openapi_json", &[]),
];

struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
        for item in doc.paths.paths.values_mut() {
            for op in [&mut item.get, &mut item.post].into_iter().flatten() {
                let id = op.operation_id.clone().unwrap_or_default();
                let roles = ROLES
                    .iter()
                    .find(|(name, _)| *name == id)
                    .map(|(_, r)| *r)
                    .unwrap_or(&[]);
                let text = if roles.is_empty() {
                    "No authentication.".to_string()
                } else {
                    format!("Roles: {}.", roles.join(", "))
                };
                op.description = Some(match op.description.take() {
                    Some(d) if !d.is_empty() => format!("{d}\n\n{text}"),
                    _ => text,
                });
                op.extensions = Some(
                    ExtensionsBuilder::new()
                        .add("x-roles", json!(roles))
                        .build(),
                );
                if !roles.is_empty() {
                    op.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
                        "bearer",
                        Vec::<String>::new(),
                    )]);
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "load-control", description = "Decides, exactly once, the state of NiFi Oracle→Hive loads. Reference: docs/api.md in the repository."),
    paths(
        crate::handlers::create_run, crate::handlers::list_runs, crate::handlers::run_detail, crate::handlers::register_manifest, crate::handlers::fail_run,
        crate::handlers::claim_partition, crate::handlers::report_chunk, crate::handlers::fail_partition, crate::handlers::start_validation,
        crate::handlers::store_metrics, crate::handlers::list_metrics, crate::handlers::stage_validated, crate::handlers::claim_publish,
        crate::handlers::publish_result, crate::handlers::succeed, crate::handlers::resend_dispatch, crate::handlers::resolve_publish_unknown,
        crate::handlers::cancel_run, crate::handlers::cleanup_candidates, crate::handlers::record_cleanup, crate::handlers::monitor_summary,
        crate::handlers::run_events, crate::handlers::healthz, crate::handlers::readyz, crate::handlers::metrics, crate::handlers::openapi_json
    ),
    components(schemas(ErrorDoc)),
    modifiers(&Security)
)]
pub struct ApiDoc;

/// The document, with `server.root_path` as its server URL.
pub fn document(root_path: &str) -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    let root = if root_path.trim_matches('/').is_empty() {
        "/".to_string()
    } else {
        format!("/{}", root_path.trim_matches('/'))
    };
    doc.servers = Some(vec![Server::new(root)]);
    doc
}

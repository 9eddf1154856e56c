//! The OpenAPI 3 document (CONTRACT §4.24), generated from the handlers' `#[utoipa::path]`
//! annotations and the body types of `crate::bodies`; served unauthenticated at `/openapi.json`.
use serde_json::json;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{Server, extensions::ExtensionsBuilder};
use utoipa::{Modify, OpenApi};

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
    components(schemas(crate::bodies::ErrorDoc)),
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

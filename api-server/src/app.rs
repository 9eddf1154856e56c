//! The axum application: routing, the request frame every call goes through, and the handlers.
//! Handlers are thin: authenticate (extractor), validate, call one ledger operation, answer.
use crate::auth::{Authenticator, Caller, Role};
use crate::config::Config;
use crate::error::{ApiError, ErrorBody, PendingError};
use crate::input::{JVal, ObjReader, Problems, parse_json};
use crate::requests;
use axum::body::Body;
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::{HeaderValue, StatusCode, header, request::Parts};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::FutureExt;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use ledger::{
    Actor, CancelOutcome, ChunkOutcome, ClaimOutcome, CreatedRun, Ledger, ManifestOutcome,
    MetricsRecorded, PartitionFailOutcome, PublishClaim, ResendOutcome, RunFailOutcome,
    StageVerdict, StartOutcome, StatusChange, SuccessVerdict,
};
use serde_json::json;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use uuid::Uuid;

pub struct Inner {
    pub ledger: Ledger,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub auth: Authenticator,
    pub config: Config,
    limiter: Option<Arc<Semaphore>>,
    /// Connection counters of the HTTP edge (`edge.rs`), for `/metrics`.
    pub edge: Arc<crate::edge::EdgeStats>,
}

#[derive(Clone)]
pub struct AppState(pub Arc<Inner>);

impl AppState {
    pub fn new(config: Config, ledger: Ledger) -> Self {
        let auth = Authenticator::from_config(&config.auth);
        let limiter = config
            .server
            .limit_concurrency
            .map(|n| Arc::new(Semaphore::new(n)));
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let ledger = ledger.with_lock_wait_observer(metrics.clone());
        AppState(Arc::new(Inner {
            ledger,
            metrics,
            auth,
            config,
            limiter,
            edge: Default::default(),
        }))
    }
}

/// The identity of the call, filled in by the auth extractor for the access log.
#[derive(Clone, Default)]
struct CallerSlot(Arc<Mutex<Option<Caller>>>);

macro_rules! caller_extractor {
    ($(#[$m:meta])* $name:ident, $roles:expr) => {
        $(#[$m])*
        pub struct $name(pub Caller);
        impl FromRequestParts<AppState> for $name {
            type Rejection = ApiError;
            async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
                let caller = state.0.auth.authenticate(&parts.headers, $roles)?;
                if let Some(slot) = parts.extensions.get::<CallerSlot>() {
                    *slot.0.lock().expect("caller slot") = Some(caller.clone());
                }
                Ok($name(caller))
            }
        }
    };
}
caller_extractor!(
    /// Endpoints NiFi flows call (§3.6).
    NifiCaller,
    &[Role::Nifi]
);
caller_extractor!(
    /// Read endpoints and the cleanup report: NiFi or an operator.
    ReadCaller,
    &[Role::Nifi, Role::Operator]
);
caller_extractor!(
    /// Operator actions.
    OperatorCaller,
    &[Role::Operator]
);

impl Caller {
    /// The identity recorded on operator events.
    pub fn actor(&self) -> Actor {
        Actor {
            name: self.identity.clone(),
            role: self.role.as_str().to_string(),
        }
    }
}

/// What a request brought: path parameters, query and body, plus the problems found so far.
pub struct Input {
    path: HashMap<String, String>,
    pub query: Vec<(String, String)>,
    body: Option<JVal>,
    pub problems: Problems,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum BodyMode {
    /// The endpoint has a JSON request body; it is required.
    Json,
    /// Reads and queries: any body is ignored (its size still counts).
    Ignored,
}

impl Input {
    /// 413 is answered at once; everything else becomes a problem for the 422 (§3.7 order).
    pub async fn read(state: &AppState, req: Request, mode: BodyMode) -> Result<Input, ApiError> {
        let limit = state.0.config.server.max_body_bytes;
        let (mut parts, body) = req.into_parts();
        let mut problems = Problems::default();
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(ApiError::payload_too_large(limit));
        }
        // A body trickled in slower than the deadline holds a request permit: 408, and
        // (the body being unread) the connection is closed after the answer.
        let deadline = Duration::from_secs_f64(state.0.config.server.body_read_timeout);
        let Ok(collected) =
            tokio::time::timeout(deadline, Limited::new(body, limit).collect()).await
        else {
            return Err(ApiError::request_timeout(deadline));
        };
        let bytes = match collected {
            Ok(b) => b.to_bytes(),
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return Err(ApiError::payload_too_large(limit));
            }
            Err(e) => {
                problems.push("$", format!("could not read the body: {e}"));
                Default::default()
            }
        };
        let path = match RawPathParams::from_request_parts(&mut parts, &()).await {
            Ok(params) => params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            Err(_) => HashMap::new(),
        };
        let query: Vec<(String, String)> = parts
            .uri
            .query()
            .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
            .unwrap_or_default();
        for (key, value) in &query {
            if key.contains('\0') || value.contains('\0') {
                problems.push(key.replace('\0', "\\u0000"), crate::input::NUL_REFUSED);
            }
        }
        let mut body = None;
        if mode == BodyMode::Json {
            let content_type = parts
                .headers
                .get(header::CONTENT_TYPE)
                .map(|v| v.to_str().unwrap_or("?").to_string());
            if let Some(ct) = content_type.filter(|ct| !is_json_media_type(ct)) {
                problems.push(
                    "$",
                    format!("unsupported content type {ct:?}: send application/json"),
                );
            } else if bytes.is_empty() {
                problems.push(
                    "$",
                    "a JSON request body is required (send {} when every field is optional)",
                );
            } else {
                match parse_json(&bytes) {
                    Ok(v) => body = Some(v),
                    Err(e) => problems.push("$", format!("malformed JSON: {e}")),
                }
            }
        }
        Ok(Input {
            path,
            query,
            body,
            problems,
        })
    }

    /// `path.run_id`, validated.
    pub fn run_id(&mut self) -> Uuid {
        requests::run_id(
            self.path.get("run_id").map(String::as_str),
            &mut self.problems,
        )
    }

    /// `path.dispatch_id`, validated.
    pub fn dispatch_id(&mut self) -> Uuid {
        match self
            .path
            .get("dispatch_id")
            .and_then(|s| crate::input::parse_uuid(s))
        {
            Some(id) => id,
            None => {
                self.problems.push("path.dispatch_id", "must be a UUID");
                Uuid::nil()
            }
        }
    }

    /// `path.partition_id`, validated.
    pub fn partition_id(&mut self) -> String {
        requests::partition_id(
            self.path.get("partition_id").map(String::as_str),
            &mut self.problems,
        )
    }

    /// Runs `f` over the body object (reporting unknown fields afterwards); `None` without one.
    pub fn with_body<T>(
        &mut self,
        f: impl FnOnce(&mut ObjReader<'_>, &mut Problems) -> T,
    ) -> Option<T> {
        let body = self.body.as_ref()?;
        let mut o = ObjReader::new(body, "$", &mut self.problems)?;
        let t = f(&mut o, &mut self.problems);
        o.finish(&mut self.problems);
        Some(t)
    }
}

/// `application/json` or `application/<x>+json`, any case, parameters ignored (§3.2).
pub fn is_json_media_type(ct: &str) -> bool {
    let media = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

/// Collapses repeated slashes, ignores a trailing one, and strips `server.root_path` as whole
/// leading segments (§3.1). Runs before routing.
pub fn normalize_path(path: &str, root: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        out.push('/');
        out.push_str(seg);
    }
    let root = normalize_root(root);
    if !root.is_empty() {
        if out == root {
            out = String::new();
        } else if let Some(rest) = out.strip_prefix(&root).filter(|r| r.starts_with('/')) {
            out = rest.to_string();
        }
    }
    if out.is_empty() { "/".to_string() } else { out }
}

fn normalize_root(root: &str) -> String {
    root.split('/')
        .filter(|s| !s.is_empty())
        .fold(String::new(), |acc, s| format!("{acc}/{s}"))
}

fn valid_request_id(v: &str) -> bool {
    (1..=100).contains(&v.len())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn render_error(e: &ApiError, request_id: &str, mut headers: axum::http::HeaderMap) -> Response {
    let body = ErrorBody {
        code: e.code,
        message: &e.message,
        request_id,
        details: e.details.as_ref(),
    };
    let json = serde_json::to_vec(&body).unwrap_or_default();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.remove(header::CONTENT_LENGTH);
    let mut res = (e.status, json).into_response();
    for (k, v) in headers.iter() {
        res.headers_mut().insert(k.clone(), v.clone());
    }
    res
}

/// The frame of every request (after routing, so the route template is known): request id,
/// concurrency limit, error bodies, panic guard, access log.
async fn frame(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let request_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| valid_request_id(v))
        .map(str::to_string)
        .unwrap_or_else(|| Uuid::new_v4().to_string());
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let quiet = matches!(path.as_str(), "/healthz" | "/readyz" | "/metrics");
    let x_run_id = req
        .headers()
        .get("x-run-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let slot = CallerSlot::default();
    req.extensions_mut().insert(slot.clone());

    let permit = match (&state.0.limiter, path.starts_with("/v1")) {
        (Some(l), true) => match l.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => return finish(ApiError::service_unavailable().into_response(), &request_id),
        },
        _ => None,
    };
    let span = tracing::info_span!("request", requestId = %request_id, runId = tracing::field::Empty, partitionId = tracing::field::Empty);
    let mut res = match AssertUnwindSafe(tracing::Instrument::instrument(next.run(req), span))
        .catch_unwind()
        .await
    {
        Ok(res) => res,
        Err(_) => {
            tracing::error!(event = "handler_panic", requestId = %request_id, "request handler panicked");
            ApiError::internal().into_response()
        }
    };
    drop(permit);
    res = finish(res, &request_id);
    state.0.metrics.request(
        &endpoint,
        res.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    if !quiet && state.0.config.logging.access_log {
        let status = res.status().as_u16();
        let caller = slot.0.lock().expect("caller slot").clone();
        let (role, identity) = caller
            .map(|c| (c.role.as_str(), c.identity))
            .unwrap_or(("", String::new()));
        let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
        macro_rules! access {
            ($lvl:ident) => {
                tracing::$lvl!(target: "load_control.access", event = "api_response", requestId = %request_id, method = %method,
                    path = %path, endpoint = %endpoint, httpStatus = status, durationMs = duration_ms, role, identity = %identity,
                    xRunId = %x_run_id, "{method} {path} -> {status}")
            };
        }
        match status {
            500.. => access!(error),
            400..=499 => access!(warn),
            _ => access!(info),
        }
    }
    res
}

/// Renders a pending error (or axum's bare 404/405) as the common body, and sets X-Request-Id.
fn finish(mut res: Response, request_id: &str) -> Response {
    let pending = res
        .extensions_mut()
        .remove::<PendingError>()
        .map(|p| p.0)
        .or_else(|| match res.status() {
            StatusCode::NOT_FOUND => Some(ApiError::not_found()),
            StatusCode::METHOD_NOT_ALLOWED => Some(ApiError::method_not_allowed()),
            _ => None,
        });
    if let Some(e) = pending {
        let headers = res.headers().clone();
        res = render_error(&e, request_id, headers);
    }
    if let Ok(v) = HeaderValue::from_str(request_id) {
        res.headers_mut().insert("x-request-id", v);
    }
    res
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .route("/v1/runs", post(create_run).get(list_runs))
        .route("/v1/runs/{run_id}", get(run_detail))
        .route("/v1/runs/{run_id}/manifest", post(register_manifest))
        .route("/v1/runs/{run_id}/fail", post(fail_run))
        .route(
            "/v1/runs/{run_id}/partitions/{partition_id}/claim",
            post(claim_partition),
        )
        .route(
            "/v1/runs/{run_id}/partitions/{partition_id}/chunks",
            post(report_chunk),
        )
        .route(
            "/v1/runs/{run_id}/partitions/{partition_id}/fail",
            post(fail_partition),
        )
        .route("/v1/runs/{run_id}/validation/start", post(start_validation))
        .route(
            "/v1/runs/{run_id}/validations",
            post(store_metrics).get(list_metrics),
        )
        .route("/v1/runs/{run_id}/stage-validated", post(stage_validated))
        .route("/v1/runs/{run_id}/publish/claim", post(claim_publish))
        .route("/v1/runs/{run_id}/publish/result", post(publish_result))
        .route("/v1/runs/{run_id}/success", post(succeed))
        .route(
            "/v1/runs/{run_id}/dispatches/{dispatch_id}/resend",
            post(resend_dispatch),
        )
        .route(
            "/v1/runs/{run_id}/publish-unknown/resolve",
            post(resolve_publish_unknown),
        )
        .route("/v1/runs/{run_id}/cancel", post(cancel_run))
        .route("/v1/cleanup/candidates", get(cleanup_candidates))
        .route("/v1/runs/{run_id}/cleanup", post(record_cleanup))
        .route("/v1/monitor/summary", get(monitor_summary))
        .route("/v1/runs/{run_id}/events", get(run_events))
        .fallback(|| async { ApiError::not_found() })
        .layer(middleware::from_fn_with_state(state.clone(), frame))
        .layer(middleware::from_fn(crate::keep_alive::close_if_body_unread))
        .with_state(state)
}

/// The router behind path normalisation (which must happen before routing).
pub fn service(
    state: AppState,
) -> tower::util::MapRequest<Router, impl FnMut(Request) -> Request + Clone + Send + 'static> {
    let root = state.0.config.server.root_path.clone();
    let app = router(state);
    let normalize = move |mut req: Request| {
        let path = normalize_path(req.uri().path(), &root);
        if path != req.uri().path() {
            let pq = match req.uri().query() {
                Some(q) => format!("{path}?{q}"),
                None => path,
            };
            let mut parts = req.uri().clone().into_parts();
            if let Ok(p) = pq.parse() {
                parts.path_and_query = Some(p);
                if let Ok(uri) = axum::http::Uri::from_parts(parts) {
                    *req.uri_mut() = uri;
                }
            }
        }
        req
    };
    tower::ServiceExt::<Request<Body>>::map_request(app, normalize)
}

#[utoipa::path(get, path = "/healthz", description = "Liveness (§4.23).", responses((status = 200, description = "OK")))]
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

#[utoipa::path(get, path = "/openapi.json", description = "This document (§4.24).", responses((status = 200, description = "OK")))]
pub async fn openapi_json(State(s): State<AppState>) -> Response {
    Json(crate::openapi::document(&s.0.config.server.root_path)).into_response()
}

#[utoipa::path(get, path = "/metrics", description = "Prometheus exposition in the OpenMetrics text format (§9.1).", responses((status = 200, description = "OK")))]
pub async fn metrics(State(s): State<AppState>) -> Response {
    // prometheus-client writes OpenMetrics text (ending in `# EOF`): served as what it is.
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        {
            s.0.metrics
                .connections_retired(s.0.ledger.connections_retired());
            s.0.metrics.edge(&s.0.edge);
            s.0.metrics.render()
        },
    )
        .into_response()
}

#[utoipa::path(get, path = "/readyz", description = "Readiness (§4.23): the database takes a write within 2 s — a transaction that is given an id and commits (waiting for a synchronous standby as any write does); 503 while it is read-only, in recovery or unreachable.", responses((status = 200, description = "OK"), (status = 503, description = "the database cannot take writes now")))]
pub async fn readyz(State(s): State<AppState>) -> Response {
    match tokio::time::timeout(Duration::from_secs(2), s.0.ledger.write_check()).await {
        Ok(Ok(())) => Json(json!({"status": "ok"})).into_response(),
        outcome => {
            let cause = match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out after 2s".to_string(),
            };
            tracing::warn!(event = "readyz_failed", cause = %cause, "readiness check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable"})),
            )
                .into_response()
        }
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

#[utoipa::path(post, path = "/v1/runs", description = "Create a run (§4.1).", request_body = crate::openapi::CreateRunBody, responses((status = 200, body = ledger::CreatedRun), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn create_run(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<CreatedRun> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let new_run = input.with_body(requests::create_run);
    input.problems.check()?;
    Ok(Json(
        s.0.ledger.create_run(&new_run.expect("validated")).await?,
    ))
}

#[utoipa::path(get, path = "/v1/runs", description = "List runs, newest first (§4.4).", params(("jobKey" = Option<String>, Query), ("businessKey" = Option<String>, Query), ("status" = Option<String>, Query), ("limit" = Option<i64>, Query, minimum = 1, maximum = 500)), responses((status = 200, body = Vec<ledger::RunSummary>), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn list_runs(
    State(s): State<AppState>,
    _c: ReadCaller,
    req: Request,
) -> ApiResult<Vec<ledger::RunSummary>> {
    let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
    let filter = requests::run_filter(&input.query, &mut input.problems);
    input.problems.check()?;
    Ok(Json(s.0.ledger.list_runs(&filter).await?))
}

#[utoipa::path(get, path = "/v1/runs/{run_id}", description = "Run detail with partitions and dispatches (§4.5).", params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::RunDetail), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn run_detail(
    State(s): State<AppState>,
    _c: ReadCaller,
    req: Request,
) -> ApiResult<ledger::RunDetail> {
    let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
    let run_id = input.run_id();
    input.problems.check()?;
    Ok(Json(s.0.ledger.run_detail(run_id).await?))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/manifest", description = "Register the manifest (§4.2).", request_body = crate::openapi::ManifestBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::ManifestOutcome), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn register_manifest(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<ManifestOutcome> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let manifest = input.with_body(requests::manifest);
    input.problems.check()?;
    Ok(Json(
        s.0.ledger
            .register_manifest(run_id, &manifest.expect("validated"))
            .await?,
    ))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/fail", description = "Non-partition stage failure (§4.3).", request_body = crate::openapi::RunFailBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::RunFailOutcome), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn fail_run(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<RunFailOutcome> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let failure = input.with_body(requests::run_failure).flatten();
    input.problems.check()?;
    Ok(Json(
        s.0.ledger
            .fail_run(run_id, &failure.expect("validated"))
            .await?,
    ))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/partitions/{partition_id}/claim", description = "Claim a partition (§4.6).", request_body = crate::openapi::ClaimBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)"), ("partition_id" = String, Path, description = "4 digits or NULL")), responses((status = 200, body = ledger::ClaimOutcome), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn claim_partition(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<ClaimOutcome> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let pid = input.partition_id();
    let claim = input.with_body(requests::claim);
    input.problems.check()?;
    let (token, worker) = claim.expect("validated");
    Ok(Json(
        s.0.ledger
            .claim_partition(run_id, &pid, token, &worker)
            .await?,
    ))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/partitions/{partition_id}/chunks", description = "Chunk report (§4.7).", request_body = crate::openapi::ChunkBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)"), ("partition_id" = String, Path, description = "4 digits or NULL")), responses((status = 200, body = ledger::ChunkOutcome), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn report_chunk(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<ChunkOutcome> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let pid = input.partition_id();
    let report = input.with_body(requests::chunk);
    input.problems.check()?;
    let report = report.expect("validated")?;
    let outcome = s.0.ledger.report_chunk(run_id, &pid, &report).await?;
    s.0.metrics.chunk_report(outcome.result);
    Ok(Json(outcome))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/partitions/{partition_id}/fail", description = "Final partition failure (§4.8).", request_body = crate::openapi::PartitionFailBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)"), ("partition_id" = String, Path, description = "4 digits or NULL")), responses((status = 200, body = ledger::PartitionFailOutcome), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn fail_partition(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<PartitionFailOutcome> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let pid = input.partition_id();
    let failure = input.with_body(requests::partition_failure);
    input.problems.check()?;
    Ok(Json(
        s.0.ledger
            .fail_partition(run_id, &pid, &failure.expect("validated"))
            .await?,
    ))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/validation/start", description = "Start stage validation; acknowledges the dispatch (§4.9).", request_body = crate::openapi::ValidationStartBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::StartOutcome), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn start_validation(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<StartOutcome> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let body = input.with_body(requests::validation_start);
    input.problems.check()?;
    let (dispatch_id, node) = body.expect("validated");
    Ok(Json(
        s.0.ledger
            .start_validation(run_id, dispatch_id, &node)
            .await?,
    ))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/validations", description = "Store STAGING or TARGET metrics (§4.10).", request_body = crate::openapi::MetricsBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::MetricsRecorded), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn store_metrics(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<MetricsRecorded> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let body = input.with_body(requests::metrics).flatten();
    input.problems.check()?;
    let (stage, version, items) = body.expect("validated");
    Ok(Json(
        s.0.ledger
            .store_metrics(run_id, stage, &version, &items)
            .await?,
    ))
}

#[utoipa::path(get, path = "/v1/runs/{run_id}/validations", description = "Stored metrics (§4.21).", params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = crate::openapi::MetricList), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn list_metrics(
    State(s): State<AppState>,
    _c: ReadCaller,
    req: Request,
) -> ApiResult<crate::openapi::MetricList> {
    let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
    let run_id = input.run_id();
    input.problems.check()?;
    Ok(Json(crate::openapi::MetricList {
        metrics: s.0.ledger.metrics(run_id).await?,
    }))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/stage-validated", description = "Judge the STAGING metrics (§4.11); no body.", params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::StageVerdict), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn stage_validated(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<StageVerdict> {
    let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
    let run_id = input.run_id();
    input.problems.check()?;
    Ok(Json(s.0.ledger.stage_validated(run_id).await?))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/publish/claim", description = "Claim the publish (§4.12).", request_body = crate::openapi::PublishClaimBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::PublishClaim), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn claim_publish(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<PublishClaim> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let token = input.with_body(requests::publish_token);
    input.problems.check()?;
    Ok(Json(
        s.0.ledger
            .claim_publish(run_id, token.expect("validated"))
            .await?,
    ))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/publish/result", description = "Report the publish outcome (§4.13).", request_body = crate::openapi::PublishResultBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::StatusChange), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn publish_result(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<StatusChange> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let body = input.with_body(requests::publish_result).flatten();
    input.problems.check()?;
    let r = body.expect("validated");
    Ok(Json(
        s.0.ledger
            .publish_result(
                run_id,
                r.token,
                r.outcome,
                r.error_code.as_deref(),
                &r.message,
            )
            .await?,
    ))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/success", description = "Judge the TARGET metrics and finish (§4.14).", request_body = crate::openapi::SuccessBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::SuccessVerdict), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn succeed(
    State(s): State<AppState>,
    _c: NifiCaller,
    req: Request,
) -> ApiResult<SuccessVerdict> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let target_count = input.with_body(requests::success);
    input.problems.check()?;
    Ok(Json(
        s.0.ledger.succeed(run_id, target_count.flatten()).await?,
    ))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/dispatches/{dispatch_id}/resend", description = "Resend a DEAD or SENT dispatch (§4.15); no body.", params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)"), ("dispatch_id" = String, Path, description = "dispatch UUID")), responses((status = 200, body = ledger::ResendOutcome), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn resend_dispatch(
    State(s): State<AppState>,
    c: OperatorCaller,
    req: Request,
) -> ApiResult<ResendOutcome> {
    let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
    let run_id = input.run_id();
    let dispatch_id = input.dispatch_id();
    input.problems.check()?;
    Ok(Json(
        s.0.ledger
            .resend_dispatch(run_id, dispatch_id, &c.0.actor())
            .await?,
    ))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/publish-unknown/resolve", description = "Resolve PUBLISH_UNKNOWN (§4.16).", request_body = crate::openapi::ResolveBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::StatusChange), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn resolve_publish_unknown(
    State(s): State<AppState>,
    c: OperatorCaller,
    req: Request,
) -> ApiResult<StatusChange> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let body = input.with_body(requests::resolution).flatten();
    input.problems.check()?;
    let (resolution, reason) = body.expect("validated");
    Ok(Json(
        s.0.ledger
            .resolve_publish_unknown(run_id, resolution, &reason, &c.0.actor(), None)
            .await?,
    ))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/cancel", description = "Cancel a run (§4.17).", request_body = crate::openapi::CancelBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::CancelOutcome), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn cancel_run(
    State(s): State<AppState>,
    c: OperatorCaller,
    req: Request,
) -> ApiResult<CancelOutcome> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let reason = input.with_body(requests::reason);
    input.problems.check()?;
    Ok(Json(
        s.0.ledger
            .cancel_run(run_id, &reason.expect("validated"), &c.0.actor(), None)
            .await?,
    ))
}

#[utoipa::path(get, path = "/v1/cleanup/candidates", description = "Runs due for cleanup (§4.18).", params(("jobKey" = Option<String>, Query), ("limit" = Option<i64>, Query, minimum = 1, maximum = 500)), responses((status = 200, body = crate::openapi::CandidateList), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn cleanup_candidates(
    State(s): State<AppState>,
    _c: ReadCaller,
    req: Request,
) -> ApiResult<crate::openapi::CandidateList> {
    let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
    let job_key = requests::query_job_key(&input.query, &mut input.problems);
    let limit = requests::query_int(&input.query, "limit", 1, 500, 50, &mut input.problems);
    input.problems.check()?;
    Ok(Json(crate::openapi::CandidateList {
        runs: s
            .0
            .ledger
            .cleanup_candidates(job_key.as_deref(), limit)
            .await?,
    }))
}

#[utoipa::path(post, path = "/v1/runs/{run_id}/cleanup", description = "Record a cleanup (§4.19).", request_body = crate::openapi::CleanupBody, params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)")), responses((status = 200, body = ledger::CleanupRecorded), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn record_cleanup(
    State(s): State<AppState>,
    c: ReadCaller,
    req: Request,
) -> ApiResult<ledger::CleanupRecorded> {
    let mut input = Input::read(&s, req, BodyMode::Json).await?;
    let run_id = input.run_id();
    let body = input.with_body(requests::cleanup_report);
    input.problems.check()?;
    let (table, path) = body.expect("validated");
    let actor = (c.0.role == Role::Operator).then(|| c.0.actor());
    Ok(Json(
        s.0.ledger
            .record_cleanup(run_id, table.as_deref(), path.as_deref(), actor.as_ref())
            .await?,
    ))
}

#[utoipa::path(get, path = "/v1/monitor/summary", description = "Monitor summary (§4.20).", params(("alertLimit" = Option<i64>, Query, minimum = 1, maximum = 500)), responses((status = 200, body = ledger::MonitorSummary), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn monitor_summary(
    State(s): State<AppState>,
    _c: ReadCaller,
    req: Request,
) -> ApiResult<ledger::MonitorSummary> {
    let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
    let limit = requests::query_int(&input.query, "alertLimit", 1, 500, 100, &mut input.problems);
    input.problems.check()?;
    Ok(Json(s.0.ledger.monitor_summary(limit).await?))
}

#[utoipa::path(get, path = "/v1/runs/{run_id}/events", description = "Event timeline, oldest first (§4.22).", params(("run_id" = String, Path, description = "run UUID (hyphenated, 32 hex, braced or urn:uuid)"), ("limit" = Option<i64>, Query, minimum = 1, maximum = 1000)), responses((status = 200, body = crate::openapi::EventList), (status = 401, body = crate::openapi::ErrorDoc), (status = 403, body = crate::openapi::ErrorDoc), (status = 404, body = crate::openapi::ErrorDoc), (status = 409, body = crate::openapi::ErrorDoc), (status = 413, body = crate::openapi::ErrorDoc), (status = 422, body = crate::openapi::ErrorDoc), (status = 503, body = crate::openapi::ErrorDoc)))]
pub async fn run_events(
    State(s): State<AppState>,
    _c: ReadCaller,
    req: Request,
) -> ApiResult<crate::openapi::EventList> {
    let mut input = Input::read(&s, req, BodyMode::Ignored).await?;
    let run_id = input.run_id();
    let limit = requests::query_int(&input.query, "limit", 1, 1000, 200, &mut input.problems);
    input.problems.check()?;
    Ok(Json(crate::openapi::EventList {
        events: s.0.ledger.run_events(run_id, limit).await?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_before_routing() {
        assert_eq!(normalize_path("/v1//runs/", ""), "/v1/runs");
        assert_eq!(normalize_path("/lca/v1/runs", "/lca"), "/v1/runs");
        assert_eq!(normalize_path("/lca/v1/runs", "lca/"), "/v1/runs");
        assert_eq!(normalize_path("/lcav1/runs", "/lca"), "/lcav1/runs");
        assert_eq!(normalize_path("//lca//v1/runs", "/lca"), "/v1/runs");
        assert_eq!(normalize_path("/", ""), "/");
    }

    #[test]
    fn json_media_types() {
        assert!(is_json_media_type("application/json"));
        assert!(is_json_media_type("Application/JSON; charset=UTF-8"));
        assert!(is_json_media_type("application/vnd.nifi+json"));
        assert!(!is_json_media_type("text/plain"));
        assert!(!is_json_media_type("application/x-www-form-urlencoded"));
    }

    #[test]
    fn request_ids_are_adopted_only_when_safe() {
        assert!(valid_request_id("nifi-req-1.a_b"));
        assert!(!valid_request_id(""));
        assert!(!valid_request_id("has space"));
        assert!(!valid_request_id(&"x".repeat(101)));
    }
}

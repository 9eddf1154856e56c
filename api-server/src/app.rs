//! The axum application: routing, the request frame every call goes through, and the handlers.
//! Handlers are thin: authenticate (extractor), validate, call one ledger operation, answer.
use crate::auth::{Authenticator, Caller, Role};
use crate::config::Config;
use crate::error::{ApiError, ErrorBody, PendingError};
use crate::handlers::*;
use crate::input::{JVal, ObjReader, Problems, parse_json};
use crate::requests;
use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::{HeaderValue, StatusCode, header, request::Parts};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::FutureExt;
use http_body_util::BodyExt;
use ledger::{Actor, Ledger};
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
    /// `server.limit_concurrency` request permits, taken once a request's body has arrived.
    limiter: Option<Arc<Semaphore>>,
    /// With a limit: the bytes of request bodies being read or handled, at most
    /// `limit_concurrency × max_body_bytes` in all (what the permits bounded when they were
    /// taken before the body), charged as the bytes arrive.
    body_budget: Option<Arc<Semaphore>>,
    /// Connection counters of the HTTP edge (`edge.rs`), for `/metrics`.
    pub edge: Arc<crate::edge::EdgeStats>,
    /// `server.forwarded_allow_ips`, parsed (the access log's client address).
    trusted_proxies: lcconfig::config::TrustedProxies,
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
        let body_budget = config.server.limit_concurrency.map(|n| {
            let bytes = n.max(1).saturating_mul(config.server.max_body_bytes);
            Arc::new(Semaphore::new(bytes.min(Semaphore::MAX_PERMITS)))
        });
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let ledger = ledger.with_lock_wait_observer(metrics.clone());
        // Validated at start; a configuration that skipped validation trusts no proxy.
        let trusted_proxies =
            lcconfig::config::TrustedProxies::parse(&config.server.forwarded_allow_ips)
                .unwrap_or(lcconfig::config::TrustedProxies::Only(Vec::new()));
        AppState(Arc::new(Inner {
            ledger,
            metrics,
            auth,
            trusted_proxies,
            config,
            limiter,
            body_budget,
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
                if let Some(connection) = parts.extensions.get::<crate::edge::ConnectionMark>() {
                    connection.authenticated();
                }
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
    /// The request permit and the body's bytes of the budget, held until the handler is done.
    _held: Held,
}

/// What a request holds while it is handled (`Input`): its `limit_concurrency` permit and its
/// body's share of the body budget.
#[derive(Default)]
struct Held {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    body_bytes: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Why a body could not be read whole.
enum BodyError {
    TooLarge,
    Read(axum::Error),
}

/// Reads `body` whole, at most `limit` bytes, charging each arriving frame to `budget` (waiting
/// for it when the budget is spent) into `held`.
async fn read_body(
    mut body: Body,
    limit: usize,
    budget: Option<&Arc<Semaphore>>,
    held: &mut Option<tokio::sync::OwnedSemaphorePermit>,
) -> Result<bytes::Bytes, BodyError> {
    let mut buf = bytes::BytesMut::new();
    // Bounded by the limit: every round adds at least one byte or ends.
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(BodyError::Read)?.into_data() else {
            continue; // trailers
        };
        if data.is_empty() {
            continue;
        }
        if buf.len() + data.len() > limit {
            return Err(BodyError::TooLarge);
        }
        if let Some(budget) = budget {
            let n = u32::try_from(data.len()).map_err(|_| BodyError::TooLarge)?;
            let got = budget
                .clone()
                .acquire_many_owned(n)
                .await
                .expect("the body budget is never closed");
            match held {
                Some(h) => h.merge(got),
                None => *held = Some(got),
            }
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
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
        // The whole body first, then the request permit: a body trickled in holds no permit,
        // only the bytes it has sent. Slower than the deadline: 408, and (the body being unread)
        // the connection is closed after the answer.
        let mut held = Held::default();
        let deadline = Duration::from_secs_f64(state.0.config.server.body_read_timeout);
        let budget = state.0.body_budget.as_ref();
        let Ok(collected) = tokio::time::timeout(
            deadline,
            read_body(body, limit, budget, &mut held.body_bytes),
        )
        .await
        else {
            return Err(ApiError::request_timeout(deadline));
        };
        let bytes = match collected {
            Ok(b) => b,
            Err(BodyError::TooLarge) => return Err(ApiError::payload_too_large(limit)),
            Err(BodyError::Read(e)) => {
                problems.push("$", format!("could not read the body: {e}"));
                Default::default()
            }
        };
        // `limit_concurrency` (only `/v1` handlers read an `Input`): the permit bounds the work
        // of parsing, validating and the ledger call.
        if let Some(limiter) = &state.0.limiter {
            match limiter.clone().try_acquire_owned() {
                Ok(p) => held.permit = Some(p),
                Err(_) => return Err(ApiError::service_unavailable()),
            }
        }
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
            _held: held,
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
/// error bodies, panic guard, access log. The concurrency limit is `Input::read`'s, once the body
/// has arrived.
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
    let logging = &state.0.config.logging;
    let access_logged = !quiet && logging.access_log;
    let bodies_logged = access_logged && logging.access_body;
    let client = if access_logged {
        let peer = req
            .extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0);
        crate::access::client(
            peer,
            req.headers(),
            state.0.config.server.proxy_headers,
            &state.0.trusted_proxies,
        )
    } else {
        String::new()
    };
    let query = crate::access::shown_query(req.uri().query().unwrap_or(""));
    let request_body = if bodies_logged && matches!(method.as_str(), "POST" | "PUT" | "PATCH") {
        let (parts, body) = req.into_parts();
        let (body, seen) = crate::access::Tee::wrap(body, logging.access_body_max);
        req = Request::from_parts(parts, body);
        Some(seen)
    } else {
        None
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
    res = finish(res, &request_id);
    state.0.metrics.request(
        &endpoint,
        res.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    if access_logged {
        let max = logging.access_body_max;
        let request_body = request_body.map(|tee| tee.clipped(max)).unwrap_or_default();
        let mut response_body = String::new();
        if bodies_logged {
            let (parts, body) = res.into_parts();
            // Our responses are whole buffers; collecting one cannot fail or wait.
            let bytes = axum::body::to_bytes(body, usize::MAX)
                .await
                .unwrap_or_default();
            response_body = crate::access::clip_bytes(&bytes, max);
            res = Response::from_parts(parts, Body::from(bytes));
        }
        tracing::info!(target: "load_control.access", event = "api_request", requestId = %request_id, method = %method,
            path = %path, query = %query, client = %client, xRunId = %x_run_id, requestBody = %request_body,
            "{method} {path} from {client}");
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
                    xRunId = %x_run_id, responseBody = %response_body, "{method} {path} -> {status}")
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

    /// The body budget is charged as bytes arrive: a body that would take more than what is
    /// left waits (the socket is not read) until other requests give theirs back.
    #[tokio::test]
    async fn a_body_waits_for_the_budget_and_holds_what_it_read() {
        let budget = Arc::new(Semaphore::new(100));
        let elsewhere = budget.clone().acquire_many_owned(50).await.unwrap();
        let chunks = [vec![b'a'; 30], vec![b'b'; 30]];
        let body = Body::from_stream(futures::stream::iter(chunks.map(Ok::<_, std::io::Error>)));
        let reading = tokio::spawn({
            let budget = budget.clone();
            async move {
                let mut held = None;
                let read = read_body(body, 1000, Some(&budget), &mut held).await;
                (read.ok(), held)
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!reading.is_finished(), "60 bytes do not fit in the 50 left");
        // The first 30 bytes hold their share; the next 30 are queued for the 20 left.
        assert_eq!(budget.available_permits(), 0);
        drop(elsewhere);
        let (bytes, held) = tokio::time::timeout(Duration::from_secs(5), reading)
            .await
            .expect("the budget was given back")
            .unwrap();
        assert_eq!(bytes.unwrap().len(), 60);
        assert_eq!(held.as_ref().map(|h| h.num_permits()), Some(60));
        assert_eq!(budget.available_permits(), 40);
        drop(held);
        assert_eq!(budget.available_permits(), 100);
        let over = Body::from(vec![b'c'; 1001]);
        assert!(matches!(
            read_body(over, 1000, Some(&budget), &mut None).await,
            Err(BodyError::TooLarge)
        ));
    }

    #[test]
    fn request_ids_are_adopted_only_when_safe() {
        assert!(valid_request_id("nifi-req-1.a_b"));
        assert!(!valid_request_id(""));
        assert!(!valid_request_id("has space"));
        assert!(!valid_request_id(&"x".repeat(101)));
    }
}

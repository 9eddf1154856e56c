//! The axum application: routing, the request frame every call goes through, and the handlers.
//! Handlers are thin: authenticate (extractor), validate, call one ledger operation, answer.
use crate::auth::Authenticator;
use crate::config::Config;
use crate::error::{ApiError, ErrorBody, PendingError};
use crate::extract::*;
use crate::handlers::*;
use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::FutureExt;
use ledger::Ledger;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Semaphore;
use uuid::Uuid;

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
        let root_path = config.server.root_path.clone();
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
            openapi: crate::openapi::document(&root_path),
        }))
    }
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
    let error_code;
    (res, error_code) = finish(res, &request_id);
    if res.status() == StatusCode::SERVICE_UNAVAILABLE
        && let Some(code) = error_code
    {
        state.0.metrics.unavailable(code);
    }
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

/// Renders a pending error (or axum's bare 404/405) as the common body, and sets X-Request-Id;
/// also returns the error's code, for the metrics.
fn finish(mut res: Response, request_id: &str) -> (Response, Option<&'static str>) {
    let pending = res
        .extensions_mut()
        .remove::<PendingError>()
        .map(|p| p.0)
        .or_else(|| match res.status() {
            StatusCode::NOT_FOUND => Some(ApiError::not_found()),
            StatusCode::METHOD_NOT_ALLOWED => Some(ApiError::method_not_allowed()),
            _ => None,
        });
    let code = pending.as_ref().map(|e| e.code);
    if let Some(e) = pending {
        let headers = res.headers().clone();
        res = render_error(&e, request_id, headers);
    }
    if let Ok(v) = HeaderValue::from_str(request_id) {
        res.headers_mut().insert("x-request-id", v);
    }
    (res, code)
}

/// The kubelet's probes: on the API's port, and alone on `server.health_port`.
fn probe_routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// `routes` with the API's error rendering, access log and request ids.
fn with_frame(routes: Router<AppState>, state: AppState) -> Router {
    routes
        .fallback(|| async { ApiError::not_found() })
        .layer(middleware::from_fn_with_state(state.clone(), frame))
        .layer(middleware::from_fn(crate::keep_alive::close_if_body_unread))
        .with_state(state)
}

/// What `server.health_port` serves: the probes, nothing else (404).
pub fn health_router(state: AppState) -> Router {
    with_frame(probe_routes(), state)
}

pub fn router(state: AppState) -> Router {
    let routes = probe_routes()
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
        .route("/v1/runs/{run_id}/events", get(run_events));
    with_frame(routes, state)
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
    use std::time::Duration;

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

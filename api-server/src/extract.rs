//! What every handler takes: the application state, the caller (one extractor per role set),
//! and the request's input (path, query and body, read within the body budget).
use crate::auth::{Authenticator, Caller, Role};
use crate::config::Config;
use crate::error::ApiError;
use crate::input::{JVal, ObjReader, Problems, parse_json};
use crate::requests;
use axum::body::Body;
use axum::extract::{FromRequestParts, RawPathParams, Request};
use axum::http::{header, request::Parts};
use http_body_util::BodyExt;
use ledger::{Actor, Ledger};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use uuid::Uuid;

pub struct Inner {
    pub ledger: Ledger,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub auth: Authenticator,
    pub config: Config,
    /// `server.limit_concurrency` request permits, taken once a request's body has arrived.
    pub(crate) limiter: Option<Arc<Semaphore>>,
    /// With a limit: the bytes of request bodies being read or handled, at most
    /// `limit_concurrency × max_body_bytes` in all (what the permits bounded when they were
    /// taken before the body), charged as the bytes arrive.
    pub(crate) body_budget: Option<Arc<Semaphore>>,
    /// Connection counters of the HTTP edge (`edge.rs`), for `/metrics`.
    pub edge: Arc<crate::edge::EdgeStats>,
    /// The OpenAPI document, with `server.root_path` as its server URL (`/openapi.json`).
    pub openapi: utoipa::openapi::OpenApi,
    /// `server.forwarded_allow_ips`, parsed (the access log's client address).
    pub(crate) trusted_proxies: lcconfig::config::TrustedProxies,
}

#[derive(Clone)]
pub struct AppState(pub Arc<Inner>);

/// The identity of the call, filled in by the auth extractor for the access log.
#[derive(Clone, Default)]
pub(crate) struct CallerSlot(pub(crate) Arc<Mutex<Option<Caller>>>);

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
pub(crate) struct Held {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    body_bytes: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Why a body could not be read whole.
pub(crate) enum BodyError {
    TooLarge,
    Read(axum::Error),
}

/// Reads `body` whole, at most `limit` bytes, charging each arriving frame to `budget` (waiting
/// for it when the budget is spent) into `held`.
pub(crate) async fn read_body(
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

//! The HTTP side of NiFi's InvokeHTTP processors: pooled keep-alive connections, bearer token,
//! `Content-Type: application/json` without charset, no `Accept`, an empty `User-Agent`, retries of
//! a 5xx or a transport error up to five more times with the same body — and the faults the
//! simulator injects: duplicate delivery and lost responses.
use crate::nifi::faults::{FaultKind, Faults};
use reqwest::StatusCode;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// What one logical call came back with: the status and the JSON body NiFi would read.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    /// An earlier attempt of this call got no answer (a transport error or a 5xx): the server
    /// may have applied the call already.
    pub retried: bool,
}

impl Answer {
    pub fn ok(&self) -> bool {
        self.status == 200
    }
    pub fn code(&self) -> &str {
        self.body.get("code").and_then(Value::as_str).unwrap_or("")
    }
    pub fn flag(&self, key: &str) -> bool {
        self.body.get(key).and_then(Value::as_bool).unwrap_or(false)
    }
    /// Whether this answer lets the flow go on (a claim or start it won).
    pub fn progressed(&self) -> bool {
        self.ok()
            && !["claimed", "started"]
                .iter()
                .any(|k| self.body.get(*k) == Some(&Value::Bool(false)))
    }

    pub fn str(&self, key: &str) -> &str {
        self.body.get(key).and_then(Value::as_str).unwrap_or("")
    }
}

#[derive(Clone)]
pub struct NifiClient {
    http: reqwest::Client,
    base: String,
    token: String,
    faults: Arc<Faults>,
    /// Retries after a 5xx or a transport error (NiFi: 5).
    pub retries: u32,
    pub retry_pause: Duration,
    /// Every attempt NiFi saw fail (5xx by status, "transport" for no answer), retried or not.
    pub failed_attempts: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>,
}

impl NifiClient {
    pub fn new(base: &str, token: &str, faults: Arc<Faults>) -> anyhow::Result<NifiClient> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .pool_idle_timeout(Duration::from_secs(4))
            .timeout(Duration::from_secs(30))
            .http1_only()
            .build()?;
        Ok(NifiClient {
            http,
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            faults,
            retries: 5,
            retry_pause: Duration::from_millis(500),
            failed_attempts: Default::default(),
        })
    }

    async fn send_once(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, String> {
        let url = format!("{}{path}", self.base);
        let mut req = match method {
            "GET" => self.http.get(&url),
            _ => self.http.post(&url),
        }
        .header("Authorization", format!("Bearer {}", self.token))
        .header("User-Agent", "")
        .header("X-Request-Id", uuid::Uuid::new_v4().to_string());
        if let Some(b) = body {
            req = req
                .header("Content-Type", "application/json")
                .body(serde_json::to_vec(b).expect("JSON"));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| format!("{method} {path}: reading: {e}"))?;
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok(Answer {
            status: status.as_u16(),
            body,
            retried: false,
        })
    }

    /// One NiFi call with its retries: a 5xx or a transport error is sent again with the same
    /// body, up to `retries` more times. Faults are drawn per call.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, String> {
        if method == "POST" && self.faults.draw(FaultKind::Duplicate) {
            // Duplicate delivery: two flowfiles make the same call at once. Each goes on with its
            // own answer; the one that lost (claimed/started false) stops, so the flow continues
            // as the winner.
            let (a, b) = tokio::join!(
                self.send_retrying(method, path, body),
                self.send_retrying(method, path, body)
            );
            return match (a, b) {
                (Ok(a), Ok(b)) if !a.progressed() && b.progressed() => Ok(b),
                (Ok(a), _) => Ok(a),
                (_, b) => b,
            };
        }
        // A lost answer is retried with the same body. validation/start is the one call whose
        // replay cannot tell the caller it won (CONTRACT §4.9 answers started=false), so a flow
        // that lost that answer stalls; the simulator does not inject it there (docs/nifi.md).
        if method == "POST"
            && !path.ends_with("/validation/start")
            && self.faults.draw(FaultKind::LostResponse)
        {
            // Lost response: the request is applied, its answer never arrives, NiFi retries.
            let _ = self.send_once(method, path, body).await;
        }
        self.send_retrying(method, path, body).await
    }

    async fn send_retrying(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, String> {
        let mut last = String::new();
        for attempt in 0..=self.retries {
            if attempt > 0 {
                tokio::time::sleep(self.retry_pause * attempt).await;
            }
            match self.send_once(method, path, body).await {
                Ok(a) if StatusCode::from_u16(a.status).is_ok_and(|s| s.is_server_error()) => {
                    self.failed(a.status.to_string());
                    last = format!("{method} {path}: {} {}", a.status, a.body);
                }
                Ok(a) => {
                    return Ok(Answer {
                        retried: attempt > 0,
                        ..a
                    });
                }
                Err(e) => {
                    self.failed("transport".into());
                    last = e
                }
            }
        }
        Err(format!("{last} (after {} retries)", self.retries))
    }

    fn failed(&self, what: String) {
        *self
            .failed_attempts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(what)
            .or_insert(0) += 1;
    }

    pub async fn post(&self, path: &str, body: Value) -> Result<Answer, String> {
        self.call("POST", path, Some(&body)).await
    }

    pub async fn get(&self, path: &str) -> Result<Answer, String> {
        self.call("GET", path, None).await
    }
}

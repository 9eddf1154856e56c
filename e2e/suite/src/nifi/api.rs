//! The HTTP side of NiFi's InvokeHTTP processors: pooled keep-alive connections, bearer token,
//! `Content-Type: application/json` without charset, no `Accept`, an empty `User-Agent`, retries of
//! a 5xx or a transport error up to five more times with the same body, on NiFi's schedule
//! ([`RetrySchedule`]) — and the faults the simulator injects: duplicate delivery and lost
//! responses.
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

/// When NiFi sends a failed call again. The flows retry InvokeHTTP's `Retry` (5xx) and `Failure`
/// (timeout, connection error) relationships five times with Back Off Mechanism "Penalize
/// FlowFile" and Max Back Off Period 1 min; the processors keep NiFi's default Penalty Duration,
/// 30 s. NiFi's framework then holds the FlowFile back before retry k (k = 1…5) for
/// min(max_backoff, penalty × 2^(k−1)): 30 s, 60 s, 60 s, 60 s, 60 s, 4.5 min in all
/// (nifi-framework-components, `StandardProcessSession.retry` and `calculateBackoffTime`, lines
/// 426–508 at rel/nifi-2.6.0; docs/nifi.md).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetrySchedule {
    /// Retries after the first attempt (the relationship's Number of Retry Attempts).
    pub count: u32,
    /// The processor's Penalty Duration: the wait before the first retry.
    pub penalty: Duration,
    /// Max Back Off Period: no wait is longer.
    pub max_backoff: Duration,
    /// Every wait is multiplied by this: 1 is NiFi's own time; the test suites shrink it to keep
    /// the schedule's shape while a run lasts seconds ([`RetrySchedule::TEST_SCALE`]).
    pub scale: f64,
}

impl RetrySchedule {
    /// The flows' settings on NiFi's clock.
    pub const NIFI: RetrySchedule = RetrySchedule {
        count: 5,
        penalty: Duration::from_secs(30),
        max_backoff: Duration::from_secs(60),
        scale: 1.0,
    };

    /// The suites' scale: NiFi's 270 s of waits become 7.5 s (0.83 s, then 1.67 s four times),
    /// the total the suites were tuned to (a restart or failover of a few seconds is ridden out
    /// by the retries; a longer outage reaches PG-90's resend).
    pub const TEST_SCALE: f64 = 1.0 / 36.0;

    /// The wait before retry `k` (1-based).
    pub fn delay(&self, k: u32) -> Duration {
        let doubled = self
            .penalty
            .saturating_mul(1u32 << k.saturating_sub(1).min(30));
        doubled.min(self.max_backoff).mul_f64(self.scale.max(0.0))
    }

    /// All the waits of a call that never gets an answer.
    pub fn total(&self) -> Duration {
        (1..=self.count).map(|k| self.delay(k)).sum()
    }
}

impl Default for RetrySchedule {
    fn default() -> Self {
        RetrySchedule::NIFI
    }
}

/// Where the bearer token comes from: a fixed value, or a file read again before every call (as
/// when NiFi's token parameter is changed under a running flow: the next call carries the new
/// value; the token-rotation test switches NiFi to a new token this way).
#[derive(Clone)]
pub enum Bearer {
    Fixed(String),
    File(std::path::PathBuf),
}

impl Bearer {
    fn current(&self) -> Result<String, String> {
        match self {
            Bearer::Fixed(token) => Ok(token.clone()),
            Bearer::File(path) => std::fs::read_to_string(path)
                .map(|t| t.trim().to_string())
                .map_err(|e| format!("token file {}: {e}", path.display())),
        }
    }
}

#[derive(Clone)]
pub struct NifiClient {
    http: reqwest::Client,
    base: String,
    bearer: Bearer,
    faults: Arc<Faults>,
    /// Retries after a 5xx or a transport error, and the waits before them.
    pub retry: RetrySchedule,
    /// Every attempt NiFi saw fail (5xx by status, "transport" for no answer), retried or not.
    pub failed_attempts: Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>,
    /// The longest single attempt (send to answer or error) and its call: how long a NiFi
    /// thread waited on load-control at worst.
    pub slowest_attempt: Arc<std::sync::Mutex<SlowestAttempt>>,
}

/// The longest single attempt a client made.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SlowestAttempt {
    pub seconds: f64,
    /// `METHOD /path → status` (or the transport error).
    pub call: String,
}

impl NifiClient {
    pub fn new(base: &str, token: &str, faults: Arc<Faults>) -> anyhow::Result<NifiClient> {
        Self::with(base, Bearer::Fixed(token.to_string()), None, None, faults)
    }

    /// `ca_pem`: the only CA trusted for an `https` API (InvokeHTTP's SSL Context Service with
    /// a truststore of that CA). `address`: where the API URL's host name is reached (as DNS
    /// would answer; the certificate is checked against the name).
    pub fn with(
        base: &str,
        bearer: Bearer,
        ca_pem: Option<&[u8]>,
        address: Option<std::net::SocketAddr>,
        faults: Arc<Faults>,
    ) -> anyhow::Result<NifiClient> {
        let mut http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .pool_idle_timeout(Duration::from_secs(4))
            .timeout(Duration::from_secs(30))
            .http1_only();
        if let Some(pem) = ca_pem {
            http = http.tls_certs_only(reqwest::Certificate::from_pem_bundle(pem)?);
        }
        if let Some(addr) = address {
            let host = reqwest::Url::parse(base)?
                .host_str()
                .ok_or_else(|| anyhow::anyhow!("{base} has no host"))?
                .to_string();
            http = http.resolve(&host, addr);
        }
        Ok(NifiClient {
            http: http.build()?,
            base: base.trim_end_matches('/').to_string(),
            bearer,
            faults,
            retry: RetrySchedule::NIFI,
            failed_attempts: Default::default(),
            slowest_attempt: Default::default(),
        })
    }

    async fn send_once(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, String> {
        let started = std::time::Instant::now();
        let answer = self.send_once_untimed(method, path, body).await;
        let seconds = started.elapsed().as_secs_f64();
        let mut slowest = self
            .slowest_attempt
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if seconds > slowest.seconds {
            let outcome = match &answer {
                Ok(a) => a.status.to_string(),
                Err(e) => e.clone(),
            };
            *slowest = SlowestAttempt {
                seconds,
                call: format!("{method} {path} → {outcome}"),
            };
        }
        answer
    }

    async fn send_once_untimed(
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
        .header(
            "Authorization",
            format!("Bearer {}", self.bearer.current()?),
        )
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
                self.send_retrying(method, path, body, 0),
                self.send_retrying(method, path, body, 0)
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
            // Lost response: the request is applied, its answer never arrives (a timeout to
            // NiFi), and NiFi retries it after the first back-off.
            let _ = self.send_once(method, path, body).await;
            return self.send_retrying(method, path, body, 1).await;
        }
        self.send_retrying(method, path, body, 0).await
    }

    /// Attempts `first..=retry.count` of a call (attempt 0 is the first send; attempt k waits
    /// `retry.delay(k)` before it).
    async fn send_retrying(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        first: u32,
    ) -> Result<Answer, String> {
        let mut last = String::new();
        for attempt in first..=self.retry.count {
            if attempt > 0 {
                tokio::time::sleep(self.retry.delay(attempt)).await;
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
        Err(format!("{last} (after {} retries)", self.retry.count))
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

#[cfg(test)]
mod tests {
    use super::RetrySchedule;
    use std::time::Duration;

    /// NiFi 2.6.0's `calculateBackoffTime(retryCount, maxBackoff, penalty)` =
    /// min(maxBackoff, 2^retryCount × penalty), retryCount being the retries already made.
    #[test]
    fn the_schedule_is_nifis() {
        let s = RetrySchedule::NIFI;
        let waits: Vec<u64> = (1..=s.count).map(|k| s.delay(k).as_secs()).collect();
        assert_eq!(waits, [30, 60, 60, 60, 60]);
        assert_eq!(s.total(), Duration::from_secs(270));
        let short_penalty = RetrySchedule {
            penalty: Duration::from_secs(5),
            ..s
        };
        let waits: Vec<u64> = (1..=5).map(|k| short_penalty.delay(k).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60]);
        let scaled = RetrySchedule {
            scale: RetrySchedule::TEST_SCALE,
            ..s
        };
        assert!((scaled.total().as_secs_f64() - 7.5).abs() < 0.01);
        assert!((scaled.delay(1).as_secs_f64() - 30.0 / 36.0).abs() < 0.001);
    }
}

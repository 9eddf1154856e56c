//! The benchmark's HTTP client: NiFi's headers, pooled keep-alive connections, and the latency of
//! every request recorded by kind. Any answer but 200 is an error: the workloads only make calls
//! that must succeed.
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Latencies (ms) by request kind, and counts.
#[derive(Default)]
pub struct Stats {
    latency_ms: Mutex<BTreeMap<&'static str, Vec<f64>>>,
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    first_errors: Mutex<Vec<String>>,
}

impl Stats {
    fn record(&self, kind: &'static str, ms: f64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.latency_ms
            .lock()
            .unwrap()
            .entry(kind)
            .or_default()
            .push(ms);
    }

    fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_errors.lock().unwrap();
        if first.len() < 5 {
            eprintln!("load-bench: {what}");
            first.push(what);
        }
    }

    pub fn count(&self, kind: &str) -> usize {
        self.latency_ms
            .lock()
            .unwrap()
            .get(kind)
            .map_or(0, Vec::len)
    }

    pub fn samples(&self, kind: &str) -> Vec<f64> {
        self.latency_ms
            .lock()
            .unwrap()
            .get(kind)
            .cloned()
            .unwrap_or_default()
    }

    /// `{kind: {n, p50, p95, p99, max}}` in milliseconds.
    pub fn summary(&self) -> Value {
        let map = self.latency_ms.lock().unwrap();
        Value::Object(
            map.iter()
                .map(|(k, v)| (k.to_string(), percentiles(v)))
                .collect(),
        )
    }

    pub fn first_errors(&self) -> Vec<String> {
        self.first_errors.lock().unwrap().clone()
    }
}

/// The nearest-rank percentile `p` (0–100) of `sorted`.
fn rank(sorted: &[f64], p: f64) -> f64 {
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `{n, p50, p95, p99, max}` of samples (ms); `{n: 0}` when there are none.
pub fn percentiles(samples: &[f64]) -> Value {
    if samples.is_empty() {
        return json!({"n": 0});
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    json!({"n": s.len(), "p50": round2(rank(&s, 50.0)), "p95": round2(rank(&s, 95.0)),
           "p99": round2(rank(&s, 99.0)), "max": round2(*s.last().unwrap())})
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    nifi_token: String,
    operator_token: String,
    pub stats: Arc<Stats>,
}

impl Client {
    pub fn new(base: &str, nifi_token: &str, operator_token: &str) -> anyhow::Result<Client> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .http1_only()
            .timeout(std::time::Duration::from_secs(60))
            .build()?;
        Ok(Client {
            http,
            base: base.to_string(),
            nifi_token: nifi_token.to_string(),
            operator_token: operator_token.to_string(),
            stats: Arc::default(),
        })
    }

    /// `http://127.0.0.1:<port>` of the api-server.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Another api-server replica (`http://127.0.0.1:<port>`), counted in the same `Stats`: the
    /// workers of one scenario spread over the replicas as NiFi's nodes do behind a Service.
    pub fn with_base(&self, base: &str) -> Client {
        Client {
            base: base.to_string(),
            ..self.clone()
        }
    }

    /// The same clients (one per replica), counted afresh in one new `Stats`: one per
    /// measurement, so that no figure adds up an earlier one's requests.
    pub fn counted_afresh(clients: &[Client]) -> Vec<Client> {
        let stats: Arc<Stats> = Arc::default();
        clients
            .iter()
            .map(|c| Client {
                stats: stats.clone(),
                ..c.clone()
            })
            .collect()
    }

    /// The same connections, counted afresh (one `Stats` per scenario).
    pub fn fresh(&self) -> Client {
        Client {
            stats: Arc::default(),
            ..self.clone()
        }
    }

    async fn send(
        &self,
        kind: &'static str,
        token: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let started = Instant::now();
        let url = format!("{}{path}", self.base);
        let request = match body {
            Some(body) => self
                .http
                .post(url)
                .header("Content-Type", "application/json")
                .body(serde_json::to_vec(body)?),
            None => self.http.get(url),
        };
        let sent = request
            .header("Authorization", format!("Bearer {token}"))
            .send()
            .await;
        let answer = match sent {
            Ok(r) => {
                let status = r.status().as_u16();
                r.bytes().await.map(|b| (status, b))
            }
            Err(e) => Err(e),
        };
        let (status, bytes) = match answer {
            Ok(a) => a,
            Err(e) => {
                self.stats.error(format!("{kind} {path}: {e}"));
                anyhow::bail!("{kind}: {e}");
            }
        };
        self.stats
            .record(kind, started.elapsed().as_secs_f64() * 1000.0);
        if status != 200 {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            self.stats.error(format!("{kind} {path}: {status} {text}"));
            anyhow::bail!("{kind}: {status} {text}");
        }
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// A NiFi call (role `nifi`).
    pub async fn post(&self, kind: &'static str, path: &str, body: Value) -> anyhow::Result<Value> {
        self.send(kind, &self.nifi_token, path, Some(&body)).await
    }

    /// An operator call (role `operator`): cancel, resolve, resend.
    pub async fn post_operator(
        &self,
        kind: &'static str,
        path: &str,
        body: Value,
    ) -> anyhow::Result<Value> {
        self.send(kind, &self.operator_token, path, Some(&body))
            .await
    }

    /// A GET with the operator's token (listings, the monitor, cleanup candidates).
    pub async fn get_operator(&self, kind: &'static str, path: &str) -> anyhow::Result<Value> {
        self.send(kind, &self.operator_token, path, None).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = percentiles(&v);
        assert_eq!(p["n"], 100);
        assert_eq!(p["p50"], 50.0);
        assert_eq!(p["p95"], 95.0);
        assert_eq!(p["p99"], 99.0);
        assert_eq!(p["max"], 100.0);
        assert_eq!(percentiles(&[7.0])["p99"], 7.0);
        assert_eq!(percentiles(&[])["n"], 0);
    }
}

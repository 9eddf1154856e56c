//! Hostile and broken HTTP clients, for the slow-clients test (api-server) and the `slow_clients`
//! benchmark line (load-bench): connections that stay silent, trickle a request head, or trickle
//! a body with a valid token, and a NiFi-like client that keeps creating runs beside them.
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What happened to one hostile connection: when the server closed it, and the status line it
/// got first, if any.
#[derive(Debug)]
pub struct Closed {
    pub after: Duration,
    pub status: Option<u16>,
}

/// Sends `text` one byte every 300 ms after `upfront` bytes at once, reading all the while, until
/// the server closes the connection (or 30 s pass: a panic).
async fn trickle(kind: &'static str, port: u16, text: Vec<u8>, upfront: usize) -> Closed {
    let start = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut r, mut w) = s.split();
    let writer = async {
        if upfront > 0 && w.write_all(&text[..upfront]).await.is_err() {
            return;
        }
        for b in &text[upfront..] {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if w.write_all(&[*b]).await.is_err() {
                return;
            }
        }
        std::future::pending::<()>().await
    };
    let reader = async {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    let got = tokio::select! {
        got = reader => got,
        _ = writer => Vec::new(),
        _ = tokio::time::sleep(Duration::from_secs(30)) => panic!("a hostile connection ({kind}) was still open after 30 s"),
    };
    let status = String::from_utf8_lossy(&got)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok());
    Closed {
        after: start.elapsed(),
        status,
    }
}

/// Opens `each` connections of every kind (`silent`, `head`, `body`) against 127.0.0.1:`port` and
/// waits until the server has closed them all. `token` authenticates the body tricklers.
pub async fn storm(port: u16, each: usize, token: &str) -> BTreeMap<&'static str, Vec<Closed>> {
    let head = b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n".to_vec();
    let body_head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"
    );
    let mut body_req = body_head.clone().into_bytes();
    body_req.extend(std::iter::repeat_n(b' ', 200));
    let mut tasks = vec![];
    for _ in 0..each {
        // In waves: the kernel's accept backlog (net.core.somaxconn, 128 here) would otherwise
        // overflow, and a silent client whose handshake the kernel dropped is not the server's.
        tokio::time::sleep(Duration::from_millis(10)).await;
        tasks.push(("silent", tokio::spawn(trickle("silent", port, vec![], 0))));
        tasks.push(("head", tokio::spawn(trickle("head", port, head.clone(), 1))));
        tasks.push((
            "body",
            tokio::spawn(trickle("body", port, body_req.clone(), body_head.len())),
        ));
    }
    let mut closed: BTreeMap<&str, Vec<Closed>> = BTreeMap::new();
    for (kind, t) in tasks {
        closed.entry(kind).or_default().push(t.await.unwrap());
    }
    closed
}

/// The longest a connection of `kind` stayed open, in seconds.
pub fn worst(closed: &BTreeMap<&str, Vec<Closed>>, kind: &str) -> f64 {
    closed[kind]
        .iter()
        .map(|c| c.after.as_secs_f64())
        .fold(0.0, f64::max)
}

/// The figures of a storm and of the NiFi-like client beside it, as one JSON object.
pub fn figures(closed: &BTreeMap<&str, Vec<Closed>>, nifi: &NifiLike) -> Value {
    let statuses = |kind: &str| {
        let mut m: BTreeMap<String, usize> = BTreeMap::new();
        for c in &closed[kind] {
            *m.entry(c.status.map_or("none".into(), |s| s.to_string()))
                .or_default() += 1;
        }
        m
    };
    let mut sorted = nifi.latencies.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        sorted
            .get(((sorted.len().max(1) - 1) as f64 * p) as usize)
            .copied()
    };
    json!({"each": closed.get("silent").map_or(0, Vec::len),
        "silent_closed_max_s": worst(closed, "silent"), "head_closed_max_s": worst(closed, "head"),
        "body_closed_max_s": worst(closed, "body"), "body_statuses": statuses("body"),
        "head_statuses": statuses("head"), "nifi_requests": nifi.latencies.len(),
        "nifi_failures": nifi.failures, "nifi_p50_s": pct(0.5), "nifi_p99_s": pct(0.99),
        "nifi_max_s": pct(1.0)})
}

/// What the NiFi-like client saw: each call's latency (its retries included) and the final
/// statuses that were not 200.
#[derive(Debug, Default)]
pub struct NifiLike {
    pub latencies: Vec<f64>,
    pub failures: Vec<u16>,
}

/// A NiFi-like client: creates a run every 100 ms on its own pooled connections until `stop` (at
/// most 600 calls), retrying a 503 or a timeout as NiFi does (five times, 0.5 s × attempt apart).
pub async fn nifi_like(base: String, token: String, stop: Arc<AtomicBool>) -> NifiLike {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut seen = NifiLike::default();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    for n in 0..600 {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let t = Instant::now();
        let mut status = 0;
        for attempt in 0..6u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(500) * attempt).await;
            }
            status = match http
                .post(format!("{base}/v1/runs"))
                .bearer_auth(&token)
                .json(
                    &json!({"jobKey": "SLOW", "businessKey": format!("n-{tag}-{n}"),
                    "hdfsRoot": "/data", "stageTablePrefix": "t_"}),
                )
                .send()
                .await
            {
                Ok(r) => r.status().as_u16(),
                Err(_) => 0,
            };
            if status != 503 && status != 0 {
                break;
            }
        }
        seen.latencies.push(t.elapsed().as_secs_f64());
        if status != 200 {
            seen.failures.push(status);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

//! PG-05, NiFi's control receiver, as strict as the real one (CONTRACT §12): POST only, the path
//! exactly `/validate/<jobKey>` or `/reissue/<jobKey>` with no trailing slash (`prefix` is empty
//! for NiFi itself; a non-empty one plays a proxy in front of it that strips the prefix),
//! headers named exactly `X-Run-Id` and `X-Dispatch-Id` carrying 36-character UUIDs, HTTP/1.1, and
//! a JSON body carrying `runId`. It reads the raw request bytes, because an HTTP library would
//! fold header names to lower case and hide exactly what NiFi is strict about.
use serde_json::Value;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use uuid::Uuid;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DispatchKind {
    Validate,
    Reissue,
}

/// A dispatch PG-05 accepted.
#[derive(Clone, Debug)]
pub struct Dispatch {
    pub kind: DispatchKind,
    pub job_key: String,
    pub run_id: Uuid,
    pub dispatch_id: Uuid,
    pub body: Value,
    /// When PG-05 accepted it (wall clock, comparable with PostgreSQL's `clock_timestamp()`).
    pub received_at: std::time::SystemTime,
}

/// How the receiver behaves (the "slow or refusing PG-05" faults).
#[derive(Clone, Debug, Default)]
pub struct Behaviour {
    /// Delay before answering each accepted dispatch.
    pub delay: Duration,
    /// Answer the first N well-formed dispatches with this status instead of 202.
    pub refuse_first: usize,
    pub refuse_status: u16,
}

#[derive(Default, Debug, Clone, serde::Serialize)]
pub struct ReceiverStats {
    pub accepted: u64,
    pub refused_on_purpose: u64,
    /// Requests NiFi would not have accepted, with the reason (a product defect if non-empty).
    pub rejected: Vec<String>,
    /// The raw header lines of the first accepted request, for wire-level tests.
    pub first_request_head: Option<String>,
}

pub struct Receiver {
    pub addr: std::net::SocketAddr,
    pub stats: Arc<Mutex<ReceiverStats>>,
}

/// Why a request head would be refused by PG-05, or the dispatch it carries.
pub fn judge(
    prefix: &str,
    head: &httparse::Request,
    raw_headers: &[(String, String)],
    body: &[u8],
) -> Result<Dispatch, String> {
    if head.version != Some(1) {
        return Err(format!(
            "HTTP/1.{} instead of HTTP/1.1",
            head.version.unwrap_or(0)
        ));
    }
    let method = head.method.unwrap_or("");
    if method != "POST" {
        return Err(format!("method {method}, PG-05 takes POST only"));
    }
    let path = head.path.unwrap_or("");
    let rest = path
        .strip_prefix(prefix)
        .ok_or_else(|| format!("path {path} is not under {prefix}"))?;
    let (kind, job_key) = if let Some(j) = rest.strip_prefix("/validate/") {
        (DispatchKind::Validate, j)
    } else if let Some(j) = rest.strip_prefix("/reissue/") {
        (DispatchKind::Reissue, j)
    } else {
        return Err(format!(
            "path {path}: expected {prefix}/validate/<jobKey> or {prefix}/reissue/<jobKey>"
        ));
    };
    if job_key.is_empty() || job_key.contains('/') || job_key.contains('?') {
        return Err(format!(
            "path {path}: bad jobKey segment (trailing slash or query?)"
        ));
    }
    let exact = |name: &str| -> Result<Uuid, String> {
        match raw_headers.iter().find(|(n, _)| n == name) {
            Some((_, v)) if v.len() == 36 => {
                Uuid::parse_str(v).map_err(|_| format!("header {name}: {v:?} is not a UUID"))
            }
            Some((_, v)) => Err(format!("header {name}: {v:?} is not a 36-character UUID")),
            None => {
                let near = raw_headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(n, _)| format!(" (received as {n:?})"))
                    .unwrap_or_default();
                Err(format!("header {name} missing{near}"))
            }
        }
    };
    let run_id = exact("X-Run-Id")?;
    let dispatch_id = exact("X-Dispatch-Id")?;
    let body: Value = serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let body_run = body.get("runId").and_then(Value::as_str).unwrap_or("");
    if body_run != run_id.to_string() {
        return Err(format!(
            "body runId {body_run:?} differs from X-Run-Id {run_id}"
        ));
    }
    Ok(Dispatch {
        kind,
        job_key: job_key.to_string(),
        run_id,
        dispatch_id,
        body,
        received_at: std::time::SystemTime::now(),
    })
}

impl Receiver {
    /// Listens on `addr` (port 0 for any); accepted dispatches go to `tx`.
    pub async fn start(
        addr: &str,
        prefix: &str,
        behaviour: Behaviour,
        tx: mpsc::UnboundedSender<Dispatch>,
    ) -> anyhow::Result<Receiver> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(Mutex::new(ReceiverStats::default()));
        let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (prefix, st) = (prefix.trim_end_matches('/').to_string(), stats.clone());
        tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let (prefix, st, tx, b, refused) = (
                    prefix.clone(),
                    st.clone(),
                    tx.clone(),
                    behaviour.clone(),
                    refused.clone(),
                );
                tokio::spawn(async move {
                    let _ = serve(conn, &prefix, &st, &tx, &b, &refused).await;
                });
            }
        });
        Ok(Receiver { addr, stats })
    }
}

async fn serve(
    mut conn: TcpStream,
    prefix: &str,
    stats: &Mutex<ReceiverStats>,
    tx: &mpsc::UnboundedSender<Dispatch>,
    behaviour: &Behaviour,
    refused: &std::sync::atomic::AtomicUsize,
) -> anyhow::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    loop {
        // Read one request head (keep-alive: several requests per connection).
        let (head_len, raw_headers, method, path, version, content_length) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            if let httparse::Status::Complete(n) = req.parse(&buf)? {
                let raw: Vec<(String, String)> = req
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_string(),
                            String::from_utf8_lossy(h.value).to_string(),
                        )
                    })
                    .collect();
                let cl = raw
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                break (
                    n,
                    raw,
                    req.method.map(str::to_string),
                    req.path.map(str::to_string),
                    req.version,
                    cl,
                );
            }
            let mut chunk = [0u8; 4096];
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        while buf.len() < head_len + content_length {
            let mut chunk = [0u8; 4096];
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let body = buf[head_len..head_len + content_length].to_vec();
        let head_text = String::from_utf8_lossy(&buf[..head_len]).to_string();
        buf.drain(..head_len + content_length);
        let mut headers = [httparse::EMPTY_HEADER; 0];
        let mut req = httparse::Request::new(&mut headers);
        req.method = method.as_deref();
        req.path = path.as_deref();
        req.version = version;
        let (status, reply) = match judge(prefix, &req, &raw_headers, &body) {
            Ok(d) => {
                if refused.load(std::sync::atomic::Ordering::SeqCst) < behaviour.refuse_first {
                    refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    stats.lock().unwrap().refused_on_purpose += 1;
                    (
                        behaviour.refuse_status,
                        serde_json::json!({"refused": true}),
                    )
                } else {
                    if !behaviour.delay.is_zero() {
                        tokio::time::sleep(behaviour.delay).await;
                    }
                    {
                        let mut s = stats.lock().unwrap();
                        s.accepted += 1;
                        s.first_request_head.get_or_insert(head_text);
                    }
                    let echo = serde_json::json!({"received": path, "runId": d.run_id, "dispatchId": d.dispatch_id});
                    let _ = tx.send(d);
                    (202, echo)
                }
            }
            Err(reason) => {
                stats.lock().unwrap().rejected.push(reason.clone());
                (400, serde_json::json!({"error": reason}))
            }
        };
        let body = reply.to_string();
        let text = match status {
            202 => "Accepted",
            400 => "Bad Request",
            _ => "Refused",
        };
        let response = format!(
            "HTTP/1.1 {status} {text}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(response.as_bytes()).await?;
    }
}

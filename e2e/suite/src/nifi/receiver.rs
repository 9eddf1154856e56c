//! PG-05, NiFi's control receiver, as strict as the real one (CONTRACT §12): POST only, the path
//! exactly `/validate/<jobKey>` or `/reissue/<jobKey>` with no trailing slash (`prefix` is empty
//! for NiFi itself; a non-empty one plays a proxy in front of it that strips the prefix),
//! headers named exactly `X-Run-Id` and `X-Dispatch-Id` carrying 36-character UUIDs, HTTP/1.1, and
//! a JSON body carrying `runId`. It reads the raw request bytes, because an HTTP library would
//! fold header names to lower case and hide exactly what NiFi is strict about.
//!
//! With signing keys ([`SigningKeys`]) it checks every dispatch's signature as docs/nifi.md tells
//! PG-05 to (CONTRACT §6.4, key rotation): the key named by `X-Lca-Key-Id` (every key it holds
//! when the header is absent, a sender still on `signing_secret`), the HMAC compared in constant
//! time, the timestamp within 300 s. An unknown key id is answered 503 (the receiver has not been
//! given the new key yet: the dispatch is retried), any other failure 401 (DEAD at once).
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use std::sync::Arc;
use std::sync::{Mutex, RwLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
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
    /// The `X-Lca-Key-Id` it was signed with (None: unsigned, or signed without a key id).
    pub key_id: Option<String>,
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
    /// The keys signatures are checked with; none: signatures are not checked.
    pub signing_keys: SigningKeys,
    /// HTTPS, with the client certificate this configuration requires (HandleHttpRequest with an
    /// SSL Context Service and Client Authentication REQUIRED); none: plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// The name the receiver's statistics give a client certificate: the first 16 hex digits of
/// the SHA-256 of its DER (a test computes it from the certificate it made).
pub fn certificate_id(der: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(der))[..16].to_string()
}

/// The `{id, secret}` keys PG-05 holds (§6.4), shared: a test changes them while the receiver
/// runs, as a rotation does. Debug shows the ids only.
#[derive(Clone, Default)]
pub struct SigningKeys(Arc<RwLock<Vec<(String, String)>>>);

impl std::fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.ids()).finish()
    }
}

impl SigningKeys {
    pub fn new(keys: &[(&str, &str)]) -> SigningKeys {
        let k = SigningKeys::default();
        k.set(keys);
        k
    }

    /// Replaces the keys held (a step of a rotation).
    pub fn set(&self, keys: &[(&str, &str)]) {
        *self.0.write().unwrap() = keys
            .iter()
            .map(|(id, secret)| (id.to_string(), secret.to_string()))
            .collect();
    }

    pub fn ids(&self) -> Vec<String> {
        self.0
            .read()
            .unwrap()
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Parses `ID=SECRET` (nifi-sim's `--pg05-signing-key`).
    pub fn parse_entry(entry: &str) -> Result<(String, String), String> {
        match entry.split_once('=') {
            Some((id, secret)) if !id.is_empty() && !secret.is_empty() => {
                Ok((id.to_string(), secret.to_string()))
            }
            _ => Err("expected ID=SECRET".into()),
        }
    }

    pub fn from_entries(entries: Vec<(String, String)>) -> SigningKeys {
        SigningKeys(Arc::new(RwLock::new(entries)))
    }

    /// Checks a dispatch's signature headers against the keys held: `Ok(key id)` when there is
    /// nothing to check or the signature is good, else the status to answer and why.
    pub fn check(
        &self,
        raw_headers: &[(String, String)],
        body: &[u8],
        now_unix: u64,
    ) -> Result<Option<String>, (u16, String)> {
        let keys = self.0.read().unwrap().clone();
        if keys.is_empty() {
            return Ok(None);
        }
        let header = |name: &str| -> Result<Option<&str>, (u16, String)> {
            match raw_headers.iter().find(|(n, _)| n == name) {
                Some((_, v)) => Ok(Some(v.as_str())),
                None => match raw_headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                {
                    // The flow reads `${http.headers.<name>}`, and NiFi keeps the case received.
                    Some((n, _)) => Err((401, format!("header {name} received as {n:?}"))),
                    None => Ok(None),
                },
            }
        };
        let refuse = |why: String| Err((401, why));
        let Some(ts) = header("X-Lca-Timestamp")? else {
            return refuse("X-Lca-Timestamp missing: the dispatch is not signed".into());
        };
        let Some(sig) = header("X-Lca-Signature")? else {
            return refuse("X-Lca-Signature missing: the dispatch is not signed".into());
        };
        let Ok(ts_secs) = ts.parse::<u64>() else {
            return refuse(format!("X-Lca-Timestamp {ts:?} is not unix seconds"));
        };
        if ts_secs.abs_diff(now_unix) > 300 {
            return refuse(format!(
                "X-Lca-Timestamp {ts_secs} is more than 300 s from the receiver's clock ({now_unix})"
            ));
        }
        let candidates: Vec<&(String, String)> = match header("X-Lca-Key-Id")? {
            Some(id) => match keys.iter().find(|(k, _)| k == id) {
                Some(k) => vec![k],
                None => {
                    return Err((
                        503,
                        format!(
                            "unknown key id {id:?}: this receiver holds {:?}",
                            self.ids()
                        ),
                    ));
                }
            },
            None => keys.iter().collect(),
        };
        let Ok(given) = hex::decode(sig) else {
            return refuse("X-Lca-Signature is not hex".into());
        };
        for (id, secret) in candidates {
            let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())
                .expect("HMAC takes any key length");
            mac.update(ts.as_bytes());
            mac.update(b".");
            mac.update(body);
            // `verify_slice` compares in constant time.
            if mac.verify_slice(&given).is_ok() {
                return Ok(header("X-Lca-Key-Id")?.map(|_| id.clone()));
            }
        }
        refuse("X-Lca-Signature does not match".into())
    }
}

#[derive(Default, Debug, Clone, serde::Serialize)]
pub struct ReceiverStats {
    pub accepted: u64,
    /// Accepted dispatches by the `X-LCA-Key-Id` they were signed with ("" when unchecked or
    /// sent without one): a key rotation shows here.
    pub accepted_by_key: std::collections::BTreeMap<String, u64>,
    /// Over HTTPS: connections by the client certificate presented ([`certificate_id`]), and
    /// handshakes refused (no certificate, or one the client CA did not sign), with the reason.
    pub client_certificates: std::collections::BTreeMap<String, u64>,
    pub handshakes_refused: Vec<String>,
    pub refused_on_purpose: u64,
    /// Dispatches refused for their signature (§6.4), with the reason: not a product defect when
    /// the receiver was meant not to hold the key.
    pub signature_refused: Vec<String>,
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
        key_id: None,
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
                    let Some(tls) = b.tls.clone() else {
                        let _ = serve(conn, &prefix, &st, &tx, &b, &refused).await;
                        return;
                    };
                    match tokio_rustls::TlsAcceptor::from(tls).accept(conn).await {
                        Ok(conn) => {
                            let id = conn
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map(|c| certificate_id(c))
                                .unwrap_or_default();
                            *st.lock()
                                .unwrap()
                                .client_certificates
                                .entry(id)
                                .or_default() += 1;
                            let _ = serve(conn, &prefix, &st, &tx, &b, &refused).await;
                        }
                        Err(e) => st.lock().unwrap().handshakes_refused.push(e.to_string()),
                    }
                });
            }
        });
        Ok(Receiver { addr, stats })
    }
}

async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut conn: S,
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
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let judged = judge(prefix, &req, &raw_headers, &body)
            .map(|d| (behaviour.signing_keys.check(&raw_headers, &body, now), d));
        let (status, reply) = match judged {
            Ok((Err((status, why)), _)) => {
                stats.lock().unwrap().signature_refused.push(why.clone());
                (status, serde_json::json!({"error": why}))
            }
            Ok((Ok(key_id), mut d)) => {
                d.key_id = key_id;
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
                        *s.accepted_by_key
                            .entry(d.key_id.clone().unwrap_or_default())
                            .or_default() += 1;
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
            401 => "Unauthorized",
            503 => "Service Unavailable",
            _ => "Refused",
        };
        let response = format!(
            "HTTP/1.1 {status} {text}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(response.as_bytes()).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, ts: &str, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("{ts}.").as_bytes());
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    }

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    /// PG-05's checks as docs/nifi.md states them: by key id, every key without one, 503 for an
    /// id it does not hold, 401 for anything else wrong.
    #[test]
    fn signatures_are_checked_by_key_id() {
        let keys = SigningKeys::new(&[("old", "old-secret"), ("new", "new-secret")]);
        let body = br#"{"runId":"x"}"#;
        let now = 1_800_000_000u64;
        let ts = now.to_string();
        let check = |h: &[(&str, &str)], at: u64| keys.check(&headers(h), body, at);
        let good = sign("new-secret", &ts, body);
        let signed = |id: &str, sig: &str| -> Vec<(String, String)> {
            headers(&[
                ("X-Lca-Key-Id", id),
                ("X-Lca-Timestamp", &ts),
                ("X-Lca-Signature", sig),
            ])
        };
        assert_eq!(
            keys.check(&signed("new", &good), body, now),
            Ok(Some("new".into()))
        );
        // No key id (signing_secret): any key held.
        assert_eq!(
            check(
                &[
                    ("X-Lca-Timestamp", &ts),
                    ("X-Lca-Signature", &sign("old-secret", &ts, body))
                ],
                now
            ),
            Ok(None)
        );
        let status = |r: Result<Option<String>, (u16, String)>| r.unwrap_err().0;
        assert_eq!(status(keys.check(&signed("newer", &good), body, now)), 503);
        assert_eq!(status(keys.check(&signed("old", &good), body, now)), 401);
        assert_eq!(
            status(keys.check(&signed("new", "zz"), body, now)),
            401,
            "not hex"
        );
        assert_eq!(
            status(keys.check(&signed("new", &good), body, now + 301)),
            401,
            "timestamp too old"
        );
        assert_eq!(
            status(keys.check(&signed("new", &good), b"{}", now)),
            401,
            "another body"
        );
        assert_eq!(status(check(&[("X-Lca-Key-Id", "new")], now)), 401);
        assert_eq!(
            status(check(
                &[
                    ("x-lca-timestamp", &ts),
                    ("X-Lca-Signature", &good),
                    ("X-Lca-Key-Id", "new")
                ],
                now
            )),
            401,
            "the flow reads the header by the name docs/nifi.md gives"
        );
        // No keys: nothing checked.
        assert_eq!(
            SigningKeys::default().check(&headers(&[]), body, now),
            Ok(None)
        );
        assert_eq!(format!("{keys:?}"), r#"["old", "new"]"#);
    }
}

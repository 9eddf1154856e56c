//! Slots NiFi can always get (issue 29 item 2), over real sockets against the real binary:
//!
//! * the connection cap (`server.max_connections`) held by unauthenticated clients (kept alive
//!   with `/healthz`, reconnecting when closed) does not keep a NiFi-like client out, on a fresh
//!   connection per call or on a kept-alive one;
//! * clients trickling their bodies hold no request permit (`server.limit_concurrency`): more
//!   tricklers than permits, and the NiFi-like client's calls are all served.
//!
//! The NiFi-like client here never retries: every call must be answered 200 on its first attempt.
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_load-control-api");
const TOKEN: &str = "nifi-slots-token";

struct Server(Child, std::path::PathBuf);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_file(&self.1);
    }
}

/// The binary on a free port of 127.0.0.1 with `server` (YAML flow mappings, without host and
/// port) added to its server section; returns it with its base URL and port once `/healthz`
/// answers.
async fn start(db_url: &str, server: &str) -> (Server, String, u16) {
    let port = testkit::free_port();
    let digest = load_control_api::auth::sha256_hex(TOKEN);
    let path = std::env::temp_dir().join(format!("slots-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(
        &path,
        format!(
            "server: {{host: 127.0.0.1, port: {port}, {server}}}\n\
             database: {{url: \"{db_url}\"}}\n\
             auth: {{tokens: [{{name: nifi, role: nifi, sha256: {digest}}}]}}\n\
             logging: {{level: WARNING}}\n"
        ),
    )
    .unwrap();
    let child = Command::new(BIN)
        .args(["--config", path.to_str().unwrap(), "serve"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child, path);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for _ in 0..200 {
        if client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return (server, base, port);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the api-server did not start");
}

/// The NiFi-like client's two ways of calling: a fresh connection per call, and one kept alive.
struct Nifi {
    fresh: reqwest::Client,
    pooled: reqwest::Client,
    base: String,
    tag: String,
}

impl Nifi {
    fn new(base: &str) -> Nifi {
        let build = |idle: usize| {
            reqwest::Client::builder()
                .pool_max_idle_per_host(idle)
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap()
        };
        Nifi {
            fresh: build(0),
            pooled: build(1),
            base: base.to_string(),
            tag: uuid::Uuid::new_v4().simple().to_string(),
        }
    }

    /// Call `n`: creates a run (fresh connection for even `n`, the kept-alive one for odd), no
    /// retry; the failure described, if it was not a 200.
    async fn call(&self, n: usize) -> Result<(), String> {
        let (http, how) = if n.is_multiple_of(2) {
            (&self.fresh, "fresh connection")
        } else {
            (&self.pooled, "kept-alive connection")
        };
        let body = serde_json::json!({"jobKey": "SLOTS", "businessKey": format!("s-{}-{n}", self.tag),
            "hdfsRoot": "/data", "stageTablePrefix": "t_"});
        match http
            .post(format!("{}/v1/runs", self.base))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
        {
            Ok(r) if r.status() == 200 => Ok(()),
            Ok(r) => Err(format!("call {n} ({how}): {}", r.status())),
            Err(e) => Err(format!("call {n} ({how}): {e:?}")),
        }
    }
}

/// One `GET /healthz` on `s`; true when answered 200 within 3 s (the whole response read).
async fn healthz(s: &mut TcpStream) -> bool {
    let exchange = async {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .ok()?;
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        for _ in 0..100 {
            let n = s.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some(end) = text.find("\r\n\r\n") {
                let length: usize = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                if got.len() >= end + 4 + length {
                    return Some(text.starts_with("HTTP/1.1 200"));
                }
            }
        }
        None
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(3), exchange).await,
        Ok(Some(true))
    )
}

/// What the hostile unauthenticated clients saw.
#[derive(Default)]
struct Hostile {
    /// Connections open now that have been answered at least once.
    held_now: AtomicUsize,
    /// The most such connections at one time.
    peak: AtomicUsize,
    /// `/healthz` answered 200.
    answered: AtomicU64,
    /// Connections the server closed (or refused) under a hostile client.
    closed: AtomicU64,
}

/// A hostile client that keeps a connection alive with `/healthz` every 300 ms and opens a new
/// one as soon as the server closes it; never authenticates. Stops at `stop`, after 60 s, or after
/// 2,000 connections.
async fn holder(port: u16, h: Arc<Hostile>, stop: Arc<AtomicBool>) {
    let until = Instant::now() + Duration::from_secs(60);
    for _ in 0..2_000 {
        if stop.load(Ordering::Acquire) || Instant::now() > until {
            return;
        }
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let mut held = false;
        for _ in 0..1_000 {
            if stop.load(Ordering::Acquire) {
                break;
            }
            if !healthz(&mut s).await {
                break;
            }
            h.answered.fetch_add(1, Ordering::Relaxed);
            if !held {
                held = true;
                let now = h.held_now.fetch_add(1, Ordering::AcqRel) + 1;
                h.peak.fetch_max(now, Ordering::AcqRel);
            }
            // 300 ms, or less when the server closes the connection meanwhile.
            let mut b = [0u8; 1];
            if tokio::time::timeout(Duration::from_millis(300), s.read(&mut b))
                .await
                .is_ok()
            {
                break;
            }
        }
        if held {
            h.held_now.fetch_sub(1, Ordering::AcqRel);
        }
        if !stop.load(Ordering::Acquire) {
            h.closed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A hostile client that reconnects in a loop: connect, `/healthz`, close, every 20 ms (at most
/// 3,000 times, 60 s).
async fn churner(port: u16, h: Arc<Hostile>, stop: Arc<AtomicBool>) {
    let until = Instant::now() + Duration::from_secs(60);
    for _ in 0..3_000 {
        if stop.load(Ordering::Acquire) || Instant::now() > until {
            return;
        }
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await
            && healthz(&mut s).await
        {
            h.answered.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A counter of the server's `/metrics` (0 when absent).
async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name || k == format!("{name}_total")).then(|| v.parse().ok())?
        })
        .unwrap_or(0.0)
}

const CAP: usize = 16;

/// `server.max_connections` reached by unauthenticated clients that keep their connections alive
/// with `/healthz` and reconnect when closed: a NiFi-like client still gets every call through,
/// on fresh connections and on its kept-alive one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unauthenticated_clients_at_the_connection_cap_do_not_keep_nifi_out() {
    let db = testkit::TestDb::fresh().await;
    let (_server, base, port) = start(
        &db.url,
        &format!(
            "max_connections: {CAP}, timeout_keep_alive: 2, header_read_timeout: 3, \
             body_read_timeout: 4"
        ),
    )
    .await;
    let h = Arc::new(Hostile::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = vec![];
    for _ in 0..CAP {
        tasks.push(tokio::spawn(holder(port, h.clone(), stop.clone())));
    }
    // The cap is reached by the hostile clients alone: CAP connections, each answered, open at once.
    let deadline = Instant::now() + Duration::from_secs(15);
    while h.held_now.load(Ordering::Acquire) < CAP {
        assert!(
            Instant::now() < deadline,
            "the hostile clients never held {CAP} connections at once (peak {})",
            h.peak.load(Ordering::Acquire)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let peak_before = h.peak.load(Ordering::Acquire);
    tasks.push(tokio::spawn(churner(port, h.clone(), stop.clone())));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let nifi = Nifi::new(&base);
    let answered_before = h.answered.load(Ordering::Acquire);
    let mut failures = vec![];
    // Hostile connections held (answered and still open) just before each NiFi-like call.
    let mut held = vec![];
    const CALLS: usize = 40;
    let t = Instant::now();
    for n in 0..CALLS {
        held.push(h.held_now.load(Ordering::Acquire));
        if let Err(e) = nifi.call(n).await {
            failures.push(e);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let nifi_s = t.elapsed().as_secs_f64();
    let answered_during = h.answered.load(Ordering::Acquire) - answered_before;
    stop.store(true, Ordering::Release);
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("a hostile client stops within 10 s")
            .unwrap();
    }
    drop(nifi);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let shed = metric(&base, "lca_http_connections_shed").await;
    let closed = h.closed.load(Ordering::Acquire);
    held.sort_unstable();
    let report = format!(
        "failures {failures:?}; hostile peak before NiFi {peak_before}, held before each call \
         (sorted) {held:?}, /healthz answered during NiFi's calls {answered_during}, hostile \
         connections closed by the server {closed}, shed {shed}; NiFi's {CALLS} calls took {nifi_s:.1} s"
    );
    println!("{report}");
    assert_eq!(peak_before, CAP, "{report}");
    // The hostile clients were at it throughout: before most calls they held nearly every slot
    // NiFi did not (CAP - 1 beside NiFi's kept-alive connection; measured: 14 or 15, a client
    // whose connection was closed is between connections for a moment), and they were answered
    // all along.
    assert!(held[CALLS / 2] >= CAP - 4, "{report}");
    assert!(answered_during >= 2 * CAP as u64, "{report}");
    // Every NiFi-like call made its way in: hostile connections were closed for it.
    assert!(failures.is_empty(), "{report}");
    assert!(shed >= (CALLS / 2) as f64, "{report}");
}

/// A trickled body, `POST /v1/runs` with a valid token and `Content-Length: 200`: the head and one
/// body byte at once, then one byte every 300 ms. Returns when the server closes the connection
/// (at most 30 s): after how long and the status it answered.
async fn trickle_body(
    port: u16,
    started: Arc<AtomicUsize>,
    trickling: Arc<AtomicUsize>,
) -> (Duration, Option<u16>) {
    let start = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 200\r\n\r\n "
    );
    let (mut r, mut w) = s.split();
    w.write_all(head.as_bytes()).await.unwrap();
    trickling.fetch_add(1, Ordering::AcqRel);
    started.fetch_add(1, Ordering::AcqRel);
    let writer = async {
        for _ in 1..200 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            if w.write_all(b" ").await.is_err() {
                break;
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
        _ = tokio::time::sleep(Duration::from_secs(30)) => panic!("a body trickler was still open after 30 s"),
    };
    trickling.fetch_sub(1, Ordering::AcqRel);
    let status = String::from_utf8_lossy(&got)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok());
    (start.elapsed(), status)
}

/// `limit_concurrency: 4` and 12 clients trickling their bodies: the tricklers hold no request
/// permit while their bodies arrive, so a NiFi-like client beside them gets every call through;
/// the tricklers are answered 408 at `body_read_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn body_tricklers_hold_no_request_permit() {
    const PERMITS: usize = 4;
    const TRICKLERS: usize = 12;
    const BODY_TIMEOUT: f64 = 6.0;
    let db = testkit::TestDb::fresh().await;
    let (_server, base, port) = start(
        &db.url,
        &format!(
            "limit_concurrency: {PERMITS}, timeout_keep_alive: 2, header_read_timeout: 3, \
             body_read_timeout: {BODY_TIMEOUT}"
        ),
    )
    .await;
    let (started, trickling) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let tricklers: Vec<_> = (0..TRICKLERS)
        .map(|_| tokio::spawn(trickle_body(port, started.clone(), trickling.clone())))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while started.load(Ordering::Acquire) < TRICKLERS {
        assert!(Instant::now() < deadline, "the tricklers did not all start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Their heads and first bytes have been read by the server.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = Instant::now();
    let nifi = Nifi::new(&base);
    let mut failures = vec![];
    // Tricklers still trickling before each NiFi-like call.
    let mut during = vec![];
    const CALLS: usize = 12;
    for n in 0..CALLS {
        during.push(trickling.load(Ordering::Acquire));
        if let Err(e) = nifi.call(n).await {
            failures.push(e);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let nifi_s = t.elapsed().as_secs_f64();
    let mut closed = vec![];
    for t in tricklers {
        closed.push(t.await.unwrap());
    }
    let report = format!(
        "failures {failures:?}; tricklers before each call {during:?}; NiFi's calls took \
         {nifi_s:.1} s; tricklers closed after (s, status) {:?}",
        closed
            .iter()
            .map(|(d, s)| (format!("{:.1}", d.as_secs_f64()), *s))
            .collect::<Vec<_>>()
    );
    println!("{report}");
    // More tricklers than permits were mid-body throughout the NiFi-like calls: every one of them
    // was read until the body deadline and answered 408 then, after the calls had ended.
    assert!(during.iter().all(|&n| n == TRICKLERS), "{report}");
    assert!(
        closed
            .iter()
            .all(|(d, s)| *s == Some(408) && d.as_secs_f64() >= BODY_TIMEOUT - 0.5),
        "{report}"
    );
    assert!(nifi_s < BODY_TIMEOUT - 1.0, "{report}");
    assert!(failures.is_empty(), "{report}");
}

//! Hostile and broken clients at the HTTP edge of the real binary (issue 20 item 1): hundreds of
//! connections that stay silent, trickle a request head, or (with a valid token) trickle a body.
//! The server closes every one of them within its deadlines (`server.timeout_keep_alive`,
//! `header_read_timeout`, `body_read_timeout`), and a NiFi-like client on its own connections
//! is served throughout; at `server.max_connections` a new connection takes the place of one that
//! never authenticated, or is closed at once when every connection is busy.
//! Prints one JSON line with the figures.
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use testkit::hostile;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_load-control-api");
const TOKEN: &str = "slow-clients-token";
const EACH: usize = 200;

struct Server(Child, std::path::PathBuf);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_file(&self.1);
    }
}

fn start(db_url: &str, port: u16, max_connections: usize) -> Server {
    let digest = load_control_api::auth::sha256_hex(TOKEN);
    let path = std::env::temp_dir().join(format!("slow-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(
        &path,
        format!(
            "server: {{host: 127.0.0.1, port: {port}, limit_concurrency: 16, timeout_keep_alive: 2, \
             header_read_timeout: 3, body_read_timeout: 4, max_connections: {max_connections}}}\n\
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
    Server(child, path)
}

async fn wait_ready(base: &str) {
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the api-server did not start");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_and_idle_clients_are_closed_within_the_deadlines_and_nifi_is_served() {
    let db = testkit::TestDb::fresh().await;
    let port = testkit::free_port();
    let _server = start(&db.url, port, 2_000);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;

    // The NiFi-like client, on its own pooled connections, beside 3 × EACH hostile ones.
    let stop = Arc::new(AtomicBool::new(false));
    let nifi = tokio::spawn(hostile::nifi_like(base.clone(), TOKEN.into(), stop.clone()));
    let closed = hostile::storm(port, EACH, TOKEN).await;
    stop.store(true, Ordering::Release);
    let nifi = nifi.await.unwrap();
    let worst = |kind: &str| hostile::worst(&closed, kind);
    let mut line = hostile::figures(&closed, &nifi);
    line["bench"] = "slow_clients".into();
    println!("{line}");
    // Every hostile connection was closed by the server, within its deadline (+2 s of slack on
    // a loaded two-core machine): silent after timeout_keep_alive (2 s), a trickled head after
    // header_read_timeout (3 s), a trickled body after body_read_timeout (4 s, answered 408: a
    // body that has not arrived holds no request permit, so none is refused 503 for lack of one).
    assert!(worst("silent") < 4.0, "{line}");
    assert!(worst("head") < 5.0, "{line}");
    assert!(worst("body") < 6.0, "{line}");
    assert!(
        closed["body"].iter().all(|c| c.status == Some(408)),
        "{line}"
    );
    // The NiFi-like client was served all along (a 503 would be retried as NiFi does).
    assert!(!nifi.latencies.is_empty(), "{line}");
    assert!(nifi.failures.is_empty(), "{line}");
}

/// Reads from `s` for `wait`: `Some(bytes read)` (0: the server closed it), `None` while it stays
/// open and silent.
async fn closed_within(s: &mut TcpStream, wait: Duration) -> Option<usize> {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(wait, s.read(&mut buf)).await {
        Ok(Ok(n)) => Some(n),
        Ok(Err(_)) => Some(0),
        Err(_) => None,
    }
}

/// `server.max_connections` (20) open: a new connection takes the place of the earliest one that
/// never authenticated and has no request in flight (20 half-sent heads: the first is closed, the
/// new one served); when every open connection is serving an authenticated request (20 bodies
/// being sent), the new one is closed at once. Once the others are gone the server accepts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_new_connection_takes_an_idle_unauthenticated_place_or_is_closed_at_once() {
    let db = testkit::TestDb::fresh().await;
    let port = testkit::free_port();
    let _server = start(&db.url, port, 20);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    let serves_again = || async {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if reqwest::get(format!("{base}/healthz"))
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                break;
            }
            assert!(Instant::now() < deadline, "the server did not accept again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The probe's own connection is gone before the next step.
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    serves_again().await;

    // 20 connections that each have sent a part of a head (no token yet): held until
    // header_read_timeout, but a new connection takes the earliest one's place.
    let mut held = vec![];
    for _ in 0..20 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        held.push(s);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut extra = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    extra
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), extra.read(&mut buf))
        .await
        .expect("the 21st connection is answered")
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    assert_eq!(
        closed_within(&mut held[0], Duration::from_secs(1)).await,
        Some(0),
        "the earliest half-sent head was closed"
    );
    for s in &mut held[1..] {
        assert_eq!(closed_within(s, Duration::from_millis(20)).await, None);
    }
    drop((held, extra));
    serves_again().await;

    // 20 connections each sending a body with a valid token (a request in flight on every one):
    // a new connection has no place and is closed at once.
    let mut busy = vec![];
    for _ in 0..20 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let head = format!(
            "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: 200\r\n\r\n "
        );
        s.write_all(head.as_bytes()).await.unwrap();
        busy.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let mut extra = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let _ = extra
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let n = tokio::time::timeout(Duration::from_secs(2), extra.read(&mut buf))
        .await
        .expect("closed at once, not left waiting");
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "the 21st connection got no answer: {:?}",
        n.map(|n| String::from_utf8_lossy(&buf[..n]).to_string())
    );
    assert!(t.elapsed() < Duration::from_secs(1));
    for s in &mut busy {
        assert_eq!(closed_within(s, Duration::from_millis(20)).await, None);
    }
    drop(busy);
    // The busy connections are gone: the server serves again.
    serves_again().await;
}

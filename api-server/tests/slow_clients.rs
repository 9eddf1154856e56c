//! Hostile and broken clients at the HTTP edge of the real binary (issue 20 item 1): hundreds of
//! connections that stay silent, trickle a request head, or (with a valid token) trickle a body.
//! The server closes every one of them within its deadlines (`server.timeout_keep_alive`,
//! `header_read_timeout`, `body_read_timeout`), and a NiFi-like client on its own connections
//! is served throughout; beyond `server.max_connections` a new connection is closed at once.
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
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
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
    // header_read_timeout (3 s), a trickled body after body_read_timeout (4 s, answered 408, or
    // 503 at once while the 16 request permits were taken).
    assert!(worst("silent") < 4.0, "{line}");
    assert!(worst("head") < 5.0, "{line}");
    assert!(worst("body") < 6.0, "{line}");
    assert!(
        closed["body"]
            .iter()
            .all(|c| matches!(c.status, Some(408) | Some(503))),
        "{line}"
    );
    assert!(
        closed["body"].iter().any(|c| c.status == Some(408)),
        "the body deadline answered: {line}"
    );
    // The NiFi-like client was served all along (503s of the permit limit retried as NiFi does);
    // how many calls it made depends on how long it waited for a permit, so only "some".
    assert!(!nifi.latencies.is_empty(), "{line}");
    assert!(nifi.failures.is_empty(), "{line}");
}

/// Beyond `server.max_connections` a new connection is closed at once, and once the others are
/// gone the server accepts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let db = testkit::TestDb::fresh().await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let _server = start(&db.url, port, 20);
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    // 20 connections that each have sent a part of a head: held until header_read_timeout.
    let mut held = vec![];
    for _ in 0..20 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let mut extra = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let _ = extra
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), extra.read(&mut buf))
        .await
        .expect("closed at once, not left waiting");
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "the 21st connection got no answer: {:?}",
        n.map(|n| String::from_utf8_lossy(&buf[..n]).to_string())
    );
    assert!(t.elapsed() < Duration::from_secs(1));
    drop(held);
    // The held connections are gone: the server serves again.
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
}

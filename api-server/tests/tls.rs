//! TLS termination in the api-server against real TLS peers: a client that trusts the server's CA
//! gets its answers, a client that does not is refused, and with `ssl_client_cert_required` only a
//! client certificate from `ssl_ca_certs` gets in — one from another CA, or none, is refused in
//! the handshake and reaches no handler.
use lcconfig::config::{Config, TokenEntry};
use load_control_api::auth::sha256_hex;
use load_control_api::server;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
use std::path::{Path, PathBuf};
use testkit::TestDb;

const NIFI: &str = "tls-nifi-token";

type Ca = testkit::TestCa;

fn ca(name: &str) -> Ca {
    testkit::TestCa::new(name)
}

/// (certificate PEM, key PEM) signed by `ca`.
fn leaf(ca: &Ca, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, names[0]);
    p.extended_key_usages = vec![usage];
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Serves over TLS with `tune` applied; the `https://127.0.0.1:<port>` base.
async fn serve_tls(tune: impl FnOnce(&mut Config)) -> (String, TestDb) {
    serve_tls_as(tune, None).await
}

/// [`serve_tls`] as the api-server of `installation` (`LC_INSTALLATION`), when given.
async fn serve_tls_as(
    tune: impl FnOnce(&mut Config),
    installation: Option<&str>,
) -> (String, TestDb) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let db = TestDb::fresh().await;
    let mut config = Config::default();
    config.database.url = Some(db.url.clone());
    config.logging.access_log = false;
    config.auth.tokens = vec![TokenEntry {
        name: "nifi".into(),
        role: "nifi".into(),
        sha256: sha256_hex(NIFI),
    }];
    tune(&mut config);
    config.validate().expect("valid");
    let mut ledger = server::connect_ledger(&config).await.unwrap();
    if let Some(installation) = installation {
        ledger = ledger.with_installation(installation, std::time::Duration::from_secs(3600));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(server::serve(
        config,
        ledger,
        listener,
        std::future::pending(),
    ));
    (base, db)
}

fn client(ca_pem: &str, identity: Option<(&str, &str)>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()]);
    if let Some((cert, key)) = identity {
        b = b.identity(reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap());
    }
    b.build().unwrap()
}

#[tokio::test]
async fn https_with_the_servers_ca_and_nothing_without_it() {
    let dir = tempdir("tls-server");
    let server_ca = ca("server-ca");
    let (cert, key) = leaf(
        &server_ca,
        &["127.0.0.1", "localhost"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (certfile, keyfile) = (write(&dir, "c.pem", &cert), write(&dir, "k.pem", &key));
    let (base, _db) = serve_tls(|c| {
        c.server.ssl_certfile = Some(certfile);
        c.server.ssl_keyfile = Some(keyfile);
    })
    .await;
    let ok = client(&server_ca.pem, None)
        .get(format!("{base}/v1/runs"))
        .bearer_auth(NIFI)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(
        ok.json::<serde_json::Value>().await.unwrap(),
        serde_json::json!([])
    );
    let stranger = ca("another-ca");
    let refused = client(&stranger.pem, None)
        .get(format!("{base}/healthz"))
        .send()
        .await;
    assert!(
        refused.is_err(),
        "a client that does not trust the server's CA got in"
    );
    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = reqwest::Client::new()
        .get(base.replace("https://", "http://") + "/healthz")
        .send()
        .await;
    assert!(plain.map(|r| r.status() != 200).unwrap_or(true));
}

#[tokio::test]
async fn a_required_client_certificate_must_come_from_the_configured_ca() {
    let dir = tempdir("tls-mutual");
    let server_ca = ca("server-ca");
    let client_ca = ca("nifi-client-ca");
    let (cert, key) = leaf(
        &server_ca,
        &["127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (certfile, keyfile) = (write(&dir, "c.pem", &cert), write(&dir, "k.pem", &key));
    let cafile = write(&dir, "clients.pem", &client_ca.pem);
    let (base, db) = serve_tls(|c| {
        c.server.ssl_certfile = Some(certfile);
        c.server.ssl_keyfile = Some(keyfile);
        c.server.ssl_ca_certs = Some(cafile);
        c.server.ssl_client_cert_required = true;
    })
    .await;
    let (nifi_cert, nifi_key) = leaf(
        &client_ca,
        &["nifi-01"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let body = serde_json::json!({"jobKey": "TLS", "businessKey": "K", "hdfsRoot": "/d", "stageTablePrefix": "t"});
    let created = client(&server_ca.pem, Some((&nifi_cert, &nifi_key)))
        .post(format!("{base}/v1/runs"))
        .bearer_auth(NIFI)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 200);
    let other_ca = ca("not-the-client-ca");
    let (bad_cert, bad_key) = leaf(
        &other_ca,
        &["intruder"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    for identity in [None, Some((bad_cert.as_str(), bad_key.as_str()))] {
        let r = client(&server_ca.pem, identity)
            .post(format!("{base}/v1/runs"))
            .bearer_auth(NIFI)
            .json(&serde_json::json!({"jobKey": "TLS", "businessKey": "X", "hdfsRoot": "/d", "stageTablePrefix": "t"}))
            .send()
            .await;
        assert!(r.is_err(), "refused in the handshake, got {r:?}");
    }
    let mut conn = db.conn().await;
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM nifi_ops.load_run")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        n, 1,
        "only the client with a valid certificate created a run"
    );
}

/// Issue 41 item 2: with client certificates required the kubelet (which has none) probes
/// `server.health_port`, plain HTTP, where `/readyz` checks what it checks on the API's port: the
/// database, the schema and the ledger's owner. A release refused the ledger is not ready there.
/// Nothing but the probes is served on that port.
#[tokio::test]
async fn with_client_certificates_required_the_probes_answer_on_the_health_port() {
    let dir = tempdir("tls-health");
    let server_ca = ca("server-ca");
    let client_ca = ca("nifi-client-ca");
    let (cert, key) = leaf(
        &server_ca,
        &["127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (certfile, keyfile) = (write(&dir, "c.pem", &cert), write(&dir, "k.pem", &key));
    let cafile = write(&dir, "clients.pem", &client_ca.pem);
    let health_port = testkit::free_port();
    let (base, db) = serve_tls_as(
        |c| {
            c.server.ssl_certfile = Some(certfile);
            c.server.ssl_keyfile = Some(keyfile);
            c.server.ssl_ca_certs = Some(cafile);
            c.server.ssl_client_cert_required = true;
            c.server.health_port = Some(health_port as i64);
        },
        Some("lc/b-leader"),
    )
    .await;
    let health = format!("http://127.0.0.1:{health_port}");
    let plain = reqwest::Client::new();
    let status = |path: &'static str| {
        let (plain, health) = (plain.clone(), health.clone());
        async move {
            plain
                .get(format!("{health}{path}"))
                .bearer_auth(NIFI)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // The server may still be binding: the first answer is awaited.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while plain.get(format!("{health}/healthz")).send().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "no health port");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(status("/healthz").await, 200);
    assert_eq!(status("/readyz").await, 200, "no owner yet: ready");
    for other in ["/v1/runs", "/metrics", "/openapi.json"] {
        assert_eq!(status(other).await, 404, "{other} on the health port");
    }
    // The API's own port still refuses a client without a certificate.
    let refused = client(&server_ca.pem, None)
        .get(format!("{base}/readyz"))
        .send()
        .await;
    assert!(refused.is_err(), "{refused:?}");
    // Another release takes the ledger: this one's API is not ready any more.
    let owner = db
        .ledger(2, ledger::LedgerConfig::default())
        .await
        .with_installation("lc/a-leader", std::time::Duration::from_secs(3600));
    owner.acquire_epoch("pod-a").await.unwrap();
    assert_eq!(
        status("/readyz").await,
        503,
        "refused the ledger: not ready"
    );
    assert_eq!(status("/healthz").await, 200, "alive all the same");
}

/// `server.max_connections` (4) handshakes stalled by clients that connect and send nothing: a
/// real client's handshake still gets through (the oldest stalled one gives way), and is served.
#[tokio::test]
async fn stalled_handshakes_at_the_cap_do_not_keep_a_real_client_out() {
    use tokio::io::AsyncReadExt;
    let dir = tempdir("tls-stalled");
    let server_ca = ca("server-ca");
    let (cert, key) = leaf(
        &server_ca,
        &["127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (certfile, keyfile) = (write(&dir, "c.pem", &cert), write(&dir, "k.pem", &key));
    let (base, _db) = serve_tls(|c| {
        c.server.ssl_certfile = Some(certfile);
        c.server.ssl_keyfile = Some(keyfile);
        c.server.max_connections = 4;
    })
    .await;
    let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
    let mut stalled = vec![];
    for _ in 0..4 {
        stalled.push(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap(),
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    // The four are all held (within header_read_timeout, 10 s): none was closed yet.
    for s in &mut stalled {
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(std::time::Duration::from_millis(20), s.read(&mut b)).await;
        assert!(r.is_err(), "a stalled handshake was closed early: {r:?}");
    }
    let http = client(&server_ca.pem, None);
    for n in 0..3 {
        let r = http
            .get(format!("{base}/v1/runs"))
            .bearer_auth(NIFI)
            .send()
            .await;
        assert!(
            r.as_ref().is_ok_and(|r| r.status() == 200),
            "call {n}: {r:?}"
        );
    }
    // The earliest stalled handshake made room.
    let mut b = [0u8; 1];
    let first = tokio::time::timeout(std::time::Duration::from_secs(1), stalled[0].read(&mut b))
        .await
        .expect("the oldest stalled handshake was closed");
    assert!(matches!(first, Ok(0) | Err(_)), "{first:?}");
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lc-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

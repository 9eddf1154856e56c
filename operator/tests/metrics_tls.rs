//! Issue 41 item 4: the operator's metrics served over TLS when the API's are
//! (`worker.metrics_tls`). The real operator binary, standalone on a real PostgreSQL, with the
//! API's certificate, key and client CA laid out as a Secret volume and client certificates
//! required: `/metrics` answers only in HTTPS to a client with a certificate of that CA; the
//! certificate's expiry is exposed as the API's is; a rotated certificate reaches the next
//! handshake without a restart; the kubelet's probes have a plain-HTTP port of their own that
//! serves nothing else. And a configuration asking for TLS without a certificate is refused at
//! start, naming the key.
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, SerialNumber};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testkit::{SecretVolume, TestCa, TestDb};

/// A certificate signed by `ca` for 127.0.0.1 with this serial: (PEM, key PEM).
fn leaf(ca: &TestCa, serial: u64, usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    p.distinguished_name
        .push(DnType::CommonName, "operator-metrics");
    p.serial_number = Some(SerialNumber::from(serial));
    p.extended_key_usages = vec![usage];
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// notAfter (Unix seconds) and serial of a PEM certificate.
fn validity_and_serial(pem: &str) -> (i64, u64) {
    let der = rustls_pki_der(pem);
    let (_, c) = x509_parser::parse_x509_certificate(&der).unwrap();
    let serial = c
        .raw_serial()
        .iter()
        .fold(0u64, |n, b| (n << 8) | u64::from(*b));
    (c.validity().not_after.timestamp(), serial)
}

fn rustls_pki_der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn operator(db: &TestDb, env: &[(&str, String)], log: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_load-control-operator"));
    c.args(["--standalone"])
        .env("LCA_CONFIG", "/dev/null")
        .env("DATABASE_URL", &db.url)
        .env("LCA_NIFI__RECEIVER_URL", "http://127.0.0.1:9")
        .env("LCA_WORKER__METRICS_HOST", "127.0.0.1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// A client trusting `ca`, presenting `identity` if any, a new handshake per request.
fn client(ca: &TestCa, identity: Option<&(String, String)>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap()])
        .tls_info(true)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5));
    if let Some((cert, key)) = identity {
        b = b.identity(reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap());
    }
    b.build().unwrap()
}

/// Status, body and the serial of the certificate the server presented.
async fn get(c: &reqwest::Client, url: &str) -> Result<(u16, String, Option<u64>), String> {
    let r = c.get(url).send().await.map_err(|e| format!("{e:?}"))?;
    let serial = r
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .map(|der| {
            let (_, c) = x509_parser::parse_x509_certificate(der).unwrap();
            c.raw_serial()
                .iter()
                .fold(0u64, |n, b| (n << 8) | u64::from(*b))
        });
    let status = r.status().as_u16();
    Ok((status, r.text().await.unwrap_or_default(), serial))
}

/// Polls `check` every 50 ms for at most `limit`; its last value.
async fn awaited<T>(
    limit: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
    what: &str,
    log: &std::path::Path,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {limit:?}; the operator's log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_metrics_are_served_over_tls_as_the_apis_are() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let db = TestDb::fresh().await;
    let ca = TestCa::new("operator-metrics-ca");
    let client_ca = TestCa::new("scraper-ca");
    let one = leaf(&ca, 4101, ExtendedKeyUsagePurpose::ServerAuth);
    let scraper = leaf(&client_ca, 77, ExtendedKeyUsagePurpose::ClientAuth);
    let mut volume = SecretVolume::new(
        "operator-metrics-tls",
        &[
            ("tls.crt", &one.0),
            ("tls.key", &one.1),
            ("client-ca.crt", &client_ca.pem),
        ],
    );
    let (metrics_port, health_port) = (testkit::free_port(), testkit::free_port());
    let log = std::env::temp_dir().join(format!(
        "operator-metrics-tls-{}.log",
        uuid::Uuid::new_v4().simple()
    ));
    let path = |f: &str| volume.path(f).to_string_lossy().into_owned();
    let _op = Killed(
        operator(
            &db,
            &[
                ("LCA_WORKER__METRICS_PORT", metrics_port.to_string()),
                ("LCA_WORKER__HEALTH_PORT", health_port.to_string()),
                ("LCA_WORKER__METRICS_TLS", "true".into()),
                ("LCA_SERVER__SSL_CERTFILE", path("tls.crt")),
                ("LCA_SERVER__SSL_KEYFILE", path("tls.key")),
                ("LCA_SERVER__SSL_CA_CERTS", path("client-ca.crt")),
                ("LCA_SERVER__SSL_CLIENT_CERT_REQUIRED", "true".into()),
                ("LCA_SERVER__RELOAD_INTERVAL", "1".into()),
            ],
            &log,
        )
        .spawn()
        .unwrap(),
    );
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let probes = format!("http://127.0.0.1:{health_port}");
    let metrics = format!("https://127.0.0.1:{metrics_port}/metrics");

    // The kubelet's port: the probes in plain HTTP, and nothing else.
    let ready = awaited(
        Duration::from_secs(30),
        async || match get(&plain, &format!("{probes}/readyz")).await {
            Ok((200, body, _)) => Some(body),
            _ => None,
        },
        "the probes port answering /readyz 200",
        &log,
    )
    .await;
    assert!(ready.contains("ok"), "{ready}");
    let (code, body, _) = get(&plain, &format!("{probes}/healthz")).await.unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, body, _) = get(&plain, &format!("{probes}/metrics")).await.unwrap();
    assert_eq!(code, 404, "the probes port serves no metrics: {body}");

    // The metrics port: never in plain HTTP, never to a client without a certificate of the CA.
    let refused_plain = get(&plain, &format!("http://127.0.0.1:{metrics_port}/metrics")).await;
    assert!(
        !matches!(refused_plain, Ok((200, _, _))),
        "plain HTTP must not be served: {refused_plain:?}"
    );
    let anonymous = get(&client(&ca, None), &metrics).await;
    assert!(
        anonymous.is_err(),
        "a client without a certificate must be refused in the handshake: {anonymous:?}"
    );
    let stranger = leaf(&ca, 78, ExtendedKeyUsagePurpose::ClientAuth);
    let foreign = get(&client(&ca, Some(&stranger)), &metrics).await;
    assert!(
        foreign.is_err(),
        "a certificate of another CA must be refused: {foreign:?}"
    );

    let scrape = client(&ca, Some(&scraper));
    let (code, text, serial) = get(&scrape, &metrics).await.unwrap();
    assert_eq!(code, 200, "{text}");
    assert_eq!(serial, Some(4101), "the certificate of the Secret volume");
    let (not_after, _) = validity_and_serial(&one.0);
    let exposed = text.lines().find_map(|l| {
        l.strip_prefix("lca_certificate_expiry_timestamp_seconds{cert=\"api\"} ")?
            .parse::<f64>()
            .ok()
    });
    assert_eq!(
        exposed,
        Some(not_after as f64),
        "the served certificate's notAfter, as the api-server exposes it"
    );
    assert!(
        text.lines().any(|l| l.starts_with("lca_leader")),
        "the operator's own series: {text}"
    );

    // A renewed certificate reaches the next handshake, without a restart.
    let two = leaf(&ca, 4102, ExtendedKeyUsagePurpose::ServerAuth);
    volume.swap(&[
        ("tls.crt", &two.0),
        ("tls.key", &two.1),
        ("client-ca.crt", &client_ca.pem),
    ]);
    let text = awaited(
        Duration::from_secs(15),
        async || match get(&scrape, &metrics).await {
            Ok((200, text, Some(4102))) => Some(text),
            _ => None,
        },
        "the renewed certificate served",
        &log,
    )
    .await;
    let (not_after, _) = validity_and_serial(&two.0);
    assert!(
        text.lines().any(|l| l
            == format!("lca_certificate_expiry_timestamp_seconds{{cert=\"api\"}} {not_after}")),
        "the renewed notAfter exposed: {text}"
    );
}

/// TLS asked for without a certificate: refused at start, naming the key, never served in plain
/// HTTP by mistake.
#[tokio::test]
async fn metrics_tls_without_a_certificate_is_refused_at_start() {
    let db = TestDb::fresh().await;
    let log = std::env::temp_dir().join(format!(
        "operator-metrics-tls-refused-{}.log",
        uuid::Uuid::new_v4().simple()
    ));
    let mut child = Killed(
        operator(
            &db,
            &[
                ("LCA_WORKER__METRICS_PORT", testkit::free_port().to_string()),
                ("LCA_WORKER__METRICS_TLS", "true".into()),
            ],
            &log,
        )
        .spawn()
        .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the operator did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("worker.metrics_tls") && err.contains("server.ssl_certfile"),
        "the message names both keys: {err}"
    );
}

//! Rotation without a restart (issue 28): the real api-server on 127.0.0.1 reading its
//! certificate and key from a directory laid out like a Kubernetes Secret volume (`tls.crt` ->
//! `..data/tls.crt`, `..data` -> `..<timestamp>`), rotated the way the kubelet does it (a new
//! timestamped directory, then `..data` replaced by a rename). New handshakes get the new
//! certificate, a connection opened before keeps the old one, requests during the swap all
//! succeed, and files that cannot be used (a broken PEM, a key of another certificate) leave the
//! previous certificate in use with a WARN naming the file and a counted failure.
use lcconfig::config::{Config, Dur, TokenEntry};
use load_control_api::auth::sha256_hex;
use load_control_api::server;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, SerialNumber};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use testkit::{SecretVolume, TestDb};

const NIFI: &str = "rotation-nifi-token";

/// Everything the server logs in this test binary (one subscriber per process).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> &'static Captured {
    static LOGS: OnceLock<Captured> = OnceLock::new();
    LOGS.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        let _ = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_env_filter("info")
            .try_init();
        captured
    })
}

fn log_text() -> String {
    String::from_utf8_lossy(&logs().0.lock().unwrap()).into_owned()
}

struct Leaf {
    cert: String,
    key: String,
}

/// A server certificate for 127.0.0.1 signed by `ca`, with this common name and serial,
/// valid for `days`.
fn leaf(ca: &testkit::TestCa, cn: &str, serial: u64, days: i64) -> Leaf {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.serial_number = Some(SerialNumber::from(serial));
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let now = time_now();
    p.not_before = now - rcgen_days(1);
    p.not_after = now + rcgen_days(days);
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    Leaf {
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

fn rcgen_days(d: i64) -> time::Duration {
    time::Duration::days(d)
}

async fn serve(tune: impl FnOnce(&mut Config)) -> (String, TestDb) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    logs();
    let db = TestDb::fresh().await;
    let mut config = Config::default();
    config.database.url = Some(db.url.clone());
    config.logging.access_log = false;
    config.server.reload_interval = Dur(Duration::from_millis(100));
    config.auth.tokens = vec![TokenEntry {
        name: "nifi".into(),
        role: "nifi".into(),
        sha256: sha256_hex(NIFI),
    }];
    tune(&mut config);
    config.validate().expect("valid");
    let ledger = server::connect_ledger(&config).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(server::serve(
        config,
        ledger,
        listener,
        std::future::pending(),
    ));
    (format!("127.0.0.1:{port}"), db)
}

/// A client that trusts `ca` and reports the server's certificate; `fresh`: a new connection
/// (a new handshake) for every request.
fn client(ca: &testkit::TestCa, fresh: bool) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap()])
        .tls_info(true)
        .timeout(Duration::from_secs(5));
    if fresh {
        b = b.pool_max_idle_per_host(0);
    }
    b.build().unwrap()
}

/// (common name, serial) of the certificate the server presented for this request.
async fn served(client: &reqwest::Client, addr: &str) -> (String, u64) {
    let r = client
        .get(format!("https://{addr}/v1/runs"))
        .bearer_auth(NIFI)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let der = r
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .expect("the server's certificate")
        .to_vec();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or("")
        .to_string();
    let serial = cert
        .raw_serial()
        .iter()
        .fold(0u64, |n, b| (n << 8) | u64::from(*b));
    (cn, serial)
}

/// Waits (at most 10 s, polling) until `check` holds; false when it never did.
async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn metrics(client: &reqwest::Client, addr: &str) -> String {
    client
        .get(format!("https://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of a series, by its name with labels as exposed.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn a_rotated_certificate_reaches_new_handshakes_and_a_broken_one_never_does() {
    let ca = testkit::TestCa::new("rotation-ca");
    let one = leaf(&ca, "api-one", 1001, 10);
    let mut volume = SecretVolume::new("api-tls", &[("tls.crt", &one.cert), ("tls.key", &one.key)]);
    let (cert_path, key_path) = (volume.path("tls.crt"), volume.path("tls.key"));
    let (addr, _db) = serve(|c| {
        c.server.ssl_certfile = Some(cert_path.clone());
        c.server.ssl_keyfile = Some(key_path.clone());
        // The connection kept across the rotation must not be closed for idleness meanwhile.
        c.server.timeout_keep_alive = 120.0;
    })
    .await;
    let fresh = client(&ca, true);
    assert_eq!(served(&fresh, &addr).await, ("api-one".into(), 1001));
    let m = metrics(&fresh, &addr).await;
    let expiry = series(&m, "lca_certificate_expiry_timestamp_seconds{cert=\"api\"}").expect(&m)
        - unix_now();
    assert!(
        (9.0 * 86400.0..=10.0 * 86400.0).contains(&expiry),
        "expiry {expiry}"
    );
    let loaded_at = series(
        &m,
        "lca_certificate_last_reload_timestamp_seconds{cert=\"api\"}",
    )
    .expect(&m);

    // A connection opened before the rotation, kept alive through it.
    let kept = client(&ca, false);
    assert_eq!(served(&kept, &addr).await.0, "api-one");

    // Load while the certificate changes: every request must succeed, each on a new handshake;
    // each task goes on until it has been served the new certificate (30 s at most).
    let (started, ok, failed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut load = Vec::new();
    for _ in 0..4 {
        let (started, ok, failed, addr) =
            (started.clone(), ok.clone(), failed.clone(), addr.clone());
        let c = client(&ca, true);
        load.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            // Runs of one certificate: (its DER, how many answers in a row).
            let mut seen: Vec<(Vec<u8>, u32)> = Vec::new();
            let mut counted = false;
            while seen.len() < 2 && Instant::now() < deadline {
                match c
                    .get(format!("https://{addr}/v1/runs"))
                    .bearer_auth(NIFI)
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 200 => {
                        if let Some(der) = r
                            .extensions()
                            .get::<reqwest::tls::TlsInfo>()
                            .and_then(|i| i.peer_certificate())
                        {
                            match seen.last_mut() {
                                Some((last, n)) if last.as_slice() == der => *n += 1,
                                _ => seen.push((der.to_vec(), 1)),
                            }
                        }
                        ok.fetch_add(1, Ordering::Relaxed);
                        if !counted {
                            counted = true;
                            started.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            seen.iter().map(|(_, n)| *n).collect::<Vec<u32>>()
        }));
    }
    assert!(
        eventually(|| async { started.load(Ordering::Relaxed) == 4 }).await,
        "the load did not start"
    );

    let two = leaf(&ca, "api-two", 2002, 30);
    volume.swap(&[("tls.crt", &two.cert), ("tls.key", &two.key)]);
    assert!(
        eventually(|| async { served(&fresh, &addr).await.0 == "api-two" }).await,
        "the new certificate was never served; logs:\n{}",
        log_text()
    );
    assert_eq!(served(&fresh, &addr).await, ("api-two".into(), 2002));
    let mut seen = Vec::new();
    for t in load {
        seen.push(t.await.unwrap());
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during the rotation ({} succeeded)",
        ok.load(Ordering::Relaxed)
    );
    assert!(
        seen.iter().all(|runs| runs.len() == 2),
        "a load task was not served the old then the new certificate: runs per task {seen:?}"
    );
    // The connection opened before goes on with the certificate it began with.
    assert_eq!(served(&kept, &addr).await.0, "api-one");

    let m = metrics(&fresh, &addr).await;
    let expiry =
        series(&m, "lca_certificate_expiry_timestamp_seconds{cert=\"api\"}").unwrap() - unix_now();
    assert!(
        (29.0 * 86400.0..=30.0 * 86400.0).contains(&expiry),
        "expiry after the rotation {expiry}"
    );
    assert!(
        series(
            &m,
            "lca_certificate_last_reload_timestamp_seconds{cert=\"api\"}"
        )
        .unwrap()
            > loaded_at
    );
    assert_eq!(
        series(&m, "lca_certificate_reload_failures_total{cert=\"api\"}"),
        None,
        "no failure yet"
    );

    // A PEM that cannot be parsed: the previous certificate stays, a WARN names the file.
    volume.swap(&[
        (
            "tls.crt",
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
        ),
        ("tls.key", &two.key),
    ]);
    let failures = |n: f64| {
        let (fresh, addr) = (fresh.clone(), addr.clone());
        async move {
            series(
                &metrics(&fresh, &addr).await,
                "lca_certificate_reload_failures_total{cert=\"api\"}",
            ) == Some(n)
        }
    };
    assert!(eventually(|| failures(1.0)).await, "no failure counted");
    assert_eq!(served(&fresh, &addr).await, ("api-two".into(), 2002));
    let cert_file = cert_path.display().to_string();
    assert!(
        log_text()
            .lines()
            .any(|l| l.contains("WARN") && l.contains(&cert_file) && l.contains("not valid X.509")),
        "no WARN naming {cert_file}"
    );

    // A certificate whose key is another one's: refused too.
    let three = leaf(&ca, "api-three", 3003, 40);
    volume.swap(&[("tls.crt", &three.cert), ("tls.key", &two.key)]);
    assert!(
        eventually(|| failures(2.0)).await,
        "a mismatched key was not refused"
    );
    assert_eq!(served(&fresh, &addr).await, ("api-two".into(), 2002));
    assert!(
        log_text()
            .lines()
            .any(|l| l.contains("WARN") && l.contains(&cert_file) && l.contains("does not match")),
        "no WARN about the key"
    );

    // And the next good pair is taken.
    volume.swap(&[("tls.crt", &three.cert), ("tls.key", &three.key)]);
    assert!(
        eventually(|| async { served(&fresh, &addr).await.1 == 3003 }).await,
        "a good pair after a refused one was not taken"
    );
    assert!(failures(2.0).await, "the good pair counted as a failure");
}

fn tokens_yaml(entries: &[(&str, &str, &str)]) -> String {
    entries
        .iter()
        .map(|(name, role, token)| {
            format!(
                "- {{name: {name}, role: {role}, sha256: {}}}\n",
                sha256_hex(token)
            )
        })
        .collect()
}

/// `auth.tokens_file` from a Secret volume, rotated as `kubectl apply` of the Secret does it: a
/// token added is accepted without a restart, old and new both while both are listed, a removed
/// one refused; a file that cannot be used keeps the tokens in force (WARN naming the file, a
/// counted failure), and no token ever reaches the log.
#[tokio::test]
async fn a_rotated_tokens_file_is_used_without_a_restart() {
    const OLD: &str = "rotation-token-old-6f1c";
    const NEW: &str = "rotation-token-new-93ab";
    const OPS: &str = "rotation-token-ops-2d77";
    let mut volume = SecretVolume::new(
        "api-tokens",
        &[(
            "tokens.yaml",
            &tokens_yaml(&[("nifi-2026a", "nifi", OLD), ("ops", "operator", OPS)]),
        )],
    );
    let path = volume.path("tokens.yaml");
    let (addr, _db) = serve(|c| {
        c.auth.tokens.clear();
        c.auth.tokens_file = Some(path.clone());
    })
    .await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let status = {
        let (http, addr) = (http.clone(), addr.clone());
        move |token: &'static str| {
            let (http, addr) = (http.clone(), addr.clone());
            async move {
                http.get(format!("http://{addr}/v1/runs"))
                    .bearer_auth(token)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }
        }
    };
    assert_eq!(status(OLD).await, 200);
    assert_eq!(status(NEW).await, 403, "not listed yet");
    assert_eq!(status(OPS).await, 200);
    let m = http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(series(&m, "lca_tokens_last_reload_timestamp_seconds").is_some_and(|t| t > 0.0));

    // Step 1 of a rotation: the new token beside the old one.
    volume.swap(&[(
        "tokens.yaml",
        &tokens_yaml(&[
            ("nifi-2026a", "nifi", OLD),
            ("nifi-2026b", "nifi", NEW),
            ("ops", "operator", OPS),
        ]),
    )]);
    assert!(
        eventually(|| async { status(NEW).await == 200 }).await,
        "the added token was never accepted"
    );
    assert_eq!(status(OLD).await, 200, "both tokens while both are listed");

    // Step 2: NiFi uses the new token, the old one is removed; calls with the new token go on
    // throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let during = {
        let (stop, status, accepted) = (stop.clone(), status.clone(), accepted.clone());
        tokio::spawn(async move {
            let mut other = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                match status(NEW).await {
                    200 => {
                        accepted.fetch_add(1, Ordering::Relaxed);
                    }
                    s => other.push(s),
                }
            }
            other
        })
    };
    assert!(
        eventually(|| async { accepted.load(Ordering::Relaxed) > 0 }).await,
        "the calls did not start"
    );
    let before = accepted.load(Ordering::Relaxed);
    volume.swap(&[(
        "tokens.yaml",
        &tokens_yaml(&[("nifi-2026b", "nifi", NEW), ("ops", "operator", OPS)]),
    )]);
    assert!(
        eventually(|| async { status(OLD).await == 403 }).await,
        "the removed token is still accepted"
    );
    // And one more call after the old token was seen refused.
    let after = accepted.load(Ordering::Relaxed);
    assert!(
        eventually(|| async { accepted.load(Ordering::Relaxed) > after }).await,
        "the calls stopped"
    );
    stop.store(true, Ordering::Relaxed);
    let other = during.await.unwrap();
    assert!(
        other.is_empty(),
        "{before} accepted before the change, {} in all, then {other:?}",
        accepted.load(Ordering::Relaxed)
    );
    // Without a token the answer stays 401.
    let none = http
        .get(format!("http://{addr}/v1/runs"))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 401);

    // A file that is not the format, then one that is gone: the tokens in force stay.
    let failures = |n: f64| {
        let (http, addr) = (http.clone(), addr.clone());
        async move {
            let m = http
                .get(format!("http://{addr}/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            series(&m, "lca_tokens_reload_failures_total") == Some(n)
        }
    };
    assert!(failures(0.0).await);
    volume.swap(&[(
        "tokens.yaml",
        &format!("- {{name: broken, role: nifi, sha256: {OLD}\n"),
    )]);
    assert!(eventually(|| failures(1.0)).await, "no failure counted");
    assert_eq!(status(NEW).await, 200);
    assert_eq!(status(OLD).await, 403);
    volume.swap(&[("other.yaml", "")]);
    assert!(
        eventually(|| failures(2.0)).await,
        "a missing file counted no failure"
    );
    assert_eq!(status(NEW).await, 200);
    assert_eq!(status(OPS).await, 200);
    let file = path.display().to_string();
    let logs = log_text();
    assert!(
        logs.lines()
            .filter(|l| l.contains("WARN") && l.contains(&file))
            .count()
            >= 2,
        "no WARN naming {file}:\n{logs}"
    );
    for token in [OLD, NEW, OPS] {
        assert!(!logs.contains(token), "a token reached the log:\n{logs}");
    }
    // Repaired: used again.
    volume.swap(&[(
        "tokens.yaml",
        &tokens_yaml(&[("nifi-2026b", "nifi", NEW), ("nifi-2026a", "nifi", OLD)]),
    )]);
    assert!(eventually(|| async { status(OLD).await == 200 }).await);
    assert_eq!(status(OPS).await, 403, "the operator token was removed");
}

/// At start there is nothing to fall back on: an unusable tokens file refuses the start, naming
/// the key and the file.
#[tokio::test]
async fn an_unusable_tokens_file_at_start_refuses_the_start() {
    let volume = SecretVolume::new(
        "api-tokens-bad",
        &[("tokens.yaml", "- {name: x, role: nifi}\n")],
    );
    let db = TestDb::fresh().await;
    for path in [volume.path("tokens.yaml"), volume.path("missing.yaml")] {
        let mut config = Config::default();
        config.database.url = Some(db.url.clone());
        config.auth.tokens_file = Some(path.clone());
        config.validate().unwrap();
        let ledger = server::connect_ledger(&config).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let refused = tokio::time::timeout(
            Duration::from_secs(5),
            server::serve(config, ledger, listener, std::future::pending()),
        )
        .await
        .expect("refused at once")
        .unwrap_err()
        .to_string();
        assert!(
            refused.contains("auth.tokens_file") && refused.contains(&path.display().to_string()),
            "{refused}"
        );
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

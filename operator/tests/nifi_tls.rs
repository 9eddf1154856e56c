//! The NiFi client certificate, key and CA bundle followed on disk (issue 28 item 1), against a
//! real TLS server that requires a client certificate, with the files laid out as Kubernetes
//! mounts a Secret (`tls.crt -> ..data/tls.crt`, `..data -> ..<timestamp>`, swapped atomically):
//! a rotated certificate is presented by the next dispatch; files that cannot be used keep the
//! previous client (logged and counted); unusable at start, nothing is sent and no attempt is
//! spent until usable files appear.
mod common;
use common::*;
use lcoperator::metrics::Metrics;
use lcoperator::nifi_tls::NifiClient;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::SecretVolume;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// (certificate PEM, key PEM, certificate DER) signed by `ca`, valid until 1 January of `until`.
fn leaf(
    ca: &testkit::TestCa,
    name: &str,
    usage: ExtendedKeyUsagePurpose,
    until: i32,
) -> (String, String, CertificateDer<'static>) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec![name.to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.extended_key_usages = vec![usage];
    p.not_after = rcgen::date_time_ymd(until, 1, 1);
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem(), cert.der().clone())
}

/// PG-05 over HTTPS requiring a client certificate from `client_ca`: answers 202 and closes the
/// connection (so every dispatch is a new handshake), recording the CN each client presented.
async fn tls_receiver(
    server_ca: &testkit::TestCa,
    client_ca: &testkit::TestCa,
) -> (String, Arc<Mutex<Vec<String>>>) {
    let (_, key, der) = leaf(
        server_ca,
        "127.0.0.1",
        ExtendedKeyUsagePurpose::ServerAuth,
        2040,
    );
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(client_ca.pem.as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .unwrap();
    let config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![der],
            PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    let seen: Arc<Mutex<Vec<String>>> = Default::default();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, record) = (acceptor.clone(), record.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let cn = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|der| {
                        let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
                        cert.subject()
                            .iter_common_name()
                            .next()
                            .and_then(|cn| cn.as_str().ok())
                            .unwrap_or("")
                            .to_string()
                    })
                    .unwrap_or_default();
                // The request head and body (small), then the answer.
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline {
                    let Ok(n) = tls.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf);
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                record.lock().unwrap().push(cn);
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (url, seen)
}

fn metric(metrics: &Metrics, series: &str) -> Option<f64> {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

async fn eventually(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Delivers the due VALIDATE_RUN of a new run with `client`; its status afterwards.
async fn dispatch_one(env: &Env, client: &NifiClient, bk: &str) -> (String, i32) {
    let (run, _) = env.validated(bk).await;
    let fence = env.fence().await;
    let mut dispatcher = env.dispatcher(&env.ledger);
    dispatcher.client = client.clone();
    let (_, shutdown) = watch::channel(false);
    dispatcher.scan(&fence, &shutdown).await;
    sqlx::query_as("SELECT status, attempt_count FROM nifi_ops.load_dispatch WHERE run_id = $1")
        .bind(run)
        .fetch_one(&mut env.conn().await)
        .await
        .unwrap()
}

const EXPIRY: &str = "lca_certificate_expiry_timestamp_seconds{cert=\"nifi_client\"}";
const RELOADED: &str = "lca_certificate_last_reload_timestamp_seconds{cert=\"nifi_client\"}";
const FAILURES: &str = "lca_certificate_reload_failures_total{cert=\"nifi_client\"}";
/// 2030-01-01T00:00:00Z and 2031-01-01T00:00:00Z.
const END_2030: f64 = 1_893_456_000.0;
const END_2031: f64 = 1_924_992_000.0;

#[tokio::test]
async fn a_rotated_client_certificate_is_presented_by_the_next_dispatch() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (server_ca, client_ca) = (
        testkit::TestCa::new("nifi-server-ca"),
        testkit::TestCa::new("nifi-client-ca"),
    );
    let (url, seen) = tls_receiver(&server_ca, &client_ca).await;
    let (cert1, key1, _) = leaf(
        &client_ca,
        "lca-client-1",
        ExtendedKeyUsagePurpose::ClientAuth,
        2030,
    );
    let mut volume = SecretVolume::new(
        "nifi-tls",
        &[
            ("tls.crt", &cert1),
            ("tls.key", &key1),
            ("ca.crt", &server_ca.pem),
        ],
    );
    let env = Env::start(|c| {
        c.nifi.receiver_url = Some(url.clone());
        c.nifi.client_cert = Some(volume.path("tls.crt"));
        c.nifi.client_key = Some(volume.path("tls.key"));
        c.nifi.ca_bundle = Some(volume.path("ca.crt"));
    })
    .await;
    let metrics = Arc::new(Metrics::default());
    let client = NifiClient::load(&env.config.nifi, metrics.clone());
    let (stop, shutdown) = watch::channel(false);
    let watcher = tokio::spawn(
        client
            .clone()
            .watch(Duration::from_millis(100), shutdown.clone()),
    );

    assert_eq!(dispatch_one(&env, &client, "T1").await, ("SENT".into(), 1));
    assert_eq!(seen.lock().unwrap().clone(), ["lca-client-1"]);
    assert_eq!(metric(&metrics, EXPIRY), Some(END_2030));
    let first_load = metric(&metrics, RELOADED).expect("loaded");

    // cert-manager renews: a new certificate and key, swapped in one rename of `..data`.
    let (cert2, key2, _) = leaf(
        &client_ca,
        "lca-client-2",
        ExtendedKeyUsagePurpose::ClientAuth,
        2031,
    );
    volume.swap(&[
        ("tls.crt", &cert2),
        ("tls.key", &key2),
        ("ca.crt", &server_ca.pem),
    ]);
    eventually(
        "the new certificate is in use",
        Duration::from_secs(10),
        || metric(&metrics, EXPIRY) == Some(END_2031),
    )
    .await;
    assert!(metric(&metrics, RELOADED).unwrap() >= first_load);
    assert_eq!(dispatch_one(&env, &client, "T2").await, ("SENT".into(), 1));
    assert_eq!(
        seen.lock().unwrap().last().map(String::as_str),
        Some("lca-client-2"),
        "the next dispatch presents the rotated certificate"
    );
    assert_eq!(metric(&metrics, FAILURES), None, "no failure so far");

    // A rotation half done: the key is not a key. The previous client stays, counted once.
    volume.swap(&[
        ("tls.crt", &cert2),
        (
            "tls.key",
            "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n",
        ),
        ("ca.crt", &server_ca.pem),
    ]);
    eventually("the failure is counted", Duration::from_secs(10), || {
        metric(&metrics, FAILURES) == Some(1.0)
    })
    .await;
    assert_eq!(dispatch_one(&env, &client, "T3").await, ("SENT".into(), 1));
    assert_eq!(
        seen.lock().unwrap().last().map(String::as_str),
        Some("lca-client-2")
    );
    // Then a file that cannot be read at all (the key missing from the new version).
    volume.swap(&[("tls.crt", &cert2), ("ca.crt", &server_ca.pem)]);
    eventually(
        "the unreadable key is counted",
        Duration::from_secs(10),
        || metric(&metrics, FAILURES) == Some(2.0),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        metric(&metrics, FAILURES),
        Some(2.0),
        "counted once, not at every poll"
    );
    assert_eq!(dispatch_one(&env, &client, "T4").await, ("SENT".into(), 1));
    assert_eq!(metric(&metrics, EXPIRY), Some(END_2031));
    // Whole again (the next renewal): taken.
    let (cert3, key3, _) = leaf(
        &client_ca,
        "lca-client-3",
        ExtendedKeyUsagePurpose::ClientAuth,
        2030,
    );
    volume.swap(&[
        ("tls.crt", &cert3),
        ("tls.key", &key3),
        ("ca.crt", &server_ca.pem),
    ]);
    eventually(
        "the third certificate is in use",
        Duration::from_secs(10),
        || metric(&metrics, EXPIRY) == Some(END_2030),
    )
    .await;
    assert_eq!(dispatch_one(&env, &client, "T5").await, ("SENT".into(), 1));
    assert_eq!(
        seen.lock().unwrap().clone(),
        [
            "lca-client-1",
            "lca-client-2",
            "lca-client-2",
            "lca-client-2",
            "lca-client-3"
        ]
    );
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the watcher stops on shutdown")
        .unwrap();
}

/// Unusable files at start are not a reason to exit: no client, nothing leased (no attempt
/// spent), a failure counted; once the files are whole the rows go out.
#[tokio::test]
async fn files_unusable_at_start_are_waited_out_without_spending_attempts() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (server_ca, client_ca) = (
        testkit::TestCa::new("nifi-server-ca"),
        testkit::TestCa::new("nifi-client-ca"),
    );
    let (url, seen) = tls_receiver(&server_ca, &client_ca).await;
    let (cert, key, _) = leaf(
        &client_ca,
        "lca-client",
        ExtendedKeyUsagePurpose::ClientAuth,
        2030,
    );
    // The key is not there yet (a Secret created after the pod).
    let mut volume = SecretVolume::new(
        "nifi-tls",
        &[("tls.crt", &cert), ("ca.crt", &server_ca.pem)],
    );
    std::os::unix::fs::symlink("..data/tls.key", volume.path("tls.key")).unwrap();
    let env = Env::start(|c| {
        c.nifi.receiver_url = Some(url.clone());
        c.nifi.client_cert = Some(volume.path("tls.crt"));
        c.nifi.client_key = Some(volume.path("tls.key"));
        c.nifi.ca_bundle = Some(volume.path("ca.crt"));
    })
    .await;
    let metrics = Arc::new(Metrics::default());
    let client = NifiClient::load(&env.config.nifi, metrics.clone());
    assert!(client.current().is_none());
    assert_eq!(metric(&metrics, FAILURES), Some(1.0));
    assert_eq!(metric(&metrics, EXPIRY), None);
    assert_eq!(
        dispatch_one(&env, &client, "W1").await,
        ("PENDING".into(), 0),
        "not leased: no attempt spent"
    );
    assert!(seen.lock().unwrap().is_empty());
    let (_stop, shutdown) = watch::channel(false);
    tokio::spawn(client.clone().watch(Duration::from_millis(100), shutdown));
    volume.swap(&[
        ("tls.crt", &cert),
        ("tls.key", &key),
        ("ca.crt", &server_ca.pem),
    ]);
    eventually("the client is built", Duration::from_secs(10), || {
        client.current().is_some()
    })
    .await;
    assert_eq!(metric(&metrics, EXPIRY), Some(END_2030));
    // The waiting row and a new one both go out.
    assert_eq!(dispatch_one(&env, &client, "W2").await, ("SENT".into(), 1));
    let (status,): (String,) =
        sqlx::query_as("SELECT string_agg(DISTINCT status, ',') FROM nifi_ops.load_dispatch")
            .fetch_one(&mut env.conn().await)
            .await
            .unwrap();
    assert_eq!(status, "SENT");
    assert_eq!(seen.lock().unwrap().clone(), ["lca-client", "lca-client"]);
}

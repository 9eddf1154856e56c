//! TLS termination in the api-server and, with `worker.metrics_tls`, in the operator's metrics
//! listener (`server.ssl_certfile`, `ssl_keyfile`, `ssl_ca_certs`, `ssl_client_cert_required`):
//! rustls with the ring provider. Handshakes run in their own tasks, so a slow or hostile client
//! never holds up the accept loop, and a failed one is logged and dropped. The certificate and key
//! are served by [`ReloadingCert`]: read again every `server.reload_interval` (`reload.rs`), so a
//! renewed certificate is used by the next handshake while established connections go on with
//! the one they began with.
use crate::reload::{Refused, Watch};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

fn read_pem<T>(
    path: &Path,
    what: &str,
    parse: impl FnOnce(&[u8]) -> Option<T>,
) -> anyhow::Result<T> {
    let bytes = std::fs::read(path).map_err(|e| {
        anyhow::anyhow!(
            "invalid configuration at `server.{what}`: {}: {e}",
            path.display()
        )
    })?;
    parse(&bytes).ok_or_else(|| {
        anyhow::anyhow!(
            "invalid configuration at `server.{what}`: {} holds no usable PEM certificate",
            path.display(),
        )
    })
}

/// Every certificate of a PEM bundle; None when there is none.
fn certificates(pem: &[u8]) -> Option<Vec<CertificateDer<'static>>> {
    let all: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect();
    (!all.is_empty()).then_some(all)
}

/// A certificate chain and its key, checked: both parse, the key is one rustls can sign with and
/// it belongs to the first certificate. Also the first certificate's notAfter (Unix seconds).
/// A refusal names the file at fault.
pub fn load_pair(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, i64), Refused> {
    let refuse = |file: &Path, reason: String| Refused {
        file: file.to_path_buf(),
        reason,
    };
    let chain = certificates(cert_pem)
        .ok_or_else(|| refuse(cert_path, "holds no usable PEM certificate".into()))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|_| refuse(key_path, "holds no usable PEM private key".into()))?;
    let not_after = x509_parser::parse_x509_certificate(&chain[0])
        .map_err(|_| {
            refuse(
                cert_path,
                "holds a certificate that is not valid X.509".into(),
            )
        })?
        .1
        .validity()
        .not_after
        .timestamp();
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => refuse(
            cert_path,
            format!("does not match the private key in {}", key_path.display()),
        ),
        other => refuse(
            key_path,
            format!("holds a key that cannot be used: {other}"),
        ),
    })?;
    Ok((certified, not_after))
}

/// The API's certificate as rustls asks for it at each handshake: whatever was last loaded.
#[derive(Debug)]
pub struct ReloadingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingCert {
    pub fn new(key: CertifiedKey) -> Self {
        ReloadingCert {
            current: RwLock::new(Arc::new(key)),
        }
    }

    /// From the next handshake on, `key` is served.
    pub fn replace(&self, key: CertifiedKey) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(key);
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// TLS session resumption as rustls' default (an in-memory cache of 256 sessions), started anew
/// when the certificate changes. A resumed session skips the certificate, so a session of the old
/// certificate must not survive a rotation: the cache is replaced, and for `quiet` after the
/// change (the longest a handshake may take, `server.header_read_timeout`) nothing is stored, so
/// that a handshake that began with the old certificate and ends after the change cannot leave a
/// session behind (resuming it would hand out new sessions of the old certificate, a chain that
/// would never end).
#[derive(Debug)]
pub struct SessionsOfTheCertificate {
    quiet: Duration,
    current: RwLock<(
        Arc<rustls::server::ServerSessionMemoryCache>,
        Option<std::time::Instant>,
    )>,
}

impl SessionsOfTheCertificate {
    const SIZE: usize = 256;

    fn new(quiet: Duration) -> Self {
        SessionsOfTheCertificate {
            quiet,
            current: RwLock::new((
                rustls::server::ServerSessionMemoryCache::new(Self::SIZE),
                None,
            )),
        }
    }

    fn cache(&self) -> Arc<rustls::server::ServerSessionMemoryCache> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .clone()
    }

    /// Sessions begun before are not resumed: their next connection makes a full handshake.
    pub fn forget_all(&self) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = (
            rustls::server::ServerSessionMemoryCache::new(Self::SIZE),
            Some(std::time::Instant::now()),
        );
    }
}

impl rustls::server::StoresServerSessions for SessionsOfTheCertificate {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        let (cache, changed) = self
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if changed.is_some_and(|at| at.elapsed() < self.quiet) {
            return false;
        }
        cache.put(key, value)
    }
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.cache().get(key)
    }
    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.cache().take(key)
    }
    fn can_cache(&self) -> bool {
        self.cache().can_cache()
    }
}

/// The TLS side of the API: the rustls configuration and what keeps its certificate current.
pub struct ApiTls {
    pub config: Arc<rustls::ServerConfig>,
    pub cert: Arc<ReloadingCert>,
    sessions: Arc<SessionsOfTheCertificate>,
    /// notAfter of the certificate loaded at start (Unix seconds).
    pub not_after: i64,
    paths: [PathBuf; 2],
    initial: Vec<Vec<u8>>,
    provider: Arc<CryptoProvider>,
}

impl ApiTls {
    /// Reads the certificate and key again every `interval`; each pair that loads is served
    /// from the next handshake on and reported to `loaded` (notAfter); each refusal to
    /// `refused`. Abort the task to stop.
    pub fn watch(
        &self,
        interval: Duration,
        loaded: impl Fn(i64) + Send + Sync + 'static,
        refused: impl Fn() + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let watch = Watch::new("api_certificate", self.paths.to_vec(), &self.initial);
        let (cert, sessions, provider) = (
            self.cert.clone(),
            self.sessions.clone(),
            self.provider.clone(),
        );
        let [cert_path, key_path] = self.paths.clone();
        watch.spawn(
            interval,
            move |files| {
                let (key, not_after) =
                    load_pair(&files[0], &files[1], &cert_path, &key_path, &provider)?;
                cert.replace(key);
                sessions.forget_all();
                loaded(not_after);
                Ok(())
            },
            refused,
        )
    }
}

/// The rustls server configuration of `server.ssl_*`: the certificate chain and key, and, with
/// `ssl_ca_certs`, client certificates verified against that bundle (required when
/// `ssl_client_cert_required`, else optional).
pub fn server_config(s: &lcconfig::config::ServerConfig) -> anyhow::Result<Option<ApiTls>> {
    let (Some(cert_path), Some(key_path)) = (&s.ssl_certfile, &s.ssl_keyfile) else {
        return Ok(None);
    };
    let read = |path: &Path, key: &str| {
        std::fs::read(path).map_err(|e| {
            anyhow::anyhow!(
                "invalid configuration at `server.{key}`: {}: {e}",
                path.display()
            )
        })
    };
    let initial = vec![
        read(cert_path, "ssl_certfile")?,
        read(key_path, "ssl_keyfile")?,
    ];
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let (certified, not_after) =
        load_pair(&initial[0], &initial[1], cert_path, key_path, &provider).map_err(|r| {
            anyhow::anyhow!(
                "invalid configuration at `server.ssl_certfile`/`ssl_keyfile`: {} {}",
                r.file.display(),
                r.reason
            )
        })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match &s.ssl_ca_certs {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            let cas: Vec<CertificateDer<'static>> = read_pem(ca, "ssl_ca_certs", certificates)?;
            for c in cas {
                roots.add(c).map_err(|e| {
                    anyhow::anyhow!("invalid configuration at `server.ssl_ca_certs`: {e}")
                })?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            );
            let verifier = if s.ssl_client_cert_required {
                verifier.build()
            } else {
                verifier.allow_unauthenticated().build()
            }
            .map_err(|e| anyhow::anyhow!("invalid configuration at `server.ssl_ca_certs`: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let cert = Arc::new(ReloadingCert::new(certified));
    let mut config = builder.with_cert_resolver(cert.clone());
    // A handshake lasts at most header_read_timeout (TlsListener drops it then), plus a margin.
    let sessions = Arc::new(SessionsOfTheCertificate::new(
        Duration::from_secs_f64(s.header_read_timeout.max(0.1)) + Duration::from_secs(1),
    ));
    config.session_storage = sessions.clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(ApiTls {
        config: Arc::new(config),
        cert,
        sessions,
        not_after,
        paths: [cert_path.clone(), key_path.clone()],
        initial,
        provider,
    }))
}

/// A listener whose connections are TLS streams whose handshake has completed.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, std::net::SocketAddr)>,
    local: std::net::SocketAddr,
    _accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Handshakes run at most `max_handshakes` at once and are dropped when not finished within
    /// `handshake_timeout`. At the cap the oldest handshake in progress gives way to the new
    /// connection: a real client's handshake takes milliseconds, so clients that stall theirs
    /// cannot keep one out (it would have to be the oldest of `max_handshakes`).
    pub fn new(
        tcp: TcpListener,
        config: Arc<rustls::ServerConfig>,
        handshake_timeout: Duration,
        max_handshakes: usize,
    ) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let max_handshakes = max_handshakes.max(1);
        // Handshakes in progress by order of arrival.
        let handshakes: Arc<Mutex<BTreeMap<u64, tokio::task::AbortHandle>>> = Arc::default();
        let acceptor = TlsAcceptor::from(config);
        let (tx, ready) = mpsc::channel(64);
        let accepting = tokio::spawn(async move {
            // One connection per round; the task ends when the listener is dropped.
            for id in 0u64.. {
                let (stream, peer) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(event = "accept_error", error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // Held while spawning, so the task's removal of itself comes after its insertion.
                let mut pending = handshakes.lock().unwrap_or_else(|p| p.into_inner());
                if pending.len() >= max_handshakes
                    && let Some((_, oldest)) = pending.pop_first()
                {
                    oldest.abort();
                    tracing::info!(
                        event = "tls_handshake_shed",
                        "the oldest TLS handshake in progress was dropped for a new connection (server.max_connections)"
                    );
                }
                let (acceptor, tx, all) = (acceptor.clone(), tx.clone(), handshakes.clone());
                let task = tokio::spawn(async move {
                    let handshake =
                        tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await;
                    all.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                    match handshake {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::info!(event = "tls_handshake_failed", peer = %peer, error = %e, "TLS handshake refused")
                        }
                        Err(_) => {
                            tracing::info!(event = "tls_handshake_timeout", peer = %peer, "TLS handshake did not finish in time")
                        }
                    }
                });
                pending.insert(id, task.abort_handle());
            }
        });
        Ok(TlsListener {
            ready,
            local,
            _accepting: accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self._accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept task never ends on its own; only a dropped listener stops it.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

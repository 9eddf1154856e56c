//! TLS termination in the api-server (`server.ssl_certfile`, `ssl_keyfile`, `ssl_ca_certs`,
//! `ssl_client_cert_required`): rustls with the ring provider. Handshakes run in their own tasks,
//! so a slow or hostile client never holds up the accept loop, and a failed one is logged and
//! dropped.
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
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
            "invalid configuration at `server.{what}`: {} holds no usable PEM {}",
            path.display(),
            if what == "ssl_keyfile" {
                "private key"
            } else {
                "certificate"
            }
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

/// The rustls server configuration of `server.ssl_*`: the certificate chain and key, and, with
/// `ssl_ca_certs`, client certificates verified against that bundle (required when
/// `ssl_client_cert_required`, else optional).
pub fn server_config(
    s: &lcconfig::config::ServerConfig,
) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
    let (Some(cert), Some(key)) = (&s.ssl_certfile, &s.ssl_keyfile) else {
        return Ok(None);
    };
    let chain: Vec<CertificateDer<'static>> = read_pem(cert, "ssl_certfile", certificates)?;
    let key: PrivateKeyDer<'static> = read_pem(key, "ssl_keyfile", |b| {
        PrivateKeyDer::from_pem_slice(b).ok()
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
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
                provider,
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
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        anyhow::anyhow!("invalid configuration at `server.ssl_certfile`/`ssl_keyfile`: {e}")
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Arc::new(config)))
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

//! The NiFi HTTP client (CONTRACT §6.4) and its TLS files reloaded while the process runs (issue
//! 28 item 1): `nifi.client_cert`, `nifi.client_key` and `nifi.ca_bundle` are read again every few
//! seconds, and when their content changed (cert-manager renewing a Secret, Kubernetes swapping
//! the volume's `..data` symlink) a new client is built and swapped in; sends already under way
//! finish on the client they started with. Files that cannot be read or do not make a client (a
//! rotation half done, a key that does not match its certificate) keep the previous client, with
//! a log line and `lca_certificate_reload_failures_total`; they are never a reason to exit. With
//! no usable client at all (unreadable at start), the dispatcher leases nothing and waits.
use crate::metrics::Metrics;
use lcconfig::config::NifiConfig;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;

/// The `cert` label of the client certificate's series.
pub const CERT_LABEL: &str = "nifi_client";

/// How often the files are read again when nothing says otherwise.
pub const POLL_INTERVAL: Duration = Duration::from_secs(5);

/// The paths of the TLS material towards NiFi.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub ca_bundle: Option<PathBuf>,
}

impl TlsFiles {
    pub fn of(c: &NifiConfig) -> TlsFiles {
        TlsFiles {
            client_cert: c.client_cert.clone(),
            client_key: c.client_key.clone(),
            ca_bundle: c.ca_bundle.clone(),
        }
    }

    fn is_empty(&self) -> bool {
        self.client_cert.is_none() && self.client_key.is_none() && self.ca_bundle.is_none()
    }

    /// The files' content; an error names the key and the path.
    pub fn read_material(&self) -> anyhow::Result<TlsMaterial> {
        self.read()
    }

    fn read(&self) -> anyhow::Result<TlsMaterial> {
        let read = |key: &str, p: &Option<PathBuf>| -> anyhow::Result<Option<Vec<u8>>> {
            p.as_ref()
                .map(|p| {
                    std::fs::read(p).map_err(|e| anyhow::anyhow!("nifi.{key} {}: {e}", p.display()))
                })
                .transpose()
        };
        Ok(TlsMaterial {
            client_cert: read("client_cert", &self.client_cert)?,
            client_key: read("client_key", &self.client_key)?,
            ca_bundle: read("ca_bundle", &self.ca_bundle)?,
        })
    }

    /// Reads until two reads in a row agree, so that a Secret volume swapped between the reads of
    /// the certificate and of the key is never taken half old, half new.
    fn read_settled(&self) -> anyhow::Result<TlsMaterial> {
        let mut last = self.read()?;
        for _ in 0..5 {
            let again = self.read()?;
            if again == last {
                return Ok(again);
            }
            last = again;
        }
        anyhow::bail!("the NiFi TLS files kept changing while being read")
    }
}

/// The content of the TLS files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsMaterial {
    pub client_cert: Option<Vec<u8>>,
    pub client_key: Option<Vec<u8>>,
    pub ca_bundle: Option<Vec<u8>>,
}

impl TlsMaterial {
    fn digest(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        for part in [&self.client_cert, &self.client_key, &self.ca_bundle] {
            match part {
                Some(bytes) => {
                    h.update([1]);
                    h.update((bytes.len() as u64).to_be_bytes());
                    h.update(bytes);
                }
                None => h.update([0]),
            }
        }
        h.finalize().into()
    }

    /// The unix time the client certificate (the first in its file) expires at.
    pub fn client_cert_not_after(&self) -> Option<i64> {
        let pem = self.client_cert.as_ref()?;
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
        let cert = pem.parse_x509().ok()?;
        Some(cert.validity().not_after.timestamp())
    }

    /// The NiFi client: no redirects, HTTP/1.1 with title-case header names, this material.
    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        let mut b = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .http1_only()
            // PG-05 matches header names exactly (`X-Run-Id`, CONTRACT §12); hyper would send
            // them in lower case.
            .http1_title_case_headers()
            .user_agent("load-control");
        if let Some(ca) = &self.ca_bundle {
            let certs = reqwest::Certificate::from_pem_bundle(ca)
                .map_err(|e| anyhow::anyhow!("nifi.ca_bundle: {e}"))?;
            if certs.is_empty() {
                anyhow::bail!("nifi.ca_bundle holds no certificate");
            }
            b = b.tls_certs_only(certs);
        }
        match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let mut pem = cert.clone();
                pem.push(b'\n');
                pem.extend_from_slice(key);
                let identity = reqwest::Identity::from_pem(&pem)
                    .map_err(|e| anyhow::anyhow!("nifi.client_cert/client_key: {e}"))?;
                b = b.identity(identity);
            }
            (None, None) => {}
            _ => anyhow::bail!("nifi.client_cert and nifi.client_key go together"),
        }
        Ok(b.build()?)
    }
}

/// The client the dispatcher sends with, swapped whole when the TLS files change.
#[derive(Clone)]
pub struct NifiClient {
    current: Arc<RwLock<Option<reqwest::Client>>>,
    state: Arc<Mutex<ReloadState>>,
    files: TlsFiles,
    metrics: Arc<Metrics>,
}

/// What the reloads have seen, so that each change is acted on (and each failure logged and
/// counted) once, not at every poll.
#[derive(Default)]
struct ReloadState {
    /// Digest of the material the current client was built from.
    applied: Option<[u8; 32]>,
    /// Digest of material that did not make a client.
    rejected: Option<[u8; 32]>,
    /// The files could not be read at the last poll.
    unreadable: bool,
}

impl NifiClient {
    /// A client that never changes (no TLS files to follow).
    pub fn fixed(client: reqwest::Client, metrics: Arc<Metrics>) -> NifiClient {
        NifiClient {
            current: Arc::new(RwLock::new(Some(client))),
            state: Default::default(),
            files: TlsFiles::default(),
            metrics,
        }
    }

    /// Builds the client from the configured files. Files that cannot be used are logged and
    /// counted, and leave no client until [`NifiClient::watch`] finds usable ones.
    pub fn load(c: &NifiConfig, metrics: Arc<Metrics>) -> NifiClient {
        let client = NifiClient {
            current: Arc::new(RwLock::new(None)),
            state: Default::default(),
            files: TlsFiles::of(c),
            metrics,
        };
        client.reload();
        client
    }

    /// The client to send with now; None while no usable TLS files were ever read.
    pub fn current(&self) -> Option<reqwest::Client> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reads the files and, when their content is new, builds a client and swaps it in, or logs
    /// and counts why not (keeping the current client).
    pub fn reload(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let material = match self.files.read_settled() {
            Ok(m) => m,
            Err(e) => {
                if !state.unreadable {
                    state.unreadable = true;
                    self.failed(&format!("{e:#}"));
                }
                return;
            }
        };
        state.unreadable = false;
        let digest = Some(material.digest());
        if digest == state.applied || digest == state.rejected {
            return;
        }
        match material.client() {
            Ok(client) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(client);
                let first = state.applied.is_none();
                state.applied = digest;
                state.rejected = None;
                let not_after = material.client_cert_not_after();
                if !self.files.is_empty() {
                    self.metrics.certificate_reloaded(CERT_LABEL, not_after);
                    tracing::info!(
                        event = if first {
                            "nifi_tls_loaded"
                        } else {
                            "nifi_tls_reloaded"
                        },
                        client_cert_not_after = not_after,
                        "NiFi TLS files {}",
                        if first {
                            "loaded"
                        } else {
                            "changed: new connections use them"
                        }
                    );
                }
            }
            Err(e) => {
                state.rejected = digest;
                self.failed(&format!("{e:#}"));
            }
        }
    }

    fn failed(&self, why: &str) {
        self.metrics.certificate_reload_failed(CERT_LABEL);
        if self.current().is_some() {
            tracing::error!(event = "nifi_tls_reload_failed", error = %why,
                "the NiFi TLS files cannot be used; dispatches go on with the previous ones");
        } else {
            tracing::error!(event = "nifi_tls_reload_failed", error = %why,
                "the NiFi TLS files cannot be used; nothing is dispatched until they can");
        }
    }

    /// Whether there are TLS files to follow.
    pub fn follows_files(&self) -> bool {
        !self.files.is_empty()
    }

    /// Reads the files again every `interval` until shutdown (returns at once when no TLS file is
    /// configured).
    pub async fn watch(self, interval: Duration, mut shutdown: watch::Receiver<bool>) {
        if self.files.is_empty() {
            return;
        }
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            // File reads block: off the async threads.
            let this = self.clone();
            let _ = tokio::task::spawn_blocking(move || this.reload()).await;
        }
    }
}

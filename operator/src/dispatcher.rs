//! Delivers outbox rows to NiFi PG-05 at least once (CONTRACT §6): lease in a short fenced
//! transaction, send after commit, record the outcome in another. Woken by LISTEN, with polling as
//! the fallback.
use crate::metrics::Metrics;
use hmac::{Hmac, Mac};
use ledger::{Fence, LeasedDispatch, Ledger, LedgerError, Recorded, SendOutcome};
use sha2::Sha256;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

#[derive(Clone)]
pub struct DispatcherConfig {
    pub listen: ledger::Dsn,
    pub poll_interval: Duration,
    pub batch: i64,
    /// §6.4: the key each attempt is signed with (`nifi.signer()`), none: unsigned.
    pub signer: Option<lcconfig::config::Signer>,
}

pub struct Dispatcher {
    pub ledger: Ledger,
    /// Swapped whole when the TLS files towards NiFi change ([`crate::nifi_tls`]).
    pub client: crate::nifi_tls::NifiClient,
    pub config: DispatcherConfig,
    pub metrics: Arc<Metrics>,
    /// Told when a transaction finds this process fenced.
    pub deposed: crate::leadership::Deposed,
}

/// The NiFi HTTP client (§6.4) of the files as they are now: no redirects, HTTP/1.1, optional
/// client certificate and CA bundle. The running process follows the files with
/// [`crate::nifi_tls::NifiClient`].
pub fn http_client(c: &lcconfig::config::NifiConfig) -> anyhow::Result<reqwest::Client> {
    crate::nifi_tls::TlsFiles::of(c).read_material()?.client()
}

/// `X-LCA-Signature`: lower-case hex HMAC-SHA256 over `<timestamp>.<raw body>` (§6.4).
pub fn signature(secret: &str, timestamp: u64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

impl Dispatcher {
    /// Runs until `shutdown`; works only while `fence` holds a value.
    pub async fn run(
        self: Arc<Self>,
        mut fence: watch::Receiver<Option<Fence>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let wake = Arc::new(Notify::new());
        let listener = tokio::spawn(listen(self.config.listen.clone(), wake.clone()));
        let mut poll = tokio::time::interval(self.config.poll_interval);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = fence.changed() => {}
                _ = wake.notified() => {}
                _ = poll.tick() => {}
            }
            if *shutdown.borrow() {
                break;
            }
            let current = fence.borrow().clone();
            if let Some(f) = current {
                self.scan(&f, &shutdown).await;
            }
        }
        listener.abort();
    }

    /// Leases and sends until nothing is due (or shutdown, or fenced).
    pub async fn scan(&self, fence: &Fence, shutdown: &watch::Receiver<bool>) {
        if self.client.current().is_none() {
            // The TLS files towards NiFi were never usable (logged and counted by the reload):
            // the rows wait, PENDING, without spending attempts.
            tracing::debug!(
                event = "dispatch_waiting_for_tls",
                "no usable NiFi TLS files yet"
            );
            return;
        }
        while !*shutdown.borrow() {
            let leased = match self.ledger.lease_dispatches(fence, self.config.batch).await {
                Ok(rows) => rows,
                Err(LedgerError::Fenced { .. }) => {
                    tracing::warn!(
                        event = "fenced",
                        epoch = fence.epoch,
                        "dispatcher lease refused: this process no longer leads"
                    );
                    self.deposed.report(fence.epoch);
                    return;
                }
                Err(e) => {
                    tracing::error!(event = "dispatch_lease_error", error = %e, "leasing outbox rows failed");
                    return;
                }
            };
            if leased.is_empty() {
                return;
            }
            futures::future::join_all(leased.iter().map(|d| self.deliver(fence, d))).await;
        }
    }

    /// One row: build, send, record.
    pub async fn deliver(&self, fence: &Fence, d: &LeasedDispatch) {
        let (outcome, settings) = match self.ledger.dispatch_request(d).await {
            Ok(Ok(req)) => (self.send(d, &req).await, req.settings),
            Ok(Err(reason)) => (SendOutcome::BuildFailed { reason }, self.ledger_settings()),
            Err(e) => {
                // Left PENDING: the lease expires and the row is taken again.
                tracing::error!(event = "dispatch_build_error", dispatch_id = %d.dispatch_id, error = %e, "reading the dispatch failed");
                return;
            }
        };
        match self.record(fence, d, &outcome, &settings).await {
            Ok(recorded) => {
                let result = match recorded {
                    Recorded::Sent => "sent",
                    Recorded::Retry => "retry",
                    Recorded::Dead => "dead",
                    Recorded::NotPending => return,
                };
                self.metrics.dispatch(&d.dispatch_type, result);
                match recorded {
                    Recorded::Sent => {
                        tracing::info!(event = "dispatch_sent", dispatch_id = %d.dispatch_id, run_id = %d.run_id, "dispatch delivered")
                    }
                    Recorded::Retry => {
                        tracing::warn!(event = "dispatch_retry", dispatch_id = %d.dispatch_id, run_id = %d.run_id, attempt = d.attempt_count, outcome = ?outcome, "dispatch will be retried")
                    }
                    _ => {
                        tracing::error!(event = "dispatch_dead", dispatch_id = %d.dispatch_id, run_id = %d.run_id, attempt = d.attempt_count, outcome = ?outcome, "dispatch is DEAD; an operator must resend it")
                    }
                }
            }
            Err(LedgerError::Fenced { .. }) => {
                tracing::warn!(event = "fenced", dispatch_id = %d.dispatch_id, "outcome not recorded: this process no longer leads");
                self.deposed.report(fence.epoch);
            }
            Err(e) => {
                tracing::error!(event = "dispatch_record_error", dispatch_id = %d.dispatch_id, error = %e, "recording the outcome failed; the lease will expire")
            }
        }
    }

    /// Records the outcome, retrying while the database is away (a restart, a failover) for as
    /// long as the lease lasts: the row is then settled seconds after the database is back, not a
    /// whole `dispatch.lease` later. A refusal of the epoch ends it at once.
    async fn record(
        &self,
        fence: &Fence,
        d: &LeasedDispatch,
        outcome: &SendOutcome,
        settings: &ledger::settings::Thresholds,
    ) -> ledger::LedgerResult<Recorded> {
        let give_up = tokio::time::Instant::now() + self.ledger.config().dispatch_lease;
        let mut pause = Duration::from_millis(200);
        loop {
            match self
                .ledger
                .record_dispatch_outcome(fence, d, outcome, settings)
                .await
            {
                Err(LedgerError::Database(e)) if tokio::time::Instant::now() + pause < give_up => {
                    tracing::warn!(event = "dispatch_record_retry", dispatch_id = %d.dispatch_id, error = %e,
                        "cannot record the outcome yet (database unavailable); retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    }

    fn ledger_settings(&self) -> ledger::settings::Thresholds {
        self.ledger.config().thresholds.clone()
    }

    async fn send(&self, d: &LeasedDispatch, req: &ledger::DispatchRequest) -> SendOutcome {
        let body = serde_json::to_vec(&req.body).expect("a JSON value serializes");
        let Some(client) = self.client.current() else {
            return SendOutcome::Retryable {
                http_status: None,
                error: "no usable NiFi TLS files (nifi.client_cert, client_key, ca_bundle)".into(),
            };
        };
        tracing::info!(event = "dispatch_sending", url = %req.url, body = %req.body, "sending dispatch");
        let mut http = client
            .post(&req.url)
            .timeout(Duration::from_secs_f64(req.settings.timeout_seconds))
            .header("Content-Type", "application/json")
            .header("X-Run-Id", d.run_id.to_string())
            .header("X-Dispatch-Id", d.dispatch_id.to_string());
        if let Some(signer) = &self.config.signer {
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|t| t.as_secs())
                .unwrap_or(0);
            if let Some(id) = &signer.key_id {
                // §6.4 key rotation: which of the receiver's keys checks this signature.
                http = http.header("X-LCA-Key-Id", id);
            }
            http = http
                .header("X-LCA-Timestamp", ts.to_string())
                .header("X-LCA-Signature", signature(&signer.secret, ts, &body));
        }
        match http.body(body).send().await {
            Ok(res) => {
                let status = res.status().as_u16();
                let text = res.text().await.unwrap_or_default();
                let text = if text.is_empty() {
                    format!("HTTP {status}")
                } else {
                    format!("HTTP {status}: {text}")
                };
                SendOutcome::from_status(status, text)
            }
            Err(e) => SendOutcome::Retryable {
                http_status: None,
                error: transport_error(&e),
            },
        }
    }
}

fn transport_error(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        text.push_str(": ");
        text.push_str(&s.to_string());
        src = s.source();
    }
    if e.is_timeout() {
        format!("timeout: {text}")
    } else {
        text
    }
}

/// `LISTEN load_dispatch` on a dedicated connection; reconnects (5 s after an error) and forces a
/// scan after every (re)connect (§6.2).
async fn listen(dsn: ledger::Dsn, wake: Arc<Notify>) {
    loop {
        match dsn.listener().await {
            Ok(mut l) => match l.listen("load_dispatch").await {
                Ok(()) => {
                    tracing::info!(event = "listen_connected", "listening on load_dispatch");
                    wake.notify_one();
                    loop {
                        match l.try_recv().await {
                            Ok(Some(_)) => wake.notify_one(),
                            Ok(None) => {
                                tracing::warn!(
                                    event = "listen_lost",
                                    "LISTEN connection lost; reconnecting"
                                );
                                wake.notify_one();
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(event = "listen_lost", error = %e, "LISTEN connection failed; reconnecting in 5s");
                                tokio::time::sleep(Duration::from_secs(5)).await;
                                break;
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(event = "listen_lost", error = %e, "LISTEN failed; retrying in 5s");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            },
            Err(e) => {
                tracing::warn!(event = "listen_lost", error = %e, "cannot connect for LISTEN; retrying in 5s");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_over_timestamp_dot_body() {
        // RFC 4231 style check against an independent computation of the same construction.
        let sig = signature("key", 1700000000, b"{\"runId\":\"x\"}");
        assert_eq!(sig.len(), 64);
        assert_eq!(sig, signature("key", 1700000000, b"{\"runId\":\"x\"}"));
        assert_ne!(sig, signature("key", 1700000001, b"{\"runId\":\"x\"}"));
        assert_eq!(
            signature("key", 0, b"The quick brown fox jumps over the lazy dog"),
            {
                let mut mac = Hmac::<Sha256>::new_from_slice(b"key").unwrap();
                mac.update(b"0.The quick brown fox jumps over the lazy dog");
                hex::encode(mac.finalize().into_bytes())
            }
        );
    }
}

//! The operator's metrics and health listener (`worker.metrics_host`, `metrics_port`): `/metrics`,
//! `/healthz` and `/readyz`, in plain HTTP or, with `worker.metrics_tls`, in HTTPS with the API's
//! certificate, key and client-certificate check (`serving_tls`, the api-server's own code); and
//! with `worker.health_port` a second, plain-HTTP port with the probes alone, for a kubelet that
//! has no client certificate to pass that check with.
use crate::health::Health;
use crate::metrics::Metrics;
use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use lcconfig::config::Config;
use ledger::Ledger;
use serving_tls::reload::Watches;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The listeners of one process, serving until it ends; dropping this stops re-reading the
/// certificate.
pub struct Listeners {
    /// Where `/metrics` is served (None: `worker.metrics_port` is null).
    pub metrics: Option<std::net::SocketAddr>,
    /// Where the probes alone are served (`worker.health_port`).
    pub probes: Option<std::net::SocketAddr>,
    _watches: Watches,
}

/// Binds and serves `worker.metrics_port` (HTTPS with `worker.metrics_tls`) and
/// `worker.health_port`. A port that cannot be bound, or a certificate or key that cannot be
/// used, is an error at start (the configuration is wrong; nothing can be waited out).
pub async fn serve(
    config: &Config,
    ledger: Ledger,
    metrics: Arc<Metrics>,
    health: Health,
) -> anyhow::Result<Listeners> {
    let w = &config.worker;
    let mut listeners = Listeners {
        metrics: None,
        probes: None,
        _watches: Watches::default(),
    };
    if let Some(port) = w.health_port {
        let addr = format!("{}:{port}", w.metrics_host);
        let tcp = TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding worker.health_port {addr}"))?;
        listeners.probes = Some(tcp.local_addr()?);
        tracing::info!(event = "health_port_listening", %addr, "probes (/healthz, /readyz) in plain HTTP on {addr}");
        let app = probes_router(ledger.clone(), metrics.clone(), health.clone());
        tokio::spawn(async move { axum::serve(tcp, app).await });
    }
    let Some(port) = w.metrics_port else {
        return Ok(listeners);
    };
    let addr = format!("{}:{port}", w.metrics_host);
    let tcp = TcpListener::bind(&addr)
        .await
        .with_context(|| format!("binding worker.metrics_port {addr}"))?;
    listeners.metrics = Some(tcp.local_addr()?);
    let app = router(ledger, metrics.clone(), health);
    if !w.metrics_tls {
        tokio::spawn(async move { axum::serve(tcp, app).await });
        return Ok(listeners);
    }
    let tls = serving_tls::tls::server_config(&config.server)
        .context(
            "worker.metrics_tls: the operator's metrics listener serves the API's certificate",
        )?
        .context("worker.metrics_tls needs server.ssl_certfile and server.ssl_keyfile")?;
    // The same files as the api-server's, under the same label: one certificate to renew.
    metrics.certificate_reloaded("api", Some(tls.not_after));
    let (loaded, refused) = (metrics.clone(), metrics);
    listeners._watches.0.push(tls.watch(
        config.server.reload_interval.0,
        move |not_after| loaded.certificate_reloaded("api", Some(not_after)),
        move || refused.certificate_reload_failed("api"),
    ));
    let https = serving_tls::tls::TlsListener::new(
        tcp,
        tls.config,
        Duration::from_secs_f64(config.server.header_read_timeout.max(0.1)),
        config.server.max_connections,
    )?;
    tracing::info!(
        event = "metrics_tls",
        %addr,
        client_certificate_required = config.server.ssl_client_cert_required,
        "the operator's /metrics, /healthz and /readyz in HTTPS on {addr} (worker.metrics_tls)"
    );
    tokio::spawn(async move { axum::serve(https, app).await });
    Ok(listeners)
}

#[derive(Clone)]
struct HealthState {
    ledger: Ledger,
    metrics: Arc<Metrics>,
    health: Health,
}

/// `/healthz` (liveness: fails only when a restart is the cure, see [`Health`]), `/readyz`
/// (the database takes a write; leadership not required) and `/metrics` (§9.3).
pub fn router(ledger: Ledger, metrics: Arc<Metrics>, health: Health) -> Router {
    probes(Router::new())
        .route(
            "/metrics",
            // Negotiated on Accept as client_golang does (the exposition crate).
            get(
                |State(s): State<HealthState>, headers: axum::http::HeaderMap| async move {
                    s.metrics
                        .owned_by_other(s.ledger.owner_conflict().is_some());
                    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
                    let (content_type, body) =
                        exposition::Format::respond(accept, s.metrics.render());
                    ([(header::CONTENT_TYPE, content_type)], body)
                },
            ),
        )
        .with_state(HealthState {
            ledger,
            metrics,
            health,
        })
}

/// `/healthz` and `/readyz` alone (404 to anything else): `worker.health_port`'s.
pub fn probes_router(ledger: Ledger, metrics: Arc<Metrics>, health: Health) -> Router {
    probes(Router::new()).with_state(HealthState {
        ledger,
        metrics,
        health,
    })
}

fn probes(r: Router<HealthState>) -> Router<HealthState> {
    r.route(
        "/healthz",
        get(|State(s): State<HealthState>| async move {
            let (alive, body) = s.health.report();
            let code = if alive {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (code, axum::Json(body))
        }),
    )
    .route("/readyz", get(readyz))
}

async fn readyz(State(s): State<HealthState>) -> impl IntoResponse {
    // Waiting to start (no Kubernetes client yet): not ready, with the reason. The chart gives
    // the operator container no readiness probe, so this never takes the pod out of the Service.
    if let Some(why) = s.health.waiting_for() {
        tracing::warn!(event = "readyz_failed", cause = %why, "not ready: no Kubernetes client yet");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(
                serde_json::json!({"status": "unavailable", "reason": "kubernetes_client", "message": why}),
            ),
        );
    }
    // Another release owning the ledger is a condition waited out (never an exit): not ready,
    // with the message naming both installations and what to do.
    let owner = tokio::time::timeout(Duration::from_secs(2), s.ledger.check_owner()).await;
    s.metrics
        .owned_by_other(s.ledger.owner_conflict().is_some());
    if let Ok(Err(e @ ledger::LedgerError::OwnedByOther(_))) = owner {
        tracing::warn!(event = "readyz_failed", cause = %e, "not ready: another load-control release owns the ledger");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(
                serde_json::json!({"status": "unavailable", "reason": "ledger_owned_by_other", "message": e.to_string()}),
            ),
        );
    }
    match tokio::time::timeout(Duration::from_secs(2), s.ledger.write_check()).await {
        Ok(Ok(())) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({"status": "ok"})),
        ),
        outcome => {
            let cause = match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "no write committed within 2s".to_string(),
            };
            tracing::warn!(event = "readyz_failed", cause = %cause, "not ready: the database cannot take this process's writes");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(serde_json::json!({"status": "unavailable"})),
            )
        }
    }
}

//! Running the API: database pool, listener, graceful shutdown.
use crate::app::service;
use crate::config::Config;
use crate::extract::AppState;
use ledger::Ledger;
use std::time::Duration;
use tokio::net::TcpListener;

/// The ledger's pool, connecting in the background: the API starts (and answers 503
/// `DATABASE_UNAVAILABLE`, `/readyz` 503) while the database is not there yet.
pub async fn connect_ledger(c: &Config) -> anyhow::Result<Ledger> {
    Ok(Ledger::connect_lazy(
        &c.database_url(),
        c.database.pool_size,
        c.database.max_overflow,
        c.ledger_config(),
    )?)
}

/// `auth.tokens_file` as it is now, checked: its bytes and entries. Unreadable or invalid, the
/// error names the key and the file (never its text).
pub fn read_tokens_file(
    path: &std::path::Path,
) -> anyhow::Result<(Vec<u8>, lcconfig::config::TokensFile)> {
    let bytes = std::fs::read(path).map_err(|e| {
        anyhow::anyhow!(
            "invalid configuration at `auth.tokens_file`: {}: {e}",
            path.display()
        )
    })?;
    let file = lcconfig::config::TokensFile::parse(&bytes).map_err(|e| {
        anyhow::anyhow!(
            "invalid configuration at `auth.tokens_file`: {} {e}",
            path.display()
        )
    })?;
    Ok((bytes, file))
}

/// Serves until `shutdown` resolves, then gives in-flight requests `timeout_graceful_shutdown`.
pub async fn serve(
    config: Config,
    ledger: Ledger,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let grace = Duration::from_secs_f64(config.server.timeout_graceful_shutdown.max(0.0));
    // The tokens file as it is at start: unreadable or invalid, the start is refused.
    let tokens_file = match &config.auth.tokens_file {
        Some(path) => {
            let (bytes, file) = read_tokens_file(path)?;
            Some((path.clone(), bytes, file))
        }
        None => None,
    };
    if config.auth.tokens.is_empty()
        && config.auth.token_digests.nifi.is_empty()
        && config.auth.token_digests.operator.is_empty()
        && tokens_file.as_ref().is_none_or(|(_, _, f)| f.is_empty())
    {
        tracing::warn!(
            event = "auth_unconfigured",
            "no auth tokens configured: every protected call answers 401/403"
        );
    }
    let tls = crate::tls::server_config(&config.server)?;
    // Whether this binary runs on the ledger's schema, said at once (readiness keeps checking).
    tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.log_schema_at_start(Duration::from_secs(10)).await }
    });
    let limits = crate::edge::EdgeLimits::of(&config.server);
    let state = AppState::new(config, ledger);
    let stats = state.0.edge.clone();
    let interval = state.0.config.server.reload_interval.0;
    let mut watches = crate::reload::Watches::default();
    if let Some((path, bytes, file)) = tokens_file {
        state.0.auth.set_file(&file);
        state.0.metrics.tokens_loaded();
        let watch = crate::reload::Watch::new("api_tokens", vec![path.clone()], &[bytes]);
        let (applied, refused) = (state.clone(), state.0.metrics.clone());
        watches.0.push(watch.spawn(
            interval,
            move |files| {
                let file = lcconfig::config::TokensFile::parse(&files[0]).map_err(|reason| {
                    crate::reload::Refused {
                        file: path.clone(),
                        reason,
                    }
                })?;
                applied.0.auth.set_file(&file);
                applied.0.metrics.tokens_loaded();
                Ok(())
            },
            move || refused.tokens_reload_failed(),
        ));
    }
    if let Some(tls) = &tls {
        let metrics = state.0.metrics.clone();
        metrics.certificate_loaded("api", tls.not_after);
        let on_refusal = metrics.clone();
        watches.0.push(tls.watch(
            interval,
            move |not_after| metrics.certificate_loaded("api", not_after),
            move || on_refusal.certificate_reload_failed("api"),
        ));
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    // The probes alone, in plain HTTP, for a kubelet that cannot pass `port`'s client
    // certificate check.
    let health = match state.0.config.server.health_port {
        Some(port) => {
            let addr = format!("{}:{port}", state.0.config.server.host);
            let listener = TcpListener::bind(&addr)
                .await
                .map_err(|e| anyhow::anyhow!("binding server.health_port {addr}: {e}"))?;
            tracing::info!(event = "health_port_listening", %addr, "probes (/healthz, /readyz) in plain HTTP on {addr}");
            let app = crate::app::health_router(state.clone());
            Some(tokio::spawn(crate::edge::serve(
                listener,
                app,
                limits,
                stats.clone(),
                stop_rx.clone(),
                grace,
            )))
        }
        None => None,
    };
    let app = service(state);
    match tls {
        Some(tls) => {
            let listener = crate::tls::TlsListener::new(
                listener,
                tls.config,
                limits.header_read,
                limits.max_connections,
            )?;
            crate::edge::serve(listener, app, limits, stats, stop_rx, grace).await
        }
        None => crate::edge::serve(listener, app, limits, stats, stop_rx, grace).await,
    }
    if let Some(health) = health {
        let _ = health.await;
    }
    drop(watches);
    Ok(())
}

/// SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
    tracing::info!(event = "shutdown_requested", "shutting down");
}

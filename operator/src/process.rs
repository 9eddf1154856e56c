//! Wiring of the standalone operator process: leadership loop, dispatcher, sweeper, and the
//! `/healthz`, `/readyz`, `/metrics` listener. Used by `main` and by the tests.
use crate::dispatcher::{Dispatcher, DispatcherConfig, http_client};
use crate::leadership::Leadership;
use crate::metrics::Metrics;
use crate::sweeper::Sweeper;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use lcconfig::config::Config;
use ledger::{Fence, Ledger};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How the Kubernetes loops are scoped and how long they keep finished LoadRuns.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    pub scope: crate::scope::WatchScope,
    /// A LoadRun whose run ended longer ago than this is deleted (the ledger keeps the run).
    pub loadrun_retention: Duration,
    /// With an instance, only LoadJobs labelled `loadcontrol.io/instance=<instance>` are this
    /// installation's, and its LoadRuns carry that label.
    pub instance: Option<String>,
}

impl Default for KubeOptions {
    fn default() -> KubeOptions {
        KubeOptions {
            scope: Default::default(),
            loadrun_retention: Duration::from_secs(7 * 86400),
            instance: None,
        }
    }
}

/// A running operator process.
pub struct Operator {
    pub metrics: Arc<Metrics>,
    pub fence: watch::Receiver<Option<Fence>>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// The Kubernetes loops, when running under Kubernetes.
    loops: Vec<tokio::task::JoinHandle<()>>,
}

impl Operator {
    /// Starts the loops; leadership is competed for at once.
    pub fn start<L: Leadership + 'static>(
        config: &Config,
        ledger: Ledger,
        leadership: L,
    ) -> anyhow::Result<Operator> {
        let metrics = Arc::new(Metrics::default());
        let deposed = crate::leadership::Deposed::default();
        let dispatcher = Arc::new(Dispatcher {
            ledger: ledger.clone(),
            client: http_client(&config.nifi)?,
            config: DispatcherConfig {
                listen_url: config
                    .database
                    .listen_dsn
                    .clone()
                    .unwrap_or_else(|| config.database_url()),
                poll_interval: config.dispatch.poll_interval.0,
                batch: config.dispatch.batch as i64,
                signing_secret: config.nifi.signing_secret.clone(),
            },
            metrics: metrics.clone(),
            deposed: deposed.clone(),
        });
        let sweeper = Arc::new(Sweeper {
            ledger,
            interval: config.recovery.sweeper_interval.0,
            metrics: metrics.clone(),
            deposed: deposed.clone(),
        });
        let (fence_tx, fence_rx) = watch::channel(None);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(lead(
            leadership,
            dispatcher,
            sweeper,
            fence_tx,
            shutdown_rx,
            deposed,
            metrics.clone(),
        ));
        Ok(Operator {
            metrics,
            fence: fence_rx,
            shutdown: shutdown_tx,
            task,
            loops: vec![],
        })
    }

    /// Under Kubernetes: Lease leadership, and the LoadJob controller and LoadRun mirror beside
    /// the dispatcher and sweeper (all acting only while leading).
    pub fn start_kubernetes(
        config: &Config,
        ledger: Ledger,
        client: kube::Client,
        namespace: &str,
        identity: &str,
        options: KubeOptions,
    ) -> anyhow::Result<Operator> {
        let leadership = crate::lease::KubeLeaseLeadership::new(
            client.clone(),
            namespace,
            ledger.clone(),
            identity.to_string(),
        );
        let mut op = Operator::start(config, ledger.clone(), leadership)?;
        let ctx = Arc::new(crate::kube_context::Context {
            recorder: crate::kube_context::recorder(client.clone(), identity),
            client,
            ledger,
            fence: op.fence.clone(),
            lease: config.dispatch.lease.0,
            mirror_queue: Default::default(),
            mirror_backoff: Default::default(),
            metrics: op.metrics.clone(),
            job_failures: Default::default(),
            scope: options.scope,
            loadrun_retention: options.loadrun_retention,
            instance: options.instance,
        });
        let listen = config
            .database
            .listen_dsn
            .clone()
            .unwrap_or_else(|| config.database_url());
        op.loops
            .push(tokio::spawn(crate::loadjob_controller::run_job_controller(
                ctx.clone(),
                op.shutdown.subscribe(),
            )));
        op.loops
            .push(tokio::spawn(crate::loadrun_mirror::run_mirror(
                ctx,
                listen,
                Duration::from_secs(30),
                op.shutdown.subscribe(),
            )));
        Ok(op)
    }

    /// Stops leasing, lets in-flight sends finish, releases leadership.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.shutdown.send(true);
        for l in self.loops {
            if tokio::time::timeout(Duration::from_secs(10), l)
                .await
                .is_err()
            {
                tracing::warn!(
                    event = "shutdown_timeout",
                    "a Kubernetes loop did not stop in time"
                );
            }
        }
        self.task.await?
    }

    /// Ends the process abruptly, as a crash would: nothing is released (tests of takeover).
    pub fn kill(self) {
        self.task.abort();
        for l in self.loops {
            l.abort();
        }
    }

    /// Resolves if the leadership task ends on its own (it should run until `stop`).
    pub async fn died(&mut self) -> anyhow::Error {
        match (&mut self.task).await {
            Ok(Ok(())) => anyhow::anyhow!("the leadership task ended"),
            Ok(Err(e)) => e.context("the leadership task failed"),
            Err(e) => anyhow::anyhow!("the leadership task died: {e}"),
        }
    }

    /// Waits until this process leads (or `limit` passes) and returns its fence.
    pub async fn wait_leading(&mut self, limit: Duration) -> Option<Fence> {
        let wait = self.fence.wait_for(|f| f.is_some());
        tokio::time::timeout(limit, wait)
            .await
            .ok()?
            .ok()
            .map(|f| f.clone().expect("waited for Some"))
    }
}

async fn lead<L: Leadership>(
    mut leadership: L,
    dispatcher: Arc<Dispatcher>,
    sweeper: Arc<Sweeper>,
    fence_tx: watch::Sender<Option<Fence>>,
    mut shutdown: watch::Receiver<bool>,
    deposed: crate::leadership::Deposed,
    metrics: Arc<Metrics>,
) -> anyhow::Result<()> {
    let d = tokio::spawn(dispatcher.run(fence_tx.subscribe(), shutdown.clone()));
    let s = tokio::spawn(sweeper.run(fence_tx.subscribe(), shutdown.clone()));
    loop {
        let fence = tokio::select! {
            f = leadership.acquire() => f?,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        tracing::info!(event = "leader_acquired", epoch = fence.epoch, holder = %fence.holder, "this process leads");
        metrics.leading(true);
        let _ = fence_tx.send(Some(fence.clone()));
        let stop = tokio::select! {
            _ = leadership.lost() => { tracing::warn!(event = "leader_lost", epoch = fence.epoch, "leadership lost"); false }
            _ = deposed.wait(fence.epoch) => { tracing::warn!(event = "leader_lost", epoch = fence.epoch, "fenced by a newer epoch"); false }
            _ = shutdown.wait_for(|s| *s) => true,
        };
        let _ = fence_tx.send(None);
        metrics.leading(false);
        if stop {
            break;
        }
        leadership.release().await;
    }
    // In-flight sends finish (within their timeout) before leadership is given up.
    let _ = d.await;
    let _ = s.await;
    leadership.release().await;
    tracing::info!(event = "leader_released", "leadership released");
    Ok(())
}

#[derive(Clone)]
struct HealthState {
    ledger: Ledger,
    metrics: Arc<Metrics>,
}

/// `/healthz`, `/readyz` (database reachable; leadership not required) and `/metrics` (§9.3).
pub fn health_router(ledger: Ledger, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
        )
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(|State(s): State<HealthState>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    s.metrics.render(),
                )
            }),
        )
        .with_state(HealthState { ledger, metrics })
}

async fn readyz(State(s): State<HealthState>) -> impl IntoResponse {
    match tokio::time::timeout(Duration::from_secs(2), s.ledger.ping()).await {
        Ok(Ok(())) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({"status": "ok"})),
        ),
        _ => {
            tracing::warn!(event = "readyz_failed", "database unreachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(serde_json::json!({"status": "unavailable"})),
            )
        }
    }
}

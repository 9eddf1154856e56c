//! Wiring of the standalone operator process: leadership loop, dispatcher, sweeper, and the
//! `/healthz`, `/readyz`, `/metrics` listener. Used by `main` and by the tests.
use crate::dispatcher::{Dispatcher, DispatcherConfig};
use crate::health::Health;
use crate::leadership::Leadership;
use crate::metrics::Metrics;
use crate::sweeper::Sweeper;
use futures::future::BoxFuture;
use lcconfig::config::Config;
use ledger::{Fence, Ledger};
use std::collections::HashMap;
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
    /// The leader Lease's name and timings.
    pub lease: crate::lease::LeaseSettings,
}

impl Default for KubeOptions {
    fn default() -> KubeOptions {
        KubeOptions {
            scope: Default::default(),
            loadrun_retention: Duration::from_secs(7 * 86400),
            instance: None,
            lease: Default::default(),
        }
    }
}

/// A running operator process.
pub struct Operator {
    pub metrics: Arc<Metrics>,
    pub health: Health,
    pub fence: watch::Receiver<Option<Fence>>,
    /// The fence the dispatcher and sweeper act on: published with `fence`, but after a restore
    /// of the ledger only once the LoadRun mirror has compared every LoadRun with the ledger
    /// (`crate::leadership::lead`).
    deciding: watch::Receiver<Option<Fence>>,
    shutdown: watch::Sender<bool>,
    /// Sent once the leader tasks have stopped: only then is leadership given up.
    release: watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// The supervised leader tasks (dispatcher, sweeper and, under Kubernetes, the controllers).
    workers: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
    /// The current run of each supervised task, to end it as a crash would (fault tests).
    running: Running,
}

type Running = Arc<std::sync::Mutex<HashMap<&'static str, tokio::task::AbortHandle>>>;

/// How a supervised task is started, anew after each failure.
type TaskFactory = Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

/// How long the leader tasks have, together, to stop once asked (a send in flight finishes within
/// `nifi.timeout_seconds`, 10 s by default); the Lease's release follows, within the chart's 40 s
/// grace period after the api-server's drain.
const WORKERS_STOP_LIMIT: Duration = Duration::from_secs(15);

/// Waits for every task at once, `limit` at most in all, and aborts those still running; the
/// names of those that were (logged, so that a slow shutdown names its cause).
pub async fn stop_all(
    workers: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
    limit: Duration,
) -> Vec<&'static str> {
    let began = tokio::time::Instant::now();
    let aborts: Vec<_> = workers
        .iter()
        .map(|(name, w)| (*name, w.abort_handle()))
        .collect();
    let all = futures::future::join_all(workers.into_iter().map(|(_, w)| w));
    if tokio::time::timeout(limit, all).await.is_ok() {
        tracing::info!(
            event = "leader_tasks_stopped",
            seconds = began.elapsed().as_secs_f64(),
            "leader tasks stopped"
        );
        return vec![];
    }
    let late: Vec<&'static str> = aborts
        .iter()
        .filter(|(_, a)| !a.is_finished())
        .map(|(name, _)| *name)
        .collect();
    for (_, a) in &aborts {
        a.abort();
    }
    tracing::warn!(
        event = "shutdown_timeout",
        tasks = ?late,
        limit_s = limit.as_secs(),
        "leader tasks did not stop in time; aborted"
    );
    late
}

/// Longest wait before a failed task is started again.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Runs `make()` until shutdown; when a run ends or panics before shutdown, it is logged, counted
/// (`lca_task_restarts`, `/healthz`) and started again after a backoff (1 s doubling to 30 s,
/// reset after a run that lasted 5 minutes). A task that keeps failing is a crash loop: logged at
/// ERROR once as it begins (`task_crash_looping`) and named in `/healthz`, but liveness stays
/// green: restarting the container would take the pod, and NiFi's API, out of the Service.
async fn supervise(
    name: &'static str,
    make: TaskFactory,
    health: Health,
    running: Running,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_secs(1);
    loop {
        // A JoinSet aborts its task when dropped: aborting the supervisor ends the task too.
        let mut one = tokio::task::JoinSet::new();
        let handle = one.spawn(make());
        running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, handle);
        let began = std::time::Instant::now();
        let ended = one.join_next().await.expect("one task was spawned");
        if *shutdown.borrow() {
            return;
        }
        let why = match ended {
            Ok(()) => "ended by itself".to_string(),
            Err(e) if e.is_panic() => {
                let p = e.into_panic();
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                format!("panicked: {msg}")
            }
            Err(_) => "was stopped".to_string(),
        };
        if began.elapsed() > crate::health::CRASH_LOOP_WINDOW {
            backoff = Duration::from_secs(1);
        }
        let recent = health.task_failed(name, &why);
        if recent == crate::health::CRASH_LOOP_RESTARTS {
            tracing::error!(event = "task_crash_looping", task = name, error = %why, restarts_in_window = recent,
                window_s = crate::health::CRASH_LOOP_WINDOW.as_secs(),
                "a leader task keeps failing; it goes on being restarted with backoff (the container is not restarted)");
        }
        tracing::error!(event = "task_failed", task = name, error = %why, restarts_in_window = recent,
            restart_in_s = backoff.as_secs(), "a leader task failed; restarting it (the others go on)");
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(RESTART_BACKOFF_MAX);
    }
}

/// The metrics and health state of a process, made before its work starts so that `/healthz`,
/// `/readyz` and `/metrics` answer while it waits for what it needs (a Kubernetes client).
#[derive(Clone)]
pub struct Observers {
    pub metrics: Arc<Metrics>,
    pub health: Health,
}

impl Default for Observers {
    fn default() -> Observers {
        let metrics = Arc::new(Metrics::default());
        Observers {
            health: Health::new(metrics.clone()),
            metrics,
        }
    }
}

impl Operator {
    /// Starts the loops; leadership is competed for at once.
    pub fn start<L: Leadership + 'static>(
        config: &Config,
        ledger: Ledger,
        leadership: L,
    ) -> anyhow::Result<Operator> {
        Operator::start_observed(config, ledger, leadership, Observers::default())
    }

    /// [`Operator::start`], reporting into `observers` (already served by [`crate::metrics_listener::router`]).
    pub fn start_observed<L: Leadership + 'static>(
        config: &Config,
        ledger: Ledger,
        leadership: L,
        observers: Observers,
    ) -> anyhow::Result<Operator> {
        Operator::start_gated(config, ledger, leadership, observers, None)
    }

    /// `compared`: under Kubernetes, the epoch under which the LoadRun mirror last compared every
    /// LoadRun with the ledger (the gate of the deciding fence after a restore).
    fn start_gated<L: Leadership + 'static>(
        config: &Config,
        ledger: Ledger,
        leadership: L,
        observers: Observers,
        compared: Option<watch::Receiver<i64>>,
    ) -> anyhow::Result<Operator> {
        let Observers { metrics, health } = observers;
        let deposed = crate::leadership::Deposed::default();
        // TLS files that cannot be used are waited out (logged and counted), never a reason to
        // exit: the api-server beside this process stays in the Service.
        let nifi_client = crate::nifi_tls::NifiClient::load(&config.nifi, metrics.clone());
        let dispatcher = Arc::new(Dispatcher {
            ledger: ledger.clone(),
            client: nifi_client.clone(),
            config: DispatcherConfig {
                listen: config.listen_dsn(),
                poll_interval: config.dispatch.poll_interval.0,
                batch: config.dispatch.batch as i64,
                signer: config.nifi.signer(),
            },
            metrics: metrics.clone(),
            deposed: deposed.clone(),
        });
        let sweeper = Arc::new(Sweeper {
            ledger: ledger.clone(),
            interval: config.recovery.sweeper_interval.0,
            metrics: metrics.clone(),
            deposed: deposed.clone(),
        });
        let (fence_tx, fence_rx) = watch::channel(None);
        let (deciding_tx, deciding_rx) = watch::channel(None);
        let (shutdown_tx, _) = watch::channel(false);
        let (release_tx, release_rx) = watch::channel(false);
        let mut op = Operator {
            metrics: metrics.clone(),
            health,
            fence: fence_rx,
            deciding: deciding_rx,
            task: tokio::spawn(crate::leadership::lead(
                leadership,
                ledger.clone(),
                crate::leadership::Fences {
                    all: fence_tx,
                    deciding: deciding_tx,
                    compared,
                },
                release_rx,
                deposed,
                metrics.clone(),
            )),
            shutdown: shutdown_tx,
            release: release_tx,
            workers: vec![],
            running: Default::default(),
        };
        let (fence, shutdown) = (op.deciding.clone(), op.shutdown.subscribe());
        op.supervise(
            "dispatcher",
            Box::new(move || Box::pin(dispatcher.clone().run(fence.clone(), shutdown.clone()))),
        );
        // Followed whether or not this process leads, so that a new leader sends with the
        // current files.
        if nifi_client.follows_files() {
            let shutdown = op.shutdown.subscribe();
            op.supervise(
                "nifi_tls_reload",
                Box::new(move || {
                    Box::pin(
                        nifi_client
                            .clone()
                            .watch(crate::nifi_tls::POLL_INTERVAL, shutdown.clone()),
                    )
                }),
            );
        }
        let (fence, shutdown) = (op.deciding.clone(), op.shutdown.subscribe());
        op.supervise(
            "sweeper",
            Box::new(move || Box::pin(sweeper.clone().run(fence.clone(), shutdown.clone()))),
        );
        Ok(op)
    }

    fn supervise(&mut self, name: &'static str, make: TaskFactory) {
        self.workers.push((
            name,
            tokio::spawn(supervise(
                name,
                make,
                self.health.clone(),
                self.running.clone(),
                self.shutdown.subscribe(),
            )),
        ));
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
        Operator::start_kubernetes_observed(
            config,
            ledger,
            client,
            namespace,
            identity,
            options,
            Observers::default(),
        )
    }

    /// [`Operator::start_kubernetes`], reporting into `observers`.
    pub fn start_kubernetes_observed(
        config: &Config,
        ledger: Ledger,
        client: kube::Client,
        namespace: &str,
        identity: &str,
        options: KubeOptions,
        observers: Observers,
    ) -> anyhow::Result<Operator> {
        let leadership = crate::lease::KubeLeaseLeadership::new(
            client.clone(),
            namespace,
            ledger.clone(),
            identity.to_string(),
            options.lease.clone(),
        );
        let leading_until = leadership.leading_until();
        let (compared, compared_rx) = watch::channel(0);
        let mut op = Operator::start_gated(
            config,
            ledger.clone(),
            leadership,
            observers,
            Some(compared_rx),
        )?;
        let ctx = Arc::new(crate::kube_context::Context {
            recorder: crate::kube_context::recorder(client.clone(), identity),
            client: client.clone(),
            ledger,
            fence: op.fence.clone(),
            leading_until,
            lease: config.dispatch.lease.0,
            mirror_queue: Default::default(),
            mirror_compared: compared,
            mirror_backoff: Default::default(),
            summary_changed: tokio::sync::broadcast::channel(1024).0,
            metrics: op.metrics.clone(),
            job_failures: Default::default(),
            scope: options.scope.clone(),
            loadrun_retention: options.loadrun_retention,
            instance: options.instance,
        });
        let listen = config.listen_dsn();
        let (c, shutdown) = (ctx.clone(), op.shutdown.subscribe());
        op.supervise(
            "loadjob_controller",
            Box::new(move || {
                Box::pin(crate::loadjob_controller::run_job_controller(
                    c.clone(),
                    shutdown.clone(),
                ))
            }),
        );
        let (queue, shutdown) = (ctx.mirror_queue.clone(), op.shutdown.subscribe());
        op.supervise(
            "loadrun_listen",
            Box::new(move || {
                let (queue, listen, mut shutdown) =
                    (queue.clone(), listen.clone(), shutdown.clone());
                Box::pin(async move {
                    tokio::select! {
                        _ = crate::loadrun_mirror::listen_for_runs(queue, listen) => {}
                        _ = shutdown.wait_for(|s| *s) => {}
                    }
                })
            }),
        );
        let shutdown = op.shutdown.subscribe();
        op.supervise(
            "loadrun_mirror",
            Box::new(move || {
                Box::pin(crate::loadrun_mirror::run_mirror(
                    ctx.clone(),
                    Duration::from_secs(30),
                    shutdown.clone(),
                ))
            }),
        );
        // Diagnosis only: reports (log, metric, /healthz) whether the kinds are served and
        // readable, and never stops anything; the watches wait out the same conditions.
        // Supervised like the others: a panic here would otherwise leave a stale diagnosis.
        let (health, shutdown) = (op.health.clone(), op.shutdown.subscribe());
        op.supervise(
            "access_watch",
            Box::new(move || {
                let (client, scope, health, mut shutdown) = (
                    client.clone(),
                    options.scope.clone(),
                    health.clone(),
                    shutdown.clone(),
                );
                Box::pin(async move {
                    tokio::select! {
                        _ = crate::scope::watch_access(client, scope, health) => {}
                        _ = shutdown.wait_for(|s| *s) => {}
                    }
                })
            }),
        );
        Ok(op)
    }

    /// Stops the leader tasks (in-flight sends finish), then releases leadership. The tasks
    /// stop together within `WORKERS_STOP_LIMIT` in all, so that the Lease is given up well
    /// inside the pod's grace period however many of them are slow.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop_naming_late().await.map(|_| ())
    }

    /// [`Operator::stop`], naming the leader tasks that had not stopped within
    /// `WORKERS_STOP_LIMIT` and were aborted (the Lease was released that much later).
    pub async fn stop_naming_late(self) -> anyhow::Result<Vec<&'static str>> {
        let _ = self.shutdown.send(true);
        let late = stop_all(self.workers, WORKERS_STOP_LIMIT).await;
        let _ = self.release.send(true);
        self.task.await??;
        Ok(late)
    }

    /// Ends the process abruptly, as a crash would: nothing is released (tests of takeover).
    pub fn kill(self) {
        self.task.abort();
        for (_, w) in self.workers {
            w.abort();
        }
    }

    /// Ends the current run of the supervised task `name` as a crash would (fault tests); the
    /// supervisor starts it again. False when no such task is running (unknown, or between two
    /// runs while its supervisor backs off).
    pub fn crash_task(&self, name: &str) -> bool {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        match running.get(name) {
            Some(h) if !h.is_finished() => {
                h.abort();
                true
            }
            _ => false,
        }
    }

    /// Resolves if the leadership task ends on its own (it should run until `stop`); liveness
    /// fails from then on.
    pub async fn died(&mut self) -> anyhow::Error {
        let e = match (&mut self.task).await {
            Ok(Ok(())) => anyhow::anyhow!("the leadership task ended"),
            Ok(Err(e)) => e.context("the leadership task failed"),
            Err(e) => anyhow::anyhow!("the leadership task died: {e}"),
        };
        self.health.fatal(format!("{e:#}"));
        e
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Three tasks that never stop cost the limit once, not three times (a pod's grace period
    /// holds however many tasks hang), and are aborted; tasks that stop in time cost nothing.
    #[tokio::test(start_paused = true)]
    async fn tasks_stop_together_within_one_limit() {
        let hung: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|name| (name, tokio::spawn(std::future::pending::<()>())))
            .collect();
        let aborts: Vec<_> = hung.iter().map(|(_, h)| h.abort_handle()).collect();
        let mut quick_one = hung;
        quick_one.push((
            "d",
            tokio::spawn(tokio::time::sleep(Duration::from_secs(1))),
        ));
        let began = tokio::time::Instant::now();
        assert_eq!(
            stop_all(quick_one, Duration::from_secs(15)).await,
            ["a", "b", "c"],
            "the late ones named, the one that stopped not"
        );
        assert_eq!(began.elapsed(), Duration::from_secs(15));
        tokio::task::yield_now().await;
        assert!(aborts.iter().all(|a| a.is_finished()), "all aborted");

        let quick: Vec<_> = (1..=3)
            .map(|i| {
                (
                    "quick",
                    tokio::spawn(tokio::time::sleep(Duration::from_secs(i))),
                )
            })
            .collect();
        let began = tokio::time::Instant::now();
        assert!(stop_all(quick, Duration::from_secs(15)).await.is_empty());
        assert_eq!(began.elapsed(), Duration::from_secs(3));
    }
}

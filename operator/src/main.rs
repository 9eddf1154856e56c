//! `load-control-operator`: the leader process (dispatcher + sweeper; with Kubernetes also the
//! LoadJob/LoadRun controllers).
use anyhow::Context;
use clap::Parser;
use lcconfig::config::{Config, config_path};
use lcoperator::leadership::{AdvisoryLockLeadership, default_identity};
use lcoperator::process::{Observers, Operator};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "load-control-operator",
    version,
    about = "load-control leader process: delivers dispatches to NiFi and sweeps stalled runs.",
    long_about = "load-control leader process.\n\nOnly the leader dispatches and sweeps; every ledger write it makes is fenced by a \
leadership epoch, so a deposed process can never write. With --standalone, leadership is the PostgreSQL advisory lock \
hashtext('load_control_leader') held on a dedicated connection (hosts without Kubernetes, local development); \
otherwise it is the Lease load-control-leader in --namespace, and the process also runs the LoadJob controller and \
the LoadRun mirror.\n\n\
Configuration: --config PATH, else $LCA_CONFIG, else ./config/config.yaml, with LCA_<SECTION>__<KEY> overrides; \
nifi.receiver_url is required."
)]
struct Cli {
    /// YAML configuration file (the api-server's format).
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Run dispatcher and sweeper without Kubernetes, led by a PostgreSQL advisory lock.
    #[arg(long)]
    standalone: bool,
    /// Namespace of the leader Lease (Kubernetes mode).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    namespace: String,
    /// Watch only these namespaces' LoadJobs and LoadRuns (repeatable or comma-separated;
    /// Kubernetes mode). Without it the whole cluster is watched: one installation per cluster.
    #[arg(
        long = "watch-namespace",
        env = "WATCH_NAMESPACES",
        value_name = "NS",
        value_delimiter = ','
    )]
    watch_namespaces: Vec<String>,
    /// Delete LoadRuns whose run ended longer ago than this (Kubernetes mode; the ledger keeps the
    /// runs). Durations as in the configuration: 7d, 36h, P14D, seconds.
    #[arg(long, env = "LOADRUN_RETENTION", default_value = "7d", value_parser = parse_duration_arg)]
    loadrun_retention: std::time::Duration,
    /// This installation's name (Kubernetes mode). Only LoadJobs labelled
    /// loadcontrol.io/instance=<NAME> are its own, and its LoadRuns carry that label: two
    /// installations that watch the same namespaces never touch each other's objects. The chart
    /// sets it to the release name when `instance.selector` is true.
    #[arg(long, env = "LC_INSTANCE", value_name = "NAME", value_parser = lcoperator::scope::valid_instance)]
    instance: Option<String>,
    /// Name of the leader Lease in --namespace (Kubernetes mode). Two installations in one
    /// namespace need two names; the chart derives it from the release name.
    #[arg(long, env = "LC_LEASE_NAME", default_value = lcoperator::lease::LEASE_NAME)]
    lease_name: String,
    /// This installation's identity in the ledger (two releases must not share one ledger
    /// database: the second is refused, see docs/operations.md). Default: `<namespace>/<lease
    /// name>` under Kubernetes, `standalone` in standalone mode.
    #[arg(long, env = "LC_INSTALLATION", value_name = "NAME")]
    installation: Option<String>,
    /// How long a lease-holding release's claim on the ledger outlives its last refresh before
    /// another installation may take the ledger over. Default: 3 × the lease duration, at least
    /// 60 s.
    #[arg(long, env = "LC_LEDGER_OWNER_STALE", value_parser = parse_duration_arg)]
    ledger_owner_stale: Option<std::time::Duration>,
    /// How long a candidate waits for an unchanged Lease before taking it (whole seconds).
    #[arg(long, env = "LC_LEASE_DURATION", default_value = "15s", value_parser = parse_duration_arg)]
    lease_duration: std::time::Duration,
    /// How long the leader goes on without a successful renewal before it stops all leader work.
    /// Renew deadline + retry period must be shorter than the lease duration.
    #[arg(long, env = "LC_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration_arg)]
    renew_deadline: std::time::Duration,
    /// How often the leader renews and a candidate tries.
    #[arg(long, env = "LC_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration_arg)]
    retry_period: std::time::Duration,
    /// Run the operator as a child process and start it again when a signal kills it (an OOM
    /// kill): the container, and the pod's readiness with the api-server beside it, stay. A child
    /// that exits with an error status ends the supervisor with that status; SIGTERM and SIGINT
    /// are passed on. The chart sets it (docs/operations.md).
    #[arg(long, env = lcoperator::supervisor::FLAG_ENV)]
    supervise: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Remove load-control's finalizer from every LoadJob, so that none is left undeletable once
    /// the operator is gone (the Helm chart's pre-delete hook). Needs only Kubernetes access.
    ReleaseFinalizers {
        /// First scale this Deployment (in --namespace) to zero and wait for its pods to end, so
        /// that no running controller adds the finalizer back.
        #[arg(long, value_name = "NAME")]
        stop_deployment: Option<String>,
    },
}

fn parse_duration_arg(s: &str) -> Result<std::time::Duration, String> {
    ledger::settings::parse_duration(s)
        .ok_or_else(|| format!("{s:?} is not a duration (7d, 36h, P14D, or seconds)"))
}

async fn release_finalizers(
    namespace: &str,
    stop: Option<&str>,
    scope: &lcoperator::scope::WatchScope,
    instance: Option<&str>,
) -> anyhow::Result<()> {
    lcconfig::logging::init(&Default::default(), "worker", &Default::default())
        .map_err(anyhow::Error::msg)?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (in-cluster or KUBECONFIG)")?;
    let stopped = match stop {
        Some(deployment) => Some((
            deployment,
            lcoperator::uninstall::stop_deployment(
                client.clone(),
                namespace,
                deployment,
                std::time::Duration::from_secs(90),
            )
            .await?,
        )),
        None => None,
    };
    match lcoperator::uninstall::release_finalizers(client.clone(), scope, instance).await {
        Ok(n) => {
            tracing::info!(
                event = "finalizers_released",
                count = n,
                "LoadJob finalizers released"
            );
            Ok(())
        }
        Err(e) => {
            // The uninstall stops here; the installation must go on serving meanwhile.
            if let Some((deployment, replicas)) = stopped {
                let api = kube::Api::namespaced(client, namespace);
                lcoperator::uninstall::restore(&api, deployment, replicas).await;
            }
            Err(e)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(Command::ReleaseFinalizers { stop_deployment }) = &cli.command {
        let scope = lcoperator::scope::WatchScope::from_list(&cli.watch_namespaces);
        return release_finalizers(
            &cli.namespace,
            stop_deployment.as_deref(),
            &scope,
            cli.instance.as_deref(),
        )
        .await;
    }
    let lease = lcoperator::lease::LeaseSettings {
        name: cli.lease_name.clone(),
        duration: cli.lease_duration,
        renew_deadline: cli.renew_deadline,
        retry: cli.retry_period,
    };
    lease
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid leader election settings: {e}"))?;
    let config = Config::load(&config_path(cli.config.as_deref()), std::env::vars())?;
    config.validate()?;
    if config.nifi.receiver_url.is_none() {
        anyhow::bail!(
            "invalid configuration at `nifi.receiver_url`: the operator process needs NiFi's PG-05 receiver URL"
        );
    }
    lcconfig::logging::init(&config.logging, "worker", &config.secrets())
        .map_err(anyhow::Error::msg)?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Connects in the background: a database that is not there yet is waited out (leadership,
    // dispatcher and sweeper retry; /readyz says so), never a reason to exit.
    let ledger = ledger::Ledger::connect_lazy(
        &config.database_url(),
        config.database.pool_size,
        config.database.max_overflow,
        config.ledger_config(),
    )
    .context("the database URL")?;
    let installation = cli.installation.clone().unwrap_or_else(|| {
        if cli.standalone {
            "standalone".to_string()
        } else {
            format!("{}/{}", cli.namespace, lease.name)
        }
    });
    let owner_stale = cli
        .ledger_owner_stale
        .unwrap_or_else(|| ledger::default_owner_stale(lease.duration));
    let ledger = ledger.with_installation(&installation, owner_stale);
    // Whether this binary runs on the ledger's schema, said at once; until it does, readiness
    // fails and no leader write (the epoch first) is made.
    tokio::spawn({
        let ledger = ledger.clone();
        async move {
            ledger
                .log_schema_at_start(std::time::Duration::from_secs(10))
                .await
        }
    });
    let identity = default_identity();
    // Served before anything is waited for: while the Kubernetes client cannot be had, the
    // process is alive (/healthz 200), not ready (/readyz 503 with the reason) and says so.
    let observers = Observers::default();
    if let Some(n) = lcoperator::supervisor::child_restarts() {
        observers.metrics.process_restarts(n);
    }
    let _listeners = lcoperator::metrics_listener::serve(
        &config,
        ledger.clone(),
        observers.metrics.clone(),
        observers.health.clone(),
    )
    .await?;
    let mut operator = if cli.standalone {
        let leadership =
            AdvisoryLockLeadership::new(config.session_dsn(), ledger.clone(), identity.clone());
        Operator::start_observed(&config, ledger.clone(), leadership, observers)?
    } else {
        let client = tokio::select! {
            c = connect_kubernetes(&observers.health) => c,
            _ = shutdown_signal() => {
                tracing::info!(event = "shutdown_requested", "stopping before any work started");
                return Ok(());
            }
        };
        let scope = lcoperator::scope::WatchScope::from_list(&cli.watch_namespaces);
        tracing::info!(event = "watch_scope", scope = %scope, lease = %lease.name, "watching LoadJobs and LoadRuns");
        Operator::start_kubernetes_observed(
            &config,
            ledger.clone(),
            client,
            &cli.namespace,
            &identity,
            lcoperator::process::KubeOptions {
                scope,
                loadrun_retention: cli.loadrun_retention,
                instance: cli.instance.clone(),
                lease,
            },
            observers,
        )?
    };
    let mode = if cli.standalone {
        "standalone"
    } else {
        "kubernetes"
    };
    tracing::info!(event = "operator_started", identity = %identity, installation = %installation, mode, "operator process started");
    tokio::select! {
        _ = shutdown_signal() => {}
        // Only the leader may write; if leadership handling dies, so does the process.
        e = operator.died() => return Err(e),
    }
    tracing::info!(
        event = "shutdown_requested",
        "stopping: in-flight sends finish, then leadership is released"
    );
    operator.stop().await
}

/// Longest wait between two attempts at a Kubernetes client.
const KUBE_CLIENT_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(30);
/// How long one attempt may take to reach the API server.
const KUBE_CLIENT_ATTEMPT_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One attempt: the configuration read (in-cluster or KUBECONFIG) and the API server answering.
async fn kube_client() -> anyhow::Result<kube::Client> {
    let client = kube::Client::try_default()
        .await
        .context("reading the Kubernetes configuration (in-cluster or KUBECONFIG)")?;
    match tokio::time::timeout(KUBE_CLIENT_ATTEMPT_LIMIT, client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => Err(anyhow::Error::new(e).context("reaching the Kubernetes API server")),
        Err(_) => Err(anyhow::anyhow!(
            "reaching the Kubernetes API server: no answer within {}s",
            KUBE_CLIENT_ATTEMPT_LIMIT.as_secs()
        )),
    }
}

/// A Kubernetes client, however long it takes: an unreadable configuration (a Secret volume not
/// mounted yet) or an API server away is waited out, never a reason to exit (the pod would leave
/// the Service with the api-server beside this container). Each attempt that fails is retried
/// after a backoff (1 s doubling to 30 s); the reason is logged at ERROR once per change, shown
/// as `lca_kubernetes_access 0`, in `/healthz` (`waitingFor`, still 200) and in `/readyz` (503).
async fn connect_kubernetes(health: &lcoperator::health::Health) -> kube::Client {
    let mut backoff = std::time::Duration::from_secs(1);
    let mut last: Option<String> = None;
    loop {
        match kube_client().await {
            Ok(client) => {
                if last.is_some() {
                    tracing::info!(
                        event = "kubernetes_client_ready",
                        "the Kubernetes API server answers; starting"
                    );
                }
                health.starting(None);
                health.kubernetes(None);
                return client;
            }
            Err(e) => {
                let why = format!("no Kubernetes client: {e:#}");
                if last.as_deref() != Some(why.as_str()) {
                    tracing::error!(event = "kubernetes_client_failed", error = %why,
                        "cannot use Kubernetes yet; retrying with backoff (the process stays up, not ready)");
                }
                health.kubernetes(Some(why.clone()));
                health.starting(Some(why.clone()));
                last = Some(why);
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(KUBE_CLIENT_BACKOFF_MAX);
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.supervise && cli.command.is_none() {
        let exe = match std::env::current_exe() {
            Ok(exe) => exe,
            Err(e) => {
                eprintln!("load-control-operator: cannot find its own executable: {e}");
                return ExitCode::FAILURE;
            }
        };
        let args = lcoperator::supervisor::child_args(std::env::args_os().skip(1));
        return lcoperator::supervisor::supervise(exe, args).await;
    }
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load-control-operator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

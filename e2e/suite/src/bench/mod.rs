//! `load-bench` (issue 12): load-control's figures from one sitting, as JSON lines. A PostgreSQL
//! of its own at the durable defaults, the release api-server and one standalone operator, PG-05
//! as strict as NiFi, `pgbench -N` as the ceiling, then the scenarios of [`scenarios`].
pub mod aged;
pub mod client;
pub mod cost;
pub mod mirror;
pub mod procstat;
pub mod scenarios;

use crate::nifi::receiver::{Behaviour, DispatchKind, Receiver};
use crate::standalone::{PgServer, Service, database_keys, free_port, hash_token, wait_http_ok};
use anyhow::Context;
use client::Client;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{Notify, mpsc};
use uuid::Uuid;

pub const NIFI_TOKEN: &str = "bench-nifi-token";
pub const OPERATOR_TOKEN: &str = "bench-operator-token";
pub const JOB_KEY: &str = "BENCH";

/// A unit of work the lifecycle clients take from their queue.
#[derive(Debug)]
pub enum Work {
    /// PG-10: create run n and register its manifest.
    Create(usize),
    /// PG-20: claim a partition (its chunks follow as their own work).
    Partition {
        run: Uuid,
        pid: String,
        path: String,
        rows: u64,
    },
    /// PG-20: one chunk report.
    Chunk {
        run: Uuid,
        pid: String,
        path: String,
        token: Uuid,
        index: usize,
        count: usize,
        rows: u64,
    },
    /// PG-05 received VALIDATE_RUN: PG-40, PG-50, PG-60.
    Validate { run: Uuid, dispatch: Uuid },
}

/// Where the system's dispatches go: every arrival is timed; VALIDATE_RUN becomes work while a
/// lifecycle scenario listens.
#[derive(Default)]
pub struct Dispatches {
    pub arrivals: Mutex<HashMap<Uuid, SystemTime>>,
    pub arrived: Notify,
    pub sink: Mutex<Option<async_channel::Sender<Work>>>,
}

pub struct Options {
    /// Where `load-control-api` and `load-control-operator` are.
    pub bin_dir: PathBuf,
    /// `database.pool_size` of both processes.
    pub pool_size: u32,
    /// Preload pg_stat_statements, to report where PostgreSQL's time goes.
    pub statements: bool,
    /// More PostgreSQL server options (`-c name=value …`), for tuning experiments.
    pub pg_options: String,
    /// More configuration of both processes, YAML lines appended to the file (the aged scenario
    /// turns history retention off while it measures).
    pub extra_config: String,
    /// The pools through PgBouncer in transaction mode (scripts/pgbouncer-up) holding
    /// `pool_size` server connections; LISTEN, the leader's lock and the migration direct.
    pub through_pgbouncer: bool,
}

pub struct Bench {
    pub pg: PgServer,
    pub db_url: String,
    pub api: Service,
    /// More api-servers on the same ledger (the scale scenario), each with its base URL.
    pub replicas: Vec<(Service, String)>,
    pub operator: Service,
    pub client: Client,
    pub dispatches: Arc<Dispatches>,
    _receiver: Receiver,
    pub logs: PathBuf,
    /// The configuration file both processes run with.
    pub config: PathBuf,
    pub bin_dir: PathBuf,
}

impl Bench {
    pub async fn start(opts: &Options) -> anyhow::Result<Bench> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let api_bin = opts.bin_dir.join("load-control-api");
        let op_bin = opts.bin_dir.join("load-control-operator");
        for b in [&api_bin, &op_bin] {
            anyhow::ensure!(
                b.exists(),
                "{} missing (scripts/bench builds it)",
                b.display()
            );
        }
        // pg_stat_statements is always loaded: the WAL each scenario writes per request comes
        // from it (`scenarios::WalProbe`); `--statements` adds nested statements to the profile.
        let mut options = opts.pg_options.clone();
        options.push_str(" -c shared_preload_libraries=pg_stat_statements");
        // `top` (the default) otherwise, left off the command line so that a scenario can
        // change it with ALTER SYSTEM (the cost scenario counts a report's nested statements).
        if opts.statements {
            options.push_str(" -c pg_stat_statements.track=all");
        }
        let pg = PgServer::start_with("bench", true, &options)?;
        let db_url = pg.create_db("bench")?;
        {
            let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db_url).await?;
            sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .execute(&mut c)
                .await?;
        }
        let logs = std::env::temp_dir().join(format!(
            "lc-bench-logs-{}",
            &Uuid::new_v4().simple().to_string()[..8]
        ));
        std::fs::create_dir_all(&logs)?;
        let dispatches = Arc::new(Dispatches::default());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let receiver = Receiver::start("127.0.0.1:0", "", Behaviour::default(), tx).await?;
        let sink = dispatches.clone();
        tokio::spawn(async move {
            while let Some(d) = rx.recv().await {
                sink.arrivals
                    .lock()
                    .unwrap()
                    .insert(d.run_id, d.received_at);
                sink.arrived.notify_waiters();
                let target = sink.sink.lock().unwrap().clone();
                if let (DispatchKind::Validate, Some(t)) = (d.kind, target) {
                    let _ = t.try_send(Work::Validate {
                        run: d.run_id,
                        dispatch: d.dispatch_id,
                    });
                }
            }
        });
        let api_port = free_port();
        let pooled = match opts.through_pgbouncer {
            true => Some(pg.through_pgbouncer(&db_url, opts.pool_size)?),
            false => None,
        };
        let database = database_keys(&db_url, pooled.as_deref(), opts.pool_size);
        let config = logs.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "server: {{host: 127.0.0.1, port: {api_port}, timeout_graceful_shutdown: 1}}\n\
                 database: {{{database}}}\n\
                 auth: {{tokens: [{{name: bench-nifi, role: nifi, sha256: {nifi}}}, \
                                  {{name: bench-operator, role: operator, sha256: {operator}}}]}}\n\
                 nifi: {{receiver_url: \"http://{receiver}\"}}\n\
                 worker: {{metrics_port: null}}\n\
                 logging: {{format: json, level: INFO}}\n{extra}",
                nifi = hash_token(&api_bin, NIFI_TOKEN)?,
                operator = hash_token(&api_bin, OPERATOR_TOKEN)?,
                receiver = receiver.addr,
                extra = opts.extra_config,
            ),
        )?;
        let cfg = config.to_str().context("config path")?;
        let migrated = Command::new(&api_bin)
            .args(["--config", cfg, "migrate"])
            .stdout(Stdio::null())
            .status()?;
        anyhow::ensure!(migrated.success(), "load-control-api migrate failed");
        let mut api = Service::new("api", api_bin, &["--config", cfg, "serve"], &[], &logs);
        let mut operator = Service::new(
            "operator",
            op_bin,
            &["--standalone", "--config", cfg],
            // One installation, whichever mode its operator runs in (the mirror scenario adds
            // one in Kubernetes mode on the same ledger): not two releases sharing a ledger.
            &[("POD_NAME", "bench-operator"), ("LC_INSTALLATION", "bench")],
            &logs,
        );
        api.start()?;
        operator.start()?;
        let base = format!("http://127.0.0.1:{api_port}");
        wait_http_ok(&format!("{base}/readyz"), Duration::from_secs(30)).await?;
        let bench = Bench {
            client: Client::new(&base, NIFI_TOKEN, OPERATOR_TOKEN)?,
            pg,
            db_url,
            api,
            replicas: Vec::new(),
            operator,
            dispatches,
            _receiver: receiver,
            config: config.clone(),
            bin_dir: opts.bin_dir.clone(),
            logs,
        };
        bench.await_leader(Duration::from_secs(30)).await?;
        Ok(bench)
    }

    /// The operator holds an epoch: the dispatcher is running.
    pub async fn await_leader(&self, limit: Duration) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if self
                .sql_i64("SELECT count(*) FROM nifi_ops.leader_epoch")
                .await?
                > 0
            {
                return Ok(());
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the operator took no leadership within {limit:?}: {}",
                self.operator.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn db(&self) -> anyhow::Result<sqlx::PgConnection> {
        use sqlx::Connection;
        Ok(sqlx::PgConnection::connect(&self.db_url).await?)
    }

    pub async fn sql_i64(&self, query: &'static str) -> anyhow::Result<i64> {
        let (v,): (i64,) = sqlx::query_as(query)
            .fetch_one(&mut self.db().await?)
            .await?;
        Ok(v)
    }

    /// `n` api-servers in all (the first is `api`), started as needed and left running: a client
    /// for each, counted in one `Stats`.
    pub async fn api_replicas(&mut self, n: usize) -> anyhow::Result<Vec<Client>> {
        let api_bin = self.bin_dir.join("load-control-api");
        let cfg = self.config.to_str().context("config path")?.to_string();
        while self.replicas.len() + 1 < n {
            let port = free_port();
            let name = format!("api-{}", self.replicas.len() + 2);
            let port_text = port.to_string();
            let mut api = Service::new(
                &name,
                api_bin.clone(),
                &["--config", &cfg, "serve"],
                &[("LCA_SERVER__PORT", &port_text)],
                &self.logs,
            );
            api.start()?;
            let base = format!("http://127.0.0.1:{port}");
            wait_http_ok(&format!("{base}/readyz"), Duration::from_secs(30))
                .await
                .with_context(|| format!("{name}: {}", api.log_tail(20)))?;
            self.replicas.push((api, base));
        }
        let first = self.client.fresh();
        let mut clients = vec![first.clone()];
        clients.extend(
            self.replicas
                .iter()
                .take(n.saturating_sub(1))
                .map(|(_, base)| first.with_base(base)),
        );
        Ok(clients)
    }

    /// CPU seconds so far of each api-server (`api` first, then the replicas).
    pub fn api_cpu(&self) -> Vec<f64> {
        std::iter::once(&self.api)
            .chain(self.replicas.iter().map(|(s, _)| s))
            .map(|s| s.pid().map_or(0.0, procstat::tree_cpu_seconds))
            .collect()
    }

    /// CPU seconds so far of (the api-server, PostgreSQL).
    pub fn cpu(&self) -> (f64, f64) {
        (
            self.api.pid().map_or(0.0, procstat::tree_cpu_seconds),
            self.pg
                .postmaster_pid()
                .map_or(0.0, procstat::tree_cpu_seconds),
        )
    }

    /// Stops the processes; the logs stay only when asked (`keep_logs`).
    pub fn stop(mut self, keep_logs: bool) {
        self.operator.stop();
        self.api.stop();
        for (replica, _) in &mut self.replicas {
            replica.stop();
        }
        if keep_logs {
            eprintln!("load-bench: logs kept in {}", self.logs.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.logs);
        }
    }
}

//! load-control without Kubernetes, as real processes the chaos suite can kill: a PostgreSQL of
//! its own (so it can be restarted), the api-server binary, and standalone operator binaries.
//! Binaries come from the Cargo target directory this test runs from (`scripts/test` builds
//! them all).
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `target/debug` (or wherever the running test binary was built).
pub fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .context("target directory")?;
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} missing: build it (cargo build -p load-control-api -p load-control-operator)",
            path.display()
        );
    }
    Ok(path)
}

pub use testkit::free_port;

/// A private PostgreSQL (scripts/pg-up with its own data directory and port).
pub struct PgServer {
    pub(crate) dir: PathBuf,
    pub(crate) port: u16,
    durable: bool,
    options: String,
    pub admin_url: String,
}

impl PgServer {
    /// Without fsync: test data only.
    pub fn start(name: &str) -> anyhow::Result<PgServer> {
        PgServer::start_with(name, false, "")
    }

    /// `durable`: PostgreSQL's durable defaults (fsync, synchronous_commit), for benchmarks.
    /// `options`: more server options (`-c name=value …`).
    pub fn start_with(name: &str, durable: bool, options: &str) -> anyhow::Result<PgServer> {
        let mut pg = PgServer::unstarted(name, durable, options)?;
        pg.admin_url = pg.up()?;
        Ok(pg)
    }

    /// A data directory and a port, nothing initialized or started yet.
    pub(crate) fn unstarted(name: &str, durable: bool, options: &str) -> anyhow::Result<PgServer> {
        let dir = std::env::temp_dir().join(format!(
            "lc-{name}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(PgServer {
            dir,
            port: free_port(),
            durable,
            options: options.to_string(),
            admin_url: String::new(),
        })
    }

    pub(crate) fn script(&self, script: &str, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(repo().join("scripts").join(script))
            .args(args)
            .env("LC_PGDATA", &self.dir)
            .env("LC_PGPORT", self.port.to_string())
            .env("LC_PG_DURABLE", if self.durable { "1" } else { "0" })
            .env("LC_PG_OPTIONS", &self.options)
            .stderr(Stdio::inherit())
            .output()?;
        if !out.status.success() {
            bail!("scripts/{script} failed: {}", out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    pub(crate) fn up(&self) -> anyhow::Result<String> {
        self.script("pg-up", &[])
    }

    /// Stops the server (fast shutdown: every connection is cut) and starts it again on the same
    /// port; returns how long it was away.
    pub fn restart(&self) -> anyhow::Result<Duration> {
        let t = Instant::now();
        self.script("pg-down", &[])?;
        self.up()?;
        Ok(t.elapsed())
    }

    /// The postmaster's process id (first line of `postmaster.pid`).
    pub fn postmaster_pid(&self) -> anyhow::Result<u32> {
        let text = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))?;
        Ok(text
            .lines()
            .next()
            .context("empty postmaster.pid")?
            .trim()
            .parse()?)
    }

    /// A fresh database on this server; its URL.
    pub fn create_db(&self, db: &str) -> anyhow::Result<String> {
        let out = Command::new("psql")
            .arg(&self.admin_url)
            .args(["-qc", &format!("CREATE DATABASE {db}")])
            .output()?;
        if !out.status.success() {
            bail!("creating {db}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(format!(
            "{}/{db}",
            self.admin_url
                .rsplit_once('/')
                .expect("URL with a database")
                .0
        ))
    }

    /// `db_url` (a database of this server) through a PgBouncer in transaction mode in front of
    /// it (scripts/pgbouncer-up, started on first use) whose pools hold `pool_size` server
    /// connections per database and user. The pooler stays up across [`PgServer::restart`], as
    /// a CloudNativePG `Pooler` does while its cluster fails over.
    pub fn through_pgbouncer(&self, db_url: &str, pool_size: u32) -> anyhow::Result<String> {
        let out = Command::new(repo().join("scripts/pgbouncer-up"))
            .env("LC_PGDATA", &self.dir)
            .env("LC_TEST_PG_URL", &self.admin_url)
            .env("LC_PGBOUNCER_POOL_SIZE", pool_size.to_string())
            .stderr(Stdio::inherit())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "scripts/pgbouncer-up failed: {}",
            out.status
        );
        let pooler = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let (base, _) = pooler
            .rsplit_once('/')
            .context("pooler URL with a database")?;
        let (_, db) = db_url.rsplit_once('/').context("URL with a database")?;
        Ok(format!("{base}/{db}"))
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self.script("pgbouncer-down", &[]);
        let _ = self.script("pg-down", &["--purge"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `database:` keys (inside the braces) of a process on the database at `direct` with
/// `pool_size` connections: the pool through `pooled` when given, LISTEN, the standalone leader's
/// lock and the migration then straight to `direct`, as behind a transaction pooler they must be.
pub fn database_keys(direct: &str, pooled: Option<&str>, pool_size: u32) -> String {
    match pooled {
        Some(pooled) => format!(
            "url: \"{pooled}\", listen_dsn: \"{direct}\", migration_url: \"{direct}\", pool_size: {pool_size}"
        ),
        None => format!("url: \"{direct}\", pool_size: {pool_size}"),
    }
}

/// A process that can be killed and started again with the same command line.
pub struct Service {
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
    pub starts: u32,
}

impl Service {
    pub fn new(
        name: &str,
        program: PathBuf,
        args: &[&str],
        env: &[(&str, &str)],
        log_dir: &Path,
    ) -> Service {
        Service {
            name: name.to_string(),
            program,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log: log_dir.join(format!("{name}.log")),
            child: None,
            starts: 0,
        }
    }

    pub fn start(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.name))?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as a crash: nothing is flushed or released.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (a clean stop).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            let _ = c.wait();
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until `url` answers 200.
pub async fn wait_http_ok(url: &str, limit: Duration) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(r) = client.get(url).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{url} did not answer 200 within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `load-control-api hash-token`: the digest the configuration holds for `token`.
pub fn hash_token(api_bin: &Path, token: &str) -> anyhow::Result<String> {
    use std::io::Write;
    let mut c = Command::new(api_bin)
        .arg("hash-token")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    c.stdin
        .take()
        .context("stdin")?
        .write_all(token.as_bytes())?;
    Ok(String::from_utf8(c.wait_with_output()?.stdout)?
        .trim()
        .to_string())
}

/// The token the standalone system accepts with the nifi role.
pub const NIFI_TOKEN: &str = "standalone-nifi-token";

/// A whole standalone load-control: its own PostgreSQL and ledger, one api-server and two
/// operators (leader and standby), configured for fast recovery (REISSUE mode, stale 4 s,
/// sweeper every second, short dispatch lease and backoff) so faults resolve within seconds.
pub struct System {
    /// The private PostgreSQL the system was started with (None: a database given by the caller,
    /// e.g. a replicated pair behind a moving address).
    pub pg: Option<PgServer>,
    pub db_url: String,
    pub api: Service,
    pub ops: [Service; 2],
    /// `http://127.0.0.1:<port>`
    pub base: String,
    /// Where load-control sends dispatches (`http://127.0.0.1:<receiver_port>/pg05`).
    pub receiver_port: u16,
    pub logs: PathBuf,
}

impl System {
    pub async fn start(name: &str) -> anyhow::Result<System> {
        let pg = PgServer::start(name)?;
        let db_url = pg.create_db(name)?;
        System::start_on(name, db_url, Some(pg), "").await
    }

    /// [`System::start`] with more keys in the `nifi:` section of the configuration
    /// (`, signing_keys: [{id: k1, secret: "…"}]`).
    pub async fn start_with_nifi(name: &str, nifi: &str) -> anyhow::Result<System> {
        let pg = PgServer::start(name)?;
        let db_url = pg.create_db(name)?;
        System::start_configured(name, db_url, Some(pg), "", nifi).await
    }

    /// The same system on the database at `db_url`; `database` adds keys to the `database:`
    /// section of the configuration (`, pool_max_lifetime: 30s`).
    pub async fn start_on(
        name: &str,
        db_url: String,
        pg: Option<PgServer>,
        database: &str,
    ) -> anyhow::Result<System> {
        System::start_configured(name, db_url, pg, database, "").await
    }

    async fn start_configured(
        name: &str,
        db_url: String,
        pg: Option<PgServer>,
        database: &str,
        nifi: &str,
    ) -> anyhow::Result<System> {
        let logs = std::env::temp_dir().join(format!(
            "lc-{name}-logs-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        std::fs::create_dir_all(&logs)?;
        let (api_port, receiver_port) = (free_port(), free_port());
        // Behind a transaction pooler the pools go through it; LISTEN, the standalone leader's
        // advisory lock and the migrations keep their sessions on direct connections.
        let pooled = match &pg {
            Some(pg) if testkit::pooler_url().is_some() => Some(pg.through_pgbouncer(&db_url, 8)?),
            _ => None,
        };
        let database = format!("{}{database}", database_keys(&db_url, pooled.as_deref(), 8));
        let api_bin = bin("load-control-api")?;
        let digest = hash_token(&api_bin, NIFI_TOKEN)?;
        let config = logs.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "server: {{host: 127.0.0.1, port: {api_port}, timeout_graceful_shutdown: 1}}\n\
             database: {{{database}}}\n\
             auth: {{tokens: [{{name: sim-nifi, role: nifi, sha256: {digest}}}]}}\n\
             nifi: {{receiver_url: \"http://127.0.0.1:{receiver_port}\", timeout_seconds: 2{nifi}}}\n\
             recovery: {{mode: REISSUE, stale: 4s, extract_query_timeout: 2s, sweeper_interval: 1s, publish_stale: 20s, max_attempts: 4}}\n\
             dispatch: {{lease: 5s, poll_interval: 1s, backoff_min: 1s, backoff_max: 3s, ack_timeout: 10s, max_attempts: 60}}\n\
             worker: {{metrics_port: null}}\n\
             logging: {{format: text, level: INFO, access_log: false}}\n"
            ),
        )?;
        let cfg = config.to_str().context("config path")?;
        let migrated = Command::new(&api_bin)
            .args(["--config", cfg, "migrate"])
            .status()?;
        anyhow::ensure!(migrated.success(), "load-control-api migrate failed");
        let mut api = Service::new("api", api_bin, &["--config", cfg, "serve"], &[], &logs);
        let op_bin = bin("load-control-operator")?;
        let mut ops = [
            Service::new(
                "op-a",
                op_bin.clone(),
                &["--standalone", "--config", cfg],
                &[("POD_NAME", "op-a")],
                &logs,
            ),
            Service::new(
                "op-b",
                op_bin,
                &["--standalone", "--config", cfg],
                &[("POD_NAME", "op-b")],
                &logs,
            ),
        ];
        api.start()?;
        for o in &mut ops {
            o.start()?;
        }
        let base = format!("http://127.0.0.1:{api_port}");
        wait_http_ok(&format!("{base}/readyz"), Duration::from_secs(20)).await?;
        Ok(System {
            pg,
            db_url,
            api,
            ops,
            base,
            receiver_port,
            logs,
        })
    }

    /// nifi-sim (the binary at `sim`) against this system, in the background, with NiFi's retry
    /// schedule shrunk to the suites' scale (7.5 s of waits in all).
    pub fn simulate(&self, sim: &str, job: &str, args: &[&str]) -> tokio::process::Child {
        tokio::process::Command::new(sim)
            .args([
                "--api",
                &self.base,
                "--token",
                NIFI_TOKEN,
                "--retry-scale",
                &crate::nifi::api::RetrySchedule::TEST_SCALE.to_string(),
                "--receiver-listen",
                &format!("127.0.0.1:{}", self.receiver_port),
                "--job",
                job,
            ])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("nifi-sim starts")
    }

    /// The leader epoch last issued and its holder (None before the first leader, or while the
    /// database is away).
    async fn leader_row(&self) -> Option<(i64, String)> {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&self.db_url).await.ok()?;
        sqlx::query_as("SELECT epoch, holder FROM nifi_ops.leader_epoch")
            .fetch_one(&mut c)
            .await
            .ok()
    }

    /// The process id of the operator holding the current epoch (identity `<name>:<pid>-<rand>`).
    pub async fn leader_pid(&self) -> Option<u32> {
        let (_, holder) = self.leader_row().await?;
        holder.split(':').nth(1)?.split('-').next()?.parse().ok()
    }

    /// The leader epoch last issued.
    pub async fn leader_epoch(&self) -> Option<i64> {
        Some(self.leader_row().await?.0)
    }

    /// Whether the api-server and both operators still run as the processes started first
    /// (none exited, none was restarted).
    pub fn all_alive_since_start(&mut self) -> Result<(), String> {
        for s in std::iter::once(&mut self.api).chain(self.ops.iter_mut()) {
            if s.starts != 1 {
                return Err(format!("{} was started {} times", s.name, s.starts));
            }
            if let Some(c) = s.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                return Err(format!("{} exited ({status}):\n{}", s.name, s.log_tail(20)));
            }
        }
        Ok(())
    }

    /// Stops every process cleanly and removes the logs (kept when a test panics first).
    pub fn stop(mut self) {
        for o in &mut self.ops {
            o.stop();
        }
        self.api.stop();
        let _ = std::fs::remove_dir_all(&self.logs);
    }
}

/// The summary line nifi-sim printed on its standard output.
pub async fn sim_summary(child: tokio::process::Child) -> serde_json::Value {
    let out = child.wait_with_output().await.expect("nifi-sim ends");
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or(""))
        .unwrap_or_else(|_| panic!("nifi-sim printed no summary ({}): {text}", out.status))
}

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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A private PostgreSQL (scripts/pg-up with its own data directory and port).
pub struct PgServer {
    dir: PathBuf,
    port: u16,
    pub admin_url: String,
}

impl PgServer {
    pub fn start(name: &str) -> anyhow::Result<PgServer> {
        let dir = std::env::temp_dir().join(format!(
            "lc-{name}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        std::fs::create_dir_all(&dir)?;
        let port = free_port();
        let mut pg = PgServer {
            dir,
            port,
            admin_url: String::new(),
        };
        pg.admin_url = pg.up()?;
        Ok(pg)
    }

    fn script(&self, script: &str, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(repo().join("scripts").join(script))
            .args(args)
            .env("LC_PGDATA", &self.dir)
            .env("LC_PGPORT", self.port.to_string())
            .stderr(Stdio::inherit())
            .output()?;
        if !out.status.success() {
            bail!("scripts/{script} failed: {}", out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn up(&self) -> anyhow::Result<String> {
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
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self.script("pg-down", &["--purge"]);
        let _ = std::fs::remove_dir_all(&self.dir);
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

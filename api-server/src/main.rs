//! `load-control-api`: the NiFi- and operator-facing HTTP API of load-control.
use anyhow::Context;
use clap::{Parser, Subcommand};
use load_control_api::config::{Config, config_path};
use load_control_api::{auth, logging, server};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "load-control-api",
    version,
    about = "load-control HTTP API: decides, exactly once, the state of NiFi Oracle→Hive loads.",
    long_about = "load-control HTTP API.\n\nConfiguration: --config PATH, else $LCA_CONFIG, else ./config/config.yaml. \
Any key can be overridden with LCA_<SECTION>__<KEY> (e.g. LCA_SERVER__PORT=9090); DATABASE_URL supplies \
database.url when nothing else does. Unknown keys refuse to start."
)]
struct Cli {
    /// YAML configuration file.
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve {
        /// Apply pending migrations before listening.
        #[arg(long)]
        migrate: bool,
        /// Override server.host.
        #[arg(long)]
        host: Option<String>,
        /// Override server.port.
        #[arg(long)]
        port: Option<i64>,
        /// This release's installation, as its operator claims the ledger (the chart sets both
        /// from `<namespace>/<lease name>`). While another installation holds a fresh claim on
        /// the ledger database, /readyz answers 503: two releases must not share one ledger, and
        /// the refused release's API leaves its Service with its operator (docs/operations.md).
        /// Without it, no such check.
        #[arg(long, env = "LC_INSTALLATION", value_name = "NAME")]
        installation: Option<String>,
        /// How long another installation's claim outlives its last refresh. Default: as the
        /// operator's, 3 × LC_LEASE_DURATION (15 s when unset), at least 60 s.
        #[arg(long, env = "LC_LEDGER_OWNER_STALE", value_parser = parse_duration_arg)]
        ledger_owner_stale: Option<std::time::Duration>,
        /// The release's leader lease duration (the chart sets it for both containers); only
        /// the default of --ledger-owner-stale derives from it.
        #[arg(long, env = "LC_LEASE_DURATION", default_value = "15s", value_parser = parse_duration_arg, hide = true)]
        lease_duration: std::time::Duration,
    },
    /// Apply the ledger schema migrations (schema nifi_ops); safe to run twice or concurrently.
    Migrate,
    /// Print the SHA-256 digest of a token read from standard input (for auth.tokens[].sha256).
    HashToken,
    /// Check that a running load-control API answers: GET <URL>/readyz must answer 200 and
    /// <URL>/openapi.json a JSON document; with a token, an authenticated read
    /// (GET /v1/monitor/summary) must answer 200; each --metrics URL must serve Prometheus text.
    /// Retries until --timeout; exit 0 when all hold. Used by the Helm chart's `helm test` hook;
    /// needs no configuration file.
    Probe {
        /// Base URL of the API, e.g. http://load-control:8080
        url: String,
        /// Seconds to keep trying before giving up.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
        /// Bearer token (nifi or operator role) for the authenticated read; from the environment
        /// so that it never shows in a process listing.
        #[arg(long, env = "LC_PROBE_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// A /metrics URL to scrape as well (repeatable).
        #[arg(long, value_name = "URL")]
        metrics: Vec<String>,
        /// PEM bundle of the CA that signed the API's certificate (https URLs).
        #[arg(long, value_name = "PATH")]
        ca_file: Option<PathBuf>,
    },
}

fn parse_duration_arg(s: &str) -> Result<std::time::Duration, String> {
    ledger::settings::parse_duration(s)
        .ok_or_else(|| format!("{s:?} is not a duration (7d, 36h, P14D, or seconds)"))
}

/// What `probe` checks besides readiness and the document.
struct ProbeChecks<'a> {
    token: Option<&'a str>,
    metrics: &'a [String],
}

/// One attempt of `probe`: every check, or the first failure in words.
async fn probe_once(
    client: &reqwest::Client,
    base: &str,
    checks: &ProbeChecks<'_>,
) -> Result<String, String> {
    let ready = client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .map_err(|e| format!("GET {base}/readyz: {e}"))?;
    if ready.status() != reqwest::StatusCode::OK {
        return Err(format!("GET {base}/readyz answered {}", ready.status()));
    }
    let doc = client
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .map_err(|e| format!("GET {base}/openapi.json: {e}"))?;
    let status = doc.status();
    let doc: serde_json::Value = doc
        .json()
        .await
        .map_err(|e| format!("GET {base}/openapi.json: not JSON ({e})"))?;
    let version = doc["info"]["version"].as_str().unwrap_or("?").to_string();
    if status != reqwest::StatusCode::OK {
        return Err(format!("GET {base}/openapi.json answered {status}"));
    }
    let mut done = format!("{base} is ready (API version {version})");
    if let Some(token) = checks.token.filter(|t| !t.is_empty()) {
        let summary = client
            .get(format!("{base}/v1/monitor/summary"))
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| format!("GET {base}/v1/monitor/summary: {e}"))?;
        if summary.status() != reqwest::StatusCode::OK {
            return Err(format!(
                "GET {base}/v1/monitor/summary with the token answered {} (is the token in auth.tokens?)",
                summary.status()
            ));
        }
        done.push_str("; the token reads");
    }
    for url in checks.metrics {
        let m = client
            .get(url)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        let status = m.status();
        let text = m.text().await.unwrap_or_default();
        if status != reqwest::StatusCode::OK || !text.contains("# TYPE lca_") {
            return Err(format!("GET {url} answered {status} without lca_ series"));
        }
        done.push_str(&format!("; {url} scraped"));
    }
    Ok(done)
}

async fn probe(
    url: &str,
    timeout: u64,
    checks: ProbeChecks<'_>,
    ca_file: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder().timeout(std::time::Duration::from_secs(5));
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("{} holds no PEM certificate", path.display()))?
        {
            builder = builder.add_root_certificate(cert);
        }
    }
    let client = builder.build()?;
    let base = url.trim_end_matches('/');
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout);
    loop {
        match probe_once(&client, base, &checks).await {
            Ok(message) => {
                println!("{message}");
                return Ok(());
            }
            // A Service whose endpoints are not Ready yet refuses connections: keep trying.
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("load-control-api probe: {e}; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => anyhow::bail!("{e} (gave up after {timeout}s)"),
        }
    }
}

fn load(cli: &Cli) -> anyhow::Result<Config> {
    let path = config_path(cli.config.as_deref());
    let config = Config::load(&path, std::env::vars())?;
    Ok(config)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match &cli.command {
        Command::Probe {
            url,
            timeout,
            token,
            metrics,
            ca_file,
        } => {
            let checks = ProbeChecks {
                token: token.as_deref(),
                metrics,
            };
            probe(url, *timeout, checks, ca_file.as_deref()).await
        }
        Command::HashToken => {
            let mut token = String::new();
            std::io::stdin()
                .read_to_string(&mut token)
                .context("reading the token from stdin")?;
            let token = token.trim_end_matches(['\r', '\n']);
            anyhow::ensure!(!token.is_empty(), "no token on standard input");
            println!("{}", auth::sha256_hex(token));
            Ok(())
        }
        Command::Migrate => {
            let config = load(&cli)?;
            config.validate()?;
            logging::init(&config.logging, "server", &config.secrets())
                .map_err(anyhow::Error::msg)?;
            let version = ledger::migrate::run_migrations_granting(
                &config.migration_dsn(),
                config.database.runtime_role.as_deref(),
            )
            .await
            .context("applying migrations")?;
            tracing::info!(
                event = "migrations_applied",
                schema_version = version,
                binary_schema_version = ledger::SCHEMA_VERSION,
                "ledger schema is up to date"
            );
            Ok(())
        }
        Command::Serve {
            migrate,
            host,
            port,
            installation,
            ledger_owner_stale,
            lease_duration,
        } => {
            let mut config = load(&cli)?;
            if let Some(h) = host {
                config.server.host = h.clone();
            }
            if let Some(p) = port {
                config.server.port = *p;
            }
            config.validate()?;
            // Unreadable certificates, keys or tokens files stop the start here, before migrations run.
            load_control_api::tls::server_config(&config.server)?;
            if let Some(path) = &config.auth.tokens_file {
                server::read_tokens_file(path)?;
            }
            logging::init(&config.logging, "server", &config.secrets())
                .map_err(anyhow::Error::msg)?;
            if *migrate {
                ledger::migrate::run_migrations_granting(
                    &config.migration_dsn(),
                    config.database.runtime_role.as_deref(),
                )
                .await
                .context("applying migrations")?;
            }
            let mut ledger = server::connect_ledger(&config)
                .await
                .context("connecting to the database")?;
            if let Some(installation) = installation {
                let stale = ledger_owner_stale
                    .unwrap_or_else(|| ledger::default_owner_stale(*lease_duration));
                ledger = ledger.with_installation(installation, stale);
            }
            let addr = format!("{}:{}", config.server.host, config.server.port);
            let listener = tokio::net::TcpListener::bind(&addr)
                .await
                .with_context(|| format!("binding {addr}"))?;
            let db = config
                .database_url()
                .rsplit('/')
                .next()
                .unwrap_or("")
                .split('?')
                .next()
                .unwrap_or("")
                .to_string();
            tracing::info!(event = "api_started", host = %config.server.host, port = config.server.port, database = %db, "load-control API listening");
            server::serve(config, ledger, listener, server::shutdown_signal()).await
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load-control-api: {e:#}");
            ExitCode::FAILURE
        }
    }
}

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
    },
    /// Apply the ledger schema migrations (schema nifi_ops); safe to run twice or concurrently.
    Migrate,
    /// Print the SHA-256 digest of a token read from standard input (for auth.tokens[].sha256).
    HashToken,
    /// Check that a running load-control API answers: GET <URL>/readyz must answer 200 and
    /// <URL>/openapi.json a JSON document. Retries until --timeout; exit 0 when both hold. Used by
    /// the Helm chart's `helm test` hook; needs no configuration file.
    Probe {
        /// Base URL of the API, e.g. http://load-control:8080
        url: String,
        /// Seconds to keep trying before giving up.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
}

/// One attempt of `probe`: both checks, or the first failure in words.
async fn probe_once(client: &reqwest::Client, base: &str) -> Result<String, String> {
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
    Ok(format!("{base} is ready (API version {version})"))
}

async fn probe(url: &str, timeout: u64) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .build()?;
    let base = url.trim_end_matches('/');
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout);
    loop {
        match probe_once(&client, base).await {
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
        Command::Probe { url, timeout } => probe(url, *timeout).await,
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
            logging::init(&config.logging);
            ledger::migrate::run_migrations(&config.migration_url())
                .await
                .context("applying migrations")?;
            tracing::info!(event = "migrations_applied", "ledger schema is up to date");
            Ok(())
        }
        Command::Serve {
            migrate,
            host,
            port,
        } => {
            let mut config = load(&cli)?;
            if let Some(h) = host {
                config.server.host = h.clone();
            }
            if let Some(p) = port {
                config.server.port = *p;
            }
            config.validate()?;
            // Unreadable certificates or keys stop the start here, before migrations run.
            load_control_api::tls::server_config(&config.server)?;
            logging::init(&config.logging);
            if *migrate {
                ledger::migrate::run_migrations(&config.migration_url())
                    .await
                    .context("applying migrations")?;
            }
            let ledger = server::connect_ledger(&config)
                .await
                .context("connecting to the database")?;
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

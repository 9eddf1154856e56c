//! `ledger-check`: reads a load-control ledger and reports every broken invariant as JSON (see
//! `e2e::check` for the rules). Exit status 1 when any is found, 2 when the ledger cannot be read.
use clap::Parser;
use sqlx::Connection;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ledger-check",
    version,
    about = "Checks a load-control ledger for broken invariants (one active run per key, complete SUCCESS runs, one owner per claim, explained states, final terminal states, one publish claim, counters that match partitions)."
)]
struct Cli {
    /// PostgreSQL URL of the ledger.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Only runs of this job key (repeatable).
    #[arg(long = "job")]
    jobs: Vec<String>,
    /// Active runs whose heartbeat is older than this many seconds must be explained
    /// (PUBLISH_UNKNOWN or a DEAD dispatch); 0 once the load has settled.
    #[arg(long, default_value_t = 0.0)]
    stale_after: f64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let scope = e2e::check::Scope {
        job_keys: cli.jobs,
        stale_after_seconds: cli.stale_after,
    };
    let report = match sqlx::PgConnection::connect(&cli.database_url).await {
        Ok(mut conn) => e2e::check::check(&mut conn, &scope).await,
        Err(e) => Err(e),
    };
    match report {
        Ok(r) => {
            println!("{}", serde_json::to_string(&r).expect("JSON"));
            if r.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("ledger-check: {e}");
            ExitCode::from(2)
        }
    }
}

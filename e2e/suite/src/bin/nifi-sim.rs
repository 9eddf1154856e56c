//! `nifi-sim`: drives whole loads through a running load-control as NiFi would, and prints one
//! JSON summary line. Exit status 1 when the contract was broken (an anomaly, a dispatch PG-05
//! would refuse, a run that never reached a final state).
use clap::{Parser, Subcommand};
use e2e::nifi::api::{Bearer, NifiClient, RetrySchedule};
use e2e::nifi::faults::Faults;
use e2e::nifi::receiver::Behaviour;
use e2e::nifi::{Plan, Simulation};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "nifi-sim",
    version,
    about = "NiFi simulator for load-control: PG-05 (strict) and PG-10…PG-90 over the real HTTP API, with fault injection."
)]
struct Cli {
    /// load-control API base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    api: String,
    /// Bearer token with the nifi role.
    #[arg(
        long,
        env = "NIFI_SIM_TOKEN",
        hide_env_values = true,
        required_unless_present = "token_file"
    )]
    token: Option<String>,
    /// A file holding the bearer token, read again before every call (a token rotated under a
    /// running flow). Instead of --token. Replace it by a rename: a call that reads a file being
    /// rewritten in place can send an empty token.
    #[arg(long, conflicts_with = "token")]
    token_file: Option<std::path::PathBuf>,
    /// PEM file of the only CA trusted for an https --api (NiFi's truststore).
    #[arg(long)]
    ca_file: Option<std::path::PathBuf>,
    /// Where --api's host name is reached (IP:PORT), as DNS would answer it; the certificate is
    /// still checked against the name.
    #[arg(long)]
    api_address: Option<std::net::SocketAddr>,
    /// Retries of a call answered 5xx or not at all (the relationships' Number of Retry Attempts).
    #[arg(long, default_value_t = RetrySchedule::NIFI.count)]
    retries: u32,
    /// Seconds before the first retry (the processor's Penalty Duration; NiFi's default 30).
    /// Each next retry waits twice as long, up to --retry-max-backoff (docs/nifi.md).
    #[arg(long, default_value_t = 30.0)]
    retry_penalty: f64,
    /// The longest wait before a retry, in seconds (the flows' Max Back Off Period).
    #[arg(long, default_value_t = 60.0)]
    retry_max_backoff: f64,
    /// Multiplies every retry wait: 1 is NiFi's own time (30 s, 60 s ×4: 4.5 min); the test
    /// suites pass 1/36 (7.5 s in all).
    #[arg(long, default_value_t = 1.0)]
    retry_scale: f64,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run loads (the default).
    Run,
    /// PG-60 for a run an operator resolved as PUBLISHED: TARGET metrics, then success.
    FinishTarget {
        #[arg(long)]
        run_id: uuid::Uuid,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Address PG-05 listens on (load-control's nifi.receiver_url must point here).
    #[arg(long, default_value = "127.0.0.1:0")]
    receiver_listen: String,
    /// Path prefix PG-05 accepts before /validate and /reissue. NiFi itself has none (its
    /// HandleHttpRequest allows /validate/<jobKey> and /reissue/<jobKey> only), so
    /// load-control's receiver URL is http://host:port; a prefix plays a proxy in front of NiFi
    /// that strips it (load-control then needs nifi.receiver_path_allowed: true).
    #[arg(long, default_value = "")]
    receiver_prefix: String,
    #[arg(long, default_value = "NIFI_SIM")]
    job: String,
    /// Once this file exists, no further run starts; runs under way finish, and the summary
    /// counts the runs started. Lets a load last exactly as long as a test's faults.
    #[arg(long)]
    stop_file: Option<std::path::PathBuf>,
    /// Business keys are <prefix>-<n> (default: a random prefix).
    #[arg(long)]
    business_key_prefix: Option<String>,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value_t = 4)]
    concurrent_runs: usize,
    #[arg(long, default_value_t = 4)]
    partitions: usize,
    #[arg(long, default_value_t = 3)]
    chunks: usize,
    #[arg(long, default_value_t = 100)]
    rows_per_chunk: u64,
    /// NiFi nodes running PG-20 (two concurrent calls each).
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Seconds one run may take to reach a final state.
    #[arg(long, default_value_t = 120)]
    run_timeout: u64,
    /// PG-90's retry budget in seconds: a call whose five NiFi retries ran out is sent again
    /// every 2 s for this long, then reported as the stage's failure (docs/nifi.md).
    #[arg(long, default_value_t = 120)]
    pg90_budget: u64,
    /// Fraction of POSTs delivered twice at once.
    #[arg(long, default_value_t = 0.0)]
    duplicate: f64,
    /// Fraction of POSTs whose response is lost (applied, then retried).
    #[arg(long, default_value_t = 0.0)]
    lost_response: f64,
    /// Fraction of partitions whose node crashes halfway (needs the job in REISSUE mode).
    #[arg(long, default_value_t = 0.0)]
    node_crash: f64,
    /// Fraction of reissued partitions whose crashed owner reports late.
    #[arg(long, default_value_t = 0.0)]
    late_report: f64,
    /// Fraction of publishes whose outcome is unknown.
    #[arg(long, default_value_t = 0.0)]
    publish_unknown: f64,
    /// The first N publishes report PUBLISH_UNKNOWN.
    #[arg(long, default_value_t = 0)]
    publish_unknown_runs: usize,
    /// The first N publish claims get no answer at all, even after PG-90's resends (the odd ones
    /// landed first): PG-90 then reports FAILED_PUBLISH (docs/nifi.md).
    #[arg(long, default_value_t = 0)]
    unanswered_publish_claims: usize,
    /// PG-05 answers each dispatch after this delay.
    #[arg(long, default_value_t = 0)]
    pg05_delay_ms: u64,
    /// PG-05 refuses the first N dispatches with --pg05-refuse-status.
    #[arg(long, default_value_t = 0)]
    pg05_refuse_first: usize,
    #[arg(long, default_value_t = 503)]
    pg05_refuse_status: u16,
    /// PG-05 checks signatures (CONTRACT §6.4) with these keys, `ID=SECRET`, repeated or
    /// comma-separated: by `X-Lca-Key-Id`, or with every key when a dispatch has none. Unset:
    /// signatures are not checked.
    #[arg(long, env = "NIFI_SIM_PG05_SIGNING_KEYS", hide_env_values = true, value_delimiter = ',',
          value_parser = e2e::nifi::receiver::SigningKeys::parse_entry)]
    pg05_signing_key: Vec<(String, String)>,
    /// PG-05 serves HTTPS with this certificate (PEM; with --pg05-tls-key) and requires a client
    /// certificate signed by --pg05-client-ca, as HandleHttpRequest with an SSL Context Service
    /// and Client Authentication REQUIRED does.
    #[arg(long, requires_all = ["pg05_tls_key", "pg05_client_ca"])]
    pg05_tls_cert: Option<std::path::PathBuf>,
    #[arg(long, requires = "pg05_tls_cert")]
    pg05_tls_key: Option<std::path::PathBuf>,
    #[arg(long, requires = "pg05_tls_cert")]
    pg05_client_ca: Option<std::path::PathBuf>,
}

/// PG-05's TLS configuration from its certificate, key and client CA files.
fn pg05_tls(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_ca: &std::path::Path,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let read =
        |p: &std::path::Path| std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()));
    let chain = CertificateDer::pem_slice_iter(&read(cert)?).collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(&read(key)?)?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&read(client_ca)?) {
        roots.add(ca?)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots)).build()?;
    Ok(Arc::new(
        rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)?,
    ))
}

async fn run(cli: Cli) -> anyhow::Result<bool> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let a = cli.run;
    let faults = Arc::new(Faults::new(
        a.duplicate,
        a.lost_response,
        a.node_crash,
        a.late_report,
        a.publish_unknown,
    ));
    let bearer = match (cli.token, cli.token_file) {
        (_, Some(file)) => Bearer::File(file),
        (Some(token), None) => Bearer::Fixed(token),
        (None, None) => anyhow::bail!("--token or --token-file is needed"),
    };
    let ca = match &cli.ca_file {
        Some(path) => Some(
            std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("--ca-file {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let mut api = NifiClient::with(
        &cli.api,
        bearer,
        ca.as_deref(),
        cli.api_address,
        faults.clone(),
    )?;
    let seconds = |name: &str, s: f64| {
        anyhow::ensure!(
            s.is_finite() && (0.0..=86400.0).contains(&s),
            "--{name}: {s} is not between 0 and 86400"
        );
        Ok(Duration::from_secs_f64(s))
    };
    anyhow::ensure!(
        cli.retry_scale.is_finite() && (0.0..=100.0).contains(&cli.retry_scale),
        "--retry-scale: {} is not between 0 and 100",
        cli.retry_scale
    );
    api.retry = RetrySchedule {
        count: cli.retries,
        penalty: seconds("retry-penalty", cli.retry_penalty)?,
        max_backoff: seconds("retry-max-backoff", cli.retry_max_backoff)?,
        scale: cli.retry_scale,
    };
    if let Some(Command::FinishTarget { run_id }) = cli.command {
        let answer = e2e::nifi::complete_published(&api, run_id).await?;
        println!("{}", answer.body);
        return Ok(answer.flag("success"));
    }
    let mut plan = Plan {
        job_key: a.job,
        runs: a.runs,
        concurrent_runs: a.concurrent_runs,
        partitions: a.partitions,
        chunks: a.chunks,
        rows_per_chunk: a.rows_per_chunk,
        nodes: a.nodes,
        run_timeout: Duration::from_secs(a.run_timeout),
        publish_unknown_runs: a.publish_unknown_runs,
        unanswered_publish_claims: a.unanswered_publish_claims,
        pg90_budget: Duration::from_secs(a.pg90_budget),
        stop_file: a.stop_file,
        ..Plan::default()
    };
    if let Some(p) = a.business_key_prefix {
        plan.business_key_prefix = p;
    }
    let tls = match (&a.pg05_tls_cert, &a.pg05_tls_key, &a.pg05_client_ca) {
        (Some(cert), Some(key), Some(ca)) => Some(pg05_tls(cert, key, ca)?),
        _ => None,
    };
    let behaviour = Behaviour {
        tls,
        delay: Duration::from_millis(a.pg05_delay_ms),
        refuse_first: a.pg05_refuse_first,
        refuse_status: a.pg05_refuse_status,
        signing_keys: e2e::nifi::receiver::SigningKeys::from_entries(a.pg05_signing_key),
    };
    let sim = Simulation::start(
        api,
        faults,
        plan,
        &a.receiver_listen,
        &a.receiver_prefix,
        behaviour,
    )
    .await?;
    eprintln!("nifi-sim: PG-05 listening on {}", sim.receiver_addr());
    let summary = sim.run().await;
    // Written, not printed: a reader gone (its test failed) is an error here, not a panic.
    use std::io::Write as _;
    writeln!(std::io::stdout(), "{}", serde_json::to_string(&summary)?)?;
    Ok(summary.anomalies.is_empty()
        && summary.gave_up.is_empty()
        && summary.unfinished.is_empty()
        && summary.receiver.rejected.is_empty())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    match run(Cli::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("nifi-sim: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_well_formed() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}

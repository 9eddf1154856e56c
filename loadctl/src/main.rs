//! `loadctl`: the on-call operator's command line for load-control (also installable as the
//! kubectl plugin `kubectl-loadctl`: the same binary under that name).
//!
//! Exit codes, for scripts:
//! * 0 — done;
//! * 2 — bad usage (unknown command, missing argument);
//! * 3 — the API refused the request (a 4xx other than 401/403: its code is printed);
//! * 4 — not authenticated or not allowed (401/403);
//! * 5 — the API could not be reached, or failed (transport error, 5xx).
use clap::{Parser, Subcommand, ValueEnum};
use loadctl::client::{Api, Failure};
use loadctl::render;
use serde_json::json;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "loadctl",
    version,
    about = "load-control for on-call operators: runs, alerts, and the actions that unstick them.",
    long_about = "load-control for on-call operators: list and inspect runs, resolve PUBLISH_UNKNOWN, resend DEAD \
dispatches, cancel runs, read the monitor summary.\n\n\
Where the API is: --server, else $LOADCTL_SERVER, else monitor.api_url of the configuration file (--config, \
$LCA_CONFIG, ./config/config.yaml; optional), else http://127.0.0.1:8080. The token: --token, else \
$LOADCTL_TOKEN, else monitor.token; actions use --operator-token / monitor.operator_token when set.\n\n\
With --kube the commands runs, run, resolve and cancel work through Kubernetes instead: LoadRuns are read, \
and actions are written on them (spec.resolution, spec.cancel) for the operator to carry out, so Kubernetes \
RBAC and audit apply. Installed as `kubectl-loadctl` (the same binary), --kube is the default unless --server \
is given on its command line ($LOADCTL_SERVER does not switch it).\n\n\
Exit codes: 0 done, 2 bad usage, 3 refused by the API (its code is printed), 4 not authenticated or not \
allowed, 5 API unreachable or failing."
)]
struct Cli {
    /// Base URL of the load-control API.
    #[arg(long, visible_alias = "url", global = true, env = "LOADCTL_SERVER")]
    server: Option<String>,
    /// Bearer token (reads need the nifi or operator role; actions need operator).
    #[arg(long, global = true, env = "LOADCTL_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Token for actions, when it differs from --token.
    #[arg(
        long,
        global = true,
        env = "LOADCTL_OPERATOR_TOKEN",
        hide_env_values = true
    )]
    operator_token: Option<String>,
    /// Configuration file (the api-server's format; only monitor.* is read).
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<std::path::PathBuf>,
    /// Output format.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Work through Kubernetes instead of the HTTP API: read LoadRuns, act through spec.cancel and
    /// spec.resolution (Kubernetes RBAC and audit apply).
    #[arg(long, global = true)]
    kube: bool,
    /// With --kube: the kubeconfig context (default: the current one).
    #[arg(long, global = true, value_name = "CONTEXT")]
    context: Option<String>,
    /// With --kube: only this namespace (default: all namespaces).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// List runs, newest first.
    Runs {
        #[arg(long)]
        job: Option<String>,
        #[arg(long)]
        business_key: Option<String>,
        /// A run status, e.g. PUBLISH_UNKNOWN.
        #[arg(long)]
        status: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show one run: partitions, metrics, dispatches, events.
    Run { run_id: String },
    /// Resolve a PUBLISH_UNKNOWN run after checking the target table in Hive.
    Resolve {
        run_id: String,
        #[arg(long, value_enum)]
        outcome: Outcome,
        /// Why (at least 5 characters); recorded in the run's events.
        #[arg(long)]
        reason: String,
    },
    /// Send a dispatch again (DEAD or SENT): one by its ids, or with --all-dead every DEAD
    /// dispatch the monitor alerts on (after a NiFi outage longer than the dispatcher's retries),
    /// narrowed by --job and --since; --dry-run lists them and sends nothing.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["dispatch_id", "all_dead"])))]
    Resend {
        #[arg(requires = "dispatch_id")]
        run_id: Option<String>,
        #[arg(requires = "run_id")]
        dispatch_id: Option<String>,
        /// Every DEAD dispatch of the monitor's DISPATCH_DEAD alerts (runs still waiting for one).
        #[arg(long, conflicts_with = "run_id")]
        all_dead: bool,
        /// With --all-dead: only this job's.
        #[arg(long, requires = "all_dead")]
        job: Option<String>,
        /// With --all-dead: only those that went DEAD since then: an RFC 3339 time
        /// (2026-12-05T02:00:00Z) or a duration back from now (90m, 6h, 2d).
        #[arg(long, requires = "all_dead", value_name = "TIME")]
        since: Option<String>,
        /// With --all-dead: list what would be sent, send nothing.
        #[arg(long, requires = "all_dead")]
        dry_run: bool,
    },
    /// Cancel a run that has not started publishing.
    Cancel {
        run_id: String,
        /// Why (at least 5 characters); recorded in the run's events.
        #[arg(long)]
        reason: String,
    },
    /// The monitor summary: active runs, dispatch backlog, alerts.
    Summary,
    /// A live terminal dashboard: counts, dispatch backlog, alerts, recent runs; Enter opens a run.
    Dashboard {
        /// Seconds between refreshes (monitor.refresh_seconds by default).
        #[arg(long, value_name = "SECONDS")]
        refresh: Option<f64>,
    },
    /// Cleanup (runs past retention).
    Cleanup {
        #[command(subcommand)]
        what: CleanupCommand,
    },
}

#[derive(Subcommand)]
enum CleanupCommand {
    /// Runs due for cleanup.
    Candidates {
        #[arg(long)]
        job: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Record a cleanup done by hand (PG-70 could not): load-control deletes nothing itself.
    Record {
        run_id: String,
        /// The stage table that was dropped.
        #[arg(long)]
        dropped_table: Option<String>,
        /// The HDFS run directory that was deleted.
        #[arg(long)]
        deleted_path: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
#[value(rename_all = "SCREAMING_SNAKE_CASE")]
enum Outcome {
    Published,
    FailedPublish,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Published => "PUBLISHED",
            Outcome::FailedPublish => "FAILED_PUBLISH",
        }
    }
}

async fn run_kube(cli: Cli, context: &str) -> Result<String, Failure> {
    use loadctl::kube_mode::{Kube, runs_table};
    let k = Kube::connect(context, cli.namespace.clone()).await?;
    let json_out = cli.output == Output::Json;
    Ok(match cli.command {
        Command::Runs {
            job,
            status,
            business_key,
            limit,
        } => {
            let runs: Vec<_> = k
                .runs()
                .await?
                .into_iter()
                .filter(|r| job.as_ref().is_none_or(|j| &r.spec.job_key == j))
                .filter(|r| {
                    business_key
                        .as_ref()
                        .is_none_or(|b| &r.spec.business_key == b)
                })
                .filter(|r| {
                    status
                        .as_ref()
                        .is_none_or(|s| r.status.as_ref().is_some_and(|st| &st.phase == s))
                })
                .take(limit as usize)
                .collect();
            if json_out {
                pretty(&runs)
            } else {
                runs_table(&runs)
            }
        }
        Command::Run { run_id } => {
            let r = k.find(&run_id).await?;
            if json_out { pretty(&r) } else { describe(&r) }
        }
        Command::Resolve {
            run_id,
            outcome,
            reason,
        } => {
            let r = k
                .request(
                    &run_id,
                    json!({"resolution": {"outcome": outcome.as_str(), "reason": reason}}),
                )
                .await?;
            format!(
                "requested on LoadRun {}/{}: the operator resolves it as {}",
                r.metadata.namespace.unwrap_or_default(),
                r.metadata.name.unwrap_or_default(),
                outcome.as_str()
            )
        }
        Command::Cancel { run_id, reason } => {
            let r = k
                .request(&run_id, json!({"cancel": {"reason": reason}}))
                .await?;
            format!(
                "requested on LoadRun {}/{}: the operator cancels it",
                r.metadata.namespace.unwrap_or_default(),
                r.metadata.name.unwrap_or_default()
            )
        }
        _ => {
            return Err(Failure::Usage(
                "with --kube only runs, run, resolve and cancel are available; use the HTTP API (--server) for the others".into(),
            ));
        }
    })
}

fn pretty<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).expect("JSON")
}

/// A LoadRun's spec and status, readable.
fn describe(r: &crds::LoadRun) -> String {
    let st = r.status.clone().unwrap_or_default();
    let mut out = vec![
        format!(
            "LoadRun {}/{}",
            r.metadata.namespace.clone().unwrap_or_default(),
            r.metadata.name.clone().unwrap_or_default()
        ),
        format!(
            "Run:         {}  {} / {}",
            r.spec.run_id, r.spec.job_key, r.spec.business_key
        ),
        format!("Phase:       {}", st.phase),
        format!("Partitions:  {}", st.partitions_summary),
        format!(
            "Rows:        source {:?}, extracted {}, staging {:?}, target {:?}",
            st.counts.source, st.counts.extracted, st.counts.staging, st.counts.target
        ),
        format!(
            "Dispatches:  pending {}, sent {}, dead {}",
            st.dispatches.pending, st.dispatches.sent, st.dispatches.dead
        ),
    ];
    for c in &st.conditions {
        out.push(format!(
            "Condition:   {}={} {}: {}",
            c.type_, c.status, c.reason, c.message
        ));
    }
    out.join("\n")
}

async fn run(cli: Cli) -> Result<String, Failure> {
    if cli.kube {
        let context = cli.context.clone().unwrap_or_default();
        return run_kube(cli, &context).await;
    }
    let api = Api::from_settings(
        cli.server.as_deref(),
        cli.token.as_deref(),
        cli.operator_token.as_deref(),
        cli.config.as_deref(),
    )?;
    let json_out = cli.output == Output::Json;
    let out = |v: &serde_json::Value, table: fn(&serde_json::Value) -> String| {
        if json_out {
            serde_json::to_string_pretty(v).expect("JSON")
        } else {
            table(v)
        }
    };
    Ok(match cli.command {
        Command::Runs {
            job,
            business_key,
            status,
            limit,
        } => {
            let mut q = vec![("limit", limit.to_string())];
            q.extend(job.map(|j| ("jobKey", j)));
            q.extend(business_key.map(|b| ("businessKey", b)));
            q.extend(status.map(|s| ("status", s)));
            out(&api.get("/v1/runs", &q).await?, render::runs)
        }
        Command::Run { run_id } => {
            let detail = api.get(&format!("/v1/runs/{run_id}"), &[]).await?;
            let metrics = api
                .get(&format!("/v1/runs/{run_id}/validations"), &[])
                .await?;
            let events = api.get(&format!("/v1/runs/{run_id}/events"), &[]).await?;
            let all = json!({"run": detail, "validations": metrics, "events": events});
            out(&all, render::run)
        }
        Command::Resolve {
            run_id,
            outcome,
            reason,
        } => {
            let body = json!({"resolution": outcome.as_str(), "reason": reason});
            let r = api
                .act(
                    &format!("/v1/runs/{run_id}/publish-unknown/resolve"),
                    Some(body),
                )
                .await?;
            out(&r, render::change)
        }
        Command::Resend {
            all_dead: true,
            job,
            since,
            dry_run,
            ..
        } => {
            let since = since
                .map(|t| loadctl::resend::parse_since(&t, chrono::Utc::now()))
                .transpose()
                .map_err(Failure::Usage)?;
            let selection = loadctl::resend::Selection {
                job,
                since,
                dry_run,
            };
            let r = loadctl::resend::resend_dead(&api, &selection).await?;
            let text = out(&r, render::resent_in_bulk);
            if r["failed"].as_u64().unwrap_or(0) > 0 {
                return Err(Failure::Unavailable(format!(
                    "{text}\n{} of {} could not be sent (the API failed); run the command again",
                    r["failed"], r["matched"]
                )));
            }
            text
        }
        Command::Resend {
            run_id,
            dispatch_id,
            ..
        } => {
            let (run_id, dispatch_id) =
                (run_id.unwrap_or_default(), dispatch_id.unwrap_or_default());
            let r = api
                .act(
                    &format!("/v1/runs/{run_id}/dispatches/{dispatch_id}/resend"),
                    None,
                )
                .await?;
            out(&r, render::resent)
        }
        Command::Cancel { run_id, reason } => {
            let r = api
                .act(
                    &format!("/v1/runs/{run_id}/cancel"),
                    Some(json!({"reason": reason})),
                )
                .await?;
            out(&r, render::change)
        }
        Command::Summary => out(&api.get("/v1/monitor/summary", &[]).await?, render::summary),
        Command::Dashboard { refresh } => {
            let secs = refresh.unwrap_or(api.refresh_seconds).max(1.0);
            let server = api.base().to_string();
            loadctl::dashboard::run(api, &server, std::time::Duration::from_secs_f64(secs))
                .await
                .map_err(|e| Failure::Unavailable(format!("dashboard: {e}")))?;
            String::new()
        }
        Command::Cleanup {
            what:
                CleanupCommand::Record {
                    run_id,
                    dropped_table,
                    deleted_path,
                },
        } => {
            let body = json!({"droppedTable": dropped_table, "deletedPath": deleted_path});
            let r = api
                .act(&format!("/v1/runs/{run_id}/cleanup"), Some(body))
                .await?;
            out(&r, render::change)
        }
        Command::Cleanup {
            what: CleanupCommand::Candidates { job, limit },
        } => {
            let mut q = vec![("limit", limit.to_string())];
            q.extend(job.map(|j| ("jobKey", j)));
            out(
                &api.get("/v1/cleanup/candidates", &q).await?,
                render::candidates,
            )
        }
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let mut cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Installed as the kubectl plugin `kubectl-loadctl`, it works through Kubernetes unless an
    // API server is named on its command line: $LOADCTL_SERVER, exported for `loadctl` by the
    // runbook's own set-up, must not switch the plugin silently to the HTTP API.
    let plugin = std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|f| f == "kubectl-loadctl")
        })
        .unwrap_or(false);
    let server_named =
        matches.value_source("server") == Some(clap::parser::ValueSource::CommandLine);
    if plugin && !server_named {
        cli.kube = true;
        if let Some(url) = cli.server.as_deref() {
            eprintln!(
                "kubectl-loadctl: runs, run, resolve and cancel work through Kubernetes; \
                 $LOADCTL_SERVER ({url}) serves the other commands only (--server URL for the HTTP API)"
            );
        }
    } else if plugin {
        eprintln!(
            "kubectl-loadctl: working through the HTTP API at {} (--server)",
            cli.server.as_deref().unwrap_or_default()
        );
    }
    match run(cli).await {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("loadctl: {f}");
            ExitCode::from(f.exit_code())
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

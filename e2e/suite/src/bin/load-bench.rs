//! load-bench: load-control's performance figures from one sitting, one JSON line per scenario on
//! standard output (progress on standard error). `scripts/bench` builds the release binaries and
//! runs it; see docs/benchmarks.md for what each line means.
use clap::Parser;
use e2e::bench::aged::AgedSizes;
use e2e::bench::scenarios::{self, Sizes};
use e2e::bench::{Bench, Options};
use std::path::PathBuf;

const SCENARIOS: &[&str] = &[
    "pgbench",
    "lifecycle",
    "scale",
    "completion",
    "manifest",
    "dispatch",
    "storm",
    "rss",
    "multixact",
    "mirror",
    "hostile",
    "slow_clients",
    "aged",
    "cost",
];

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Benchmarks load-control against its own PostgreSQL (durable defaults) and prints one JSON line per scenario",
    long_about = "Starts a PostgreSQL of its own with fsync on, the api-server and one standalone operator from --bin-dir, \
and a PG-05 receiver as strict as NiFi. Then: pgbench -N at each client count (the ceiling), the full lifecycle \
at each client count, completion scaling (one run of 10…10,000 partitions), a 10,000-partition manifest, dispatch \
latency idle (and under load, from the lifecycle), a cancel and a partition /fail during a chunk storm, RSS idle and \
at peak, MultiXact growth over the dispatcher's fenced outcomes, and the LoadRun mirror at scale (the operator in \
Kubernetes mode against a private kube-apiserver: scripts/controlplane-build, LC_CONTROLPLANE_BIN). Everything listens on 127.0.0.1 and every loop \
is bounded in count and time."
)]
struct Args {
    /// Directory holding load-control-api and load-control-operator [default: this binary's directory]
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Scenarios to run, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "pgbench,lifecycle,scale,completion,manifest,dispatch,storm,rss,hostile,slow_clients,multixact,cost,mirror",
          value_parser = clap::builder::PossibleValuesParser::new(SCENARIOS))]
    only: Vec<String>,
    /// Concurrent clients of pgbench and the lifecycle, comma-separated
    #[arg(long, value_delimiter = ',')]
    clients: Option<Vec<usize>>,
    /// Scale scenario: concurrent NiFi workers, comma-separated [default: 16,64,128,256; 4,8 with --quick]
    #[arg(long, value_delimiter = ',')]
    scale_clients: Option<Vec<usize>>,
    /// Scale scenario: api-server replicas on the one ledger, the workers spread over them,
    /// comma-separated [default: 1,2,4; 1,2 with --quick]
    #[arg(long, value_delimiter = ',')]
    replicas: Option<Vec<usize>>,
    /// Runs of the lifecycle scenario
    #[arg(long)]
    runs: Option<usize>,
    /// Partitions per lifecycle run
    #[arg(long)]
    partitions: Option<usize>,
    /// Chunks per lifecycle partition
    #[arg(long)]
    chunks: Option<usize>,
    /// database.pool_size of the api-server and the operator
    #[arg(long, default_value_t = 16)]
    pool_size: u32,
    /// Tiny sizes: every scenario in seconds (a smoke run, not a measurement)
    #[arg(long)]
    quick: bool,
    /// Preload pg_stat_statements and print, after each lifecycle, the statements PostgreSQL
    /// spent most time on (a profile; it costs some throughput)
    #[arg(long)]
    statements: bool,
    /// More PostgreSQL server options, e.g. "-c shared_buffers=1GB" (the durable defaults stay)
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pg_options: String,
    /// Keep the processes' logs (printed path) instead of removing them
    #[arg(long)]
    keep_logs: bool,
    /// Both processes' pools through PgBouncer in transaction mode (scripts/pgbouncer-up, which
    /// builds it the first time) holding --pool-size server connections; LISTEN, the leader's
    /// lock and the migration on direct connections. pgbench stays direct (the ceiling).
    #[arg(long)]
    through_pgbouncer: bool,
    /// Aged scenario (`--only aged`): runs in the aged ledger [default: 1000; 60 with --quick]
    #[arg(long)]
    aged_runs: Option<usize>,
    /// Aged scenario: partitions per run [default: 20; 4 with --quick]
    #[arg(long)]
    aged_partitions: Option<usize>,
    /// Aged scenario: files (chunks) per finished partition [default: 3; 2 with --quick]
    #[arg(long)]
    aged_files: Option<usize>,
    /// Aged scenario: the age of the ledger, days over which the runs started [default: 365; 30 with --quick]
    #[arg(long)]
    aged_days: Option<u32>,
    /// Aged scenario: cleanup.history_retention (days) for the catch-up after the measurement
    /// [default: 180; 10 with --quick]
    #[arg(long)]
    aged_retention_days: Option<u32>,
    /// Aged scenario: lifecycle clients in each phase [default: 16; 4 with --quick]
    #[arg(long)]
    aged_clients: Option<usize>,
    /// Aged scenario: samples of each read, sweeper tick and lease scan per phase [default: 50; 5 with --quick]
    #[arg(long)]
    aged_samples: Option<usize>,
}

/// Set by `--through-pgbouncer`: every line says so (`"pooler": "pgbouncer"`).
static THROUGH_PGBOUNCER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn emit(line: &serde_json::Value) {
    let mut line = line.clone();
    if THROUGH_PGBOUNCER.load(std::sync::atomic::Ordering::Relaxed)
        && let Some(fields) = line.as_object_mut()
    {
        fields.insert("pooler".into(), "pgbouncer".into());
    }
    println!("{line}");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    THROUGH_PGBOUNCER.store(args.through_pgbouncer, std::sync::atomic::Ordering::Relaxed);
    let mut s = if args.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    if let Some(c) = args.clients {
        anyhow::ensure!(
            c.iter().all(|&n| n > 0),
            "--clients: every count must be at least 1"
        );
        s.clients = c;
    }
    if let Some(c) = args.scale_clients {
        anyhow::ensure!(
            c.iter().all(|&n| n > 0),
            "--scale-clients: every count must be at least 1"
        );
        s.scale_clients = c;
    }
    if let Some(r) = args.replicas {
        anyhow::ensure!(
            r.iter().all(|&n| (1..=16).contains(&n)),
            "--replicas: every count must be between 1 and 16"
        );
        s.replicas = r;
    }
    s.runs = args.runs.unwrap_or(s.runs).max(1);
    s.partitions = args.partitions.unwrap_or(s.partitions).max(1);
    s.chunks = args.chunks.unwrap_or(s.chunks).max(1);
    let bin_dir = match args.bin_dir {
        Some(d) => d,
        None => std::env::current_exe()?
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default(),
    };
    let run = |name: &str| args.only.iter().any(|o| o == name);
    let d = AgedSizes::default_for(args.quick);
    let aged = AgedSizes {
        runs: args.aged_runs.unwrap_or(d.runs),
        partitions: args.aged_partitions.unwrap_or(d.partitions),
        files: args.aged_files.unwrap_or(d.files),
        days: args.aged_days.unwrap_or(d.days),
        retention_days: args.aged_retention_days.unwrap_or(d.retention_days),
        clients: args.aged_clients.unwrap_or(d.clients).max(1),
        samples: args.aged_samples.unwrap_or(d.samples).max(1),
        statements: args.statements,
    };
    eprintln!("load-bench: starting PostgreSQL (durable), the api-server and the operator");
    let mut bench = Bench::start(&Options {
        bin_dir,
        pool_size: args.pool_size,
        statements: args.statements,
        pg_options: args.pg_options.clone(),
        through_pgbouncer: args.through_pgbouncer,
        // The aged scenario measures the ledger as filled: history retention only in its
        // catch-up, by its own sweeper (the operator's stays off).
        extra_config: if run("aged") {
            "cleanup: {history_retention: null}\n".into()
        } else {
            String::new()
        },
    })
    .await?;
    let outcome = async {
        if run("rss") {
            emit(&scenarios::rss(&bench, "idle"));
        }
        let mut tps = std::collections::HashMap::new();
        if run("pgbench") {
            // The ceiling at every client count a later scenario compares with.
            let mut counts = s.clients.clone();
            if run("scale") {
                counts.extend(&s.scale_clients);
            }
            counts.sort_unstable();
            counts.dedup();
            eprintln!("load-bench: pgbench -N at {counts:?} clients");
            let sizes = Sizes {
                clients: counts,
                ..s.clone()
            };
            let (lines, t) = scenarios::pgbench(&bench, &sizes).await?;
            lines.iter().for_each(emit);
            tps = t;
        }
        if run("lifecycle") {
            for &c in &s.clients {
                eprintln!("load-bench: lifecycle at {c} clients");
                if args.statements {
                    scenarios::statements(&bench, "start", 0).await?;
                }
                emit(&scenarios::lifecycle(&bench, &s, c, tps.get(&c).copied()).await?);
                if args.statements {
                    emit(
                        &scenarios::statements(&bench, &format!("lifecycle at {c} clients"), 25)
                            .await?,
                    );
                }
            }
        }
        if run("scale") {
            for &r in &s.replicas {
                let replicas = bench.api_replicas(r).await?;
                for &k in &s.scale_clients {
                    eprintln!("load-bench: scale, {k} workers over {r} api-server(s)");
                    let clients = e2e::bench::client::Client::counted_afresh(&replicas);
                    let mut line =
                        scenarios::lifecycle_across(&bench, &clients, &s, k, tps.get(&k).copied())
                            .await?;
                    line["scenario"] = "scale".into();
                    emit(&line);
                }
            }
        }
        if run("completion") {
            let mut p50 = vec![];
            for &p in &s.completion_partitions {
                eprintln!("load-bench: completion with {p} partitions");
                let line = scenarios::completion(&bench, &s, p).await?;
                p50.push(line["partition_completing_report_ms"]["p50"].as_f64());
                emit(&line);
            }
            if let (Some(Some(first)), Some(Some(last))) = (p50.first(), p50.last()) {
                emit(&serde_json::json!({"scenario": "completion_ratio",
                    "partitions": [s.completion_partitions.first(), s.completion_partitions.last()],
                    "p50_ratio": (last / first * 100.0).round() / 100.0, "target": 1.2}));
            }
        }
        if run("manifest") {
            eprintln!(
                "load-bench: manifest of {} partitions",
                s.manifest_partitions
            );
            emit(&scenarios::manifest(&bench, &s).await?);
        }
        if run("dispatch") {
            eprintln!("load-bench: dispatch latency, idle");
            emit(&scenarios::dispatch_idle(&bench, &s).await?);
        }
        if run("storm") {
            eprintln!("load-bench: cancel and partition /fail during a chunk storm");
            let clients = s.clients.iter().copied().max().unwrap_or(32).min(32);
            emit(&scenarios::storm(&bench, &s, clients).await?);
        }
        if run("rss") {
            emit(&scenarios::rss(&bench, "after_load"));
        }
        if run("hostile") {
            eprintln!("load-bench: 4 bodies of millions of JSON values at once");
            emit(&scenarios::hostile_bodies(&bench).await?);
        }
        if run("slow_clients") {
            eprintln!(
                "load-bench: {} silent, head-trickling and body-trickling connections each",
                s.slow_clients
            );
            emit(&scenarios::slow_clients(&bench, &s).await?);
        }
        if run("aged") {
            e2e::bench::aged::aged(&mut bench, &s, &aged, &emit).await?;
            // It leaves the operator stopped, as the ones after it want it.
        }
        if run("multixact") {
            eprintln!(
                "load-bench: MultiXact growth over {} dispatcher outcomes",
                s.multixact_outcomes
            );
            emit(&scenarios::multixact(&mut bench, &s, 16).await?);
        }
        if run("cost") {
            let sizes = e2e::bench::cost::CostSizes::default_for(args.quick);
            eprintln!(
                "load-bench: the cost of one chunk report ({} runs × {} partitions × {} chunks, one at a time, the operator stopped)",
                sizes.runs, sizes.partitions, sizes.chunks
            );
            // One writer: nothing but the reports in PostgreSQL's counters.
            bench.operator.stop();
            e2e::bench::cost::cost(&bench, &sizes)
                .await?
                .iter()
                .for_each(emit);
        }
        if run("mirror") {
            eprintln!(
                "load-bench: LoadRun mirror with {} runs ({} active) against a kube-apiserver",
                s.mirror.runs, s.mirror.active
            );
            // One leader: the standalone operator gives way to the one in Kubernetes mode.
            bench.operator.stop();
            emit(&e2e::bench::mirror::mirror(&bench, &s.mirror).await?);
        }
        anyhow::Ok(())
    }
    .await;
    bench.stop(args.keep_logs || outcome.is_err());
    outcome
}

//! The scenarios of issue 12, each ending in one JSON line (a `serde_json::Value`).
use super::client::{Client, percentiles};
use super::{Bench, JOB_KEY, Work, procstat};
use anyhow::Context;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use uuid::Uuid;

/// How big each scenario is.
#[derive(Clone, Debug)]
pub struct Sizes {
    pub clients: Vec<usize>,
    /// Concurrent workers of the scale scenario, at each count of api-server `replicas`.
    pub scale_clients: Vec<usize>,
    pub replicas: Vec<usize>,
    pub runs: usize,
    pub partitions: usize,
    pub chunks: usize,
    pub rows_per_chunk: u64,
    pub completion_partitions: Vec<usize>,
    pub completion_clients: usize,
    pub manifest_partitions: usize,
    pub manifest_repeats: usize,
    pub dispatch_idle_runs: usize,
    pub storm: Duration,
    pub multixact_outcomes: usize,
    /// Hostile connections of each kind in the slow-clients scenario.
    pub slow_clients: usize,
    pub pgbench_seconds: u64,
    /// Bound of every scenario that waits for the system.
    pub timeout: Duration,
    pub mirror: super::mirror::MirrorSizes,
}

impl Sizes {
    /// Issue 12's sizes.
    pub fn full() -> Sizes {
        Sizes {
            clients: vec![16, 32, 64],
            scale_clients: vec![16, 64, 128, 256],
            replicas: vec![1, 2, 4],
            runs: 300,
            partitions: 8,
            chunks: 4,
            rows_per_chunk: 1000,
            completion_partitions: vec![10, 100, 1_000, 10_000],
            completion_clients: 16,
            manifest_partitions: 10_000,
            manifest_repeats: 3,
            dispatch_idle_runs: 30,
            storm: Duration::from_secs(3),
            multixact_outcomes: 100_000,
            slow_clients: 300,
            pgbench_seconds: 15,
            timeout: Duration::from_secs(600),
            mirror: super::mirror::MirrorSizes {
                runs: 10_000,
                active: 1_000,
                changes: 500,
                changes_per_second: 25.0,
                timeout: Duration::from_secs(900),
            },
        }
    }

    /// A smoke run of every scenario in seconds (the test suite runs it on debug builds).
    pub fn quick() -> Sizes {
        Sizes {
            clients: vec![4],
            scale_clients: vec![4, 8],
            replicas: vec![1, 2],
            runs: 4,
            partitions: 2,
            chunks: 2,
            rows_per_chunk: 10,
            completion_partitions: vec![2, 8],
            completion_clients: 4,
            manifest_partitions: 50,
            manifest_repeats: 1,
            dispatch_idle_runs: 3,
            storm: Duration::from_millis(500),
            multixact_outcomes: 400,
            slow_clients: 20,
            pgbench_seconds: 2,
            timeout: Duration::from_secs(60),
            mirror: super::mirror::MirrorSizes {
                runs: 60,
                active: 10,
                changes: 10,
                changes_per_second: 10.0,
                timeout: Duration::from_secs(30),
            },
        }
    }
}

fn secs(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn tag() -> String {
    Uuid::new_v4().simple().to_string()[..8].to_string()
}

/// `pgbench -N` at each client count on a database of its own: the ceiling of what this
/// PostgreSQL commits (simple protocol, 2 threads, scale 16). `{clients: tps}`.
pub async fn pgbench(b: &Bench, s: &Sizes) -> anyhow::Result<(Vec<Value>, HashMap<usize, f64>)> {
    let url = b.pg.create_db("pgbench")?;
    let init = tokio::process::Command::new("pgbench")
        .args(["-i", "-q", "-s", "16", &url])
        .output()
        .await
        .context("pgbench (Debian package postgresql-contrib / postgresql-client)")?;
    anyhow::ensure!(
        init.status.success(),
        "pgbench -i: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    let (mut lines, mut tps) = (vec![], HashMap::new());
    for &c in &s.clients {
        let out = tokio::process::Command::new("pgbench")
            .args(["-N", "-n", "-j", "2", "-c", &c.to_string()])
            .args(["-T", &s.pgbench_seconds.to_string(), &url])
            .output()
            .await?;
        let text = String::from_utf8_lossy(&out.stdout);
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix("tps = "))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .with_context(|| format!("pgbench printed no tps: {text}"))?;
        tps.insert(c, value);
        lines.push(json!({"scenario": "pgbench", "mode": "-N", "clients": c,
                          "seconds": s.pgbench_seconds, "tps": value.round()}));
    }
    // pgbench's backends finish exiting after pgbench does; the postmaster's children CPU time
    // takes them in when it reaps them, which must not happen inside the next measurement.
    let deadline = Instant::now() + Duration::from_secs(30);
    while b
        .sql_i64("SELECT count(*) FROM pg_stat_activity WHERE datname = 'pgbench'")
        .await?
        > 0
    {
        anyhow::ensure!(Instant::now() < deadline, "pgbench's backends did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((lines, tps))
}

/// PG-10: creates a run and registers a manifest of `partitions` partitions of `rows` rows each,
/// numbers as strings as NiFi sends them. (run, hdfsRunPath, [(partitionId, expected rows)]).
pub(crate) async fn create_run(
    c: &Client,
    business_key: &str,
    partitions: usize,
    rows: u64,
) -> anyhow::Result<(Uuid, String, Vec<(String, u64)>)> {
    let created = c
        .post(
            "create",
            "/v1/runs",
            json!({"jobKey": JOB_KEY, "businessKey": business_key, "hdfsRoot": "/data/bench/",
                   "stageTablePrefix": "tmp_bench_", "allowEmptySource": false}),
        )
        .await?;
    let run = Uuid::parse_str(created["runId"].as_str().context("runId")?)?;
    let path = created["hdfsRunPath"]
        .as_str()
        .context("hdfsRunPath")?
        .to_string();
    let parts: Vec<Value> = (0..partitions)
        .map(|p| {
            json!({"partitionId": format!("{p:04}"), "lowerBound": (p * 1000).to_string(),
                   "upperBound": ((p + 1) * 1000).to_string(),
                   "upperInclusive": (p + 1 == partitions).to_string(),
                   "isNullPartition": "false", "expectedRowCount": rows.to_string()})
        })
        .collect();
    let total = rows * partitions as u64;
    let manifest = c
        .post(
            "manifest",
            &format!("/v1/runs/{run}/manifest"),
            json!({"snapshotScn": "1234567890", "sourceCount": total.to_string(),
                   "sourceNullSplitCount": "0", "sourceMinSplit": "0",
                   "sourceMaxSplit": (partitions * 1000).to_string(),
                   "plannedPartitionCount": partitions.to_string(), "partitions": parts}),
        )
        .await?;
    let dispatch = manifest["dispatchPartitions"]
        .as_array()
        .context("dispatchPartitions")?
        .iter()
        .map(|p| {
            (
                p["partitionId"].as_str().unwrap_or_default().to_string(),
                p["expectedRowCount"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    Ok((run, path, dispatch))
}

pub(crate) async fn claim(c: &Client, run: Uuid, pid: &str, token: Uuid) -> anyhow::Result<()> {
    let a = c
        .post(
            "claim",
            &format!("/v1/runs/{run}/partitions/{pid}/claim"),
            json!({"claimToken": token, "workerNode": "nifi-01"}),
        )
        .await?;
    anyhow::ensure!(a["claimed"] == true, "claim of {run}/{pid} refused: {a}");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn report_chunk(
    c: &Client,
    run: Uuid,
    pid: &str,
    path: &str,
    token: Uuid,
    index: usize,
    count: usize,
    rows: u64,
) -> anyhow::Result<Value> {
    c.post(
        "chunk",
        &format!("/v1/runs/{run}/partitions/{pid}/chunks"),
        json!({"claimToken": token, "chunkIndex": index, "chunkCount": count,
               "fragmentIdentifier": format!("f-{token}"),
               "hdfsPath": format!("{path}/p={pid}/part-{index:06}.parquet"),
               "recordCount": rows, "byteCount": rows * 64}),
    )
    .await
}

/// PG-40, PG-50, PG-60 for one VALIDATE_RUN dispatch.
async fn validate_and_publish(c: &Client, run: Uuid, dispatch: Uuid) -> anyhow::Result<()> {
    let base = format!("/v1/runs/{run}");
    let start = c
        .post(
            "validation_start",
            &format!("{base}/validation/start"),
            json!({"dispatchId": dispatch, "node": "nifi-01"}),
        )
        .await?;
    anyhow::ensure!(
        start["started"] == true,
        "validation of {run} not started: {start}"
    );
    let rows = start["extractedCount"].as_u64().unwrap_or(0).to_string();
    c.post("validations", &format!("{base}/validations"),
        json!({"stage": "STAGING", "queryVersion": "v1", "metrics": [
            {"metricName": "STAGE_COUNT", "expectedValue": rows, "actualValue": rows, "result": "PASS"}]}))
        .await?;
    c.post(
        "stage_validated",
        &format!("{base}/stage-validated"),
        json!({}),
    )
    .await?;
    let token = Uuid::new_v4();
    c.post(
        "publish_claim",
        &format!("{base}/publish/claim"),
        json!({"publishToken": token}),
    )
    .await?;
    c.post(
        "publish_result",
        &format!("{base}/publish/result"),
        json!({"publishToken": token, "outcome": "PUBLISHED"}),
    )
    .await?;
    c.post("validations", &format!("{base}/validations"),
        json!({"stage": "TARGET", "metrics": [
            {"metricName": "TARGET_COUNT", "expectedValue": rows, "actualValue": rows, "result": "PASS"}]}))
        .await?;
    let done = c
        .post("success", &format!("{base}/success"), json!({}))
        .await?;
    anyhow::ensure!(done["success"] == true, "success of {run} refused: {done}");
    Ok(())
}

struct Lifecycle {
    /// One client per api-server replica; worker `i` calls replica `i % len`.
    clients: Vec<Client>,
    sizes: Sizes,
    tag: String,
    hi: async_channel::Sender<Work>,
    hi_rx: async_channel::Receiver<Work>,
    creates: async_channel::Receiver<Work>,
    done: AtomicUsize,
    runs: Mutex<Vec<Uuid>>,
    /// Work items done through each replica (every replica took its share).
    by_replica: Vec<AtomicUsize>,
}

impl Lifecycle {
    /// One client: run and partition work first, a new run only when nothing else waits, so the
    /// number of runs in flight follows from the client count.
    async fn client(self: Arc<Self>, worker: usize) {
        let replica = worker % self.clients.len();
        let c = self.clients[replica].clone();
        loop {
            let w = match self.hi_rx.try_recv() {
                Ok(w) => w,
                Err(_) => match self.creates.try_recv() {
                    Ok(w) => w,
                    Err(_) => match self.hi_rx.recv().await {
                        Ok(w) => w,
                        Err(_) => break,
                    },
                },
            };
            // A failed call leaves its run unfinished: a measurement with errors is no
            // measurement, so the scenario stops at once and reports them.
            self.by_replica[replica].fetch_add(1, Ordering::Relaxed);
            if self.step(&c, w).await.is_err() {
                self.hi.close();
                self.creates.close();
            }
        }
    }

    async fn step(&self, c: &Client, w: Work) -> anyhow::Result<()> {
        let s = &self.sizes;
        match w {
            Work::Create(n) => {
                let rows = s.rows_per_chunk * s.chunks as u64;
                let bk = format!("{}-{n:06}", self.tag);
                let (run, path, parts) = create_run(c, &bk, s.partitions, rows).await?;
                self.runs.lock().unwrap().push(run);
                for (pid, rows) in parts {
                    self.hi.try_send(Work::Partition {
                        run,
                        pid,
                        path: path.clone(),
                        rows,
                    })?;
                }
            }
            Work::Partition {
                run,
                pid,
                path,
                rows,
            } => {
                let token = Uuid::new_v4();
                claim(c, run, &pid, token).await?;
                for index in 0..s.chunks {
                    self.hi.try_send(Work::Chunk {
                        run,
                        pid: pid.clone(),
                        path: path.clone(),
                        token,
                        index,
                        count: s.chunks,
                        rows: rows / s.chunks as u64,
                    })?;
                }
            }
            Work::Chunk {
                run,
                pid,
                path,
                token,
                index,
                count,
                rows,
            } => {
                report_chunk(c, run, &pid, &path, token, index, count, rows).await?;
            }
            Work::Validate { run, dispatch } => {
                validate_and_publish(c, run, dispatch).await?;
                if self.done.fetch_add(1, Ordering::SeqCst) + 1 == s.runs {
                    self.hi.close();
                }
            }
        }
        Ok(())
    }
}

/// From the completion CAS (`extract_completed_at`, just before its commit) until PG-05 accepted
/// the VALIDATE_RUN dispatch, for each of `runs` that PG-05 saw.
async fn dispatch_latencies(b: &Bench, runs: &[Uuid]) -> anyhow::Result<Vec<f64>> {
    let rows: Vec<(Uuid, Option<f64>)> = sqlx::query_as(
        "SELECT run_id, extract(epoch FROM extract_completed_at)::float8 FROM nifi_ops.load_run WHERE run_id = ANY($1)",
    )
    .bind(runs)
    .fetch_all(&mut b.db().await?)
    .await?;
    let arrivals = b.dispatches.arrivals.lock().unwrap();
    Ok(rows
        .into_iter()
        .filter_map(|(run, done)| Some((secs(*arrivals.get(&run)?) - done?) * 1000.0))
        .collect())
}

/// Scenario 1: runs × partitions × chunks through every step, `clients` at a time. Also
/// scenario 4 under load (the dispatch latency of these runs).
pub async fn lifecycle(
    b: &Bench,
    s: &Sizes,
    clients: usize,
    pgbench_tps: Option<f64>,
) -> anyhow::Result<Value> {
    lifecycle_across(b, &[b.client.fresh()], s, clients, pgbench_tps).await
}

/// The lifecycle with its workers spread over `replicas` (clients of one `Stats`, one per
/// api-server), and the PostgreSQL connections it held (sampled every 100 ms).
pub async fn lifecycle_across(
    b: &Bench,
    replicas: &[Client],
    s: &Sizes,
    clients: usize,
    pgbench_tps: Option<f64>,
) -> anyhow::Result<Value> {
    let (hi, hi_rx) = async_channel::unbounded();
    let (creates_tx, creates) = async_channel::unbounded();
    for n in 0..s.runs {
        creates_tx.try_send(Work::Create(n))?;
    }
    creates_tx.close();
    let l = Arc::new(Lifecycle {
        clients: replicas.to_vec(),
        sizes: s.clone(),
        tag: format!("life-{clients}-{}", tag()),
        hi: hi.clone(),
        hi_rx,
        creates,
        done: AtomicUsize::new(0),
        runs: Mutex::default(),
        by_replica: replicas.iter().map(|_| AtomicUsize::new(0)).collect(),
    });
    *b.dispatches.sink.lock().unwrap() = Some(hi.clone());
    let probe = WalProbe::start(b).await?;
    let connections = ConnectionSampler::start(b).await?;
    let (api0, pg0, t0) = (b.api_cpu(), b.cpu().1, Instant::now());
    let tasks: Vec<_> = (0..clients)
        .map(|i| tokio::spawn(l.clone().client(i)))
        .collect();
    let all = futures::future::join_all(tasks);
    let finished = tokio::time::timeout(s.timeout, all).await.is_ok();
    let wall = t0.elapsed().as_secs_f64();
    let (api1, pg1) = (b.api_cpu(), b.cpu().1);
    let connections = connections.finish().await;
    hi.close();
    *b.dispatches.sink.lock().unwrap() = None;
    let st = &replicas[0].stats;
    let requests = st.requests.load(Ordering::Relaxed) as f64;
    let chunks = st.count("chunk") as f64;
    let done = l.done.load(Ordering::SeqCst);
    let runs = l.runs.lock().unwrap().clone();
    let dispatch = dispatch_latencies(b, &runs).await?;
    let wal = probe.finish(b, requests as u64).await?;
    let per_request = |cpu: f64| (cpu * 1000.0 / requests.max(1.0) * 1000.0).round() / 1000.0;
    let api_each: Vec<f64> = api0
        .iter()
        .zip(&api1)
        .take(replicas.len())
        .map(|(a, b)| b - a)
        .collect();
    let api_total: f64 = api_each.iter().sum();
    Ok(json!({
        "scenario": "lifecycle", "replicas": replicas.len(), "clients": clients, "runs": s.runs,
        "partitions": s.partitions, "chunks": s.chunks,
        "finished": finished && done == s.runs, "runs_done": done,
        "errors": st.errors.load(Ordering::Relaxed), "wall_s": (wall * 100.0).round() / 100.0,
        "chunk_reports_per_s": (chunks / wall).round(), "requests_per_s": (requests / wall).round(),
        "runs_per_s": ((done as f64 / wall) * 10.0).round() / 10.0,
        "pgbench_tps": pgbench_tps.map(f64::round),
        "chunk_reports_to_pgbench": pgbench_tps.map(|t| ((chunks / wall / t) * 1000.0).round() / 1000.0),
        "requests_to_pgbench": pgbench_tps.map(|t| ((requests / wall / t) * 1000.0).round() / 1000.0),
        "cpu_ms_per_request": {"api_server": per_request(api_total), "postgres": per_request(pg1 - pg0),
                               "each_api_server": api_each.iter().map(|&c| per_request(c)).collect::<Vec<_>>()},
        "cpu_utilisation": {"api_server": (api_total / wall * 100.0).round() / 100.0,
                            "postgres": ((pg1 - pg0) / wall * 100.0).round() / 100.0},
        "pg_connections": connections,
        "work_items_by_replica": l.by_replica.iter().map(|n| n.load(Ordering::Relaxed)).collect::<Vec<_>>(),
        "latency_ms": st.summary(),
        "dispatch_latency_ms": percentiles(&dispatch),
        "wal": wal["wal"], "updates": wal["updates"],
        "first_errors": st.first_errors(),
    }))
}

/// The ledger database's connections while a scenario runs, sampled every 100 ms on a
/// connection of its own (left out of the counts): the most open and the most busy at once
/// (`state <> 'idle'`, this includes idle in transaction), and the busy ones' mean.
struct ConnectionSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<Value>>,
}

impl ConnectionSampler {
    async fn start(b: &Bench) -> anyhow::Result<ConnectionSampler> {
        let mut db = b.db().await?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut open_max, mut busy_max, mut busy_sum, mut samples) = (0i64, 0i64, 0i64, 0i64);
            while !flag.load(Ordering::Relaxed) {
                let (open, busy): (i64, i64) = sqlx::query_as(
                    "SELECT count(*), count(*) FILTER (WHERE state <> 'idle') FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                )
                .fetch_one(&mut db)
                .await?;
                open_max = open_max.max(open);
                busy_max = busy_max.max(busy);
                busy_sum += busy;
                samples += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let mean = busy_sum as f64 / samples.max(1) as f64;
            Ok(json!({"open_max": open_max, "busy_max": busy_max,
                      "busy_mean": (mean * 10.0).round() / 10.0, "samples": samples}))
        });
        Ok(ConnectionSampler { stop, task })
    }

    async fn finish(self) -> Value {
        self.stop.store(true, Ordering::Relaxed);
        match self.task.await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => json!({"error": e.to_string()}),
            Err(e) => json!({"error": e.to_string()}),
        }
    }
}

/// Scenario 2: one run of `partitions` one-chunk partitions; every chunk report completes its
/// partition (and the last one the run).
pub async fn completion(b: &Bench, s: &Sizes, partitions: usize) -> anyhow::Result<Value> {
    let c = b.client.fresh();
    let (run, path, parts) =
        create_run(&c, &format!("completion-{}", tag()), partitions, 10).await?;
    let queue = Arc::new(Mutex::new(parts));
    let run_completed = Arc::new(AtomicUsize::new(0));
    let probe = WalProbe::start(b).await?;
    let requests0 = c.stats.requests.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..s.completion_clients)
        .map(|_| {
            let (c, queue, path, run_completed) = (
                c.clone(),
                queue.clone(),
                path.clone(),
                run_completed.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let Some((pid, rows)) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    let token = Uuid::new_v4();
                    if claim(&c, run, &pid, token).await.is_err() {
                        continue;
                    }
                    if let Ok(a) = report_chunk(&c, run, &pid, &path, token, 0, 1, rows).await
                        && a["validationScheduled"] == true
                    {
                        run_completed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    let finished = tokio::time::timeout(s.timeout, futures::future::join_all(tasks))
        .await
        .is_ok();
    let wall = t0.elapsed().as_secs_f64();
    let reports = c.stats.samples("chunk");
    let wal = probe
        .finish(b, c.stats.requests.load(Ordering::Relaxed) - requests0)
        .await?;
    Ok(json!({
        "scenario": "completion", "partitions": partitions, "clients": s.completion_clients,
        "wal": wal["wal"], "updates": wal["updates"],
        "finished": finished, "run_completed_by": run_completed.load(Ordering::SeqCst),
        "errors": c.stats.errors.load(Ordering::Relaxed),
        "partition_completing_report_ms": percentiles(&reports),
        "claim_ms": percentiles(&c.stats.samples("claim")),
        "reports_per_s": (reports.len() as f64 / wall).round(),
        "manifest_ms": percentiles(&c.stats.samples("manifest")),
    }))
}

/// Scenario 3: a manifest of `manifest_partitions` partitions, `manifest_repeats` times.
pub async fn manifest(b: &Bench, s: &Sizes) -> anyhow::Result<Value> {
    let c = b.client.fresh();
    for _ in 0..s.manifest_repeats {
        create_run(
            &c,
            &format!("manifest-{}", tag()),
            s.manifest_partitions,
            10,
        )
        .await?;
    }
    Ok(
        json!({"scenario": "manifest", "partitions": s.manifest_partitions,
              "manifest_ms": percentiles(&c.stats.samples("manifest")),
              "samples_ms": c.stats.samples("manifest").iter().map(|v| v.round()).collect::<Vec<_>>(),
              "target_ms": 150}),
    )
}

/// Scenario 4, idle: one run at a time completes; PG-05's arrival is awaited before the next.
pub async fn dispatch_idle(b: &Bench, s: &Sizes) -> anyhow::Result<Value> {
    let c = b.client.fresh();
    let mut runs = vec![];
    for _ in 0..s.dispatch_idle_runs {
        let (run, path, parts) = create_run(&c, &format!("dispatch-{}", tag()), 1, 10).await?;
        let token = Uuid::new_v4();
        claim(&c, run, &parts[0].0, token).await?;
        let arrived = b.dispatches.arrived.notified();
        tokio::pin!(arrived);
        arrived.as_mut().enable();
        report_chunk(&c, run, &parts[0].0, &path, token, 0, 1, 10).await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !b.dispatches.arrivals.lock().unwrap().contains_key(&run) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "no dispatch of {run} within 10 s"
            );
            let _ = tokio::time::timeout(Duration::from_millis(200), arrived.as_mut()).await;
            arrived.set(b.dispatches.arrived.notified());
            arrived.as_mut().enable();
        }
        runs.push(run);
    }
    let latencies = dispatch_latencies(b, &runs).await?;
    Ok(json!({"scenario": "dispatch_idle", "runs": runs.len(),
              "dispatch_latency_ms": percentiles(&latencies), "target_p99_ms": 20}))
}

/// Scenario 5: a cancel, then a partition `/fail`, each in the middle of a chunk storm on its
/// own run (§11 #24: within 2 s).
pub async fn storm(b: &Bench, s: &Sizes, clients: usize) -> anyhow::Result<Value> {
    let mut out = json!({"scenario": "cancel_and_fail_under_storm", "storm_clients": clients,
                         "target_ms": 2000});
    for action in ["cancel", "partition_fail"] {
        let c = b.client.fresh();
        let partitions = 32;
        let (run, path, parts) =
            create_run(&c, &format!("storm-{}", tag()), partitions, 1 << 40).await?;
        let mut tokens = vec![];
        for (pid, _) in &parts {
            let t = Uuid::new_v4();
            claim(&c, run, pid, t).await?;
            tokens.push((pid.clone(), t));
        }
        let tokens = Arc::new(tokens);
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicUsize::new(0));
        let storm_client = b.client.fresh();
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                let (c, tokens, stop, next, path) = (
                    storm_client.clone(),
                    tokens.clone(),
                    stop.clone(),
                    next.clone(),
                    path.clone(),
                );
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let (pid, token) = &tokens[n % tokens.len()];
                        let index = n / tokens.len();
                        let _ =
                            report_chunk(&c, run, pid, &path, *token, index, 1_000_000, 1).await;
                    }
                })
            })
            .collect();
        // Let the storm reach its steady state before the action.
        tokio::time::sleep(s.storm).await;
        let before = storm_client.stats.count("chunk");
        let t = Instant::now();
        let acted = match action {
            "cancel" => {
                c.post_operator(
                    "cancel",
                    &format!("/v1/runs/{run}/cancel"),
                    json!({"reason": "load-bench: cancel during a chunk storm"}),
                )
                .await
            }
            _ => {
                let (pid, token) = &tokens[0];
                c.post(
                    "partition_fail",
                    &format!("/v1/runs/{run}/partitions/{pid}/fail"),
                    json!({"claimToken": token, "errorStage": "EXTRACT", "errorClass": "BENCH",
                           "errorCode": "BENCH_FAILURE", "message": "load-bench: failure during a chunk storm"}),
                )
                .await
            }
        };
        let took = t.elapsed().as_secs_f64() * 1000.0;
        stop.store(true, Ordering::Relaxed);
        futures::future::join_all(tasks).await;
        out[action] = json!({"ms": took.round(), "ok": acted.is_ok(),
            "storm_reports_before": before, "storm_errors": storm_client.stats.errors.load(Ordering::Relaxed),
            "storm_reports_per_s": (before as f64 / s.storm.as_secs_f64()).round()});
    }
    Ok(out)
}

/// Scenario 6: resident memory now and at its peak, KiB.
pub fn rss(b: &Bench, when: &str) -> Value {
    let of = |pid: Option<u32>| {
        pid.and_then(procstat::rss_kib)
            .map(|(now, peak)| json!({"rss_kib": now, "peak_kib": peak}))
    };
    json!({"scenario": "rss", "when": when, "api_server": of(b.api.pid()),
           "operator": of(b.operator.pid())})
}

/// Hostile input: 4 concurrent bodies just under the size limit made of millions of tiny JSON
/// values. Their answers, and the api-server's resident memory before and after (a parser that
/// builds the whole tree first takes hundreds of MB per body).
pub async fn hostile_bodies(b: &Bench) -> anyhow::Result<Value> {
    let before = b.api.pid().and_then(procstat::rss_kib);
    let body = bytes_of_zeros(15 * 1024 * 1024);
    let http = reqwest::Client::new();
    let url = format!("{}/v1/runs", b.client.base());
    let sends = (0..4).map(|_| {
        http.post(&url)
            .bearer_auth(super::NIFI_TOKEN)
            .header("Content-Type", "application/json")
            .body(body.clone())
            .send()
    });
    let statuses: Vec<u16> = futures::future::join_all(sends)
        .await
        .into_iter()
        .map(|r| r.map(|r| r.status().as_u16()).unwrap_or(0))
        .collect();
    let after = b.api.pid().and_then(procstat::rss_kib);
    Ok(
        json!({"scenario": "hostile_bodies", "bodies": 4, "bytes_each": body.len(), "statuses": statuses,
              "api_rss_kib_before": before.map(|r| r.0), "api_rss_kib_after": after.map(|r| r.0),
              "api_peak_kib_after": after.map(|r| r.1)}),
    )
}

/// Hostile connections at the edge: `s.slow_clients` each that stay silent, trickle a head, or
/// trickle a body with a valid token, against the api-server's default deadlines, with a NiFi-like
/// client creating runs beside them. When the server closed them, and how NiFi was served.
pub async fn slow_clients(b: &Bench, s: &Sizes) -> anyhow::Result<Value> {
    let base = b.client.base().to_string();
    let port: u16 = base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no port in {base}"))?;
    let before = b.api.pid().and_then(procstat::rss_kib);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let nifi = tokio::spawn(testkit::hostile::nifi_like(
        base,
        super::NIFI_TOKEN.into(),
        stop.clone(),
    ));
    let closed = testkit::hostile::storm(port, s.slow_clients, super::NIFI_TOKEN).await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    let nifi = nifi.await?;
    let after = b.api.pid().and_then(procstat::rss_kib);
    let mut line = testkit::hostile::figures(&closed, &nifi);
    line["scenario"] = "slow_clients".into();
    line["deadlines_s"] =
        json!({"timeout_keep_alive": 5, "header_read_timeout": 10, "body_read_timeout": 10});
    line["api_rss_kib_before"] = json!(before.map(|r| r.0));
    line["api_peak_kib_after"] = json!(after.map(|r| r.1));
    Ok(line)
}

/// `[0,0,…,0]` of about `n` bytes.
fn bytes_of_zeros(n: usize) -> Vec<u8> {
    format!("[{}0]", "0,".repeat(n / 2 - 1)).into_bytes()
}

/// `next_multixact_id` as of a fresh checkpoint.
async fn next_multixact(b: &Bench) -> anyhow::Result<i64> {
    let mut db = b.db().await?;
    sqlx::query("CHECKPOINT").execute(&mut db).await?;
    let (id,): (String,) =
        sqlx::query_as("SELECT next_multixact_id::text FROM pg_control_checkpoint()")
            .fetch_one(&mut db)
            .await?;
    Ok(id.parse()?)
}

/// Scenario 7: MultiXact IDs consumed by `outcomes` dispatcher outcomes recorded by `writers`
/// concurrent senders, as the dispatcher records them (each fenced on `leader_epoch`). The
/// operator is stopped first so that this process holds the only epoch.
pub async fn multixact(b: &mut Bench, s: &Sizes, writers: usize) -> anyhow::Result<Value> {
    b.operator.stop();
    let ledger = ledger::Ledger::connect(
        &b.db_url,
        writers as u32,
        0,
        ledger::LedgerConfig::default(),
    )
    .await?;
    let fence = Arc::new(ledger.acquire_epoch("load-bench").await?);
    let before = next_multixact(b).await?;
    let t0 = Instant::now();
    let per = s.multixact_outcomes.div_ceil(writers);
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let (ledger, fence) = (ledger.clone(), fence.clone());
            tokio::spawn(async move {
                let d = ledger::LeasedDispatch {
                    dispatch_id: Uuid::new_v4(),
                    run_id: Uuid::new_v4(),
                    dispatch_type: "VALIDATE_RUN".into(),
                    partition_id: None,
                    attempt_count: 1,
                    job_key: JOB_KEY.into(),
                };
                let settings = ledger::settings::Thresholds::default();
                let outcome = ledger::SendOutcome::Delivered { http_status: 202 };
                let mut failed = 0usize;
                for _ in 0..per {
                    if ledger
                        .record_dispatch_outcome(&fence, &d, &outcome, &settings)
                        .await
                        .is_err()
                    {
                        failed += 1;
                    }
                }
                failed
            })
        })
        .collect();
    let failed: usize = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap_or(per))
        .sum();
    let wall = t0.elapsed().as_secs_f64();
    let after = next_multixact(b).await?;
    let outcomes = per * writers;
    Ok(
        json!({"scenario": "multixact", "outcomes": outcomes, "writers": writers,
              "failed": failed, "multixacts_consumed": after - before,
              "per_1000_outcomes": ((after - before) as f64 * 1000.0 / outcomes as f64 * 100.0).round() / 100.0,
              "outcomes_per_s": (outcomes as f64 / wall).round()}),
    )
}

/// The statements PostgreSQL spent most time executing since the last call (pg_stat_statements,
/// when load-bench runs with `--statements`), then resets the counts.
pub async fn statements(b: &Bench, after: &str, top: i64) -> anyhow::Result<Value> {
    let mut db = b.db().await?;
    let rows: Vec<(String, i64, f64, f64)> = sqlx::query_as(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 160), calls, total_exec_time, mean_exec_time \
           FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT $1",
    )
    .bind(top)
    .fetch_all(&mut db)
    .await?;
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&mut db)
        .await?;
    Ok(
        json!({"scenario": "statements", "after": after, "top": rows.iter().map(|(q, calls, total, mean)|
        json!({"query": q, "calls": calls, "total_ms": total.round(), "mean_ms": (mean * 1000.0).round() / 1000.0})).collect::<Vec<_>>()}),
    )
}

/// The tables whose updates the hot path makes (issue 30): their updates and HOT share.
pub(crate) const HOT_TABLES: &[&str] = &[
    "load_run",
    "load_partition",
    "load_file",
    "load_event",
    "load_dispatch",
];

/// A backend flushes its table statistics at most once a second, and an idle one up to 10 s
/// later (PostgreSQL 15's `PGSTAT_IDLE_INTERVAL`): a reading waits this out.
pub(crate) const STATS_FLUSH: Duration = Duration::from_millis(11_000);

/// WAL and row versions of one measured phase: `start` resets pg_stat_statements and reads the
/// tables' update counters, `finish` reads both again and divides by the phase's requests.
/// Every statement of the bench database counts (the operator's too: its work is the load's).
/// These figures do not depend on how the binaries were built.
pub struct WalProbe {
    tables: std::collections::HashMap<String, (i64, i64)>,
}

async fn table_updates(
    db: &mut sqlx::PgConnection,
) -> anyhow::Result<std::collections::HashMap<String, (i64, i64)>> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables \
          WHERE schemaname = 'nifi_ops' AND relname = ANY($1)",
    )
    .bind(HOT_TABLES)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|(t, u, h)| (t, (u, h))).collect())
}

impl WalProbe {
    pub async fn start(b: &Bench) -> anyhow::Result<WalProbe> {
        tokio::time::sleep(STATS_FLUSH).await;
        let mut db = b.db().await?;
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(&mut db)
            .await?;
        Ok(WalProbe {
            tables: table_updates(&mut db).await?,
        })
    }

    /// `{"wal": {records, bytes, fpi, statements, *_per_request}, "updates": {table: {upd, hot_upd, hot_share}}}`.
    pub async fn finish(self, b: &Bench, requests: u64) -> anyhow::Result<Value> {
        let mut db = b.db().await?;
        // `calls` counts statements on the wire, BEGIN and COMMIT included (track_utility is on
        // by default): each is one round trip for sqlx, which sends a statement and waits for it.
        let (records, bytes, fpi, statements): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT COALESCE(sum(wal_records), 0)::int8, COALESCE(sum(wal_bytes), 0)::int8, \
                    COALESCE(sum(wal_fpi), 0)::int8, COALESCE(sum(calls), 0)::int8 \
               FROM pg_stat_statements WHERE toplevel \
                AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_one(&mut db)
        .await?;
        tokio::time::sleep(STATS_FLUSH).await;
        let after = table_updates(&mut db).await?;
        let per = |v: i64| (v as f64 / requests.max(1) as f64 * 10.0).round() / 10.0;
        let mut updates = serde_json::Map::new();
        for t in HOT_TABLES {
            let (u1, h1) = after.get(*t).copied().unwrap_or_default();
            let (u0, h0) = self.tables.get(*t).copied().unwrap_or_default();
            let (upd, hot) = (u1 - u0, h1 - h0);
            let share = if upd > 0 {
                Some((hot as f64 / upd as f64 * 1000.0).round() / 1000.0)
            } else {
                None
            };
            updates.insert(
                (*t).to_string(),
                json!({"upd": upd, "hot_upd": hot, "hot_share": share, "upd_per_request": per(upd)}),
            );
        }
        Ok(json!({
            "wal": {"requests": requests, "records": records, "bytes": bytes, "fpi": fpi,
                    "records_per_request": per(records), "bytes_per_request": per(bytes),
                    "statements": statements, "statements_per_request": per(statements)},
            "updates": updates,
        }))
    }
}

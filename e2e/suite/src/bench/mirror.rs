//! The LoadRun mirror at scale (issue 11): N runs in the ledger (most ended, some active) under a
//! LoadJob, the operator binary in Kubernetes mode against a real kube-apiserver (kubetest), then
//! paced ledger changes. Measures the initial sync, the lag from each change's commit to the
//! LoadRun showing it, the API server's request count per change (its own metrics), and the
//! operator's CPU and memory.
use super::client::percentiles;
use super::{Bench, procstat};
use crate::standalone::Service;
use anyhow::Context as _;
use futures::StreamExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use uuid::Uuid;

#[derive(Clone, Debug)]
pub struct MirrorSizes {
    pub runs: usize,
    pub active: usize,
    pub changes: usize,
    pub changes_per_second: f64,
    pub timeout: Duration,
}

const JOB_KEY: &str = "MIRROR_BENCH";

/// The API server's `apiserver_request_total`, summed by `resource verb` for our resources.
async fn request_counts(client: &kube::Client) -> anyhow::Result<BTreeMap<String, f64>> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let (labels, value) = line.rsplit_once(' ').context("metric line")?;
        let label = |k: &str| {
            labels
                .split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let resource = label("resource");
        if !["loadruns", "loadjobs", "events", "leases"].contains(&resource.as_str()) {
            continue;
        }
        let sub = label("subresource");
        let key = format!(
            "{resource}{}{} {}",
            if sub.is_empty() { "" } else { "/" },
            sub,
            label("verb")
        );
        *out.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    Ok(out)
}

fn delta(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

/// Counts the LoadRuns with a status (a phase) from a watch, so that waiting for the initial sync
/// does not load the API server: a full LIST of 10,000 LoadRuns every 500 ms, as this bench did
/// before, kept kube-apiserver at its limit and slowed the very sync it measured.
fn count_mirrored(
    api: Api<crds::LoadRun>,
) -> (
    tokio::sync::watch::Receiver<usize>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::watch::channel(0);
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut with_phase = std::collections::HashSet::new();
        let mut relisting = std::collections::HashSet::new();
        while let Some(Ok(ev)) = stream.next().await {
            let has_phase =
                |lr: &crds::LoadRun| lr.status.as_ref().is_some_and(|s| !s.phase.is_empty());
            match ev {
                watcher::Event::Apply(lr) if has_phase(&lr) => {
                    with_phase.insert(lr.metadata.name.unwrap_or_default());
                }
                watcher::Event::Delete(lr) => {
                    with_phase.remove(&lr.metadata.name.unwrap_or_default());
                }
                watcher::Event::Init => relisting.clear(),
                watcher::Event::InitApply(lr) if has_phase(&lr) => {
                    relisting.insert(lr.metadata.name.unwrap_or_default());
                }
                watcher::Event::InitDone => with_phase = std::mem::take(&mut relisting),
                _ => continue,
            }
            let _ = tx.send(with_phase.len());
        }
    });
    (rx, task)
}

/// LoadRuns in `ns` with a status (a phase), by one paged LIST (for the error message).
async fn mirrored(api: &Api<crds::LoadRun>) -> anyhow::Result<usize> {
    let mut n = 0;
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = api.list(&lp).await?;
        n += page
            .items
            .iter()
            .filter(|lr| lr.status.as_ref().is_some_and(|s| !s.phase.is_empty()))
            .count();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return Ok(n),
        }
    }
}

pub async fn mirror(b: &Bench, s: &MirrorSizes) -> anyhow::Result<Value> {
    let cp = kubetest::ControlPlane::start()
        .await
        .context("kube-apiserver + etcd (scripts/controlplane-build, LC_CONTROLPLANE_BIN)")?;
    let outcome = measure(b, s, &cp).await;
    cp.stop();
    outcome
}

async fn measure(b: &Bench, s: &MirrorSizes, cp: &kubetest::ControlPlane) -> anyhow::Result<Value> {
    let all = crds::all_crds_yaml();
    cp.install_crds(&all).await?;
    let ns = cp.create_namespace("bench").await?;
    let admin = cp.client().await?;
    let job: crds::LoadJob = serde_json::from_value(json!({
        "apiVersion": "loadcontrol.io/v1beta1", "kind": "LoadJob",
        "metadata": {"name": "mirror-bench"}, "spec": {"jobKey": JOB_KEY}}))?;
    Api::<crds::LoadJob>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &job)
        .await?;
    // The ledger: `runs` runs of the job, all but `active` of them cancelled (ended), through
    // the ledger's own operations; then the ended ones are dated back two hours (test data).
    let ledger = ledger::Ledger::connect(&b.db_url, 16, 0, ledger::LedgerConfig::default()).await?;
    let actor = ledger::Actor {
        name: "load-bench".into(),
        role: "operator".into(),
    };
    let seeded = Instant::now();
    let ids: Vec<Uuid> = futures::stream::iter(0..s.runs)
        .map(|n| {
            let (ledger, actor) = (ledger.clone(), actor.clone());
            let active = s.active;
            async move {
                let run = ledger
                    .create_run(&ledger::NewRun {
                        job_key: JOB_KEY.into(),
                        business_key: format!("bk-{n:06}"),
                        hdfs_root: "/data/bench/".into(),
                        stage_table_prefix: "tmp_bench_".into(),
                        allow_empty_source: false,
                        parameters: Default::default(),
                    })
                    .await?;
                if n >= active {
                    ledger
                        .cancel_run(run.run_id, "load-bench: an ended run", &actor, None)
                        .await?;
                }
                anyhow::Ok(run.run_id)
            }
        })
        .buffered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    // History: the ended runs ended within the last day (the mirror shows a day), not just now.
    sqlx::query(
        "UPDATE nifi_ops.load_run SET completed_at = completed_at - interval '2 hours' \
          WHERE job_key = $1 AND completed_at IS NOT NULL",
    )
    .bind(JOB_KEY)
    .execute(&mut b.db().await?)
    .await?;
    let seed_s = seeded.elapsed().as_secs_f64();
    // The operator as shipped, in Kubernetes mode, watching the one namespace.
    let cfg = b.config.to_str().context("config path")?;
    let kubeconfig = cp
        .kubeconfig
        .to_str()
        .context("kubeconfig path")?
        .to_string();
    let mut op = Service::new(
        "operator-kube",
        b.bin_dir.join("load-control-operator"),
        &[
            "--config",
            cfg,
            "--namespace",
            &ns,
            "--watch-namespace",
            &ns,
        ],
        &[
            ("KUBECONFIG", &kubeconfig),
            ("POD_NAME", "bench-operator-kube"),
            ("LC_INSTALLATION", "bench"),
        ],
        &b.logs,
    );
    let runs_api: Api<crds::LoadRun> = Api::namespaced(admin.clone(), &ns);
    let (mut count, counter) = count_mirrored(runs_api.clone());
    let counts0 = request_counts(&admin).await?;
    op.start()?;
    let pid = op.pid().context("operator pid")?;
    let started = Instant::now();
    let jobs_api: Api<crds::LoadJob> = Api::namespaced(admin.clone(), &ns);
    let synced_in = tokio::time::timeout(s.timeout, count.wait_for(|n| *n >= s.runs)).await;
    counter.abort();
    if !matches!(synced_in, Ok(Ok(_))) {
        let job = jobs_api.get("mirror-bench").await?;
        anyhow::bail!(
            "the initial sync did not finish within {:?} ({} of {} LoadRuns; LoadJob status {:?}): {}",
            s.timeout,
            mirrored(&runs_api).await?,
            s.runs,
            job.status,
            op.log_tail(20)
        );
    }
    let initial_sync_s = started.elapsed().as_secs_f64();
    let synced = request_counts(&admin).await?;
    // The changes: cancel `changes` active runs at a steady pace; a watch sees each LoadRun
    // turn CANCELLED.
    let targets: Vec<Uuid> = ids.iter().take(s.active.min(s.changes)).copied().collect();
    let committed: Arc<Mutex<HashMap<String, SystemTime>>> = Arc::default();
    let seen: Arc<Mutex<HashMap<String, SystemTime>>> = Arc::default();
    let watch = {
        let seen = seen.clone();
        let wanted: std::collections::HashSet<String> =
            targets.iter().map(Uuid::to_string).collect();
        let mut stream = watcher(runs_api.clone(), watcher::Config::default())
            .default_backoff()
            .boxed();
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut listed_tx = Some(listed_tx);
            while let Some(Ok(ev)) = stream.next().await {
                match ev {
                    watcher::Event::InitDone => {
                        if let Some(tx) = listed_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    // A restarted watch lists again: its objects come as InitApply.
                    watcher::Event::Apply(lr) | watcher::Event::InitApply(lr)
                        if lr.status.as_ref().is_some_and(|s| s.phase == "CANCELLED")
                            && wanted.contains(&lr.spec.run_id) =>
                    {
                        seen.lock()
                            .unwrap()
                            .entry(lr.spec.run_id.clone())
                            .or_insert_with(SystemTime::now);
                    }
                    _ => {}
                }
            }
        });
        // The count of requests the changes cause starts after this watch's own LIST.
        tokio::time::timeout(Duration::from_secs(60), listed)
            .await
            .context("the bench's LoadRun watch did not list within 60 s")??;
        task
    };
    let counts1 = request_counts(&admin).await?;
    let cpu0 = procstat::tree_cpu_seconds(pid);
    let changes_started = Instant::now();
    let pace = Duration::from_secs_f64(1.0 / s.changes_per_second.max(0.1));
    for (i, id) in targets.iter().enumerate() {
        let due = changes_started + pace * i as u32;
        tokio::time::sleep_until(due.into()).await;
        // Taken before the cancel: the mirror may show it before the call has returned here, and
        // a lag measured from after the call would then be negative (and the change lost).
        let began = SystemTime::now();
        ledger
            .cancel_run(*id, "load-bench: a mirrored change", &actor, None)
            .await?;
        committed.lock().unwrap().insert(id.to_string(), began);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.lock().unwrap().len() < targets.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Late requests the changes caused (debounced LoadJob status, Events) settle first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu1 = procstat::tree_cpu_seconds(pid);
    let counts2 = request_counts(&admin).await?;
    watch.abort();
    let rss = procstat::rss_kib(pid);
    op.stop();
    let lags: Vec<f64> = {
        let (c, v) = (committed.lock().unwrap(), seen.lock().unwrap());
        c.iter()
            .filter_map(|(id, at)| {
                let lag = v.get(id)?.duration_since(*at).unwrap_or_default();
                Some(lag.as_secs_f64() * 1000.0)
            })
            .collect()
    };
    let change_requests = delta(&counts2, &counts1);
    let caused: f64 = change_requests
        .iter()
        .filter(|(k, _)| !k.starts_with("leases"))
        .map(|(_, v)| v)
        .sum();
    Ok(json!({
        "scenario": "mirror", "runs": s.runs, "active": s.active, "seed_s": (seed_s * 10.0).round() / 10.0,
        "initial_sync_s": (initial_sync_s * 10.0).round() / 10.0,
        "initial_sync_requests": delta(&synced, &counts0),
        "changes": targets.len(), "changes_per_s": s.changes_per_second, "changes_seen": lags.len(),
        "lag_ms": percentiles(&lags),
        "api_requests_per_change": ((caused / targets.len().max(1) as f64) * 100.0).round() / 100.0,
        "change_requests": change_requests,
        "operator_cpu_ms_per_change": (((cpu1 - cpu0) * 1000.0 / targets.len().max(1) as f64) * 100.0).round() / 100.0,
        "operator_rss_kib": rss.map(|r| r.0), "operator_peak_kib": rss.map(|r| r.1),
        "targets": {"lag_p99_ms": 1000, "api_requests_per_change": 2, "rss_mib": 64},
    }))
}

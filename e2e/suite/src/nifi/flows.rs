//! The process groups' logic, driven by the runs of a [`Plan`] and by PG-05's dispatches.
use crate::nifi::api::{Answer, NifiClient};
use crate::nifi::faults::{FaultKind, Faults};
use crate::nifi::receiver::{Behaviour, Dispatch, DispatchKind, Receiver, ReceiverStats};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex as AsyncMutex, Semaphore, mpsc};
use uuid::Uuid;

/// What to load and how.
#[derive(Clone, Debug)]
pub struct Plan {
    pub job_key: String,
    /// Business keys are `<prefix>-<n>`.
    pub business_key_prefix: String,
    pub runs: usize,
    /// Runs in flight at once.
    pub concurrent_runs: usize,
    pub partitions: usize,
    pub chunks: usize,
    pub rows_per_chunk: u64,
    /// NiFi nodes running PG-20, each with two concurrent calls.
    pub nodes: usize,
    pub hdfs_root: String,
    /// How long one run may take to reach a final state.
    pub run_timeout: Duration,
    /// This many runs (the first ones) report PUBLISH_UNKNOWN, besides the random fault.
    pub publish_unknown_runs: usize,
    /// This many runs (the first to publish) never get an answer to their publish claim, neither
    /// to NiFi's retries nor to PG-90's resends: odd ones after the claim landed (the answer
    /// lost), even ones before it reached the api-server.
    pub unanswered_publish_claims: usize,
    /// PG-90's own retry budget for a call whose NiFi retries ran out (docs/nifi.md): it is sent
    /// again every 2 s for this long before the flow reports the failure instead.
    pub pg90_budget: Duration,
    /// Once this file exists no further run starts (runs under way finish): a load that lasts
    /// as long as a test's faults do. The summary's `runs` counts the runs started.
    pub stop_file: Option<std::path::PathBuf>,
}

impl Default for Plan {
    fn default() -> Plan {
        Plan {
            job_key: "NIFI_SIM".into(),
            business_key_prefix: format!("sim-{}", &Uuid::new_v4().simple().to_string()[..8]),
            runs: 3,
            concurrent_runs: 4,
            partitions: 4,
            chunks: 3,
            rows_per_chunk: 100,
            nodes: 2,
            hdfs_root: "/data/nifi/stage/".into(),
            run_timeout: Duration::from_secs(120),
            publish_unknown_runs: 0,
            unanswered_publish_claims: 0,
            pg90_budget: Duration::from_secs(120),
            stop_file: None,
        }
    }
}

/// What happened, for the closing report and for assertions.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    pub runs: usize,
    /// Final status of each run, by status.
    pub final_status: BTreeMap<String, usize>,
    pub run_ids: Vec<Uuid>,
    /// Runs that did not reach a final state in time.
    pub unfinished: Vec<String>,
    pub faults_injected: BTreeMap<FaultKind, u64>,
    /// Answers the contract does not allow (a late report accepted, a refused valid call…).
    pub anomalies: Vec<String>,
    /// Calls that found no answer after NiFi's retries (the server down too long): PG-90 took
    /// over where it could. Expected under injected outages, never otherwise.
    pub gave_up: Vec<String>,
    pub receiver: ReceiverStats,
    pub requests: u64,
    /// Attempts that failed as NiFi saw them (5xx by status, or "transport"), retried or not.
    pub failed_attempts: BTreeMap<String, u64>,
    /// The longest single attempt of any call (a NiFi thread's longest wait on load-control).
    pub slowest_attempt: super::api::SlowestAttempt,
    /// Every effect load-control acknowledged to this flow (created, chunk accepted, stage
    /// validated, publish claimed, final status seen): `e2e::check::acknowledged` finds each one
    /// in the ledger afterwards, or reports it lost.
    pub acknowledged: Vec<Value>,
    /// Calls PG-90 sent again after NiFi's retries ran out, and how many of them got an answer.
    pub pg90_resent: u64,
    pub pg90_answered: u64,
    pub wall_seconds: f64,
}

struct PartitionTask {
    run_id: Uuid,
    partition_id: String,
    hdfs_run_path: String,
    expected_rows: u64,
    reissue: bool,
}

struct Shared {
    api: NifiClient,
    faults: Arc<Faults>,
    plan: Plan,
    anomalies: Mutex<Vec<String>>,
    gave_up: Mutex<Vec<String>>,
    acknowledged: Mutex<Vec<Value>>,
    pg90_resent: AtomicUsize,
    pg90_answered: AtomicUsize,
    /// Owners that crashed mid-partition: (run, partition) → their claim token.
    crashed: Mutex<HashMap<(Uuid, String), Uuid>>,
    publish_unknown_left: AtomicUsize,
    /// Publish claims still to leave unanswered, counting down (`Plan::unanswered_publish_claims`).
    unanswered_claims_left: AtomicUsize,
    requests: AtomicUsize,
    work: mpsc::UnboundedSender<PartitionTask>,
}

impl Shared {
    fn anomaly(&self, what: String) {
        tracing::warn!(event = "sim_anomaly", %what);
        self.anomalies.lock().unwrap().push(what);
    }

    async fn post(&self, path: &str, body: Value) -> Option<Answer> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match self.api.post(path, body).await {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!(event = "sim_gave_up", error = %e);
                self.gave_up.lock().unwrap().push(e);
                None
            }
        }
    }

    fn ack(&self, what: Value) {
        self.acknowledged.lock().unwrap().push(what);
    }

    /// PG-90's retry budget: a call whose NiFi retries ran out (an outage longer than the retry
    /// schedule's waits: 4.5 min on NiFi's clock, 7.5 s at the suites' scale) is sent again, same
    /// body, every 2 s for `plan.pg90_budget`. Every call of this API
    /// is safe to replay (docs/nifi.md). None when the budget ran out too.
    async fn resend(&self, path: &str, body: Value) -> Option<Answer> {
        self.pg90_resent.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + self.plan.pg90_budget;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(2)).await;
            self.requests.fetch_add(1, Ordering::Relaxed);
            if let Ok(a) = self.api.post(path, body.clone()).await {
                self.pg90_answered.fetch_add(1, Ordering::Relaxed);
                return Some(a);
            }
        }
        tracing::warn!(
            event = "sim_pg90_gave_up",
            path,
            "PG-90's retry budget ran out too"
        );
        None
    }

    /// A call, and PG-90's resend when NiFi's retries ran out.
    async fn post_or_resend(&self, path: &str, body: Value) -> Option<Answer> {
        match self.post(path, body.clone()).await {
            Some(a) => Some(a),
            None => self.resend(path, body).await,
        }
    }

    /// PG-90 for EXTRACT/CHUNK_WRITE: the partition's final failure, with the claim's token. When
    /// the claim itself never landed (409: not this token's), the run is failed instead, so that
    /// nothing waits for `recovery.stale`.
    async fn fail_partition(&self, run: Uuid, pid: &str, token: Uuid, stage: &str) {
        let body = json!({"claimToken": token, "errorStage": stage, "errorClass": "NIFI",
                          "errorCode": "NIFI_RETRIES_EXHAUSTED", "message": "NiFi gave up after its retries"});
        match self
            .post_or_resend(&format!("/v1/runs/{run}/partitions/{pid}/fail"), body)
            .await
        {
            Some(a) if a.ok() => {}
            Some(a) if a.status == 409 && a.code() == "CLAIM_MISMATCH" && stage == "EXTRACT" => {
                self.fail_run(run, "EXTRACTING", "FAILED_EXTRACT", stage)
                    .await
            }
            // 409 otherwise: reissued to another owner, or the run moved on; nothing to do.
            Some(a) if a.status == 409 => {}
            Some(a) => self.anomaly(format!(
                "PG-90 partition fail {run}/{pid}: {} {}",
                a.status, a.body
            )),
            None => {}
        }
    }

    /// PG-90: a stage gave up after its retries; fail the run (expected → fail status).
    async fn fail_run(&self, run: Uuid, expected: &str, fail: &str, stage: &str) {
        let body = json!({"expectedStatus": expected, "failStatus": fail, "errorStage": stage,
                          "errorCode": "NIFI_RETRIES_EXHAUSTED", "message": "NiFi gave up after its retries"});
        for _ in 0..10 {
            match self
                .api
                .post(&format!("/v1/runs/{run}/fail"), body.clone())
                .await
            {
                // 409: the run moved on meanwhile (the call that seemed lost was applied).
                Ok(a) if a.ok() || a.status == 409 => return,
                Ok(a) => return self.anomaly(format!("PG-90 fail {run}: {} {}", a.status, a.body)),
                Err(_) => tokio::time::sleep(Duration::from_secs(2)).await,
            }
        }
        self.anomaly(format!("PG-90 could not report the failure of {run}"));
    }

    /// PG-90 for a publish claim that never got an answer: the INSERT OVERWRITE was not started,
    /// so the run failed to publish. The claim's own token reports it when the claim landed; a
    /// 409 `PUBLISH_TOKEN_MISMATCH` says it did not, and the run is failed instead.
    async fn fail_unstarted_publish(&self, run: Uuid, token: Uuid) {
        let body = json!({"publishToken": token, "outcome": "FAILED_PUBLISH", "errorCode": "NIFI_RETRIES_EXHAUSTED",
                          "message": "NiFi gave up on the publish claim after its retries; nothing was published"});
        match self
            .post_or_resend(&format!("/v1/runs/{run}/publish/result"), body)
            .await
        {
            Some(a) if a.ok() => {}
            Some(a) if a.status == 409 && a.code() == "PUBLISH_TOKEN_MISMATCH" => {
                self.fail_run(run, "STAGING_VALIDATED", "FAILED_PUBLISH", "PUBLISH")
                    .await
            }
            // 409 otherwise: another claimant holds the publish or the run ended; not ours.
            Some(a) if a.status == 409 => {}
            Some(a) => self.anomaly(format!("PG-90 publish fail {run}: {} {}", a.status, a.body)),
            None => {}
        }
    }

    /// PG-90 for the STAGE_VALIDATION failing stage: STAGE_VALIDATING → FAILED_STAGE_VALIDATION.
    async fn fail_stage_validation(&self, run: Uuid) {
        self.fail_run(
            run,
            "STAGE_VALIDATING",
            "FAILED_STAGE_VALIDATION",
            "STAGE_VALIDATION",
        )
        .await
    }

    /// A call whose only acceptable answer is 200.
    async fn post_ok(&self, path: &str, body: Value) -> Option<Answer> {
        let a = self.post(path, body).await?;
        if !a.ok() {
            self.anomaly(format!("POST {path}: {} {}", a.status, a.body));
            return None;
        }
        Some(a)
    }
}

pub struct Simulation {
    shared: Arc<Shared>,
    receiver: Receiver,
    work_rx: Option<mpsc::UnboundedReceiver<PartitionTask>>,
    dispatches: Option<mpsc::UnboundedReceiver<Dispatch>>,
}

const FINAL: &[&str] = &[
    "SUCCESS",
    "FAILED_MANIFEST",
    "FAILED_EXTRACT",
    "FAILED_STAGE_VALIDATION",
    "FAILED_PUBLISH",
    "FAILED_TARGET_VALIDATION",
    "FAILED_SNAPSHOT_EXPIRED",
    "TIMED_OUT",
    "CANCELLED",
    "PUBLISH_UNKNOWN",
];

impl Simulation {
    /// Starts PG-05 on `receiver_addr` under `receiver_prefix` (the path part of the receiver URL
    /// load-control is configured with).
    pub async fn start(
        api: NifiClient,
        faults: Arc<Faults>,
        plan: Plan,
        receiver_addr: &str,
        receiver_prefix: &str,
        behaviour: Behaviour,
    ) -> anyhow::Result<Simulation> {
        let (dtx, drx) = mpsc::unbounded_channel();
        let receiver = Receiver::start(receiver_addr, receiver_prefix, behaviour, dtx).await?;
        let (wtx, wrx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            api,
            faults,
            publish_unknown_left: AtomicUsize::new(plan.publish_unknown_runs),
            unanswered_claims_left: AtomicUsize::new(plan.unanswered_publish_claims),
            plan,
            anomalies: Mutex::default(),
            gave_up: Mutex::default(),
            acknowledged: Mutex::default(),
            pg90_resent: AtomicUsize::new(0),
            pg90_answered: AtomicUsize::new(0),
            crashed: Mutex::default(),
            requests: AtomicUsize::new(0),
            work: wtx,
        });
        Ok(Simulation {
            shared,
            receiver,
            work_rx: Some(wrx),
            dispatches: Some(drx),
        })
    }

    pub fn receiver_addr(&self) -> std::net::SocketAddr {
        self.receiver.addr
    }

    /// Runs the plan to the end: every run final (or timed out), then the summary.
    pub async fn run(mut self) -> Summary {
        let started = Instant::now();
        let sh = self.shared.clone();
        // PG-20: nodes × 2 workers on one queue.
        let queue = Arc::new(AsyncMutex::new(self.work_rx.take().expect("run once")));
        let mut workers = vec![];
        for node in 0..sh.plan.nodes.max(1) {
            for _ in 0..2 {
                let (sh, queue) = (sh.clone(), queue.clone());
                let name = format!("nifi-{:02}", node + 1);
                workers.push(tokio::spawn(async move {
                    loop {
                        let task = { queue.lock().await.recv().await };
                        let Some(task) = task else { break };
                        extract_partition(&sh, &name, task).await;
                    }
                }));
            }
        }
        // PG-05 → PG-40/50/60 or PG-20.
        let mut dispatches = self.dispatches.take().expect("run once");
        let dsh = sh.clone();
        let dispatch_loop = tokio::spawn(async move {
            while let Some(d) = dispatches.recv().await {
                let sh = dsh.clone();
                tokio::spawn(async move { on_dispatch(&sh, d).await });
            }
        });
        // PG-10: the runs, bounded in flight.
        let gate = Arc::new(Semaphore::new(sh.plan.concurrent_runs.max(1)));
        let mut runs = vec![];
        for n in 0..sh.plan.runs {
            let (sh, gate) = (sh.clone(), gate.clone());
            runs.push(tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.expect("semaphore");
                if sh.plan.stop_file.as_ref().is_some_and(|f| f.exists()) {
                    return None;
                }
                Some(drive_run(&sh, n).await)
            }));
        }
        let mut final_status = BTreeMap::new();
        let (mut run_ids, mut unfinished, mut runs_started) = (vec![], vec![], 0);
        for r in runs {
            let Some(outcome) = r.await.expect("run task") else {
                continue; // not started: the stop file was there
            };
            runs_started += 1;
            match outcome {
                (Some(id), Some(status)) => {
                    run_ids.push(id);
                    *final_status.entry(status).or_insert(0) += 1;
                }
                (id, _) => {
                    if let Some(id) = id {
                        run_ids.push(id);
                    }
                    unfinished.push(
                        id.map(|i| i.to_string())
                            .unwrap_or_else(|| "(not created)".into()),
                    );
                }
            }
        }
        dispatch_loop.abort();
        for w in workers {
            w.abort();
        }
        let receiver = self.receiver.stats.lock().unwrap().clone();
        Summary {
            runs: runs_started,
            final_status,
            run_ids,
            unfinished,
            faults_injected: sh.faults.injected(),
            anomalies: sh.anomalies.lock().unwrap().clone(),
            gave_up: sh.gave_up.lock().unwrap().clone(),
            acknowledged: sh.acknowledged.lock().unwrap().clone(),
            pg90_resent: sh.pg90_resent.load(Ordering::Relaxed) as u64,
            pg90_answered: sh.pg90_answered.load(Ordering::Relaxed) as u64,
            receiver,
            requests: sh.requests.load(Ordering::Relaxed) as u64,
            failed_attempts: sh.api.failed_attempts.lock().unwrap().clone(),
            slowest_attempt: sh.api.slowest_attempt.lock().unwrap().clone(),
            wall_seconds: started.elapsed().as_secs_f64(),
        }
    }
}

/// PG-10, then waits for the run to reach a final state. Returns (run id, final status).
async fn drive_run(sh: &Shared, n: usize) -> (Option<Uuid>, Option<String>) {
    let plan = &sh.plan;
    let business_key = format!("{}-{n:05}", plan.business_key_prefix);
    let Some((run_id, path)) = create_run(sh, &business_key).await else {
        return (None, None);
    };
    let rows = plan.rows_per_chunk * plan.chunks as u64;
    // The manifest as NiFi sends it: every number and boolean a string.
    let partitions: Vec<Value> = (0..plan.partitions)
        .map(|p| {
            json!({"partitionId": format!("{p:04}"), "lowerBound": (p * 1000).to_string(),
                   "upperBound": ((p + 1) * 1000).to_string(),
                   "upperInclusive": (p + 1 == plan.partitions).to_string(),
                   "isNullPartition": "false", "expectedRowCount": rows.to_string()})
        })
        .collect();
    let total = rows * plan.partitions as u64;
    let manifest = json!({"snapshotScn": "1234567890", "sourceCount": total.to_string(),
        "sourceNullSplitCount": "0", "sourceMinSplit": "0",
        "sourceMaxSplit": (plan.partitions * 1000).to_string(),
        "plannedPartitionCount": plan.partitions.to_string(),
        "sourceMetrics": {"AMOUNT_SUM": "123.45"}, "partitions": partitions});
    let Some(m) = sh
        .post_ok(&format!("/v1/runs/{run_id}/manifest"), manifest)
        .await
    else {
        // PG-90: MANIFEST failing stage → run fail CREATED → FAILED_MANIFEST.
        sh.fail_run(run_id, "CREATED", "FAILED_MANIFEST", "MANIFEST")
            .await;
        return (Some(run_id), wait_final(sh, run_id).await);
    };
    for p in m.body["dispatchPartitions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let _ = sh.work.send(PartitionTask {
            run_id,
            partition_id: p["partitionId"].as_str().unwrap_or_default().to_string(),
            hdfs_run_path: path.clone(),
            expected_rows: p["expectedRowCount"].as_u64().unwrap_or(0),
            reissue: false,
        });
    }
    (Some(run_id), wait_final(sh, run_id).await)
}

/// Waits for a final state, as a dashboard would; None when the plan's run timeout passes.
async fn wait_final(sh: &Shared, run_id: Uuid) -> Option<String> {
    let deadline = Instant::now() + sh.plan.run_timeout;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sh.requests.fetch_add(1, Ordering::Relaxed);
        if let Ok(a) = sh.api.get(&format!("/v1/runs/{run_id}")).await {
            let status = a.str("status").to_string();
            if FINAL.contains(&status.as_str()) {
                sh.ack(json!({"kind": "final", "runId": run_id, "status": status}));
                return Some(status);
            }
        }
    }
    None
}

/// PG-10's create. A create whose answer was lost is retried and answered 409
/// DUPLICATE_ACTIVE_RUN: the flow then adopts the run it created, found by its key (still CREATED).
async fn create_run(sh: &Shared, business_key: &str) -> Option<(Uuid, String)> {
    let plan = &sh.plan;
    let body = json!({"jobKey": plan.job_key, "businessKey": business_key, "hdfsRoot": plan.hdfs_root,
                      "stageTablePrefix": "tmp_sim_", "allowEmptySource": false,
                      "parameters": {"trigger": "nifi-sim"}});
    let created = sh.post_or_resend("/v1/runs", body).await?;
    if created.ok() {
        let run_id = Uuid::parse_str(created.str("runId")).ok()?;
        sh.ack(json!({"kind": "created", "runId": run_id}));
        return Some((run_id, created.str("hdfsRunPath").to_string()));
    }
    if created.status == 409 && created.code() == "DUPLICATE_ACTIVE_RUN" {
        let query = format!(
            "/v1/runs?jobKey={}&businessKey={business_key}&status=CREATED&limit=1",
            plan.job_key
        );
        let found = sh.api.get(&query).await.ok()?;
        let run_id = Uuid::parse_str(found.body.as_array()?.first()?["runId"].as_str()?).ok()?;
        sh.ack(json!({"kind": "created", "runId": run_id}));
        let detail = sh.api.get(&format!("/v1/runs/{run_id}")).await.ok()?;
        return Some((run_id, detail.str("hdfsRunPath").to_string()));
    }
    sh.anomaly(format!(
        "POST /v1/runs: {} {}",
        created.status, created.body
    ));
    None
}

/// PG-20 on one node: claim, then report every chunk (or crash halfway).
async fn extract_partition(sh: &Shared, node: &str, task: PartitionTask) {
    let (run, pid) = (task.run_id, task.partition_id.clone());
    let token = Uuid::new_v4();
    let base = format!("/v1/runs/{run}/partitions/{pid}");
    let claim_body = json!({"claimToken": token, "workerNode": node});
    let claim = match sh.post(&format!("{base}/claim"), claim_body).await {
        Some(a) if a.ok() => a,
        Some(a) => return sh.anomaly(format!("POST {base}/claim: {} {}", a.status, a.body)),
        // PG-90: EXTRACT failing stage. The claim may have landed without its answer.
        None => return sh.fail_partition(run, &pid, token, "EXTRACT").await,
    };
    if !claim.flag("claimed") {
        return; // another owner, or the run ended: nothing to do
    }
    // A superseded owner (crashed before the reissue) reports late: it must be refused.
    if task.reissue {
        let old = sh.crashed.lock().unwrap().remove(&(run, pid.clone()));
        if let Some(old) = old.filter(|_| sh.faults.draw(FaultKind::LateReport)) {
            let late = json!({"claimToken": old, "chunkIndex": 0, "chunkCount": sh.plan.chunks,
                "hdfsPath": format!("{}/p={pid}/late-{old}.parquet", task.hdfs_run_path),
                "recordCount": sh.plan.rows_per_chunk, "byteCount": 1024});
            if let Some(a) = sh.post(&format!("{base}/chunks"), late).await
                && !(a.status == 409 && a.code() == "CLAIM_MISMATCH")
            {
                sh.anomaly(format!(
                    "late report of a superseded owner answered {} {}",
                    a.status, a.body
                ));
            }
        }
    }
    let chunks = sh.plan.chunks.max(1);
    let crash_after = (!task.reissue && sh.faults.draw(FaultKind::NodeCrash)).then_some(chunks / 2);
    let per_chunk = task.expected_rows / chunks as u64;
    for i in 0..chunks {
        if crash_after == Some(i) {
            sh.crashed.lock().unwrap().insert((run, pid.clone()), token);
            return; // the node died: no more reports, no failure report
        }
        let rows = if i + 1 == chunks {
            task.expected_rows - per_chunk * (chunks as u64 - 1)
        } else {
            per_chunk
        };
        let body = json!({"claimToken": token, "chunkIndex": i, "chunkCount": chunks,
            "fragmentIdentifier": format!("f-{token}"),
            "hdfsPath": format!("{}/p={pid}/{}/part-{i:05}.parquet", task.hdfs_run_path, &token.simple().to_string()[..8]),
            "recordCount": rows, "byteCount": rows * 64});
        let Some(a) = sh.post_or_resend(&format!("{base}/chunks"), body).await else {
            // PG-90: CHUNK_WRITE failing stage, after its own retry budget.
            return sh.fail_partition(run, &pid, token, "CHUNK_WRITE").await;
        };
        if a.ok() && a.flag("recorded") {
            sh.ack(json!({"kind": "chunk", "runId": run, "partitionId": pid, "chunkIndex": i}));
        }
        if !a.ok() {
            // A run that ended meanwhile (timeout, cancel) refuses nothing here; anything else is wrong.
            sh.anomaly(format!("chunk {i} of {run}/{pid}: {} {}", a.status, a.body));
            return;
        }
    }
}

/// PG-05 started a flow: VALIDATE_RUN → PG-40, PG-50, PG-60; REISSUE_PARTITION → PG-20.
async fn on_dispatch(sh: &Shared, d: Dispatch) {
    match d.kind {
        DispatchKind::Reissue => {
            let b = &d.body;
            let _ = sh.work.send(PartitionTask {
                run_id: d.run_id,
                partition_id: b["partitionId"].as_str().unwrap_or_default().to_string(),
                hdfs_run_path: b["hdfsRunPath"].as_str().unwrap_or_default().to_string(),
                expected_rows: b["expectedRowCount"].as_u64().unwrap_or(0),
                reissue: true,
            });
        }
        DispatchKind::Validate => validate_and_publish(sh, d.run_id, d.dispatch_id).await,
    }
}

async fn validate_and_publish(sh: &Shared, run: Uuid, dispatch: Uuid) {
    // PG-40
    let Some(start) = sh
        .post_ok(
            &format!("/v1/runs/{run}/validation/start"),
            json!({"dispatchId": dispatch, "node": "nifi-01"}),
        )
        .await
    else {
        return; // VALIDATION_START failing stage: event only, the dispatch is retried
    };
    if !start.flag("started") {
        // A start whose first attempt got no answer (the api-server was killed after it
        // committed) is refused on replay (§4.9 answers started=false): this flow may well have
        // won, and nothing would ever move the run on. NiFi cannot tell; PG-90 ends the run
        // (explained) instead of leaving it STAGE_VALIDATING for an operator.
        if start.retried && start.str("runStatus") == "STAGE_VALIDATING" {
            sh.fail_stage_validation(run).await;
        }
        return; // otherwise a resent dispatch: the first delivery runs the flow
    }
    let extracted = start.body["extractedCount"]
        .as_u64()
        .unwrap_or(0)
        .to_string();
    let staging = json!({"stage": "STAGING", "queryVersion": "v1", "metrics": [
        {"metricName": "STAGE_COUNT", "expectedValue": extracted, "actualValue": extracted, "result": "PASS"},
        {"metricName": "DUP_PK_COUNT", "expectedValue": "0", "actualValue": "0", "result": "PASS"}]});
    let verdict = match sh
        .post_ok(&format!("/v1/runs/{run}/validations"), staging)
        .await
    {
        Some(_) => {
            sh.post_ok(&format!("/v1/runs/{run}/stage-validated"), json!({}))
                .await
        }
        None => None,
    };
    let Some(verdict) = verdict else {
        // PG-90: STAGE_VALIDATION failing stage → run fail.
        sh.fail_stage_validation(run).await;
        return;
    };
    if !verdict.flag("stageValidated") {
        sh.anomaly(format!("stage-validated refused {run}: {}", verdict.body));
        return;
    }
    sh.ack(json!({"kind": "stage_validated", "runId": run}));
    // PG-50. A claim is safe to send again with its token (the same token answers claimed=true
    // once it landed); PG-90 does so for its budget. Nothing was published before the claim's
    // answer, so when the budget runs out too the outcome is known: FAILED_PUBLISH.
    let token = Uuid::new_v4();
    let path = format!("/v1/runs/{run}/publish/claim");
    if let Ok(left) =
        sh.unanswered_claims_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
    {
        // The injected outage of this claim: no answer, whether or not it landed.
        if left % 2 == 1 {
            sh.requests.fetch_add(1, Ordering::Relaxed);
            let _lost = sh.api.post(&path, json!({"publishToken": token})).await;
        }
        return sh.fail_unstarted_publish(run, token).await;
    }
    let claim = match sh
        .post_or_resend(&path, json!({"publishToken": token}))
        .await
    {
        None => return sh.fail_unstarted_publish(run, token).await,
        Some(a) if !a.ok() => {
            return sh.anomaly(format!("POST {path}: {} {}", a.status, a.body));
        }
        Some(a) => a,
    };
    if !claim.flag("claimed") {
        return;
    }
    sh.ack(json!({"kind": "publish_claimed", "runId": run}));
    let forced = sh
        .publish_unknown_left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if forced {
        sh.faults.record(FaultKind::PublishUnknown);
    }
    if forced || sh.faults.draw(FaultKind::PublishUnknown) {
        sh.post_ok(
            &format!("/v1/runs/{run}/publish/result"),
            json!({"publishToken": token, "outcome": "PUBLISH_UNKNOWN", "errorCode": "TIMEOUT",
                   "message": "HiveServer2 connection lost during INSERT OVERWRITE"}),
        )
        .await;
        return;
    }
    // The outcome is known here: PG-90 reports it again rather than leave the run to the
    // sweeper's PUBLISH_UNKNOWN (a person) after an outage longer than NiFi's retries.
    let Some(published) = sh
        .post_or_resend(
            &format!("/v1/runs/{run}/publish/result"),
            json!({"publishToken": token, "outcome": "PUBLISHED"}),
        )
        .await
    else {
        return; // the sweeper turns a PUBLISHING run whose result never came into PUBLISH_UNKNOWN
    };
    if published.str("runStatus") != "PUBLISHED" {
        sh.anomaly(format!("publish result for {run}: {}", published.body));
        return;
    }
    finish_target(sh, run, &extracted).await;
}

/// PG-60: TARGET metrics, then success.
async fn finish_target(sh: &Shared, run: Uuid, rows: &str) {
    let target = json!({"stage": "TARGET", "metrics": [
        {"metricName": "TARGET_COUNT", "expectedValue": rows, "actualValue": rows, "result": "PASS"}]});
    let verdict = match sh
        .post_ok(&format!("/v1/runs/{run}/validations"), target)
        .await
    {
        Some(_) => {
            sh.post_ok(&format!("/v1/runs/{run}/success"), json!({}))
                .await
        }
        None => None,
    };
    match verdict {
        None => {
            // PG-90: TARGET_VALIDATION failing stage → run fail.
            sh.fail_run(
                run,
                "PUBLISHED",
                "FAILED_TARGET_VALIDATION",
                "TARGET_VALIDATION",
            )
            .await
        }
        Some(a) if !a.flag("success") => sh.anomaly(format!("success refused {run}: {}", a.body)),
        Some(_) => {}
    }
}

/// PG-60 for a run an operator resolved as PUBLISHED (NiFi does not restart it by itself).
pub async fn complete_published(api: &NifiClient, run: Uuid) -> anyhow::Result<Answer> {
    let detail = api
        .get(&format!("/v1/runs/{run}"))
        .await
        .map_err(anyhow::Error::msg)?;
    let rows = detail.body["extractedCount"]
        .as_u64()
        .unwrap_or(0)
        .to_string();
    let target = json!({"stage": "TARGET", "metrics": [
        {"metricName": "TARGET_COUNT", "expectedValue": rows, "actualValue": rows, "result": "PASS"}]});
    let a = api
        .post(&format!("/v1/runs/{run}/validations"), target)
        .await
        .map_err(anyhow::Error::msg)?;
    anyhow::ensure!(a.ok(), "TARGET metrics: {} {}", a.status, a.body);
    api.post(&format!("/v1/runs/{run}/success"), json!({}))
        .await
        .map_err(anyhow::Error::msg)
}

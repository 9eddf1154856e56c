//! The operator's Kubernetes loops (ARCHITECTURE loops 1–2), written as pure steps (validate,
//! build status) plus thin apply steps. Both write only while this process leads, and every ledger
//! write they make is fenced.
use crds::names::load_run_name;
use crds::{
    Condition, DispatchCounts, LoadJob, LoadRun, LoadRunSpec, LoadRunStatus, PartitionCounts,
    RecentCounts, ResolutionOutcome, RunCounts, RunError, RunRef,
};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use ledger::settings::Thresholds;
use ledger::{Actor, Fence, JobWrite, Ledger, MirroredRun, RunStatus};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

pub const FINALIZER: &str = "loadcontrol.io/ledger";

// ---- pure steps ----

/// The LoadJob's settings as a `load_job.settings` object (the YAML file's section/key names).
pub fn job_settings(job: &crds::LoadJobSpec) -> Value {
    let mut out = Map::new();
    let mut section = |name: &str, pairs: Vec<(&str, Option<Value>)>| {
        let m: Map<String, Value> = pairs
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
            .collect();
        if !m.is_empty() {
            out.insert(name.to_string(), Value::Object(m));
        }
    };
    let s = |v: &Option<String>| v.clone().map(Value::String);
    if let Some(n) = &job.nifi {
        section(
            "nifi",
            vec![
                ("receiver_url", s(&n.receiver_url)),
                ("timeout_seconds", n.timeout_seconds.map(|t| json!(t))),
            ],
        );
    }
    if let Some(r) = &job.recovery {
        let mode = r.mode.as_ref().map(|m| json!(m));
        section(
            "recovery",
            vec![
                ("mode", mode),
                ("max_attempts", r.max_attempts.map(|n| json!(n))),
                ("stale", s(&r.stale)),
                ("extract_query_timeout", s(&r.extract_query_timeout)),
                ("run_timeout", s(&r.run_timeout)),
                ("validation_stale", s(&r.validation_stale)),
                ("publish_stale", s(&r.publish_stale)),
            ],
        );
    }
    if let Some(d) = &job.dispatch {
        section(
            "dispatch",
            vec![
                ("max_attempts", d.max_attempts.map(|n| json!(n))),
                ("backoff_min", s(&d.backoff_min)),
                ("backoff_max", s(&d.backoff_max)),
                ("ack_timeout", s(&d.ack_timeout)),
            ],
        );
    }
    if let Some(c) = &job.cleanup {
        section(
            "cleanup",
            vec![
                ("success_retention", s(&c.success_retention)),
                ("failed_retention", s(&c.failed_retention)),
                ("event_retention", s(&c.event_retention)),
            ],
        );
    }
    Value::Object(out)
}

/// Validates the effective settings exactly as the ledger will read them (§10.3–§10.4).
pub fn validate_job(
    job: &crds::LoadJobSpec,
    global: &Thresholds,
    lease: Duration,
) -> Result<Value, String> {
    let settings = job_settings(job);
    ledger::settings::effective(global, &settings, lease)?;
    Ok(settings)
}

fn now() -> String {
    ledger::json::format_ts(&chrono::Utc::now())
}

/// Sets a condition, keeping its transition time when the status did not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let time = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(now);
    conditions.retain(|c| c.type_ != type_);
    conditions.push(Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message: message.into(),
        last_transition_time: time,
        observed_generation: generation,
    });
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

fn run_ref(r: &ledger::RunBrief) -> RunRef {
    RunRef {
        name: load_run_name(&r.job_key, &r.business_key, &r.run_id.to_string()),
        run_id: r.run_id.to_string(),
        business_key: r.business_key.clone(),
        status: r.status.clone(),
        completed_at: r.completed_at.as_ref().map(ledger::json::format_ts),
    }
}

/// The LoadRun status the ledger's row implies (conditions merged with the previous ones).
pub fn run_status(run: &MirroredRun, previous: Option<&LoadRunStatus>) -> LoadRunStatus {
    let phase = RunStatus::parse(&run.status);
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    let success = phase == Some(RunStatus::Success);
    let cancelled = phase == Some(RunStatus::Cancelled);
    let failed = phase.is_some_and(|p| p.is_failed_class()) && !cancelled;
    let msg = |s: &str| format!("{s}: {}", run.error_message.clone().unwrap_or_default());
    set_condition(
        &mut conditions,
        "Succeeded",
        success,
        if success {
            "RunSucceeded"
        } else {
            "NotSucceeded"
        },
        &run.status,
        None,
    );
    set_condition(
        &mut conditions,
        "Failed",
        failed,
        if failed { "RunFailed" } else { "NotFailed" },
        &if failed {
            msg(run.error_code.as_deref().unwrap_or(""))
        } else {
            String::new()
        },
        None,
    );
    set_condition(
        &mut conditions,
        "Cancelled",
        cancelled,
        if cancelled {
            "RunCancelled"
        } else {
            "NotCancelled"
        },
        &if cancelled {
            msg("cancelled")
        } else {
            String::new()
        },
        None,
    );
    let (needs, reason, message) = if phase == Some(RunStatus::PublishUnknown) {
        (
            true,
            "PublishUnknown",
            "The publish outcome is unknown. Check the target table, then set spec.resolution {outcome: PUBLISHED|FAILED_PUBLISH, reason} \
             (or POST /v1/runs/{id}/publish-unknown/resolve)."
                .to_string(),
        )
    } else if run.d_dead_alerting > 0 {
        (
            true,
            "DispatchDead",
            format!(
                "{} dispatch(es) are DEAD; resend them with POST /v1/runs/{{id}}/dispatches/{{dispatchId}}/resend.",
                run.d_dead_alerting
            ),
        )
    } else {
        (false, "NoActionNeeded", String::new())
    };
    set_condition(
        &mut conditions,
        "NeedsOperator",
        needs,
        reason,
        &message,
        None,
    );
    let expected = run.expected_partition_count.unwrap_or(0) as i64;
    LoadRunStatus {
        phase: run.status.clone(),
        snapshot_scn: run.snapshot_scn.clone(),
        hdfs_run_path: run.hdfs_run_path.clone(),
        stage_table: run.stage_table_name.clone(),
        counts: RunCounts {
            source: run.source_count,
            extracted: run.extracted_count,
            staging: run.staging_count,
            target: run.target_count,
        },
        partitions: PartitionCounts {
            expected,
            succeeded: run.p_succeeded,
            running: run.p_running,
            pending: run.p_pending,
            retry: run.p_retry,
            failed: run.p_failed,
            timed_out: run.p_timed_out,
            aborted: run.p_aborted,
        },
        partitions_summary: format!("{}/{expected}", run.p_succeeded),
        started_at: Some(ledger::json::format_ts(&run.started_at)),
        completed_at: run.completed_at.as_ref().map(ledger::json::format_ts),
        error: (run.error_code.is_some() || run.error_stage.is_some()).then(|| RunError {
            stage: run.error_stage.clone(),
            code: run.error_code.clone(),
            message: run.error_message.clone(),
        }),
        dispatches: DispatchCounts {
            pending: run.d_pending,
            sent: run.d_sent,
            dead: run.d_dead,
        },
        ledger_version: run.version_no as i64,
        conditions,
    }
}

/// Whether a LoadRun is past retention: its run ended (completedAt set) longer than `retention`
/// before `now` (pure). Active runs, PUBLISH_UNKNOWN included, are never past retention.
pub fn past_retention(
    status: Option<&LoadRunStatus>,
    now: chrono::DateTime<chrono::Utc>,
    retention: Duration,
) -> bool {
    let Some(done) = status.and_then(|s| s.completed_at.as_deref()) else {
        return false;
    };
    let Ok(done) = chrono::DateTime::parse_from_rfc3339(done) else {
        return false;
    };
    chrono::Duration::from_std(retention).is_ok_and(|r| done.with_timezone(&chrono::Utc) + r < now)
}

/// Deletes the LoadRuns past retention in the watched namespaces; how many.
async fn prune_loadruns(ctx: &Context, fence: &Fence) -> Result<usize, LoopError> {
    let now = chrono::Utc::now();
    let mut deleted = 0;
    for api in ctx.scope.apis::<LoadRun>(&ctx.client) {
        for lr in api.list(&Default::default()).await?.items {
            if !past_retention(lr.status.as_ref(), now, ctx.loadrun_retention) {
                continue;
            }
            ctx.still_leads(fence)?;
            let ns: Api<LoadRun> =
                Api::namespaced(ctx.client.clone(), &lr.namespace().unwrap_or_default());
            match ns.delete(&lr.name_any(), &Default::default()).await {
                Ok(_) => deleted += 1,
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    if deleted > 0 {
        tracing::info!(
            event = "loadruns_pruned",
            deleted,
            retention_s = ctx.loadrun_retention.as_secs(),
            "finished LoadRuns past retention deleted; the ledger keeps the runs"
        );
    }
    Ok(deleted)
}

/// Why the ledger would refuse (or did not carry out) the request written on a LoadRun, if it
/// would (pure). A cancel is refused once the run is past STAGING_VALIDATED or ended otherwise; a
/// resolution needs PUBLISH_UNKNOWN, and is taken as carried out once the run is where its
/// outcome leads.
pub fn request_refusal(spec: &crds::LoadRunSpec, phase: Option<RunStatus>) -> Option<String> {
    let phase = phase?;
    if spec.cancel.is_some()
        && phase != RunStatus::Cancelled
        && !ledger::ops::operator::cancellable(phase)
    {
        let why = match phase {
            RunStatus::Publishing | RunStatus::Published | RunStatus::PublishUnknown => {
                ": an INSERT OVERWRITE may have happened (resolve a PUBLISH_UNKNOWN run instead)"
            }
            _ => ": it has ended",
        };
        return Some(format!(
            "spec.cancel refused (RUN_STATUS_MISMATCH): the run is {phase}{why}"
        ));
    }
    if let Some(res) = &spec.resolution {
        let carried_out = match res.outcome {
            ResolutionOutcome::Published => matches!(
                phase,
                RunStatus::Published | RunStatus::Success | RunStatus::FailedTargetValidation
            ),
            ResolutionOutcome::FailedPublish => phase == RunStatus::FailedPublish,
        };
        if phase != RunStatus::PublishUnknown && !carried_out {
            return Some(format!(
                "spec.resolution refused (RUN_STATUS_MISMATCH): the run is {phase}, not PUBLISH_UNKNOWN"
            ));
        }
    }
    None
}

/// The Kubernetes Event worth a human's attention when a run enters `phase`, if any.
pub fn phase_event(
    previous: Option<&str>,
    run: &MirroredRun,
) -> Option<(EventType, &'static str, String)> {
    if previous == Some(run.status.as_str()) {
        return None;
    }
    let phase = RunStatus::parse(&run.status)?;
    let detail = format!(
        "{} {}",
        run.error_code.as_deref().unwrap_or(""),
        run.error_message.as_deref().unwrap_or("")
    )
    .trim()
    .to_string();
    match phase {
        RunStatus::PublishUnknown => Some((
            EventType::Warning,
            "PublishUnknown",
            format!("publish outcome unknown, needs an operator: {detail}"),
        )),
        RunStatus::Cancelled => Some((EventType::Normal, "Cancelled", detail)),
        p if p.is_failed_class() => Some((
            EventType::Warning,
            "RunFailed",
            format!("{}: {detail}", run.status),
        )),
        _ => None,
    }
}

// ---- apply steps ----

pub struct Context {
    pub client: Client,
    pub ledger: Ledger,
    pub fence: watch::Receiver<Option<Fence>>,
    pub recorder: Recorder,
    pub lease: Duration,
    pub wake_mirror: Arc<Notify>,
    /// The namespaces whose LoadJobs and LoadRuns this installation owns.
    pub scope: crate::scope::WatchScope,
    /// Finished LoadRuns older than this are deleted (etcd does not grow without limit).
    pub loadrun_retention: Duration,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Consecutive reconcile failures per LoadJob (namespace/name), for the error policy.
    pub job_failures: std::sync::Mutex<HashMap<String, u32>>,
    /// Runs whose mirroring failed, and when to try each again.
    pub mirror_backoff: std::sync::Mutex<HashMap<uuid::Uuid, RetryAfter>>,
}

/// A run's mirroring failed `failures` times in a row; it is skipped until `next`.
#[derive(Debug, Clone, Copy)]
pub struct RetryAfter {
    pub failures: u32,
    pub next: std::time::Instant,
}

/// Backoff after the n-th consecutive failure of one run: 2 s, 4 s, 8 s, … at most 5 minutes (pure).
pub fn mirror_retry_delay(failures: u32) -> Duration {
    Duration::from_secs(2u64.saturating_pow(failures.min(9)).min(300))
}

impl Context {
    /// Whether this process still holds the epoch `fence` was won with: every Kubernetes write of
    /// the mirror checks it first, so a deposed leader stops writing at once, not at the end of
    /// its pass.
    fn still_leads(&self, fence: &Fence) -> Result<(), LoopError> {
        match self.fence.borrow().as_ref() {
            Some(f) if f.epoch == fence.epoch => Ok(()),
            _ => Err(LoopError::NotLeading(fence.epoch)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    #[error("ledger: {0}")]
    Ledger(#[from] ledger::LedgerError),
    #[error("finalizer: {0}")]
    Finalizer(String),
    #[error("leadership of epoch {0} lost: nothing more is written")]
    NotLeading(i64),
}

impl LoopError {
    /// What kind of failure this is, for the error policy and the metrics: `invalid` (the object
    /// or request cannot be applied as it is: wait for it to change), `conflict` (someone else
    /// wrote first: retry soon), `not_leading` (this process was deposed), `transient` (the API
    /// server or the database: back off).
    pub fn class(&self) -> &'static str {
        match self {
            LoopError::Kube(kube::Error::Api(e)) if e.code == 409 => "conflict",
            LoopError::Kube(kube::Error::Api(e)) if e.code == 400 || e.code == 422 => "invalid",
            LoopError::Ledger(ledger::LedgerError::Fenced { .. }) | LoopError::NotLeading(_) => {
                "not_leading"
            }
            _ => "transient",
        }
    }
}

/// The error policy's delay for a class after the n-th consecutive failure (pure): conflicts
/// retry at once, transient failures back off 1 s, 2 s, 4 s, … up to 5 minutes; None means wait
/// for the object to change (invalid), or for leadership (not_leading).
pub fn retry_delay(class: &str, failures: u32) -> Option<Duration> {
    match class {
        "invalid" | "not_leading" => None,
        "conflict" => Some(Duration::from_millis(200)),
        _ => Some(Duration::from_secs(
            2u64.saturating_pow(failures.saturating_sub(1).min(9))
                .min(300),
        )),
    }
}

fn source_of(job: &LoadJob) -> String {
    format!(
        "LoadJob/{}/{}",
        job.namespace().unwrap_or_default(),
        job.name_any()
    )
}

async fn reconcile_job(job: Arc<LoadJob>, ctx: Arc<Context>) -> Result<Action, LoopError> {
    let started = std::time::Instant::now();
    let key = format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any());
    let result = reconcile_job_once(job, &ctx).await;
    let outcome = match &result {
        Ok(_) => {
            ctx.job_failures.lock().expect("failures lock").remove(&key);
            "ok"
        }
        Err(e) => e.class(),
    };
    ctx.metrics
        .reconciled("loadjob", outcome, started.elapsed().as_secs_f64());
    result
}

async fn reconcile_job_once(job: Arc<LoadJob>, ctx: &Arc<Context>) -> Result<Action, LoopError> {
    let Some(fence) = ctx.fence.borrow().clone() else {
        // Not the leader: writes nothing. Winning leadership reconciles every LoadJob again.
        return Ok(Action::await_change());
    };
    let api: Api<LoadJob> =
        Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    let result = finalizer(&api, FINALIZER, job, |event| async {
        match event {
            Finalizer::Apply(job) => apply_job(&job, ctx, &fence).await,
            Finalizer::Cleanup(job) => {
                ctx.ledger.remove_job(&fence, &job.spec.job_key, &source_of(&job)).await?;
                tracing::info!(event = "job_removed", job_key = %job.spec.job_key, "LoadJob deleted; its ledger row is marked removed");
                Ok(Action::await_change())
            }
        }
    })
    .await;
    result.map_err(|e| LoopError::Finalizer(e.to_string()))
}

async fn apply_job(job: &LoadJob, ctx: &Context, fence: &Fence) -> Result<Action, LoopError> {
    let api: Api<LoadJob> =
        Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    let generation = job.metadata.generation;
    let mut status = job.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    match validate_job(&job.spec, &ctx.ledger.config().thresholds, ctx.lease) {
        Err(reason) => {
            set_condition(
                &mut status.conditions,
                "Ready",
                false,
                "InvalidSpec",
                &reason,
                generation,
            );
        }
        Ok(settings) => match ctx
            .ledger
            .apply_job(
                fence,
                &job.spec.job_key,
                job.spec.suspend,
                &settings,
                &source_of(job),
                generation,
            )
            .await?
        {
            JobWrite::Conflict { owner } => {
                let msg = format!("jobKey {} is owned by {owner}", job.spec.job_key);
                set_condition(
                    &mut status.conditions,
                    "Ready",
                    false,
                    "JobKeyConflict",
                    &msg,
                    generation,
                );
            }
            JobWrite::Applied => {
                set_condition(
                    &mut status.conditions,
                    "Ready",
                    true,
                    "Applied",
                    "settings written to the ledger",
                    generation,
                );
                let suspend_msg = if job.spec.suspend {
                    "new runs are refused with 409 JOB_SUSPENDED"
                } else {
                    ""
                };
                set_condition(
                    &mut status.conditions,
                    "Suspended",
                    job.spec.suspend,
                    if job.spec.suspend {
                        "Suspended"
                    } else {
                        "Active"
                    },
                    suspend_msg,
                    generation,
                );
                let summary = ctx.ledger.job_summary(&job.spec.job_key).await?;
                status.active_runs = summary.active_runs;
                status.active_run = summary.active_run.as_ref().map(run_ref);
                status.last_run = summary.last_run.as_ref().map(run_ref);
                status.recent = RecentCounts {
                    succeeded: summary.succeeded,
                    failed: summary.failed,
                    cancelled: summary.cancelled,
                };
                ctx.wake_mirror.notify_one();
            }
        },
    }
    if job.status.as_ref() != Some(&status) {
        api.patch_status(
            &job.name_any(),
            &status_apply_params(),
            &Patch::Apply(json!({
                "apiVersion": "loadcontrol.io/v1alpha1", "kind": "LoadJob",
                "metadata": {"name": job.name_any()}, "status": status,
            })),
        )
        .await?;
    }
    // Runs change without the LoadJob changing: refresh the run summary periodically.
    Ok(Action::requeue(Duration::from_secs(30)))
}

fn error_policy(job: Arc<LoadJob>, error: &LoopError, ctx: Arc<Context>) -> Action {
    let key = format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any());
    let failures = {
        let mut f = ctx.job_failures.lock().expect("failures lock");
        let n = f.entry(key.clone()).or_insert(0);
        *n += 1;
        *n
    };
    let class = error.class();
    match retry_delay(class, failures) {
        Some(delay) => {
            tracing::warn!(event = "loadjob_reconcile_error", loadjob = %key, class, failures, retry_in_ms = delay.as_millis() as u64, error = %error, "LoadJob reconcile failed; retrying");
            Action::requeue(delay)
        }
        None => {
            tracing::warn!(event = "loadjob_reconcile_error", loadjob = %key, class, error = %error, "LoadJob reconcile failed; waiting for a change");
            Action::await_change()
        }
    }
}

/// Loop 1: the LoadJob controller, until `shutdown`.
pub async fn run_job_controller(ctx: Arc<Context>, shutdown: watch::Receiver<bool>) {
    let jobs = ctx.scope.apis::<LoadJob>(&ctx.client);
    let runs = ctx.scope.apis::<LoadRun>(&ctx.client);
    let controllers = jobs.into_iter().zip(runs).map(|(jobs, runs)| {
        let mut shutdown = shutdown.clone();
        Controller::new(jobs, watcher::Config::default())
            // A LoadRun changing phase refreshes its owner's activeRun/lastRun at once instead
            // of at the next periodic requeue; bursts of status patches are debounced.
            .owns(runs, watcher::Config::default())
            .with_config(
                kube::runtime::controller::Config::default().debounce(Duration::from_secs(1)),
            )
            // A standby reconciles nothing; winning leadership reconciles every LoadJob at once.
            .reconcile_all_on(leadership_won(ctx.fence.clone()))
            .graceful_shutdown_on(async move {
                let _ = shutdown.wait_for(|s| *s).await;
            })
            .run(reconcile_job, error_policy, ctx.clone())
            .for_each(|_| async {})
    });
    futures::future::join_all(controllers).await;
}

/// The field manager that owns the status this operator writes.
pub const FIELD_MANAGER: &str = "load-control-operator";

/// Status is written by server-side apply under [`FIELD_MANAGER`]; forced, because the status of
/// our objects is ours alone (a previous writer's fields are taken over, not fought over).
fn status_apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Emits once each time this process starts leading.
fn leadership_won(fence: watch::Receiver<Option<Fence>>) -> impl futures::Stream<Item = ()> + Send {
    futures::stream::unfold(fence, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if rx.borrow_and_update().is_some() {
                return Some(((), rx));
            }
        }
    })
}

/// Loop 2: ledger → LoadRuns (LISTEN `load_run` + LoadRun watch + periodic resync), and LoadRun
/// operator requests → ledger.
pub async fn run_mirror(
    ctx: Arc<Context>,
    listen_url: String,
    resync: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let wake = ctx.wake_mirror.clone();
    // Owned by this loop: dropping it (the loop ends or its task is aborted) aborts both.
    let mut wakers = tokio::task::JoinSet::new();
    {
        let wake = wake.clone();
        wakers.spawn(async move {
            loop {
                if let Ok(mut l) = sqlx::postgres::PgListener::connect(&listen_url).await
                    && l.listen("load_run").await.is_ok()
                {
                    wake.notify_one();
                    while let Ok(Some(_)) = l.try_recv().await {
                        wake.notify_one();
                    }
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }
    {
        // Winning leadership is a reason to look at once (mirror and retention).
        let (wake, mut fence) = (wake.clone(), ctx.fence.clone());
        wakers.spawn(async move {
            while fence.changed().await.is_ok() {
                if fence.borrow_and_update().is_some() {
                    wake.notify_one();
                }
            }
        });
    }
    for runs in ctx.scope.apis::<LoadRun>(&ctx.client) {
        let wake = wake.clone();
        wakers.spawn(async move {
            // Backoff: a missing CRD, a 403 or an API outage must not become a busy loop.
            let mut stream = watcher(runs, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(_) => wake.notify_one(),
                    Err(e) => {
                        tracing::warn!(event = "loadrun_watch_error", error = %e, "watching LoadRuns failed; backing off")
                    }
                }
            }
        });
    }
    let mut tick = tokio::time::interval(resync);
    let mut pruned_under: Option<i64> = None;
    loop {
        let periodic = tokio::select! {
            _ = shutdown.changed() => break,
            _ = tick.tick() => true,
            _ = wake.notified() => false,
        };
        let current = ctx.fence.borrow().clone();
        let Some(fence) = current else { continue };
        if let Err(e) = mirror_pass(&ctx, &fence).await {
            tracing::warn!(event = "loadrun_mirror_error", error = %e, "mirroring the ledger into LoadRuns failed; retrying");
        }
        // Retention is no hurry: on the periodic resync and once when leadership is won, not on
        // every wake-up.
        if periodic || pruned_under != Some(fence.epoch) {
            pruned_under = Some(fence.epoch);
            if let Err(e) = prune_loadruns(&ctx, &fence).await {
                tracing::warn!(event = "loadrun_prune_error", error = %e, "deleting LoadRuns past retention failed; retrying at the next resync");
            }
        }
    }
    wakers.abort_all();
}

async fn mirror_pass(ctx: &Context, fence: &Fence) -> Result<(), LoopError> {
    let mut owners: HashMap<String, Option<LoadJob>> = HashMap::new();
    for run in ctx.ledger.mirrored_runs().await? {
        let due = ctx
            .mirror_backoff
            .lock()
            .expect("backoff lock")
            .get(&run.run_id)
            .copied();
        if due.is_some_and(|d| std::time::Instant::now() < d.next) {
            continue;
        }
        let started = std::time::Instant::now();
        let mirrored = mirror_run(ctx, fence, &run, &mut owners).await;
        let outcome = mirrored.as_ref().map_or_else(LoopError::class, |_| "ok");
        ctx.metrics
            .reconciled("loadrun_mirror", outcome, started.elapsed().as_secs_f64());
        match mirrored {
            Ok(()) => {
                if due.is_some() {
                    ctx.mirror_backoff
                        .lock()
                        .expect("backoff lock")
                        .remove(&run.run_id);
                }
            }
            // Leadership is gone: the rest of the pass writes nothing.
            Err(e @ LoopError::NotLeading(_)) => return Err(e),
            // One run's failure never stops the others: it backs off on its own.
            Err(e) => {
                let failures = due.map_or(1, |d| d.failures + 1);
                let delay = mirror_retry_delay(failures);
                ctx.mirror_backoff.lock().expect("backoff lock").insert(
                    run.run_id,
                    RetryAfter {
                        failures,
                        next: std::time::Instant::now() + delay,
                    },
                );
                tracing::warn!(event = "loadrun_mirror_run_error", run_id = %run.run_id, job_key = %run.job_key,
                    failures, retry_in_s = delay.as_secs(), error = %e, "mirroring this run failed; the others go on");
            }
        }
    }
    Ok(())
}

/// Mirrors one ledger run into its LoadRun (created if missing), and carries out its requests.
async fn mirror_run(
    ctx: &Context,
    fence: &Fence,
    run: &MirroredRun,
    owners: &mut HashMap<String, Option<LoadJob>>,
) -> Result<(), LoopError> {
    let mut parts = run.source.splitn(3, '/').skip(1);
    let (Some(ns), Some(job_name)) = (parts.next(), parts.next()) else {
        return Ok(());
    };
    if !ctx.scope.covers(ns) {
        return Ok(()); // another installation's LoadJob
    }
    let owner = match owners.get(&run.source) {
        Some(o) => o.clone(),
        None => {
            let o = Api::<LoadJob>::namespaced(ctx.client.clone(), ns)
                .get_opt(job_name)
                .await?;
            owners.insert(run.source.clone(), o.clone());
            o
        }
    };
    let Some(owner) = owner else {
        return Ok(());
    };
    let api: Api<LoadRun> = Api::namespaced(ctx.client.clone(), ns);
    let name = load_run_name(&run.job_key, &run.business_key, &run.run_id.to_string());
    let existing = match api.get_opt(&name).await? {
        Some(lr) => lr,
        None => {
            let lr = LoadRun {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    owner_references: Some(vec![owner_reference(&owner)]),
                    labels: Some(
                        [(
                            "loadcontrol.io/job-key".to_string(),
                            crds::names::job_key_label(&run.job_key),
                        )]
                        .into(),
                    ),
                    ..Default::default()
                },
                spec: LoadRunSpec {
                    job_key: run.job_key.clone(),
                    business_key: run.business_key.clone(),
                    run_id: run.run_id.to_string(),
                    cancel: None,
                    resolution: None,
                },
                status: None,
            };
            ctx.still_leads(fence)?;
            api.create(&PostParams::default(), &lr).await?
        }
    };
    if act_on_requests(ctx, fence, &existing, run, ns).await? {
        // The ledger changed; the NOTIFY brings the new state into the next pass.
        return Ok(());
    }
    let previous = existing.status.as_ref();
    let mut status = run_status(run, previous);
    let refusal = request_refusal(&existing.spec, RunStatus::parse(&run.status));
    let newly_refused = refusal.is_some()
        && !previous.is_some_and(|p| {
            p.conditions
                .iter()
                .any(|c| c.type_ == "RequestRefused" && c.status == "True")
        });
    set_condition(
        &mut status.conditions,
        "RequestRefused",
        refusal.is_some(),
        if refusal.is_some() {
            "RUN_STATUS_MISMATCH"
        } else {
            "NoRefusal"
        },
        refusal.as_deref().unwrap_or(""),
        None,
    );
    if previous == Some(&status) {
        return Ok(());
    }
    ctx.still_leads(fence)?;
    if newly_refused && let Some(why) = &refusal {
        publish(
            ctx,
            &existing,
            EventType::Warning,
            "RequestRefused",
            why.clone(),
            "Request",
        )
        .await;
    }
    if let Some((type_, reason, note)) = phase_event(previous.map(|p| p.phase.as_str()), run) {
        publish(ctx, &existing, type_, reason, note, "Mirror").await;
    }
    if run.d_dead_alerting > previous.map_or(0, |p| p.dispatches.dead)
        && previous.is_none_or(|p| p.dispatches.dead < run.d_dead)
    {
        publish(
            ctx,
            &existing,
            EventType::Warning,
            "DispatchDead",
            format!(
                "{} DEAD dispatch(es); an operator must resend",
                run.d_dead_alerting
            ),
            "Mirror",
        )
        .await;
    }
    api.patch_status(
        &name,
        &status_apply_params(),
        &Patch::Apply(json!({
            "apiVersion": "loadcontrol.io/v1alpha1", "kind": "LoadRun",
            "metadata": {"name": name}, "status": status,
        })),
    )
    .await?;
    Ok(())
}

/// Carries out `spec.cancel` / `spec.resolution` through the same (fenced) ledger operations as
/// the HTTP operator endpoints. `true` when the ledger changed.
async fn act_on_requests(
    ctx: &Context,
    fence: &Fence,
    lr: &LoadRun,
    run: &MirroredRun,
    ns: &str,
) -> Result<bool, LoopError> {
    let actor = Actor {
        name: format!("kubernetes:{ns}/{}", lr.name_any()),
        role: "operator".into(),
    };
    let phase = RunStatus::parse(&run.status);
    if let Some(cancel) = &lr.spec.cancel
        && phase.is_some_and(ledger::ops::operator::cancellable)
    {
        let out = ctx
            .ledger
            .cancel_run(run.run_id, &cancel.reason, &actor, Some(fence))
            .await?;
        if out.changed {
            publish(
                ctx,
                lr,
                EventType::Normal,
                "Cancelled",
                format!("cancelled by {}: {}", actor.name, cancel.reason),
                "Cancel",
            )
            .await;
        }
        return Ok(out.changed);
    }
    if let Some(res) = &lr.spec.resolution
        && phase == Some(RunStatus::PublishUnknown)
    {
        let outcome = match res.outcome {
            ResolutionOutcome::Published => RunStatus::Published,
            ResolutionOutcome::FailedPublish => RunStatus::FailedPublish,
        };
        let out = ctx
            .ledger
            .resolve_publish_unknown(run.run_id, outcome, &res.reason, &actor, Some(fence))
            .await?;
        if out.changed {
            publish(
                ctx,
                lr,
                EventType::Normal,
                "Resolved",
                format!("resolved as {outcome} by {}: {}", actor.name, res.reason),
                "Resolve",
            )
            .await;
        }
        return Ok(out.changed);
    }
    Ok(false)
}

fn owner_reference(job: &LoadJob) -> OwnerReference {
    OwnerReference {
        api_version: LoadJob::api_version(&()).to_string(),
        kind: LoadJob::kind(&()).to_string(),
        name: job.name_any(),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(false),
    }
}

async fn publish(
    ctx: &Context,
    lr: &LoadRun,
    type_: EventType,
    reason: &str,
    note: String,
    action: &str,
) {
    let ev = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &lr.object_ref(&())).await {
        tracing::warn!(event = "kube_event_error", error = %e, "publishing a Kubernetes Event failed");
    }
}

pub fn recorder(client: Client, identity: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: "load-control-operator".into(),
            instance: Some(identity.to_string()),
        },
    )
}

#[cfg(test)]
mod tests {

    #[test]
    fn requests_the_ledger_would_refuse_are_named() {
        use crds::{CancelRequest, LoadRunSpec, ResolutionRequest};
        let spec = |cancel: bool, resolution: Option<ResolutionOutcome>| LoadRunSpec {
            job_key: "J".into(),
            business_key: "b".into(),
            run_id: "r".into(),
            cancel: cancel.then(|| CancelRequest {
                reason: "wrong date".into(),
            }),
            resolution: resolution.map(|outcome| ResolutionRequest {
                outcome,
                reason: "checked".into(),
            }),
        };
        let cancel = spec(true, None);
        assert_eq!(request_refusal(&cancel, Some(RunStatus::Extracting)), None);
        assert_eq!(request_refusal(&cancel, Some(RunStatus::Cancelled)), None);
        assert!(
            request_refusal(&cancel, Some(RunStatus::Publishing))
                .unwrap()
                .contains("INSERT OVERWRITE")
        );
        assert!(
            request_refusal(&cancel, Some(RunStatus::Success))
                .unwrap()
                .contains("RUN_STATUS_MISMATCH")
        );
        let publish = spec(false, Some(ResolutionOutcome::Published));
        assert_eq!(
            request_refusal(&publish, Some(RunStatus::PublishUnknown)),
            None
        );
        assert_eq!(
            request_refusal(&publish, Some(RunStatus::Success)),
            None,
            "carried out"
        );
        assert!(request_refusal(&publish, Some(RunStatus::Extracting)).is_some());
        let failed = spec(false, Some(ResolutionOutcome::FailedPublish));
        assert_eq!(
            request_refusal(&failed, Some(RunStatus::FailedPublish)),
            None
        );
        assert!(request_refusal(&failed, Some(RunStatus::Success)).is_some());
        assert_eq!(
            request_refusal(&spec(false, None), Some(RunStatus::Success)),
            None
        );
    }

    #[test]
    fn only_loadruns_of_runs_ended_long_ago_are_past_retention() {
        let now = chrono::Utc::now();
        let week = Duration::from_secs(7 * 86400);
        let ended = |days: i64| LoadRunStatus {
            completed_at: Some(ledger::json::format_ts(
                &(now - chrono::Duration::days(days)),
            )),
            ..Default::default()
        };
        assert!(past_retention(Some(&ended(8)), now, week));
        assert!(!past_retention(Some(&ended(6)), now, week));
        assert!(
            !past_retention(Some(&LoadRunStatus::default()), now, week),
            "still active"
        );
        assert!(!past_retention(None, now, week));
    }

    #[test]
    fn the_error_policy_follows_the_class() {
        assert_eq!(retry_delay("invalid", 3), None);
        assert_eq!(retry_delay("not_leading", 1), None);
        assert_eq!(retry_delay("conflict", 5), Some(Duration::from_millis(200)));
        let transient: Vec<u64> = (1..=12)
            .map(|n| retry_delay("transient", n).unwrap().as_secs())
            .collect();
        assert_eq!(&transient[..4], &[1, 2, 4, 8]);
        assert_eq!(*transient.last().unwrap(), 300);
    }

    #[test]
    fn a_failing_run_backs_off_exponentially_up_to_five_minutes() {
        let delays: Vec<u64> = (1..=12).map(|n| mirror_retry_delay(n).as_secs()).collect();
        assert_eq!(&delays[..5], &[2, 4, 8, 16, 32]);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*delays.last().unwrap(), 300);
    }

    use super::*;
    use crds::{LoadJobSpec, RecoveryMode, RecoverySpec};

    fn spec() -> LoadJobSpec {
        LoadJobSpec {
            job_key: "J".into(),
            description: None,
            suspend: false,
            nifi: None,
            recovery: None,
            dispatch: None,
            cleanup: None,
        }
    }

    #[test]
    fn settings_use_the_files_section_and_key_names() {
        let mut s = spec();
        s.recovery = Some(RecoverySpec {
            mode: Some(RecoveryMode::Reissue),
            stale: Some("2h".into()),
            ..Default::default()
        });
        assert_eq!(
            job_settings(&s),
            json!({"recovery": {"mode": "REISSUE", "stale": "2h"}})
        );
        assert_eq!(job_settings(&spec()), json!({}));
        assert!(validate_job(&s, &Thresholds::default(), Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn invalid_combinations_are_refused_with_the_reason() {
        let mut s = spec();
        s.recovery = Some(RecoverySpec {
            stale: Some("30m".into()),
            ..Default::default()
        });
        let err = validate_job(&s, &Thresholds::default(), Duration::from_secs(60)).unwrap_err();
        assert!(err.contains("recovery.stale"), "{err}");
    }

    #[test]
    fn conditions_keep_their_transition_time_while_unchanged() {
        let mut c = vec![];
        set_condition(&mut c, "Ready", true, "Applied", "", Some(1));
        let t = c[0].last_transition_time.clone();
        std::thread::sleep(Duration::from_millis(5));
        set_condition(&mut c, "Ready", true, "Applied", "again", Some(2));
        assert_eq!(
            (
                c.len(),
                c[0].last_transition_time.as_str(),
                c[0].observed_generation
            ),
            (1, t.as_str(), Some(2))
        );
        set_condition(&mut c, "Ready", false, "InvalidSpec", "x", Some(3));
        assert_ne!(c[0].last_transition_time, t);
    }
}

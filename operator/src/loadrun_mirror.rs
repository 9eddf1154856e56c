//! Loop 2, the LoadRun mirror: every mirrored ledger run as a LoadRun (created with its owner,
//! status applied when it changed), Events on phase changes, and retention of finished LoadRuns.
//! Kubernetes writes happen only while this process leads. `run_status` and `past_retention` are
//! the pure decisions.
use crate::kube_context::{
    Context, LoopError, RetryAfter, publish, set_condition, status_apply_params,
};
use crate::loadrun_requests::{act_on_requests, request_refusal};
use crds::names::load_run_name;
use crds::{
    DispatchCounts, LoadJob, LoadRun, LoadRunSpec, LoadRunStatus, PartitionCounts, RunCounts,
    RunError,
};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PostParams};
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use ledger::{Fence, MirroredRun, RunStatus};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

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

/// Whether a ledger run ended longer than `retention` before `now` (pure): its LoadRun is not
/// (re)created. The same rule as [`past_retention`], read from the ledger's side.
pub fn run_past_retention(
    run: &MirroredRun,
    now: chrono::DateTime<chrono::Utc>,
    retention: Duration,
) -> bool {
    run.completed_at
        .is_some_and(|done| chrono::Duration::from_std(retention).is_ok_and(|r| done + r < now))
}

/// Deletes the LoadRuns past retention in the watched namespaces; how many.
async fn prune_loadruns(ctx: &Context, fence: &Fence, stores: &Stores) -> Result<usize, LoopError> {
    let now = chrono::Utc::now();
    let mut deleted = 0;
    {
        for lr in stores.all_runs() {
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

/// The Kubernetes Event worth a human's attention when a run enters `phase`, if any.
pub fn phase_event(
    previous: Option<&str>,
    run: &MirroredRun,
) -> Option<(EventType, &'static str, String)> {
    if previous == Some(run.status.as_str()) {
        return None;
    }
    // A LoadRun made for a run that ended long ago (the mirror catching up on history) is no
    // news: an Event each would flood the namespace and the API server.
    if previous.is_none()
        && run
            .completed_at
            .is_some_and(|t| t < chrono::Utc::now() - chrono::Duration::minutes(10))
    {
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

/// Backoff after the n-th consecutive failure of one run: 2 s, 4 s, 8 s, … at most 5 minutes (pure).
pub fn mirror_retry_delay(failures: u32) -> Duration {
    Duration::from_secs(2u64.saturating_pow(failures.min(9)).min(300))
}

/// At most this many LoadRuns are written at once by one pass.
const WRITE_CONCURRENCY: usize = 8;

/// What the mirror looks at next: single runs (a NOTIFY names its run; a LoadRun carrying a
/// request, or deleted) or everything (start, leadership won, a restarted LISTEN or watch, a
/// newly applied LoadJob, the periodic resync).
#[derive(Default)]
pub struct MirrorQueue {
    runs: std::sync::Mutex<HashSet<Uuid>>,
    everything: AtomicBool,
    wake: Notify,
}

impl MirrorQueue {
    pub fn run(&self, id: Uuid) {
        self.runs.lock().expect("queue lock").insert(id);
        self.wake.notify_one();
    }

    pub fn everything(&self) {
        self.everything.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Empties the queue: (a full pass is due, the single runs asked for).
    fn take(&self) -> (bool, Vec<Uuid>) {
        let everything = self.everything.swap(false, Ordering::SeqCst);
        let runs = std::mem::take(&mut *self.runs.lock().expect("queue lock"));
        (everything, runs.into_iter().collect())
    }
}

/// Whether a LoadRun event needs the mirror (pure): a request to carry out or to refuse. Status
/// updates, the mirror's own included, do not.
pub fn asks_for_action(lr: &LoadRun) -> bool {
    lr.spec.cancel.is_some() || lr.spec.resolution.is_some()
}

/// What a write must not go behind (pure): the newer, by `ledgerVersion`, of the LoadRun's
/// status as the API server last showed it and of what this process last applied (the watch
/// may lag behind its own writes); equal versions prefer what was applied.
pub fn newest_known<'a>(
    observed: Option<&'a Applied>,
    applied: Option<&'a Applied>,
) -> Option<&'a Applied> {
    match (observed, applied) {
        (Some(o), Some(a)) if o.ledger_version > a.ledger_version => Some(o),
        (o, None) => o,
        (_, a) => a,
    }
}

/// The part of a LoadRun the mirror keeps (pure): of the metadata only its names, and of the status only
/// what a new status is built from (conditions), compared with (dead dispatches) or retention
/// reads (completedAt). What the full status was is kept as its [`Applied`] digest.
pub fn compact(lr: &mut LoadRun) -> Option<Applied> {
    // Of the metadata, what names the object (and its Events) only.
    let meta = &mut lr.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.annotations = None;
    meta.owner_references = None;
    meta.finalizers = None;
    meta.creation_timestamp = None;
    let full = lr.status.take()?;
    let seen = Applied::of(&full);
    lr.status = Some(LoadRunStatus {
        phase: full.phase,
        ledger_version: full.ledger_version,
        conditions: full.conditions,
        dispatches: full.dispatches,
        // Retention reads it.
        completed_at: full.completed_at,
        ..Default::default()
    });
    Some(seen)
}

/// The LoadRuns and LoadJobs of the watched namespaces as their watches last reported them: the
/// mirror reads these instead of asking the API server for every run on every pass.
/// A LoadRun as watched: one that cannot be read stays that run's problem (it backs off) instead
/// of breaking the watch of all of them.
type GuardedRun = DeserializeGuard<LoadRun>;

#[derive(Default)]
struct Stores {
    runs: Vec<Store<GuardedRun>>,
    jobs: Vec<Store<PartialObjectMeta<LoadJob>>>,
    /// Each run's LoadRun status as the watch last delivered it, as a digest.
    observed: Arc<std::sync::Mutex<HashMap<Uuid, Applied>>>,
}

impl Stores {
    /// The stored LoadRun, or why it cannot be read.
    fn run(&self, ns: &str, name: &str) -> Option<Result<Arc<LoadRun>, String>> {
        let key = ObjectRef::new(name).within(ns);
        let guarded = self.runs.iter().find_map(|s| s.get(&key))?;
        Some(match &guarded.0 {
            Ok(lr) => Ok(Arc::new(lr.clone())),
            Err(invalid) => Err(invalid.error.clone()),
        })
    }

    fn job(&self, ns: &str, name: &str) -> Option<Arc<PartialObjectMeta<LoadJob>>> {
        let key = ObjectRef::new(name).within(ns);
        self.jobs.iter().find_map(|s| s.get(&key))
    }

    fn all_runs(&self) -> Vec<Arc<LoadRun>> {
        self.runs
            .iter()
            .flat_map(|s| s.state())
            .filter_map(|g| g.0.as_ref().ok().cloned().map(Arc::new))
            .collect()
    }
}

/// What the mirror last applied to a run's LoadRun, small enough to keep for every run: the
/// watch may not have brought that status back into the store yet.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub ledger_version: i64,
    pub phase: String,
    /// Digest of the whole status, to recognise a write already made.
    pub digest: u64,
}

impl Applied {
    pub fn of(status: &LoadRunStatus) -> Applied {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        serde_json::to_vec(status).unwrap_or_default().hash(&mut h);
        Applied {
            ledger_version: status.ledger_version,
            phase: status.phase.clone(),
            digest: h.finish(),
        }
    }
}

/// The mirror's own memory: its stores, and what it last applied to each run's LoadRun.
struct Mirror {
    stores: Stores,
    applied: std::sync::Mutex<HashMap<Uuid, Applied>>,
}

/// Loop 2: ledger → LoadRuns (LISTEN `load_run` names the changed run; LoadRun and LoadJob
/// watches feed reflector stores; a periodic full resync), and LoadRun requests → ledger.
pub async fn run_mirror(
    ctx: Arc<Context>,
    listen_url: String,
    resync: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let queue = ctx.mirror_queue.clone();
    // Owned by this loop: dropping it (the loop ends or its task is aborted) aborts them all.
    let mut wakers = tokio::task::JoinSet::new();
    {
        let queue = queue.clone();
        wakers.spawn(async move {
            loop {
                if let Ok(mut l) = sqlx::postgres::PgListener::connect(&listen_url).await
                    && l.listen("load_run").await.is_ok()
                {
                    // Changes made while nobody listened are found by a full pass.
                    queue.everything();
                    while let Ok(Some(n)) = l.try_recv().await {
                        match Uuid::parse_str(n.payload()) {
                            Ok(id) => queue.run(id),
                            Err(_) => queue.everything(),
                        }
                    }
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }
    {
        // Winning leadership is a reason to look at everything (mirror and retention).
        let (queue, mut fence) = (queue.clone(), ctx.fence.clone());
        wakers.spawn(async move {
            while fence.changed().await.is_ok() {
                if fence.borrow_and_update().is_some() {
                    queue.everything();
                }
            }
        });
    }
    let mut stores = Stores::default();
    let watched = crate::scope::watcher_config(ctx.instance.as_deref());
    for api in ctx.scope.apis::<GuardedRun>(&ctx.client) {
        let (reader, writer) = reflector::store();
        stores.runs.push(reader);
        let (queue, observed, watched) = (queue.clone(), stores.observed.clone(), watched.clone());
        wakers.spawn(async move {
            // kube-runtime's default backoff: a missing CRD, a 403 or an API outage must not
            // become a busy loop.
            let mut stream = watcher(api, watched)
                .default_backoff()
                // The store holds every LoadRun, so only what the mirror reads (10,000 of them
                // must fit in the operator's memory limit).
                .modify(move |guarded| {
                    let Ok(lr) = &mut guarded.0 else { return };
                    let seen = compact(lr);
                    if let (Some(seen), Ok(id)) = (seen, Uuid::parse_str(&lr.spec.run_id)) {
                        observed.lock().expect("observed lock").insert(id, seen);
                    }
                })
                .reflect(writer)
                .boxed();
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(DeserializeGuard(Ok(lr)))) if asks_for_action(&lr) => {
                        if let Ok(id) = Uuid::parse_str(&lr.spec.run_id) {
                            queue.run(id)
                        }
                    }
                    // Deleted by hand: recreated if its run is still mirrored.
                    Ok(watcher::Event::Delete(DeserializeGuard(Ok(lr)))) => {
                        if let Ok(id) = Uuid::parse_str(&lr.spec.run_id) {
                            queue.run(id)
                        }
                    }
                    Ok(
                        watcher::Event::Apply(DeserializeGuard(Err(invalid)))
                        | watcher::Event::InitApply(DeserializeGuard(Err(invalid))),
                    ) => {
                        tracing::warn!(event = "loadrun_unreadable", name = ?invalid.metadata.name,
                            namespace = ?invalid.metadata.namespace, error = %invalid.error,
                            "a LoadRun cannot be read; its run is not mirrored until it is fixed or deleted")
                    }
                    Ok(watcher::Event::InitDone) => queue.everything(),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(event = "loadrun_watch_error", error = %e, "watching LoadRuns failed; backing off")
                    }
                }
            }
        });
    }
    // Of a LoadJob the mirror needs only its name and uid (the LoadRun's owner), so it watches
    // metadata alone: a LoadJob whose spec cannot be read (an older or hand-edited CRD) can never
    // break this watch, and the store holds no specs.
    for api in ctx.scope.apis::<PartialObjectMeta<LoadJob>>(&ctx.client) {
        let (reader, writer) = reflector::store();
        stores.jobs.push(reader);
        let watched = watched.clone();
        wakers.spawn(async move {
            let mut stream = watcher(api, watched)
                .default_backoff()
                .modify(|job| job.managed_fields_mut().clear())
                .reflect(writer)
                .boxed();
            while let Some(ev) = stream.next().await {
                if let Err(e) = ev {
                    tracing::warn!(event = "loadjob_watch_error", error = %e, "watching LoadJobs failed; backing off")
                }
            }
        });
    }
    // Until each store has listed once, a LoadRun missing from it may exist.
    let ready = async {
        for s in &stores.runs {
            let _ = s.wait_until_ready().await;
        }
        for s in &stores.jobs {
            let _ = s.wait_until_ready().await;
        }
    };
    tokio::select! {
        _ = ready => {}
        _ = shutdown.changed() => return,
    }
    let mirror = Mirror {
        stores,
        applied: Default::default(),
    };
    let mut tick = tokio::time::interval(resync);
    let mut pruned_under: Option<i64> = None;
    loop {
        let periodic = tokio::select! {
            _ = shutdown.changed() => break,
            _ = tick.tick() => true,
            _ = queue.wake.notified() => false,
        };
        let current = ctx.fence.borrow().clone();
        let Some(fence) = current else { continue };
        let (everything, ids) = queue.take();
        let full = everything || periodic;
        if !full && ids.is_empty() {
            continue;
        }
        let passed = if full {
            full_pass(&ctx, &fence, &mirror).await
        } else {
            match ctx.ledger.mirrored_runs_by_id(&ids).await {
                Ok(runs) => mirror_pass(&ctx, &fence, &mirror, &runs).await,
                Err(e) => Err(e.into()),
            }
        };
        match passed {
            Ok(()) => {}
            Err(e @ LoopError::NotLeading(_)) => {
                tracing::warn!(event = "loadrun_mirror_error", error = %e, "mirroring the ledger into LoadRuns stopped")
            }
            Err(e) => {
                // The next wake-up or the periodic resync looks at everything again.
                queue.everything.store(true, Ordering::SeqCst);
                tracing::warn!(event = "loadrun_mirror_error", error = %e, "reading the runs to mirror failed; retrying");
            }
        }
        // Retention is no hurry: on the periodic resync and once when leadership is won, not on
        // every wake-up.
        if periodic || pruned_under != Some(fence.epoch) {
            pruned_under = Some(fence.epoch);
            if let Err(e) = prune_loadruns(&ctx, &fence, &mirror.stores).await {
                tracing::warn!(event = "loadrun_prune_error", error = %e, "deleting LoadRuns past retention failed; retrying at the next resync");
            }
            let shown = |ns: &str, name: &str| mirror.stores.job(ns, name).is_some();
            if let Err(e) = crate::orphan_jobs::remove_orphans(&ctx, &fence, shown).await {
                tracing::warn!(event = "orphan_job_error", error = %e, "checking for ledger jobs whose LoadJob is gone failed; retrying at the next resync");
            }
        }
    }
    wakers.abort_all();
}

/// Runs a full pass reads at a time.
const PAGE: i64 = 500;

/// Every mirrored run, page by page (memory bounded by a page, not by the number of runs); then
/// forgets what it kept about runs no longer mirrored.
async fn full_pass(ctx: &Context, fence: &Fence, mirror: &Mirror) -> Result<(), LoopError> {
    let mut current = HashSet::new();
    let mut after = None;
    loop {
        let page = ctx.ledger.mirrored_runs_page(after, PAGE).await?;
        current.extend(page.iter().map(|r| r.run_id));
        mirror_pass(ctx, fence, mirror, &page).await?;
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => after = Some((last.started_at, last.run_id)),
            _ => break,
        }
    }
    mirror
        .applied
        .lock()
        .expect("applied lock")
        .retain(|id, _| current.contains(id));
    mirror
        .stores
        .observed
        .lock()
        .expect("observed lock")
        .retain(|id, _| current.contains(id));
    Ok(())
}

/// Mirrors `runs`, at most [`WRITE_CONCURRENCY`] at once. One run's failure never stops the
/// others (it backs off on its own); losing leadership stops every write.
async fn mirror_pass(
    ctx: &Context,
    fence: &Fence,
    mirror: &Mirror,
    runs: &[MirroredRun],
) -> Result<(), LoopError> {
    // Made one at a time as slots free up (a future per run made up front would hold every
    // run's state at once); indexed, because a stream of closures over borrowed runs is not
    // `Send` for every lifetime, which `tokio::spawn` needs.
    let results: Vec<Result<(), LoopError>> = futures::stream::iter(0..runs.len())
        .map(|i| mirror_one(ctx, fence, mirror, &runs[i]))
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().find(|r| r.is_err()).unwrap_or(Ok(()))
}

/// One run, with its own backoff; only `NotLeading` is returned.
async fn mirror_one(
    ctx: &Context,
    fence: &Fence,
    mirror: &Mirror,
    run: &MirroredRun,
) -> Result<(), LoopError> {
    let due = ctx
        .mirror_backoff
        .lock()
        .expect("backoff lock")
        .get(&run.run_id)
        .copied();
    if due.is_some_and(|d| std::time::Instant::now() < d.next) {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let mirrored = mirror_run(ctx, fence, mirror, run).await;
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
            Ok(())
        }
        Err(e @ LoopError::NotLeading(_)) => Err(e),
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
            Ok(())
        }
    }
}

/// Mirrors one ledger run into its LoadRun (created if missing), and carries out its requests.
async fn mirror_run(
    ctx: &Context,
    fence: &Fence,
    mirror: &Mirror,
    run: &MirroredRun,
) -> Result<(), LoopError> {
    let mut parts = run.source.splitn(3, '/').skip(1);
    let (Some(ns), Some(job_name)) = (parts.next(), parts.next()) else {
        return Ok(());
    };
    if !ctx.scope.covers(ns) {
        return Ok(()); // another installation's LoadJob
    }
    let Some(owner) = mirror.stores.job(ns, job_name) else {
        return Ok(()); // the LoadJob is gone (or not seen yet: its watch event brings a full pass)
    };
    let api: Api<LoadRun> = Api::namespaced(ctx.client.clone(), ns);
    let name = load_run_name(&run.job_key, &run.business_key, &run.run_id.to_string());
    let stored = match mirror.stores.run(ns, &name) {
        Some(Ok(lr)) => Some(lr),
        Some(Err(why)) => return Err(LoopError::Unreadable(format!("LoadRun {ns}/{name}: {why}"))),
        None => None,
    };
    let existing: Arc<LoadRun> = match stored.clone() {
        Some(lr) => lr,
        // Past retention: deleted (or about to be), never created again, however short the
        // retention (the mirror still reads runs that ended within a day).
        None if run_past_retention(run, chrono::Utc::now(), ctx.loadrun_retention) => {
            return Ok(());
        }
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
                        .into_iter()
                        .chain(
                            ctx.instance
                                .as_ref()
                                .map(|i| (crate::scope::INSTANCE_LABEL.to_string(), i.clone())),
                        )
                        .collect(),
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
            match api.create(&PostParams::default(), &lr).await {
                Ok(created) => Arc::new(created),
                // Created by an earlier pass; the watch has not brought it into the store yet.
                Err(kube::Error::Api(e)) if e.code == 409 => Arc::new(api.get(&name).await?),
                Err(e) => return Err(e.into()),
            }
        }
    };
    if act_on_requests(ctx, fence, &existing, run, ns).await? {
        // The ledger changed; its NOTIFY brings the new state into the next pass.
        return Ok(());
    }
    let applied = mirror
        .applied
        .lock()
        .expect("applied lock")
        .get(&run.run_id)
        .cloned()
        // A LoadRun just created has no status, whatever an earlier one had.
        .filter(|_| stored.is_some());
    let observed = mirror
        .stores
        .observed
        .lock()
        .expect("observed lock")
        .get(&run.run_id)
        .cloned()
        .filter(|_| stored.is_some());
    // The kept part of the status: conditions and dead dispatches.
    let previous = existing.status.as_ref();
    let known = newest_known(observed.as_ref(), applied.as_ref());
    if known.is_some_and(|k| k.ledger_version > run.version_no as i64) {
        // Read before a newer change was mirrored: never write an older state over a newer one.
        return Ok(());
    }
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
    let applying = Applied::of(&status);
    if known.is_some_and(|k| k.digest == applying.digest) {
        return Ok(()); // unchanged (or written already, and the watch has not brought it back)
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
    if let Some((type_, reason, note)) = phase_event(known.map(|k| k.phase.as_str()), run) {
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
    mirror
        .applied
        .lock()
        .expect("applied lock")
        .insert(run.run_id, applying);
    Ok(())
}

pub(crate) fn owner_reference(job: &PartialObjectMeta<LoadJob>) -> OwnerReference {
    OwnerReference {
        api_version: LoadJob::api_version(&()).to_string(),
        kind: LoadJob::kind(&()).to_string(),
        name: job.name_any(),
        uid: job.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_failing_run_backs_off_exponentially_up_to_five_minutes() {
        let delays: Vec<u64> = (1..=12).map(|n| mirror_retry_delay(n).as_secs()).collect();
        assert_eq!(&delays[..5], &[2, 4, 8, 16, 32]);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*delays.last().unwrap(), 300);
    }

    #[test]
    fn the_newest_known_version_wins_and_what_was_applied_breaks_ties() {
        let at = |v: i64, phase: &str| {
            Applied::of(&LoadRunStatus {
                ledger_version: v,
                phase: phase.into(),
                ..Default::default()
            })
        };
        let (observed, applied) = (at(3, "EXTRACTING"), at(4, "EXTRACTED_VALIDATED"));
        assert_eq!(
            newest_known(Some(&observed), Some(&applied)),
            Some(&applied)
        );
        let newer = at(5, "STAGE_VALIDATING");
        assert_eq!(newest_known(Some(&newer), Some(&applied)), Some(&newer));
        let tie = at(4, "STALE_COPY");
        assert_eq!(newest_known(Some(&tie), Some(&applied)), Some(&applied));
        assert_eq!(newest_known(Some(&observed), None), Some(&observed));
        assert_eq!(newest_known(None, None), None);
        assert_ne!(observed.digest, newer.digest);
    }

    fn a_loadrun() -> LoadRun {
        LoadRun::new(
            "r",
            LoadRunSpec {
                job_key: "J".into(),
                business_key: "b".into(),
                run_id: "00000000-0000-0000-0000-000000000001".into(),
                cancel: None,
                resolution: None,
            },
        )
    }

    #[test]
    fn the_kept_loadrun_holds_what_a_new_status_is_built_from() {
        let mut lr = a_loadrun();
        let full = LoadRunStatus {
            phase: "EXTRACTING".into(),
            ledger_version: 7,
            hdfs_run_path: Some("/data/J/run_id=1".into()),
            partitions_summary: "3/8 succeeded".into(),
            completed_at: Some("2026-12-01T10:00:00Z".into()),
            dispatches: DispatchCounts {
                dead: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        lr.status = Some(full.clone());
        lr.metadata.managed_fields = Some(vec![Default::default()]);
        let seen = compact(&mut lr).expect("a status");
        assert_eq!(seen, Applied::of(&full), "the digest is of the full status");
        let kept = lr.status.as_ref().unwrap();
        assert_eq!(kept.completed_at, full.completed_at, "retention reads it");
        assert_eq!(
            (
                kept.phase.as_str(),
                kept.ledger_version,
                kept.dispatches.dead
            ),
            ("EXTRACTING", 7, 1)
        );
        assert_eq!(
            (
                kept.hdfs_run_path.as_deref(),
                kept.partitions_summary.as_str()
            ),
            (None, "")
        );
        assert!(
            lr.metadata
                .managed_fields
                .as_ref()
                .is_none_or(Vec::is_empty)
        );
        assert!(lr.metadata.managed_fields.is_none() && lr.metadata.owner_references.is_none());
        assert_eq!(lr.metadata.name.as_deref(), Some("r"));
        lr.status = None;
        assert_eq!(compact(&mut lr), None);
    }

    #[test]
    fn only_requests_wake_the_mirror_for_a_loadrun() {
        let mut lr = a_loadrun();
        lr.status = Some(LoadRunStatus::default());
        assert!(!asks_for_action(&lr), "a status update is the mirror's own");
        lr.spec.cancel = Some(crds::CancelRequest {
            reason: "wrong day".into(),
        });
        assert!(asks_for_action(&lr));
    }
}

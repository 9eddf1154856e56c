//! Loop 1, the LoadJob controller: validates each LoadJob, writes its settings to the ledger
//! (fenced), keeps the finalizer that marks the job removed, and reports Ready/Suspended and the
//! run summary in its status. Pure steps (settings, validation) are tested without a cluster.
use crate::kube_context::{
    Context, LoopError, leadership_won, retry_delay, set_condition, status_apply_params,
};
use crds::names::load_run_name;
use crds::{LoadJob, RecentCounts, RunRef};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch};
use kube::core::DeserializeGuard;
use kube::core::error_boundary::InvalidObject;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use ledger::settings::Thresholds;
use ledger::{Fence, JobWrite};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub const FINALIZER: &str = "loadcontrol.io/ledger";

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

fn run_ref(r: &ledger::RunBrief) -> RunRef {
    RunRef {
        name: load_run_name(&r.job_key, &r.business_key, &r.run_id.to_string()),
        run_id: r.run_id.to_string(),
        business_key: r.business_key.clone(),
        status: r.status.clone(),
        completed_at: r.completed_at.as_ref().map(ledger::json::format_ts),
    }
}

pub(crate) fn source_of(job: &LoadJob) -> String {
    format!(
        "LoadJob/{}/{}",
        job.namespace().unwrap_or_default(),
        job.name_any()
    )
}

/// A LoadJob as watched: one that cannot be read (written under an older or hand-edited CRD)
/// stays that object's problem, reported on it, instead of breaking the watch of all of them.
type GuardedJob = DeserializeGuard<LoadJob>;

async fn reconcile_job(guarded: Arc<GuardedJob>, ctx: Arc<Context>) -> Result<Action, LoopError> {
    let started = std::time::Instant::now();
    let key = format!(
        "{}/{}",
        guarded.namespace().unwrap_or_default(),
        guarded.name_any()
    );
    let job = match &guarded.0 {
        Ok(job) => Arc::new(job.clone()),
        Err(invalid) => {
            report_unreadable(&ctx, invalid).await;
            ctx.metrics
                .reconciled("loadjob", "invalid", started.elapsed().as_secs_f64());
            return Ok(Action::await_change());
        }
    };
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

/// A Warning Event on a LoadJob that cannot be read, once per change of it (leader only).
async fn report_unreadable(ctx: &Context, invalid: &InvalidObject) {
    let current = ctx.fence.borrow().clone();
    let Some(fence) = current else { return };
    let meta = &invalid.metadata;
    tracing::warn!(event = "loadjob_unreadable", namespace = ?meta.namespace, name = ?meta.name,
        error = %invalid.error, "a LoadJob cannot be read; it is skipped until it changes");
    let reference = ObjectReference {
        api_version: Some(LoadJob::api_version(&()).to_string()),
        kind: Some(LoadJob::kind(&()).to_string()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        ..Default::default()
    };
    let ev = KubeEvent {
        type_: EventType::Warning,
        reason: "InvalidObject".into(),
        note: Some(format!(
            "this LoadJob cannot be read and is ignored until it changes: {}",
            invalid.error
        )),
        action: "Reconcile".into(),
        secondary: None,
    };
    // Checked last, right before the write: a Kubernetes write like the others.
    if ctx.still_leads(&fence).is_err() {
        return;
    }
    if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
        tracing::warn!(event = "kube_event_error", error = %e, "publishing a Kubernetes Event failed");
    }
}

async fn reconcile_job_once(job: Arc<LoadJob>, ctx: &Arc<Context>) -> Result<Action, LoopError> {
    let Some(fence) = ctx.fence.borrow().clone() else {
        // Not the leader: writes nothing. Winning leadership reconciles every LoadJob again.
        return Ok(Action::await_change());
    };
    let api: Api<LoadJob> =
        Api::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    // `finalizer` adds our finalizer (a patch) before the first Apply and removes it after
    // Cleanup: both are Kubernetes writes, fenced like the status writes. A stalled leader adds
    // none, and keeps the finalizer when it could not check that the ledger row was marked.
    ctx.still_leads(&fence)?;
    let result = finalizer(&api, FINALIZER, job, |event| async {
        match event {
            Finalizer::Apply(job) => apply_job(&job, ctx, &fence).await,
            Finalizer::Cleanup(job) => {
                ctx.ledger.remove_job(&fence, &job.spec.job_key, &source_of(&job)).await?;
                ctx.still_leads(&fence)?;
                tracing::info!(event = "job_removed", job_key = %job.spec.job_key, "LoadJob deleted; its ledger row is marked removed");
                Ok(Action::await_change())
            }
        }
    })
    .await;
    result.map_err(|e| LoopError::Finalizer(Box::new(e)))
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
            // Nothing of this spec was applied: a Suspended condition would describe an old one.
            status.conditions.retain(|c| c.type_ != "Suspended");
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
                status.conditions.retain(|c| c.type_ != "Suspended");
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
                // A LoadJob applied for the first time may own runs the mirror has not shown
                // yet; later reconciles change nothing the mirror reads.
                let was_ready = job.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
                if !was_ready {
                    ctx.mirror_queue.everything();
                }
            }
        },
    }
    if job.status.as_ref() != Some(&status) {
        ctx.still_leads(fence)?;
        api.patch_status(
            &job.name_any(),
            &status_apply_params(),
            &Patch::Apply(json!({
                "apiVersion": LoadJob::api_version(&()), "kind": "LoadJob",
                "metadata": {"name": job.name_any()}, "status": status,
            })),
        )
        .await?;
    }
    // Its LoadRuns changing phase reconcile it (the controller owns them); the requeue only moves
    // the summary's time windows (recent counts) along.
    Ok(Action::requeue(Duration::from_secs(300)))
}

fn error_policy(job: Arc<GuardedJob>, error: &LoopError, ctx: Arc<Context>) -> Action {
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

/// At most this many LoadJobs are reconciled at once (each holds a pool connection for its
/// ledger write and summary): the dispatcher shares the pool.
const RECONCILE_CONCURRENCY: u16 = 4;

/// How long reconciles in flight may go on once shutdown is asked: a Kubernetes write that
/// hangs must not hold up the Lease's release, which waits for this loop (a reconcile cut off is
/// done again by the next leader, as after a crash).
const RECONCILE_STOP_GRACE: Duration = Duration::from_secs(2);

/// Loop 1: the LoadJob controller, until `shutdown` (and the reconciles in flight, up to
/// [`RECONCILE_STOP_GRACE`]).
pub async fn run_job_controller(ctx: Arc<Context>, shutdown: watch::Receiver<bool>) {
    let jobs = ctx.scope.apis::<GuardedJob>(&ctx.client);
    let controllers = jobs.into_iter().map(|jobs| {
        let mut shutdown = shutdown.clone();
        let watched = crate::scope::watcher_config(ctx.instance.as_deref());
        Controller::new(jobs, watched)
            // A run changing phase refreshes its LoadJob's summary (activeRun, lastRun, recent)
            // at once: the mirror says when, so a LoadRun status patch that changes no phase
            // (most of them) reconciles nothing, and no second watch of every LoadRun is kept.
            .reconcile_on(summary_changes(&ctx))
            .with_config(
                kube::runtime::controller::Config::default()
                    .debounce(Duration::from_secs(1))
                    .concurrency(RECONCILE_CONCURRENCY),
            )
            // A standby reconciles nothing; winning leadership reconciles every LoadJob at once.
            .reconcile_all_on(leadership_won(ctx.fence.clone()))
            .graceful_shutdown_on(async move {
                let _ = shutdown.wait_for(|s| *s).await;
            })
            .run(reconcile_job, error_policy, ctx.clone())
            .for_each(|_| async {})
    });
    let mut asked = shutdown.clone();
    tokio::select! {
        _ = futures::future::join_all(controllers) => {}
        _ = async {
            let _ = asked.wait_for(|s| *s).await;
            tokio::time::sleep(RECONCILE_STOP_GRACE).await;
        } => {
            tracing::warn!(event = "reconciles_abandoned", grace_s = RECONCILE_STOP_GRACE.as_secs(),
                "LoadJob reconciles still in flight 2 s after shutdown was asked were cut off (a Kubernetes or ledger call that did not answer); the next leader does them again");
        }
    }
}

/// The LoadJobs whose summary changed, as the mirror reports them (a lagging receiver skips
/// what it missed: the periodic requeue catches up).
fn summary_changes(
    ctx: &Context,
) -> impl futures::Stream<Item = ObjectRef<GuardedJob>> + Send + use<> {
    let rx = ctx.summary_changed.subscribe();
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok((ns, name)) => return Some((ObjectRef::new(&name).within(&ns), rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::{LoadJobSpec, NifiSpec, RecoveryMode, RecoverySpec};

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

    /// A LoadJob whose receiver URL has a path is refused (Ready=False, InvalidSpec, nothing
    /// written) with a reason naming the key and the way out: NiFi's PG-05 would answer 404 and
    /// every dispatch of the job would go DEAD at once.
    #[test]
    fn a_receiver_url_with_a_path_is_refused_unless_a_proxy_strips_it() {
        let mut s = spec();
        s.nifi = Some(NifiSpec {
            receiver_url: Some("https://nifi-b.example:9443/lca".into()),
            timeout_seconds: None,
        });
        let lease = Duration::from_secs(60);
        let err = validate_job(&s, &Thresholds::default(), lease).unwrap_err();
        assert!(
            err.contains("nifi.receiver_url")
                && err.contains("/lca")
                && err.contains("https://nifi-b.example:9443")
                && err.contains("nifi.receiver_path_allowed"),
            "{err}"
        );
        let proxied = Thresholds {
            receiver_path_allowed: true,
            ..Thresholds::default()
        };
        assert!(validate_job(&s, &proxied, lease).is_ok());
        s.nifi.as_mut().unwrap().receiver_url = Some("https://nifi-b.example:9443".into());
        assert_eq!(
            validate_job(&s, &Thresholds::default(), lease).unwrap(),
            json!({"nifi": {"receiver_url": "https://nifi-b.example:9443"}})
        );
    }
}

//! Writing one run's LoadRun: created with its owner if missing, requests carried out, status
//! applied only when newer and changed, Events published; each run backs off on its own.
use super::Mirror;
use super::retention::run_past_retention;
use super::status::{phase_event, run_status};
use super::store::{Applied, newest_known};
use crate::kube_context::{
    Context, LoopError, RetryAfter, publish, set_condition, status_apply_params,
};
use crate::loadrun_requests::{act_on_requests, request_refusal};
use crds::names::load_run_name;
use crds::{LoadJob, LoadRun, LoadRunSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use ledger::{Fence, MirroredRun, RunStatus};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Backoff after the n-th consecutive failure of one run: 2 s, 4 s, 8 s, … at most 5 minutes (pure).
pub fn mirror_retry_delay(failures: u32) -> Duration {
    Duration::from_secs(2u64.saturating_pow(failures.min(9)).min(300))
}

/// The longest a run waits to be mirrored again when the API server gave no answer at all
/// (unreachable, paused, the connection cut): that is no fault of the run, and a backoff grown
/// through a long outage would leave the LoadRun behind for minutes after the API server is back.
/// A refusal (an answer, even a 5xx) keeps the run's own growing backoff.
pub const UNANSWERED_RETRY_MAX: Duration = Duration::from_secs(4);

/// The delay before the run is tried again after `failures` consecutive failures, the last `e`.
pub fn retry_after(e: &LoopError, failures: u32) -> Duration {
    let unanswered = matches!(e, LoopError::Kube(k) if !matches!(k, kube::Error::Api(_)));
    let delay = mirror_retry_delay(failures);
    if unanswered {
        delay.min(UNANSWERED_RETRY_MAX)
    } else {
        delay
    }
}

/// One run, with its own backoff; only `NotLeading` is returned.
pub(super) async fn mirror_one(
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
        // The ledger's fence refused this epoch: no longer leading, whatever the Lease says.
        Err(LoopError::Ledger(ledger::LedgerError::Fenced { ours, .. })) => {
            Err(LoopError::NotLeading(ours))
        }
        Err(e) => {
            mirror
                .failed_in_pass
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let failures = due.map_or(1, |d| d.failures + 1);
            let delay = retry_after(&e, failures);
            ctx.mirror_backoff.lock().expect("backoff lock").insert(
                run.run_id,
                RetryAfter {
                    failures,
                    next: std::time::Instant::now() + delay,
                },
            );
            // Tried again when due, not only at the run's next change or the next resync (30 s).
            let (queue, id) = (ctx.mirror_queue.clone(), run.run_id);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                queue.run(id);
            });
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
    if let Some(k) = known.filter(|k| k.ledger_version > run.version_no as i64) {
        // Older than the LoadRun: a read from before a newer change was mirrored (never written
        // over the newer one), or the ledger went back (restored from backup). The ledger read
        // again now tells them apart: every version mirrored was committed, so only a ledger that
        // lost commits is still behind.
        let fresh = ctx.ledger.mirrored_runs_by_id(&[run.run_id]).await?;
        if let Some(now) = fresh.first()
            && (now.version_no as i64) < k.ledger_version
        {
            went_back(ctx, fence, &existing, now, k, ns).await?;
        }
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
            // CamelCase, as Kubernetes reasons are; the message keeps the ledger's code.
            "RunStatusMismatch"
        } else {
            "NoRefusal"
        },
        refusal.as_deref().unwrap_or(""),
        None,
    );
    // The spec (cancel, resolution) this status has seen, so a user can tell.
    status.observed_generation = existing.metadata.generation;
    let applying = Applied::of(&status);
    if known.is_some_and(|k| k.digest == applying.digest) {
        return Ok(()); // unchanged (or written already, and the watch has not brought it back)
    }
    ctx.still_leads(fence)?;
    if newly_refused && let Some(why) = &refusal {
        publish(
            ctx,
            fence,
            &existing,
            EventType::Warning,
            "RequestRefused",
            why.clone(),
            "Request",
        )
        .await;
    }
    if let Some((type_, reason, note)) = phase_event(known.map(|k| k.phase.as_str()), run) {
        publish(ctx, fence, &existing, type_, reason, note, "Mirror").await;
    }
    let phase_changed = known.is_none_or(|k| k.phase != run.status);
    if run.d_dead_alerting > previous.map_or(0, |p| p.dispatches.dead)
        && previous.is_none_or(|p| p.dispatches.dead < run.d_dead)
    {
        publish(
            ctx,
            fence,
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
            "apiVersion": LoadRun::api_version(&()), "kind": "LoadRun",
            "metadata": {"name": name}, "status": status,
        })),
    )
    .await?;
    mirror
        .applied
        .lock()
        .expect("applied lock")
        .insert(run.run_id, applying);
    if phase_changed {
        // Its LoadJob's summary (active and last run, recent counts) moved.
        let _ = ctx
            .summary_changed
            .send((ns.to_string(), job_name.to_string()));
    }
    Ok(())
}

/// The ledger holds an older state of `run` than its LoadRun showed (`shown`): the ledger's
/// [`ledger::Ledger::run_went_back`] numbers the run's versions on after the shown one (its NOTIFY
/// brings the run, as the ledger now holds it, into the next pass, a forward change for the
/// LoadRun) and holds it for a person if its publish had begun; a Warning Event says what happened.
async fn went_back(
    ctx: &Context,
    fence: &Fence,
    lr: &LoadRun,
    run: &MirroredRun,
    shown: &Applied,
    ns: &str,
) -> Result<(), LoopError> {
    let Some(shown_status) = RunStatus::parse(&shown.phase) else {
        return Ok(()); // not a status this release wrote
    };
    let actor = ledger::Actor {
        name: format!("kubernetes:{ns}/{}", lr.name_any()),
        role: "operator".into(),
    };
    let outcome = match ctx
        .ledger
        .run_went_back(
            fence,
            run.run_id,
            run.version_no as i64,
            shown.ledger_version,
            shown_status,
            &actor,
        )
        .await
    {
        Ok(o) => o,
        // Changed meanwhile: the next pass reads it again.
        Err(ledger::LedgerError::RunStatusMismatch { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let held = if outcome.held {
        "; its publish had begun, so it is held as PUBLISH_UNKNOWN until a person checks Hive and resolves it"
    } else {
        ""
    };
    publish(
        ctx,
        fence,
        lr,
        EventType::Warning,
        "LedgerWentBack",
        format!(
            "the ledger holds version {} ({}) of this run, older than version {} ({}) this LoadRun \
             showed: the ledger database was restored to an earlier point (or failed over to a \
             standby that lacked commits), and what was decided after it is not in the ledger{held}",
            run.version_no, run.status, shown.ledger_version, shown.phase
        ),
        "Mirror",
    )
    .await;
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
    fn a_run_the_api_server_did_not_answer_for_is_tried_again_within_seconds() {
        let unanswered = LoopError::Kube(kube::Error::Service(
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused").into(),
        ));
        let refused = LoopError::Kube(kube::Error::Api(
            kube::core::Status::failure("forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        ));
        for failures in 1..=12 {
            assert!(retry_after(&unanswered, failures) <= UNANSWERED_RETRY_MAX);
            assert_eq!(
                retry_after(&refused, failures),
                mirror_retry_delay(failures)
            );
        }
        assert_eq!(retry_after(&refused, 12).as_secs(), 300);
    }

    #[test]
    fn a_failing_run_backs_off_exponentially_up_to_five_minutes() {
        let delays: Vec<u64> = (1..=12).map(|n| mirror_retry_delay(n).as_secs()).collect();
        assert_eq!(&delays[..5], &[2, 4, 8, 16, 32]);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*delays.last().unwrap(), 300);
    }
}

//! The mirror's view of Kubernetes: reflector stores of the LoadRuns and (metadata only) LoadJobs
//! it watches, the compact form it keeps of each LoadRun, and what it last applied. The pure
//! parts are unit-tested.
use crate::kube_context::Context;
use crate::mirror_queue::MirrorQueue;
use crds::{LoadJob, LoadRun, LoadRunStatus};
use futures::StreamExt;
use kube::ResourceExt;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::HashMap;
use std::sync::Arc;
use uuid::Uuid;

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
pub(super) type GuardedRun = DeserializeGuard<LoadRun>;

#[derive(Default)]
pub(super) struct Stores {
    pub(super) runs: Vec<Store<GuardedRun>>,
    pub(super) jobs: Vec<Store<PartialObjectMeta<LoadJob>>>,
    /// Each run's LoadRun status as the watch last delivered it, as a digest.
    pub(super) observed: Arc<std::sync::Mutex<HashMap<Uuid, Applied>>>,
}

impl Stores {
    /// The stored LoadRun, or why it cannot be read.
    pub(super) fn run(&self, ns: &str, name: &str) -> Option<Result<Arc<LoadRun>, String>> {
        let key = ObjectRef::new(name).within(ns);
        let guarded = self.runs.iter().find_map(|s| s.get(&key))?;
        Some(match &guarded.0 {
            Ok(lr) => Ok(Arc::new(lr.clone())),
            Err(invalid) => Err(invalid.error.clone()),
        })
    }

    pub(super) fn job(&self, ns: &str, name: &str) -> Option<Arc<PartialObjectMeta<LoadJob>>> {
        let key = ObjectRef::new(name).within(ns);
        self.jobs.iter().find_map(|s| s.get(&key))
    }

    pub(super) fn all_runs(&self) -> Vec<Arc<LoadRun>> {
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

/// Starts the watches that feed the stores (LoadRuns guarded, LoadJobs metadata only), each with
/// kube-runtime's backoff, owned by `wakers`. A LoadRun carrying a request, or deleted, wakes the
/// mirror for its run; a restarted watch asks for everything.
pub(super) fn spawn_watches(
    ctx: &Context,
    queue: &Arc<MirrorQueue>,
    wakers: &mut tokio::task::JoinSet<()>,
) -> Stores {
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
    stores
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::{DispatchCounts, LoadRunSpec};

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

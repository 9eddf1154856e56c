//! Ledger jobs whose LoadJob is gone. The LoadJob controller's finalizer marks a job removed when
//! its LoadJob is deleted; a finalizer bypassed (`helm uninstall --no-hooks` followed by a
//! manual strip, a namespace force-deleted) leaves the row owned forever: NiFi could still start
//! runs for it, and a new LoadJob with that jobKey would be refused as a conflict. The mirror's
//! periodic resync finds such rows and marks them removed, exactly as the finalizer would have.
//!
//! A job is removed only on positive evidence that its LoadJob is gone: the LoadJob kind is
//! served (discovery lists `loadjobs` in `loadcontrol.io/v1beta1`, the version this binary reads,
//! before and after the lookups), and a GET of that very LoadJob answers 404 naming it. A 404 from a kind that is not served (the
//! CRD deleted, or a CRD that no longer serves this version) says nothing about the LoadJobs, so
//! such a pass removes nothing. And one pass removes at most [`MAX_REMOVED_PER_PASS`].
use crate::kube_context::{Context, LoopError};
use crds::LoadJob;
use kube::{Api, Resource};
use ledger::Fence;

/// At most this many jobs are marked removed by one pass; the rest wait for the next resync
/// (30 s). An orphan is the exception (a finalizer bypassed by hand): many at once means that
/// something happened to the LoadJobs as a whole (a namespace force-deleted, a restore, a CRD
/// replaced, a fault not foreseen here), and removing a job refuses NiFi's runs for it while
/// `jobs.require_registered` is on. Bounded, the warnings and `lca_orphan_jobs_removed_total` are
/// there to be seen before the whole ledger is emptied, while a real mass deletion still
/// completes by itself (1000 orphans in 25 minutes).
pub const MAX_REMOVED_PER_PASS: usize = 20;

/// A ledger job owned by `LoadJob/<namespace>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedJob {
    pub job_key: String,
    pub source: String,
    pub namespace: String,
    pub name: String,
}

/// The owned jobs of this installation's scope whose LoadJob the watch does not show (pure):
/// candidates only, each confirmed with the API server before it is removed (the watch may lag,
/// and with an instance label the watch shows only labelled LoadJobs).
pub fn orphan_candidates(
    owned: Vec<(String, String)>,
    scope: &crate::scope::WatchScope,
    shown: impl Fn(&str, &str) -> bool,
) -> Vec<OwnedJob> {
    owned
        .into_iter()
        .filter_map(|(job_key, source)| {
            let mut parts = source.splitn(3, '/');
            let (Some("LoadJob"), Some(ns), Some(name)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return None;
            };
            let job = OwnedJob {
                namespace: ns.to_string(),
                name: name.to_string(),
                job_key,
                source: source.clone(),
            };
            (scope.covers(ns) && !shown(ns, name)).then_some(job)
        })
        .collect()
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Swept {
    /// The LoadJob kind is not served (the sentence says how it looked): nobody can tell which
    /// LoadJobs exist, so nothing was removed.
    KindNotServed(String),
    /// `removed` jobs marked removed; `left` candidates not looked up, because the pass reached
    /// [`MAX_REMOVED_PER_PASS`] (they wait for the next one).
    Done { removed: usize, left: usize },
}

/// Whether the LoadJob kind is served: the discovery document of its group and version lists its
/// resource (Err: a sentence saying what is missing). Failing to ask (the API server away, a 403)
/// is an error of the pass, not an answer.
pub async fn loadjob_kind_served(client: &kube::Client) -> Result<Result<(), String>, kube::Error> {
    let api_version = LoadJob::api_version(&());
    let plural = LoadJob::plural(&());
    match client.list_api_group_resources(&api_version).await {
        Ok(list) => Ok(
            if list
                .resources
                .iter()
                .any(|r| r.name == plural && r.kind == LoadJob::kind(&()))
            {
                Ok(())
            } else {
                Err(format!(
                    "{api_version} is served without {plural} (the LoadJob CRD does not serve this version)"
                ))
            },
        ),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Err(format!(
            "{api_version} is not served (the LoadJob CRD is not installed, or does not serve this version)"
        ))),
        Err(e) => Err(e),
    }
}

/// Whether a 404 answered to a GET of LoadJob `name` is the API server saying that this object
/// does not exist (pure): its details name the object and the resource. A path that is not served
/// at all answers 404 too, without them.
pub fn not_found_names(status: &kube::core::Status, name: &str) -> bool {
    status.code == 404
        && status.details.as_ref().is_some_and(|d| {
            d.name == name && d.kind == LoadJob::plural(&()) && d.group == LoadJob::group(&())
        })
}

/// What a GET of one candidate's LoadJob showed.
enum Lookup {
    Exists,
    Gone,
    /// A 404 that does not name the object: the kind is not served (any longer).
    CannotTell(String),
}

async fn look_up(ctx: &Context, job: &OwnedJob) -> Result<Lookup, kube::Error> {
    let api: Api<LoadJob> = Api::namespaced(ctx.client.clone(), &job.namespace);
    match api.get_metadata(&job.name).await {
        Ok(_) => Ok(Lookup::Exists),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(if not_found_names(&s, &job.name) {
            Lookup::Gone
        } else {
            Lookup::CannotTell(format!(
                "a GET of LoadJob {}/{} answered 404 without naming it: {}",
                job.namespace, job.name, s.message
            ))
        }),
        Err(e) => Err(e),
    }
}

/// A pass that cannot tell which LoadJobs exist: logged, counted, nothing removed.
fn cannot_tell(ctx: &Context, why: String, candidates: usize) -> Swept {
    ctx.metrics.orphan_sweep(true, 0);
    tracing::warn!(event = "orphan_check_skipped", candidates, problem = %why,
        "the LoadJob kind is not served, so no LoadJob can be confirmed gone: no ledger job is marked removed until it is served again");
    Swept::KindNotServed(why)
}

/// Marks removed the owned jobs whose LoadJob the API server confirms is gone, at most
/// [`MAX_REMOVED_PER_PASS`]: the kind served before and after the lookups, and each LoadJob's own
/// GET answering a 404 that names it. `shown` (the watch) only spares the lookups of LoadJobs it
/// has; its absence proves nothing.
pub async fn remove_orphans(
    ctx: &Context,
    fence: &Fence,
    shown: impl Fn(&str, &str) -> bool,
) -> Result<Swept, LoopError> {
    let owned = ctx.ledger.loadjob_owned_jobs().await?;
    let candidates = orphan_candidates(owned, &ctx.scope, shown);
    if candidates.is_empty() {
        ctx.metrics.orphan_sweep(false, 0);
        return Ok(Swept::Done {
            removed: 0,
            left: 0,
        });
    }
    if let Err(why) = loadjob_kind_served(&ctx.client).await? {
        return Ok(cannot_tell(ctx, why, candidates.len()));
    }
    let mut gone = Vec::new();
    let mut looked = 0;
    for job in &candidates {
        if gone.len() == MAX_REMOVED_PER_PASS {
            break;
        }
        looked += 1;
        match look_up(ctx, job).await? {
            Lookup::Exists => {} // not yet in the watch, or not labelled for this instance
            Lookup::Gone => gone.push(job),
            Lookup::CannotTell(why) => return Ok(cannot_tell(ctx, why, candidates.len())),
        }
    }
    if gone.is_empty() {
        ctx.metrics.orphan_sweep(false, 0);
        return Ok(Swept::Done {
            removed: 0,
            left: 0,
        });
    }
    // The 404s prove something only if the kind was served all along.
    if let Err(why) = loadjob_kind_served(&ctx.client).await? {
        return Ok(cannot_tell(ctx, why, candidates.len()));
    }
    let mut removed = 0;
    for job in gone {
        ctx.still_leads(fence)?;
        if ctx
            .ledger
            .remove_job(fence, &job.job_key, &job.source)
            .await?
        {
            removed += 1;
            tracing::warn!(event = "orphan_job_removed", job_key = %job.job_key, source = %job.source,
                "the LoadJob of this ledger job no longer exists (its finalizer was bypassed): marked removed");
        }
    }
    let left = candidates.len() - looked;
    if left > 0 {
        tracing::warn!(
            event = "orphan_jobs_deferred",
            removed,
            left,
            "more ledger jobs may have lost their LoadJob than one pass removes: the rest are looked at by the next resync"
        );
    }
    ctx.metrics.orphan_sweep(false, removed as u64);
    Ok(Swept::Done { removed, left })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::WatchScope;

    #[test]
    fn only_owned_jobs_in_scope_that_the_watch_lacks_are_candidates() {
        let owned = vec![
            ("SHOWN".into(), "LoadJob/a/shown".into()),
            ("GONE".into(), "LoadJob/a/gone".into()),
            ("ELSEWHERE".into(), "LoadJob/b/gone".into()),
            ("ODD".into(), "config".into()),
        ];
        let scope = WatchScope::Namespaces(vec!["a".into()]);
        let c = orphan_candidates(owned.clone(), &scope, |ns, n| ns == "a" && n == "shown");
        assert_eq!(c.len(), 1);
        assert_eq!(
            c[0],
            OwnedJob {
                job_key: "GONE".into(),
                source: "LoadJob/a/gone".into(),
                namespace: "a".into(),
                name: "gone".into()
            }
        );
        let all = orphan_candidates(owned, &WatchScope::Cluster, |_, _| false);
        assert_eq!(
            all.len(),
            3,
            "a source that is no LoadJob is never a candidate"
        );
    }

    #[test]
    fn only_a_404_naming_the_loadjob_confirms_it_gone() {
        use kube::core::Status;
        // As the API server words it.
        let not_found = |name: &str, kind: &str| -> Status {
            serde_json::from_value(serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                "message": format!("{kind}.loadcontrol.io \"{name}\" not found"), "code": 404,
                "details": {"name": name, "group": "loadcontrol.io", "kind": kind},
            }))
            .unwrap()
        };
        assert!(not_found_names(&not_found("a", "loadjobs"), "a"));
        assert!(!not_found_names(&not_found("b", "loadjobs"), "a"));
        assert!(!not_found_names(&not_found("a", "loadruns"), "a"));
        let unserved = Status::failure(
            "the server could not find the requested resource",
            "NotFound",
        )
        .with_code(404);
        assert!(
            !not_found_names(&unserved, "a"),
            "a path not served says nothing about the object"
        );
    }
}

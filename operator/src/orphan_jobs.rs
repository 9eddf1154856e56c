//! Ledger jobs whose LoadJob is gone. The LoadJob controller's finalizer marks a job removed when
//! its LoadJob is deleted; a finalizer bypassed (`helm uninstall --no-hooks` followed by a
//! manual strip, a namespace force-deleted) leaves the row owned forever: NiFi could still start
//! runs for it, and a new LoadJob with that jobKey would be refused as a conflict. The mirror's
//! periodic resync finds such rows and marks them removed, exactly as the finalizer would have.
use crate::kube_context::{Context, LoopError};
use crds::LoadJob;
use kube::Api;
use ledger::Fence;

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

/// Marks removed every owned job whose LoadJob the API server confirms is gone; how many.
pub async fn remove_orphans(
    ctx: &Context,
    fence: &Fence,
    shown: impl Fn(&str, &str) -> bool,
) -> Result<usize, LoopError> {
    let owned = ctx.ledger.loadjob_owned_jobs().await?;
    let mut removed = 0;
    for job in orphan_candidates(owned, &ctx.scope, shown) {
        let api: Api<LoadJob> = Api::namespaced(ctx.client.clone(), &job.namespace);
        if api.get_metadata_opt(&job.name).await?.is_some() {
            continue; // it exists (not yet in the watch, or not labelled for this instance)
        }
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
    Ok(removed)
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
}

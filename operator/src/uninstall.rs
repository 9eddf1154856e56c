//! What `helm uninstall` needs from the operator: LoadJobs outlive the release (they are the
//! user's objects, and Helm never deletes CRDs), but the finalizer the LoadJob controller put on
//! them would leave every later `kubectl delete loadjob` hanging with no controller to clear it.
//! The chart's pre-delete hook runs `load-control-operator release-finalizers --stop-deployment
//! NAME`: it first scales the release's Deployment to zero (a running LoadJob controller would put
//! the finalizer straight back), then removes only our finalizer. Ledger rows stay: a later
//! install adopts its LoadJobs again.
use crate::loadjob_controller::FINALIZER;
use crate::scope::WatchScope;
use crds::LoadJob;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::{Client, ResourceExt};
use std::time::{Duration, Instant};

/// The finalizers left once ours is removed (pure).
pub fn without_ours(finalizers: &[String]) -> Vec<String> {
    finalizers
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect()
}

/// Scales the Deployment to zero and waits until none of its pods is left; returns the replicas
/// it had, so that a failed uninstall can put them back.
pub async fn stop_deployment(
    client: Client,
    namespace: &str,
    name: &str,
    limit: Duration,
) -> anyhow::Result<i32> {
    let api: Api<Deployment> = Api::namespaced(client, namespace);
    let d = api
        .get(name)
        .await
        .map_err(|e| anyhow::anyhow!("reading Deployment {namespace}/{name}: {e}"))?;
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    scale(&api, name, 0).await?;
    // Wait for the pods themselves, terminating ones included: a stopping operator still
    // reconciles until its process ends, and would put the finalizer back.
    let selector = d
        .spec
        .and_then(|s| s.selector.match_labels)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    anyhow::ensure!(
        !selector.is_empty(),
        "Deployment {namespace}/{name} has no selector labels"
    );
    let pods: Api<Pod> = Api::namespaced(api.clone().into_client(), namespace);
    let deadline = Instant::now() + limit;
    loop {
        let left = match pods
            .list_metadata(&ListParams::default().labels(&selector))
            .await
        {
            Ok(list) => Some(list.items.len()),
            Err(e) => {
                tracing::warn!(event = "uninstall_list_pods_error", error = %e, "listing the operator pods failed; retrying");
                None
            }
        };
        if left == Some(0) {
            tracing::info!(
                event = "deployment_stopped",
                namespace,
                name,
                "the operator pods are gone"
            );
            return Ok(replicas);
        }
        if Instant::now() >= deadline {
            restore(&api, name, replicas).await;
            anyhow::bail!(
                "Deployment {namespace}/{name} still has pods after {limit:?}; scaled back to {replicas}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn scale(api: &Api<Deployment>, name: &str, replicas: i32) -> anyhow::Result<()> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"spec": {"replicas": replicas}})),
    )
    .await
    .map_err(|e| anyhow::anyhow!("scaling Deployment {name} to {replicas}: {e}"))?;
    Ok(())
}

/// Puts the Deployment back to `replicas` (a failed uninstall must not leave NiFi's API down);
/// retried, because the failure that brought us here may be passing.
pub async fn restore(api: &Api<Deployment>, name: &str, replicas: i32) {
    for attempt in 1..=5u32 {
        match scale(api, name, replicas).await {
            Ok(()) => {
                tracing::warn!(
                    event = "deployment_restored",
                    name,
                    replicas,
                    "uninstall failed: the Deployment is scaled back"
                );
                return;
            }
            Err(e) => {
                tracing::error!(event = "deployment_restore_error", name, attempt, error = %e, "scaling the Deployment back failed");
                tokio::time::sleep(Duration::from_secs(attempt as u64)).await;
            }
        }
    }
}

/// How often one LoadJob's release is tried (a conflict means someone wrote it meanwhile).
const RELEASE_ATTEMPTS: u32 = 8;

/// Removes our finalizer from every LoadJob that carries it; returns how many were released.
/// Metadata only: a LoadJob whose spec cannot be read (an older or hand-edited CRD) is released
/// like any other, and cannot make the uninstall fail.
pub async fn release_finalizers(
    client: Client,
    scope: &WatchScope,
    instance: Option<&str>,
) -> anyhow::Result<usize> {
    let mut list = ListParams::default();
    if let Some(i) = instance {
        list = list.labels(&format!("{}={i}", crate::scope::INSTANCE_LABEL));
    }
    let mut jobs = vec![];
    for api in scope.apis::<LoadJob>(&client) {
        jobs.extend(api.list_metadata(&list).await?.items);
    }
    let mut released = 0;
    for job in jobs {
        if !job.finalizers().iter().any(|f| f == FINALIZER) {
            continue;
        }
        let (ns, name) = (job.namespace().unwrap_or_default(), job.name_any());
        let api: Api<LoadJob> = Api::namespaced(client.clone(), &ns);
        if release_one(&api, job).await? {
            tracing::info!(event = "finalizer_released", namespace = %ns, name = %name, "LoadJob released for uninstall");
            released += 1;
        }
    }
    Ok(released)
}

/// Removes our finalizer from one LoadJob: a compare-and-set on its resourceVersion (a finalizer
/// someone else added meanwhile is never dropped), read again and retried on a conflict.
async fn release_one(
    api: &Api<LoadJob>,
    mut job: PartialObjectMeta<LoadJob>,
) -> anyhow::Result<bool> {
    let name = job.name_any();
    for attempt in 1..=RELEASE_ATTEMPTS {
        let finalizers = job.finalizers().to_vec();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            return Ok(false);
        }
        let patch = serde_json::json!({"metadata": {
            "finalizers": without_ours(&finalizers),
            "resourceVersion": job.resource_version(),
        }});
        match api
            .patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < RELEASE_ATTEMPTS => {
                tracing::info!(event = "finalizer_release_conflict", name = %name, attempt, "the LoadJob changed meanwhile; reading it again");
                match api.get_metadata_opt(&name).await? {
                    Some(fresh) => job = fresh,
                    None => return Ok(false),
                }
            }
            Err(e) => anyhow::bail!("releasing LoadJob {name}: {e}"),
        }
    }
    anyhow::bail!("releasing LoadJob {name}: still conflicting after {RELEASE_ATTEMPTS} attempts")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_finalizer_is_removed() {
        let f = vec!["other.io/keep".to_string(), FINALIZER.to_string()];
        assert_eq!(without_ours(&f), vec!["other.io/keep".to_string()]);
        assert!(without_ours(&[FINALIZER.to_string()]).is_empty());
    }
}

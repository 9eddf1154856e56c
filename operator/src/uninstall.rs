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

/// Scales the Deployment to zero and waits until none of its pods is left.
pub async fn stop_deployment(
    client: Client,
    namespace: &str,
    name: &str,
    limit: Duration,
) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(client, namespace);
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"spec": {"replicas": 0}})),
    )
    .await
    .map_err(|e| anyhow::anyhow!("scaling Deployment {namespace}/{name} to zero: {e}"))?;
    // Wait for the pods themselves, terminating ones included: a stopping operator still
    // reconciles until its process ends, and would put the finalizer back.
    let d = api.get(name).await?;
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
    let pods: Api<Pod> = Api::namespaced(api.into_client(), namespace);
    let deadline = Instant::now() + limit;
    loop {
        let left = pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .len();
        if left == 0 {
            tracing::info!(
                event = "deployment_stopped",
                namespace,
                name,
                "the operator pods are gone"
            );
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "Deployment {namespace}/{name} still has {left} pods after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Removes our finalizer from every LoadJob that carries it; returns how many were released.
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
        jobs.extend(api.list(&list).await?.items);
    }
    let mut released = 0;
    for job in jobs {
        let finalizers = job.finalizers().to_vec();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            continue;
        }
        let (ns, name) = (job.namespace().unwrap_or_default(), job.name_any());
        let api: Api<LoadJob> = Api::namespaced(client.clone(), &ns);
        // The resourceVersion makes the patch a compare-and-set: a finalizer someone else added
        // meanwhile is never dropped.
        let patch = serde_json::json!({"metadata": {
            "finalizers": without_ours(&finalizers),
            "resourceVersion": job.resource_version(),
        }});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| anyhow::anyhow!("releasing LoadJob {ns}/{name}: {e}"))?;
        tracing::info!(event = "finalizer_released", namespace = %ns, name = %name, "LoadJob released for uninstall");
        released += 1;
    }
    Ok(released)
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

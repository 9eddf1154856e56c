//! Which namespaces the operator watches: the whole cluster (one installation per cluster), or a
//! list (several installations side by side, each with a Role in its namespaces only). Two
//! installations never touch each other's LoadJobs and LoadRuns when their lists do not overlap.
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum WatchScope {
    #[default]
    Cluster,
    Namespaces(Vec<String>),
}

impl WatchScope {
    /// From `--watch-namespace` values (empty: the whole cluster); blanks and repeats dropped.
    pub fn from_list(list: &[String]) -> WatchScope {
        let mut ns: Vec<String> = list
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        ns.sort();
        ns.dedup();
        if ns.is_empty() {
            WatchScope::Cluster
        } else {
            WatchScope::Namespaces(ns)
        }
    }

    /// Whether objects in `namespace` are ours to act on.
    pub fn covers(&self, namespace: &str) -> bool {
        match self {
            WatchScope::Cluster => true,
            WatchScope::Namespaces(list) => list.iter().any(|n| n == namespace),
        }
    }

    /// One API handle per watched namespace (or one for the whole cluster).
    pub fn apis<K>(&self, client: &Client) -> Vec<Api<K>>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        match self {
            WatchScope::Cluster => vec![Api::all(client.clone())],
            WatchScope::Namespaces(list) => list
                .iter()
                .map(|n| Api::namespaced(client.clone(), n))
                .collect(),
        }
    }
}

/// Whether the LoadJob and LoadRun kinds are served and listable in the scope; if not, a sentence
/// saying what to do. Metadata only: one object whose spec cannot be read (an older or
/// hand-edited CRD) must not make the whole installation look broken.
pub async fn kinds_served(client: &Client, scope: &WatchScope) -> Result<(), String> {
    use kube::api::ListParams;
    async fn one<K>(apis: Vec<Api<K>>, kind: &str, scope: &WatchScope) -> Result<(), String>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        for api in apis {
            match api.list_metadata(&ListParams::default().limit(1)).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    return Err(format!(
                        "the {kind} custom resource is not installed: run `kubectl apply --server-side -f crds/` (or install the chart's CRDs)"
                    ));
                }
                Err(kube::Error::Api(e)) if e.code == 403 => {
                    return Err(format!(
                        "not allowed to list {kind}s in {scope}: {} (check the chart's RBAC and watchNamespaces)",
                        e.message
                    ));
                }
                Err(e) => return Err(format!("listing {kind}s in {scope}: {e}")),
            }
        }
        Ok(())
    }
    one(scope.apis::<crds::LoadJob>(client), "LoadJob", scope).await?;
    one(scope.apis::<crds::LoadRun>(client), "LoadRun", scope).await
}

/// How often access is checked again once it works (RBAC or a CRD can be taken away later).
const ACCESS_RECHECK: std::time::Duration = std::time::Duration::from_secs(60);
/// Longest wait between checks while access fails (each is one small list call per kind).
const ACCESS_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(15);

/// Checks [`kinds_served`] for as long as the process runs: at once, with backoff (1 s doubling
/// to 15 s) while it fails, then every minute. It never ends the process: a missing CRD, a 403 or
/// an API server that is away are conditions to wait out (the watches back off meanwhile, and the
/// api-server beside this process goes on serving NiFi). Each change is logged once and shown
/// in `/healthz` and `lca_kubernetes_access`.
pub async fn watch_access(client: Client, scope: WatchScope, health: crate::health::Health) {
    let mut delay = std::time::Duration::from_secs(1);
    let mut last: Option<Result<(), String>> = None;
    loop {
        let now = kinds_served(&client, &scope).await;
        if last.as_ref() != Some(&now) {
            match &now {
                Ok(()) => tracing::info!(event = "kubernetes_access_ok", scope = %scope,
                    "LoadJobs and LoadRuns are served and readable"),
                Err(why) => {
                    tracing::error!(event = "kubernetes_access_failed", scope = %scope, problem = %why,
                    "cannot do the Kubernetes work until this is fixed; retrying with backoff (NiFi's API is not affected)")
                }
            }
            health.kubernetes(now.clone().err());
        }
        let wait = if now.is_ok() {
            delay = std::time::Duration::from_secs(1);
            ACCESS_RECHECK
        } else {
            let d = delay;
            delay = (delay * 2).min(ACCESS_RETRY_MAX);
            d
        };
        last = Some(now);
        tokio::time::sleep(wait).await;
    }
}

/// The label that ties LoadJobs and LoadRuns to one installation (`--instance`).
pub const INSTANCE_LABEL: &str = "loadcontrol.io/instance";

/// Whether `name` can be an instance: a Kubernetes label value (pure).
pub fn valid_instance(name: &str) -> Result<String, String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(name.to_string())
    } else {
        Err(format!(
            "{name:?} is not a label value (1-63 of A-Z a-z 0-9 - _ ., starting and ending alphanumeric)"
        ))
    }
}

/// Watches of one installation: with an instance, only the objects labelled with it.
pub fn watcher_config(instance: Option<&str>) -> kube::runtime::watcher::Config {
    match instance {
        Some(i) => {
            kube::runtime::watcher::Config::default().labels(&format!("{INSTANCE_LABEL}={i}"))
        }
        None => Default::default(),
    }
}

impl std::fmt::Display for WatchScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WatchScope::Cluster => f.write_str("all namespaces"),
            WatchScope::Namespaces(list) => write!(f, "namespaces {}", list.join(",")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_scopes_and_nothing_means_the_cluster() {
        assert_eq!(WatchScope::from_list(&[]), WatchScope::Cluster);
        assert_eq!(WatchScope::from_list(&[" ".into()]), WatchScope::Cluster);
        let s = WatchScope::from_list(&["b,a".into(), "a".into()]);
        assert_eq!(s, WatchScope::Namespaces(vec!["a".into(), "b".into()]));
        assert!(s.covers("a") && s.covers("b") && !s.covers("c"));
        assert!(WatchScope::Cluster.covers("anything"));
    }
}

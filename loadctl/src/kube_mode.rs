//! `loadctl --kube`: the same commands through Kubernetes instead of the HTTP API. Runs are read
//! from LoadRuns, and actions are requests written on them (`spec.cancel`, `spec.resolution`)
//! that the operator carries out — so Kubernetes RBAC decides who may act, and the API server's
//! audit log records who did.
use crate::client::Failure;
use crds::LoadRun;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::DeserializeGuard;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

pub struct Kube {
    client: Client,
    namespace: Option<String>,
}

fn failure(e: kube::Error) -> Failure {
    match e {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => Failure::Denied {
            status: s.code,
            code: s.reason.clone(),
            message: s.message.clone(),
        },
        kube::Error::Api(s) if (400..500).contains(&s.code) => Failure::Refused {
            status: s.code,
            code: s.reason.clone(),
            message: s.message.clone(),
        },
        other => Failure::Unavailable(format!("Kubernetes: {other}")),
    }
}

impl Kube {
    /// `context` empty: the current context of the kubeconfig (or in-cluster).
    pub async fn connect(context: &str, namespace: Option<String>) -> Result<Kube, Failure> {
        let client = if context.is_empty() {
            Client::try_default()
                .await
                .map_err(|e| Failure::Usage(format!("Kubernetes: {e}")))?
        } else {
            let kc = Kubeconfig::read().map_err(|e| Failure::Usage(format!("kubeconfig: {e}")))?;
            let opts = KubeConfigOptions {
                context: Some(context.to_string()),
                ..Default::default()
            };
            let config = kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|e| Failure::Usage(format!("kubeconfig context {context}: {e}")))?;
            Client::try_from(config).map_err(|e| Failure::Usage(format!("Kubernetes: {e}")))?
        };
        Ok(Kube { client, namespace })
    }

    /// Every LoadRun of the scope, newest first. One that cannot be read (written under an older
    /// or hand-edited CRD) is left out and named on standard error, never an error for the rest.
    pub async fn runs(&self) -> Result<Vec<LoadRun>, Failure> {
        let api: Api<DeserializeGuard<LoadRun>> = match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let listed = api.list(&ListParams::default()).await.map_err(failure)?;
        let mut runs = vec![];
        for DeserializeGuard(item) in listed.items {
            match item {
                Ok(lr) => runs.push(lr),
                Err(invalid) => eprintln!(
                    "warning: LoadRun {}/{} cannot be read and is left out: {}",
                    invalid.metadata.namespace.unwrap_or_default(),
                    invalid.metadata.name.unwrap_or_default(),
                    invalid.error
                ),
            }
        }
        runs.sort_by_key(|r| std::cmp::Reverse(r.creation_timestamp()));
        Ok(runs)
    }

    /// A LoadRun by its name or its runId.
    pub async fn find(&self, id: &str) -> Result<LoadRun, Failure> {
        self.runs()
            .await?
            .into_iter()
            .find(|r| r.name_any() == id || r.spec.run_id == id)
            .ok_or_else(|| Failure::Refused {
                status: 404,
                code: "NotFound".into(),
                message: format!(
                    "no LoadRun named {id} or with that runId{}",
                    match &self.namespace {
                        Some(ns) => format!(" in namespace {ns}"),
                        None => String::new(),
                    }
                ),
            })
    }

    /// Writes a request on the LoadRun (`{"cancel": …}` or `{"resolution": …}`).
    pub async fn request(&self, id: &str, spec: Value) -> Result<LoadRun, Failure> {
        let run = self.find(id).await?;
        let api: Api<LoadRun> =
            Api::namespaced(self.client.clone(), &run.namespace().unwrap_or_default());
        api.patch(
            &run.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await
        .map_err(failure)
    }
}

/// `loadctl --kube runs` as a table.
pub fn runs_table(runs: &[LoadRun]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let st = r.status.clone().unwrap_or_default();
            vec![
                r.namespace().unwrap_or_default(),
                r.name_any(),
                r.spec.job_key.clone(),
                r.spec.business_key.clone(),
                if st.phase.is_empty() {
                    "-".into()
                } else {
                    st.phase.clone()
                },
                if st.partitions_summary.is_empty() {
                    "-".into()
                } else {
                    st.partitions_summary.clone()
                },
                st.counts.extracted.to_string(),
            ]
        })
        .collect();
    crate::render::table(
        &[
            "NAMESPACE",
            "NAME",
            "JOB",
            "BUSINESS KEY",
            "PHASE",
            "PARTITIONS",
            "ROWS",
        ],
        rows,
    )
}

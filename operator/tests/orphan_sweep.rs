//! The orphan sweep (`orphan_jobs::remove_orphans`, run by the LoadRun mirror's resync) against a
//! real kube-apiserver + etcd and a real ledger, one pass at a time: it marks a ledger job removed
//! only when the LoadJob kind is served and a GET confirms that LoadJob gone, never when the kind
//! itself is missing, and at most `MAX_REMOVED_PER_PASS` per pass. The watch is played as empty
//! (`shown` answers false for everything), the worst it can show: the API server alone decides.
mod common;
use common::*;
use crds::LoadJob;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kubetest::ControlPlane;
use lcoperator::kube_context::Context;
use lcoperator::orphan_jobs::{MAX_REMOVED_PER_PASS, Swept, loadjob_kind_served, remove_orphans};
use lcoperator::scope::WatchScope;
use ledger::Fence;
use serde_json::json;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Polls `probe` until it yields `Some` (bounded); the condition, not a sleep, is what is awaited.
async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Sweep {
    cp: ControlPlane,
    env: Env,
    ns: String,
    ctx: Context,
    fence: Fence,
}

/// A control plane with the CRDs, a ledger, and the context the mirror would give the sweep,
/// leading under a fence of its own (no operator runs: nothing sweeps but the test).
async fn setup() -> Sweep {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.install_crds(&crds::all_crds_yaml()).await.unwrap();
    let ns = cp.create_namespace("orphans").await.unwrap();
    let env = Env::start(|_| {}).await;
    let fence = env.ledger.acquire_epoch("orphan-sweep-test").await.unwrap();
    let client = cp.client().await.unwrap();
    let leading_until = lcoperator::lease::LeadingUntil::default();
    leading_until.set(Some(Instant::now() + Duration::from_secs(3600)));
    let ctx = Context {
        recorder: lcoperator::kube_context::recorder(client.clone(), "orphan-sweep-test"),
        client,
        ledger: env.ledger.clone(),
        fence: tokio::sync::watch::channel(Some(fence.clone())).1,
        leading_until,
        lease: Duration::from_secs(30),
        mirror_queue: Default::default(),
        mirror_compared: tokio::sync::watch::channel(0).0,
        mirror_backoff: Default::default(),
        summary_changed: tokio::sync::broadcast::channel(16).0,
        metrics: Arc::new(lcoperator::metrics::Metrics::default()),
        job_failures: Default::default(),
        scope: WatchScope::Namespaces(vec![ns.clone()]),
        loadrun_retention: Duration::from_secs(86400),
        instance: None,
    };
    Sweep {
        cp,
        env,
        ns,
        ctx,
        fence,
    }
}

impl Sweep {
    fn jobs(&self) -> Api<LoadJob> {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    /// The LoadJob `name` (server-side apply) and its ledger job `key`, as the controller would
    /// have written it.
    async fn loadjob(&self, name: &str, key: &str) {
        self.jobs()
            .patch(
                name,
                &PatchParams::apply("orphan-sweep-test"),
                &Patch::Apply(json!({
                    "apiVersion": "loadcontrol.io/v1beta1",
                    "kind": "LoadJob",
                    "metadata": {"name": name},
                    "spec": {"jobKey": key},
                })),
            )
            .await
            .unwrap();
        self.ledger_job(name, key).await;
    }

    /// A ledger job owned by `LoadJob/<ns>/<name>`, whether that LoadJob exists or not.
    async fn ledger_job(&self, name: &str, key: &str) {
        let w = self
            .env
            .ledger
            .apply_job(
                &self.fence,
                key,
                false,
                &json!({}),
                &format!("LoadJob/{}/{name}", self.ns),
                None,
            )
            .await
            .unwrap();
        assert_eq!(w, ledger::JobWrite::Applied);
    }

    /// One pass, with a watch that shows nothing.
    async fn pass(&self) -> Swept {
        remove_orphans(&self.ctx, &self.fence, |_, _| false)
            .await
            .unwrap()
    }

    /// The jobKeys marked removed (`load_job.removed_at` set).
    async fn removed(&self) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT job_key FROM nifi_ops.load_job WHERE removed_at IS NOT NULL ORDER BY job_key",
        )
        .fetch_all(&mut self.env.conn().await)
        .await
        .unwrap()
    }

    async fn served(&self) -> bool {
        loadjob_kind_served(&self.ctx.client).await.unwrap().is_ok()
    }
}

/// With the LoadJob CRD deleted, every LoadJob answers 404; that says nothing about which exist,
/// so a pass removes nothing (it says why, in its outcome and `lca_orphan_sweep_undecided`). Once
/// the CRD is back and the LoadJobs re-applied, still nothing is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_removes_nothing_while_the_loadjob_kind_is_not_served() {
    let s = setup().await;
    for (name, key) in [("a", "JOB_A"), ("b", "JOB_B"), ("c", "JOB_C")] {
        s.loadjob(name, key).await;
    }
    assert_eq!(
        s.pass().await,
        Swept::Done {
            removed: 0,
            left: 0
        },
        "every LoadJob exists"
    );
    let crds = Api::<CustomResourceDefinition>::all(s.ctx.client.clone());
    crds.delete("loadjobs.loadcontrol.io", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the LoadJob CRD gone", Duration::from_secs(30), || async {
        crds.get_opt("loadjobs.loadcontrol.io")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    eventually(
        "the LoadJob kind no longer served",
        Duration::from_secs(30),
        || async { (!s.served().await).then_some(()) },
    )
    .await;
    let swept = s.pass().await;
    assert!(
        matches!(&swept, Swept::KindNotServed(why) if why.contains("loadcontrol.io/v1beta1")),
        "{swept:?}"
    );
    assert_eq!(s.removed().await, Vec::<String>::new(), "nothing removed");
    assert!(
        s.ctx
            .metrics
            .render()
            .contains("lca_orphan_sweep_undecided 1"),
        "{}",
        s.ctx.metrics.render()
    );
    // The CRD back, the LoadJobs re-applied (the CRD's deletion deleted them).
    s.cp.install_crds(&crds::all_crds_yaml()).await.unwrap();
    eventually(
        "the LoadJob kind served again",
        Duration::from_secs(30),
        || async { s.served().await.then_some(()) },
    )
    .await;
    for (name, key) in [("a", "JOB_A"), ("b", "JOB_B"), ("c", "JOB_C")] {
        s.loadjob(name, key).await;
    }
    assert_eq!(
        s.pass().await,
        Swept::Done {
            removed: 0,
            left: 0
        }
    );
    assert_eq!(
        s.removed().await,
        Vec::<String>::new(),
        "still nothing removed"
    );
    let metrics = s.ctx.metrics.render();
    assert!(
        metrics.contains("lca_orphan_sweep_undecided 0")
            && metrics.contains("lca_orphan_jobs_removed_total 0"),
        "{metrics}"
    );
}

/// With the kind served, the LoadJob deleted (its finalizer bypassed) is confirmed gone by its GET
/// and its job marked removed; the others, which the (empty) watch does not show either, stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_removes_the_job_of_a_deleted_loadjob_only() {
    let s = setup().await;
    for (name, key) in [("a", "JOB_A"), ("b", "JOB_B"), ("c", "JOB_C")] {
        s.loadjob(name, key).await;
    }
    s.jobs()
        .delete("b", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        s.pass().await,
        Swept::Done {
            removed: 1,
            left: 0
        }
    );
    assert_eq!(s.removed().await, vec!["JOB_B".to_string()]);
    assert!(
        s.ctx
            .metrics
            .render()
            .contains("lca_orphan_jobs_removed_total 1")
    );
    assert_eq!(
        s.pass().await,
        Swept::Done {
            removed: 0,
            left: 0
        },
        "a removed job is no candidate any more"
    );
}

/// More orphans than one pass removes: the first pass removes exactly the bound, the next the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_removes_at_most_the_bound() {
    let s = setup().await;
    let orphans = MAX_REMOVED_PER_PASS + 5;
    for i in 0..orphans {
        s.ledger_job(&format!("gone-{i:02}"), &format!("GONE_{i:02}"))
            .await;
    }
    s.loadjob("kept", "KEPT").await;
    // In jobKey order: the first MAX_REMOVED_PER_PASS GONE_* are looked up and removed; the other
    // five and KEPT are left for the next pass.
    assert_eq!(
        s.pass().await,
        Swept::Done {
            removed: MAX_REMOVED_PER_PASS,
            left: 6
        }
    );
    let removed = s.removed().await;
    assert_eq!(removed.len(), MAX_REMOVED_PER_PASS);
    assert_eq!(
        s.pass().await,
        Swept::Done {
            removed: 5,
            left: 0
        }
    );
    let removed = s.removed().await;
    assert_eq!(removed.len(), orphans);
    assert!(!removed.contains(&"KEPT".to_string()));
}

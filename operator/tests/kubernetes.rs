//! The operator against a real kube-apiserver + etcd (e2e/kubetest) and a real PostgreSQL, with
//! NiFi's side played over real HTTP against the api-server.
mod common;
use common::*;
use crds::{LoadJob, LoadRun};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use kubetest::ControlPlane;
use lcoperator::process::{KubeOptions, Operator};
use lcoperator::scope::WatchScope;
use serde_json::{Value, json};
use std::future::Future;
use std::time::{Duration, Instant};
use uuid::Uuid;

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
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

struct Cluster {
    cp: ControlPlane,
    ns: String,
    env: Env,
    api: String,
    http: reqwest::Client,
}

const NIFI: &str = "nifi-token";

async fn cluster() -> Cluster {
    cluster_with_crds(&crds::all_crds_yaml()).await
}

/// A cluster whose CRDs are `crds_yaml` (an earlier release's, say).
async fn cluster_with_crds(crds_yaml: &str) -> Cluster {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.install_crds(crds_yaml).await.unwrap();
    let ns = cp.create_namespace("lc").await.unwrap();
    let env = Env::start(|c| c.recovery.sweeper_interval = lcconfig::config::Dur::secs(3600)).await;
    let mut api_config = env.config.clone();
    api_config.auth.tokens = vec![lcconfig::config::TokenEntry {
        name: "nifi".into(),
        role: "nifi".into(),
        sha256: load_control_api::auth::sha256_hex(NIFI),
    }];
    api_config.logging.access_log = false;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(load_control_api::server::serve(
        api_config,
        env.ledger.clone(),
        listener,
        std::future::pending(),
    ));
    Cluster {
        cp,
        ns,
        env,
        api,
        http: reqwest::Client::new(),
    }
}

impl Cluster {
    fn apply(&self, yaml: &str) -> std::process::Output {
        kubectl_apply(&self.cp, &self.ns, yaml)
    }
}

/// `kubectl <args>` with `input` on standard input (no temporary files left behind).
fn kubectl_with_input(cp: &ControlPlane, args: &[&str], input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = cp
        .kubectl()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `kubectl <args>`, which must succeed; its standard output.
fn kubectl_ok(cp: &ControlPlane, args: &[&str]) -> String {
    let out = cp.kubectl().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `kubectl apply -f -` with the YAML on standard input.
fn kubectl_apply(cp: &ControlPlane, ns: &str, yaml: &str) -> std::process::Output {
    let out = kubectl_with_input(cp, &["apply", "-n", ns, "-f", "-"], yaml);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl Cluster {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.api))
            .bearer_auth(NIFI)
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    async fn operator(&self, identity: &str) -> Operator {
        self.operator_with_client(identity, self.cp.client().await.unwrap())
    }

    /// An operator of this cluster's namespace that reaches Kubernetes through `client`.
    fn operator_with_client(&self, identity: &str, client: kube::Client) -> Operator {
        Operator::start_kubernetes(
            &self.env.config,
            self.env.ledger.clone(),
            client,
            &self.ns,
            identity,
            KubeOptions {
                scope: WatchScope::Namespaces(vec![self.ns.clone()]),
                ..Default::default()
            },
        )
        .unwrap()
    }

    async fn job_row(&self, job_key: &str) -> Option<(bool, Value, String, bool)> {
        sqlx::query_as::<_, (bool, sqlx::types::Json<Value>, String, bool)>(
            "SELECT suspended, settings, source, removed_at IS NOT NULL FROM nifi_ops.load_job WHERE job_key = $1",
        )
        .bind(job_key)
        .fetch_optional(&mut self.env.conn().await)
        .await
        .unwrap()
        .map(|(a, b, c, d)| (a, b.0, c, d))
    }

    async fn condition(&self, name: &str, type_: &str) -> Option<(String, String)> {
        let job = Api::<LoadJob>::namespaced(self.cp.client().await.unwrap(), &self.ns)
            .get_opt(name)
            .await
            .ok()??;
        job.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status, c.reason))
    }

    async fn run_phase(&self, run: Uuid) -> Option<LoadRun> {
        let runs = Api::<LoadRun>::namespaced(self.cp.client().await.unwrap(), &self.ns)
            .list(&ListParams::default())
            .await
            .ok()?;
        runs.items
            .into_iter()
            .find(|r| r.spec.run_id == run.to_string())
    }

    async fn wait_phase(&self, run: Uuid, phase: &str) -> LoadRun {
        eventually(
            &format!("LoadRun phase {phase}"),
            Duration::from_secs(20),
            || async {
                self.run_phase(run)
                    .await
                    .filter(|r| r.status.as_ref().is_some_and(|s| s.phase == phase))
            },
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loadjobs_write_the_ledger_report_conditions_and_suspend_creates() {
    let c = cluster().await;
    let mut op = c.operator("op-a").await;
    op.wait_leading(Duration::from_secs(20))
        .await
        .expect("leads");
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: insp}\nspec:\n  jobKey: INSP\n  recovery: {mode: REISSUE, stale: 2h}\n  cleanup: {failedRetention: P30D}\n");
    let row = eventually("load_job row", Duration::from_secs(20), || {
        c.job_row("INSP")
    })
    .await;
    assert_eq!(
        row.1,
        json!({"recovery": {"mode": "REISSUE", "stale": "2h"}, "cleanup": {"failed_retention": "P30D"}})
    );
    // Reconciles are counted by controller and result, with their duration.
    let metrics = op.metrics.render();
    assert!(
        metrics.contains(r#"lca_reconcile_total{controller="loadjob",result="ok"}"#)
            && metrics.contains("lca_reconcile_seconds_bucket"),
        "{metrics}"
    );
    assert_eq!(
        (row.0, row.2.as_str(), row.3),
        (false, format!("LoadJob/{}/insp", c.ns).as_str(), false)
    );
    eventually("Ready=True", Duration::from_secs(20), || async {
        c.condition("insp", "Ready").await.filter(|r| r.0 == "True")
    })
    .await;

    // Invalid: stale below the extract query timeout. Reported, never applied.
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: bad}\nspec:\n  jobKey: BAD\n  recovery: {stale: 30m}\n");
    let (_, reason) = eventually("Ready=False", Duration::from_secs(20), || async {
        c.condition("bad", "Ready").await.filter(|r| r.0 == "False")
    })
    .await;
    assert_eq!(reason, "InvalidSpec");
    assert!(
        c.job_row("BAD").await.is_none(),
        "no ledger change for an invalid spec"
    );

    // The same jobKey from a second LoadJob: conflict, nothing written.
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: insp-copy}\nspec: {jobKey: INSP, suspend: true}\n");
    let (_, reason) = eventually("JobKeyConflict", Duration::from_secs(20), || async {
        c.condition("insp-copy", "Ready")
            .await
            .filter(|r| r.0 == "False")
    })
    .await;
    assert_eq!(reason, "JobKeyConflict");
    assert!(!c.job_row("INSP").await.unwrap().0);

    // Suspend: creates are refused with 409 JOB_SUSPENDED.
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: insp}\nspec:\n  jobKey: INSP\n  suspend: true\n");
    eventually("suspended row", Duration::from_secs(20), || async {
        c.job_row("INSP").await.filter(|r| r.0)
    })
    .await;
    let (status, body) = c.post("/v1/runs", json!({"jobKey": "INSP", "businessKey": "K", "hdfsRoot": "/d", "stageTablePrefix": "t"})).await;
    assert_eq!(
        (status, body["code"].as_str().unwrap()),
        (409, "JOB_SUSPENDED")
    );
    eventually("Suspended=True", Duration::from_secs(20), || async {
        c.condition("insp", "Suspended")
            .await
            .filter(|r| r.0 == "True")
    })
    .await;
    // The spec turned invalid: Ready=False, and no stale Suspended condition describes it.
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: insp}\nspec:\n  jobKey: INSP\n  suspend: true\n  recovery: {stale: 30m}\n");
    eventually(
        "Ready=False InvalidSpec",
        Duration::from_secs(20),
        || async {
            c.condition("insp", "Ready")
                .await
                .filter(|r| r.0 == "False" && r.1 == "InvalidSpec")
        },
    )
    .await;
    assert!(
        c.condition("insp", "Suspended").await.is_none(),
        "stale Suspended condition kept"
    );
    // kubectl shows Ready in `get lj` and lists both kinds under the category.
    let out =
        c.cp.kubectl()
            .args(["get", "loadcontrol", "-n", &c.ns])
            .output()
            .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("READY") && table.contains("loadjob.loadcontrol.io/insp"),
        "{table}"
    );

    // Deleting the LoadJob marks the row removed (kept for history).
    Api::<LoadJob>::namespaced(c.cp.client().await.unwrap(), &c.ns)
        .delete("insp", &DeleteParams::default())
        .await
        .unwrap();
    eventually("removed row", Duration::from_secs(20), || async {
        c.job_row("INSP").await.filter(|r| r.3)
    })
    .await;
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loadruns_follow_the_ledger_and_carry_operator_requests() {
    let c = cluster().await;
    let mut op = c.operator("op-a").await;
    op.wait_leading(Duration::from_secs(20))
        .await
        .expect("leads");
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: daily}\nspec: {jobKey: DAILY}\n");
    eventually("load_job row", Duration::from_secs(20), || {
        c.job_row("DAILY")
    })
    .await;

    let (_, created) = c.post("/v1/runs", json!({"jobKey": "DAILY", "businessKey": "2026-09-28", "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
    let run: Uuid = created["runId"].as_str().unwrap().parse().unwrap();
    let lr = c.wait_phase(run, "CREATED").await;
    assert_eq!(
        lr.metadata.name.as_deref().unwrap(),
        format!("daily-2026-09-28-{}", &run.simple().to_string()[..8])
    );
    assert_eq!(
        lr.metadata.owner_references.as_ref().unwrap()[0].kind,
        "LoadJob"
    );
    // Status is written by server-side apply under the operator's own field manager.
    let managers: Vec<(String, String)> = lr
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        managers.contains(&(
            lcoperator::kube_context::FIELD_MANAGER.to_string(),
            "Apply".to_string()
        )),
        "{managers:?}"
    );
    let manifest = json!({"snapshotScn": "42", "sourceCount": 5, "plannedPartitionCount": 1,
        "partitions": [{"partitionId": "0000", "lowerBound": "0", "upperBound": "9", "upperInclusive": true, "expectedRowCount": 5}]});
    c.post(&format!("/v1/runs/{run}/manifest"), manifest).await;
    c.wait_phase(run, "EXTRACTING").await;
    let token = Uuid::new_v4();
    c.post(
        &format!("/v1/runs/{run}/partitions/0000/claim"),
        json!({"claimToken": token, "workerNode": "n1"}),
    )
    .await;
    c.post(
        &format!("/v1/runs/{run}/partitions/0000/chunks"),
        json!({"claimToken": token, "chunkIndex": 0, "chunkCount": 1,
        "hdfsPath": format!("/data/DAILY/run_id={run}/p/0.parquet"), "recordCount": 5}),
    )
    .await;
    let lr = c.wait_phase(run, "EXTRACTED_VALIDATED").await;
    let st = lr.status.unwrap();
    assert_eq!(
        (
            st.partitions_summary.as_str(),
            st.counts.extracted,
            st.dispatches.pending
        ),
        ("1/1", 5, 1)
    );
    let (dispatch,): (Uuid,) =
        sqlx::query_as("SELECT dispatch_id FROM nifi_ops.load_dispatch WHERE run_id = $1")
            .bind(run)
            .fetch_one(&mut c.env.conn().await)
            .await
            .unwrap();
    c.post(
        &format!("/v1/runs/{run}/validation/start"),
        json!({"dispatchId": dispatch}),
    )
    .await;
    c.wait_phase(run, "STAGE_VALIDATING").await;
    c.post(&format!("/v1/runs/{run}/validations"), json!({"stage": "STAGING", "metrics": [{"metricName": "STAGE_COUNT", "actualValue": "5", "result": "PASS"}]})).await;
    c.post(&format!("/v1/runs/{run}/stage-validated"), json!({}))
        .await;
    c.wait_phase(run, "STAGING_VALIDATED").await;
    let publish = Uuid::new_v4();
    c.post(
        &format!("/v1/runs/{run}/publish/claim"),
        json!({"publishToken": publish}),
    )
    .await;
    c.wait_phase(run, "PUBLISHING").await;
    c.post(
        &format!("/v1/runs/{run}/publish/result"),
        json!({"publishToken": publish, "outcome": "PUBLISH_UNKNOWN", "message": "HS2 lost"}),
    )
    .await;
    let lr = c.wait_phase(run, "PUBLISH_UNKNOWN").await;
    let needs = lr
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "NeedsOperator")
        .unwrap()
        .clone();
    assert_eq!(
        (needs.status.as_str(), needs.reason.as_str()),
        ("True", "PublishUnknown")
    );
    let name = lr.metadata.name.clone().unwrap();
    let events = eventually("PublishUnknown Event", Duration::from_secs(20), || async {
        let out =
            c.cp.kubectl()
                .args(["get", "events", "-n", &c.ns, "-o", "json"])
                .output()
                .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "PublishUnknown")
            .then_some(v)
    })
    .await;
    assert!(
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["regarding"]["name"] == name.as_str()
                || e["involvedObject"]["name"] == name.as_str())
    );

    // The operator resolves it on the LoadRun, not over HTTP.
    let patch = r#"{"spec":{"resolution":{"outcome":"PUBLISHED","reason":"rows verified in the target table"}}}"#;
    let out =
        c.cp.kubectl()
            .args([
                "patch",
                "loadrun",
                &name,
                "-n",
                &c.ns,
                "--type=merge",
                "-p",
                patch,
            ])
            .output()
            .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.wait_phase(run, "PUBLISHED").await;
    let (details,): (Value,) = sqlx::query_as("SELECT details FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'PUBLISH_UNKNOWN_RESOLVED'")
        .bind(run)
        .fetch_one(&mut c.env.conn().await)
        .await
        .unwrap();
    assert_eq!(details["operator"], format!("kubernetes:{}/{name}", c.ns));
    c.post(&format!("/v1/runs/{run}/validations"), json!({"stage": "TARGET", "metrics": [{"metricName": "TARGET_COUNT", "actualValue": "5", "result": "PASS"}]})).await;
    c.post(&format!("/v1/runs/{run}/success"), json!({})).await;
    let lr = c.wait_phase(run, "SUCCESS").await;
    let succeeded = lr
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Succeeded")
        .unwrap();
    assert_eq!(succeeded.status, "True");

    // A second run, cancelled through spec.cancel.
    let (_, created) = c.post("/v1/runs", json!({"jobKey": "DAILY", "businessKey": "2026-09-29", "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
    let run2: Uuid = created["runId"].as_str().unwrap().parse().unwrap();
    let lr2 = c.wait_phase(run2, "CREATED").await;
    let out =
        c.cp.kubectl()
            .args([
                "patch",
                "loadrun",
                lr2.metadata.name.as_deref().unwrap(),
                "-n",
                &c.ns,
                "--type=merge",
                "-p",
                r#"{"spec":{"cancel":{"reason":"wrong business date"}}}"#,
            ])
            .output()
            .unwrap();
    assert!(out.status.success());
    let lr2 = c.wait_phase(run2, "CANCELLED").await;
    let conds = lr2.status.unwrap().conditions;
    assert_eq!(
        conds
            .iter()
            .find(|c| c.type_ == "Cancelled")
            .unwrap()
            .status,
        "True"
    );
    assert_eq!(
        conds.iter().find(|c| c.type_ == "Failed").unwrap().status,
        "False"
    );

    let table =
        c.cp.kubectl()
            .args(["get", "loadjobs,loadruns", "-n", &c.ns])
            .output()
            .unwrap();
    let text = String::from_utf8_lossy(&table.stdout).to_string();
    println!("$ kubectl get loadjobs,loadruns\n{text}");
    assert!(
        text.contains("SUCCESS") && text.contains("CANCELLED") && text.contains("1/1"),
        "{text}"
    );
    let header = text.lines().find(|l| l.contains("BUSINESSKEY")).unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        vec![
            "NAME",
            "JOB",
            "BUSINESSKEY",
            "PHASE",
            "PARTITIONS",
            "ROWS",
            "AGE"
        ]
    );
    op.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_operator_leads_and_a_killed_leader_is_replaced_and_fenced() {
    let c = cluster().await;
    let mut a = c.operator("op-a").await;
    let first = a
        .wait_leading(Duration::from_secs(20))
        .await
        .expect("a leads");
    let mut b = c.operator("op-b").await;
    assert!(
        b.wait_leading(Duration::from_secs(4)).await.is_none(),
        "exactly one leads"
    );
    let killed = Instant::now();
    a.kill();
    let second = b
        .wait_leading(Duration::from_secs(25))
        .await
        .expect("b takes over after the lease expires");
    let took = killed.elapsed();
    println!(
        "{{\"bench\":\"lease_takeover\",\"seconds\":{:.2}}}",
        took.as_secs_f64()
    );
    assert!(second.epoch > first.epoch);
    assert_eq!(second.holder, "op-b");
    b.stop().await.unwrap();
    // The old leader's writes are fenced: nothing written (the new leader is stopped, so any
    // change to this row could only come from the old epoch).
    let (run, _) = c.env.validated("K").await;
    assert!(matches!(
        c.env.ledger.lease_dispatches(&first, 10).await,
        Err(ledger::LedgerError::Fenced { .. })
    ));
    assert!(matches!(
        c.env.ledger.sweep(&first).await,
        Err(ledger::LedgerError::Fenced { .. })
    ));
    assert_eq!(
        c.env
            .scalar(
                "SELECT attempt_count::bigint FROM nifi_ops.load_dispatch WHERE run_id = $1",
                run
            )
            .await,
        0
    );
}

fn chart_dir() -> String {
    format!("{}/../charts/load-control", env!("CARGO_MANIFEST_DIR"))
}

fn render(cp: &ControlPlane, release: &str, ns: &str) -> String {
    template(cp.helm(), release, ns, &[])
}

/// The value of a container's environment variable `name` as rendered, if it is set.
fn env_value(container: &serde_yaml::Value, name: &str) -> Option<String> {
    container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].as_str().unwrap().to_string())
}

/// `helm template` of the chart with `--set` values; the rendered YAML.
/// `helm template` of the chart with one `--set` that the chart must refuse: helm's output.
fn template_refused(set: &str) -> std::process::Output {
    kubetest::helm_offline()
        .args([
            "template",
            "lc",
            &chart_dir(),
            "-f",
            &kubetest::required_values(),
        ])
        .args(["--set", set])
        .output()
        .unwrap()
}

/// `helm template` of the chart with `sets`, as YAML documents.
fn template_docs(sets: &[&str]) -> Vec<serde_yaml::Value> {
    release_template_docs("lc", sets)
}

fn release_template_docs(release: &str, sets: &[&str]) -> Vec<serde_yaml::Value> {
    template(kubetest::helm_offline(), release, "ns", sets)
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str(d).ok())
        .collect()
}

fn template(helm: std::process::Command, release: &str, ns: &str, sets: &[&str]) -> String {
    template_with(helm, release, ns, &[], sets)
}

/// [`template`] with more values files (`-f`) after the required values.
fn template_with(
    mut helm: std::process::Command,
    release: &str,
    ns: &str,
    files: &[&str],
    sets: &[&str],
) -> String {
    helm.args(["template", release, &chart_dir(), "--namespace", ns]);
    helm.args(["-f", &kubetest::required_values()]);
    for file in files {
        helm.args(["-f", file]);
    }
    for set in sets {
        helm.args(["--set", set]);
    }
    let out = helm.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// examples/values-cnpg-pooler.yaml: the pools through the Pooler, and what keeps session state
/// (the operator's LISTEN, the migration hook) straight to the cluster, each URL from its key of
/// the one Secret; the password as a file, for rotation.
#[test]
fn the_pooler_example_keeps_session_state_off_the_pooler() {
    let example = format!(
        "{}/../examples/values-cnpg-pooler.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let docs: Vec<serde_yaml::Value> =
        template_with(kubetest::helm_offline(), "lc", "ns", &[&example], &[])
            .split("\n---")
            .filter_map(|d| serde_yaml::from_str(d).ok())
            .collect();
    let secret_key = |env: &serde_yaml::Value, name: &str| -> Option<(String, String)> {
        let var = env.as_sequence()?.iter().find(|e| e["name"] == name)?;
        let key = &var["valueFrom"]["secretKeyRef"];
        Some((key["name"].as_str()?.into(), key["key"].as_str()?.into()))
    };
    let containers = docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]
        ["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .clone();
    let env_of = |name: &str| containers.iter().find(|c| c["name"] == name).unwrap()["env"].clone();
    let lc_db = |key: &str| Some(("lc-db".to_string(), key.to_string()));
    for container in ["api-server", "operator"] {
        assert_eq!(
            secret_key(&env_of(container), "DATABASE_URL"),
            lc_db("DATABASE_URL"),
            "{container}: its pool through the Pooler"
        );
    }
    assert_eq!(
        secret_key(&env_of("operator"), "LCA_DATABASE__LISTEN_DSN"),
        lc_db("LISTEN_DSN"),
        "the operator LISTENs straight to the cluster"
    );
    let migrate = docs
        .iter()
        .find(|d| d["kind"] == "Job" && d["metadata"]["name"] == "lc-load-control-migrate")
        .unwrap();
    assert_eq!(
        secret_key(
            &migrate["spec"]["template"]["spec"]["containers"][0]["env"],
            "LCA_DATABASE__MIGRATION_URL"
        ),
        lc_db("MIGRATION_URL"),
        "the migration hook straight to the cluster"
    );
    for container in ["api-server", "operator"] {
        assert!(
            env_of(container)
                .as_sequence()
                .unwrap()
                .iter()
                .any(|e| e["name"] == "LCA_DATABASE__PASSWORD_FILE"),
            "{container}: the password as a file"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_charts_rbac_is_enough_for_the_operator_and_no_broader() {
    let c = cluster().await;
    let lint =
        c.cp.helm()
            .args(["lint", &chart_dir(), "-f", &kubetest::required_values()])
            .output()
            .unwrap();
    assert!(
        lint.status.success(),
        "{}",
        String::from_utf8_lossy(&lint.stdout)
    );
    // Apply only the chart's identity and RBAC objects, then run the operator as that identity.
    let rendered = render(&c.cp, "rel", &c.ns);
    let rbac: String = rendered
        .split("\n---")
        .filter(|d| {
            [
                "kind: ServiceAccount",
                "kind: ClusterRole",
                "kind: Role",
                "kind: RoleBinding",
                "kind: ClusterRoleBinding",
            ]
            .iter()
            .any(|k| d.contains(k))
        })
        .map(|d| format!("{d}\n---\n"))
        .collect();
    c.apply(&rbac);
    let sa =
        c.cp.service_account_client(&c.ns, "rel-load-control")
            .await
            .unwrap();
    let mut op = Operator::start_kubernetes(
        &c.env.config,
        c.env.ledger.clone(),
        sa.clone(),
        &c.ns,
        "as-sa",
        KubeOptions {
            // The chart's Lease rights name the release's own Lease.
            lease: lcoperator::lease::LeaseSettings {
                name: "rel-load-control-leader".into(),
                ..Default::default()
            },
            ..KubeOptions::default()
        },
    )
    .unwrap();
    op.wait_leading(Duration::from_secs(20))
        .await
        .expect("the chart's RBAC allows the Lease");
    let other = c.cp.create_namespace("jobs").await.unwrap();
    kubectl_apply(
        &c.cp,
        &other,
        "apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: rbac}\nspec: {jobKey: RBAC}\n",
    );
    eventually(
        "load_job row written as the service account",
        Duration::from_secs(20),
        || c.job_row("RBAC"),
    )
    .await;
    let jobs = Api::<LoadJob>::namespaced(c.cp.client().await.unwrap(), &other);
    eventually(
        "Ready=True patched as the service account",
        Duration::from_secs(20),
        || async {
            jobs.get("rbac")
                .await
                .ok()?
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")
        },
    )
    .await;
    let (_, created) = c.post("/v1/runs", json!({"jobKey": "RBAC", "businessKey": "K", "hdfsRoot": "/d", "stageTablePrefix": "t"})).await;
    let run = created["runId"].as_str().unwrap().to_string();
    let runs = Api::<LoadRun>::namespaced(c.cp.client().await.unwrap(), &other);
    eventually(
        "LoadRun created and its status written as the service account",
        Duration::from_secs(20),
        || async {
            runs.list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|r| r.spec.run_id == run && r.status.is_some())
        },
    )
    .await;
    op.stop().await.unwrap();
    // No broader than needed: deleting LoadJobs, reading Secrets, Leases elsewhere are refused.
    let forbidden =
        |r: Result<_, kube::Error>| matches!(r, Err(kube::Error::Api(e)) if e.code == 403);
    assert!(forbidden(
        Api::<LoadJob>::namespaced(sa.clone(), &other)
            .delete("rbac", &DeleteParams::default())
            .await
            .map(|_| ())
    ));
    assert!(forbidden(
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(sa.clone(), &c.ns)
            .list(&ListParams::default())
            .await
            .map(|_| ())
    ));
    assert!(forbidden(
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(sa.clone(), &other)
            .list(&ListParams::default())
            .await
            .map(|_| ())
    ));
    // The uninstall hook's rights are its own ServiceAccount's, not the operator's.
    assert!(forbidden(
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(sa.clone(), &c.ns)
            .get("rel-load-control")
            .await
            .map(|_| ())
    ));
    // Lease rights are the release's own Lease's: another Lease in the same namespace is refused.
    assert!(forbidden(
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(sa, &c.ns)
            .get("load-control-leader")
            .await
            .map(|_| ())
    ));
}

/// A rollback (an upgrade to an older chart) onto a ledger whose leader ran a schema that chart's
/// binaries do not support is refused when the chart renders: no hook runs, no revision is
/// recorded, the installed release stays as it was. Up to the chart's supported maximum it goes on.
#[tokio::test]
async fn an_upgrade_to_a_chart_older_than_the_ledger_is_refused_before_its_hooks() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.install_crds(&crds::all_crds_yaml()).await.unwrap();
    let ns = cp.create_namespace("older").await.unwrap();
    let helm = |verb: &str, extra: &[&str]| {
        let out = cp
            .helm()
            .args([verb, "lc", &chart_dir(), "--namespace", &ns])
            .args(["-f", &kubetest::required_values()])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, err) = helm("install", &["--no-hooks"]);
    assert!(ok, "{err}");
    let supported_max = *ledger::schema::SUPPORTED_SCHEMA.end();
    let mark = |version: i32| {
        kubectl_apply(
            &cp,
            &ns,
            &format!(
                "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: lc-load-control-leader\n  \
                 annotations:\n    {}: \"{version}\"\n    {}: load-control 9.9.9\nspec:\n  holderIdentity: elsewhere\n",
                lcoperator::lease::SCHEMA_ANNOTATION,
                lcoperator::lease::SCHEMA_WRITER_ANNOTATION
            ),
        );
    };
    // The newest schema this chart runs on: the upgrade goes on.
    mark(supported_max);
    let (ok, err) = helm("upgrade", &["--no-hooks"]);
    assert!(ok, "refused at the supported schema {supported_max}: {err}");
    // One above: refused with what to do, hooks included in the attempt.
    mark(supported_max + 1);
    let (ok, err) = helm("upgrade", &["--timeout", "30s"]);
    assert!(!ok, "an upgrade onto schema {} went on", supported_max + 1);
    assert!(
        err.contains(&format!(
            "the ledger is at schema version {} (its leader was load-control 9.9.9",
            supported_max + 1
        )) && err.contains("Nothing was changed"),
        "{err}"
    );
    let jobs = kubectl_ok(&cp, &["get", "jobs", "-n", &ns, "-o", "name"]);
    assert_eq!(jobs.trim(), "", "a hook ran");
    let history = cp
        .helm()
        .args(["history", "lc", "--namespace", &ns, "-o", "json"])
        .output()
        .unwrap();
    let history: Value = serde_json::from_slice(&history.stdout).unwrap();
    let revisions: Vec<(i64, String)> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["revision"].as_i64().unwrap(),
                r["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        revisions,
        vec![(1, "superseded".to_string()), (2, "deployed".to_string())],
        "a revision was recorded"
    );
}

#[tokio::test]
async fn helm_install_creates_every_object() {
    let cp = ControlPlane::start().await.expect("control plane");
    let all = crds::all_crds_yaml();
    cp.install_crds(&all).await.unwrap();
    let ns = cp.create_namespace("helm").await.unwrap();
    let rendered = render(&cp, "lc", &ns);
    assert!(
        rendered.contains("helm.sh/hook: pre-install,pre-upgrade"),
        "the migration runs as a hook"
    );
    assert!(
        rendered.contains("readOnlyRootFilesystem: true")
            && rendered.contains("runAsNonRoot: true")
    );
    // Memory per pod is bounded by default: requests in flight are limited.
    assert!(
        rendered.contains("limit_concurrency: 16"),
        "the chart limits requests in flight by default"
    );
    // Hook pods never match the Deployment's selector (the Service would route to them).
    let docs: Vec<serde_yaml::Value> = rendered
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str(d).ok())
        .collect();
    let kind = |k: &'static str| docs.iter().filter(move |d| d["kind"] == k);
    let selector = &kind("Deployment").next().unwrap()["spec"]["selector"]["matchLabels"];
    for job in kind("Job").chain(kind("Pod")) {
        let labels = job["spec"]["template"]["metadata"]["labels"]
            .as_mapping()
            .or(job["metadata"]["labels"].as_mapping())
            .unwrap();
        let matches = selector
            .as_mapping()
            .unwrap()
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v));
        assert!(
            !matches,
            "hook {:?} carries the Deployment's selector",
            job["metadata"]["name"]
        );
    }
    // A PDB only when more than one replica can keep serving.
    let single = cp
        .helm()
        .args(["template", "lc", &chart_dir(), "--set", "replicaCount=1"])
        .args(["-f", &kubetest::required_values()])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&single.stdout).contains("kind: PodDisruptionBudget"));
    // Values that would silently override each other are refused, naming both.
    let clash = cp
        .helm()
        .args([
            "template",
            "lc",
            &chart_dir(),
            "--set",
            "config.server.port=9999",
        ])
        .args(["-f", &kubetest::required_values()])
        .output()
        .unwrap();
    assert!(!clash.status.success());
    assert!(
        String::from_utf8_lossy(&clash.stderr)
            .contains("config.server.port must not be set: the chart sets it from api.port")
    );
    // Without the values that have no default, `helm install` is refused before anything is
    // created, naming what to set.
    let bare = cp
        .helm()
        .args([
            "install",
            "lc",
            &chart_dir(),
            "--namespace",
            &ns,
            "--no-hooks",
        ])
        .output()
        .unwrap();
    assert!(
        !bare.status.success(),
        "installed without its required values"
    );
    let said = String::from_utf8_lossy(&bare.stderr);
    assert!(said.contains("is required"), "{said}");
    let listed = cp
        .helm()
        .args(["list", "--namespace", &ns, "--all", "-q"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout).trim(),
        "",
        "a release was recorded"
    );
    // The real install, hooks included, runs on the real node (e2e/suite/tests/user_story.rs); the
    // API server alone has no node to run the hook's pod.
    let out = cp
        .helm()
        .args([
            "install",
            "lc",
            &chart_dir(),
            "--namespace",
            &ns,
            "--no-hooks",
            // The API server validates the optional NetworkPolicy too.
            "--set",
            "networkPolicy.enabled=true",
        ])
        .args(["-f", &kubetest::required_values()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cp
        .kubectl()
        .args([
            "get",
            "deploy,svc,sa,cm,pdb,role,rolebinding,networkpolicy",
            "-n",
            &ns,
            "-o",
            "name",
        ])
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&out.stdout).to_string();
    for obj in [
        "deployment.apps/lc-load-control",
        "service/lc-load-control",
        "serviceaccount/lc-load-control",
        "configmap/lc-load-control",
        "poddisruptionbudget.policy/lc-load-control",
        "role.rbac.authorization.k8s.io/lc-load-control-leader",
        "rolebinding.rbac.authorization.k8s.io/lc-load-control-leader",
        "networkpolicy.networking.k8s.io/lc-load-control",
    ] {
        assert!(
            names.lines().any(|l| l == obj),
            "{obj} missing from:\n{names}"
        );
    }
    // Cluster-scoped objects carry the namespace: a second release of the same name in another
    // namespace installs beside the first.
    let other = cp.create_namespace("helm2").await.unwrap();
    let out = cp
        .helm()
        .args([
            "install",
            "lc",
            &chart_dir(),
            "--namespace",
            &other,
            "--no-hooks",
        ])
        .args(["-f", &kubetest::required_values()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "a second release collided: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for n in [&ns, &other] {
        let cluster = cp
            .kubectl()
            .args([
                "get",
                &format!("clusterrole/load-control:{n}:lc-load-control"),
                &format!("clusterrolebinding/load-control:{n}:lc-load-control"),
                "-o",
                "name",
            ])
            .output()
            .unwrap();
        assert!(
            cluster.status.success(),
            "{}",
            String::from_utf8_lossy(&cluster.stderr)
        );
    }
    let deploy = cp
        .kubectl()
        .args(["get", "deploy/lc-load-control", "-n", &ns, "-o", "json"])
        .output()
        .unwrap();
    let d: Value = serde_json::from_slice(&deploy.stdout).unwrap();
    assert_eq!(d["spec"]["replicas"], 2);
    let containers: Vec<&str> = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(containers, vec!["api-server", "operator"]);
}

/// Issue 41 item 6: the hook Jobs and the test pod schedule where the release's pods may (a tainted
/// pool, a node selector, a priority class) and carry the pods' labels and annotations, with
/// `hooks.podAnnotations` over them (a mesh's sidecar switched off for Jobs only: Linkerd's
/// `linkerd.io/inject: disabled`).
#[test]
fn hooks_take_the_pods_scheduling_and_metadata() {
    let docs = template_docs(&[
        "tolerations[0].key=pool,tolerations[0].operator=Exists,tolerations[0].effect=NoSchedule",
        "nodeSelector.pool=batch",
        "priorityClassName=high",
        "podAnnotations.team=data",
        "podLabels.cost=etl",
        "hooks.podAnnotations.linkerd\\.io/inject=disabled",
    ]);
    let mut hooks = 0;
    for d in &docs {
        let (kind, name) = (d["kind"].as_str().unwrap_or(""), &d["metadata"]["name"]);
        let pod = match kind {
            "Job" | "Deployment" => &d["spec"]["template"],
            "Pod" => d,
            _ => continue,
        };
        let (meta, spec) = (&pod["metadata"], &pod["spec"]);
        assert_eq!(spec["tolerations"][0]["key"], "pool", "{kind} {name:?}");
        assert_eq!(spec["nodeSelector"]["pool"], "batch", "{kind} {name:?}");
        assert_eq!(spec["priorityClassName"], "high", "{kind} {name:?}");
        assert_eq!(meta["labels"]["cost"], "etl", "{kind} {name:?}");
        assert_eq!(meta["annotations"]["team"], "data", "{kind} {name:?}");
        let inject = &meta["annotations"]["linkerd.io/inject"];
        if kind == "Deployment" {
            assert!(
                inject.is_null(),
                "the hooks' annotation reached the Deployment"
            );
        } else {
            assert_eq!(inject, "disabled", "{kind} {name:?}");
            hooks += 1;
        }
    }
    assert_eq!(
        hooks, 3,
        "the migration Job, the uninstall Job and the test pod"
    );
}

/// Issue 27 item 1: the migration hook runs before install, upgrade and rollback. A rollback runs
/// the hooks of the revision it returns to, with that revision's image: the older `migrate` leaves
/// a newer schema it runs on as it is, and refuses (stopping the rollback before any pod changes)
/// one it does not run on.
#[test]
fn the_migration_hook_runs_before_install_upgrade_and_rollback() {
    let docs = template_docs(&[]);
    let job = docs
        .iter()
        .find(|d| {
            d["kind"] == "Job"
                && d["metadata"]["labels"]["app.kubernetes.io/component"] == "migration"
        })
        .expect("the migration Job");
    let hooks: Vec<&str> = job["metadata"]["annotations"]["helm.sh/hook"]
        .as_str()
        .unwrap()
        .split(',')
        .collect();
    assert_eq!(hooks, ["pre-install", "pre-upgrade", "pre-rollback"]);
    let command = &job["spec"]["template"]["spec"]["containers"][0]["command"];
    assert_eq!(
        command,
        &serde_yaml::to_value(["load-control-api", "migrate"]).unwrap()
    );
    // A failed rollback hook is kept for its log (the refusal names both schema versions).
    let delete = job["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
        .as_str()
        .unwrap();
    assert!(delete.split(',').all(|p| p != "hook-failed"), "{delete}");
}

/// Whether a label selector (`matchLabels`, `matchExpressions` with `In`) selects `labels`; a
/// Service's selector is a bare map of labels.
fn selects(selector: &serde_yaml::Value, labels: &serde_yaml::Value) -> bool {
    let (equal, expressions) = match selector.get("matchLabels") {
        Some(m) => (m.clone(), selector.get("matchExpressions").cloned()),
        None if selector.get("matchExpressions").is_some() => (
            serde_yaml::Value::Mapping(Default::default()),
            selector.get("matchExpressions").cloned(),
        ),
        None => (selector.clone(), None),
    };
    let equal_ok = equal
        .as_mapping()
        .unwrap()
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_ok = expressions
        .and_then(|e| e.as_sequence().cloned())
        .unwrap_or_default()
        .iter()
        .all(|e| {
            assert_eq!(e["operator"], "In", "{e:?}");
            labels
                .get(&e["key"])
                .is_some_and(|v| e["values"].as_sequence().unwrap().contains(v))
        });
    equal_ok && expressions_ok
}

/// Issue 41 item 1: `topology: split` renders the API and the operator as two Deployments. The
/// API's pods run the api-server alone, with no service-account token (none mounted, none
/// projected) and their replicas left to the autoscaler when it is on; the operator's run the
/// operator alone, with the token and the release's Lease. The Service and the API's PDB select
/// the API's pods only, the operator's PDB its own pods only, the PodMonitor and the NetworkPolicy
/// both; the Service has no operator port. The sidecar topology stays the default (one Deployment,
/// both containers) and refuses the autoscaler. Seen failing with the operator's pods and selector
/// given the API's component label (the two Deployments then select each other's pods).
#[test]
fn the_split_topology_renders_the_api_and_the_operator_apart() {
    let docs = template_docs(&[
        "topology=split",
        "api.autoscaling.enabled=true",
        "serviceMonitor.enabled=true",
        "networkPolicy.enabled=true",
    ]);
    let named = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .clone()
    };
    let api = named("Deployment", "lc-load-control");
    let operator = named("Deployment", "lc-load-control-operator");
    let pod = |d: &serde_yaml::Value| d["spec"]["template"].clone();
    let names = |d: &serde_yaml::Value, list: &str| -> Vec<String> {
        d["spec"]["template"]["spec"][list]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&api, "containers"), ["api-server"]);
    assert_eq!(names(&operator, "containers"), ["operator"]);
    assert!(
        api["spec"]["replicas"].is_null(),
        "the autoscaler owns the API's replicas"
    );
    assert_eq!(operator["spec"]["replicas"], 2);
    assert_eq!(pod(&api)["spec"]["automountServiceAccountToken"], false);
    assert!(!names(&api, "volumes").contains(&"kube-api-access".to_string()));
    assert!(names(&operator, "volumes").contains(&"kube-api-access".to_string()));
    let lease = pod(&operator)["spec"]["containers"][0]["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "LC_LEASE_NAME")
        .map(|e| e["value"].clone());
    assert_eq!(lease, Some("lc-load-control-leader".into()));
    let (api_labels, operator_labels) = (
        pod(&api)["metadata"]["labels"].clone(),
        pod(&operator)["metadata"]["labels"].clone(),
    );
    for (deployment, labels) in [(&api, &api_labels), (&operator, &operator_labels)] {
        assert!(selects(&deployment["spec"]["selector"], labels));
    }
    assert!(!selects(&api["spec"]["selector"], &operator_labels));
    assert!(!selects(&operator["spec"]["selector"], &api_labels));
    let service = named("Service", "lc-load-control");
    assert!(selects(&service["spec"]["selector"], &api_labels));
    assert!(!selects(&service["spec"]["selector"], &operator_labels));
    let ports: Vec<_> = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| p["name"].clone())
        .collect();
    assert_eq!(ports, ["http"]);
    let api_pdb = named("PodDisruptionBudget", "lc-load-control");
    assert!(selects(&api_pdb["spec"]["selector"], &api_labels));
    assert!(!selects(&api_pdb["spec"]["selector"], &operator_labels));
    let operator_pdb = named("PodDisruptionBudget", "lc-load-control-operator");
    assert!(selects(&operator_pdb["spec"]["selector"], &operator_labels));
    assert!(!selects(&operator_pdb["spec"]["selector"], &api_labels));
    for (kind, name, path) in [
        ("PodMonitor", "lc-load-control-operator", "selector"),
        ("NetworkPolicy", "lc-load-control", "podSelector"),
    ] {
        let selector = named(kind, name)["spec"][path].clone();
        assert!(selects(&selector, &operator_labels), "{kind}");
        assert!(selects(&selector, &api_labels), "{kind}");
    }
    // The uninstall hook stops the pods that run the operator (else the LoadJob controller
    // would put the finalizers back), and may scale that Deployment only.
    let hook = named("Job", "lc-load-control-release-finalizers");
    let command = &hook["spec"]["template"]["spec"]["containers"][0]["command"];
    assert_eq!(command[3], "lc-load-control-operator", "{command:?}");
    let hook_role = named("Role", "lc-load-control-uninstall");
    assert_eq!(
        hook_role["rules"][0]["resourceNames"][0],
        "lc-load-control-operator"
    );
    // `helm test` reads the API's metrics through the Service, which has no operator port here.
    let test_pod = docs
        .iter()
        .find(|d| d["kind"] == "Pod" && d["metadata"]["annotations"]["helm.sh/hook"] == "test")
        .unwrap();
    let command = serde_yaml::to_string(&test_pod["spec"]["containers"][0]["command"]).unwrap();
    assert_eq!(command.matches("--metrics").count(), 1, "{command}");
    let hpa = named("HorizontalPodAutoscaler", "lc-load-control");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "lc-load-control");
    assert_eq!(
        (&hpa["spec"]["minReplicas"], &hpa["spec"]["maxReplicas"]),
        (&2.into(), &6.into())
    );

    // The default: one Deployment, both containers, no autoscaler.
    let sidecar = template_docs(&[]);
    let deployments: Vec<_> = sidecar
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .collect();
    assert_eq!(deployments.len(), 1);
    assert_eq!(
        names(deployments[0], "containers"),
        ["api-server", "operator"]
    );
    assert!(
        !sidecar
            .iter()
            .any(|d| d["kind"] == "HorizontalPodAutoscaler")
    );
    let refused = template_refused("api.autoscaling.enabled=true");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("needs topology: split"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

/// The rendered chart keeps NiFi's API independent of the operator and is scrapable: only the
/// api-server's readiness decides whether a pod takes traffic; the ServiceMonitor selects the
/// chart's Service (with the extra labels a Prometheus looks for); the PDB never blocks a drain
/// during an outage; the Lease is the release's own, named in its RBAC and passed to the operator.
#[test]
fn the_chart_isolates_the_operator_and_scrapes_what_it_labels() {
    let docs = template_docs(&[
        "serviceMonitor.enabled=true",
        "serviceMonitor.labels.release=kube-prometheus-stack",
    ]);
    let one = |k: &str| docs.iter().find(|d| d["kind"] == k).unwrap();
    let containers = one("Deployment")["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .clone();
    let container = |n: &str| containers.iter().find(|c| c["name"] == n).unwrap().clone();
    assert!(
        container("operator")["readinessProbe"].is_null(),
        "the operator must not decide the pod's readiness"
    );
    assert_eq!(
        container("operator")["livenessProbe"]["httpGet"]["path"],
        "/healthz"
    );
    assert_eq!(
        container("api-server")["readinessProbe"]["httpGet"]["path"],
        "/readyz"
    );
    let env = |n: &str| {
        container("operator")["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"] == n)
            .map(|e| e["value"].as_str().unwrap().to_string())
    };
    assert_eq!(
        env("LC_LEASE_NAME").as_deref(),
        Some("lc-load-control-leader")
    );
    assert_eq!(env("LC_RENEW_DEADLINE").as_deref(), Some("10s"));
    let sm = one("ServiceMonitor");
    assert_eq!(sm["metadata"]["labels"]["release"], "kube-prometheus-stack");
    let service_labels = one("Service")["metadata"]["labels"]
        .as_mapping()
        .unwrap()
        .clone();
    let selector = sm["spec"]["selector"]["matchLabels"].as_mapping().unwrap();
    assert!(
        selector
            .iter()
            .all(|(k, v)| service_labels.get(k) == Some(v)),
        "the ServiceMonitor's selector {selector:?} does not select the Service {service_labels:?}"
    );
    assert_eq!(
        one("PodDisruptionBudget")["spec"]["unhealthyPodEvictionPolicy"],
        "AlwaysAllow"
    );
    let leader_role = docs
        .iter()
        .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "lc-load-control-leader")
        .unwrap();
    let lease_rules: Vec<_> = leader_role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter(|r| r["resources"][0] == "leases")
        .collect();
    for rule in &lease_rules {
        let verbs = rule["verbs"].as_sequence().unwrap();
        if verbs.iter().any(|v| v != "create") {
            assert_eq!(
                rule["resourceNames"][0], "lc-load-control-leader",
                "Lease rights beyond create are scoped by name"
            );
        }
    }
    // Scheduling: replicas spread over nodes by default; pod labels, annotations and priority
    // settable; an optional NetworkPolicy for the pods of this release.
    let pod = &one("Deployment")["spec"]["template"];
    assert_eq!(
        pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            [0]["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert!(
        docs.iter().all(|d| d["kind"] != "NetworkPolicy"),
        "off by default"
    );
    let helm = kubetest::helm_offline();
    let tuned = template(
        helm,
        "lc",
        "ns",
        &[
            "networkPolicy.enabled=true",
            "podLabels.team=data",
            "podAnnotations.owner=platform",
            "priorityClassName=critical",
            "terminationGracePeriodSeconds=60",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        ],
    );
    let tuned: Vec<serde_yaml::Value> = tuned
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str(d).ok())
        .collect();
    let deployment = tuned.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let t = &deployment["spec"]["template"];
    assert_eq!(t["metadata"]["labels"]["team"], "data");
    assert_eq!(t["metadata"]["annotations"]["owner"], "platform");
    assert_eq!(t["spec"]["priorityClassName"], "critical");
    assert_eq!(t["spec"]["terminationGracePeriodSeconds"], 60);
    assert!(
        t["spec"]["affinity"]["podAntiAffinity"].is_null(),
        "a given affinity replaces the default"
    );
    let np = tuned.iter().find(|d| d["kind"] == "NetworkPolicy").unwrap();
    assert!(selects(
        &np["spec"]["podSelector"],
        &deployment["spec"]["template"]["metadata"]["labels"]
    ));
    let egress_ports: Vec<i64> = np["spec"]["egress"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r["ports"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|p| p["port"].as_i64().unwrap())
        })
        .collect();
    for port in [53, 5432, 443, 9443] {
        assert!(
            egress_ports.contains(&port),
            "egress to {port}: {egress_ports:?}"
        );
    }
    // Timings that would let a candidate take over while the leader still acts are refused by
    // the binary (the chart passes them through).
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_load-control-operator"))
        .args(["--lease-duration", "15s", "--renew-deadline", "14s"])
        .env("LCA_CONFIG", "/dev/null")
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("shorter than the lease duration"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// Credentials come from Secrets, each into the one container that needs it, and never through
/// the ConfigMap: rendered with every credential set, the ConfigMap holds none, and a signing
/// secret written into `config` is refused.
#[test]
fn the_chart_takes_credentials_from_secrets_only() {
    let docs = template_docs(&[
        "secrets.signingSecret.existingSecret=lc-signing",
        "secrets.apiTls.existingSecret=lc-api-tls",
        "secrets.apiTls.clientCaKey=client-ca.crt",
        "secrets.nifiTls.existingSecret=lc-nifi-tls",
        "tests.tokenSecret.existingSecret=lc-test-token",
        "database.listenDsnSecret.name=lc-listen",
        "database.listenDsnSecret.key=dsn",
        "database.migrationUrlKey=MIGRATION_URL",
    ]);
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "lc-load-control")
        .unwrap();
    let config = cm["data"]["config.yaml"].as_str().unwrap();
    for word in [
        "signing",
        "ssl_",
        "client_cert",
        "client_key",
        "ca_bundle",
        "tokens",
        "sha256",
        "listen_dsn",
        "migration_url",
    ] {
        assert!(
            !config.contains(word),
            "the ConfigMap holds {word}:\n{config}"
        );
    }
    let containers = docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]
        ["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .clone();
    let env_of = |name: &str| -> Vec<String> {
        containers.iter().find(|c| c["name"] == name).unwrap()["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (api, op) = (env_of("api-server"), env_of("operator"));
    assert!(
        op.contains(&"LCA_NIFI__SIGNING_SECRET".into())
            && !api.contains(&"LCA_NIFI__SIGNING_SECRET".into())
    );
    // The API's key goes to both: the operator serves its metrics with the API's certificate
    // (worker.metrics_tls), and to no one without secrets.apiTls.
    assert!(
        api.contains(&"LCA_SERVER__SSL_KEYFILE".into())
            && op.contains(&"LCA_SERVER__SSL_KEYFILE".into())
    );
    assert!(
        op.contains(&"LCA_NIFI__CLIENT_KEY".into())
            && !api.contains(&"LCA_NIFI__CLIENT_KEY".into())
    );
    // The API's tokens go to the api-server alone (the operator checks none), as a file of the
    // mounted Secret that the api-server reads again (an environment variable is never updated);
    // the LISTEN DSN to the operator alone (its dispatcher LISTENs), each from its Secret.
    assert!(
        api.contains(&"LCA_AUTH__TOKENS_FILE".into())
            && !op.iter().any(|v| v.starts_with("LCA_AUTH__")),
        "api-server {api:?}, operator {op:?}"
    );
    let mounts_of = |name: &str| -> Vec<serde_yaml::Value> {
        containers.iter().find(|c| c["name"] == name).unwrap()["volumeMounts"]
            .as_sequence()
            .unwrap()
            .clone()
    };
    let tokens_mount = mounts_of("api-server")
        .into_iter()
        .find(|m| m["name"] == "api-tokens")
        .expect("the tokens Secret mounted into the api-server");
    // The tokens are the api-server's alone; the API's certificate is both processes' (the
    // operator serves its metrics with it, worker.metrics_tls).
    assert!(
        !mounts_of("operator")
            .iter()
            .any(|m| m["name"] == "api-tokens"),
        "the operator mounts the API's tokens"
    );
    assert!(
        mounts_of("operator").iter().any(|m| m["name"] == "api-tls"),
        "the operator serves its metrics with the API's certificate"
    );
    // Mounted as directories: a subPath mount is never updated when its Secret changes.
    for mount in mounts_of("api-server")
        .into_iter()
        .chain(mounts_of("operator"))
    {
        assert!(mount["subPath"].is_null(), "{mount:?}");
    }
    let pod_spec =
        &docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"];
    let tokens_volume = pod_spec["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "api-tokens")
        .unwrap();
    // The Secret examples/values-required.yaml names.
    assert_eq!(tokens_volume["secret"]["secretName"], "lc-tokens");
    let tokens_file = containers
        .iter()
        .find(|c| c["name"] == "api-server")
        .unwrap()["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "LCA_AUTH__TOKENS_FILE")
        .unwrap()["value"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        tokens_file,
        format!(
            "{}/{}",
            tokens_mount["mountPath"].as_str().unwrap(),
            tokens_volume["secret"]["items"][0]["path"]
                .as_str()
                .unwrap()
        )
    );
    assert_eq!(tokens_volume["secret"]["items"][0]["key"], "tokens.yaml");
    assert!(
        op.contains(&"LCA_DATABASE__LISTEN_DSN".into())
            && !api.contains(&"LCA_DATABASE__LISTEN_DSN".into())
    );
    let env_var = |container: &str, var: &str| -> serde_yaml::Value {
        containers.iter().find(|c| c["name"] == container).unwrap()["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"] == var)
            .unwrap()
            .clone()
    };
    let listen = env_var("operator", "LCA_DATABASE__LISTEN_DSN");
    assert_eq!(listen["valueFrom"]["secretKeyRef"]["name"], "lc-listen");
    assert_eq!(listen["valueFrom"]["secretKeyRef"]["key"], "dsn");
    let migrate = docs
        .iter()
        .find(|d| d["kind"] == "Job" && d["metadata"]["name"] == "lc-load-control-migrate")
        .unwrap();
    let migration_url = migrate["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "LCA_DATABASE__MIGRATION_URL")
        .unwrap();
    assert_eq!(
        migration_url["valueFrom"]["secretKeyRef"]["key"],
        "MIGRATION_URL"
    );
    // Without a listen key the operator LISTENs on DATABASE_URL: nothing rendered.
    let plain = template_docs(&[]);
    let plain_op = plain.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]
        ["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "operator")
        .unwrap()
        .clone();
    assert!(
        !serde_yaml::to_string(&plain_op)
            .unwrap()
            .contains("LISTEN_DSN")
    );
    let test_pod = docs
        .iter()
        .find(|d| d["kind"] == "Pod" && d["metadata"]["annotations"]["helm.sh/hook"] == "test")
        .unwrap();
    let command: Vec<&str> = test_pod["spec"]["containers"][0]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(command[2].starts_with("https://"), "{command:?}");
    let scraped: Vec<&str> = command
        .windows(2)
        .filter(|w| w[0] == "--metrics")
        .map(|w| w[1])
        .collect();
    assert_eq!(scraped.len(), 2, "both containers scraped: {command:?}");
    // The operator's port serves HTTPS too when the API's does (worker.metrics_tls).
    assert!(
        scraped.iter().all(|u| u.starts_with("https://")),
        "{scraped:?}"
    );
    assert_eq!(
        test_pod["spec"]["containers"][0]["env"][0]["name"],
        "LC_PROBE_TOKEN"
    );
    // A secret in the values' config is refused, naming where it belongs: the signing key, and
    // the database URLs that carry a password.
    for (set, owner) in [
        ("config.nifi.signing_secret=oops", "secrets.signingSecret"),
        (
            "config.database.listen_dsn=postgres://u:pw@db/x",
            "database.listenDsnSecret",
        ),
        (
            "config.database.migration_url=postgres://u:pw@db/x",
            "database.migrationUrlKey",
        ),
        (
            "config.auth.tokens_file=/tmp/tokens.yaml",
            "auth.existingSecret",
        ),
    ] {
        let refused = template_refused(set);
        assert!(!refused.status.success(), "{set}");
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains(owner),
            "{set}: {}",
            String::from_utf8_lossy(&refused.stderr)
        );
    }
}

/// §6.4 key rotation: `secrets.signingKeys` reaches the operator alone as
/// `LCA_NIFI__SIGNING_KEYS` from its Secret, never the ConfigMap; with the signing secret too, or
/// written into `config`, the install fails naming the value to use.
#[test]
fn the_signing_keys_come_from_their_secret_into_the_operator_only() {
    let docs = template_docs(&["secrets.signingKeys.existingSecret=lc-keys"]);
    let containers = docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]
        ["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .clone();
    let keys_env = |name: &str| -> Option<serde_yaml::Value> {
        containers.iter().find(|c| c["name"] == name).unwrap()["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "LCA_NIFI__SIGNING_KEYS")
            .cloned()
    };
    let op = keys_env("operator").expect("the operator gets the keys");
    assert_eq!(op["valueFrom"]["secretKeyRef"]["name"], "lc-keys");
    assert_eq!(op["valueFrom"]["secretKeyRef"]["key"], "signing-keys.yaml");
    assert!(
        keys_env("api-server").is_none(),
        "the api-server never signs"
    );
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "lc-load-control")
        .unwrap();
    assert!(
        !cm["data"]["config.yaml"]
            .as_str()
            .unwrap()
            .contains("signing")
    );
    for (set, says) in [
        (
            "secrets.signingSecret.existingSecret=lc-signing",
            "secrets.signingSecret and secrets.signingKeys must not both be set",
        ),
        ("config.nifi.signing_keys[0].id=a", "secrets.signingKeys"),
    ] {
        let refused = kubetest::helm_offline()
            .args([
                "template",
                "lc",
                &chart_dir(),
                "--set",
                "secrets.signingKeys.existingSecret=lc-keys",
                "--set",
                set,
            ])
            .args(["-f", &kubetest::required_values()])
            .output()
            .unwrap();
        assert!(!refused.status.success(), "{set}");
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains(says),
            "{set}: {}",
            String::from_utf8_lossy(&refused.stderr)
        );
    }
}

/// The operator's rights are what it calls and no more: it creates LoadRuns, patches their status
/// (server-side apply on `loadruns/status`) and deletes them past retention, but never patches a
/// LoadRun itself (its spec is the user's); LoadJobs are read, their finalizer (metadata) and
/// status patched. The same rules in cluster mode (ClusterRole) and namespace mode (Roles).
#[test]
fn the_operators_rules_are_the_verbs_it_uses() {
    let expected = [
        ("loadjobs", vec!["get", "list", "watch", "patch"]),
        ("loadjobs/status", vec!["patch"]),
        ("loadruns", vec!["get", "list", "watch", "create", "delete"]),
        ("loadruns/status", vec!["patch"]),
        ("events", vec!["create", "patch"]),
    ];
    let rules_of = |doc: &serde_yaml::Value| -> Vec<(String, Vec<String>)> {
        doc["rules"]
            .as_sequence()
            .unwrap()
            .iter()
            .flat_map(|r| {
                let verbs: Vec<String> = r["verbs"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
                    .collect();
                r["resources"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(move |res| (res.as_str().unwrap().to_string(), verbs.clone()))
            })
            .collect()
    };
    let want: Vec<(String, Vec<String>)> = expected
        .iter()
        .map(|(r, v)| (r.to_string(), v.iter().map(|s| s.to_string()).collect()))
        .collect();
    let cluster = template_docs(&[]);
    let role = cluster
        .iter()
        .find(|d| {
            d["kind"] == "ClusterRole" && d["metadata"]["name"] == "load-control:ns:lc-load-control"
        })
        .unwrap();
    assert_eq!(rules_of(role), want);
    let namespaced = template_docs(&["watchNamespaces={team-a,team-b}"]);
    let roles: Vec<_> = namespaced
        .iter()
        .filter(|d| d["kind"] == "Role" && d["metadata"]["name"] == "lc-load-control")
        .collect();
    assert_eq!(roles.len(), 2);
    for role in roles {
        assert_eq!(rules_of(role), want, "{:?}", role["metadata"]);
    }
    assert!(namespaced.iter().all(|d| d["kind"] != "ClusterRole"));
}

/// NiFi's PG-05 answers 404 under a path prefix and a 404 makes a dispatch DEAD at once: the
/// chart's default receiver URL has no path, and one with a path fails the render with the value
/// to use, unless `config.nifi.receiver_path_allowed` says a proxy strips it.
/// `config.*` is typed by the application's own schema (config/config.schema.json, spliced into
/// values.schema.json): a misspelt key, a value of the wrong type, a duration the binaries cannot
/// read and an unknown log level are refused by helm before anything is created, naming the key,
/// instead of installing and failing when a pod starts. The keys other values own keep the
/// template's refusal, which names the value to set instead.
#[test]
fn the_chart_checks_the_configuration_against_the_applications_schema() {
    for (set, named) in [
        ("config.recovery.stael=1h", "'stael' not allowed"),
        (
            "config.dispatch.max_attempts=many",
            "/config/dispatch/max_attempts",
        ),
        (
            "config.recovery.stale=ninety minutes",
            "/config/recovery/stale",
        ),
        ("config.logging.level=LOUD", "/config/logging/level"),
        (
            "config.cleanup.history_archive.path=/x",
            "/config/cleanup/history_archive",
        ),
    ] {
        let refused = template_refused(set);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{set} was accepted");
        assert!(
            stderr.contains("don't meet the specifications of the schema")
                && stderr.contains(named),
            "{set}: {stderr}"
        );
    }
    let owned = template_refused("config.nifi.signing_keys[0].id=a");
    assert!(String::from_utf8_lossy(&owned.stderr).contains(
        "config.nifi.signing_keys must not be set: the chart sets it from secrets.signingKeys"
    ));
    let docs = template_docs(&[
        "config.recovery.stale=2h",
        "config.recovery.extract_query_timeout=PT90M",
        "config.dispatch.max_attempts=30",
        "config.cleanup.history_archive.dir=/archive",
        "config.server.limit_concurrency=null",
    ]);
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "lc-load-control")
        .unwrap();
    let config: serde_yaml::Value =
        serde_yaml::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(config["recovery"]["stale"], "2h");
    assert_eq!(config["dispatch"]["max_attempts"], 30);
}

#[test]
fn the_chart_refuses_a_receiver_url_with_a_path() {
    let docs = template_docs(&[]);
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "lc-load-control")
        .unwrap();
    let config: serde_yaml::Value =
        serde_yaml::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
    let url = config["nifi"]["receiver_url"].as_str().unwrap();
    assert!(
        ledger::settings::receiver_url_problem(url, false).is_none(),
        "the default {url} is one the binaries accept"
    );
    let refused = template_refused("config.nifi.receiver_url=https://nifi.example:9443/lca");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("config.nifi.receiver_url=https://nifi.example:9443,")
            && stderr.contains("config.nifi.receiver_path_allowed=true"),
        "{stderr}"
    );
    for ok in [
        &["config.nifi.receiver_url=https://nifi.example:9443/"][..],
        &[
            "config.nifi.receiver_url=https://proxy.example/nifi-pg05",
            "config.nifi.receiver_path_allowed=true",
        ][..],
    ] {
        template_docs(ok);
    }
}

/// Issue 27 item 5: both containers of a release carry one installation identity, the operator's
/// own default (`<namespace>/<lease name>`), so the api-server's readiness and the operator's
/// claim on the ledger speak of the same release; two releases have two.
#[test]
fn the_chart_gives_both_containers_the_releases_installation() {
    let installation = |release: &str| {
        let docs = release_template_docs(release, &[]);
        let deployment = docs
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("a Deployment");
        let containers = deployment["spec"]["template"]["spec"]["containers"]
            .as_sequence()
            .unwrap();
        let values: Vec<(String, String, String)> = containers
            .iter()
            .map(|c| {
                let env = |name: &str| {
                    c["env"]
                        .as_sequence()
                        .unwrap()
                        .iter()
                        .find(|e| e["name"] == name)
                        .and_then(|e| e["value"].as_str())
                        .unwrap_or_default()
                        .to_string()
                };
                (
                    c["name"].as_str().unwrap().to_string(),
                    env("LC_INSTALLATION"),
                    env("LC_LEASE_NAME"),
                )
            })
            .collect();
        assert_eq!(values.len(), 2, "{values:?}");
        for (container, value, lease) in &values {
            assert_eq!(value, &format!("ns/{lease}"), "{container}");
        }
        values[0].1.clone()
    };
    assert_ne!(installation("one"), installation("two"));
}

/// A CloudNativePG ledger (issue 21 item 8): the URL from the cluster's `-app` Secret under its
/// `uri` key, `sslmode=verify-full` and the CA from the `-ca` Secret, in every container that
/// connects (api-server, operator, migration hook) and in no other. (That the binaries verify
/// with them is `e2e/suite/tests/database_tls.rs`.)
#[test]
fn the_chart_connects_to_a_managed_ledger_with_its_ca() {
    let docs = template_docs(&[
        "database.existingSecret=ledger-app",
        "database.urlKey=uri",
        "database.tls.sslMode=verify-full",
        "database.tls.caSecret=ledger-ca",
    ]);
    let pod_specs: Vec<&serde_yaml::Value> = docs
        .iter()
        .filter(|d| d["kind"] == "Deployment" || d["kind"] == "Job")
        .map(|d| &d["spec"]["template"]["spec"])
        .collect();
    let mut connecting = vec![];
    for spec in pod_specs {
        for c in spec["containers"].as_sequence().unwrap() {
            let env = c["env"].as_sequence().cloned().unwrap_or_default();
            let get = |n: &str| env.iter().find(|e| e["name"] == n).cloned();
            let Some(url) = get("DATABASE_URL") else {
                continue;
            };
            let name = c["name"].as_str().unwrap().to_string();
            assert_eq!(
                url["valueFrom"]["secretKeyRef"]["name"], "ledger-app",
                "{name}"
            );
            assert_eq!(url["valueFrom"]["secretKeyRef"]["key"], "uri", "{name}");
            assert_eq!(get("PGSSLMODE").unwrap()["value"], "verify-full", "{name}");
            let ca = get("PGSSLROOTCERT").unwrap()["value"]
                .as_str()
                .unwrap()
                .to_string();
            let mount = c["volumeMounts"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|m| m["name"] == "database-ca")
                .unwrap_or_else(|| panic!("{name} mounts the CA"));
            assert!(
                ca.starts_with(mount["mountPath"].as_str().unwrap()),
                "{name}: {ca}"
            );
            let volume = spec["volumes"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|v| v["name"] == "database-ca")
                .unwrap();
            assert_eq!(volume["secret"]["secretName"], "ledger-ca");
            assert_eq!(volume["secret"]["items"][0]["key"], "ca.crt");
            connecting.push(name);
        }
    }
    connecting.sort();
    assert_eq!(connecting, ["api-server", "migrate", "operator"]);
    // Without TLS values nothing of it is rendered.
    let plain = template(kubetest::helm_offline(), "lc", "ns", &[]);
    assert!(!plain.contains("PGSSLROOTCERT") && !plain.contains("database-ca"));
    // An sslmode libpq does not know fails the install.
    let refused = template_refused("database.tls.sslMode=verify");
    assert!(!refused.status.success());
}

/// NOTES' example LoadJob is one this release manages, for each combination of the values it
/// depends on: labelled when instanceSelector is on, applied in a watched namespace; its commands
/// name the release's Lease and the API's scheme.
#[test]
fn the_notes_example_is_right_for_every_combination() {
    for (instance, watch, tls) in [
        (false, false, false),
        (true, false, false),
        (false, true, true),
        (true, true, true),
    ] {
        let mut args = vec!["install", "lc", "--dry-run=client", "-n", "rel"];
        let chart = chart_dir();
        let required = kubetest::required_values();
        args.insert(2, &chart);
        args.extend(["-f", &required]);
        let sets = [
            (instance, "instanceSelector=true"),
            (watch, "watchNamespaces={team-a,team-b}"),
            (tls, "secrets.apiTls.existingSecret=api-tls"),
        ];
        for (on, set) in sets {
            if on {
                args.extend(["--set", set]);
            }
        }
        let out = kubetest::helm_offline().args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let notes = &text[text.find("NOTES:").unwrap()..];
        let yaml = notes
            .split("<<YAML\n")
            .nth(1)
            .unwrap()
            .split("\n     YAML")
            .next()
            .unwrap();
        let job: LoadJob = serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{e}: {yaml}"));
        assert_eq!(
            job.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("loadcontrol.io/instance"))
                .map(String::as_str),
            instance.then_some("lc"),
            "{notes}"
        );
        let ns = if watch { "team-a" } else { "rel" };
        assert!(
            notes.contains(&format!("kubectl -n {ns} apply -f -")),
            "{notes}"
        );
        assert!(
            notes.contains("get lease lc-load-control-leader"),
            "{notes}"
        );
        let scheme = if tls { "https://" } else { "http://" };
        assert!(
            notes.contains(&format!("Point NiFi at the API: {scheme}")),
            "{notes}"
        );
    }
}

/// A jobKey of 200 characters with a leading `_` makes no valid label value as it is; its run is
/// mirrored with a hashed label, and it never holds up the runs after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_awkward_job_key_is_mirrored_and_holds_up_no_other_run() {
    let c = cluster().await;
    let mut op = c.operator("op-a").await;
    op.wait_leading(Duration::from_secs(20))
        .await
        .expect("leads");
    let long = format!("_{}", "LONG_KEY".repeat(25))[..200].to_string();
    c.apply(&format!("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {{name: long}}\nspec: {{jobKey: {long}}}\n"));
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: plain}\nspec: {jobKey: PLAIN}\n");
    for key in [long.as_str(), "PLAIN"] {
        eventually("load_job row", Duration::from_secs(20), || c.job_row(key)).await;
    }
    let (_, first) = c.post("/v1/runs", json!({"jobKey": long, "businessKey": "b1", "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
    let (_, second) = c.post("/v1/runs", json!({"jobKey": "PLAIN", "businessKey": "b1", "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
    for created in [first, second] {
        let run: Uuid = created["runId"].as_str().unwrap().parse().unwrap();
        let lr = c.wait_phase(run, "CREATED").await;
        let label = &lr.metadata.labels.as_ref().unwrap()["loadcontrol.io/job-key"];
        assert!(
            label.len() <= 63 && label.starts_with(|ch: char| ch.is_ascii_alphanumeric()),
            "{label}"
        );
        assert_eq!(label, &crds::names::job_key_label(&lr.spec.job_key));
    }
}

/// A live holder whose clock lags writes renewTimes that already look expired. Expiry is judged
/// on the candidate's own clock from the record changing, so the candidate leaves the Lease alone
/// while the holder renews, and takes it once the renewals stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewing_holder_with_a_slow_clock_keeps_its_lease() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    let c = cluster().await;
    let leases: Api<Lease> = Api::namespaced(c.cp.client().await.unwrap(), &c.ns);
    let skewed = || LeaseSpec {
        holder_identity: Some("skewed-holder".into()),
        lease_duration_seconds: Some(15),
        renew_time: Some(MicroTime(Timestamp::now() - SignedDuration::from_secs(60))),
        ..Default::default()
    };
    leases
        .create(
            &Default::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some("load-control-leader".into()),
                    ..Default::default()
                },
                spec: Some(skewed()),
            },
        )
        .await
        .unwrap();
    let renewer = {
        let leases = leases.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                if let Ok(mut l) = leases.get("load-control-leader").await {
                    l.spec = Some(skewed());
                    let _ = leases
                        .replace("load-control-leader", &Default::default(), &l)
                        .await;
                }
            }
        })
    };
    let mut op = c.operator("candidate").await;
    assert!(
        op.wait_leading(Duration::from_secs(20)).await.is_none(),
        "a renewing holder keeps its Lease, however old its renewTime looks"
    );
    renewer.abort();
    let fence = op
        .wait_leading(Duration::from_secs(25))
        .await
        .expect("taken once the renewals stop");
    assert_eq!(fence.holder, "candidate");
    // Taking a Lease marks it with the ledger schema the leader runs on (the chart's refusal of a
    // rollback reads it).
    let schema_mark = |l: &Lease| {
        l.metadata.annotations.as_ref().and_then(|a| {
            a.get(lcoperator::lease::SCHEMA_ANNOTATION)
                .zip(a.get(lcoperator::lease::SCHEMA_WRITER_ANNOTATION))
                .map(|(v, by)| (v.clone(), by.clone()))
        })
    };
    let marked = Some((
        ledger::schema::SCHEMA_VERSION.to_string(),
        concat!("load-control ", env!("CARGO_PKG_VERSION")).to_string(),
    ));
    assert_eq!(
        schema_mark(&leases.get("load-control-leader").await.unwrap()),
        marked
    );

    // A Lease deleted under the leader means leadership is lost at the next renewal, not after
    // the renew deadline: the leader resigns and wins a fresh Lease with a new epoch.
    leases
        .delete("load-control-leader", &DeleteParams::default())
        .await
        .unwrap();
    let t = Instant::now();
    let next = eventually(
        "a new epoch after the Lease was deleted",
        Duration::from_secs(8),
        || async { op.fence.borrow().clone().filter(|f| f.epoch > fence.epoch) },
    )
    .await;
    assert_eq!(next.holder, "candidate");
    assert_eq!(
        schema_mark(&leases.get("load-control-leader").await.unwrap()),
        marked,
        "a Lease created by the leader carries the mark too"
    );
    println!(
        "{{\"bench\":\"lease_deleted_reacquire\",\"seconds\":{:.2}}}",
        t.elapsed().as_secs_f64()
    );
}

/// The shipped binary in Kubernetes mode does not exit when the CRDs are missing (in the chart's
/// pod that would take NiFi's API out of the Service): it says what to do, in its log and in
/// `/healthz` (still alive), shows `lca_kubernetes_access 0`, and recovers by itself once the CRDs
/// are installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_waits_for_missing_crds_and_recovers_by_itself() {
    let cp = ControlPlane::start().await.expect("control plane");
    let env = Env::start(|_| {}).await;
    let db = env.config.database.url.clone().unwrap();
    let port = testkit::free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_load-control-operator"))
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("LCA_CONFIG", "/dev/null")
        .env("DATABASE_URL", &db)
        .env("LCA_NIFI__RECEIVER_URL", "http://127.0.0.1:9")
        .env("LCA_WORKER__METRICS_PORT", port.to_string())
        .env("POD_NAMESPACE", "default")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    let health = || async {
        let r = http
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .ok()?;
        Some((r.status().as_u16(), r.json::<Value>().await.ok()?))
    };
    let (code, body) = eventually(
        "/healthz naming the missing CRD",
        Duration::from_secs(30),
        || async {
            health()
                .await
                .filter(|(_, b)| b["kubernetes"].as_str().is_some_and(|k| k != "ok"))
        },
    )
    .await;
    assert_eq!(
        code, 200,
        "waiting for a CRD is no reason to restart: {body}"
    );
    let problem = body["kubernetes"].as_str().unwrap();
    assert!(
        problem.contains("custom resource is not installed") && problem.contains("crds/"),
        "{problem}"
    );
    let metrics = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap();
    assert!(
        metrics.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
        "no Accept: the classic text format, as from client_golang"
    );
    assert!(
        metrics
            .text()
            .await
            .unwrap()
            .contains("lca_kubernetes_access 0")
    );
    // Installed later: the process notices without a restart.
    cp.install_crds(&crds::all_crds_yaml()).await.unwrap();
    eventually(
        "/healthz reporting Kubernetes access",
        Duration::from_secs(30),
        || async { health().await.filter(|(_, b)| b["kubernetes"] == "ok") },
    )
    .await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the operator is still running"
    );
    child.kill().await.unwrap();
}

/// A request the ledger refuses is not silently ignored: the LoadRun shows RequestRefused with the
/// ledger's code, and a Warning Event says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_request_shows_as_a_condition() {
    let c = cluster().await;
    let mut op = c.operator("op-a").await;
    op.wait_leading(Duration::from_secs(20))
        .await
        .expect("leads");
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: refused}\nspec: {jobKey: REFUSED}\n");
    eventually("load_job row", Duration::from_secs(20), || {
        c.job_row("REFUSED")
    })
    .await;
    let (_, created) = c
        .post(
            "/v1/runs",
            json!({"jobKey": "REFUSED", "businessKey": "b1", "hdfsRoot": "/data", "stageTablePrefix": "t_"}),
        )
        .await;
    let run: Uuid = created["runId"].as_str().unwrap().parse().unwrap();
    let lr = c.wait_phase(run, "CREATED").await;
    let name = lr.metadata.name.clone().unwrap();
    let api: Api<LoadRun> = Api::namespaced(c.cp.client().await.unwrap(), &c.ns);
    api.patch(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"resolution": {"outcome": "PUBLISHED", "reason": "not even published"}}})),
    )
    .await
    .unwrap();
    let refused = eventually("RequestRefused=True", Duration::from_secs(20), || async {
        let lr = api.get(&name).await.ok()?;
        lr.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "RequestRefused" && c.status == "True")
    })
    .await;
    assert_eq!(refused.reason, "RunStatusMismatch");
    assert!(
        refused.message.contains("RUN_STATUS_MISMATCH"),
        "{}",
        refused.message
    );
    // The status says which spec it has seen.
    let seen = api.get(&name).await.unwrap();
    assert_eq!(
        seen.status.as_ref().unwrap().observed_generation,
        seen.metadata.generation,
        "observedGeneration follows the spec carrying the request"
    );
    assert!(
        refused.message.contains("not PUBLISH_UNKNOWN"),
        "{}",
        refused.message
    );
}

/// LoadRuns of runs that ended longer ago than the retention are deleted (etcd does not grow
/// without limit); recent and active ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loadruns_past_retention_are_deleted() {
    let c = cluster().await;
    let api: Api<LoadRun> = Api::namespaced(c.cp.client().await.unwrap(), &c.ns);
    for (name, days_ago) in [
        ("old-run", Some(30)),
        ("recent-run", Some(1)),
        ("active-run", None),
    ] {
        let mut lr = LoadRun::new(
            name,
            crds::LoadRunSpec {
                job_key: "RET".into(),
                business_key: name.into(),
                run_id: Uuid::new_v4().to_string(),
                cancel: None,
                resolution: None,
            },
        );
        lr.metadata.namespace = Some(c.ns.clone());
        api.create(&Default::default(), &lr).await.unwrap();
        let completed = days_ago
            .map(|d| ledger::json::format_ts(&(chrono::Utc::now() - chrono::Duration::days(d))));
        api.patch_status(
            name,
            &Default::default(),
            &kube::api::Patch::Merge(json!({"status": {"phase": if completed.is_some() { "SUCCESS" } else { "EXTRACTING" }, "completedAt": completed}})),
        )
        .await
        .unwrap();
    }
    let mut op = c.operator("op-a").await;
    op.wait_leading(Duration::from_secs(20))
        .await
        .expect("leads");
    eventually("old-run deleted", Duration::from_secs(20), || async {
        api.get_opt("old-run").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(api.get_opt("recent-run").await.unwrap().is_some());
    assert!(api.get_opt("active-run").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_watching_one_namespace_never_touch_each_others_objects() {
    let c = cluster().await;
    // Installation b: its own ledger and its own Lease namespace, the same watched namespace.
    let other =
        Env::start(|cfg| cfg.recovery.sweeper_interval = lcconfig::config::Dur::secs(3600)).await;
    let lease_b = c.cp.create_namespace("lc-b").await.unwrap();
    let start = async |env: &Env, lease_ns: &str, instance: &str| {
        Operator::start_kubernetes(
            &env.config,
            env.ledger.clone(),
            c.cp.client().await.unwrap(),
            lease_ns,
            instance,
            KubeOptions {
                scope: WatchScope::Namespaces(vec![c.ns.clone()]),
                instance: Some(instance.into()),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let a = start(&c.env, &c.ns, "a").await;
    let b = start(&other, &lease_b, "b").await;
    let job = |name: &str, key: &str, instance: Option<&str>| {
        let labels = instance
            .map(|i| format!("\n  labels: {{loadcontrol.io/instance: {i}}}"))
            .unwrap_or_default();
        format!(
            "apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata:\n  name: {name}{labels}\nspec:\n  jobKey: {key}\n"
        )
    };
    c.apply(&job("ja", "JA", Some("a")));
    c.apply(&job("jb", "JB", Some("b")));
    c.apply(&job("jn", "JN", None));
    let row = async |env: &Env, key: &'static str| -> Option<String> {
        sqlx::query_scalar("SELECT source FROM nifi_ops.load_job WHERE job_key = $1")
            .bind(key)
            .fetch_optional(&mut env.conn().await)
            .await
            .unwrap()
    };
    let ns = c.ns.clone();
    assert_eq!(
        eventually("JA in a's ledger", Duration::from_secs(20), || row(
            &c.env, "JA"
        ))
        .await,
        format!("LoadJob/{ns}/ja")
    );
    assert_eq!(
        eventually("JB in b's ledger", Duration::from_secs(20), || row(
            &other, "JB"
        ))
        .await,
        format!("LoadJob/{ns}/jb")
    );
    for name in ["ja", "jb"] {
        c.wait_ready(name).await;
    }
    // A run of a's job becomes a LoadRun carrying a's label.
    let run = c.create_run("JA", "K").await;
    let lr = c.wait_phase(run, "CREATED").await;
    assert_eq!(
        lr.metadata
            .labels
            .unwrap_or_default()
            .get("loadcontrol.io/instance")
            .map(String::as_str),
        Some("a")
    );
    // Neither installation wrote the other's jobs (or the unlabelled one) into its ledger, and
    // each LoadJob carries one finalizer: its own installation's.
    for key in ["JB", "JN"] {
        assert_eq!(row(&c.env, key).await, None, "{key} in a's ledger");
    }
    for key in ["JA", "JN"] {
        assert_eq!(row(&other, key).await, None, "{key} in b's ledger");
    }
    let jobs = Api::<LoadJob>::namespaced(c.cp.client().await.unwrap(), &c.ns);
    for name in ["ja", "jb"] {
        let j = jobs.get(name).await.unwrap();
        assert_eq!(j.metadata.finalizers.unwrap_or_default().len(), 1, "{name}");
    }
    let jn = jobs.get("jn").await.unwrap();
    assert!(
        jn.status.is_none() && jn.metadata.finalizers.is_none(),
        "nobody's LoadJob is left alone"
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreadable_loadjob_is_reported_and_holds_up_no_other() {
    let c = cluster().await;
    // A LoadJob the operator cannot read: written while a looser CRD (older, or hand-edited)
    // was installed. The loose CRD accepts any spec.
    loosen_crd(&c.cp, "loadjobs");
    let op = c.operator("guard").await;
    let broken = "apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: broken}\nspec:\n  jobKey: 12345\n  recovery: {mode: [not, a, mode]}\n";
    // The API server takes the loose schema up a moment after the CRD update.
    apply_eventually(&c, "the loose CRD accepts it", broken).await;
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: fine}\nspec:\n  jobKey: FINE\n");
    eventually(
        "the readable LoadJob Ready",
        Duration::from_secs(20),
        || async {
            c.condition("fine", "Ready")
                .await
                .filter(|(s, _)| s == "True")
        },
    )
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(c.cp.client().await.unwrap(), &c.ns);
    let note = eventually(
        "an InvalidObject Event on the unreadable LoadJob",
        Duration::from_secs(20),
        || async {
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("InvalidObject")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("broken")
                })
                .and_then(|e| e.note)
        },
    )
    .await;
    assert!(note.contains("cannot be read"), "{note}");
    assert!(
        c.job_row("12345").await.is_none(),
        "nothing of it reached the ledger"
    );
    op.stop().await.unwrap();
}

/// Replaces the CRD whose name starts with `plural` by one that accepts any spec (as an older or
/// hand-edited CRD might have), so objects the operator cannot read can be written.
fn loosen_crd(cp: &ControlPlane, plural: &str) {
    let crd = crds::loosened_crd_json(plural);
    let out = kubectl_with_input(
        cp,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &serde_json::to_string(&crd).unwrap(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `kubectl apply` of `yaml`, retried until the API server accepts it (a CRD change takes a
/// moment to apply).
async fn apply_eventually(c: &Cluster, what: &str, yaml: &str) {
    eventually(what, Duration::from_secs(20), || async {
        kubectl_with_input(&c.cp, &["apply", "-n", &c.ns, "-f", "-"], yaml)
            .status
            .success()
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreadable_loadrun_holds_up_no_other_run() {
    let c = cluster().await;
    loosen_crd(&c.cp, "loadruns");
    apply_eventually(
        &c,
        "an unreadable LoadRun",
        "apiVersion: loadcontrol.io/v1alpha1\nkind: LoadRun\nmetadata: {name: broken}\nspec:\n  runId: [not, a, string]\n",
    )
    .await;
    let op = c.operator("guard-runs").await;
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: daily}\nspec:\n  jobKey: GUARDED\n");
    c.wait_ready("daily").await;
    let run = c.create_run("GUARDED", "K").await;
    // The mirror still watches and writes: the run's LoadRun appears with its phase.
    let lr = eventually("the run's LoadRun", Duration::from_secs(20), || async {
        let runs = Api::<kube::core::DeserializeGuard<LoadRun>>::namespaced(
            c.cp.client().await.unwrap(),
            &c.ns,
        )
        .list(&ListParams::default())
        .await
        .ok()?;
        runs.items.into_iter().find_map(|g| {
            g.0.ok().filter(|lr| {
                lr.spec.run_id == run.to_string()
                    && lr.status.as_ref().is_some_and(|s| s.phase == "CREATED")
            })
        })
    })
    .await;
    assert_eq!(lr.spec.job_key, "GUARDED");
    op.stop().await.unwrap();
}

impl Cluster {
    /// A run of `job_key` created over HTTP, as NiFi creates it; its id.
    async fn create_run(&self, job_key: &str, business_key: &str) -> Uuid {
        let (status, created) = self
            .post("/v1/runs", json!({"jobKey": job_key, "businessKey": business_key, "hdfsRoot": "/data", "stageTablePrefix": "t_"}))
            .await;
        assert_eq!(status, 200, "{created}");
        Uuid::parse_str(created["runId"].as_str().unwrap()).unwrap()
    }

    /// Waits until the LoadJob `name` is Ready.
    async fn wait_ready(&self, name: &str) {
        eventually(
            &format!("{name} Ready"),
            Duration::from_secs(20),
            || async {
                self.condition(name, "Ready")
                    .await
                    .filter(|(s, _)| s == "True")
            },
        )
        .await;
    }
}

/// The API server itself refuses a LoadRun status older than the stored one (the CRD's
/// transition rule on `ledgerVersion`), whoever writes it: a deposed or stalled leader whose
/// local checks passed a moment too long cannot move a LoadRun backwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_a_status_older_than_the_stored_one() {
    let cp = ControlPlane::start().await.expect("control plane");
    cp.install_crds(&crds::all_crds_yaml()).await.unwrap();
    let ns = cp.create_namespace("fence").await.unwrap();
    let runs = Api::<LoadRun>::namespaced(cp.client().await.unwrap(), &ns);
    let run_id = Uuid::new_v4().to_string();
    kubectl_apply(
        &cp,
        &ns,
        &format!(
            "apiVersion: loadcontrol.io/v1alpha1\nkind: LoadRun\nmetadata: {{name: r}}\nspec: {{jobKey: J, businessKey: K, runId: {run_id}}}\n"
        ),
    );
    let write = |version: i64, phase: &'static str| {
        let runs = runs.clone();
        async move {
            runs.patch_status(
                "r",
                &kube::api::PatchParams::apply("test").force(),
                &kube::api::Patch::Apply(json!({
                    "apiVersion": "loadcontrol.io/v1beta1", "kind": "LoadRun",
                    "metadata": {"name": "r"},
                    "status": {"phase": phase, "ledgerVersion": version},
                })),
            )
            .await
        }
    };
    write(5, "EXTRACTING").await.expect("a first status");
    match write(3, "CREATED").await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(
                e.message.contains("ledgerVersion never goes back"),
                "{}",
                e.message
            );
        }
        other => panic!("an older status was accepted: {other:?}"),
    }
    assert_eq!(
        runs.get("r").await.unwrap().status.unwrap().phase,
        "EXTRACTING"
    );
    write(5, "EXTRACTING")
        .await
        .expect("the same version again");
    write(9, "SUCCESS").await.expect("a newer status");
    assert_eq!(
        runs.get("r").await.unwrap().status.unwrap().ledger_version,
        9
    );
}

/// A LoadJob whose finalizer was bypassed (stripped by hand, then deleted) leaves its ledger
/// job owned; the mirror's resync marks it removed, so NiFi can no longer start runs for it and
/// a new LoadJob may take the jobKey. And with a retention shorter than the mirror's one-day
/// window, a run that ended before it never gets its LoadRun (re)created.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orphaned_jobs_are_removed_and_short_retention_recreates_nothing() {
    let c = cluster().await;
    let mut op = Operator::start_kubernetes(
        &c.env.config,
        c.env.ledger.clone(),
        c.cp.client().await.unwrap(),
        &c.ns,
        "orphans",
        KubeOptions {
            scope: WatchScope::Namespaces(vec![c.ns.clone()]),
            loadrun_retention: Duration::from_secs(2),
            ..Default::default()
        },
    )
    .unwrap();
    let fence = op
        .wait_leading(Duration::from_secs(20))
        .await
        .expect("leads");
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: short}\nspec:\n  jobKey: SHORT\n");
    c.wait_ready("short").await;
    // A run that ends at once: past the 2 s retention a moment later.
    let run = c.create_run("SHORT", "ENDED").await;
    let actor = ledger::Actor {
        name: "test".into(),
        role: "operator".into(),
    };
    c.env
        .ledger
        .cancel_run(run, "test", &actor, Some(&fence))
        .await
        .unwrap();
    let runs = Api::<LoadRun>::namespaced(c.cp.client().await.unwrap(), &c.ns);
    // Whatever the mirror did meanwhile, once retention has passed and a full pass has run (a
    // new LoadJob applied asks for one), no LoadRun of it exists and none comes back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: other}\nspec:\n  jobKey: OTHER\n");
    c.wait_ready("other").await;
    let present = || async {
        runs.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .any(|lr| lr.spec.run_id == run.to_string())
    };
    eventually(
        "no LoadRun of the ended run",
        Duration::from_secs(40),
        || async { (!present().await).then_some(()) },
    )
    .await;
    // The orphan: the finalizer stripped, the LoadJob deleted behind the controller's back.
    let jobs = Api::<LoadJob>::namespaced(c.cp.client().await.unwrap(), &c.ns);
    op.stop().await.unwrap();
    jobs.patch(
        "short",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    jobs.delete("short", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        c.job_row("SHORT").await.map(|r| r.3),
        Some(false),
        "still owned"
    );
    let op = c.operator("orphans-2").await;
    eventually(
        "the orphaned job marked removed",
        Duration::from_secs(60),
        || async { c.job_row("SHORT").await.filter(|r| r.3) },
    )
    .await;
    assert!(
        !present().await,
        "the ended run's LoadRun was not recreated"
    );
    assert_eq!(
        c.job_row("OTHER").await.map(|r| r.3),
        Some(false),
        "a LoadJob that exists keeps its job"
    );
    op.stop().await.unwrap();
}

/// Every long-lived task of the Kubernetes side is supervised: the LISTEN that wakes the mirror,
/// the mirror itself (whose watches end it when they die) and the access diagnosis are each ended
/// as a crash would end them, restarted, counted in `/healthz`, and the mirror still follows the
/// ledger afterwards (a run created after the crashes shows as a LoadRun).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crashed_kubernetes_tasks_are_restarted_and_the_mirror_follows_the_ledger() {
    let c = cluster().await;
    let mut op = c.operator("op-a").await;
    op.wait_leading(Duration::from_secs(20))
        .await
        .expect("leads");
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: sup}\nspec: {jobKey: SUP}\n");
    eventually("load_job row", Duration::from_secs(20), || c.job_row("SUP")).await;
    let tasks = ["loadrun_listen", "loadrun_mirror", "access_watch"];
    for task in tasks {
        // A supervised task may be between two runs for a moment; it is running most of the time.
        eventually(
            &format!("{task} crashed"),
            Duration::from_secs(10),
            || async { op.crash_task(task).then_some(()) },
        )
        .await;
    }
    for task in tasks {
        eventually(
            &format!("{task} restarted"),
            Duration::from_secs(20),
            || async {
                let (_, body) = op.health.report();
                (body["tasks"][task]["restarts"] == 1).then_some(())
            },
        )
        .await;
    }
    let (alive, body) = op.health.report();
    assert!(alive, "one restart each is no crash loop: {body}");
    let (_, created) = c.post("/v1/runs", json!({"jobKey": "SUP", "businessKey": "2026-10-01", "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
    let run: Uuid = created["runId"].as_str().unwrap().parse().unwrap();
    c.wait_phase(run, "CREATED").await;
    let metrics = op.metrics.render();
    for task in tasks {
        assert!(
            metrics.contains(&format!("lca_task_restarts_total{{task=\"{task}\"}} 1")),
            "{task}: {metrics}"
        );
    }
    op.stop().await.unwrap();
}

/// Kubernetes writes that hang (an API server stalled on LoadRuns and LoadJobs) hold up neither
/// the shutdown nor the Lease: the mirror gives its pass up at shutdown, the LoadJob controller
/// its reconciles after a short grace, and the Lease is released at once rather than after the
/// leader tasks' stop limit (15 s, as long as the Lease itself). The held writes are dropped
/// with the tasks' futures: none went through before the stop returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hung_kubernetes_writes_hold_up_neither_the_shutdown_nor_the_lease() {
    let c = cluster().await;
    let (client, stalls) =
        c.cp.client_stalling_writes(&["/loadruns", "/loadjobs"], Duration::from_secs(120))
            .await
            .unwrap();
    let mut op = c.operator_with_client("op-stalled", client);
    op.wait_leading(Duration::from_secs(20))
        .await
        .expect("leads");
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: hung}\nspec: {jobKey: HUNG}\n");
    eventually("load_job row", Duration::from_secs(20), || {
        c.job_row("HUNG")
    })
    .await;
    let jobs: Api<LoadJob> = Api::namespaced(c.cp.client().await.unwrap(), &c.ns);
    eventually("the LoadJob's status", Duration::from_secs(20), || async {
        jobs.get("hung").await.ok()?.status.map(|_| ())
    })
    .await;
    stalls.start();
    // A run to mirror (a LoadRun to create) and a LoadJob spec to reconcile (a status to write).
    let (status, created) = c.post("/v1/runs", json!({"jobKey": "HUNG", "businessKey": "2026-12-07", "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
    assert_eq!(status, 200, "{created}");
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: hung}\nspec: {jobKey: HUNG, description: changed}\n");
    eventually(
        "both kinds' writes held",
        Duration::from_secs(20),
        || async { (stalls.held("/loadruns") > 0 && stalls.held("/loadjobs") > 0).then_some(()) },
    )
    .await;
    let late = op.stop_naming_late().await.unwrap();
    assert!(
        late.is_empty(),
        "leader tasks that held up the shutdown: {late:?}"
    );
    let lease: k8s_openapi::api::coordination::v1::Lease =
        Api::namespaced(c.cp.client().await.unwrap(), &c.ns)
            .get(lcoperator::lease::LEASE_NAME)
            .await
            .unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "the Lease released"
    );
    let runs: Api<LoadRun> = Api::namespaced(c.cp.client().await.unwrap(), &c.ns);
    assert!(
        runs.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no held write went through"
    );
}

/// `helm template lc` in namespace `ns` with `sets`: its documents, or helm's refusal.
fn monitoring_render(release: &str, sets: &[&str]) -> Result<Vec<serde_yaml::Value>, String> {
    let mut helm = kubetest::helm_offline();
    helm.args(["template", release, &chart_dir(), "--namespace", "ns"]);
    helm.args(["-f", &kubetest::required_values()]);
    for set in sets {
        helm.args(["--set", set]);
    }
    let out = helm.output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8(out.stdout)
        .unwrap()
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str(d).ok())
        .collect())
}

/// The ServiceMonitor's endpoints, the PodMonitor's endpoints, and the Deployment's pod selector.
struct Monitors {
    api: Vec<serde_yaml::Value>,
    operator: Vec<serde_yaml::Value>,
    pod_monitor_selector: serde_yaml::Value,
    deployment_pod_labels: serde_yaml::Value,
}

fn monitors(release: &str, sets: &[&str]) -> Monitors {
    let mut all = vec!["serviceMonitor.enabled=true"];
    all.extend_from_slice(sets);
    let docs = monitoring_render(release, &all).unwrap_or_else(|e| panic!("{e}"));
    let one = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("no {k} rendered"))
            .clone()
    };
    let (sm, pm) = (one("ServiceMonitor"), one("PodMonitor"));
    Monitors {
        api: sm["spec"]["endpoints"].as_sequence().unwrap().clone(),
        operator: pm["spec"]["podMetricsEndpoints"]
            .as_sequence()
            .unwrap()
            .clone(),
        pod_monitor_selector: pm["spec"]["selector"].clone(),
        deployment_pod_labels: one("Deployment")["spec"]["template"]["metadata"]["labels"].clone(),
    }
}

/// The value a monitor endpoint's relabelings give `label` as a constant (action replace, no
/// source labels), if any.
fn static_label(endpoint: &serde_yaml::Value, label: &str) -> Option<String> {
    endpoint["relabelings"]
        .as_sequence()?
        .iter()
        .find(|r| {
            r["targetLabel"] == label
                && r["sourceLabels"].is_null()
                && (r["action"].is_null() || r["action"] == "replace")
        })
        .and_then(|r| r["replacement"].as_str().map(str::to_string))
}

/// The api-server's endpoint (port http) of the ServiceMonitor: exactly one.
fn api_endpoint(m: &Monitors) -> serde_yaml::Value {
    let http: Vec<_> = m.api.iter().filter(|e| e["port"] == "http").collect();
    assert_eq!(http.len(), 1, "{:?}", m.api);
    http[0].clone()
}

/// Each mode scrapes the operator on its own port (worker.metrics_port) in the API's TLS mode (the
/// same scheme and tlsConfig: worker.metrics_tls serves the API's certificate with its client
/// check), on this release's Deployment pods only, labelled with the release; and only once (the
/// ServiceMonitor does not scrape that port too, which would double every operator series).
fn assert_operator_scraped_once(m: &Monitors, release: &str) {
    assert_eq!(m.operator.len(), 1, "{:?}", m.operator);
    let e = &m.operator[0];
    assert_eq!(e["port"], "metrics");
    assert_eq!(e["path"], "/metrics");
    let api = api_endpoint(m);
    assert_eq!(
        e["scheme"], api["scheme"],
        "the operator in the API's TLS mode"
    );
    assert_eq!(
        e["tlsConfig"], api["tlsConfig"],
        "the operator in the API's TLS mode"
    );
    assert_eq!(static_label(e, "release").as_deref(), Some(release));
    assert!(selects(&m.pod_monitor_selector, &m.deployment_pod_labels));
    assert_eq!(
        m.pod_monitor_selector["matchLabels"]["app.kubernetes.io/instance"],
        release
    );
    // Not the hooks' pods (the migration Job's, the test pod's).
    let mut hook = m.deployment_pod_labels.clone();
    hook["app.kubernetes.io/component"] = "migration".into();
    assert!(!selects(&m.pod_monitor_selector, &hook));
    assert!(
        m.api.iter().all(|e| e["port"] != "metrics"),
        "the operator's port is the PodMonitor's: {:?}",
        m.api
    );
}

/// Plain mode (no secrets.apiTls): the API is scraped over HTTP, without tlsConfig.
#[test]
fn monitoring_scrapes_plain_http_without_api_tls() {
    let m = monitors("lc", &[]);
    let api = api_endpoint(&m);
    assert_eq!(api["scheme"], "http");
    assert_eq!(api["path"], "/metrics");
    assert!(api["tlsConfig"].is_null(), "{api:?}");
    assert_eq!(static_label(&api, "release").as_deref(), Some("lc"));
    assert_operator_scraped_once(&m, "lc");
}

/// API TLS: HTTPS, verified against the CA the user names (a Secret's or a ConfigMap's key) for
/// the name in the API's certificate (the Service's DNS name unless given); no verification only
/// when asked for explicitly; no client certificate unless given.
#[test]
fn monitoring_scrapes_https_with_the_named_ca_under_api_tls() {
    let tls = "secrets.apiTls.existingSecret=lc-api-tls";
    let m = monitors(
        "lc",
        &[
            tls,
            "serviceMonitor.tls.ca.secret=lc-api-tls",
            "serviceMonitor.tls.ca.key=ca.crt",
        ],
    );
    let api = api_endpoint(&m);
    assert_eq!(api["scheme"], "https");
    let t = &api["tlsConfig"];
    assert_eq!(t["serverName"], "lc-load-control.ns.svc");
    assert_eq!(t["ca"]["secret"]["name"], "lc-api-tls");
    assert_eq!(t["ca"]["secret"]["key"], "ca.crt");
    assert!(t["ca"]["configMap"].is_null());
    assert!(t["insecureSkipVerify"].is_null(), "{t:?}");
    assert!(t["cert"].is_null() && t["keySecret"].is_null(), "{t:?}");
    assert_eq!(static_label(&api, "release").as_deref(), Some("lc"));
    assert_operator_scraped_once(&m, "lc");

    let m = monitors(
        "lc",
        &[
            tls,
            "serviceMonitor.tls.ca.configMap=trust-bundle",
            "serviceMonitor.tls.ca.key=root.pem",
            "serviceMonitor.tls.serverName=api.load-control.example",
        ],
    );
    let t = &api_endpoint(&m)["tlsConfig"];
    assert_eq!(t["serverName"], "api.load-control.example");
    assert_eq!(t["ca"]["configMap"]["name"], "trust-bundle");
    assert_eq!(t["ca"]["configMap"]["key"], "root.pem");
    assert!(t["ca"]["secret"].is_null());

    let m = monitors("lc", &[tls, "serviceMonitor.tls.insecureSkipVerify=true"]);
    let api = api_endpoint(&m);
    assert_eq!(api["scheme"], "https");
    assert_eq!(api["tlsConfig"]["insecureSkipVerify"], true);
    assert!(api["tlsConfig"]["ca"].is_null());
}

/// Client certificates required: HTTPS with the CA and Prometheus' own certificate and key from
/// the Secret the user names (tlsConfig.cert, keySecret).
#[test]
fn monitoring_presents_the_named_client_certificate_under_mtls() {
    let m = monitors(
        "lc",
        &[
            "secrets.apiTls.existingSecret=lc-api-tls",
            "secrets.apiTls.clientCaKey=client-ca.crt",
            "secrets.apiTls.clientCertRequired=true",
            "serviceMonitor.tls.ca.secret=lc-api-tls",
            "serviceMonitor.tls.clientCert.secret=prometheus-lc-client",
        ],
    );
    let api = api_endpoint(&m);
    assert_eq!(api["scheme"], "https");
    let t = &api["tlsConfig"];
    assert_eq!(t["serverName"], "lc-load-control.ns.svc");
    assert_eq!(t["ca"]["secret"]["name"], "lc-api-tls");
    assert_eq!(t["ca"]["secret"]["key"], "ca.crt");
    assert_eq!(t["cert"]["secret"]["name"], "prometheus-lc-client");
    assert_eq!(t["cert"]["secret"]["key"], "tls.crt");
    assert_eq!(t["keySecret"]["name"], "prometheus-lc-client");
    assert_eq!(t["keySecret"]["key"], "tls.key");
    assert!(t["insecureSkipVerify"].is_null());
    assert_operator_scraped_once(&m, "lc");
}

/// Issue 41 item 2: with client certificates required the kubelet probes `/readyz` on the
/// plain-HTTP health port, which the api-server opens from `server.health_port`; in the other
/// modes the probes stay on the API's port and no health port is opened.
#[test]
fn under_mtls_the_probes_read_readyz_on_the_health_port() {
    let api = |sets: &[&str]| {
        let docs = monitoring_render("lc", sets).unwrap_or_else(|e| panic!("{e}"));
        let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        deployment["spec"]["template"]["spec"]["containers"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "api-server")
            .unwrap()
            .clone()
    };
    let mtls = api(&[
        "secrets.apiTls.existingSecret=lc-api-tls",
        "secrets.apiTls.clientCaKey=client-ca.crt",
        "secrets.apiTls.clientCertRequired=true",
        "api.healthPort=9091",
    ]);
    assert_eq!(
        env_value(&mtls, "LCA_SERVER__HEALTH_PORT").as_deref(),
        Some("9091")
    );
    let health = mtls["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "health")
        .expect("a health port");
    assert_eq!(health["containerPort"], 9091);
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(mtls[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(mtls[probe]["httpGet"]["port"], "health", "{probe}");
        assert!(
            mtls[probe]["httpGet"]["scheme"].is_null(),
            "{probe}: plain HTTP"
        );
    }
    for sets in [
        &[][..],
        &["secrets.apiTls.existingSecret=lc-api-tls"][..],
        &[
            "secrets.apiTls.existingSecret=lc-api-tls",
            "secrets.apiTls.clientCaKey=client-ca.crt",
        ][..],
    ] {
        let c = api(sets);
        assert_eq!(env_value(&c, "LCA_SERVER__HEALTH_PORT"), None, "{sets:?}");
        assert_eq!(c["readinessProbe"]["httpGet"]["port"], "http", "{sets:?}");
    }
}

/// Issue 41 item 4: in either topology the operator container serves its metrics in the API's TLS
/// mode: with secrets.apiTls it has the API's certificate mounted and in its configuration
/// (`worker.metrics_tls`), and its liveness probe follows (HTTPS on the metrics port; with client
/// certificates required, plain HTTP on a probes port of its own, `worker.health_port`, since the
/// kubelet has no client certificate). Without secrets.apiTls nothing of it is rendered.
#[test]
fn the_operator_serves_its_metrics_in_the_apis_tls_mode() {
    let tls = "secrets.apiTls.existingSecret=lc-api-tls";
    let ca = "secrets.apiTls.clientCaKey=client-ca.crt";
    let required = "secrets.apiTls.clientCertRequired=true";
    for topology in ["topology=sidecar", "topology=split"] {
        let operator = |sets: &[&str]| {
            let mut all = vec![topology, "operator.healthPort=9181"];
            all.extend_from_slice(sets);
            let docs = monitoring_render("lc", &all).unwrap_or_else(|e| panic!("{e}"));
            let (deployment, container) = docs
                .iter()
                .filter(|d| d["kind"] == "Deployment")
                .find_map(|d| {
                    let c = d["spec"]["template"]["spec"]["containers"]
                        .as_sequence()?
                        .iter()
                        .find(|c| c["name"] == "operator")?
                        .clone();
                    Some((d.clone(), c))
                })
                .expect("a Deployment with the operator container");
            let volumes: Vec<String> = deployment["spec"]["template"]["spec"]["volumes"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|v| v["name"].as_str().unwrap().to_string())
                .collect();
            (container, volumes)
        };
        let mounted = |c: &serde_yaml::Value| {
            c["volumeMounts"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|m| m["name"] == "api-tls")
                .map(|m| m["mountPath"].as_str().unwrap().to_string())
        };
        let port = |c: &serde_yaml::Value, name: &str| {
            c["ports"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .map(|p| p["containerPort"].as_i64().unwrap())
        };

        let (plain, volumes) = operator(&[]);
        assert_eq!(
            env_value(&plain, "LCA_WORKER__METRICS_TLS"),
            None,
            "{topology}"
        );
        assert_eq!(
            env_value(&plain, "LCA_SERVER__SSL_CERTFILE"),
            None,
            "{topology}"
        );
        assert_eq!(mounted(&plain), None, "{topology}");
        assert!(!volumes.contains(&"api-tls".to_string()), "{topology}");
        assert_eq!(plain["livenessProbe"]["httpGet"]["port"], "metrics");
        assert!(plain["livenessProbe"]["httpGet"]["scheme"].is_null());

        let (https, volumes) = operator(&[tls]);
        assert_eq!(
            env_value(&https, "LCA_WORKER__METRICS_TLS").as_deref(),
            Some("true"),
            "{topology}"
        );
        let (cert, key) = (
            env_value(&https, "LCA_SERVER__SSL_CERTFILE").expect("the certificate"),
            env_value(&https, "LCA_SERVER__SSL_KEYFILE").expect("the key"),
        );
        let dir = mounted(&https).expect("the API's certificate mounted");
        assert!(
            cert.starts_with(&format!("{dir}/")) && key.starts_with(&format!("{dir}/")),
            "{cert} {key} under {dir}"
        );
        assert_eq!(
            volumes.iter().filter(|v| *v == "api-tls").count(),
            1,
            "{topology}: one api-tls volume for the pod's containers: {volumes:?}"
        );
        assert_eq!(
            env_value(&https, "LCA_WORKER__HEALTH_PORT"),
            None,
            "{topology}"
        );
        assert_eq!(https["livenessProbe"]["httpGet"]["port"], "metrics");
        assert_eq!(
            https["livenessProbe"]["httpGet"]["scheme"], "HTTPS",
            "{topology}"
        );

        let (mtls, _) = operator(&[tls, ca, required]);
        assert_eq!(
            env_value(&mtls, "LCA_SERVER__SSL_CLIENT_CERT_REQUIRED").as_deref(),
            Some("true")
        );
        let bundle = env_value(&mtls, "LCA_SERVER__SSL_CA_CERTS").expect("the client CA");
        assert!(bundle.starts_with(&format!("{dir}/")), "{bundle}");
        assert_eq!(
            env_value(&mtls, "LCA_WORKER__HEALTH_PORT").as_deref(),
            Some("9181"),
            "{topology}"
        );
        assert_eq!(port(&mtls, "operator-health"), Some(9181), "{topology}");
        assert_eq!(mtls["livenessProbe"]["httpGet"]["port"], "operator-health");
        assert!(
            mtls["livenessProbe"]["httpGet"]["scheme"].is_null(),
            "plain HTTP"
        );
        let (optional, _) = operator(&[tls, ca]);
        assert_eq!(
            env_value(&optional, "LCA_WORKER__HEALTH_PORT"),
            None,
            "{topology}"
        );
        assert_eq!(port(&optional, "operator-health"), None, "{topology}");
        assert_eq!(
            optional["livenessProbe"]["httpGet"]["scheme"], "HTTPS",
            "{topology}"
        );
    }
    // The sidecar's containers share the pod's network: a port used twice refuses to render.
    let refused = template_refused("operator.metricsPort=8080");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains("api.port and operator.metricsPort are both 8080"),
        "{stderr}"
    );
}

/// A mode that needs a value the user did not give refuses to render, naming the value, instead of
/// a ServiceMonitor that can never scrape.
#[test]
fn monitoring_refuses_to_render_without_what_its_tls_mode_needs() {
    let tls = "secrets.apiTls.existingSecret=lc-api-tls";
    let cases: [(&[&str], &[&str]); 3] = [
        // HTTPS with no CA and no explicit insecureSkipVerify.
        (
            &[tls],
            &["serviceMonitor.tls.ca.secret", "insecureSkipVerify"],
        ),
        // Client certificates required, none for Prometheus.
        (
            &[
                tls,
                "secrets.apiTls.clientCaKey=client-ca.crt",
                "secrets.apiTls.clientCertRequired=true",
                "serviceMonitor.tls.ca.secret=lc-api-tls",
            ],
            &["serviceMonitor.tls.clientCert.secret"],
        ),
        // Two CAs: which one would be meant is unclear.
        (
            &[
                tls,
                "serviceMonitor.tls.ca.secret=lc-api-tls",
                "serviceMonitor.tls.ca.configMap=trust-bundle",
            ],
            &["serviceMonitor.tls.ca"],
        ),
    ];
    for (sets, named) in cases {
        let mut all = vec!["serviceMonitor.enabled=true"];
        all.extend_from_slice(sets);
        let refused = monitoring_render("lc", &all).err();
        let stderr = refused.unwrap_or_else(|| panic!("{sets:?} rendered"));
        for n in named {
            assert!(stderr.contains(n), "{sets:?}: {stderr}");
        }
    }
    // The same values without the ServiceMonitor render (the API's TLS itself needs none of them).
    assert!(monitoring_render("lc", &[tls]).is_ok());
}

/// Two releases in one namespace: each release's monitors label its series with its own release,
/// and every alert selects on the namespace and that release, so one release's series (a healthy
/// leader, say) never hide the other's alert (NoLeader).
#[test]
fn two_releases_in_one_namespace_alert_on_their_own_series() {
    let selector = regex::Regex::new(r"lca_[a-z_]+\{([^}]*)\}").unwrap();
    let kube_selector = regex::Regex::new(r"kube_[a-z_]+\{([^}]*)\}").unwrap();
    let mut seen = Vec::new();
    for release in ["a", "b"] {
        let docs = monitoring_render(
            release,
            &["serviceMonitor.enabled=true", "prometheusRule.enabled=true"],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let m = monitors(release, &[]);
        assert_eq!(
            static_label(&api_endpoint(&m), "release").as_deref(),
            Some(release)
        );
        assert_operator_scraped_once(&m, release);
        let rule = docs.iter().find(|d| d["kind"] == "PrometheusRule").unwrap();
        let mut selectors = Vec::new();
        for r in rule["spec"]["groups"][0]["rules"].as_sequence().unwrap() {
            let expr = r["expr"].as_str().unwrap();
            // kube-state-metrics' series name the release's Service instead.
            for c in kube_selector.captures_iter(expr) {
                let labels = c[1].replace(' ', "");
                assert!(labels.contains("namespace=\"ns\""), "{expr}");
                assert!(
                    labels.contains(&format!("endpoint=\"{release}-load-control\"")),
                    "{} does not select release {release}'s Service: {expr}",
                    r["alert"].as_str().unwrap()
                );
                selectors.push(labels);
            }
            let sels: Vec<String> = selector
                .captures_iter(expr)
                .map(|c| c[1].replace(' ', ""))
                .collect();
            assert!(!sels.is_empty() || kube_selector.is_match(expr), "{expr}");
            for s in sels {
                let labels: Vec<&str> = s.split(',').collect();
                assert!(labels.contains(&"namespace=\"ns\""), "{expr}");
                assert!(
                    labels.contains(&format!("release=\"{release}\"").as_str()),
                    "{} does not select release {release}: {expr}",
                    r["alert"].as_str().unwrap()
                );
                selectors.push(s);
            }
        }
        seen.push(selectors);
    }
    assert!(
        seen[0].iter().all(|s| !seen[1].contains(s)),
        "a selector of release a is also release b's: {seen:?}"
    );
}

/// Graceful drain (issue 27 item 7): the api-server keeps serving for `api.drainSeconds` after
/// its pod is marked for deletion (a preStop sleep: SIGTERM comes after it), the operator has no
/// such delay (it serves no client), and the grace period leaves room for the drain, the leader
/// tasks' stop (15 s at most) and the Lease's release.
#[test]
fn the_api_server_drains_before_it_stops_accepting() {
    let containers = |sets: &[&str]| {
        let docs = template_docs(sets);
        let pod =
            docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"]
                .clone();
        (
            pod["terminationGracePeriodSeconds"].as_i64().unwrap(),
            pod["containers"].as_sequence().unwrap().clone(),
        )
    };
    let pre_stop = |c: &serde_yaml::Value| c["lifecycle"]["preStop"]["sleep"]["seconds"].as_i64();
    let (grace, default) = containers(&[]);
    let api = default.iter().find(|c| c["name"] == "api-server").unwrap();
    let operator = default.iter().find(|c| c["name"] == "operator").unwrap();
    assert_eq!(pre_stop(api), Some(5), "{api:?}");
    assert_eq!(operator["lifecycle"], serde_yaml::Value::Null);
    assert!(grace >= 5 + 15 + 10, "grace {grace}");
    let (_, tuned) = containers(&["api.drainSeconds=12"]);
    assert_eq!(
        pre_stop(tuned.iter().find(|c| c["name"] == "api-server").unwrap()),
        Some(12)
    );
    let (_, none) = containers(&["api.drainSeconds=0"]);
    let api = none.iter().find(|c| c["name"] == "api-server").unwrap();
    assert_eq!(api["lifecycle"], serde_yaml::Value::Null);
}

/// The CRDs as release v0.1.0 shipped them: `v1alpha1` only, stored as `v1alpha1`.
fn crds_of_v0_1_0() -> String {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/tests/fixtures/v0.1.0");
    [
        "loadjobs.loadcontrol.io.yaml",
        "loadruns.loadcontrol.io.yaml",
    ]
    .iter()
    .map(|f| format!("{}\n---\n", std::fs::read_to_string(dir.join(f)).unwrap()))
    .collect()
}

fn stored_versions(cp: &ControlPlane, crd: &str) -> String {
    kubectl_ok(
        cp,
        &["get", "crd", crd, "-o", "jsonpath={.status.storedVersions}"],
    )
}

/// Issue 27 item 4: LoadJobs and LoadRuns stored as `v1alpha1` under the first release's CRDs are
/// read, updated and mirrored at `v1beta1` once the CRDs are upgraded the documented way (no
/// conversion: the schemas agree), `kubectl get` works at both versions throughout, and the
/// storage-version migration of docs/operations.md leaves only `v1beta1` stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn objects_stored_as_v1alpha1_are_read_updated_and_mirrored_after_the_crd_upgrade() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
    let c = cluster_with_crds(&crds_of_v0_1_0()).await;
    let ns = c.ns.as_str();
    let client = c.cp.client().await.unwrap();
    // Before the upgrade: what the first release left behind, written at v1alpha1.
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: daily}\nspec: {jobKey: DAILY, suspend: true}\n");
    let (_, created) = c.post("/v1/runs", json!({"jobKey": "DAILY", "businessKey": "2026-11-30", "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
    let run: Uuid = created["runId"].as_str().unwrap().parse().unwrap();
    let old_runs = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "loadcontrol.io",
            "v1alpha1",
            "LoadRun",
        )),
    );
    let name = crds::names::load_run_name("DAILY", "2026-11-30", &run.to_string());
    let mut old = DynamicObject::new(
        &name,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "loadcontrol.io",
            "v1alpha1",
            "LoadRun",
        )),
    );
    old.data =
        json!({"spec": {"jobKey": "DAILY", "businessKey": "2026-11-30", "runId": run.to_string()}});
    old_runs.create(&PostParams::default(), &old).await.unwrap();
    old_runs
        .patch_status(
            &name,
            &PatchParams::apply("v0.1.0-operator"),
            &Patch::Apply(
                json!({"apiVersion": "loadcontrol.io/v1alpha1", "kind": "LoadRun",
                "metadata": {"name": name}, "status": {"phase": "CREATED"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        stored_versions(&c.cp, "loadjobs.loadcontrol.io"),
        r#"["v1alpha1"]"#
    );

    // The upgrade, as docs/operations.md says: the new CRDs first.
    let upgraded = kubectl_with_input(
        &c.cp,
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &crds::all_crds_yaml(),
    );
    assert!(
        upgraded.status.success(),
        "{}",
        String::from_utf8_lossy(&upgraded.stderr)
    );
    for crd in ["loadjobs.loadcontrol.io", "loadruns.loadcontrol.io"] {
        kubectl_ok(
            &c.cp,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=30s",
                "crd",
                crd,
            ],
        );
        assert_eq!(
            stored_versions(&c.cp, crd),
            r#"["v1alpha1","v1beta1"]"#,
            "{crd}"
        );
    }

    // Read at v1beta1 without a write since: the object stored as v1alpha1, relabelled.
    let jobs = Api::<LoadJob>::namespaced(client.clone(), ns);
    let job = jobs.get("daily").await.unwrap();
    assert_eq!(
        (job.spec.job_key.as_str(), job.spec.suspend),
        ("DAILY", true)
    );
    let lr = Api::<LoadRun>::namespaced(client.clone(), ns)
        .get(&name)
        .await
        .unwrap();
    assert_eq!(lr.status.map(|s| s.phase).as_deref(), Some("CREATED"));

    // The operator (v1beta1) takes over: the LoadJob written into the ledger, then updated at
    // v1beta1; the LoadRun written by the old release mirrored on.
    let mut op = c.operator("op-upgraded").await;
    op.wait_leading(Duration::from_secs(20))
        .await
        .expect("leads");
    eventually("the suspended job row", Duration::from_secs(20), || async {
        c.job_row("DAILY").await.filter(|r| r.0)
    })
    .await;
    jobs.patch(
        "daily",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": false}})),
    )
    .await
    .unwrap();
    eventually("the job row resumed", Duration::from_secs(20), || async {
        c.job_row("DAILY").await.filter(|r| !r.0)
    })
    .await;
    let manifest = json!({"snapshotScn": "42", "sourceCount": 5, "plannedPartitionCount": 1,
        "partitions": [{"partitionId": "0000", "lowerBound": "0", "upperBound": "9", "upperInclusive": true, "expectedRowCount": 5}]});
    let (status, _) = c.post(&format!("/v1/runs/{run}/manifest"), manifest).await;
    assert_eq!(status, 200);
    let lr = c.wait_phase(run, "EXTRACTING").await;
    assert_eq!(lr.metadata.name.as_deref(), Some(name.as_str()));

    // kubectl at the preferred version and, explicitly, at the old one.
    for resource in [
        "loadjobs,loadruns",
        "loadjobs.v1alpha1.loadcontrol.io,loadruns.v1alpha1.loadcontrol.io",
    ] {
        let text = kubectl_ok(&c.cp, &["get", resource, "-n", ns]);
        assert!(
            text.contains("DAILY") && text.contains("EXTRACTING"),
            "{resource}: {text}"
        );
    }

    // The storage-version migration: every object rewritten at the storage version, then the
    // old version dropped from storedVersions.
    // The operator writes statuses meanwhile: a replace that meets one is refused with a
    // conflict and, as the runbook says, run again (bounded here).
    let mut attempts = 0;
    loop {
        attempts += 1;
        let listed = kubectl_ok(&c.cp, &["get", "loadjobs,loadruns", "-A", "-o", "json"]);
        let replaced = kubectl_with_input(&c.cp, &["replace", "-f", "-"], &listed);
        let stderr = String::from_utf8_lossy(&replaced.stderr).to_string();
        if replaced.status.success() {
            break;
        }
        assert!(
            stderr.contains("the object has been modified") && attempts < 10,
            "{stderr}"
        );
    }
    for crd in ["loadjobs.loadcontrol.io", "loadruns.loadcontrol.io"] {
        kubectl_ok(
            &c.cp,
            &[
                "patch",
                "crd",
                crd,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"storedVersions":["v1beta1"]}}"#,
            ],
        );
        assert_eq!(stored_versions(&c.cp, crd), r#"["v1beta1"]"#);
    }
    // Still served and acted on after the migration: a cancel requested at the old version.
    kubectl_ok(
        &c.cp,
        &[
            "patch",
            "loadruns.v1alpha1.loadcontrol.io",
            &name,
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"cancel":{"reason":"after the storage migration"}}}"#,
        ],
    );
    c.wait_phase(run, "CANCELLED").await;
    op.stop().await.unwrap();
}

/// Issue 42 item 4: the values with no default. Each one missing (the others given) refuses the
/// install with a message naming it and what to set; all three given, the chart renders.
/// `database.passwordKey`: the password as a file in every container that connects (the migration
/// hook too), mounted as a directory so the kubelet replaces it; `config.database.password_file`
/// and the raw tokens of `config.monitor` are refused in the ConfigMap.
#[test]
fn the_database_password_is_a_mounted_file_and_raw_tokens_stay_out_of_the_configmap() {
    let render = |sets: &[&str]| {
        let mut helm = kubetest::helm_offline();
        helm.args(["template", "lc", &chart_dir(), "--namespace", "ns"])
            .args(["-f", &kubetest::required_values()]);
        for set in sets {
            helm.args(["--set", set]);
        }
        helm.output().unwrap()
    };
    let out = render(&["database.passwordKey=password"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<serde_yaml::Value> = String::from_utf8_lossy(&out.stdout)
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str(d).ok())
        .collect();
    let mut containers = 0;
    for doc in docs
        .iter()
        .filter(|d| d["kind"] == "Deployment" || d["kind"] == "Job")
    {
        let pod = &doc["spec"]["template"]["spec"];
        let volume = pod["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == "database-password");
        let Some(volume) = volume else {
            continue;
        };
        assert_eq!(volume["secret"]["secretName"], "lc-db", "{volume:?}");
        assert_eq!(volume["secret"]["items"][0]["key"], "password");
        for c in pod["containers"].as_sequence().unwrap() {
            let file = c["env"]
                .as_sequence()
                .into_iter()
                .flatten()
                .find(|e| e["name"] == "LCA_DATABASE__PASSWORD_FILE")
                .map(|e| e["value"].as_str().unwrap().to_string());
            let Some(file) = file else {
                continue;
            };
            let mounted = c["volumeMounts"].as_sequence().unwrap().iter().any(|m| {
                m["name"] == "database-password"
                    && m.get("subPath").is_none()
                    && file.starts_with(m["mountPath"].as_str().unwrap())
            });
            assert!(
                mounted,
                "{:?}: {file} is not on a directory mount",
                c["name"]
            );
            containers += 1;
        }
    }
    assert_eq!(
        containers, 3,
        "api-server, operator and the migration hook read the password file"
    );
    for (set, says) in [
        (
            "config.database.password_file=/x",
            "config.database.password_file must not be set: the chart sets it from database.passwordKey",
        ),
        (
            "config.monitor.token=abc",
            "config.monitor.token must not be set: it is a raw token",
        ),
        (
            "config.monitor.operator_token=abc",
            "config.monitor.operator_token must not be set: it is a raw token",
        ),
    ] {
        let out = render(&[set]);
        assert!(!out.status.success(), "{set} rendered");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{set}: {err}");
    }
}

#[test]
fn the_chart_refuses_an_install_without_its_required_values() {
    let required = [
        (
            "database.existingSecret=lc-db",
            "database.existingSecret is required: the name of a Secret",
        ),
        (
            "auth.existingSecret=lc-tokens",
            "auth.existingSecret is required: the name of a Secret",
        ),
        (
            "config.nifi.receiver_url=https://nifi-0.nifi.svc:9443",
            "config.nifi.receiver_url is required: NiFi PG-05's scheme, host and port",
        ),
    ];
    let render = |sets: &[&str]| {
        let mut helm = kubetest::helm_offline();
        helm.args(["template", "lc", &chart_dir(), "--namespace", "ns"]);
        for set in sets {
            helm.args(["--set", set]);
        }
        helm.output().unwrap()
    };
    for (missing, says) in required {
        let others: Vec<&str> = required
            .iter()
            .map(|(set, _)| *set)
            .filter(|set| *set != missing)
            .collect();
        let out = render(&others);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rendered without {missing}");
        assert!(stderr.contains(says), "without {missing}: {stderr}");
    }
    let all: Vec<&str> = required.iter().map(|(set, _)| *set).collect();
    let out = render(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A malformed URL is the schema's to refuse.
    let mut bad = all.clone();
    bad[2] = "config.nifi.receiver_url=nifi-0:9443";
    let out = render(&bad);
    assert!(!out.status.success(), "a URL without a scheme rendered");
    assert!(String::from_utf8_lossy(&out.stderr).contains("receiver_url"));
}

/// The reasons of the Events about `object` so far.
fn event_reasons(c: &Cluster, object: &str) -> Vec<String> {
    let out =
        c.cp.kubectl()
            .args(["get", "events", "-n", &c.ns, "-o", "json"])
            .output()
            .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["regarding"]["name"] == object || e["involvedObject"]["name"] == object)
        .filter_map(|e| e["reason"].as_str().map(str::to_string))
        .collect()
}

/// Issue 40 item 6. The ledger restored from a backup (pg_dump / pg_restore, under the running
/// operator and api-server) taken while a run was STAGING_VALIDATED; after the backup the run was
/// published and another run created. The leader notices (its clock), leads again under a higher
/// epoch, the mirror moves the published run's LoadRun back with a LedgerWentBack Event, and the
/// run is held as PUBLISH_UNKNOWN so that NiFi's publish claim is refused instead of publishing it
/// a second time. Seen failing without the mirror's fresh read (the LoadRun stayed PUBLISHED) and
/// without the hold (the restored run took a second publish claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restored_ledger_is_followed_and_a_publish_after_it_is_held() {
    let c = cluster().await;
    let mut op = c.operator("op-a").await;
    let before = op
        .wait_leading(Duration::from_secs(20))
        .await
        .expect("leads");
    c.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: rs}\nspec: {jobKey: RS}\n");
    eventually("load_job row", Duration::from_secs(20), || c.job_row("RS")).await;
    let (_, created) = c.post("/v1/runs", json!({"jobKey": "RS", "businessKey": "2026-12-01", "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
    let run: Uuid = created["runId"].as_str().unwrap().parse().unwrap();
    let manifest = json!({"snapshotScn": "42", "sourceCount": 5, "plannedPartitionCount": 1,
        "partitions": [{"partitionId": "0000", "lowerBound": "0", "upperBound": "9", "upperInclusive": true, "expectedRowCount": 5}]});
    let (status, body) = c.post(&format!("/v1/runs/{run}/manifest"), manifest).await;
    assert_eq!(status, 200, "{body}");
    let token = Uuid::new_v4();
    c.post(
        &format!("/v1/runs/{run}/partitions/0000/claim"),
        json!({"claimToken": token, "workerNode": "n1"}),
    )
    .await;
    let (status, body) = c
        .post(
            &format!("/v1/runs/{run}/partitions/0000/chunks"),
            json!({"claimToken": token, "chunkIndex": 0, "chunkCount": 1,
            "hdfsPath": format!("/data/RS/run_id={run}/p/0.parquet"), "recordCount": 5}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (dispatch,): (Uuid,) =
        sqlx::query_as("SELECT dispatch_id FROM nifi_ops.load_dispatch WHERE run_id = $1")
            .bind(run)
            .fetch_one(&mut c.env.conn().await)
            .await
            .unwrap();
    c.post(
        &format!("/v1/runs/{run}/validation/start"),
        json!({"dispatchId": dispatch}),
    )
    .await;
    c.post(&format!("/v1/runs/{run}/validations"), json!({"stage": "STAGING", "metrics": [{"metricName": "STAGE_COUNT", "actualValue": "5", "result": "PASS"}]})).await;
    c.post(&format!("/v1/runs/{run}/stage-validated"), json!({}))
        .await;
    c.wait_phase(run, "STAGING_VALIDATED").await;
    let clock = || async {
        let (tick,): (i64,) = sqlx::query_as("SELECT tick FROM nifi_ops.ledger_clock")
            .fetch_one(&mut c.env.conn().await)
            .await
            .unwrap();
        tick
    };
    let before_backup = clock().await;
    let backup = c.env.db.backup();

    // After the backup: published, and a second run created.
    let publish = Uuid::new_v4();
    let (status, _) = c
        .post(
            &format!("/v1/runs/{run}/publish/claim"),
            json!({"publishToken": publish}),
        )
        .await;
    assert_eq!(status, 200);
    c.post(
        &format!("/v1/runs/{run}/publish/result"),
        json!({"publishToken": publish, "outcome": "PUBLISHED"}),
    )
    .await;
    let lr = c.wait_phase(run, "PUBLISHED").await;
    let name = lr.metadata.name.clone().unwrap();
    let (_, later) = c.post("/v1/runs", json!({"jobKey": "RS", "businessKey": "2026-12-02", "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
    assert!(later["runId"].is_string(), "{later}");
    // The leader's clock advanced after the backup, as it does every few seconds.
    eventually(
        "a clock tick after the backup",
        Duration::from_secs(20),
        || async { (clock().await >= before_backup + 2).then_some(()) },
    )
    .await;

    c.env.db.restore(&backup).await;

    let lr = c.wait_phase(run, "PUBLISH_UNKNOWN").await;
    let needs = lr
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "NeedsOperator")
        .cloned()
        .unwrap();
    assert_eq!(needs.status, "True");
    let (code, message): (String, String) =
        sqlx::query_as("SELECT error_code, error_message FROM nifi_ops.load_run WHERE run_id = $1")
            .bind(run)
            .fetch_one(&mut c.env.conn().await)
            .await
            .unwrap();
    assert_eq!(code, "PUBLISHED_AFTER_RESTORE_POINT");
    assert!(message.contains("showed PUBLISHED"), "{message}");
    // NiFi's flow, replayed from the restored state, cannot publish it again.
    let (status, body) = c
        .post(
            &format!("/v1/runs/{run}/publish/claim"),
            json!({"publishToken": Uuid::new_v4()}),
        )
        .await;
    assert_eq!(
        (status, &body["claimed"], &body["runStatus"]),
        (200, &json!(false), &json!("PUBLISH_UNKNOWN")),
        "{body}"
    );
    let reasons = eventually(
        "a LedgerWentBack Event",
        Duration::from_secs(20),
        || async {
            let r = event_reasons(&c, &name);
            r.iter().any(|r| r == "LedgerWentBack").then_some(r)
        },
    )
    .await;
    assert!(reasons.iter().any(|r| r == "PublishUnknown"), "{reasons:?}");
    // The leader noticed, and leads under an epoch above every one issued before.
    let after = op
        .wait_leading(Duration::from_secs(20))
        .await
        .expect("leads again");
    assert!(after.epoch > before.epoch, "{after:?} after {before:?}");
    let metrics = op.metrics.render();
    assert!(
        metrics.contains("lca_ledger_went_back_total 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("went_back"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    op.stop().await.unwrap();
}

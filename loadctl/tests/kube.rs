//! `loadctl --kube` against a real kube-apiserver: LoadRuns are read, and actions become requests
//! written on them (spec.resolution, spec.cancel) for the operator to carry out.
use crds::{LoadRun, LoadRunSpec};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kubetest::ControlPlane;
use std::process::Command;

fn loadctl(cp: &ControlPlane, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_loadctl"))
        .arg("--kube")
        .args(args)
        .env("KUBECONFIG", &cp.kubeconfig)
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_mode_reads_loadruns_and_writes_requests_on_them() {
    let cp = ControlPlane::start().await.expect("control plane");
    let all = crds::all_crds_yaml();
    cp.install_crds(&all).await.unwrap();
    let ns = cp.create_namespace("loadctl").await.unwrap();
    let client = cp.client().await.unwrap();
    let api: Api<LoadRun> = Api::namespaced(client, &ns);
    let run_id = uuid::Uuid::new_v4().to_string();
    let mut lr = LoadRun::new(
        "orders-2026-09-28-0b6f8c1e",
        LoadRunSpec {
            job_key: "ORDERS".into(),
            business_key: "2026-09-28".into(),
            run_id: run_id.clone(),
            cancel: None,
            resolution: None,
        },
    );
    lr.metadata.namespace = Some(ns.clone());
    api.create(&PostParams::default(), &lr).await.unwrap();
    api.patch_status(
        "orders-2026-09-28-0b6f8c1e",
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({"status": {"phase": "PUBLISH_UNKNOWN", "partitionsSummary": "4/4"}}),
        ),
    )
    .await
    .unwrap();

    // A LoadRun that cannot be read (written under a loosened CRD) is named, not fatal.
    let loose = crds::loosened_crd_json("loadruns");
    cp.install_crds(&serde_json::to_string(&loose).unwrap())
        .await
        .unwrap();
    let broken = serde_json::json!({"apiVersion": "loadcontrol.io/v1beta1", "kind": "LoadRun",
        "metadata": {"name": "broken", "namespace": ns}, "spec": {"runId": 7}});
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(
        cp.client().await.unwrap(),
        &ns,
        &kube::api::ApiResource::erase::<LoadRun>(&()),
    );
    let mut created = false;
    for _ in 0..100 {
        if raw
            .create(
                &PostParams::default(),
                &serde_json::from_value(broken.clone()).unwrap(),
            )
            .await
            .is_ok()
        {
            created = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(created, "the loose CRD takes the unreadable LoadRun");
    cp.install_crds(&all).await.unwrap();

    let (code, out, err) = loadctl(&cp, &["runs", "--status", "PUBLISH_UNKNOWN"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("LoadRun") && err.contains("/broken cannot be read"),
        "{err}"
    );
    assert!(
        out.lines().next().unwrap().starts_with("NAMESPACE"),
        "{out}"
    );
    assert!(
        out.contains("orders-2026-09-28-0b6f8c1e")
            && out.contains("PUBLISH_UNKNOWN")
            && out.contains("4/4"),
        "{out}"
    );
    let (code, out, _) = loadctl(&cp, &["run", &run_id]);
    assert_eq!(code, 0);
    assert!(out.contains("Phase:       PUBLISH_UNKNOWN"), "{out}");

    let (code, out, err) = loadctl(
        &cp,
        &[
            "-n",
            &ns,
            "resolve",
            &run_id,
            "--outcome",
            "PUBLISHED",
            "--reason",
            "checked in Hive",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("resolves it as PUBLISHED"), "{out}");
    let (code, _, err) = loadctl(
        &cp,
        &[
            "cancel",
            "orders-2026-09-28-0b6f8c1e",
            "--reason",
            "wrong business date",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let now = api.get("orders-2026-09-28-0b6f8c1e").await.unwrap();
    let resolution = now.spec.resolution.expect("spec.resolution written");
    assert_eq!(resolution.reason, "checked in Hive");
    assert_eq!(
        now.spec.cancel.expect("spec.cancel written").reason,
        "wrong business date"
    );

    let (code, _, err) = loadctl(&cp, &["run", "no-such-run"]);
    assert_eq!(code, 3, "{err}");
    let (code, _, err) = loadctl(&cp, &["summary"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("HTTP API"), "{err}");
}

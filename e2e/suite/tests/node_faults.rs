//! Faults production chooses, on the real node, under NiFi load through the Service (issues 18
//! and 19). Each ends with the invariant checker at 0 violations, every run final, and every
//! LoadRun's phase and ledgerVersion equal to the ledger's. Each prints one JSON line with what
//! it measured.
use e2e::check::{Scope, check};
use e2e::node::wait_for;
use e2e::release::Release;
use serde_json::{Value, json};
use sqlx::Connection;
use std::time::{Duration, Instant};

const LOAD: &[&str] = &[
    "--concurrent-runs",
    "3",
    "--partitions",
    "2",
    "--chunks",
    "2",
    "--nodes",
    "2",
    "--run-timeout",
    "240",
];

/// The ledger's verdict on `job_key`: no violation of the invariants.
async fn assert_ledger_clean(r: &Release, job_key: &str, runs: usize) {
    let mut conn = sqlx::PgConnection::connect(&r.ledger_url).await.unwrap();
    let report = check(
        &mut conn,
        &Scope {
            job_keys: vec![job_key.into()],
            stale_after_seconds: 0.0,
        },
    )
    .await
    .unwrap();
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(report.runs as usize, runs);
}

/// What NiFi saw: every run SUCCESS, nothing given up, nothing the contract forbids.
fn assert_all_succeeded(summary: &Value, runs: usize) {
    assert_eq!(
        summary["final_status"],
        json!({"SUCCESS": runs}),
        "{summary}"
    );
    assert_eq!(summary["anomalies"], json!([]), "{summary}");
    assert_eq!(summary["unfinished"], json!([]), "{summary}");
    assert_eq!(summary["gave_up"], json!([]), "{summary}");
    assert_eq!(summary["receiver"]["rejected"], json!([]), "{summary}");
}

fn ready_pods(r: &Release) -> usize {
    r.server_pods()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| {
            p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
        })
        .count()
}

/// Issue 18 item 4 / issue 19 item 1: a LoadJob and a LoadRun the operator cannot read (written
/// under a loosened CRD) are present while both pods are restarted, once as a rolling restart
/// under NiFi load and once both at the same moment. The pods become Ready again (readiness is
/// the api-server's), NiFi's runs all succeed without an error, new runs get their LoadRuns, and
/// the chart uninstalls (its hook reads metadata only) without leaving the Deployment at zero.
#[tokio::test(flavor = "multi_thread")]
async fn unreadable_objects_never_take_nifis_api_down() {
    let tag = std::env::var("LC_IMAGE_TAG").unwrap_or_else(|_| "0.1.0".into());
    let r = Release::prepare("unreadable", env!("CARGO_BIN_EXE_nifi-sim")).await;
    r.helm_install_with("install", &tag, &["config.recovery.sweeper_interval=2s"]);
    r.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: faults}\nspec:\n  jobKey: NODE_FAULTS\n");
    wait_for("the LoadJob in the ledger", Duration::from_secs(30), || {
        Ok(
            r.kj(&["get", "loadjob", "faults"])["status"]["observedGeneration"]
                .as_i64()
                .map(|_| ()),
        )
    })
    .unwrap();
    {
        let _loose = r.loosen_crds();
        r.apply_eventually(
            "an unreadable LoadJob",
            "apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: broken}\nspec: {jobKey: 5}\n",
        );
        r.apply_eventually(
            "an unreadable LoadRun",
            "apiVersion: loadcontrol.io/v1alpha1\nkind: LoadRun\nmetadata: {name: broken}\nspec: {runId: [not, a, string]}\n",
        );
    } // the real CRDs are back; the two objects stay unreadable

    // A rolling restart (an upgrade, a drain) under NiFi load.
    let t0 = Instant::now();
    let sim = r.start_simulation("NODE_FAULTS", &[&["--runs", "10"][..], LOAD].concat());
    r.k(&["rollout", "restart", "deployment/lc-load-control"]);
    r.k(&[
        "rollout",
        "status",
        "deployment/lc-load-control",
        "--timeout=180s",
    ]);
    let rolled = t0.elapsed();
    let rolling = Release::summary(sim);
    assert_all_succeeded(&rolling, 10);

    // Both pods at once: nothing serves until one is Ready again.
    let t1 = Instant::now();
    r.k(&[
        "delete",
        "pod",
        "-l",
        "app.kubernetes.io/component=server",
        "--wait=false",
    ]);
    wait_for("both new pods Ready", Duration::from_secs(120), || {
        Ok((ready_pods(&r) == 2).then_some(()))
    })
    .unwrap();
    let both_ready = t1.elapsed();
    let after = r.simulate("NODE_FAULTS", &[&["--runs", "4"][..], LOAD].concat());
    assert_all_succeeded(&after, 4);
    let agreed = r
        .wait_mirror_agrees("NODE_FAULTS", Duration::from_secs(10))
        .await;
    assert_ledger_clean(&r, "NODE_FAULTS", 14).await;
    // Nothing restarted the operator container: it waited nothing out because nothing was to
    // wait for, and one unreadable object is no reason to exit.
    for pod in r.server_pods() {
        for c in pod["status"]["containerStatuses"].as_array().unwrap() {
            assert_eq!(c["restartCount"], 0, "{} restarted: {c}", c["name"]);
        }
    }
    let line = json!({"bench": "node_fault_unreadable_objects",
        "rolling_restart_seconds": rolled.as_secs_f64(),
        "both_pods_ready_seconds": both_ready.as_secs_f64(),
        "nifi_failed_attempts_rolling": rolling["failed_attempts"],
        "nifi_failed_attempts_after": after["failed_attempts"],
        "mirror_agrees_seconds": agreed.as_secs_f64()});
    println!("{line}");
    eprintln!("node faults: {line}");

    // The uninstall hook releases every finalizer, the unreadable LoadJob's neighbours included.
    r.helm(&["uninstall", &r.name, "--wait", "--timeout", "120s"]);
    let job = r.kj(&["get", "loadjob", "faults"]);
    assert!(
        job["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty()),
        "{job}"
    );
    r.k(&["delete", "loadjob", "faults", "broken", "--timeout=30s"]);
    r.k(&["delete", "loadrun", "broken", "--timeout=30s"]);
    r.remove().await;
}

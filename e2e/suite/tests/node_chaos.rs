//! The fault-injection suite on the real node (issue 10): loads through the Service with
//! duplicates, lost responses, node crashes and late reports, while the leader pod and then the
//! other pod are deleted with kubectl. Afterwards the invariant checker must find nothing and
//! every run must have ended. `LC_NODE_CHAOS_RUNS` sets the number of runs (default 24).
use e2e::check::{Scope, check};
use e2e::node::wait_for;
use e2e::release::Release;
use serde_json::json;
use sqlx::Connection;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread")]
async fn loads_survive_pod_deletions_on_the_node() {
    let runs: usize = std::env::var("LC_NODE_CHAOS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let tag = std::env::var("LC_IMAGE_TAG").unwrap_or_else(|_| env!("CARGO_PKG_VERSION").into());
    let r = Release::prepare("chaos", env!("CARGO_BIN_EXE_nifi-sim")).await;
    // The sweeper every 2 s instead of every minute, so a crashed node's partition is reissued
    // within seconds of going stale. Stale after 10 s: longer than NiFi's retries of one report
    // across a pod deletion (0.8 s, then 1.7 s each, at the suites' scale), so only crashed owners
    // are superseded, never a live one still retrying.
    r.helm_install_with("install", &tag, &["config.recovery.sweeper_interval=2s"]);
    r.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: chaos}\nspec:\n  jobKey: NODE_CHAOS\n  recovery: {mode: REISSUE, stale: 10s, extractQueryTimeout: 5s}\n  dispatch: {backoffMin: 1s, backoffMax: 4s, ackTimeout: 20s}\n");
    wait_for("the LoadJob in the ledger", Duration::from_secs(30), || {
        let j = r.kj(&["get", "loadjob", "chaos"]);
        Ok(j["status"]["observedGeneration"].as_i64().map(|_| ()))
    })
    .unwrap();
    let t0 = Instant::now();
    let runs_arg = runs.to_string();
    let mut args = vec![
        "--runs",
        runs_arg.as_str(),
        "--concurrent-runs",
        "3",
        "--partitions",
        "4",
        "--chunks",
        "4",
        "--nodes",
        "3",
        "--run-timeout",
        "240",
    ];
    args.extend_from_slice(e2e::nifi::CHAOS_FAULTS);
    let sim = r.start_simulation("NODE_CHAOS", &args);
    // The leader pod is deleted, then (once a new leader holds the Lease) the other pod.
    let leader = wait_for("a leader", Duration::from_secs(30), || {
        Ok(r.lease_holder_pod())
    })
    .unwrap();
    r.k(&["delete", "pod", &leader, "--wait=false"]);
    let next = wait_for("a new leader", Duration::from_secs(30), || {
        Ok(r.lease_holder_pod().filter(|p| *p != leader))
    })
    .unwrap();
    let other = r
        .server_pods()
        .into_iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .find(|p| *p != next && *p != leader);
    if let Some(other) = &other {
        r.k(&["delete", "pod", other, "--wait=false"]);
    }
    let summary = Release::summary(sim);
    let why = e2e::nifi::what_went_wrong(&summary);
    let mut conn = sqlx::PgConnection::connect(&r.ledger_url).await.unwrap();
    let report = check(
        &mut conn,
        &Scope {
            job_keys: vec!["NODE_CHAOS".into()],
            stale_after_seconds: 0.0,
        },
    )
    .await
    .unwrap();
    let line = json!({"bench": "node_chaos", "runs": runs, "final_status": summary["final_status"],
        "faults_injected": summary["faults_injected"], "pods_deleted": 1 + other.iter().count(),
        "violations": report.violations.len(), "gave_up": summary["gave_up"].as_array().map_or(0, Vec::len),
        "wall_seconds": t0.elapsed().as_secs_f64()});
    println!("{line}");
    eprintln!("node chaos: {line}");
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert_eq!(summary["anomalies"], json!([]), "{why}");
    assert_eq!(summary["unfinished"], json!([]), "{why}");
    assert_eq!(summary["receiver"]["rejected"], json!([]), "{why}");
    assert_eq!(report.runs as usize, runs);
    r.k(&["delete", "loadjob", "chaos", "--wait=false"]);
    r.remove().await;
}

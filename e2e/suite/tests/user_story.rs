//! The user story on the real node (issue 9): what a platform engineer, a NiFi flow and an on-call
//! operator do, through the shipped parts only — the image, `helm`, `kubectl`, the Service, and a
//! NiFi (the simulator) inside the cluster network. Needs `scripts/cluster-up` and the image
//! loaded (`scripts/test` does both; `LC_IMAGE_TAG` and `LC_IMAGE_TAG_NEXT` name the tags).
use e2e::node::wait_for;
use e2e::release::{Release, condition};
use serde_json::{Value, json};
use sqlx::Connection;
use std::process::Stdio;
use std::time::{Duration, Instant};

async fn ledger_epoch(url: &str) -> (i64, String) {
    let mut c = sqlx::PgConnection::connect(url).await.expect("ledger");
    sqlx::query_as("SELECT epoch, holder FROM nifi_ops.leader_epoch")
        .fetch_one(&mut c)
        .await
        .expect("epoch row")
}

#[tokio::test(flavor = "multi_thread")]
async fn user_story_on_a_real_node() {
    let tag = std::env::var("LC_IMAGE_TAG").unwrap_or_else(|_| env!("CARGO_PKG_VERSION").into());
    let next_tag = std::env::var("LC_IMAGE_TAG_NEXT")
        .expect("LC_IMAGE_TAG_NEXT: a second image tag for the upgrade (scripts/test)");
    let s = Release::prepare("story", env!("CARGO_BIN_EXE_nifi-sim")).await;

    // 1. helm install --wait --wait-for-jobs, as the README says.
    let t0 = Instant::now();
    s.helm_install("install", &tag);
    let install_secs = t0.elapsed().as_secs_f64();
    // The migration hook completed: the ledger schema exists in the release's database.
    let (tables,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'nifi_ops'",
    )
    .fetch_one(&mut sqlx::PgConnection::connect(&s.ledger_url).await.unwrap())
    .await
    .unwrap();
    assert!(
        tables >= 7,
        "migration hook created the ledger tables ({tables})"
    );
    // Both containers of both pods Ready.
    let pods = s.server_pods();
    assert_eq!(pods.len(), 2, "two replicas");
    for p in &pods {
        let statuses = p["status"]["containerStatuses"].as_array().unwrap();
        assert_eq!(statuses.len(), 2);
        assert!(
            statuses.iter().all(|c| c["ready"] == true),
            "containers ready: {statuses:?}"
        );
    }
    // Pod start: from creation to Ready, as the API server recorded them.
    for p in &pods {
        let created = p["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap_or_default();
        let ready = condition(p, "Ready")
            .and_then(|c| c["lastTransitionTime"].as_str())
            .unwrap_or_default();
        let secs = |t: &str| {
            chrono::DateTime::parse_from_rfc3339(t)
                .map(|d| d.timestamp())
                .unwrap_or(0)
        };
        eprintln!(
            "story: pod {} Ready {}s after creation",
            p["metadata"]["name"],
            secs(ready) - secs(created)
        );
    }
    let pod_names: Vec<String> = pods
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    // One pod holds the Lease.
    let leader = wait_for("a Lease holder", Duration::from_secs(30), || {
        Ok(s.lease_holder_pod())
    })
    .unwrap();
    assert!(
        pod_names.contains(&leader),
        "Lease held by {leader}, one of {pod_names:?}"
    );
    // The API answers through the Service (helm test).
    let test = s.helm(&["test", &s.name, "--logs"]);
    assert!(test.contains("Succeeded"), "helm test: {test}");
    assert!(
        test.contains("the token reads") && test.matches("/metrics scraped").count() == 2,
        "helm test read with the token and scraped both containers: {test}"
    );
    eprintln!("story: helm install --wait --wait-for-jobs took {install_secs:.1}s");

    // 2. kubectl apply a LoadJob.
    s.apply("apiVersion: loadcontrol.io/v1alpha1\nkind: LoadJob\nmetadata: {name: story-job}\nspec:\n  jobKey: STORY_JOB\n  recovery: {mode: REISSUE, stale: 20s, extractQueryTimeout: 10s}\n");
    wait_for("LoadJob Ready", Duration::from_secs(30), || {
        let j = s.kj(&["get", "loadjob", "story-job"]);
        Ok(condition(&j, "Ready")
            .filter(|c| c["status"] == "True")
            .map(|_| ()))
    })
    .unwrap();

    // 3. NiFi drives runs through the Service; the first publish's outcome is unknown.
    let summary = s.simulate(
        "STORY_JOB",
        &[
            "--runs",
            "3",
            "--partitions",
            "4",
            "--chunks",
            "3",
            "--rows-per-chunk",
            "100",
            "--publish-unknown-runs",
            "1",
        ],
    );
    let why = e2e::nifi::what_went_wrong(&summary);
    assert_eq!(summary["anomalies"], json!([]), "{why}");
    assert_eq!(
        summary["receiver"]["rejected"],
        json!([]),
        "PG-05 refused a dispatch: {why}"
    );
    assert_eq!(summary["final_status"]["SUCCESS"], 2, "{why}");
    assert_eq!(summary["final_status"]["PUBLISH_UNKNOWN"], 1, "{why}");

    // 4. kubectl get loadruns shows SUCCESS with the right partition and row counts.
    let mut unknown = None;
    for id in summary["run_ids"].as_array().unwrap() {
        let id = id.as_str().unwrap();
        let lr = wait_for(
            &format!("LoadRun of {id} settled"),
            Duration::from_secs(60),
            || {
                Ok(s.loadrun(id).filter(|r| {
                    matches!(
                        r["status"]["phase"].as_str(),
                        Some("SUCCESS" | "PUBLISH_UNKNOWN")
                    )
                }))
            },
        )
        .unwrap();
        let st = &lr["status"];
        assert_eq!(st["partitions"]["expected"], 4);
        assert_eq!(st["partitions"]["succeeded"], 4);
        assert_eq!(st["counts"]["source"], 1200);
        assert_eq!(st["counts"]["extracted"], 1200);
        if st["phase"] == "SUCCESS" {
            assert_eq!(st["counts"]["target"], 1200);
            assert_eq!(condition(&lr, "Succeeded").unwrap()["status"], "True");
        } else {
            unknown = Some((
                id.to_string(),
                lr["metadata"]["name"].as_str().unwrap().to_string(),
            ));
        }
    }
    // The LoadJob shows its last run (refreshed when its LoadRuns change, not only periodically).
    wait_for("the LoadJob's last run", Duration::from_secs(15), || {
        let j = s.kj(&["get", "loadjob", "story-job"]);
        let st = &j["status"];
        Ok((st["lastRun"]["status"] == "SUCCESS" && st["recent"]["succeeded"] == 2).then_some(()))
    })
    .unwrap();
    let shown = s.k(&["get", "loadjobs,loadruns"]);
    eprintln!("story: kubectl get loadjobs,loadruns\n{shown}");
    let success_rows = shown
        .lines()
        .filter(|l| l.contains("SUCCESS") && l.contains("4/4") && l.contains("1200"))
        .count();
    assert_eq!(
        success_rows, 2,
        "two SUCCESS LoadRuns with 4/4 partitions and 1200 rows:\n{shown}"
    );

    // 5. The PUBLISH_UNKNOWN run asks for a person; resolved with kubectl patch, then PG-60.
    let (unknown_id, unknown_name) = unknown.expect("one run in PUBLISH_UNKNOWN");
    let lr = s.loadrun(&unknown_id).unwrap();
    let needs = condition(&lr, "NeedsOperator").expect("NeedsOperator condition");
    assert_eq!(needs["status"], "True", "{needs}");
    s.k(&[
        "patch",
        "loadrun",
        &unknown_name,
        "--type=merge",
        "-p",
        r#"{"spec":{"resolution":{"outcome":"PUBLISHED","reason":"row counts checked in Hive"}}}"#,
    ]);
    let lr = s.wait_phase(&unknown_id, "PUBLISHED");
    assert_ne!(
        condition(&lr, "NeedsOperator").map(|c| c["status"].clone()),
        Some(Value::from("True"))
    );
    let api = format!("http://{}:8080", s.service_ip());
    let finish = s
        .node
        .in_netns(env!("CARGO_BIN_EXE_nifi-sim"))
        .args([
            "--api",
            &api,
            "--token",
            e2e::release::NIFI_TOKEN,
            "--retry-scale",
            &e2e::nifi::api::RetrySchedule::TEST_SCALE.to_string(),
            "finish-target",
            "--run-id",
            &unknown_id,
        ])
        .output()
        .unwrap();
    assert!(
        finish.status.success(),
        "PG-60 after resolution: {}",
        String::from_utf8_lossy(&finish.stdout)
    );
    s.wait_phase(&unknown_id, "SUCCESS");

    // 6. The leader pod is deleted: the standby leads within 20 s, runs keep completing, and the
    //    old epoch writes nothing (the epoch moved on, held by the new pod).
    let (epoch_before, _) = ledger_epoch(&s.ledger_url).await;
    let old = s.lease_holder_pod().unwrap();
    // The old leader's last words, shown when the handover is slow.
    let mut old_logs = std::process::Command::new(s.node.var("KUBECTL"))
        .args([
            "--kubeconfig",
            s.node.var("KUBECONFIG"),
            "-n",
            &s.ns,
            "logs",
            "-f",
            &old,
            "-c",
            "operator",
            "--since=5s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    s.k(&["delete", "pod", &old, "--wait=false"]);
    let new = wait_for("another pod to lead", Duration::from_secs(20), || {
        Ok(s.lease_holder_pod().filter(|p| *p != old))
    })
    .unwrap_or_else(|e| panic!("failover: {e:#}"));
    let failover = t0.elapsed().as_secs_f64();
    eprintln!("story: failover from {old} to {new} in {failover:.1}s");
    let _ = old_logs.kill();
    let logs = old_logs.wait_with_output().unwrap();
    if failover > 5.0 {
        eprintln!(
            "story: slow handover; the old leader logged:\n{}",
            String::from_utf8_lossy(&logs.stdout)
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let (epoch_after, holder) = loop {
        let e = ledger_epoch(&s.ledger_url).await;
        if e.0 > epoch_before {
            break e;
        }
        assert!(
            Instant::now() < deadline,
            "the new leader never bumped the epoch ({e:?})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        holder.starts_with(&new),
        "epoch {epoch_after} held by {holder}, the new leader is {new}"
    );
    let summary = s.simulate(
        "STORY_JOB",
        &["--runs", "2", "--partitions", "3", "--chunks", "2"],
    );
    let why = e2e::nifi::what_went_wrong(&summary);
    assert_eq!(
        summary["final_status"]["SUCCESS"], 2,
        "runs after failover: {why}"
    );
    let now = ledger_epoch(&s.ledger_url).await;
    assert_eq!(
        (now.0, now.1.as_str()),
        (epoch_after, holder.as_str()),
        "no other leader wrote meanwhile"
    );

    // 7. helm upgrade to a new image tag, CRDs first as the README says.
    s.node
        .kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &format!("{}/crds/", s.repo.display()),
        ])
        .unwrap();
    s.helm_install("upgrade", &next_tag);
    let images: Vec<String> = s
        .server_pods()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .flat_map(|p| {
            p["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["image"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        !images.is_empty() && images.iter().all(|i| i.ends_with(&format!(":{next_tag}"))),
        "{images:?}"
    );
    let summary = s.simulate(
        "STORY_JOB",
        &["--runs", "1", "--partitions", "2", "--chunks", "2"],
    );
    let why = e2e::nifi::what_went_wrong(&summary);
    assert_eq!(
        summary["final_status"]["SUCCESS"], 1,
        "runs after upgrade: {why}"
    );

    // 8. helm uninstall leaves no LoadJob stuck on its finalizer.
    s.helm(&["uninstall", &s.name, "--wait", "--timeout", "120s"]);
    let job = s.kj(&["get", "loadjob", "story-job"]);
    assert!(
        job["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty()),
        "{job}"
    );
    s.k(&["delete", "loadjob", "story-job", "--timeout=20s"]);
    s.remove().await;
}

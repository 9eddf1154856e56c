//! loadctl as operators run it: the binary against a real api-server on a real PostgreSQL.
mod common;
use common::*;
use serde_json::{Value, json};
use std::process::Command;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn an_on_call_night_with_loadctl() {
    let api = Api::start().await;
    let unknown = api.publish_unknown_run("2026-09-28").await;
    let created = api.post("/v1/runs", json!({"jobKey": "CLI_JOB", "businessKey": "2026-09-29", "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
    let fresh = created["runId"].as_str().unwrap().to_string();

    // What is wrong? The summary lists the PUBLISH_UNKNOWN alert first.
    let (code, out, _) = api.loadctl(OPS, &["summary"]);
    assert_eq!(code, 0);
    let first_alert = out
        .lines()
        .find(|l| l.starts_with("ERROR"))
        .unwrap_or_default();
    assert!(
        first_alert.contains("PUBLISH_UNKNOWN") && first_alert.contains(&unknown),
        "{out}"
    );

    // Runs, as a table and as JSON.
    let (code, out, _) = api.loadctl(NIFI, &["runs", "--status", "PUBLISH_UNKNOWN"]);
    assert_eq!(code, 0);
    assert!(out.lines().next().unwrap().starts_with("RUN ID"), "{out}");
    assert!(out.contains(&unknown) && !out.contains(&fresh), "{out}");
    let (code, out, _) = api.loadctl(NIFI, &["runs", "-o", "json", "--job", "CLI_JOB"]);
    assert_eq!(code, 0);
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);

    // The detail: partitions, dispatches, metrics, events.
    let (code, out, _) = api.loadctl(NIFI, &["run", &unknown]);
    assert_eq!(code, 0);
    for needle in [
        "Status:      PUBLISH_UNKNOWN",
        "0000",
        "VALIDATE_RUN",
        "STAGE_COUNT",
        "PUBLISH_UNKNOWN",
        "RUN_STARTED",
    ] {
        assert!(out.contains(needle), "{needle} missing from:\n{out}");
    }

    // A NiFi token may read but not act: exit 4, "no permission", nothing changed.
    let (code, _, err) = api.loadctl(
        NIFI,
        &[
            "resolve",
            &unknown,
            "--outcome",
            "FAILED_PUBLISH",
            "--reason",
            "checked in Hive",
        ],
    );
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("no permission"), "{err}");
    assert_eq!(api.status(&unknown).await, "PUBLISH_UNKNOWN");

    // A refused action prints the contract's code: exit 3.
    let (code, _, err) = api.loadctl(OPS, &["cancel", &fresh, "--reason", "no"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("(422)"), "{err}");

    // The operator resolves, then cancels the run of the wrong business date.
    let (code, out, _) = api.loadctl(
        OPS,
        &[
            "resolve",
            &unknown,
            "--outcome",
            "FAILED_PUBLISH",
            "--reason",
            "target partition empty in Hive",
        ],
    );
    assert_eq!((code, out.trim()), (0, "run FAILED_PUBLISH: changed"));
    assert_eq!(api.status(&unknown).await, "FAILED_PUBLISH");
    let (code, out, _) = api.loadctl(
        OPS,
        &[
            "resolve",
            &unknown,
            "--outcome",
            "FAILED_PUBLISH",
            "--reason",
            "target partition empty in Hive",
        ],
    );
    assert_eq!(
        (code, out.trim()),
        (0, "run FAILED_PUBLISH: already so; nothing changed")
    );
    let (code, _, _) = api.loadctl(OPS, &["cancel", &fresh, "--reason", "wrong business date"]);
    assert_eq!(code, 0);
    assert_eq!(api.status(&fresh).await, "CANCELLED");
    let (code, _, err) = api.loadctl(OPS, &["run", &Uuid::new_v4().to_string()]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("RUN_NOT_FOUND"), "{err}");

    // A cleanup done by hand is recorded; one that is not due is refused with its code.
    let (code, _, err) = api.loadctl(
        OPS,
        &["cleanup", "record", &unknown, "--dropped-table", "t_x"],
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("CLEANUP_NOT_DUE"), "{err}");
    let (code, out, _) = api.loadctl(OPS, &["cleanup", "candidates"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("RUN ID"), "{out}");

    // Nothing listening: exit 5.
    let out = Command::new(env!("CARGO_BIN_EXE_loadctl"))
        .args(["--server", "http://127.0.0.1:9", "summary"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5));
}

/// The API's place and token from the environment over the configuration file (CONTRACT §10.1),
/// the token one that YAML reads as a number: loadctl sends it as written and is let in.
#[tokio::test(flavor = "multi_thread")]
async fn a_numeric_looking_token_from_the_environment_is_sent_as_written() {
    let api = Api::start().await;
    let file = std::env::temp_dir().join(format!("loadctl-{}.yaml", Uuid::new_v4().simple()));
    std::fs::write(
        &file,
        "monitor:\n  api_url: http://127.0.0.1:9\n  token: from-the-file\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_loadctl"))
        .args(["--config", file.to_str().unwrap(), "summary"])
        .env("LCA_MONITOR__API_URL", &api.base)
        .env("LCA_MONITOR__TOKEN", NUMERIC_OPS)
        .env_remove("LOADCTL_SERVER")
        .env_remove("LOADCTL_TOKEN")
        .env_remove("LOADCTL_OPERATOR_TOKEN")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(!stdout.trim().is_empty(), "the summary is shown: {stderr}");
}

/// Issue 42 item 3: as the kubectl plugin, $LOADCTL_SERVER (which the runbook exports for
/// `loadctl`) does not switch `runs` silently to the HTTP API: it still works through Kubernetes
/// (here a kubeconfig that does not exist, so the error names Kubernetes, not the URL) and says so;
/// `--server` on the command line does switch it, and says that too.
#[test]
fn the_plugin_says_which_way_it_works_and_ignores_loadctl_server_for_runs() {
    let dir = std::env::temp_dir().join(format!("loadctl-plugin-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let plugin = dir.join("kubectl-loadctl");
    std::fs::copy(env!("CARGO_BIN_EXE_loadctl"), &plugin).unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(&plugin)
            .args(args)
            .env("LOADCTL_SERVER", "http://127.0.0.1:9")
            .env("KUBECONFIG", dir.join("no-such-kubeconfig"))
            .env_remove("LOADCTL_TOKEN")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let through_kube = run(&["runs"]);
    assert!(
        through_kube.contains("work through Kubernetes")
            && through_kube.contains("http://127.0.0.1:9"),
        "{through_kube}"
    );
    assert!(
        !through_kube.contains("unreachable"),
        "the HTTP API was called: {through_kube}"
    );
    let through_http = run(&["--server", "http://127.0.0.1:9", "runs"]);
    assert!(
        through_http.contains("working through the HTTP API at http://127.0.0.1:9"),
        "{through_http}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// After a NiFi outage every dispatch is DEAD: `resend --all-dead` sends them again in one
/// command, narrowed by job and time, and `--dry-run` lists them without sending.
#[tokio::test(flavor = "multi_thread")]
async fn dead_dispatches_resent_in_bulk() {
    let api = Api::start().await;
    let mut runs = vec![];
    for (job, bk, dead_for) in [
        ("BULK_A", "2026-12-01", "3 hours"),
        ("BULK_A", "2026-12-02", "3 hours"),
        ("BULK_A", "2026-12-03", "10 minutes"),
        ("BULK_B", "2026-12-03", "10 minutes"),
    ] {
        let run = api.extracted_run(job, bk).await;
        let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&api.db.url)
            .await
            .unwrap();
        // What the dispatcher leaves after its last attempt failed.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE nifi_ops.load_dispatch SET status = 'DEAD', attempt_count = 20, \
                    last_error = 'HTTP 503 from PG-05', next_attempt_at = now() - interval '{dead_for}' \
              WHERE run_id = $1::uuid"
        )))
        .bind(&run)
        .execute(&mut c)
        .await
        .unwrap();
        runs.push(run);
    }
    let statuses = || async {
        let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&api.db.url)
            .await
            .unwrap();
        let mut out = vec![];
        for run in &runs {
            let (st,): (String,) =
                sqlx::query_as("SELECT status FROM nifi_ops.load_dispatch WHERE run_id = $1::uuid")
                    .bind(run)
                    .fetch_one(&mut c)
                    .await
                    .unwrap();
            out.push(st);
        }
        out
    };

    // A dry run of the last hour's BULK_A: the one, listed; nothing sent.
    let (code, out, err) = api.loadctl(
        OPS,
        &[
            "resend",
            "--all-dead",
            "--job",
            "BULK_A",
            "--since",
            "1h",
            "--dry-run",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&runs[2]) && !out.contains(&runs[0]) && !out.contains(&runs[3]),
        "{out}"
    );
    assert!(
        out.contains("1 would be sent again (dry run: nothing sent)"),
        "{out}"
    );
    assert_eq!(statuses().await, ["DEAD", "DEAD", "DEAD", "DEAD"]);

    // A NiFi token may read but not act: exit 4 at the first resend, nothing sent.
    let (code, _, err) = api.loadctl(NIFI, &["resend", "--all-dead"]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("no permission"), "{err}");
    assert_eq!(statuses().await, ["DEAD", "DEAD", "DEAD", "DEAD"]);

    // Every BULK_A one.
    let (code, out, err) = api.loadctl(OPS, &["resend", "--all-dead", "--job", "BULK_A"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("3 matched: 3 resent, 0 refused, 0 failed"),
        "{out}"
    );
    assert_eq!(statuses().await, ["PENDING", "PENDING", "PENDING", "DEAD"]);

    // The rest, as JSON.
    let (code, out, err) = api.loadctl(OPS, &["resend", "--all-dead", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (r["matched"].clone(), r["resent"].clone()),
        (json!(1), json!(1)),
        "{r}"
    );
    assert_eq!(r["dispatches"][0]["runId"], runs[3].as_str());
    assert_eq!(statuses().await, ["PENDING"; 4]);

    // Nothing left.
    let (code, out, _) = api.loadctl(OPS, &["resend", "--all-dead"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("no DEAD dispatch matches"), "{out}");

    // Usage mistakes: exit 2, saying what is wrong.
    for (args, says) in [
        (&["resend"][..], "required"),
        (
            &["resend", "--all-dead", "--since", "yesterday"][..],
            "--since",
        ),
        (&["resend", "--job", "BULK_A"][..], "--all-dead"),
    ] {
        let (code, _, err) = api.loadctl(OPS, args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

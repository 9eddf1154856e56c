//! loadctl as operators run it: the binary against a real api-server on a real PostgreSQL.
use load_control_api::auth::sha256_hex;
use load_control_api::config::{Config, TokenEntry};
use serde_json::{Value, json};
use std::process::Command;
use uuid::Uuid;

const NIFI: &str = "cli-nifi-token";
const OPS: &str = "cli-operator-token";

struct Api {
    base: String,
    http: reqwest::Client,
    db: testkit::TestDb,
}

impl Api {
    async fn start() -> Api {
        testkit::install_crypto();
        let db = testkit::TestDb::fresh().await;
        let mut config = Config::default();
        config.database.url = Some(db.url.clone());
        config.logging.access_log = false;
        config.auth.tokens = vec![
            TokenEntry {
                name: "nifi".into(),
                role: "nifi".into(),
                sha256: sha256_hex(NIFI),
            },
            TokenEntry {
                name: "oncall".into(),
                role: "operator".into(),
                sha256: sha256_hex(OPS),
            },
        ];
        let ledger = load_control_api::server::connect_ledger(&config)
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(load_control_api::server::serve(
            config,
            ledger,
            listener,
            std::future::pending(),
        ));
        Api {
            base,
            http: reqwest::Client::new(),
            db,
        }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(NIFI)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.unwrap()
    }

    async fn status(&self, run: &str) -> String {
        let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&self.db.url)
            .await
            .unwrap();
        let (s,): (String,) =
            sqlx::query_as("SELECT status FROM nifi_ops.load_run WHERE run_id = $1::uuid")
                .bind(run)
                .fetch_one(&mut c)
                .await
                .unwrap();
        let _ = sqlx::Connection::close(c).await;
        s
    }

    /// A run walked by hand to PUBLISH_UNKNOWN.
    async fn publish_unknown_run(&self, bk: &str) -> String {
        let created = self.post("/v1/runs", json!({"jobKey": "CLI_JOB", "businessKey": bk, "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
        let run = created["runId"].as_str().unwrap().to_string();
        self.post(&format!("/v1/runs/{run}/manifest"), json!({"snapshotScn": "1", "sourceCount": "5", "plannedPartitionCount": "1",
            "partitions": [{"partitionId": "0000", "lowerBound": "0", "upperBound": "9", "upperInclusive": "true", "expectedRowCount": "5"}]})).await;
        let token = Uuid::new_v4();
        self.post(
            &format!("/v1/runs/{run}/partitions/0000/claim"),
            json!({"claimToken": token, "workerNode": "n1"}),
        )
        .await;
        self.post(&format!("/v1/runs/{run}/partitions/0000/chunks"), json!({"claimToken": token, "chunkIndex": 0, "chunkCount": 1,
            "hdfsPath": format!("{}/p/0.parquet", created["hdfsRunPath"].as_str().unwrap()), "recordCount": 5})).await;
        let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&self.db.url)
            .await
            .unwrap();
        let (dispatch,): (Uuid,) = sqlx::query_as(
            "SELECT dispatch_id FROM nifi_ops.load_dispatch WHERE run_id = $1::uuid",
        )
        .bind(&run)
        .fetch_one(&mut c)
        .await
        .unwrap();
        self.post(
            &format!("/v1/runs/{run}/validation/start"),
            json!({"dispatchId": dispatch}),
        )
        .await;
        self.post(&format!("/v1/runs/{run}/validations"), json!({"stage": "STAGING", "metrics": [{"metricName": "STAGE_COUNT", "actualValue": "5", "result": "PASS"}]})).await;
        self.post(&format!("/v1/runs/{run}/stage-validated"), json!({}))
            .await;
        let publish = Uuid::new_v4();
        self.post(
            &format!("/v1/runs/{run}/publish/claim"),
            json!({"publishToken": publish}),
        )
        .await;
        self.post(&format!("/v1/runs/{run}/publish/result"), json!({"publishToken": publish, "outcome": "PUBLISH_UNKNOWN", "message": "connection lost"})).await;
        run
    }

    /// Runs loadctl; (exit code, stdout, stderr).
    fn loadctl(&self, token: &str, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_loadctl"))
            .args(["--server", &self.base, "--token", token])
            .args(args)
            .env_remove("LCA_CONFIG")
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

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

    // Nothing listening: exit 5.
    let out = Command::new(env!("CARGO_BIN_EXE_loadctl"))
        .args(["--server", "http://127.0.0.1:9", "summary"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5));
}

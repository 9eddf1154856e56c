//! A real api-server on a real PostgreSQL for loadctl's tests, and a run walked to PUBLISH_UNKNOWN.
#![allow(dead_code)]
use load_control_api::auth::sha256_hex;
use load_control_api::config::{Config, TokenEntry};
use serde_json::{Value, json};
use std::process::Command;
use uuid::Uuid;

pub const NIFI: &str = "cli-nifi-token";
pub const OPS: &str = "cli-operator-token";
/// An operator token that YAML would read as a number (one from `LCA_MONITOR__TOKEN` is taken as
/// written).
pub const NUMERIC_OPS: &str = "20261203123456";

pub struct Api {
    pub base: String,
    http: reqwest::Client,
    pub db: testkit::TestDb,
}

impl Api {
    pub async fn start() -> Api {
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
            TokenEntry {
                name: "oncall-numeric".into(),
                role: "operator".into(),
                sha256: sha256_hex(NUMERIC_OPS),
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

    pub async fn post(&self, path: &str, body: Value) -> Value {
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

    pub async fn status(&self, run: &str) -> String {
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

    /// A run of `job` walked by hand to EXTRACTED_VALIDATED: its VALIDATE_RUN dispatch waits.
    pub async fn extracted_run(&self, job: &str, bk: &str) -> String {
        let created = self.post("/v1/runs", json!({"jobKey": job, "businessKey": bk, "hdfsRoot": "/data", "stageTablePrefix": "t_"})).await;
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
        run
    }

    /// A run walked by hand to PUBLISH_UNKNOWN.
    pub async fn publish_unknown_run(&self, bk: &str) -> String {
        let run = self.extracted_run("CLI_JOB", bk).await;
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
    pub fn loadctl(&self, token: &str, args: &[&str]) -> (i32, String, String) {
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

//! Harness: the real api-server on 127.0.0.1 (random port) over a fresh ledger database.
#![allow(dead_code)]
use load_control_api::auth::sha256_hex;
use load_control_api::config::{Config, TokenEntry};
use load_control_api::server;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgConnection;
use testkit::TestDb;
use uuid::Uuid;

pub const NIFI: &str = "nifi-secret-token";
pub const OPERATOR: &str = "operator-secret-token";

pub struct Api {
    pub base: String,
    pub client: reqwest::Client,
    pub db: TestDb,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Api {
    pub async fn start() -> Api {
        Api::start_with(|_| {}).await
    }

    pub async fn start_with(tune: impl FnOnce(&mut Config)) -> Api {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter("warn")
            .try_init();
        let db = TestDb::fresh().await;
        let mut config = Config::default();
        config.database.url = Some(db.url.clone());
        // Behind a transaction pooler, what keeps session state goes straight to PostgreSQL.
        config.database.listen_dsn = Some(db.direct_url.clone());
        config.database.migration_url = Some(db.direct_url.clone());
        config.database.pool_size = 40;
        config.logging.access_log = false;
        config.auth.tokens = vec![
            TokenEntry {
                name: "nifi-prod".into(),
                role: "nifi".into(),
                sha256: sha256_hex(NIFI),
            },
            TokenEntry {
                name: "alice".into(),
                role: "operator".into(),
                sha256: sha256_hex(OPERATOR),
            },
        ];
        tune(&mut config);
        config.validate().expect("test config is valid");
        let ledger = server::connect_ledger(&config).await.expect("ledger");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(server::serve(
            config,
            ledger,
            listener,
            std::future::pending(),
        ));
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .unwrap();
        Api { base, client, db }
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Reply {
        let mut req = self
            .client
            .request(method.parse().unwrap(), format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await.expect("request sent");
        let status = res.status();
        let headers = res.headers().clone();
        let text = res.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> Reply {
        self.send("POST", path, Some(NIFI), Some(&body)).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send("GET", path, Some(NIFI), None).await
    }

    /// A raw request (for bodies that are not JSON, odd headers, …).
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Reply {
        let mut req = self
            .client
            .request(method.parse().unwrap(), format!("{}{path}", self.base))
            .body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = req.send().await.expect("request sent");
        let status = res.status();
        let headers = res.headers().clone();
        let text = res.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn conn(&self) -> PgConnection {
        self.db.conn().await
    }

    /// `POST /v1/runs` that must succeed; returns the run id.
    pub async fn create_run(&self, job: &str, bk: &str) -> Uuid {
        let r = self
            .post("/v1/runs", json!({"jobKey": job, "businessKey": bk, "hdfsRoot": "/data/stage/", "stageTablePrefix": "tmp_"}))
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        r.body["runId"].as_str().unwrap().parse().unwrap()
    }

    /// A run with `rows[i]` expected rows in partition `000i` (ranges 0..n), registered.
    pub async fn extracting_run(&self, job: &str, bk: &str, rows: &[i64]) -> Uuid {
        let run = self.create_run(job, bk).await;
        let r = self
            .post(&format!("/v1/runs/{run}/manifest"), manifest(rows))
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        run
    }

    pub async fn claim(&self, run: Uuid, pid: &str, token: Uuid) -> Reply {
        self.post(
            &format!("/v1/runs/{run}/partitions/{pid}/claim"),
            json!({"claimToken": token, "workerNode": "nifi-01"}),
        )
        .await
    }

    pub async fn chunk(
        &self,
        run: Uuid,
        pid: &str,
        token: Uuid,
        index: i64,
        count: i64,
        rows: i64,
    ) -> Reply {
        self.post(
            &format!("/v1/runs/{run}/partitions/{pid}/chunks"),
            chunk_body(run, pid, token, index, count, rows),
        )
        .await
    }

    pub async fn run_status(&self, run: Uuid) -> String {
        let (s,): (String,) =
            sqlx::query_as("SELECT status FROM nifi_ops.load_run WHERE run_id = $1")
                .bind(run)
                .fetch_one(&mut self.conn().await)
                .await
                .unwrap();
        s
    }

    pub async fn count(&self, sql: &str, run: Uuid) -> i64 {
        let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_string()))
            .bind(run)
            .fetch_one(&mut self.conn().await)
            .await
            .unwrap();
        n
    }

    pub async fn events(&self, run: Uuid) -> Vec<String> {
        let rows: Vec<(String,)> = sqlx::query_as("SELECT event_name FROM nifi_ops.load_event WHERE run_id = $1 ORDER BY event_time, event_id")
            .bind(run)
            .fetch_all(&mut self.conn().await)
            .await
            .unwrap();
        rows.into_iter().map(|r| r.0).collect()
    }
}

pub fn pid(i: usize) -> String {
    format!("{i:04}")
}

/// A valid manifest: partition i covers [i*1000, (i+1)*1000), the last inclusive.
pub fn manifest(rows: &[i64]) -> Value {
    let n = rows.len();
    let parts: Vec<Value> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            json!({"partitionId": pid(i), "lowerBound": (i * 1000).to_string(), "upperBound": ((i + 1) * 1000).to_string(),
                   "upperInclusive": i + 1 == n, "expectedRowCount": r})
        })
        .collect();
    json!({"snapshotScn": "1234567890", "sourceCount": rows.iter().sum::<i64>(), "sourceMinSplit": "0",
           "sourceMaxSplit": (n * 1000).to_string(), "plannedPartitionCount": n, "partitions": parts})
}

pub fn chunk_body(run: Uuid, pid: &str, token: Uuid, index: i64, count: i64, rows: i64) -> Value {
    json!({"claimToken": token, "chunkIndex": index, "chunkCount": count, "recordCount": rows, "byteCount": 100,
           "hdfsPath": format!("/data/stage/JOB/run_id={run}/p={pid}/part-{index}.parquet")})
}

impl Api {
    pub async fn send_op(&self, path: &str, body: Value) -> Reply {
        self.send("POST", path, Some(OPERATOR), Some(&body)).await
    }

    /// A run whose single partition succeeded: EXTRACTED_VALIDATED with its VALIDATE_RUN dispatch.
    pub async fn validated_run(&self, bk: &str) -> (Uuid, Uuid) {
        let run = self.extracting_run("JOB", bk, &[5]).await;
        let t = Uuid::new_v4();
        self.claim(run, "0000", t).await;
        let r = self.chunk(run, "0000", t, 0, 1, 5).await;
        assert_eq!(r.body["validationScheduled"], true, "{:?}", r.body);
        let (dispatch,): (Uuid,) =
            sqlx::query_as("SELECT dispatch_id FROM nifi_ops.load_dispatch WHERE run_id = $1")
                .bind(run)
                .fetch_one(&mut self.conn().await)
                .await
                .unwrap();
        (run, dispatch)
    }

    pub async fn staging_metrics(&self, run: Uuid, metrics: Value) -> Reply {
        self.post(
            &format!("/v1/runs/{run}/validations"),
            json!({"stage": "STAGING", "metrics": metrics}),
        )
        .await
    }

    /// A run in STAGING_VALIDATED.
    pub async fn stage_validated_run(&self, bk: &str) -> Uuid {
        let (run, dispatch) = self.validated_run(bk).await;
        assert_eq!(
            self.post(
                &format!("/v1/runs/{run}/validation/start"),
                json!({"dispatchId": dispatch})
            )
            .await
            .body["started"],
            true
        );
        self.staging_metrics(
            run,
            json!([{"metricName": "STAGE_COUNT", "actualValue": "5", "result": "PASS"}]),
        )
        .await;
        assert_eq!(
            self.post(&format!("/v1/runs/{run}/stage-validated"), json!({}))
                .await
                .body["stageValidated"],
            true
        );
        run
    }

    /// A run in PUBLISHING, claimed with the returned token.
    pub async fn publishing_run(&self, bk: &str) -> (Uuid, Uuid) {
        let run = self.stage_validated_run(bk).await;
        let token = Uuid::new_v4();
        assert_eq!(
            self.post(
                &format!("/v1/runs/{run}/publish/claim"),
                json!({"publishToken": token})
            )
            .await
            .body["claimed"],
            true
        );
        (run, token)
    }

    pub async fn sql(&self, sql: &str, run: Uuid) {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
            .bind(run)
            .execute(&mut self.conn().await)
            .await
            .unwrap();
    }
}

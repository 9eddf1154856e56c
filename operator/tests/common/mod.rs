//! Harness: a real ledger database, a real HTTP receiver on 127.0.0.1 playing NiFi PG-05, and
//! helpers that drive runs through the ledger's own operations.
#![allow(dead_code)]
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use lcconfig::config::Config;
use lcoperator::dispatcher::{Dispatcher, DispatcherConfig};
use lcoperator::metrics::Metrics;
use ledger::{ChunkReport, Fence, Ledger, LedgerConfig, Manifest, ManifestPartition};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::TestDb;
use tokio::sync::Notify;
use uuid::Uuid;

#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: serde_json::Value,
    pub raw: Vec<u8>,
    pub at: Instant,
}

/// What the receiver answers next: a status, optionally after a delay. The last one repeats.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub delay: Duration,
}

#[derive(Clone, Default)]
pub struct Receiver {
    pub url: String,
    pub received: Arc<Mutex<Vec<Received>>>,
    answers: Arc<Mutex<VecDeque<Answer>>>,
    pub arrived: Arc<Notify>,
}

impl Receiver {
    pub async fn start(answers: &[(u16, u64)]) -> Receiver {
        let r = Receiver {
            url: String::new(),
            received: Default::default(),
            answers: Arc::new(Mutex::new(
                answers
                    .iter()
                    .map(|(s, ms)| Answer {
                        status: *s,
                        delay: Duration::from_millis(*ms),
                    })
                    .collect(),
            )),
            arrived: Arc::new(Notify::new()),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let app = axum::Router::new().fallback(receive).with_state(r.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { url, ..r }
    }

    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    /// Waits until `n` requests arrived (bounded), returning them.
    pub async fn wait_for(&self, n: usize, limit: Duration) -> Vec<Received> {
        let deadline = Instant::now() + limit;
        while self.count() < n && Instant::now() < deadline {
            let _ = tokio::time::timeout(Duration::from_millis(200), self.arrived.notified()).await;
        }
        self.received.lock().unwrap().clone()
    }
}

async fn receive(
    State(r): State<Receiver>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let answer = {
        let mut a = r.answers.lock().unwrap();
        if a.len() > 1 {
            a.pop_front().unwrap()
        } else {
            a.front().cloned().unwrap_or(Answer {
                status: 202,
                delay: Duration::ZERO,
            })
        }
    };
    r.received.lock().unwrap().push(Received {
        path: uri.path().to_string(),
        headers,
        body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        raw: body.to_vec(),
        at: Instant::now(),
    });
    r.arrived.notify_waiters();
    tokio::time::sleep(answer.delay).await;
    (StatusCode::from_u16(answer.status).unwrap(), "echo")
}

pub struct Env {
    pub db: TestDb,
    pub ledger: Ledger,
    pub config: Config,
}

impl Env {
    /// `tune` adjusts the configuration (receiver URL, timeouts, modes) before the ledger opens.
    pub async fn start(tune: impl FnOnce(&mut Config)) -> Env {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter("warn")
            .try_init();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let db = TestDb::fresh().await;
        let mut config = Config::default();
        config.database.url = Some(db.url.clone());
        // Behind a transaction pooler, what keeps session state goes straight to PostgreSQL.
        config.database.listen_dsn = Some(db.direct_url.clone());
        config.database.migration_url = Some(db.direct_url.clone());
        config.nifi.receiver_url = Some("http://127.0.0.1:9".into());
        tune(&mut config);
        let ledger = Ledger::connect(&db.url, 20, 0, config.ledger_config())
            .await
            .unwrap();
        Env { db, ledger, config }
    }

    /// The ledger with a different lease (the config validation would refuse a lease this short).
    pub async fn ledger_with(&self, tune: impl FnOnce(&mut LedgerConfig)) -> Ledger {
        let mut c = self.config.ledger_config();
        tune(&mut c);
        Ledger::connect(&self.db.url, 20, 0, c).await.unwrap()
    }

    pub fn dispatcher(&self, ledger: &Ledger) -> Dispatcher {
        Dispatcher {
            ledger: ledger.clone(),
            client: lcoperator::nifi_tls::NifiClient::load(
                &self.config.nifi,
                Arc::new(Metrics::default()),
            ),
            config: DispatcherConfig {
                listen: self.db.direct_url.clone().into(),
                poll_interval: Duration::from_secs(3600),
                batch: 20,
                signer: self.config.nifi.signer(),
            },
            metrics: Arc::new(Metrics::default()),
            deposed: Default::default(),
        }
    }

    pub async fn fence(&self) -> Fence {
        self.ledger.acquire_epoch("test-leader").await.unwrap()
    }

    pub async fn conn(&self) -> sqlx::PgConnection {
        self.db.conn().await
    }

    pub async fn scalar(&self, sql: &str, id: Uuid) -> i64 {
        let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_string()))
            .bind(id)
            .fetch_one(&mut self.conn().await)
            .await
            .unwrap();
        n
    }

    pub async fn text(&self, sql: &str, id: Uuid) -> Option<String> {
        let (t,): (Option<String>,) = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_string()))
            .bind(id)
            .fetch_one(&mut self.conn().await)
            .await
            .unwrap();
        t
    }

    pub async fn exec(&self, sql: &str, id: Uuid) {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
            .bind(id)
            .execute(&mut self.conn().await)
            .await
            .unwrap();
    }

    pub async fn events(&self, run: Uuid, name: &str) -> i64 {
        self.scalar(&format!("SELECT count(*) FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = '{name}'"), run).await
    }

    /// A registered run with `rows.len()` partitions, each claimed by the returned tokens.
    pub async fn extracting(&self, bk: &str, rows: &[i64]) -> (Uuid, Vec<Uuid>) {
        let run = self
            .ledger
            .create_run(&testkit::new_run(bk))
            .await
            .unwrap()
            .run_id;
        let n = rows.len();
        let partitions = rows
            .iter()
            .enumerate()
            .map(|(i, r)| ManifestPartition {
                partition_id: format!("{i:04}"),
                lower_bound: ledger::Decimal38::parse(&(i * 10).to_string()),
                upper_bound: ledger::Decimal38::parse(&((i + 1) * 10).to_string()),
                lower_text: None,
                upper_text: None,
                upper_inclusive: i + 1 == n,
                is_null_partition: false,
                expected_row_count: *r,
            })
            .collect();
        let m = Manifest {
            snapshot_scn: ledger::Decimal38::parse("777"),
            source_count: rows.iter().sum(),
            source_null_split_count: 0,
            source_min_split: None,
            source_max_split: None,
            planned_partition_count: n as i64,
            source_metrics: vec![],
            source_metrics_version: "v1".into(),
            partitions,
        };
        self.ledger.register_manifest(run, &m).await.unwrap();
        let mut tokens = vec![];
        for i in 0..n {
            let t = Uuid::new_v4();
            assert!(
                self.ledger
                    .claim_partition(run, &format!("{i:04}"), t, "nifi-01")
                    .await
                    .unwrap()
                    .claimed
            );
            tokens.push(t);
        }
        (run, tokens)
    }

    pub async fn chunk(
        &self,
        run: Uuid,
        pid: &str,
        token: Uuid,
        rows: i64,
    ) -> ledger::ChunkOutcome {
        self.ledger
            .report_chunk(
                run,
                pid,
                &ChunkReport {
                    claim_token: token,
                    chunk_index: 0,
                    chunk_count: 1,
                    fragment_identifier: None,
                    hdfs_path: format!("/data/JOB/run_id={run}/p={pid}/part-0.parquet"),
                    record_count: rows,
                    byte_count: None,
                },
            )
            .await
            .unwrap()
    }

    /// A run in EXTRACTED_VALIDATED and its VALIDATE_RUN dispatch id.
    pub async fn validated(&self, bk: &str) -> (Uuid, Uuid) {
        let (run, tokens) = self.extracting(bk, &[3]).await;
        assert!(
            self.chunk(run, "0000", tokens[0], 3)
                .await
                .validation_scheduled
        );
        let (d,): (Uuid,) =
            sqlx::query_as("SELECT dispatch_id FROM nifi_ops.load_dispatch WHERE run_id = $1")
                .bind(run)
                .fetch_one(&mut self.conn().await)
                .await
                .unwrap();
        (run, d)
    }
}

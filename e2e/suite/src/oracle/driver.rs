//! Runs seeded sequences against the real api-server binary and a real PostgreSQL, checking
//! every answer and every ledger row of the sequence's runs against the model after each
//! request, and the row count of every table of the whole ledger.
use super::compare::{Diff, Window, json_diff};
use super::generator::Generator;
use super::model::Model;
use super::ops_run::Ctx;
use super::request::Request;
use super::snapshot;
use chrono::Utc;
use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::{Connection, PgConnection};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const NIFI_TOKEN: &str = "oracle-nifi-token";
pub const OPERATOR_TOKEN: &str = "oracle-operator-token";
pub const NIFI_NAME: &str = "oracle-nifi";
pub const OPERATOR_NAME: &str = "oracle-ops";

/// The api-server binary serving one database on 127.0.0.1.
pub struct Server {
    child: Child,
    pub base: String,
    pub log: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl Server {
    /// Cleanup made observable: runs of the failed class are due at once (`failed_retention`
    /// 0), SUCCESS runs not for days, so both the due and the not-due paths are met.
    pub async fn start(bin: &std::path::Path, db_url: &str) -> anyhow::Result<Server> {
        let port = testkit::free_port();
        let dir = std::env::temp_dir().join(format!("lc-oracle-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "server: {{host: 127.0.0.1, port: {port}, timeout_graceful_shutdown: 1}}\n\
                 database: {{url: \"{db_url}\", pool_size: 4}}\n\
                 auth: {{tokens: [{{name: {NIFI_NAME}, role: nifi, sha256: {}}}, {{name: {OPERATOR_NAME}, role: operator, sha256: {}}}]}}\n\
                 cleanup: {{success_retention: P3D, failed_retention: 0s}}\n\
                 logging: {{format: text, level: WARNING, access_log: false}}\n",
                digest(NIFI_TOKEN),
                digest(OPERATOR_TOKEN)
            ),
        )?;
        // The binary migrates its own (empty) database: its migrations are part of what is
        // checked, and any build can be pointed at (LC_ORACLE_API_BIN).
        let migrated = Command::new(bin)
            .args(["--config", config.to_str().unwrap(), "migrate"])
            .stdout(Stdio::null())
            .status()?;
        anyhow::ensure!(migrated.success(), "{} migrate failed", bin.display());
        let log = dir.join("api.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new(bin)
            .args(["--config", config.to_str().unwrap(), "serve"])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        };
        crate::standalone::wait_http_ok(
            &format!("{}/readyz", server.base),
            Duration::from_secs(30),
        )
        .await?;
        Ok(server)
    }
}

/// What the run checked.
#[derive(Debug, Default)]
pub struct Tally {
    pub sequences: u64,
    pub requests: u64,
    /// Requests checked per operation and answer (`chunks 200 recorded`, `claim 200`, …).
    pub answers: std::collections::BTreeMap<String, u64>,
}

/// The first difference, with everything needed to replay it.
#[derive(Debug)]
pub struct Failure {
    pub seed: u64,
    pub sequence: u64,
    pub request: u64,
    pub log: Vec<String>,
    pub diff: Diff,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let from = self.log.len().saturating_sub(40);
        writeln!(
            f,
            "contract_oracle: seed {} (LC_ORACLE_SEED={}), sequence {}, request #{}:",
            self.seed, self.seed, self.sequence, self.request
        )?;
        writeln!(
            f,
            "  request: {}",
            self.log.last().map(String::as_str).unwrap_or("-")
        )?;
        writeln!(f, "  field:    {}", self.diff.field)?;
        writeln!(f, "  expected: {}", self.diff.expected)?;
        writeln!(f, "  actual:   {}", self.diff.actual)?;
        writeln!(
            f,
            "requests of this sequence (last {}):",
            self.log.len() - from
        )?;
        for line in &self.log[from..] {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

pub struct Driver {
    pub client: reqwest::Client,
    pub base: String,
    pub conn: PgConnection,
    pub seed: u64,
}

impl Driver {
    pub async fn new(base: &str, db_url: &str, seed: u64) -> anyhow::Result<Driver> {
        Ok(Driver {
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
            base: base.into(),
            conn: PgConnection::connect(db_url).await?,
            seed,
        })
    }

    /// Sequences until `deadline` or `max_sequences`; the first difference ends the run.
    pub async fn run(
        &mut self,
        deadline: Instant,
        max_sequences: u64,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        while tally.sequences < max_sequences && Instant::now() < deadline {
            self.sequence(tally.sequences, deadline, tally).await?;
            tally.sequences += 1;
        }
        Ok(())
    }

    async fn sequence(
        &mut self,
        seq: u64,
        deadline: Instant,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        let job = format!("ORACLE_{}_{seq}", self.seed % 1_000_000_007);
        let mut model = Model::new(&job, NIFI_NAME, OPERATOR_NAME);
        let mut generator = Generator::new(self.seed, seq, &job);
        let length = generator.length();
        let mut log = Vec::new();
        let seed = self.seed;
        let fail = |log: &Vec<String>, k: u64, diff: Diff| Failure {
            seed,
            sequence: seq,
            request: k,
            log: log.clone(),
            diff,
        };
        let before = snapshot::read(&mut self.conn, &[], &job)
            .await
            .map_err(|e| fail(&log, 0, Diff::new("ledger read", "readable", e)))?;
        let baseline = before.totals;
        for k in 0..length as u64 {
            if Instant::now() >= deadline {
                break;
            }
            let req = generator.next(&model);
            let outcome = self
                .step(&mut model, &req, seq, k, baseline, &mut log)
                .await;
            tally.requests += 1;
            let answer = outcome.map_err(|d| fail(&log, k, d))?;
            *tally
                .answers
                .entry(format!("{} {answer}", req.op.name()))
                .or_default() += 1;
        }
        Ok(())
    }

    async fn step(
        &mut self,
        model: &mut Model,
        req: &Request,
        seq: u64,
        k: u64,
        baseline: [i64; 6],
        log: &mut Vec<String>,
    ) -> Result<String, Diff> {
        let wire = req.wire(|t| model.run_id(t));
        let request_id = format!("oracle-{}-{seq}-{k}", self.seed);
        let body_text = wire.body.as_ref().map(Value::to_string);
        log.push(format!(
            "#{k} {} {} {} {}",
            wire.method,
            wire.path,
            body_text.as_deref().unwrap_or(""),
            if wire.operator {
                "(operator token)"
            } else {
                ""
            }
        ));
        let mut http = self
            .client
            .request(
                wire.method.parse().unwrap(),
                format!("{}{}", self.base, wire.path),
            )
            .bearer_auth(if wire.operator {
                OPERATOR_TOKEN
            } else {
                NIFI_TOKEN
            })
            .header("X-Request-Id", &request_id);
        if let Some(b) = body_text {
            http = http.header("Content-Type", "application/json").body(b);
        }
        let from = Utc::now();
        let resp = http
            .send()
            .await
            .map_err(|e| Diff::new("HTTP", "an answer", e))?;
        let status = resp.status().as_u16();
        let echoed = resp
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = resp
            .text()
            .await
            .map_err(|e| Diff::new("HTTP body", "a body", e))?;
        let to = Utc::now();
        let actual: Value =
            serde_json::from_str(&text).map_err(|_| Diff::new("body", "JSON", &text))?;
        if echoed.as_deref() != Some(request_id.as_str()) {
            return Err(Diff::new(
                "header X-Request-Id",
                &request_id,
                format!("{echoed:?}"),
            ));
        }
        let ctx = Ctx {
            actual: &actual,
            request_id: &request_id,
            step: k as usize,
        };
        let expected = model.apply(req, &ctx)?;
        if status != expected.status {
            return Err(Diff::new(
                "HTTP status",
                format!("{} {}", expected.status, expected.body),
                format!("{status} {text}"),
            ));
        }
        if let Some(d) = json_diff("$", &expected.body, &actual) {
            return Err(d);
        }
        // §12: an error body's first key is `code`.
        if status >= 400 && !text.starts_with("{\"code\":") {
            return Err(Diff::new("error body (first key)", "{\"code\": …", &text));
        }
        let ids: Vec<uuid::Uuid> = model.runs.iter().map(|r| r.id).collect();
        let snap = snapshot::read(&mut self.conn, &ids, &model.job)
            .await
            .map_err(|e| Diff::new("ledger read", "readable", e))?;
        snapshot::compare(model, &snap, Window { from, to })?;
        let mine = snapshot::model_counts(model);
        for (i, table) in snapshot::TABLES.iter().enumerate() {
            if snap.totals[i] != baseline[i] + mine[i] {
                return Err(Diff::new(
                    format!("{table} (rows in the whole ledger)"),
                    baseline[i] + mine[i],
                    snap.totals[i],
                ));
            }
        }
        Ok(match actual.get("code").and_then(Value::as_str) {
            Some(code) => format!("{status} {code}"),
            None => status.to_string(),
        })
    }
}

/// Seed from `LC_ORACLE_SEED`, else random.
pub fn seed() -> u64 {
    std::env::var("LC_ORACLE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// Wall-time budget from `LC_ORACLE_SECONDS` (default 60 s, the server's start included).
pub fn seconds() -> u64 {
    std::env::var("LC_ORACLE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
}

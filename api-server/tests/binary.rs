//! The `load-control-api` binary's interface: `migrate`, `hash-token`, `serve`, `--help`, and
//! configuration errors that name the key.
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;
use testkit::TestDb;

const BIN: &str = env!("CARGO_BIN_EXE_load-control-api");

/// A configuration file removed when the test is done with it.
struct ConfigFile(std::path::PathBuf);

impl std::ops::Deref for ConfigFile {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn config_file(dir: &std::path::Path, yaml: &str) -> ConfigFile {
    let path = dir.join(format!("config-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(&path, yaml).unwrap();
    ConfigFile(path)
}

#[test]
fn hash_token_prints_the_sha256_of_stdin() {
    let mut child = Command::new(BIN)
        .arg("hash-token")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"secret\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
    );
}

#[test]
fn help_explains_the_subcommands() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for word in ["serve", "migrate", "hash-token", "--config", "LCA_"] {
        assert!(text.contains(word), "--help lacks {word}:\n{text}");
    }
}

#[test]
fn configuration_errors_name_the_key_and_exit_non_zero() {
    let dir = std::env::temp_dir();
    for (yaml, key) in [
        (
            "database: {url: 'postgres://x@127.0.0.1/d'}\nserver: {prot: 1}\n",
            "prot",
        ),
        (
            "database: {url: 'postgres://x@127.0.0.1/d'}\nrecovery: {stale: 10m}\n",
            "recovery.stale",
        ),
        ("server: {port: 8080}\n", "database.url"),
        (
            "database: {url: 'postgres://x@127.0.0.1/d'}\nserver: {ssl_certfile: /c.pem, ssl_keyfile: /k.pem}\n",
            "server.ssl_certfile",
        ),
    ] {
        let path = config_file(&dir, yaml);
        let out = Command::new(BIN)
            .args(["--config", path.to_str().unwrap(), "serve"])
            .env_remove("DATABASE_URL")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains(key), "{key} not named in: {err}");
    }
    // From the environment: the variable is named, and the key; no panic.
    let path = config_file(&dir, "database: {url: 'postgres://x@127.0.0.1/d'}\n");
    for (var, value, key) in [
        ("LCA_SERVER__PORT", "http", "server.port"),
        ("LCA_SERVER__SSL_CLIENT_CERT_REQUIRED", "maybe", "server"),
        ("LCA_DATABASE__POOL_SIZE", "ten", "database.pool_size"),
    ] {
        let out = Command::new(BIN)
            .args(["--config", path.to_str().unwrap(), "serve"])
            .env(var, value)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{var}={value}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(
            err.contains(var) && err.contains(key) && !err.contains("panicked"),
            "{var}={value}: {err}"
        );
    }
    let out = Command::new(BIN)
        .args(["--config", "/nonexistent/config.yaml", "migrate"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("/nonexistent/config.yaml")
    );
}

#[tokio::test]
async fn migrate_twice_at_once_then_serve() {
    let db = TestDb::empty().await;
    let dir = std::env::temp_dir();
    let path = config_file(
        &dir,
        &format!("database:\n  url: {}\nlogging:\n  format: text\n", db.url),
    );
    // Two migrate processes at once, then a third.
    let a = Command::new(BIN)
        .args(["--config", path.to_str().unwrap(), "migrate"])
        .spawn()
        .unwrap();
    let b = Command::new(BIN)
        .args(["--config", path.to_str().unwrap(), "migrate"])
        .spawn()
        .unwrap();
    assert!(a.wait_with_output().unwrap().status.success());
    assert!(b.wait_with_output().unwrap().status.success());
    assert!(
        Command::new(BIN)
            .args(["--config", path.to_str().unwrap(), "migrate"])
            .status()
            .unwrap()
            .success()
    );

    let (mut server, port) = serve(&path, &[], Stdio::null);
    testkit::install_crypto();
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/readyz");
    let mut ready = None;
    for _ in 0..100 {
        if let Ok(r) = client.get(&url).send().await {
            ready = Some(r.status());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ready.map(|s| s.as_u16()), Some(200));
    // No tokens configured: protected calls are refused, never served.
    let r = client
        .get(format!("http://127.0.0.1:{port}/v1/runs"))
        .bearer_auth("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    send_sigterm(server.id());
    let status = server.wait().unwrap();
    assert!(status.success(), "graceful exit on SIGTERM: {status:?}");
}

/// `load-control-api serve` on a free 127.0.0.1 port (graceful shutdown within 2 s); the port.
fn serve(
    config: &std::path::Path,
    extra_env: &[(&str, &str)],
    output: impl Fn() -> Stdio,
) -> (std::process::Child, u16) {
    let port = testkit::free_port();
    let child = Command::new(BIN)
        .args([
            "--config",
            config.to_str().unwrap(),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .env("LCA_SERVER__TIMEOUT_GRACEFUL_SHUTDOWN", "2")
        .envs(extra_env.iter().copied())
        .stdout(output())
        .stderr(output())
        .spawn()
        .unwrap();
    (child, port)
}

/// The binary with one nifi token (`name: nifi-a`), the database of `db` and `more` YAML, its
/// output piped, once it answers `/readyz`; the server and its base URL.
async fn serve_ready(
    db: &TestDb,
    token: &str,
    more: &str,
    extra_env: &[(&str, &str)],
) -> (std::process::Child, String) {
    let digest = load_control_api::auth::sha256_hex(token);
    let path = config_file(
        &std::env::temp_dir(),
        &format!(
            "database:\n  url: {}\nauth:\n  tokens: [{{name: nifi-a, role: nifi, sha256: {digest}}}]\n{more}",
            db.url
        ),
    );
    let (server, port) = serve(&path, extra_env, Stdio::piped);
    testkit::install_crypto();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if client.get(format!("{base}/readyz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (server, base)
}

fn send_sigterm(pid: u32) {
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
}

/// Tokens never reach the logs, whatever the level: the binary at DEBUG with access logs on serves
/// good, unknown and malformed tokens, and its whole output is searched for them.
#[tokio::test]
async fn tokens_never_appear_in_the_logs() {
    let db = TestDb::fresh().await;
    let good = "good-secret-token-4f1c";
    let (server, base) = serve_ready(
        &db,
        good,
        "logging:\n  format: json\n  level: DEBUG\n  access_log: true\n  access_body: false\n",
        &[("RUST_LOG", "trace")],
    )
    .await;
    let client = reqwest::Client::new();
    let unknown = "unknown-secret-token-9a7e";
    let malformed = "Basic bWFsZm9ybWVkLXNlY3JldA==";
    // Refusals are 401 or 403 as §3.6 says; what matters here is what the logs say about them.
    for (auth, want) in [
        (format!("Bearer {good}"), [200, 200]),
        (format!("Bearer {unknown}"), [401, 403]),
        (malformed.to_string(), [401, 403]),
    ] {
        let r = client
            .get(format!("{base}/v1/runs?limit=1"))
            .header("Authorization", &auth)
            .send()
            .await
            .unwrap();
        assert!(
            want.contains(&r.status().as_u16()),
            "{auth}: {}",
            r.status()
        );
    }
    // A token sent where it does not belong (a body field) is not echoed either: bodies are logged
    // only with `logging.access_body` (the default, §9.2), which this site turned off.
    // `the_access_log_names_the_client_and_clips_bodies` covers bodies that are logged.
    let _ = client
        .post(format!("{base}/v1/runs"))
        .bearer_auth(good)
        .header("Content-Type", "application/json")
        .body(format!("{{\"jobKey\":\"{unknown}\"}}"))
        .send()
        .await
        .unwrap();
    send_sigterm(server.id());
    let out = server.wait_with_output().unwrap();
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        logs.contains("api_response"),
        "access logs were written:\n{logs}"
    );
    for secret in [good, unknown, "bWFsZm9ybWVkLXNlY3JldA"] {
        assert!(!logs.contains(secret), "{secret} appears in the logs");
    }
}

/// The access log (§9.2): `api_request` then `api_response` for each request, the client behind
/// a trusted proxy, request and response bodies clipped at `logging.access_body_max`.
#[tokio::test]
async fn the_access_log_names_the_client_and_clips_bodies() {
    let db = TestDb::fresh().await;
    let token = "access-log-token-51ab";
    let (server, base) = serve_ready(
        &db,
        token,
        "server:\n  forwarded_allow_ips: 127.0.0.1\nlogging:\n  format: json\n  access_body_max: 40\n",
        &[],
    )
    .await;
    let client = reqwest::Client::new();
    let body = r#"{"jobKey":"ACCESS_LOG","businessKey":"2026-12-02","hdfsRoot":"/data/access/","stageTablePrefix":"tmp_access_"}"#;
    let created = client
        .post(format!("{base}/v1/runs"))
        .bearer_auth(token)
        .header("X-Forwarded-For", "203.0.113.7")
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 200);
    let answer = created.text().await.unwrap();
    let listed = client
        .get(format!("{base}/v1/runs?limit=1"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    send_sigterm(server.id());
    let out = server.wait_with_output().unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let find = |event: &str, method: &str| {
        lines
            .iter()
            .position(|l| l["event"] == event && l["method"] == method)
            .unwrap_or_else(|| panic!("no {event} for {method} in {lines:#?}"))
    };
    let (request, response) = (find("api_request", "POST"), find("api_response", "POST"));
    assert!(request < response, "api_request comes first");
    let request = &lines[request];
    assert_eq!(
        request["client"], "203.0.113.7",
        "the proxy's X-Forwarded-For is believed"
    );
    assert_eq!(
        request["requestBody"],
        format!("{}...(+{} chars)", &body[..40], body.len() - 40)
    );
    let response = &lines[response];
    let shown: String = answer.chars().take(40).collect();
    assert_eq!(
        response["responseBody"],
        format!("{shown}...(+{} chars)", answer.chars().count() - 40)
    );
    assert_eq!(response["httpStatus"], 200);
    // A GET has no request body to log; its response body is logged.
    let get = &lines[find("api_request", "GET")];
    assert_eq!(get["requestBody"], "");
    assert_eq!(get["query"], "limit=1");
    assert!(
        get["client"].as_str().unwrap().starts_with("127.0.0.1:"),
        "no X-Forwarded-For: the peer itself, {get}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(token),
        "the bearer token is never logged"
    );
}

/// `probe` (the chart's `helm test`): readiness and the document, an authenticated read with the
/// configured token, and a metrics scrape; a wrong token or a URL serving no metrics fails it,
/// naming what failed.
#[tokio::test]
async fn probe_checks_a_token_read_and_metrics_scrapes() {
    let db = TestDb::fresh().await;
    let token = "probe-token-7d2a";
    let digest = load_control_api::auth::sha256_hex(token);
    let path = config_file(
        &std::env::temp_dir(),
        &format!(
            "database:\n  url: {}\nauth:\n  tokens: [{{name: ops, role: operator, sha256: {digest}}}]\nlogging:\n  format: text\n",
            db.url
        ),
    );
    let (mut server, port) = serve(&path, &[], Stdio::null);
    let base = format!("http://127.0.0.1:{port}");
    let probe = |token: &str, metrics: &str| {
        Command::new(BIN)
            .args(["probe", &base, "--timeout", "20", "--metrics", metrics])
            .env("LC_PROBE_TOKEN", token)
            .output()
            .unwrap()
    };
    let ok = probe(token, &format!("{base}/metrics"));
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        out.contains("the token reads") && out.contains("/metrics scraped"),
        "{out}"
    );
    let wrong = Command::new(BIN)
        .args(["probe", &base, "--timeout", "1"])
        .env("LC_PROBE_TOKEN", "not-the-token")
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    let why = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        why.contains("/v1/monitor/summary with the token answered 40"),
        "{why}"
    );
    let no_metrics = Command::new(BIN)
        .args([
            "probe",
            &base,
            "--timeout",
            "1",
            "--metrics",
            &format!("{base}/openapi.json"),
        ])
        .output()
        .unwrap();
    assert!(!no_metrics.status.success());
    assert!(String::from_utf8_lossy(&no_metrics.stderr).contains("without lca_ series"));
    send_sigterm(server.id());
    server.wait().unwrap();
}

/// `logging.file` (CONTRACT §10.2) on the real binary: `{service}` is `server`, the file has its
/// own format (JSON here, text on stdout being off), it is rotated by `max_bytes` keeping
/// `backup_count` files, and `stdout: false` leaves standard output empty. A site that collects
/// the file sees every access-log line.
#[tokio::test]
async fn the_log_file_is_written_rotated_and_stdout_can_be_off() {
    let db = TestDb::fresh().await;
    let dir = std::env::temp_dir().join(format!("lc-logs-{}", uuid::Uuid::new_v4().simple()));
    let path = config_file(
        &std::env::temp_dir(),
        &format!(
            "database:\n  url: {}\nlogging:\n  stdout: false\n  access_log: true\n  file: {{path: '{}/{{service}}.log', format: json, max_bytes: 4096, backup_count: 2}}\n",
            db.url,
            dir.display()
        ),
    );
    let (mut server, port) = serve(&path, &[], Stdio::piped);
    testkit::install_crypto();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if client.get(format!("{base}/healthz")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each refused call writes one access-log line of about 400 bytes: 60 of them fill more
    // than the three files allowed.
    for n in 0..60 {
        let r = client
            .get(format!("{base}/v1/runs?limit=1&n={n}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }
    send_sigterm(server.id());
    let out = server.wait_with_output_now();
    let current = std::fs::read_to_string(dir.join("server.log")).expect("server.log written");
    let rotated: Vec<String> = (1..=3)
        .filter_map(|i| std::fs::read_to_string(dir.join(format!("server.log.{i}"))).ok())
        .collect();
    assert_eq!(
        rotated.len(),
        2,
        "backup_count 2 keeps server.log.1 and .2 only"
    );
    for text in std::iter::once(&current).chain(&rotated) {
        assert!(
            text.len() <= 4096 + 1024,
            "rotated near max_bytes: {}",
            text.len()
        );
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("the file's format is JSON ({e}): {line}"));
            assert!(v["event"].is_string(), "{line}");
        }
    }
    assert!(
        current.contains("api_response") || rotated.iter().any(|t| t.contains("api_response")),
        "the access log reaches the file"
    );
    assert!(
        out.is_empty(),
        "stdout: false writes nothing to stdout: {out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An unwritable `logging.file.path` stops the start with a message naming the key.
#[test]
fn an_unwritable_log_file_names_the_key() {
    let path = config_file(
        &std::env::temp_dir(),
        "database:\n  url: 'postgres://x@127.0.0.1:1/d'\nlogging:\n  file: {path: '/proc/lc-no/{service}.log'}\n",
    );
    let out = Command::new(BIN)
        .args(["--config", path.to_str().unwrap(), "serve"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("logging.file.path"), "{err}");
}

trait WaitOutput {
    fn wait_with_output_now(&mut self) -> String;
}

impl WaitOutput for std::process::Child {
    /// Waits for the exit and returns what was written to stdout.
    fn wait_with_output_now(&mut self) -> String {
        use std::io::Read;
        let _ = self.wait();
        let mut s = String::new();
        if let Some(mut o) = self.stdout.take() {
            let _ = o.read_to_string(&mut s);
        }
        s
    }
}

/// One request to the binary under test: status and JSON body (Null when not JSON).
async fn call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    token: &str,
    body: Option<String>,
) -> (u16, serde_json::Value) {
    let mut req = client.request(method, url).bearer_auth(token);
    if let Some(body) = body {
        req = req.header("Content-Type", "application/json").body(body);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// Drives whole run lifecycles through `base` (create, manifest, claims, chunks, validation,
/// publish, success; a PUBLISH_UNKNOWN resolved; refusals with stale and foreign tokens, a
/// malformed and a form-encoded body carrying a token, the run's events and detail read back)
/// and returns every secret it issued or sent.
async fn lifecycles_with_every_token(
    base: &str,
    db: &TestDb,
    nifi: &str,
    operator: &str,
    planted: &[&str],
) -> Vec<String> {
    use reqwest::Method;
    use serde_json::json;
    let client = reqwest::Client::new();
    let mut secrets: Vec<String> = vec![nifi.into(), operator.into()];
    secrets.extend(planted.iter().map(|s| s.to_string()));
    let post = |path: String, body: serde_json::Value, token: &'static str| {
        let client = client.clone();
        let url = format!("{base}{path}");
        let token = if token == "nifi" { nifi } else { operator }.to_string();
        async move { call(&client, Method::POST, url, &token, Some(body.to_string())).await }
    };
    let get = |path: String| {
        let client = client.clone();
        let url = format!("{base}{path}");
        let token = operator.to_string();
        async move { call(&client, Method::GET, url, &token, None).await }
    };
    for (bk, outcome) in [
        ("2026-12-01", "PUBLISHED"),
        ("2026-12-02", "PUBLISH_UNKNOWN"),
    ] {
        let (s, run) = post(
            "/v1/runs".into(),
            json!({"jobKey": "LOG_AUDIT", "businessKey": bk, "hdfsRoot": "/data/audit", "stageTablePrefix": "tmp_"}),
            "nifi",
        )
        .await;
        assert_eq!(s, 200, "{run}");
        let run = run["runId"].as_str().unwrap().to_string();
        let manifest = json!({"snapshotScn": "77", "sourceCount": 7, "sourceMinSplit": "0", "sourceMaxSplit": "2000",
            "plannedPartitionCount": 2, "partitions": [
                {"partitionId": "0000", "lowerBound": "0", "upperBound": "1000", "expectedRowCount": 3},
                {"partitionId": "0001", "lowerBound": "1000", "upperBound": "2000", "upperInclusive": true, "expectedRowCount": 4}]});
        assert_eq!(
            post(format!("/v1/runs/{run}/manifest"), manifest, "nifi")
                .await
                .0,
            200
        );
        for (pid, rows) in [("0000", 3), ("0001", 4)] {
            let (token, rival) = (
                uuid::Uuid::new_v4().to_string(),
                uuid::Uuid::new_v4().to_string(),
            );
            secrets.extend([token.clone(), rival.clone()]);
            let claim = format!("/v1/runs/{run}/partitions/{pid}/claim");
            let (s, b) = post(
                claim.clone(),
                json!({"claimToken": token, "workerNode": "n1"}),
                "nifi",
            )
            .await;
            assert_eq!((s, &b["claimed"]), (200, &json!(true)), "{b}");
            let (_, b) = post(
                claim,
                json!({"claim_token": rival, "workerNode": "n2"}),
                "nifi",
            )
            .await;
            assert_eq!(b["claimed"], false);
            let chunks = format!("/v1/runs/{run}/partitions/{pid}/chunks");
            let chunk = |token: &str, index: i64| {
                json!({"claimToken": token, "chunkIndex": index, "chunkCount": 2, "recordCount": if index == 0 { 1 } else { rows - 1 },
                       "hdfsPath": format!("/data/audit/LOG_AUDIT/run_id={run}/p={pid}/part-{index}.parquet")})
            };
            assert_eq!(post(chunks.clone(), chunk(&rival, 0), "nifi").await.0, 409);
            assert_eq!(post(chunks.clone(), chunk(&token, 0), "nifi").await.0, 200);
            assert_eq!(post(chunks.clone(), chunk(&token, 1), "nifi").await.0, 200);
            // A malformed body and a form-encoded one, each carrying a token: refused, and logged.
            let r = client
                .post(format!("{base}{chunks}"))
                .bearer_auth(nifi)
                .header("Content-Type", "application/json")
                .body(format!("{{\"claimToken\": \"{token}\", \"chunkIndex\": "))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 422);
            let r = client
                .post(format!("{base}{chunks}"))
                .bearer_auth(nifi)
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(format!("claimToken={token}&chunkIndex=0"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 422);
        }
        let (dispatch,): (uuid::Uuid,) = sqlx::query_as(
            "SELECT dispatch_id FROM nifi_ops.load_dispatch WHERE run_id = $1::uuid",
        )
        .bind(&run)
        .fetch_one(&mut db.conn().await)
        .await
        .unwrap();
        let (_, b) = post(
            format!("/v1/runs/{run}/validation/start"),
            json!({"dispatchId": dispatch}),
            "nifi",
        )
        .await;
        assert_eq!(b["started"], true, "{b}");
        let metrics = |stage: &str| json!({"stage": stage, "metrics": [{"metricName": format!("{stage}_COUNT"), "actualValue": "7", "result": "PASS"}]});
        assert_eq!(
            post(
                format!("/v1/runs/{run}/validations"),
                metrics("STAGING"),
                "nifi"
            )
            .await
            .0,
            200
        );
        assert_eq!(
            post(format!("/v1/runs/{run}/stage-validated"), json!({}), "nifi")
                .await
                .0,
            200
        );
        let (publish, stranger) = (
            uuid::Uuid::new_v4().to_string(),
            uuid::Uuid::new_v4().to_string(),
        );
        secrets.extend([publish.clone(), stranger.clone()]);
        let (_, b) = post(
            format!("/v1/runs/{run}/publish/claim"),
            json!({"publishToken": publish}),
            "nifi",
        )
        .await;
        assert_eq!(b["claimed"], true, "{b}");
        let result = |token: &str| json!({"publishToken": token, "outcome": outcome});
        assert_eq!(
            post(
                format!("/v1/runs/{run}/publish/result"),
                result(&stranger),
                "nifi"
            )
            .await
            .0,
            409
        );
        assert_eq!(
            post(
                format!("/v1/runs/{run}/publish/result"),
                result(&publish),
                "nifi"
            )
            .await
            .0,
            200
        );
        if outcome == "PUBLISHED" {
            assert_eq!(
                post(
                    format!("/v1/runs/{run}/validations"),
                    metrics("TARGET"),
                    "nifi"
                )
                .await
                .0,
                200
            );
            let (_, b) = post(format!("/v1/runs/{run}/success"), json!({}), "nifi").await;
            assert_eq!(b["success"], true, "{b}");
        } else {
            let (s, b) = post(
                format!("/v1/runs/{run}/publish-unknown/resolve"),
                json!({"resolution": "FAILED_PUBLISH", "reason": "checked in Hive: not written"}),
                "operator",
            )
            .await;
            assert_eq!(s, 200, "{b}");
        }
        // The events carry the publish token in PUBLISH_STARTED's details (§8): read back, logged.
        let (s, events) = get(format!("/v1/runs/{run}/events")).await;
        assert_eq!(s, 200);
        assert!(
            events.to_string().contains(&publish),
            "the events hold the token: {events}"
        );
        assert_eq!(get(format!("/v1/runs/{run}")).await.0, 200);
        assert_eq!(
            get(format!("/v1/runs?limit=5&claimToken={publish}"))
                .await
                .0,
            200
        );
    }
    // A known secret sent where it does not belong: the body is logged, the secret is not.
    for planted in planted {
        let (s, _) = post("/v1/runs".into(), json!({"jobKey": planted}), "nifi").await;
        assert_eq!(s, 422);
    }
    // Refused bearer tokens.
    for refused in [
        "unknown-bearer-token-7b1d",
        "Basic bWFsZm9ybWVkLXNlY3JldA==",
    ] {
        secrets.push(refused.into());
        let r = client
            .get(format!("{base}/v1/runs"))
            .header("Authorization", format!("Bearer {refused}"))
            .send()
            .await
            .unwrap();
        assert!(matches!(r.status().as_u16(), 401 | 403));
    }
    secrets
}

/// §9.2: no token, signing secret or database password in any log line. Whole lifecycles run
/// against the binary with access bodies on (the default) in every log format and output, and
/// every secret issued or sent is searched for in everything written: whole, and its first 8
/// characters (a clipped body must not show part of a token either).
#[tokio::test]
async fn no_secret_reaches_any_log_output() {
    let dir = std::env::temp_dir().join(format!("lc-log-audit-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("{service}.log");
    let file = file.to_str().unwrap();
    let outputs = [
        (
            "json",
            "logging:\n  format: json\n  level: DEBUG\n".to_string(),
        ),
        ("text", "logging:\n  format: text\n".to_string()),
        ("console", "logging:\n  format: console\n".to_string()),
        (
            "clipped json",
            "logging:\n  format: json\n  access_body_max: 24\n".to_string(),
        ),
        (
            "json file",
            format!("logging:\n  stdout: false\n  file: {{path: '{file}', format: json}}\n"),
        ),
        (
            "text file",
            format!("logging:\n  stdout: false\n  file: {{path: '{file}', format: text}}\n"),
        ),
    ];
    for (name, logging) in outputs {
        let _ = std::fs::remove_file(dir.join("server.log"));
        let db = TestDb::fresh().await;
        let (nifi, operator) = ("nifi-bearer-3c9e1f", "operator-bearer-8d2b7a");
        let (signing, password, monitor) = (
            "signing-secret-5e0c4b",
            "pg-password-1a7f3d",
            "monitor-token-4b8e2c",
        );
        // Trust authentication: the password is sent nowhere, but it is in the configuration.
        let url = db
            .url
            .replacen("postgres@", &format!("postgres:{password}@"), 1);
        assert_ne!(
            url, db.url,
            "the test database URL has a user to add a password to"
        );
        let yaml = format!(
            "database:\n  url: '{url}'\nnifi:\n  signing_secret: {signing}\nmonitor:\n  token: {monitor}\n\
             auth:\n  tokens: [{{name: nifi-a, role: nifi, sha256: {}}}, {{name: ops, role: operator, sha256: {}}}]\n{logging}",
            load_control_api::auth::sha256_hex(nifi),
            load_control_api::auth::sha256_hex(operator),
        );
        let config = config_file(&dir, &yaml);
        // Output to a file, not a pipe: at DEBUG a whole lifecycle writes more than a pipe holds.
        let output = dir.join("stdout.log");
        std::fs::File::create(&output).unwrap();
        let out = || {
            Stdio::from(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&output)
                    .unwrap(),
            )
        };
        let (mut server, port) = serve(&config, &[], out);
        let base = format!("http://127.0.0.1:{port}");
        testkit::install_crypto();
        let client = reqwest::Client::new();
        for _ in 0..100 {
            if client
                .get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let secrets =
            lifecycles_with_every_token(&base, &db, nifi, operator, &[signing, password, monitor])
                .await;
        send_sigterm(server.id());
        server.wait().unwrap();
        let logs = format!(
            "{}{}",
            std::fs::read_to_string(&output).unwrap_or_default(),
            std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
        );
        // What is searched must have been written: the bodies that carried the tokens.
        assert!(
            logs.contains("api_request")
                && logs.contains("claimToken")
                && logs.contains("publishToken"),
            "{name}: the access log shows the bodies:\n{logs}"
        );
        assert!(
            logs.contains("***"),
            "{name}: masked values are shown as ***"
        );
        for secret in &secrets {
            // A claim or publish token (a UUID) must not show even in part.
            let part = if uuid::Uuid::parse_str(secret).is_ok() {
                &secret[..8]
            } else {
                secret.as_str()
            };
            for needle in [secret.as_str(), part] {
                if let Some(at) = logs.find(needle) {
                    let line = logs[..at].rfind('\n').map_or(0, |n| n + 1);
                    let end = logs[at..].find('\n').map_or(logs.len(), |n| at + n);
                    panic!(
                        "{name}: {needle:?} (of {secret}) is in the logs:\n{}",
                        &logs[line..end]
                    );
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 27 item 1: against a ledger whose schema version is newer than this binary supports, the
/// server starts but is never ready, refuses writes with a 503 and writes nothing; the log (at
/// start and at each probe) and `migrate` name both versions and what to do.
#[tokio::test]
async fn a_schema_newer_than_supported_is_not_served_and_said_so() {
    let db = TestDb::fresh().await;
    let newer = *ledger::SUPPORTED_SCHEMA.end() + 1;
    let mut conn = db.conn().await;
    sqlx::query("UPDATE nifi_ops.schema_version SET version = $1")
        .bind(newer)
        .execute(&mut conn)
        .await
        .unwrap();
    let token = "schema-test-token";
    let (server, base) = serve_ready(&db, token, "logging:\n  format: text\n", &[]).await;
    let client = reqwest::Client::new();
    let ready = client.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    assert_eq!(
        ready.json::<serde_json::Value>().await.unwrap(),
        serde_json::json!({"status": "unavailable"}),
        "the body is the contract's (§4.23): the cause is logged"
    );
    let created = client
        .post(format!("{base}/v1/runs"))
        .bearer_auth(token)
        .json(&serde_json::json!({"jobKey": "J", "businessKey": "b", "hdfsRoot": "/data", "stageTablePrefix": "tmp_"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 503);
    let body: serde_json::Value = created.json().await.unwrap();
    assert_eq!(body["code"], "DATABASE_UNAVAILABLE", "{body}");
    let metrics = client
        .get(format!("{base}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "lca_unavailable_total{code=\"DATABASE_UNAVAILABLE\"} 1"),
        "{metrics}"
    );
    let (runs,): (i64,) = sqlx::query_as("SELECT count(*) FROM nifi_ops.load_run")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(runs, 0, "nothing was written");

    let path = config_file(
        &std::env::temp_dir(),
        &format!("database:\n  url: {}\nlogging:\n  format: text\n", db.url),
    );
    let migrate = Command::new(BIN)
        .args(["--config", path.to_str().unwrap(), "migrate"])
        .output()
        .unwrap();
    assert!(!migrate.status.success(), "migrate refuses a newer schema");
    let said = String::from_utf8_lossy(&migrate.stderr);
    let why = format!(
        "database schema version {newer} is newer than this binary (load-control {}) supports (≤{})",
        env!("CARGO_PKG_VERSION"),
        newer - 1
    );
    assert!(
        said.contains(&why) && said.contains("roll forward"),
        "{said}"
    );

    send_sigterm(server.id());
    let out = server.wait_with_output().unwrap();
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // At start, at each probe, and for the refused write.
    for (event, what) in [
        ("schema_unsupported", "not ready, and it writes nothing"),
        ("readyz_failed", "readiness check failed"),
        ("schema_unsupported", "write refused"),
    ] {
        assert!(
            logs.lines()
                .any(|l| l.contains(event) && l.contains(what) && l.contains(&why)),
            "{event} ({what}) names both versions:\n{logs}"
        );
    }
}

/// Issue 27 item 5: the api-server of a release that is refused the ledger (another installation
/// holds a fresh claim on it) is not ready, so it leaves its Service as its operator does and NiFi
/// writes only through the release that owns the ledger. Its own installation's claim, no
/// installation configured, or a claim gone stale: ready, the last without a restart.
#[tokio::test]
async fn the_api_of_a_release_refused_the_ledger_is_not_ready() {
    let db = TestDb::fresh().await;
    let owner = db
        .ledger(2, ledger::LedgerConfig::default())
        .await
        .with_installation("lc/a-leader", Duration::from_secs(3600));
    let fence = owner.acquire_epoch("pod-a").await.unwrap();
    let client = reqwest::Client::new();
    let ready = |base: String| {
        let client = client.clone();
        async move {
            client
                .get(format!("{base}/readyz"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    for (installation, want) in [
        (Some("lc/b-leader"), 503),
        (Some("lc/a-leader"), 200),
        (None, 200),
    ] {
        let env: Vec<(&str, &str)> = installation
            .map(|i| vec![("LC_INSTALLATION", i)])
            .unwrap_or_default();
        let (mut server, base) = serve_ready(&db, "t-owner", "", &env).await;
        let got = ready(base).await;
        let _ = server.kill();
        let _ = server.wait();
        assert_eq!(got, want, "installation {installation:?}");
    }

    // The owner's leader gone: its claim, refreshed one last time once the server runs, goes
    // stale 5 s later.
    let (mut server, base) = serve_ready(
        &db,
        "t-owner",
        "",
        &[
            ("LC_INSTALLATION", "lc/b-leader"),
            ("LC_LEDGER_OWNER_STALE", "5"),
        ],
    )
    .await;
    owner.refresh_owner(&fence).await.unwrap();
    let first = ready(base.clone()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut now = first;
    while now != 200 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        now = ready(base.clone()).await;
    }
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!((first, now), (503, 200));
}

/// Reads one HTTP/1.1 response (head and a Content-Length body) from `conn`; None at end of
/// stream or on a reset before a whole response arrived.
async fn read_response(conn: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    loop {
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if body.len() >= length {
                return Some(text);
            }
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(Duration::from_secs(10), conn.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => panic!("no answer within 10 s: {text:?}"),
        }
    }
}

/// Issue 27 item 7: at SIGTERM a kept-alive connection is not closed under its client (a pooled
/// NiFi connection to a pod being drained). A request sent on it after the signal, once the
/// listener is closed, is answered, with `Connection: close`; then the connection ends and the
/// process exits, without waiting out its drain window.
#[tokio::test]
async fn a_kept_alive_connection_is_answered_while_the_server_drains() {
    use tokio::io::AsyncWriteExt;
    let db = TestDb::fresh().await;
    let (mut server, base) = serve_ready(&db, "drain-token", "", &[]).await;
    let addr = base.strip_prefix("http://").unwrap().to_string();
    let request = b"GET /healthz HTTP/1.1\r\nHost: lca\r\n\r\n";
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    conn.write_all(request).await.unwrap();
    let first = read_response(&mut conn).await.expect("an answer");
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        !first.to_ascii_lowercase().contains("connection: close"),
        "{first}"
    );

    let signalled = std::time::Instant::now();
    send_sigterm(server.id());
    // The listener closed: the server has begun to shut down.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(&addr).await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "still accepting 10 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    conn.write_all(request).await.unwrap();
    let second = read_response(&mut conn)
        .await
        .expect("the kept-alive connection was closed under its client at shutdown");
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    assert!(
        second.to_ascii_lowercase().contains("connection: close"),
        "{second}"
    );
    assert_eq!(
        read_response(&mut conn).await,
        None,
        "the connection ends after it"
    );
    let status = tokio::task::spawn_blocking(move || server.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "graceful exit on SIGTERM: {status:?}");
    assert!(
        signalled.elapsed() < load_control_api::edge::DRAIN_WINDOW,
        "the exit waited out the drain window with no connection left: {:?}",
        signalled.elapsed()
    );
}

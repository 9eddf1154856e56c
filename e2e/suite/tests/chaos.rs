//! The fault-injection suite (issue 10), standalone: M runs go through the NiFi simulator with
//! duplicates, lost responses, node crashes with reissue and late reports, while the api-server is
//! SIGKILLed and restarted every few seconds, the leading operator is killed (the standby takes
//! over), and PostgreSQL restarts once. Afterwards every run must have ended SUCCESS, in an
//! explained terminal state, or in PUBLISH_UNKNOWN, and the invariant checker must find nothing.
//! `LC_CHAOS_RUNS` sets M (default 20, what CI runs).
use e2e::check::{Scope, check};
use e2e::standalone::{PgServer, Service, bin, free_port, wait_http_ok};
use sqlx::Connection;
use std::time::{Duration, Instant};

const NIFI: &str = "chaos-nifi-token";

fn sha256(t: &str) -> String {
    use std::io::Write;
    let mut c = std::process::Command::new(bin("load-control-api").unwrap())
        .arg("hash-token")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(t.as_bytes()).unwrap();
    String::from_utf8(c.wait_with_output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string()
}

async fn leader_pid(url: &str) -> Option<u32> {
    let mut c = sqlx::PgConnection::connect(url).await.ok()?;
    let (holder,): (String,) = sqlx::query_as("SELECT holder FROM nifi_ops.leader_epoch")
        .fetch_one(&mut c)
        .await
        .ok()?;
    // identity = <POD_NAME>:<pid>-<random>
    holder.split(':').nth(1)?.split('-').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_survive_kills_restarts_and_injected_faults() {
    let runs: usize = std::env::var("LC_CHAOS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let t0 = Instant::now();
    let pg = PgServer::start("chaos").expect("PostgreSQL");
    let db_url = pg.create_db("chaos").unwrap();
    let dir = tempdir();
    let (api_port, receiver_port) = (free_port(), free_port());
    let config = dir.join("config.yaml");
    std::fs::write(&config, format!(
        "server: {{host: 127.0.0.1, port: {api_port}, timeout_graceful_shutdown: 1}}\n\
         database: {{url: \"{db_url}\", pool_size: 8}}\n\
         auth: {{tokens: [{{name: chaos-nifi, role: nifi, sha256: {}}}]}}\n\
         nifi: {{receiver_url: \"http://127.0.0.1:{receiver_port}/pg05\", timeout_seconds: 2}}\n\
         recovery: {{mode: REISSUE, stale: 4s, extract_query_timeout: 2s, sweeper_interval: 1s, publish_stale: 20s, max_attempts: 4}}\n\
         dispatch: {{lease: 5s, poll_interval: 1s, backoff_min: 1s, backoff_max: 3s, ack_timeout: 10s, max_attempts: 60}}\n\
         worker: {{metrics_port: null}}\n\
         logging: {{format: text, level: INFO, access_log: false}}\n",
        sha256(NIFI))).unwrap();
    let cfg = config.to_str().unwrap();
    let api_bin = bin("load-control-api").unwrap();
    let st = std::process::Command::new(&api_bin)
        .args(["--config", cfg, "migrate"])
        .status()
        .unwrap();
    assert!(st.success(), "migrate");
    let mut api = Service::new("api", api_bin, &["--config", cfg, "serve"], &[], &dir);
    let op_bin = bin("load-control-operator").unwrap();
    let mut ops = [
        Service::new(
            "op-a",
            op_bin.clone(),
            &["--standalone", "--config", cfg],
            &[("POD_NAME", "op-a")],
            &dir,
        ),
        Service::new(
            "op-b",
            op_bin,
            &["--standalone", "--config", cfg],
            &[("POD_NAME", "op-b")],
            &dir,
        ),
    ];
    api.start().unwrap();
    for o in &mut ops {
        o.start().unwrap();
    }
    let base = format!("http://127.0.0.1:{api_port}");
    wait_http_ok(&format!("{base}/readyz"), Duration::from_secs(20))
        .await
        .unwrap();

    let mut sim = tokio::process::Command::new(env!("CARGO_BIN_EXE_nifi-sim"))
        .args([
            "--api",
            &base,
            "--token",
            NIFI,
            "--receiver-listen",
            &format!("127.0.0.1:{receiver_port}"),
            "--receiver-prefix",
            "/pg05",
            "--job",
            "CHAOS_JOB",
            "--runs",
            &runs.to_string(),
            "--concurrent-runs",
            "6",
            "--partitions",
            "3",
            "--chunks",
            "3",
            "--nodes",
            "3",
            "--publish-unknown",
            "0.02",
            "--run-timeout",
            "240",
        ])
        .args(e2e::nifi::CHAOS_FAULTS)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdout = sim.stdout.take().unwrap();
    let out = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut s = String::new();
        stdout.read_to_string(&mut s).await.map(|_| s)
    });

    // The chaos: the api-server killed every 3 s, the leading operator killed once, PostgreSQL
    // restarted once, for as long as the load runs (at most 10 minutes).
    let (mut api_kills, mut leader_kills, mut pg_restarts) = (0, 0, 0);
    let chaos_start = Instant::now();
    let mut next_api_kill = Duration::from_secs(2);
    let exit = loop {
        if let Ok(Some(status)) = sim.try_wait() {
            break status;
        }
        let t = chaos_start.elapsed();
        assert!(
            t < Duration::from_secs(600),
            "the load did not finish in 10 minutes"
        );
        if t >= next_api_kill {
            api.kill();
            api.start().unwrap();
            api_kills += 1;
            next_api_kill += Duration::from_secs(3);
        }
        if leader_kills == 0
            && t >= Duration::from_secs(3)
            && let Some(pid) = leader_pid(&db_url).await
            && let Some(o) = ops.iter_mut().find(|o| o.pid() == Some(pid))
        {
            o.kill();
            leader_kills += 1;
            o.start().unwrap(); // back as the standby
        }
        if pg_restarts == 0 && t >= Duration::from_secs(5) {
            let away = pg.restart().unwrap();
            eprintln!(
                "chaos: PostgreSQL restarted ({:.1}s away)",
                away.as_secs_f64()
            );
            pg_restarts += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let text = out.await.unwrap().unwrap();
    let summary: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or(""))
        .unwrap_or_else(|_| panic!("nifi-sim printed no summary (exit {exit}): {text}"));

    // The ledger settles: nothing left moving but what waits for a person.
    let mut conn = sqlx::PgConnection::connect(&db_url).await.unwrap();
    let report = check(
        &mut conn,
        &Scope {
            job_keys: vec!["CHAOS_JOB".into()],
            stale_after_seconds: 0.0,
        },
    )
    .await
    .unwrap();
    let line = serde_json::json!({
        "bench": "chaos", "runs": runs, "final_status": summary["final_status"], "ledger": report.by_status,
        "faults_injected": summary["faults_injected"], "api_kills": api_kills, "leader_kills": leader_kills,
        "pg_restarts": pg_restarts, "violations": report.violations.len(), "gave_up": summary["gave_up"].as_array().map_or(0, Vec::len),
        "requests": summary["requests"], "wall_seconds": t0.elapsed().as_secs_f64(),
    });
    println!("{line}");
    eprintln!("chaos: {line}");
    assert!(
        report.violations.is_empty(),
        "invariants broken: {:#?}\n{}",
        report.violations,
        ops[0].log_tail(30)
    );
    assert_eq!(
        summary["anomalies"],
        serde_json::json!([]),
        "contract broken under faults: {summary}"
    );
    assert_eq!(
        summary["receiver"]["rejected"],
        serde_json::json!([]),
        "PG-05 refused a dispatch: {summary}"
    );
    assert_eq!(
        summary["unfinished"],
        serde_json::json!([]),
        "runs that never ended: {summary}"
    );
    assert_eq!(
        report.runs as usize, runs,
        "every run was created once: {:?}",
        report.by_status
    );
    assert!(
        api_kills >= 1 && leader_kills == 1 && pg_restarts == 1,
        "the faults happened while the load ran"
    );
    for o in &mut ops {
        o.stop();
    }
    api.stop();
    let _ = std::fs::remove_dir_all(&dir); // the processes' logs, kept only when the test fails
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "lc-chaos-logs-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

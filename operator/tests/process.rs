//! The operator process: leadership handover with a higher epoch, LISTEN wake-up, the binary.
mod common;
use common::*;
use lcoperator::leadership::AdvisoryLockLeadership;
use lcoperator::process::Operator;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_of_two_leads_and_the_other_takes_over_with_a_higher_epoch() {
    let env = Env::start(|c| c.recovery.sweeper_interval = lcconfig::config::Dur::secs(3600)).await;
    let lead = |name: &str| {
        AdvisoryLockLeadership::new(
            env.config.session_dsn(),
            env.ledger.clone(),
            name.to_string(),
        )
    };
    let mut a = Operator::start(&env.config, env.ledger.clone(), lead("a")).unwrap();
    let first = a
        .wait_leading(Duration::from_secs(10))
        .await
        .expect("a leads");
    let mut b = Operator::start(&env.config, env.ledger.clone(), lead("b")).unwrap();
    assert!(
        b.wait_leading(Duration::from_secs(3)).await.is_none(),
        "only one leads"
    );
    let started = Instant::now();
    a.stop().await.unwrap();
    let second = b
        .wait_leading(Duration::from_secs(15))
        .await
        .expect("b takes over");
    eprintln!("handover in {:?}", started.elapsed());
    assert!(second.epoch > first.epoch);
    assert_eq!(second.holder, "b");
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listen_wakes_the_dispatcher_after_each_completion() {
    let receiver = Receiver::start(&[(202, 0)]).await;
    let env = Env::start(|c| {
        c.nifi.receiver_url = Some(receiver.url.clone());
        // Only LISTEN can wake the dispatcher within the test: polling is an hour away.
        c.dispatch.poll_interval = lcconfig::config::Dur::secs(3600);
        c.recovery.sweeper_interval = lcconfig::config::Dur::secs(3600);
    })
    .await;
    let leadership = AdvisoryLockLeadership::new(
        env.config.session_dsn(),
        env.ledger.clone(),
        "listener".into(),
    );
    let mut op = Operator::start(&env.config, env.ledger.clone(), leadership).unwrap();
    op.wait_leading(Duration::from_secs(10))
        .await
        .expect("leads");
    // The first (re)connect forces one scan; let it pass before measuring.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut latencies = vec![];
    for i in 0..100 {
        let (run, tokens) = env.extracting(&format!("L{i}"), &[2]).await;
        let before = receiver.count();
        let committed = Instant::now();
        assert!(
            env.chunk(run, "0000", tokens[0], 2)
                .await
                .validation_scheduled
        );
        let got = receiver.wait_for(before + 1, Duration::from_secs(10)).await;
        assert_eq!(got.len(), before + 1, "run {i} delivered");
        latencies.push(got[before].at.saturating_duration_since(committed));
    }
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{{\"bench\":\"listen_wakeup\",\"runs\":100,\"p50_ms\":{:.2},\"p99_ms\":{:.2},\"max_ms\":{:.2}}}",
        ms(latencies[49]),
        ms(latencies[98]),
        ms(latencies[99])
    );
    op.stop().await.unwrap();
}

#[tokio::test]
async fn the_binary_serves_health_and_metrics_and_stops_on_sigterm() {
    let bin = env!("CARGO_BIN_EXE_load-control-operator");
    let help = String::from_utf8(Command::new(bin).arg("--help").output().unwrap().stdout).unwrap();
    assert!(
        help.contains("--standalone") && help.contains("--config"),
        "{help}"
    );
    let env = Env::start(|_| {}).await;
    let port = testkit::free_port();
    let config = std::env::temp_dir().join(format!("op-{}.yaml", uuid::Uuid::new_v4().simple()));
    let log_dir = std::env::temp_dir().join(format!("op-logs-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(
        &config,
        // listen_dsn: behind a transaction pooler (scripts/test pooler), the leader's session
        // lock must not go through it (released at exit below, or held on for ever).
        format!("database: {{url: '{}', listen_dsn: '{}'}}\nnifi: {{receiver_url: 'http://127.0.0.1:9'}}\nworker: {{metrics_host: 127.0.0.1, metrics_port: {port}}}\n\
                 logging: {{format: text, file: {{path: '{}/{{service}}.log'}}}}\n", env.db.url, env.db.direct_url, log_dir.display()),
    )
    .unwrap();
    let no_receiver =
        std::env::temp_dir().join(format!("op-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(
        &no_receiver,
        format!("database: {{url: '{}'}}\n", env.db.url),
    )
    .unwrap();
    let refused = Command::new(bin)
        .args(["--standalone", "--config", no_receiver.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&no_receiver);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("nifi.receiver_url"));

    let mut child = Command::new(bin)
        .args(["--standalone", "--config", config.to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut leading = false;
    while Instant::now() < deadline && !leading {
        if let Ok(r) = client.get(format!("{base}/metrics")).send().await {
            leading = r.text().await.unwrap().lines().any(|l| l == "lca_leader 1");
        }
        if !leading {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(leading, "the only operator leads");
    let _ = std::fs::remove_file(&config); // read once at start
    assert_eq!(
        client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let (epoch,): (i64,) = sqlx::query_as("SELECT epoch FROM nifi_ops.leader_epoch")
        .fetch_one(&mut env.conn().await)
        .await
        .unwrap();
    assert!(epoch >= 1);
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "graceful exit: {status:?}");
    // logging.file: `{service}` is `worker` for this process, the file's format is text.
    let log = std::fs::read_to_string(log_dir.join("worker.log")).expect("worker.log written");
    assert!(log.contains("leader_acquired"), "{log}");
    assert!(!log.trim_start().starts_with('{'), "text, not JSON: {log}");
    let _ = std::fs::remove_dir_all(&log_dir);
    // Leadership was released: the advisory lock is free again.
    let (free,): (bool,) =
        sqlx::query_as("SELECT pg_try_advisory_lock(hashtext('load_control_leader'))")
            .fetch_one(&mut env.conn().await)
            .await
            .unwrap();
    assert!(free);
}

/// Supervision: a leader task that dies (here: ended as a crash would, mid-work) is restarted
/// by the process without losing leadership, counted in `lca_task_restarts` and `/healthz`, and
/// does its work again; the process does not exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crashed_leader_task_is_restarted_and_works_again() {
    let receiver = Receiver::start(&[(202, 0)]).await;
    let env = Env::start(|c| {
        c.nifi.receiver_url = Some(receiver.url.clone());
        c.dispatch.poll_interval = lcconfig::config::Dur::secs(1);
        c.recovery.sweeper_interval = lcconfig::config::Dur::secs(3600);
    })
    .await;
    let leadership =
        AdvisoryLockLeadership::new(env.config.session_dsn(), env.ledger.clone(), "sup".into());
    let mut op = Operator::start(&env.config, env.ledger.clone(), leadership).unwrap();
    let fence = op
        .wait_leading(Duration::from_secs(10))
        .await
        .expect("leads");
    for task in ["dispatcher", "sweeper"] {
        assert!(op.crash_task(task), "{task} is supervised");
    }
    assert!(!op.crash_task("no-such-task"));
    // Work after the crash: a run completes extraction, its dispatch must still be delivered.
    let (run, tokens) = env.extracting("SUP", &[1]).await;
    assert!(
        env.chunk(run, "0000", tokens[0], 1)
            .await
            .validation_scheduled
    );
    let got = receiver.wait_for(1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1, "the restarted dispatcher delivers");
    let (alive, body) = op.health.report();
    assert!(alive, "one restart is no crash loop: {body}");
    assert_eq!(body["tasks"]["dispatcher"]["restarts"], 1, "{body}");
    assert_eq!(body["tasks"]["sweeper"]["restarts"], 1, "{body}");
    let metrics = op.metrics.render();
    assert!(
        metrics.contains("lca_task_restarts_total{task=\"dispatcher\"} 1"),
        "{metrics}"
    );
    // Leadership was never given up: the same epoch still leads.
    assert_eq!(
        op.fence.borrow().as_ref().map(|f| f.epoch),
        Some(fence.epoch)
    );
    op.stop().await.unwrap();
}

/// A task that keeps dying is a crash loop: named in `/healthz` (`crashLooping`) and counted, but
/// liveness stays green (issue 28 item 2: a restarted operator container would take the pod, and
/// the healthy api-server beside it, out of the Service), and the task is still restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_looping_task_is_reported_but_keeps_liveness_green() {
    let env = Env::start(|c| c.recovery.sweeper_interval = lcconfig::config::Dur::secs(3600)).await;
    let leadership =
        AdvisoryLockLeadership::new(env.config.session_dsn(), env.ledger.clone(), "loop".into());
    let mut op = Operator::start(&env.config, env.ledger.clone(), leadership).unwrap();
    op.wait_leading(Duration::from_secs(10))
        .await
        .expect("leads");
    let mut crashed = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    let restarts = |op: &Operator| {
        op.health.report().1["tasks"]["sweeper"]["restarts"]
            .as_u64()
            .unwrap_or(0) as usize
    };
    while crashed < lcoperator::health::CRASH_LOOP_RESTARTS && Instant::now() < deadline {
        // Only a running task can be crashed; between runs the supervisor is backing off.
        if op.crash_task("sweeper") {
            crashed += 1;
            while restarts(&op) < crashed && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(restarts(&op), lcoperator::health::CRASH_LOOP_RESTARTS);
    let (alive, body) = op.health.report();
    assert!(alive, "a crash loop must not fail liveness: {body}");
    assert_eq!(body["status"], "degraded", "{body}");
    assert_eq!(body["crashLooping"], serde_json::json!(["sweeper"]));
    let metrics = op.metrics.render();
    assert!(
        metrics.contains(&format!(
            "lca_task_restarts_total{{task=\"sweeper\"}} {}",
            lcoperator::health::CRASH_LOOP_RESTARTS
        )),
        "{metrics}"
    );
    // Still supervised: the sweeper is started again after its backoff.
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut again = false;
    while !again && Instant::now() < deadline {
        again = op.crash_task("sweeper");
        if !again {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(again, "the crash-looping task is still restarted");
    op.stop().await.unwrap();
}

/// Forwards `127.0.0.1:<port>` to `to` once started (a database that appears late).
async fn forwarder(listener: tokio::net::TcpListener, to: String) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            return;
        };
        let to = to.clone();
        tokio::spawn(async move {
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(&to).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// The binaries never exit because the database is not there yet: started against an address
/// where nothing listens, the operator and the api-server stay up and say they are not ready,
/// and once the database appears there they become ready (and the operator leads) by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binaries_wait_for_a_database_that_is_not_there_yet() {
    let env = Env::start(|_| {}).await;
    let real = env.db.url.clone();
    let real_addr = real
        .split('@')
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let free = testkit::free_port;
    let (db_port, op_port, api_port) = (free(), free(), free());
    let late_url = real.replace(&real_addr, &format!("127.0.0.1:{db_port}"));
    let operator = Command::new(env!("CARGO_BIN_EXE_load-control-operator"))
        .args(["--standalone"])
        .env("LCA_CONFIG", "/dev/null")
        .env("DATABASE_URL", &late_url)
        .env("LCA_NIFI__RECEIVER_URL", "http://127.0.0.1:9")
        .env("LCA_WORKER__METRICS_HOST", "127.0.0.1")
        .env("LCA_WORKER__METRICS_PORT", op_port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let api = Command::new(
        std::path::Path::new(env!("CARGO_BIN_EXE_load-control-operator"))
            .with_file_name("load-control-api"),
    )
    .args([
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        &api_port.to_string(),
    ])
    .env("LCA_CONFIG", "/dev/null")
    .env("DATABASE_URL", &late_url)
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    struct Kill(Vec<std::process::Child>);
    impl Drop for Kill {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let mut children = Kill(vec![operator, api]);
    let http = reqwest::Client::new();
    let status = |port: u16, path: &'static str| {
        let http = http.clone();
        async move {
            http.get(format!("http://127.0.0.1:{port}{path}"))
                .send()
                .await
                .ok()
                .map(|r| r.status().as_u16())
        }
    };
    // Both answer, alive but not ready, and keep running.
    let deadline = Instant::now() + Duration::from_secs(20);
    while (status(op_port, "/healthz").await != Some(200)
        || status(api_port, "/healthz").await != Some(200))
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status(op_port, "/healthz").await, Some(200));
    assert_eq!(status(op_port, "/readyz").await, Some(503));
    assert_eq!(status(api_port, "/readyz").await, Some(503));
    tokio::time::sleep(Duration::from_secs(3)).await; // a few retries of everything
    for c in &mut children.0 {
        assert!(c.try_wait().unwrap().is_none(), "a binary exited: {c:?}");
    }
    // The database appears at that address.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", db_port))
        .await
        .unwrap();
    tokio::spawn(forwarder(listener, real_addr));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut leading = false;
    while Instant::now() < deadline && !leading {
        let metrics = http
            .get(format!("http://127.0.0.1:{op_port}/metrics"))
            .send()
            .await
            .ok();
        if let Some(m) = metrics {
            leading = m
                .text()
                .await
                .unwrap_or_default()
                .lines()
                .any(|l| l == "lca_leader 1");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(leading, "the operator leads once the database is there");
    assert_eq!(status(api_port, "/readyz").await, Some(200));
    assert_eq!(status(op_port, "/readyz").await, Some(200));
}

/// Issue 27 item 1: an operator whose binary does not run on the ledger's schema version is not
/// ready, never leads (no epoch is bumped, nothing is dispatched or swept) and says why at start
/// and in each failed probe; once the version is back in its range it is ready and leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_outside_the_schema_range_neither_leads_nor_is_ready() {
    let env = Env::start(|_| {}).await;
    let newer = *ledger::SUPPORTED_SCHEMA.end() + 1;
    let set_version = |v: i32| {
        let url = env.db.url.clone();
        async move {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::query("UPDATE nifi_ops.schema_version SET version = $1")
                .bind(v)
                .execute(&mut conn)
                .await
                .unwrap();
        }
    };
    set_version(newer).await;
    let port = testkit::free_port();
    let config = std::env::temp_dir().join(format!("op-{}.yaml", uuid::Uuid::new_v4().simple()));
    std::fs::write(
        &config,
        format!("database: {{url: '{}', listen_dsn: '{}'}}\nnifi: {{receiver_url: 'http://127.0.0.1:9'}}\nworker: {{metrics_host: 127.0.0.1, metrics_port: {port}}}\n\
                 logging: {{format: text}}\n", env.db.url, env.db.direct_url),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_load-control-operator"))
        .args(["--standalone", "--config", config.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let get = |path: &'static str| {
        let (client, base) = (client.clone(), base.clone());
        async move {
            let r = client.get(format!("{base}{path}")).send().await.ok()?;
            Some((r.status().as_u16(), r.text().await.unwrap()))
        }
    };
    // For 6 s (three leadership attempts): never ready, never leading, no epoch.
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut probes = 0;
    while Instant::now() < deadline {
        if let Some((status, _)) = get("/readyz").await {
            assert_eq!(status, 503, "not ready on a schema it does not run on");
            probes += 1;
        }
        if let Some((_, metrics)) = get("/metrics").await {
            assert!(!metrics.lines().any(|l| l == "lca_leader 1"), "it leads");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(probes > 0, "the health listener answered");
    let (epochs,): (i64,) = sqlx::query_as("SELECT count(*) FROM nifi_ops.leader_epoch")
        .fetch_one(&mut env.conn().await)
        .await
        .unwrap();
    assert_eq!(epochs, 0, "no epoch was bumped");

    // The schema rolled forward to one it runs on (here: the version back in range).
    set_version(ledger::SCHEMA_VERSION).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut recovered = false;
    while Instant::now() < deadline && !recovered {
        let ready = get("/readyz").await.is_some_and(|(s, _)| s == 200);
        let leads = get("/metrics")
            .await
            .is_some_and(|(_, m)| m.lines().any(|l| l == "lca_leader 1"));
        recovered = ready && leads;
        if !recovered {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(recovered, "ready and leading once the version is in range");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_file(&config);
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let why = format!(
        "database schema version {newer} is newer than this binary (load-control {}) supports (≤{})",
        env!("CARGO_PKG_VERSION"),
        newer - 1
    );
    for event in ["schema_unsupported", "readyz_failed", "leader_epoch_error"] {
        assert!(
            logs.lines().any(|l| l.contains(event) && l.contains(&why)),
            "{event} names both versions:\n{logs}"
        );
    }
}

/// The output of `cmd`, killed if it has not exited within `limit` (a process that should refuse
/// to start but does not must fail the test, not hang it).
fn output_within(mut cmd: Command, limit: Duration) -> std::process::Output {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if child.try_wait().unwrap().is_none() {
        let _ = child.kill();
    }
    child.wait_with_output().unwrap()
}

/// §6.4 key rotation through the binary, configured as the chart does it (`LCA_NIFI__SIGNING_KEYS`
/// from a Secret): the operator signs with the first key and sends its id, and PG-05 (the strict
/// receiver holding both keys) accepts; neither secret reaches the log, even at DEBUG. Each
/// mistake in the keys refuses to start with a configuration error naming the key: exit status 1,
/// no panic, no secret on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_signs_with_the_first_key_from_the_environment() {
    use e2e::nifi::receiver::{Behaviour, Receiver, SigningKeys};
    const NEW: &str = "n3w-s3cret-from-env";
    const OLD: &str = "0ld-s3cret-from-env";
    let bin = env!("CARGO_BIN_EXE_load-control-operator");
    let env = Env::start(|_| {}).await;
    for (keys, secret, key) in [
        (
            format!("[{{id: a, secret: {NEW}}}, {{id: a, secret: {OLD}}}]"),
            None,
            "nifi.signing_keys[1].id",
        ),
        (
            format!("[{{id: a, secret: {NEW}}}]"),
            Some(OLD),
            "nifi.signing_keys",
        ),
        ("[]".to_string(), None, "nifi.signing_keys"),
        (
            format!("[{{id: 'no spaces', secret: {NEW}}}]"),
            None,
            "nifi.signing_keys[0].id",
        ),
        (
            "[{id: a, secret: 20261203}]".to_string(),
            None,
            "nifi.signing_keys[0].secret",
        ),
        (
            "[{id: a, secret: ''}]".to_string(),
            None,
            "nifi.signing_keys[0].secret",
        ),
    ] {
        let mut cmd = Command::new(bin);
        cmd.args(["--standalone"])
            .env("LCA_CONFIG", "/dev/null")
            .env("DATABASE_URL", &env.db.url)
            .env("LCA_NIFI__RECEIVER_URL", "http://127.0.0.1:9")
            .env("LCA_WORKER__METRICS_PORT", "null")
            .env("LCA_NIFI__SIGNING_KEYS", &keys);
        if let Some(s) = secret {
            cmd.env("LCA_NIFI__SIGNING_SECRET", s);
        }
        let out = output_within(cmd, Duration::from_secs(20));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{keys}: {stderr}");
        assert!(
            stderr.contains("invalid configuration") && stderr.contains(&format!("`{key}`")),
            "{keys}: {stderr}"
        );
        assert!(
            !stderr.contains("panicked")
                && !stderr.contains(NEW)
                && !stderr.contains(OLD)
                && !stderr.contains("20261203"),
            "{stderr}"
        );
    }

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pg05 = Receiver::start(
        "127.0.0.1:0",
        "",
        Behaviour {
            signing_keys: SigningKeys::new(&[("k-old", OLD), ("k-new", NEW)]),
            ..Default::default()
        },
        tx,
    )
    .await
    .unwrap();
    let (_, dispatch) = env.validated("BIN").await;
    let log = std::env::temp_dir().join(format!("op-{}.log", uuid::Uuid::new_v4().simple()));
    let mut child = Command::new(bin)
        .args(["--standalone"])
        .env("LCA_CONFIG", "/dev/null")
        .env("DATABASE_URL", &env.db.url)
        .env("LCA_NIFI__RECEIVER_URL", format!("http://{}", pg05.addr))
        .env("LCA_WORKER__METRICS_PORT", "null")
        .env("LCA_LOGGING__LEVEL", "DEBUG")
        .env(
            "LCA_NIFI__SIGNING_KEYS",
            format!("- id: k-new\n  secret: {NEW}\n- id: k-old\n  secret: {OLD}\n"),
        )
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await;
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let got = got.expect("PG-05 accepted a dispatch within 30 s").unwrap();
    assert_eq!(
        (got.dispatch_id, got.key_id.as_deref()),
        (dispatch, Some("k-new"))
    );
    assert!(status.success(), "{status:?}");
    assert!(
        pg05.stats.lock().unwrap().signature_refused.is_empty(),
        "{:?}",
        pg05.stats.lock().unwrap().signature_refused
    );
    assert!(text.contains("dispatch_sent"), "{text}");
    assert!(!text.contains(NEW) && !text.contains(OLD), "{text}");
}

/// NiFi TLS files that cannot be read (a Secret not mounted yet, a rotation half done) are no
/// reason to exit (issue 28 item 2): the binary stays up, healthy, says why in its metrics, and
/// its container never takes the api-server beside it out of the Service.
#[tokio::test]
async fn the_binary_waits_out_unreadable_nifi_tls_files() {
    let env = Env::start(|_| {}).await;
    let port = testkit::free_port();
    let missing = std::env::temp_dir().join(format!("absent-{}", uuid::Uuid::new_v4().simple()));
    let log = std::env::temp_dir().join(format!("tls-wait-{port}.log"));
    let mut child = standalone_on(&env.db, port)
        .env("LCA_NIFI__RECEIVER_URL", "https://127.0.0.1:9")
        .env("LCA_NIFI__CLIENT_CERT", missing.join("tls.crt"))
        .env("LCA_NIFI__CLIENT_KEY", missing.join("tls.key"))
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut metrics = String::new();
    while Instant::now() < deadline {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the operator exited on unreadable TLS files"
        );
        if let Ok(r) = client
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
        {
            metrics = r.text().await.unwrap();
            if metrics.contains("lca_leader 1") {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let healthz = client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .map(|r| r.status().as_u16());
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(
        still_running,
        "the operator exited on unreadable TLS files\n{logged}"
    );
    assert_eq!(healthz.ok(), Some(200), "{logged}");
    assert!(
        metrics.contains("lca_certificate_reload_failures_total{cert=\"nifi_client\"} 1"),
        "{metrics}\n--- its log:\n{logged}"
    );
}

/// Issue 28 item 2: in Kubernetes mode, a Kubernetes client that cannot be had (an API server
/// where nothing listens, a KUBECONFIG that cannot be read) is waited out, never a reason to
/// exit: the binary stays up for 10 s, alive (`/healthz` 200), not ready (`/readyz` 503 naming
/// the reason), `lca_kubernetes_access 0`, the reason logged at ERROR once (not once per retry),
/// and it stops cleanly on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_waits_out_a_kubernetes_client_it_cannot_have() {
    let env = Env::start(|_| {}).await;
    let dir = std::env::temp_dir().join(format!("op-kube-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let unreachable = dir.join("kubeconfig");
    std::fs::write(
        &unreachable,
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\n\
         contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    let unreadable = dir.join("absent").join("kubeconfig");
    let free = testkit::free_port;
    let start = |kubeconfig: &std::path::Path, port: u16, log: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_load-control-operator"))
            .env("KUBECONFIG", kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("POD_NAMESPACE", "default")
            .env("LCA_CONFIG", "/dev/null")
            .env("DATABASE_URL", &env.db.url)
            .env("LCA_NIFI__RECEIVER_URL", "http://127.0.0.1:9")
            .env("LCA_WORKER__METRICS_HOST", "127.0.0.1")
            .env("LCA_WORKER__METRICS_PORT", port.to_string())
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
            .spawn()
            .unwrap()
    };
    struct Kill(Vec<std::process::Child>);
    impl Drop for Kill {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let cases = [
        (unreachable.clone(), free(), dir.join("unreachable.log")),
        (unreadable.clone(), free(), dir.join("unreadable.log")),
    ];
    let mut children = Kill(
        cases
            .iter()
            .map(|(k, port, log)| start(k, *port, log))
            .collect(),
    );
    let http = reqwest::Client::new();
    let get = |port: u16, path: &'static str| {
        let http = http.clone();
        async move {
            let r = http
                .get(format!("http://127.0.0.1:{port}{path}"))
                .send()
                .await
                .ok()?;
            Some((r.status().as_u16(), r.text().await.unwrap_or_default()))
        }
    };
    let began = Instant::now();
    while began.elapsed() < Duration::from_secs(10) {
        for (c, (k, _, log)) in children.0.iter_mut().zip(&cases) {
            assert!(
                c.try_wait().unwrap().is_none(),
                "the operator exited with KUBECONFIG {}: {}",
                k.display(),
                std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (i, (k, port, log)) in cases.iter().enumerate() {
        let what = k.display();
        let (code, body) = get(*port, "/healthz").await.expect("/healthz answers");
        assert_eq!(code, 200, "{what}: {body}");
        assert!(body.contains("waitingFor"), "{what}: {body}");
        let (code, body) = get(*port, "/readyz").await.expect("/readyz answers");
        assert_eq!(code, 503, "{what}: {body}");
        assert!(body.contains("kubernetes_client"), "{what}: {body}");
        let (_, metrics) = get(*port, "/metrics").await.expect("/metrics answers");
        assert!(
            metrics.lines().any(|l| l == "lca_kubernetes_access 0"),
            "{what}: {metrics}"
        );
        Command::new("kill")
            .args(["-TERM", &children.0[i].id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while children.0[i].try_wait().unwrap().is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let status = children.0[i].try_wait().unwrap();
        assert!(
            status.is_some_and(|s| s.success()),
            "{what}: SIGTERM ends it cleanly: {status:?}"
        );
        let text = std::fs::read_to_string(log).unwrap();
        let failures = text
            .lines()
            .filter(|l| l.contains("kubernetes_client_failed"))
            .count();
        assert_eq!(failures, 1, "{what}: logged once per change: {text}");
        assert!(
            text.contains("ERROR") || text.contains("\"level\":\"error\""),
            "{what}: {text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The binary in standalone mode on the database `db`, no configuration file, its metrics and
/// health on 127.0.0.1:`port`; the NiFi receiver and output are the caller's. Its leader lock and
/// LISTEN straight to PostgreSQL (`database.listen_dsn`), as behind a pooler they must be.
fn standalone_on(db: &testkit::TestDb, port: u16) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_load-control-operator"));
    cmd.arg("--standalone")
        .env("LCA_CONFIG", "/dev/null")
        .env("DATABASE_URL", &db.url)
        .env("LCA_DATABASE__LISTEN_DSN", &db.direct_url)
        .env("LCA_WORKER__METRICS_HOST", "127.0.0.1")
        .env("LCA_WORKER__METRICS_PORT", port.to_string());
    cmd
}

/// The processes whose parent is `parent` (from /proc).
fn children_of(parent: u32) -> Vec<u32> {
    let mut found = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // `pid (comm) state ppid …`; comm may hold spaces, so read after its closing parenthesis.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            found.push(pid);
        }
    }
    found
}

fn kill(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Issue 28 item 2: under `--supervise` (the chart's arrangement) an operator process killed by a
/// signal, as an OOM kill would, is started again inside the same container at once: the
/// supervisor stays (so the pod's readiness and the api-server beside it do), the new process
/// leads again and counts the restart; SIGTERM reaches the child and both end cleanly.
#[tokio::test]
async fn a_killed_operator_process_is_started_again_by_its_supervisor() {
    let env = Env::start(|_| {}).await;
    let port = testkit::free_port();
    let log = std::env::temp_dir().join(format!("supervised-{port}.log"));
    let mut supervisor = standalone_on(&env.db, port)
        .arg("--supervise")
        .env("LCA_NIFI__RECEIVER_URL", "http://127.0.0.1:9")
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let metrics = || {
        let client = client.clone();
        async move {
            client
                .get(format!("http://127.0.0.1:{port}/metrics"))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()
        }
    };
    let until = |what: &'static str, limit: Duration, cond: Box<dyn Fn(&str) -> bool>| async move {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(m) = metrics().await
                && cond(&m)
            {
                return m;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    until(
        "the first process to lead",
        Duration::from_secs(60),
        Box::new(|m| m.lines().any(|l| l == "lca_leader 1")),
    )
    .await;
    let first = children_of(supervisor.id());
    assert_eq!(first.len(), 1, "one operator process: {first:?}");
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{}/oom_score_adj", first[0]))
            .unwrap()
            .trim(),
        "500",
        "the OOM killer picks the worker, not the supervisor"
    );
    kill(first[0], "-KILL");
    let after = until(
        "a second process, leading, that counts the restart",
        Duration::from_secs(60),
        Box::new(|m| {
            m.lines().any(|l| l == "lca_leader 1")
                && m.lines()
                    .any(|l| l == "lca_operator_process_restarts_total 1")
        }),
    )
    .await;
    assert!(after.contains("lca_operator_process_restarts_total 1"));
    assert!(
        supervisor.try_wait().unwrap().is_none(),
        "the supervisor stays"
    );
    let second = children_of(supervisor.id());
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first);

    kill(supervisor.id(), "-TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = supervisor.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the supervisor did not stop");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(status.success(), "{status:?}\n{logged}");
    assert!(
        !std::path::Path::new(&format!("/proc/{}", second[0])).exists()
            || std::fs::read_to_string(format!("/proc/{}/stat", second[0]))
                .is_ok_and(|s| s.contains(") Z ")),
        "the child outlived its supervisor"
    );
    assert!(
        logged.contains("\"event\":\"operator_process_killed\""),
        "{logged}"
    );
    assert!(
        logged.contains("\"event\":\"leader_released\""),
        "the child stopped gracefully: {logged}"
    );
}

/// A child that exits with an error status chose to (here an invalid configuration): the
/// supervisor ends with that status, so the kubelet's restart count still shows it.
#[test]
fn a_supervised_operator_that_exits_with_an_error_ends_its_supervisor() {
    let out = Command::new(env!("CARGO_BIN_EXE_load-control-operator"))
        .args(["--standalone", "--supervise"])
        .env("LCA_CONFIG", "/dev/null")
        .env("DATABASE_URL", "postgres://127.0.0.1:9/none")
        .env_remove("LCA_NIFI__RECEIVER_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nifi.receiver_url"),
        "{out:?}"
    );
}

/// Issue 40 item 6. A leader whose acquisition finds the ledger gone back (restored from a backup
/// taken before its clock's last ticks) publishes its fence to the Kubernetes tasks at once, but
/// the dispatcher's and sweeper's only once the LoadRun mirror has compared every LoadRun under
/// the new epoch; an acquisition that finds nothing publishes both at once. Seen failing with the
/// gate removed (the deciding fence came with the other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restore_decisions_wait_until_the_loadruns_were_compared() {
    use lcoperator::leadership::{Deposed, Fences, lead};
    use tokio::sync::watch;
    let env = Env::start(|_| {}).await;
    let first = env.ledger.acquire_epoch("before").await.unwrap();
    env.ledger.advance_clock(&first).await.unwrap();
    let backup = env.db.backup();
    env.ledger.advance_clock(&first).await.unwrap();
    env.db.restore(&backup).await;

    let (all_tx, mut all) = watch::channel(None);
    let (deciding_tx, deciding) = watch::channel(None);
    let (compared_tx, compared) = watch::channel(0);
    let (release_tx, release) = watch::channel(false);
    let leadership =
        AdvisoryLockLeadership::new(env.config.session_dsn(), env.ledger.clone(), "after".into());
    let task = tokio::spawn(lead(
        leadership,
        env.ledger.clone(),
        Fences {
            all: all_tx,
            deciding: deciding_tx,
            compared: Some(compared),
        },
        release,
        Deposed::default(),
        Default::default(),
    ));
    let fence = tokio::time::timeout(Duration::from_secs(30), all.wait_for(|f| f.is_some()))
        .await
        .expect("leads")
        .unwrap()
        .clone()
        .unwrap();
    assert_eq!(fence.epoch, 2, "above the epoch issued before the restore");
    assert_eq!(env.ledger.went_back_count(), 1);
    // Held for as long as the LoadRuns were not compared under this epoch (an earlier epoch's
    // comparison does not count).
    compared_tx.send_replace(1);
    let mut held = deciding.clone();
    assert!(
        tokio::time::timeout(Duration::from_secs(2), held.wait_for(|f| f.is_some()))
            .await
            .is_err(),
        "the dispatcher and sweeper were let decide before the LoadRuns were compared"
    );
    compared_tx.send_replace(fence.epoch);
    let mut opened = deciding.clone();
    let opened = tokio::time::timeout(Duration::from_secs(5), opened.wait_for(|f| f.is_some()))
        .await
        .expect("decisions resume once compared")
        .unwrap()
        .clone();
    assert_eq!(opened, Some(fence));
    release_tx.send_replace(true);
    task.await.unwrap().unwrap();
}

//! The dispatcher against a real receiver on 127.0.0.1 (CONTRACT §6): each receiver outcome, the
//! exact request, at-least-once delivery after a lost sender, two dispatchers on one outbox, and
//! the LISTEN wake-up.
mod common;
use common::*;
use ledger::{LeasedDispatch, Recorded};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use uuid::Uuid;

async fn leased(env: &Env, fence: &ledger::Fence) -> Vec<LeasedDispatch> {
    env.ledger.lease_dispatches(fence, 20).await.unwrap()
}

/// Delivers the run's VALIDATE_RUN once against `answers`; returns (status, attempts, http, error, delay-seconds).
async fn outcome(
    answers: &[(u16, u64)],
    tune: impl FnOnce(&mut lcconfig::config::Config),
) -> (String, i32, Option<i32>, Option<String>, f64, Env, Uuid) {
    let receiver = Receiver::start(answers).await;
    let env = Env::start(|c| {
        c.nifi.receiver_url = Some(receiver.url.clone());
        tune(c);
    })
    .await;
    let (run, _) = env.validated("K").await;
    let fence = env.fence().await;
    let rows = leased(&env, &fence).await;
    assert_eq!(rows.len(), 1);
    env.dispatcher(&env.ledger).deliver(&fence, &rows[0]).await;
    let (status, attempts, http, error, delay): (String, i32, Option<i32>, Option<String>, f64) = sqlx::query_as(
        "SELECT status, attempt_count, last_http_status, last_error, extract(epoch FROM next_attempt_at - clock_timestamp())::float8 \
           FROM nifi_ops.load_dispatch WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut env.conn().await)
    .await
    .unwrap();
    (status, attempts, http, error, delay, env, run)
}

#[tokio::test]
async fn a_2xx_marks_the_row_sent_and_the_request_is_exactly_the_contracts() {
    let receiver = Receiver::start(&[(202, 0)]).await;
    let env = Env::start(|c| {
        c.nifi.receiver_url = Some(receiver.url.clone());
        c.nifi.signing_secret = Some("s3cret".into());
    })
    .await;
    let (run, dispatch) = env.validated("K").await;
    let fence = env.fence().await;
    let rows = leased(&env, &fence).await;
    env.dispatcher(&env.ledger).deliver(&fence, &rows[0]).await;
    let got = receiver.wait_for(1, Duration::from_secs(5)).await;
    let r = &got[0];
    assert_eq!(r.path, "/validate/JOB", "no doubled or trailing slash");
    assert_eq!(r.headers["content-type"], "application/json");
    assert_eq!(r.headers["x-run-id"], run.to_string());
    assert_eq!(r.headers["x-dispatch-id"], dispatch.to_string());
    assert_eq!(
        r.body,
        serde_json::json!({"runId": run, "dispatchId": dispatch})
    );
    let ts: u64 = r.headers["x-lca-timestamp"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        r.headers["x-lca-signature"].to_str().unwrap(),
        lcoperator::dispatcher::signature("s3cret", ts, &r.raw)
    );
    assert!(
        !r.headers.contains_key("x-lca-key-id"),
        "signing_secret has no key id"
    );
    let (status, http, sent): (String, Option<i32>, bool) =
        sqlx::query_as("SELECT status, last_http_status, sent_at IS NOT NULL FROM nifi_ops.load_dispatch WHERE dispatch_id = $1")
            .bind(dispatch)
            .fetch_one(&mut env.conn().await)
            .await
            .unwrap();
    assert_eq!((status.as_str(), http, sent), ("SENT", Some(202), true));
}

#[tokio::test]
async fn refusals_are_dead_at_once_with_an_event() {
    for code in [400, 404] {
        let (status, attempts, http, error, _, env, run) = outcome(&[(code, 0)], |_| {}).await;
        assert_eq!(
            (status.as_str(), attempts, http),
            ("DEAD", 1, Some(code as i32))
        );
        assert!(error.unwrap().starts_with(&format!("HTTP {code}")));
        assert_eq!(env.events(run, "DISPATCH_DEAD").await, 1);
        let (job,): (Option<String>,) = sqlx::query_as("SELECT job_key FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'DISPATCH_DEAD'")
            .bind(run)
            .fetch_one(&mut env.conn().await)
            .await
            .unwrap();
        assert_eq!(job, None, "dispatch events carry run and partition only");
    }
}

#[tokio::test]
async fn retryable_answers_back_off_and_stay_pending() {
    for code in [408, 429, 500] {
        let (status, attempts, http, error, delay, env, run) = outcome(&[(code, 0)], |_| {}).await;
        assert_eq!(
            (status.as_str(), attempts, http),
            ("PENDING", 1, Some(code as i32)),
            "{code}"
        );
        assert!(error.is_some());
        assert!(
            (4.0..=5.5).contains(&delay),
            "first backoff is backoff_min (5 s), got {delay}"
        );
        assert_eq!(env.events(run, "DISPATCH_DEAD").await, 0);
    }
}

#[tokio::test]
async fn transport_errors_and_timeouts_retry_without_a_status() {
    let (status, _, http, error, _, _, _) = outcome(&[(202, 0)], |c| {
        c.nifi.receiver_url = Some("http://127.0.0.1:9".into())
    })
    .await;
    assert_eq!(
        (status.as_str(), http),
        ("PENDING", None),
        "connection refused is retried"
    );
    assert!(!error.unwrap().is_empty());
    let (status, _, http, error, _, _, _) =
        outcome(&[(202, 3000)], |c| c.nifi.timeout_seconds = 0.5).await;
    assert_eq!(
        (status.as_str(), http),
        ("PENDING", None),
        "a slow answer past the timeout is retried"
    );
    assert!(error.unwrap().starts_with("timeout"));
}

#[tokio::test]
async fn attempts_exhausted_is_dead() {
    let (status, _, http, error, _, env, run) =
        outcome(&[(503, 0)], |c| c.dispatch.max_attempts = 1).await;
    assert_eq!((status.as_str(), http), ("DEAD", Some(503)));
    assert!(error.unwrap().starts_with("max attempts reached: HTTP 503"));
    assert_eq!(env.events(run, "DISPATCH_DEAD").await, 1);
}

#[tokio::test]
async fn an_ack_before_the_answer_stays_acked() {
    let receiver = Receiver::start(&[(202, 0)]).await;
    let env = Env::start(|c| c.nifi.receiver_url = Some(receiver.url.clone())).await;
    let (run, dispatch) = env.validated("K").await;
    let fence = env.fence().await;
    let rows = leased(&env, &fence).await;
    // PG-40 acknowledged before the dispatcher recorded PG-05's answer.
    assert!(
        env.ledger
            .start_validation(run, dispatch, "n")
            .await
            .unwrap()
            .started
    );
    let recorded = env
        .ledger
        .record_dispatch_outcome(
            &fence,
            &rows[0],
            &ledger::SendOutcome::Delivered { http_status: 202 },
            &env.config.thresholds(),
        )
        .await
        .unwrap();
    assert_eq!(recorded, Recorded::NotPending);
    assert_eq!(
        env.text(
            "SELECT status FROM nifi_ops.load_dispatch WHERE dispatch_id = $1",
            dispatch
        )
        .await
        .as_deref(),
        Some("ACKED")
    );
}

#[tokio::test]
async fn a_sender_lost_after_the_lease_is_retaken_and_the_duplicate_is_absorbed() {
    let receiver = Receiver::start(&[(202, 0)]).await;
    let env = Env::start(|c| c.nifi.receiver_url = Some(receiver.url.clone())).await;
    let short = env
        .ledger_with(|c| c.dispatch_lease = Duration::from_millis(500))
        .await;
    let (run, dispatch) = env.validated("K").await;
    let fence = env.fence().await;
    // The first sender leased the row and died before sending.
    assert_eq!(short.lease_dispatches(&fence, 20).await.unwrap().len(), 1);
    assert!(
        short.lease_dispatches(&fence, 20).await.unwrap().is_empty(),
        "nobody else takes it within the lease"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let retaken = loop {
        let rows = short.lease_dispatches(&fence, 20).await.unwrap();
        if !rows.is_empty() || Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(retaken.len(), 1, "taken again once the lease passed");
    assert_eq!(retaken[0].attempt_count, 2);
    env.dispatcher(&short).deliver(&fence, &retaken[0]).await;
    assert_eq!(receiver.wait_for(1, Duration::from_secs(5)).await.len(), 1);
    // NiFi may have received it twice (at-least-once); validation/start's CAS starts once.
    let first = env
        .ledger
        .start_validation(run, dispatch, "n1")
        .await
        .unwrap();
    let second = env
        .ledger
        .start_validation(run, dispatch, "n2")
        .await
        .unwrap();
    assert!(first.started && !second.started);
}

/// Issue 21 item 4: a row leased by a leader that lost its epoch (crashed, deposed, or cut off
/// from the database while sending) is free for the next epoch at once, not after
/// `dispatch.lease`; within one epoch the lease still holds, and a recorded retry's backoff is
/// honoured across a change of leader.
#[tokio::test]
async fn a_lease_of_a_lost_epoch_is_free_at_once() {
    let env = Env::start(|_| {}).await;
    let (run, _) = env.validated("K").await;
    let old = env.fence().await;
    assert_eq!(
        env.ledger.lease_dispatches(&old, 20).await.unwrap().len(),
        1
    );
    assert!(
        env.ledger
            .lease_dispatches(&old, 20)
            .await
            .unwrap()
            .is_empty(),
        "the same epoch waits for its own lease"
    );
    let new = env.ledger.acquire_epoch("next-leader").await.unwrap();
    let retaken = env.ledger.lease_dispatches(&new, 20).await.unwrap();
    assert_eq!(
        retaken.len(),
        1,
        "the lost epoch's lease (60 s) is not waited out"
    );
    assert_eq!(retaken[0].attempt_count, 2);
    assert!(
        env.ledger
            .lease_dispatches(&new, 20)
            .await
            .unwrap()
            .is_empty(),
        "and now it is the new epoch's lease"
    );
    // A retry recorded by the new epoch keeps its backoff when leadership moves again.
    let settings = env.ledger.config().thresholds.clone();
    let recorded = env
        .ledger
        .record_dispatch_outcome(
            &new,
            &retaken[0],
            &ledger::SendOutcome::Retryable {
                http_status: Some(503),
                error: "busy".into(),
            },
            &settings,
        )
        .await
        .unwrap();
    assert_eq!(recorded, Recorded::Retry);
    let third = env.ledger.acquire_epoch("third-leader").await.unwrap();
    assert!(
        env.ledger
            .lease_dispatches(&third, 20)
            .await
            .unwrap()
            .is_empty(),
        "a row in backoff is not a lease"
    );
    assert_eq!(
        env.scalar(
            "SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND leased_epoch IS NULL",
            run
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_dispatchers_send_every_row_once() {
    let receiver = Receiver::start(&[(202, 5)]).await;
    let env = Env::start(|c| c.nifi.receiver_url = Some(receiver.url.clone())).await;
    for i in 0..40 {
        env.validated(&format!("K{i}")).await;
    }
    let fence = env.fence().await;
    let (a, b) = (env.dispatcher(&env.ledger), env.dispatcher(&env.ledger));
    let (_tx, rx) = watch::channel(false);
    tokio::join!(a.scan(&fence, &rx), b.scan(&fence, &rx));
    let got = receiver.wait_for(40, Duration::from_secs(10)).await;
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for r in &got {
        *per_id
            .entry(r.headers["x-dispatch-id"].to_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(per_id.len(), 40);
    assert!(per_id.values().all(|n| *n == 1), "{per_id:?}");
    let sent: i64 = sqlx::query_as::<_, (i64,)>(
        "SELECT count(*) FROM nifi_ops.load_dispatch WHERE status = 'SENT'",
    )
    .fetch_one(&mut env.conn().await)
    .await
    .unwrap()
    .0;
    assert_eq!(sent, 40);
}

#[tokio::test]
async fn a_missing_receiver_url_is_a_build_failure() {
    let env = Env::start(|_| {}).await;
    let mut conn = env.conn().await;
    let (run, _) = env.validated("K").await;
    // A job row with a path in its receiver URL (written before that was refused, or by hand)
    // is invalid as a whole: PG-05 would answer 404 there, so the global receiver is used.
    sqlx::query("INSERT INTO nifi_ops.load_job (job_key, settings) VALUES ('JOB', '{\"nifi\": {\"receiver_url\": \"https://nifi-b:9443/lca\"}}')")
        .execute(&mut conn)
        .await
        .unwrap();
    let fence = env.fence().await;
    let rows = leased(&env, &fence).await;
    let req = env
        .ledger
        .dispatch_request(&rows[0])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        req.url, "http://127.0.0.1:9/validate/JOB",
        "settings with a receiver path are ignored"
    );
    sqlx::query("UPDATE nifi_ops.load_job SET settings = '{\"nifi\": {\"receiver_url\": \"https://nifi-b:9443/\"}}'")
        .execute(&mut conn)
        .await
        .unwrap();
    let req = env
        .ledger
        .dispatch_request(&rows[0])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        req.url, "https://nifi-b:9443/validate/JOB",
        "the job's receiver overrides the global one"
    );
    sqlx::query("UPDATE nifi_ops.load_dispatch SET status = 'PENDING', next_attempt_at = now() WHERE run_id = $1").bind(run).execute(&mut conn).await.unwrap();
    let mut no_url = env.config.clone();
    no_url.nifi.receiver_url = None;
    let ledger = ledger::Ledger::connect(&env.db.url, 4, 0, no_url.ledger_config())
        .await
        .unwrap();
    sqlx::query("DELETE FROM nifi_ops.load_job")
        .execute(&mut conn)
        .await
        .unwrap();
    let rows = ledger.lease_dispatches(&fence, 20).await.unwrap();
    env.dispatcher(&ledger).deliver(&fence, &rows[0]).await;
    assert_eq!(
        env.text(
            "SELECT last_error FROM nifi_ops.load_dispatch WHERE run_id = $1",
            run
        )
        .await
        .as_deref(),
        Some("build failed: no receiver URL for job JOB")
    );
}

/// PG-05 matches header names exactly and reads HTTP/1.1 (CONTRACT §12): the bytes the dispatcher
/// writes must pass NiFi's strict receiver, not only a case-insensitive one.
#[tokio::test]
async fn the_request_bytes_pass_a_receiver_as_strict_as_nifi() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let strict = e2e::nifi::receiver::Receiver::start("127.0.0.1:0", "", Default::default(), tx)
        .await
        .unwrap();
    let env = Env::start(|c| c.nifi.receiver_url = Some(format!("http://{}/", strict.addr))).await;
    let (run, dispatch) = env.validated("K").await;
    let fence = env.fence().await;
    let rows = leased(&env, &fence).await;
    env.dispatcher(&env.ledger).deliver(&fence, &rows[0]).await;
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (got.run_id, got.dispatch_id, got.job_key.as_str()),
        (run, dispatch, "JOB")
    );
    let stats = strict.stats.lock().unwrap().clone();
    assert!(
        stats.rejected.is_empty(),
        "PG-05 refused: {:?}",
        stats.rejected
    );
    let head = stats.first_request_head.expect("one request");
    assert!(
        head.starts_with("POST /validate/JOB HTTP/1.1\r\n"),
        "{head}"
    );
    for line in [
        "Content-Type: application/json".to_string(),
        format!("X-Run-Id: {run}"),
        format!("X-Dispatch-Id: {dispatch}"),
    ] {
        assert!(
            head.contains(&format!("\r\n{line}\r\n")),
            "{line:?} not sent byte for byte in:\n{head}"
        );
    }
    assert_eq!(
        env.text(
            "SELECT status FROM nifi_ops.load_dispatch WHERE run_id = $1",
            run
        )
        .await
        .as_deref(),
        Some("SENT")
    );
}

async fn status_of(env: &Env, run: Uuid) -> (String, i32, Option<i32>) {
    sqlx::query_as(
        "SELECT status, attempt_count, last_http_status FROM nifi_ops.load_dispatch WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut env.conn().await)
    .await
    .unwrap()
}

/// Leases what is due and delivers the run's dispatch with `dispatcher`.
async fn deliver_due(
    env: &Env,
    fence: &ledger::Fence,
    dispatcher: lcoperator::dispatcher::Dispatcher,
    run: Uuid,
) {
    let rows = leased(env, fence).await;
    let row = rows
        .iter()
        .find(|r| r.run_id == run)
        .expect("the run's dispatch is due");
    dispatcher.deliver(fence, row).await;
}

/// CONTRACT §6.4 key rotation, against PG-05 checking signatures as docs/nifi.md tells it to
/// (e2e's strict receiver, real HTTP): the receiver holds {old, new} and the dispatcher signs with
/// `signing_keys: [new, old]` → accepted with `X-Lca-Key-Id: new`; a receiver that holds only the
/// old key refuses the new one with 503 (the dispatch stays PENDING and is retried) and accepts the
/// retry once it is given the new key; a known id with the wrong secret is a 401 (DEAD at once);
/// a sender still on `signing_secret` (no key id) is checked against every key held.
#[tokio::test]
async fn a_key_rotation_is_accepted_by_key_id_and_an_unknown_key_is_retried() {
    use e2e::nifi::receiver::{Behaviour, Receiver, SigningKeys};
    const OLD: (&str, &str) = ("k-2026.06", "old-s3cret-0606");
    const NEW: (&str, &str) = ("k-2026.12", "new-s3cret-1212");
    let pg05_keys = SigningKeys::new(&[OLD, NEW]);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pg05 = Receiver::start(
        "127.0.0.1:0",
        "",
        Behaviour {
            signing_keys: pg05_keys.clone(),
            ..Default::default()
        },
        tx,
    )
    .await
    .unwrap();
    let env = Env::start(|c| {
        c.nifi.receiver_url = Some(format!("http://{}", pg05.addr));
        c.nifi.signing_keys = Some(
            [NEW, OLD]
                .iter()
                .map(|(id, secret)| lcconfig::config::SigningKey {
                    id: id.to_string(),
                    secret: secret.to_string(),
                })
                .collect(),
        );
    })
    .await;
    env.config.validate().unwrap();
    let fence = env.fence().await;
    let received = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<
        e2e::nifi::receiver::Dispatch,
    >| { rx.try_recv().ok() };

    // 1. PG-05 holds {old, new}; the dispatcher signs with the first of [new, old].
    let (run1, dispatch1) = env.validated("ROT-1").await;
    deliver_due(&env, &fence, env.dispatcher(&env.ledger), run1).await;
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (got.dispatch_id, got.key_id.as_deref()),
        (dispatch1, Some(NEW.0))
    );
    assert_eq!(status_of(&env, run1).await, ("SENT".into(), 1, Some(202)));
    let head = pg05
        .stats
        .lock()
        .unwrap()
        .first_request_head
        .clone()
        .unwrap();
    assert!(
        head.contains(&format!("\r\nX-Lca-Key-Id: {}\r\n", NEW.0)),
        "the key id is sent under the name PG-05 reads:\n{head}"
    );
    // Issue 42 item 3: every header name the docs and the chart tell PG-05 to read is spelled as
    // the wire has it (NiFi's attribute names are case-sensitive: `X-LCA-Key-Id` reads nothing).
    let sent: std::collections::BTreeSet<&str> = head
        .split("\r\n")
        .filter_map(|l| l.split_once(':').map(|(n, _)| n))
        .filter(|n| n.to_ascii_lowercase().starts_with("x-lca-"))
        .collect();
    assert_eq!(sent.len(), 3, "{head}");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut read = vec![];
    for file in [
        "README.md",
        "SECURITY.md",
        "charts/load-control/values.yaml",
    ]
    .into_iter()
    .map(|f| format!("{root}/{f}"))
    .chain(
        std::fs::read_dir(format!("{root}/docs"))
            .unwrap()
            .map(|e| e.unwrap().path().display().to_string()),
    ) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, _) in text.to_ascii_lowercase().match_indices("x-lca-") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            read.push((file.clone(), name));
        }
    }
    assert!(read.len() >= 3, "{read:?}");
    for (file, name) in &read {
        assert!(
            sent.contains(name.as_str()),
            "{file} names the header {name:?}; the dispatcher sends {sent:?}"
        );
    }

    // 2. PG-05 holds only the old key (the rotation's first step not done): 503, retried.
    pg05_keys.set(&[OLD]);
    let (run2, dispatch2) = env.validated("ROT-2").await;
    deliver_due(&env, &fence, env.dispatcher(&env.ledger), run2).await;
    assert_eq!(
        status_of(&env, run2).await,
        ("PENDING".into(), 1, Some(503))
    );
    assert!(received(&mut rx).is_none(), "not accepted");
    let refused = pg05.stats.lock().unwrap().signature_refused.clone();
    assert!(
        refused.len() == 1 && refused[0].contains(&format!("unknown key id \"{}\"", NEW.0)),
        "{refused:?}"
    );
    // ... PG-05 is given the new key; the retry (made due now) is accepted.
    pg05_keys.set(&[OLD, NEW]);
    env.exec(
        "UPDATE nifi_ops.load_dispatch SET next_attempt_at = now() WHERE run_id = $1",
        run2,
    )
    .await;
    deliver_due(&env, &fence, env.dispatcher(&env.ledger), run2).await;
    assert_eq!(status_of(&env, run2).await, ("SENT".into(), 2, Some(202)));
    let got = received(&mut rx).expect("the retry was accepted");
    assert_eq!(
        (got.dispatch_id, got.key_id.as_deref()),
        (dispatch2, Some(NEW.0))
    );

    // 3. A key id PG-05 holds, signed with another secret: 401, DEAD at once.
    let (run3, _) = env.validated("ROT-3").await;
    let mut forged = env.dispatcher(&env.ledger);
    forged.config.signer = Some(lcconfig::config::Signer {
        key_id: Some(OLD.0.into()),
        secret: "not-the-old-secret".into(),
    });
    deliver_due(&env, &fence, forged, run3).await;
    assert_eq!(status_of(&env, run3).await, ("DEAD".into(), 1, Some(401)));
    assert_eq!(env.events(run3, "DISPATCH_DEAD").await, 1);

    // 4. A sender still on `signing_secret` (no key id), with the old secret: accepted.
    let (run4, dispatch4) = env.validated("ROT-4").await;
    let mut legacy = env.dispatcher(&env.ledger);
    legacy.config.signer = Some(lcconfig::config::Signer {
        key_id: None,
        secret: OLD.1.into(),
    });
    deliver_due(&env, &fence, legacy, run4).await;
    assert_eq!(status_of(&env, run4).await, ("SENT".into(), 1, Some(202)));
    let got = received(&mut rx).expect("accepted");
    assert_eq!((got.dispatch_id, got.key_id), (dispatch4, None));
    assert!(
        pg05.stats.lock().unwrap().rejected.is_empty(),
        "every request was well-formed"
    );
}

/// The operator's gauges (§9.1: `lca_dispatch_backlog`, `lca_active_runs`, the database's ages)
/// are what the outbox and the runs hold (cargo-mutants: `backlog_gauges` answering an empty
/// reading survived every test).
#[tokio::test]
async fn the_backlog_gauges_count_what_the_outbox_and_the_runs_hold() {
    let env = Env::start(|_| {}).await;
    let (run, _) = env.extracting("GAUGES", &[3, 3]).await;
    for status in ["DEAD", "DEAD", "PENDING"] {
        env.exec(
            &format!(
                "INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type, partition_id, status) \
                 VALUES (gen_random_uuid(), $1, 'REISSUE_PARTITION', '0000', '{status}')"
            ),
            run,
        )
        .await;
    }
    let g = env.ledger.backlog_gauges().await.unwrap();
    let dispatches: HashMap<String, i64> = g.dispatches.iter().cloned().collect();
    assert_eq!(
        (dispatches.get("DEAD"), dispatches.get("PENDING")),
        (Some(&2), Some(&1)),
        "{g:?}"
    );
    assert!(g.runs.contains(&("EXTRACTING".to_string(), 1)), "{g:?}");
    assert!(g.xid_age > 0, "{g:?}");
}

/// `lca_monitor_alerts{kind}` (the chart's LoadControlRunFailed and LoadControlRunStale) counts
/// what the monitor lists, by the same rules: a failed run and a stale one each count once, a
/// healthy run not at all, and every kind the monitor knows is shown, zero included.
#[tokio::test]
async fn the_alert_gauge_counts_what_the_monitor_lists() {
    let env = Env::start(|_| {}).await;
    let (stale, _) = env.extracting("ALERT_STALE", &[3]).await;
    let (failed, _) = env.extracting("ALERT_FAILED", &[3]).await;
    env.extracting("ALERT_FINE", &[3]).await;
    env.exec(
        "UPDATE nifi_ops.load_run SET heartbeat_at = now() - interval '91 minutes' WHERE run_id = $1",
        stale,
    )
    .await;
    let outcome = env
        .ledger
        .fail_run(
            failed,
            &ledger::RunFailure {
                expected_status: ledger::RunStatus::Extracting,
                fail_status: ledger::RunStatus::FailedExtract,
                error_stage: "EXTRACT".into(),
                error_code: "ORA-00942".into(),
                message: "table or view does not exist".into(),
            },
        )
        .await
        .unwrap();
    assert!(outcome.changed, "{outcome:?}");
    let counts: HashMap<String, i64> = env
        .ledger
        .alert_counts()
        .await
        .unwrap()
        .into_iter()
        .collect();
    let listed = env.ledger.monitor_summary(1000).await.unwrap().alerts;
    let mut by_kind: HashMap<String, i64> = ledger::ops::monitor::ALERT_KINDS
        .iter()
        .map(|k| (k.to_string(), 0))
        .collect();
    for a in &listed {
        *by_kind.get_mut(&a.kind).expect("a kind ALERT_KINDS names") += 1;
    }
    assert_eq!(counts, by_kind, "{listed:?}");
    assert_eq!(
        (counts["RUN_FAILED"], counts["RUN_STALE"]),
        (1, 1),
        "{listed:?}"
    );
    let metrics = lcoperator::metrics::Metrics::default();
    metrics.monitor_alerts(&env.ledger.alert_counts().await.unwrap());
    let text = metrics.render();
    for line in [
        "lca_monitor_alerts{kind=\"RUN_FAILED\"} 1",
        "lca_monitor_alerts{kind=\"RUN_STALE\"} 1",
        "lca_monitor_alerts{kind=\"PUBLISH_UNKNOWN\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
}

//! Real concurrency against one run (CONTRACT §11): many tasks, each with its own HTTP client and
//! so its own connections, released together; exactly one wins and the ledger agrees.
mod common;
use common::*;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

/// A race test repeats its round until every ordering it claims to cover has happened at least
/// once (and at least `MIN_ROUNDS` times in all), and fails if one has not after `MAX_ROUNDS`: a
/// race that never went one way proves nothing about that way.
const MIN_ROUNDS: usize = 12;
const MAX_ROUNDS: usize = 80;

/// The delay that leans round `round` of a two-sided race: none, then each side held back in turn
/// by a growing multiple of `unit`, so both orderings get their chance on any machine.
fn lean(round: usize, unit: Duration) -> (Duration, Duration) {
    let margin = unit * (1 + (round / 3 % 4) as u32);
    match round % 3 {
        0 => (Duration::ZERO, Duration::ZERO),
        1 => (margin, Duration::ZERO),
        _ => (Duration::ZERO, margin),
    }
}
use uuid::Uuid;

/// Sends every `(path, body)` at once from its own client; the replies in the same order.
async fn all_at_once(api: &Api, calls: Vec<(String, Value)>) -> Vec<Reply> {
    all_at_once_skewed(
        api,
        calls
            .into_iter()
            .map(|(p, b)| (p, b, Duration::ZERO))
            .collect(),
    )
    .await
}

/// As `all_at_once`, each call held back by its own delay after the common release, so a test can
/// lean the race one way or the other and still see whichever ordering really happened.
async fn all_at_once_skewed(api: &Api, calls: Vec<(String, Value, Duration)>) -> Vec<Reply> {
    let barrier = Arc::new(Barrier::new(calls.len()));
    let tasks: Vec<_> = calls
        .into_iter()
        .map(|(path, body, delay)| {
            let barrier = barrier.clone();
            let url = format!("{}{path}", api.base);
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                // Warm the connection so the barrier releases requests, not TCP handshakes.
                client
                    .get(url.split("/v1").next().unwrap().to_string() + "/healthz")
                    .send()
                    .await
                    .unwrap();
                barrier.wait().await;
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let res = client
                    .post(url)
                    .bearer_auth(NIFI)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let status = res.status();
                let headers = res.headers().clone();
                let body: Value = res.json().await.unwrap();
                Reply {
                    status,
                    headers,
                    body,
                }
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_creates_of_one_key_make_exactly_one_run() {
    let api = Api::start().await;
    for round in 0..3 {
        let bk = format!("2026-09-{round:02}");
        let body = json!({"jobKey":"JOB","businessKey": bk,"hdfsRoot":"/data/stage","stageTablePrefix":"tmp_"});
        let replies = all_at_once(&api, vec![("/v1/runs".to_string(), body); 16]).await;
        let won: Vec<&Reply> = replies.iter().filter(|r| r.status == 200).collect();
        assert_eq!(won.len(), 1, "round {round}");
        for r in replies.iter().filter(|r| r.status != 200) {
            assert_eq!(
                (r.status.as_u16(), r.body["code"].as_str().unwrap()),
                (409, "DUPLICATE_ACTIVE_RUN")
            );
        }
        let (n,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM nifi_ops.load_run WHERE business_key = $1")
                .bind(&bk)
                .fetch_one(&mut api.conn().await)
                .await
                .unwrap();
        assert_eq!(n, 1);
        let run: Uuid = won[0].body["runId"].as_str().unwrap().parse().unwrap();
        assert_eq!(api.events(run).await, vec!["RUN_STARTED"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_claims_of_one_partition_have_one_owner() {
    let api = Api::start().await;
    for round in 0..5 {
        let run = api.extracting_run("JOB", &format!("K{round}"), &[5]).await;
        let tokens: Vec<Uuid> = (0..8).map(|_| Uuid::new_v4()).collect();
        let calls = tokens
            .iter()
            .map(|t| {
                (
                    format!("/v1/runs/{run}/partitions/0000/claim"),
                    json!({"claimToken": t, "workerNode": "n"}),
                )
            })
            .collect();
        let replies = all_at_once(&api, calls).await;
        let winners: Vec<usize> = (0..8)
            .filter(|&i| replies[i].body["claimed"] == true)
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "round {round}: {:?}",
            replies.iter().map(|r| &r.body).collect::<Vec<_>>()
        );
        assert_eq!(replies[winners[0]].body["attempt"], 1);
        let replay = api.claim(run, "0000", tokens[winners[0]]).await;
        assert_eq!(
            (
                replay.body["claimed"].as_bool(),
                replay.body["attempt"].as_i64()
            ),
            (Some(true), Some(1))
        );
        let (attempts, owner): (i32, Uuid) = sqlx::query_as(
            "SELECT attempt_count, claim_token FROM nifi_ops.load_partition WHERE run_id = $1",
        )
        .bind(run)
        .fetch_one(&mut api.conn().await)
        .await
        .unwrap();
        assert_eq!((attempts, owner), (1, tokens[winners[0]]));
        assert_eq!(
            api.events(run)
                .await
                .iter()
                .filter(|e| *e == "PARTITION_STARTED")
                .count(),
            1
        );
    }
}

/// The last chunk of every partition at the same instant: exactly one completion.
async fn last_chunks_at_once(api: &Api, partitions: usize, bk: &str) {
    let rows: Vec<i64> = (0..partitions).map(|i| 3 + i as i64).collect();
    let run = api.extracting_run("JOB", bk, &rows).await;
    let tokens: Vec<Uuid> = (0..partitions).map(|_| Uuid::new_v4()).collect();
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(api.claim(run, &pid(i), *t).await.body["claimed"], true);
        // Chunk 0 of 2 first; the race is on chunk 1, which completes each partition.
        assert_eq!(api.chunk(run, &pid(i), *t, 0, 2, 1).await.status, 200);
    }
    let last = |i: usize| {
        (
            format!("/v1/runs/{run}/partitions/{}/chunks", pid(i)),
            chunk_body(run, &pid(i), tokens[i], 1, 2, rows[i] - 1),
        )
    };
    let replies = all_at_once(api, (0..partitions).map(last).collect()).await;
    assert!(
        replies.iter().all(|r| r.status == 200),
        "{:?}",
        replies.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    assert_eq!(
        replies
            .iter()
            .filter(|r| r.body["validationScheduled"] == true)
            .count(),
        1,
        "{partitions} partitions"
    );
    assert!(
        replies
            .iter()
            .all(|r| r.body["partitionStatus"] == "SUCCESS")
    );
    // Replays of every chunk, all at once, change nothing.
    let replays = all_at_once(api, (0..partitions).map(last).collect()).await;
    assert!(
        replays
            .iter()
            .all(|r| r.status == 200 && r.body["validationScheduled"] == false)
    );
    let (status, success, expected, extracted, source): (String, i32, i32, i64, i64) = sqlx::query_as(
        "SELECT status, success_partition_count, expected_partition_count, extracted_count, source_count FROM nifi_ops.load_run WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut api.conn().await)
    .await
    .unwrap();
    assert_eq!(status, "EXTRACTED_VALIDATED");
    let recount = api
        .count(
            "SELECT count(*) FROM nifi_ops.load_partition WHERE run_id = $1 AND status = 'SUCCESS'",
            run,
        )
        .await;
    assert_eq!(
        (success as i64, expected as i64),
        (recount, partitions as i64)
    );
    assert_eq!(extracted, source);
    assert_eq!(api.count("SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND dispatch_type = 'VALIDATE_RUN'", run).await, 1);
    assert_eq!(
        api.events(run)
            .await
            .iter()
            .filter(|e| *e == "EXTRACT_VALIDATED")
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn last_chunks_of_2_8_and_32_partitions_complete_once() {
    let api = Api::start().await;
    for (round, n) in [2, 8, 32, 2, 8, 32].into_iter().enumerate() {
        last_chunks_at_once(&api, n, &format!("R{round}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_chunk_three_times_at_once_is_one_row() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "K", &[9]).await;
    let t = Uuid::new_v4();
    api.claim(run, "0000", t).await;
    let call = (
        format!("/v1/runs/{run}/partitions/0000/chunks"),
        chunk_body(run, "0000", t, 0, 3, 3),
    );
    let replies = all_at_once(&api, vec![call; 3]).await;
    assert!(
        replies
            .iter()
            .all(|r| r.status == 200 && r.body["receivedChunks"] == 1)
    );
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_file WHERE run_id = $1",
            run
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completion_and_failure_never_both_happen() {
    let api = Api::start().await;
    let mut completed = 0;
    let mut failed = 0;
    let mut round = 0;
    while round < MIN_ROUNDS || completed == 0 || failed == 0 {
        assert!(
            round < MAX_ROUNDS,
            "after {round} rounds the completion won {completed} times and the failure {failed}: \
             one ordering never happened"
        );
        let run = api
            .extracting_run("JOB", &format!("C{round}"), &[4, 4])
            .await;
        let (t0, t1) = (Uuid::new_v4(), Uuid::new_v4());
        api.claim(run, "0000", t0).await;
        api.claim(run, "0001", t1).await;
        api.chunk(run, "0001", t1, 0, 1, 4).await;
        // The last chunk of 0000 (completes the run) against a failure report for the same partition.
        let (chunk_delay, fail_delay) = lean(round, Duration::from_micros(400));
        let calls = vec![
            (
                format!("/v1/runs/{run}/partitions/0000/chunks"),
                chunk_body(run, "0000", t0, 0, 1, 4),
                chunk_delay,
            ),
            (
                format!("/v1/runs/{run}/partitions/0000/fail"),
                json!({"claimToken": t0, "errorStage":"EXTRACT","errorClass":"DB","errorCode":"ORA-1"}),
                fail_delay,
            ),
        ];
        let r = all_at_once_skewed(&api, calls).await;
        let validations = api
            .count(
                "SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1",
                run,
            )
            .await;
        match api.run_status(run).await.as_str() {
            "EXTRACTED_VALIDATED" => {
                completed += 1;
                assert_eq!(r[0].body["validationScheduled"], true);
                assert_eq!(
                    (r[1].status.as_u16(), r[1].body["code"].as_str()),
                    (409, Some("PARTITION_STATUS_MISMATCH"))
                );
                assert_eq!(validations, 1);
            }
            "FAILED_EXTRACT" => {
                failed += 1;
                assert_eq!(r[1].body["changed"], true);
                assert_eq!(r[0].body["validationScheduled"], false);
                assert_eq!(validations, 0);
                assert_eq!(api.count("SELECT count(*) FROM nifi_ops.load_partition WHERE run_id = $1 AND status IN ('PENDING','RUNNING','RETRY')", run).await, 0);
            }
            other => panic!("unexpected run status {other}"),
        }
        round += 1;
    }
    eprintln!("completion won {completed} times, failure {failed} times");
}

/// §11 #8 as the contract states it: the success of one partition racing the failure of another
/// (different rows, so no partition lock orders them; only the run row does). Whichever commits
/// first, the run fails once, no VALIDATE_RUN is written and its counters stay consistent; the
/// succeeded partition keeps SUCCESS when it won, and is ABORTED by the failure when it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn success_of_one_partition_racing_failure_of_another_fails_the_run_once() {
    let api = Api::start().await;
    let (mut success_first, mut failure_first) = (0, 0);
    let mut round = 0;
    while round < MIN_ROUNDS || success_first == 0 || failure_first == 0 {
        assert!(
            round < MAX_ROUNDS,
            "after {round} rounds the success came first {success_first} times and the failure \
             {failure_first}: one ordering never happened"
        );
        let run = api
            .extracting_run("JOB", &format!("S{round}"), &[4, 4])
            .await;
        let (t0, t1) = (Uuid::new_v4(), Uuid::new_v4());
        api.claim(run, "0000", t0).await;
        api.claim(run, "0001", t1).await;
        let (chunk_delay, fail_delay) = lean(round, Duration::from_micros(400));
        let calls = vec![
            (
                format!("/v1/runs/{run}/partitions/0000/chunks"),
                chunk_body(run, "0000", t0, 0, 1, 4),
                chunk_delay,
            ),
            (
                format!("/v1/runs/{run}/partitions/0001/fail"),
                json!({"claimToken": t1, "errorStage":"EXTRACT","errorClass":"DB","errorCode":"ORA-1"}),
                fail_delay,
            ),
        ];
        let r = all_at_once_skewed(&api, calls).await;
        assert_eq!(api.run_status(run).await, "FAILED_EXTRACT", "round {round}");
        assert_eq!(r[1].status, 200, "round {round}: {:?}", r[1].body);
        assert_eq!(r[1].body["changed"], true, "round {round}: {:?}", r[1].body);
        assert_ne!(
            r[0].body["validationScheduled"], true,
            "round {round}: a run with a failed partition never completes: {:?}",
            r[0].body
        );
        let dispatches = api
            .count(
                "SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1",
                run,
            )
            .await;
        assert_eq!(dispatches, 0, "round {round}: no VALIDATE_RUN");
        let unfinished = api.count("SELECT count(*) FROM nifi_ops.load_partition WHERE run_id = $1 AND status IN ('PENDING','RUNNING','RETRY')", run).await;
        assert_eq!(unfinished, 0, "round {round}: nothing left running");
        let counters_agree = api.count("SELECT count(*) FROM nifi_ops.load_run r WHERE run_id = $1 AND extracted_count = 0 AND success_partition_count = (SELECT count(*) FROM nifi_ops.load_partition p WHERE p.run_id = r.run_id AND p.status = 'SUCCESS')", run).await;
        assert_eq!(
            counters_agree, 1,
            "round {round}: counters agree with the rows"
        );
        let (status,): (String,) = sqlx::query_as(
            "SELECT status FROM nifi_ops.load_partition WHERE run_id = $1 AND partition_id = '0000'",
        )
        .bind(run)
        .fetch_one(&mut api.conn().await)
        .await
        .unwrap();
        match status.as_str() {
            "SUCCESS" => {
                success_first += 1;
                assert_eq!(r[0].status, 200, "round {round}: {:?}", r[0].body);
            }
            "ABORTED" => failure_first += 1,
            other => panic!("round {round}: partition 0000 is {other}"),
        }
        round += 1;
    }
    eprintln!("success first {success_first} times, failure first {failure_first} times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_owner_is_refused_after_a_reset_and_writes_nothing() {
    let api = Api::start().await;
    let run = api.extracting_run("JOB", "K", &[6]).await;
    let (old, new) = (Uuid::new_v4(), Uuid::new_v4());
    api.claim(run, "0000", old).await;
    api.chunk(run, "0000", old, 0, 2, 3).await;
    // The sweeper's REISSUE reset (CONTRACT §2.3), as the sweeper writes it.
    let mut conn = api.conn().await;
    sqlx::query(
        "UPDATE nifi_ops.load_partition SET status = 'RETRY', claim_token = NULL, worker_node = NULL, error_code = 'HEARTBEAT_STALE' WHERE run_id = $1",
    )
    .bind(run)
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("UPDATE nifi_ops.load_file SET status = 'FAILED' WHERE run_id = $1")
        .bind(run)
        .execute(&mut conn)
        .await
        .unwrap();
    let before_reclaim = api.chunk(run, "0000", old, 1, 2, 3).await;
    assert_eq!(
        before_reclaim.body["code"], "CLAIM_MISMATCH",
        "a NULL token after the reset matches nobody"
    );
    let reclaimed = api.claim(run, "0000", new).await;
    assert_eq!(
        (
            reclaimed.body["claimed"].as_bool(),
            reclaimed.body["attempt"].as_i64()
        ),
        (Some(true), Some(2))
    );
    let calls = vec![
        (
            format!("/v1/runs/{run}/partitions/0000/chunks"),
            chunk_body(run, "0000", old, 1, 2, 3),
        ),
        (
            format!("/v1/runs/{run}/partitions/0000/fail"),
            json!({"claimToken": old, "errorStage":"E","errorClass":"C","errorCode":"X"}),
        ),
    ];
    let r = all_at_once(&api, calls).await;
    assert!(
        r.iter()
            .all(|r| r.status == 409 && r.body["code"] == "CLAIM_MISMATCH")
    );
    assert_eq!(
        api.count(
            "SELECT count(*) FROM nifi_ops.load_file WHERE run_id = $1 AND chunk_index = 1",
            run
        )
        .await,
        0
    );
    assert_eq!(api.run_status(run).await, "EXTRACTING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_validation_starts_with_one_dispatch_start_once() {
    let api = Api::start().await;
    for round in 0..4 {
        let (run, dispatch) = api.validated_run(&format!("V{round}")).await;
        let call = (
            format!("/v1/runs/{run}/validation/start"),
            json!({"dispatchId": dispatch, "node": "n"}),
        );
        let replies = all_at_once(&api, vec![call; 8]).await;
        assert!(replies.iter().all(|r| r.status == 200));
        assert_eq!(
            replies.iter().filter(|r| r.body["started"] == true).count(),
            1
        );
        assert_eq!(api.count("SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND status = 'ACKED'", run).await, 1);
        assert_eq!(
            api.events(run)
                .await
                .iter()
                .filter(|e| *e == "STAGE_VALIDATION_STARTED")
                .count(),
            1
        );
        assert_eq!(api.run_status(run).await, "STAGE_VALIDATING");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_publish_claims_have_one_owner() {
    let api = Api::start().await;
    for round in 0..4 {
        let run = api.stage_validated_run(&format!("P{round}")).await;
        let tokens: Vec<Uuid> = (0..8).map(|_| Uuid::new_v4()).collect();
        let calls = tokens
            .iter()
            .map(|t| {
                (
                    format!("/v1/runs/{run}/publish/claim"),
                    json!({"publishToken": t}),
                )
            })
            .collect();
        let replies = all_at_once(&api, calls).await;
        let winners: Vec<usize> = (0..8)
            .filter(|&i| replies[i].body["claimed"] == true)
            .collect();
        assert_eq!(winners.len(), 1);
        let (stored,): (Uuid,) =
            sqlx::query_as("SELECT publish_token FROM nifi_ops.load_run WHERE run_id = $1")
                .bind(run)
                .fetch_one(&mut api.conn().await)
                .await
                .unwrap();
        assert_eq!(stored, tokens[winners[0]]);
        let loser = tokens[(winners[0] + 1) % 8];
        let r = api
            .post(
                &format!("/v1/runs/{run}/publish/result"),
                json!({"publishToken": loser, "outcome": "PUBLISHED"}),
            )
            .await;
        assert_eq!(r.body["code"], "PUBLISH_TOKEN_MISMATCH");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_resolutions_change_the_run_once() {
    let api = Api::start().await;
    for round in 0..4 {
        let (run, token) = api.publishing_run(&format!("U{round}")).await;
        api.post(
            &format!("/v1/runs/{run}/publish/result"),
            json!({"publishToken": token, "outcome": "PUBLISH_UNKNOWN"}),
        )
        .await;
        let path = format!("/v1/runs/{run}/publish-unknown/resolve");
        let barrier = Arc::new(Barrier::new(8));
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let (barrier, url) = (barrier.clone(), format!("{}{path}", api.base));
                let resolution = if i % 2 == 0 {
                    "PUBLISHED"
                } else {
                    "FAILED_PUBLISH"
                };
                tokio::spawn(async move {
                    let client = reqwest::Client::new();
                    barrier.wait().await;
                    let res = client
                        .post(url)
                        .bearer_auth(OPERATOR)
                        .json(&json!({"resolution": resolution, "reason": "checked by hand"}))
                        .send()
                        .await
                        .unwrap();
                    (res.status().as_u16(), res.json::<Value>().await.unwrap())
                })
            })
            .collect();
        let mut changed = 0;
        for t in tasks {
            let (status, body) = t.await.unwrap();
            if status == 200 && body["changed"] == true {
                changed += 1;
            } else {
                assert!(status == 409 || body["changed"] == false, "{status} {body}");
            }
        }
        assert_eq!(changed, 1);
        assert_eq!(
            api.events(run)
                .await
                .iter()
                .filter(|e| *e == "PUBLISH_UNKNOWN_RESOLVED")
                .count(),
            1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_racing_the_last_chunks_ends_in_one_consistent_state() {
    let api = Api::start().await;
    let (mut cancelled, mut completed) = (0, 0);
    let mut round = 0;
    while round < MIN_ROUNDS || cancelled == 0 || completed == 0 {
        assert!(
            round < MAX_ROUNDS,
            "after {round} rounds the cancel came first {cancelled} times and the completion \
             {completed}: one ordering never happened"
        );
        // Four chunk reports (each its own handshake) against one cancel: the chunks need a wider
        // margin to finish first.
        let (chunk_delay, cancel_delay) = lean(round, Duration::from_millis(5));
        let run = api
            .extracting_run("JOB", &format!("X{round}"), &[2, 2, 2, 2])
            .await;
        let tokens: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        for (i, t) in tokens.iter().enumerate() {
            api.claim(run, &pid(i), *t).await;
        }
        let barrier = Arc::new(Barrier::new(5));
        let mut tasks = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            let (barrier, url, body) = (
                barrier.clone(),
                format!("{}/v1/runs/{run}/partitions/{}/chunks", api.base, pid(i)),
                chunk_body(run, &pid(i), *t, 0, 1, 2),
            );
            let healthz = format!("{}/healthz", api.base);
            tasks.push(tokio::spawn(async move {
                let client = reqwest::Client::new();
                // Warm the connection so the barrier releases requests, not TCP handshakes.
                client.get(healthz).send().await.unwrap();
                barrier.wait().await;
                tokio::time::sleep(chunk_delay).await;
                client
                    .post(url)
                    .bearer_auth(NIFI)
                    .json(&body)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }));
        }
        let cancel = {
            let (barrier, url) = (
                barrier.clone(),
                format!("{}/v1/runs/{run}/cancel", api.base),
            );
            let healthz = format!("{}/healthz", api.base);
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                client.get(healthz).send().await.unwrap();
                barrier.wait().await;
                tokio::time::sleep(cancel_delay).await;
                client
                    .post(url)
                    .bearer_auth(OPERATOR)
                    .json(&json!({"reason": "operator stop"}))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        };
        for t in tasks {
            assert_eq!(t.await.unwrap(), 200);
        }
        assert_eq!(
            cancel.await.unwrap(),
            200,
            "cancel is allowed before and after completion"
        );
        assert_eq!(api.run_status(run).await, "CANCELLED");
        let unfinished = api.count("SELECT count(*) FROM nifi_ops.load_partition WHERE run_id = $1 AND status IN ('PENDING','RUNNING','RETRY')", run).await;
        let live = api.count("SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND status IN ('PENDING','SENT')", run).await;
        assert_eq!(
            (unfinished, live),
            (0, 0),
            "nothing left running after a cancel"
        );
        let validate = api.count("SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND dispatch_type = 'VALIDATE_RUN'", run).await;
        if validate == 1 {
            completed += 1;
            let dead = api.count("SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND status = 'DEAD' AND last_error = 'run cancelled'", run).await;
            assert_eq!(
                dead, 1,
                "the completion's VALIDATE_RUN row was settled by the cancel"
            );
        } else {
            cancelled += 1;
        }
        round += 1;
    }
    eprintln!("cancel first {cancelled} times, completion first {completed} times");
}

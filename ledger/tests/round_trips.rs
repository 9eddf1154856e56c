//! Issue 30 item 1: a chunk report is one round trip to PostgreSQL whatever it decides
//! (`nifi_ops.report_chunk_v2` on its own, ledger/functions/: progress, the partition's
//! success, the run's completion), counted on the wire by a forwarder between the ledger and the
//! server; only a gate mismatch, which fails the run, decides again in a transaction under the
//! run's exclusive lock. A claim, whatever it answers, is one round trip too
//! (`nifi_ops.claim_partition_v2`, ledger/functions/), and still writes its event with it.
//! And the run-directory rule (§4.7 step 4), which now lives in record_chunk, refuses every alias
//! of a file and nothing else.
use ledger::{
    Actor, ChunkReport, ChunkResult, LedgerConfig, LedgerError, PartitionStatus, RunStatus,
};
use sqlx::postgres::PgListener;
use testkit::{RoundTrips, TestDb, claim_all, extracting_run, new_run, notified_until_now};
use uuid::Uuid;

fn report(token: Uuid, index: i32, count: i32, path: String) -> ChunkReport {
    ChunkReport {
        claim_token: token,
        chunk_index: index,
        chunk_count: count,
        fragment_identifier: None,
        hdfs_path: path,
        record_count: 10,
        byte_count: Some(100),
    }
}

/// The report that completes a run: `nifi_ops.report_chunk_v2` alone. Fourteen statements before
/// issue 30 (the try, BEGIN, the run lock, the chunk, the SUCCESS, its event, the pin, the run
/// row's write lock, the CAS, two NOTIFYs, the outbox row, its event, COMMIT), ten before the
/// decision became one statement.
const COMPLETING_STATEMENTS: u64 = 1;

/// What `call` answers, and the statements it sent.
async fn counted<T>(wire: &RoundTrips, call: impl std::future::Future<Output = T>) -> (T, u64) {
    let before = wire.statements();
    let out = call.await;
    (out, wire.statements() - before)
}

/// A fresh database and a ledger of one connection through a forwarder to it: every statement
/// of the ledger passes the forwarder on that connection.
async fn through_the_forwarder() -> (TestDb, RoundTrips, ledger::Ledger) {
    let db = TestDb::fresh().await;
    let wire = RoundTrips::start(&db.url).await;
    let ledger = ledger::Ledger::connect(&wire.url, 1, 0, LedgerConfig::default())
        .await
        .expect("connect the ledger through the forwarder");
    (db, wire, ledger)
}

#[tokio::test]
async fn a_progress_report_is_one_round_trip_and_the_last_one_decides() {
    let (db, wire, ledger) = through_the_forwarder().await;
    let created = extracting_run(&ledger, "round-trips", &[40, 40, 10]).await;
    let run = created.run_id;
    let token = Uuid::new_v4();
    claim_all(&ledger, run, &["0000", "0001", "0002"], token).await;
    let path = |pid: &str, i: i32| format!("{}/p={pid}/part-{i}.parquet", created.hdfs_run_path);
    // The first report prepares the statement on the connection (a Parse/Describe exchange of
    // its own, once per connection): measured from the second on.
    let first = ledger
        .report_chunk(run, "0000", &report(token, 0, 4, path("0000", 0)))
        .await
        .unwrap();
    assert_eq!(first.result, ChunkResult::Progress);
    let mut sent = Vec::new();
    for (i, replay) in [(1, false), (1, true), (2, false)] {
        let before = wire.statements();
        let out = ledger
            .report_chunk(run, "0000", &report(token, i, 4, path("0000", i)))
            .await
            .unwrap();
        sent.push(wire.statements() - before);
        assert_eq!(
            (
                out.result,
                out.partition_status,
                out.run_status,
                out.received_chunks
            ),
            (
                ChunkResult::Progress,
                PartitionStatus::Running,
                RunStatus::Extracting,
                i64::from(i) + 1
            ),
            "chunk {i} (replay: {replay})"
        );
    }
    assert_eq!(
        sent,
        vec![1, 1, 1],
        "statements per progress report (a new chunk, its identical replay, the next chunk)"
    );
    // Refusals are answered from the same one statement, writing nothing.
    let before = wire.statements();
    let refused = ledger
        .report_chunk(run, "0000", &report(Uuid::new_v4(), 3, 4, path("0000", 3)))
        .await;
    assert!(
        matches!(refused, Err(LedgerError::ClaimMismatch)),
        "{refused:?}"
    );
    assert_eq!(wire.statements() - before, 1, "a refusal's statements");

    // The last chunk of a partition decides, in the same one statement.
    let before = wire.statements();
    let done = ledger
        .report_chunk(run, "0000", &report(token, 3, 4, path("0000", 3)))
        .await
        .unwrap();
    let decision = wire.statements() - before;
    assert_eq!(
        (done.result, done.partition_status, done.run_status),
        (
            ChunkResult::PartitionSuccess,
            PartitionStatus::Success,
            RunStatus::Extracting
        )
    );
    // Six before this (the try, BEGIN, the run lock, the chunk statement, the SUCCESS with its
    // event and pin, COMMIT), eight before the SUCCESS, its event and its pin were one call.
    assert_eq!(
        decision, 1,
        "statements of the deciding report of a partition that is not the last"
    );
    // A report to the succeeded partition that changes a chunk is a conflict, answered from the
    // one statement, which writes nothing; so is its identical replay (Ignored: NiFi's replay
    // carries no decision of its own).
    let mut changed = report(token, 3, 4, path("0000", 3));
    changed.record_count = 11;
    let (conflict, sent) = counted(&wire, ledger.report_chunk(run, "0000", &changed)).await;
    assert!(
        matches!(conflict, Err(LedgerError::ChunkConflict)),
        "{conflict:?}"
    );
    assert_eq!(sent, 1, "a conflict's statements");
    let before = wire.statements();
    let replay = ledger
        .report_chunk(run, "0000", &report(token, 3, 4, path("0000", 3)))
        .await
        .unwrap();
    assert_eq!(
        (
            replay.result,
            replay.partition_status,
            wire.statements() - before
        ),
        (ChunkResult::Ignored, PartitionStatus::Success, 1)
    );
    // A partition of one chunk: its only report decides, in one statement too.
    let (single, sent) = counted(
        &wire,
        ledger.report_chunk(run, "0002", &report(token, 0, 1, path("0002", 0))),
    )
    .await;
    assert_eq!(single.unwrap().result, ChunkResult::PartitionSuccess);
    assert_eq!(sent, 1, "a single chunk's statements");
    // The other partition completes the run, exactly once.
    let mut completing = 0;
    for i in 0..4 {
        let before = wire.statements();
        let out = ledger
            .report_chunk(run, "0001", &report(token, i, 4, path("0001", i)))
            .await
            .unwrap();
        completing = wire.statements() - before;
        let expected = if i == 3 {
            ChunkResult::RunComplete
        } else {
            ChunkResult::Progress
        };
        assert_eq!(out.result, expected, "chunk {i} of 0001");
    }
    // The last success pins nothing: it then locks the run row, recounts and completes.
    assert_eq!(
        completing, COMPLETING_STATEMENTS,
        "statements of the report that completes the run"
    );
    let mut conn = db.conn().await;
    let (status, files, records): (String, i64, i64) = sqlx::query_as(
        "SELECT r.status, (SELECT count(*) FROM nifi_ops.load_file f WHERE f.run_id = r.run_id), \
                (SELECT sum(record_count)::bigint FROM nifi_ops.load_file f WHERE f.run_id = r.run_id) \
           FROM nifi_ops.load_run r WHERE r.run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), files, records),
        ("EXTRACTED_VALIDATED", 9, 90),
        "the conflicting report wrote nothing"
    );
}

#[tokio::test]
async fn the_run_directory_rule_refuses_every_alias_and_nothing_else() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let created = extracting_run(&ledger, "paths", &[1_000]).await;
    let run = created.run_id;
    let token = Uuid::new_v4();
    ledger
        .claim_partition(run, "0000", token, "nifi-01")
        .await
        .unwrap();
    let root = created.hdfs_run_path.as_str();
    let accepted = [
        format!("{root}/p=0000/part-0.parquet"),
        format!("{root}/x"),
        format!("{root}/p/f"),
        format!("{root}/a/b/c/d.parquet"),
        format!("{root}/..x/f"),
        format!("{root}/.hidden"),
    ];
    let refused = [
        root.to_string(),
        format!("{root}/"),
        format!("{root}0/x"),
        format!("{root}x/part.parquet"),
        format!("{root}/../run_id=2/x"),
        format!("{root}/p/../f"),
        format!("{root}/p/.."),
        format!("{root}/p//f"),
        format!("{root}/p/./f"),
        format!("{root}/./p/f"),
        format!("{root}//p/f"),
        format!("{root}/p/"),
        "/data/other/x".to_string(),
        format!("x{root}/f"),
    ];
    for (i, path) in accepted.iter().enumerate() {
        let out = ledger
            .report_chunk(run, "0000", &report(token, i as i32, 100, path.clone()))
            .await;
        assert!(
            matches!(&out, Ok(o) if o.result == ChunkResult::Progress),
            "{path}: {out:?}"
        );
    }
    for (i, path) in refused.iter().enumerate() {
        let out = ledger
            .report_chunk(
                run,
                "0000",
                &report(token, 50 + i as i32, 100, path.clone()),
            )
            .await;
        assert!(
            matches!(out, Err(LedgerError::HdfsPathOutsideRun)),
            "{path}: {out:?}"
        );
    }
    let mut conn = db.conn().await;
    let stored: Vec<String> = sqlx::query_scalar(
        "SELECT hdfs_path FROM nifi_ops.load_file WHERE run_id = $1 ORDER BY chunk_index",
    )
    .bind(run)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        stored,
        accepted.to_vec(),
        "only the accepted paths are recorded"
    );
}

#[tokio::test]
async fn a_claim_is_one_round_trip_whatever_it_answers() {
    let (db, wire, ledger) = through_the_forwarder().await;
    let created = extracting_run(&ledger, "claim-trips", &[10, 10, 10]).await;
    let run = created.run_id;
    let token = Uuid::new_v4();
    // The first claim prepares the statement on the connection: measured from the second on.
    ledger
        .claim_partition(run, "0000", token, "nifi-01")
        .await
        .unwrap();
    let other = Uuid::new_v4();
    let mut answers = Vec::new();
    for (pid, t, what) in [
        ("0001", token, "a new claim"),
        ("0001", token, "its replay (the answer was lost)"),
        (
            "0001",
            other,
            "another worker's claim of a running partition",
        ),
    ] {
        let before = wire.statements();
        let out = ledger
            .claim_partition(run, pid, t, "nifi-02")
            .await
            .unwrap();
        assert_eq!(wire.statements() - before, 1, "statements of {what}");
        answers.push((
            out.claimed,
            out.partition_status,
            out.run_status,
            out.attempt,
        ));
    }
    let running = (PartitionStatus::Running, RunStatus::Extracting, 1);
    assert_eq!(
        answers,
        vec![
            (true, running.0, running.1, running.2),
            (true, running.0, running.1, running.2),
            (false, running.0, running.1, running.2),
        ]
    );
    let before = wire.statements();
    let missing = ledger.claim_partition(run, "0009", token, "nifi-02").await;
    assert!(
        matches!(missing, Err(LedgerError::PartitionNotFound)),
        "{missing:?}"
    );
    let unknown = ledger
        .claim_partition(Uuid::new_v4(), "0000", token, "nifi-02")
        .await;
    assert!(
        matches!(unknown, Err(LedgerError::RunNotFound)),
        "{unknown:?}"
    );
    assert_eq!(wire.statements() - before, 2, "statements of two refusals");

    // The claim's event is written with it, once per claim that took the partition: not by the
    // replay, not by the refused claim.
    let mut conn = db.conn().await;
    let events: Vec<(
        String,
        String,
        Option<String>,
        String,
        String,
        serde_json::Value,
    )> = sqlx::query_as(
        "SELECT event_level, event_name, partition_id, job_key, processor_name, details \
               FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'PARTITION_STARTED' \
              ORDER BY event_id",
    )
    .bind(run)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let started = |pid: &str, worker: &str| {
        (
            "INFO".to_string(),
            "PARTITION_STARTED".to_string(),
            Some(pid.to_string()),
            new_run("claim-trips").job_key,
            "partition_started".to_string(),
            serde_json::json!({"workerNode": worker, "attempt": 1}),
        )
    };
    assert_eq!(
        events,
        vec![started("0000", "nifi-01"), started("0001", "nifi-02")]
    );
    let (worker, owner, attempts): (String, Uuid, i32) = sqlx::query_as(
        "SELECT worker_node, claim_token, attempt_count FROM nifi_ops.load_partition \
          WHERE run_id = $1 AND partition_id = '0001'",
    )
    .bind(run)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!((worker.as_str(), owner, attempts), ("nifi-02", token, 1));
}

/// A statement run alone may commit and then lose its connection before the answer arrives: the
/// ledger repeats it on a new connection (`alone!`), and the repeat must find its own write and
/// answer the same, writing nothing twice. The fault is injected on the wire: the forwarder lets
/// the claim (and then a chunk report) run to its end on the server, then closes the connection
/// without a byte of the answer.
#[tokio::test]
async fn a_claim_or_report_whose_answer_is_lost_is_repeated_and_answered_the_same() {
    let (db, wire, ledger) = through_the_forwarder().await;
    let created = extracting_run(&ledger, "lost-answers", &[30, 30]).await;
    let run = created.run_id;
    let token = Uuid::new_v4();
    ledger
        .claim_partition(run, "0000", token, "nifi-01")
        .await
        .unwrap();

    wire.lose_next_answer();
    let claim = ledger
        .claim_partition(run, "0001", token, "nifi-02")
        .await
        .expect("the claim is repeated on a new connection");
    assert_eq!(wire.answers_lost(), 1, "the claim's answer was lost");
    assert_eq!(
        (
            claim.claimed,
            claim.partition_status,
            claim.run_status,
            claim.attempt
        ),
        (true, PartitionStatus::Running, RunStatus::Extracting, 1),
        "the repeat is answered as the lost answer would have been"
    );

    let path = |i: i32| format!("{}/p=0001/part-{i}.parquet", created.hdfs_run_path);
    ledger
        .report_chunk(run, "0001", &report(token, 0, 3, path(0)))
        .await
        .unwrap();
    wire.lose_next_answer();
    let progress = ledger
        .report_chunk(run, "0001", &report(token, 1, 3, path(1)))
        .await
        .expect("the report is repeated on a new connection");
    assert_eq!(wire.answers_lost(), 2, "the report's answer was lost");
    assert_eq!(
        (progress.result, progress.received_chunks),
        (ChunkResult::Progress, 2)
    );

    let mut conn = db.conn().await;
    let (started, attempts, files): (i64, i32, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM nifi_ops.load_event e WHERE e.run_id = p.run_id \
                   AND e.partition_id = p.partition_id AND e.event_name = 'PARTITION_STARTED'), \
                p.attempt_count, \
                (SELECT count(*) FROM nifi_ops.load_file f WHERE f.run_id = p.run_id \
                   AND f.partition_id = p.partition_id) \
           FROM nifi_ops.load_partition p WHERE p.run_id = $1 AND p.partition_id = '0001'",
    )
    .bind(run)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (started, attempts, files),
        (1, 1, 2),
        "one claim, one event, two chunks: nothing written twice"
    );
}

/// A transaction whose COMMIT got no answer may have committed: PostgreSQL keeps a commit whose
/// connection was terminated while it waited for a synchronous standby. A cancel is not
/// repeatable as such (its replay answers "nothing changed"), so answering such a commit as a
/// failure would tell the operator the cancel failed when it did not. The ledger looks for the
/// transaction's event from a new connection: there, the cancel is answered as made; not there
/// (the COMMIT never reached the server), the error stands and nothing changed.
#[tokio::test]
async fn a_commit_whose_answer_is_lost_is_answered_as_what_happened() {
    let (db, wire, ledger) = through_the_forwarder().await;
    let mut conn = db.conn().await;
    let actor = Actor {
        name: "alice".into(),
        role: "operator".into(),
    };
    let kept = extracting_run(&ledger, "commit-kept", &[10]).await.run_id;
    let dropped = extracting_run(&ledger, "commit-dropped", &[10])
        .await
        .run_id;

    wire.lose_next_commit_answer();
    let cancel = ledger
        .cancel_run(kept, "no longer needed", &actor, None)
        .await
        .expect("the cancel committed: answered as made");
    assert_eq!(wire.answers_lost(), 1, "the COMMIT's answer was lost");
    assert_eq!(
        (cancel.changed, cancel.run_status),
        (true, RunStatus::Cancelled)
    );

    wire.drop_next_commit();
    let refused = ledger
        .cancel_run(dropped, "no longer needed", &actor, None)
        .await;
    assert_eq!(wire.answers_lost(), 2, "the COMMIT was dropped");
    assert!(
        matches!(refused, Err(LedgerError::Database(_))),
        "{refused:?}"
    );

    let statuses: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT run_id, status FROM nifi_ops.load_run WHERE run_id = ANY($1) ORDER BY business_key",
    )
    .bind(vec![dropped, kept])
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        statuses,
        vec![
            (dropped, "EXTRACTING".to_string()),
            (kept, "CANCELLED".to_string()),
        ],
        "the dropped COMMIT changed nothing; the lost answer's did"
    );
    // And the dropped one's cancel, repeated now, changes the run: nothing of it had stayed.
    let again = ledger
        .cancel_run(dropped, "no longer needed", &actor, None)
        .await
        .unwrap();
    assert!(again.changed);
}

/// A validation start (§4.9) is one statement (`nifi_ops.start_validation_v2`, first in migration
/// 20261204000016; eight before: BEGIN, the run lock, the dispatch's lock, the ACK, the CAS, the
/// event, the SOURCE metrics, COMMIT). It is not repeatable (a second start is refused), so when
/// its answer is lost the ledger repeats it with the same event id, and the repeat, finding its
/// own STAGE_VALIDATION_STARTED, answers the start it made; a second delivery of the dispatch is
/// refused as before.
#[tokio::test]
async fn a_validation_start_is_one_round_trip_and_its_lost_answer_is_answered_as_started() {
    let (db, wire, ledger) = through_the_forwarder().await;
    let mut conn = db.conn().await;
    // Two runs, each extracted and waiting for its validation start.
    let mut waiting = Vec::new();
    for key in ["start-counted", "start-kept"] {
        let created = extracting_run(&ledger, key, &[10]).await;
        let run = created.run_id;
        let token = Uuid::new_v4();
        claim_all(&ledger, run, &["0000"], token).await;
        let path = format!("{}/p=0000/part-0.parquet", created.hdfs_run_path);
        let done = ledger
            .report_chunk(run, "0000", &report(token, 0, 1, path))
            .await
            .unwrap();
        assert_eq!(done.run_status, RunStatus::ExtractedValidated);
        sqlx::query(
            "INSERT INTO nifi_ops.load_validation (run_id, stage, metric_name, actual_value, result, query_version) \
             VALUES ($1, 'SOURCE', 'row_count', '10', 'PASS', 'v1')",
        )
        .bind(run)
        .execute(&mut conn)
        .await
        .unwrap();
        let dispatch: Uuid = sqlx::query_scalar(
            "SELECT dispatch_id FROM nifi_ops.load_dispatch WHERE run_id = $1 AND dispatch_type = 'VALIDATE_RUN'",
        )
        .bind(run)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        waiting.push((run, dispatch));
    }

    // The first call prepares the statement on the connection: counted from the second on.
    let (counted_run, counted_dispatch) = waiting[0];
    let first = ledger
        .start_validation(counted_run, counted_dispatch, "nifi-02")
        .await
        .unwrap();
    assert!(first.started);
    let (again, sent) = counted(
        &wire,
        ledger.start_validation(counted_run, counted_dispatch, "nifi-02"),
    )
    .await;
    let again = again.unwrap();
    assert_eq!(
        (again.started, again.run_status, sent),
        (false, RunStatus::StageValidating, 1),
        "a second delivery is refused, in one statement"
    );

    let (kept, kept_dispatch) = waiting[1];
    wire.lose_next_answer();
    let (start, sent) = counted(
        &wire,
        ledger.start_validation(kept, kept_dispatch, "nifi-02"),
    )
    .await;
    let start = start.expect("the start committed: answered as made");
    assert_eq!(wire.answers_lost(), 1, "the start's answer was lost");
    assert_eq!(sent, 2, "the start and its repeat");
    assert_eq!(
        (
            start.started,
            start.run_status,
            start.source_count,
            start.extracted_count,
            start.source_metrics.get("row_count").cloned()
        ),
        (
            true,
            RunStatus::StageValidating,
            Some(10),
            Some(10),
            Some(serde_json::json!("10"))
        ),
        "the repeat answers the start it made, its metrics included"
    );
    let (starts, acked): (i64, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM nifi_ops.load_event e \
                  WHERE e.run_id = $1 AND e.event_name = 'STAGE_VALIDATION_STARTED'), \
                (SELECT status FROM nifi_ops.load_dispatch WHERE dispatch_id = $2)",
    )
    .bind(kept)
    .bind(kept_dispatch)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        (starts, acked.as_str()),
        (1, "ACKED"),
        "one start, acknowledged"
    );
}

/// A run's status changes wake the LoadRun mirror (§3.9) and, on completion, the dispatcher
/// (§6.1) from the statement that makes them (`RETURNING pg_notify(…)` of the CAS): the
/// notifications arrive, cost no statement of their own, and none is sent when nothing changed.
#[tokio::test]
async fn a_status_change_notifies_from_the_statement_that_makes_it() {
    let (db, wire, ledger) = through_the_forwarder().await;
    let mut listener = PgListener::connect(&db.url).await.unwrap();
    listener
        .listen_all(["load_run", "load_dispatch"])
        .await
        .unwrap();
    let created = extracting_run(&ledger, "notify", &[10]).await;
    let run = created.run_id;
    let token = Uuid::new_v4();
    claim_all(&ledger, run, &["0000"], token).await;
    notified_until_now(&db, &mut listener, "load_run").await;

    let path = format!("{}/p=0000/part-0.parquet", created.hdfs_run_path);
    let (done, sent) = counted(
        &wire,
        ledger.report_chunk(run, "0000", &report(token, 0, 1, path)),
    )
    .await;
    assert_eq!(done.unwrap().result, ChunkResult::RunComplete);
    assert_eq!(
        sent, COMPLETING_STATEMENTS,
        "statements of the single chunk that completes the run"
    );
    let mut woken = notified_until_now(&db, &mut listener, "load_run").await;
    woken.sort();
    assert_eq!(
        woken,
        vec![
            ("load_dispatch".to_string(), run.to_string()),
            ("load_run".to_string(), run.to_string())
        ],
        "the completion wakes the dispatcher and the mirror"
    );

    let actor = Actor {
        name: "alice".into(),
        role: "operator".into(),
    };
    let cancelled = ledger
        .cancel_run(run, "no longer needed", &actor, None)
        .await
        .unwrap();
    assert_eq!(
        (cancelled.changed, cancelled.run_status),
        (true, RunStatus::Cancelled)
    );
    assert_eq!(
        notified_until_now(&db, &mut listener, "load_run").await,
        vec![("load_run".to_string(), run.to_string())],
        "a transition wakes the mirror"
    );
    let again = ledger
        .cancel_run(run, "no longer needed", &actor, None)
        .await
        .unwrap();
    assert!(!again.changed);
    assert_eq!(
        notified_until_now(&db, &mut listener, "load_run").await,
        vec![],
        "nothing changed, nothing sent"
    );
}

/// A deciding report whose answer is lost is repeated on a new connection (it is one statement,
/// which may have committed) and answered as the decision it made, not as a late report: the
/// repeat carries the ids of the events the first attempt wrote, and finds them. A partition's
/// success, then the run's completion; nothing is written twice.
#[tokio::test]
async fn a_decision_whose_answer_is_lost_is_repeated_and_answered_as_decided() {
    let (db, wire, ledger) = through_the_forwarder().await;
    let created = extracting_run(&ledger, "success-kept", &[10, 10]).await;
    let run = created.run_id;
    let token = Uuid::new_v4();
    claim_all(&ledger, run, &["0000", "0001"], token).await;
    let path = |pid: &str| format!("{}/p={pid}/part-0.parquet", created.hdfs_run_path);
    let mut answers = Vec::new();
    for (pid, lost) in [("0000", 1), ("0001", 2)] {
        wire.lose_next_answer();
        let done = ledger
            .report_chunk(run, pid, &report(token, 0, 1, path(pid)))
            .await
            .expect("the decision committed: answered as such");
        assert_eq!(wire.answers_lost(), lost, "the answer for {pid} was lost");
        answers.push((done.result, done.partition_status, done.run_status));
    }
    assert_eq!(
        answers,
        vec![
            (
                ChunkResult::PartitionSuccess,
                PartitionStatus::Success,
                RunStatus::Extracting
            ),
            (
                ChunkResult::RunComplete,
                PartitionStatus::Success,
                RunStatus::ExtractedValidated
            )
        ]
    );
    // NiFi's own replay of the report (new ids) is a late report.
    let replay = ledger
        .report_chunk(run, "0001", &report(token, 0, 1, path("0001")))
        .await
        .unwrap();
    assert_eq!(replay.result, ChunkResult::Ignored);
    let (successes, completions, dispatches, status): (i64, i64, i64, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM nifi_ops.load_event e \
                  WHERE e.run_id = r.run_id AND e.event_name = 'PARTITION_SUCCESS'), \
                (SELECT count(*) FROM nifi_ops.load_event e \
                  WHERE e.run_id = r.run_id AND e.event_name = 'EXTRACT_VALIDATED'), \
                (SELECT count(*) FROM nifi_ops.load_dispatch d \
                  WHERE d.run_id = r.run_id AND d.dispatch_type = 'VALIDATE_RUN'), \
                r.status \
           FROM nifi_ops.load_run r WHERE r.run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut db.conn().await)
    .await
    .unwrap();
    assert_eq!(
        (successes, completions, dispatches, status.as_str()),
        (2, 1, 1, "EXTRACTED_VALIDATED")
    );
}

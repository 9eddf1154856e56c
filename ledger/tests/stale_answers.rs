//! A report or a claim that waited for its run or its partition answers (and decides on) the run
//! as it is once its locks are held (CONTRACT §4.6, §4.7, §5.3), not as its first statement's
//! snapshot saw it.
//!
//! Two kinds of writers change a run while a report waits:
//! * run-changing operations (cancel, manifest, …) hold the exclusive advisory lock and the run row
//!   `FOR UPDATE` before they update it. PostgreSQL records such an update as one that changed the
//!   key, so the waiting report's `FOR KEY SHARE` follows the update chain and reads the committed
//!   version: the first three tests pin that down (they passed before the fix too).
//! * the report that completes the extraction changes the status under `FOR KEY SHARE` only (§5.3
//!   rule 3): a non-key update, which another `FOR KEY SHARE` locks without re-reading. A report
//!   or claim of the same partition that read the run before that commit and then waited for the
//!   partition row answered `EXTRACTING` for a run already EXTRACTED_VALIDATED: the last two tests.
//!
//! Each interleaving is forced with a plain transaction holding a row lock that the first
//! operation queues behind; waits are observed in `pg_stat_activity`, never slept out.
use ledger::{Actor, ChunkResult, Ledger, LedgerConfig, PartitionStatus, RunStatus};
use sqlx::{Connection, PgConnection};
use std::time::{Duration, Instant};
use testkit::{TestDb, chunk_report, claim_all, manifest, new_run};
use uuid::Uuid;

/// Waits until `n` backends of the test database wait for a heavyweight lock, `on` of them on
/// `wait_event` (`transactionid` for a row another transaction holds, `advisory`).
async fn until_waiting(observer: &mut PgConnection, n: i64, wait_event: &str, on: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (waiting, waiting_on): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE wait_event = $1) FROM pg_stat_activity \
              WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .bind(wait_event)
        .fetch_one(&mut *observer)
        .await
        .unwrap();
        if waiting == n && waiting_on == on {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{waiting} backends wait for a lock, {waiting_on} on {wait_event}; expected {n}, {on}"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A transaction that ran `statement` (its `$1` is the run) and stays open: what the operation
/// under test queues behind, until the caller commits it.
async fn holding(db: &TestDb, run: Uuid, statement: &str) -> PgConnection {
    let mut holder = db.conn().await;
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
        .bind(run)
        .execute(&mut holder)
        .await
        .unwrap();
    holder
}

/// A transaction holding the run row `FOR UPDATE` (what queues the run-changing operation).
async fn hold_run_row(db: &TestDb, run: Uuid) -> PgConnection {
    holding(
        db,
        run,
        "SELECT 1 FROM nifi_ops.load_run WHERE run_id = $1 FOR UPDATE",
    )
    .await
}

/// `testkit::extracting_run`, as this file's tests use it: the run and its HDFS directory.
async fn extracting_run(ledger: &Ledger, rows: &[i64]) -> (Uuid, String) {
    let created = testkit::extracting_run(ledger, "stale", rows).await;
    (created.run_id, created.hdfs_run_path)
}

fn actor() -> Actor {
    Actor {
        name: "ops-admin".into(),
        role: "operator".into(),
    }
}

#[tokio::test]
async fn a_report_that_waited_behind_a_cancel_answers_cancelled_and_is_recorded_only() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let (run, path) = extracting_run(&ledger, &[5]).await;
    let token = Uuid::new_v4();
    assert!(
        ledger
            .claim_partition(run, "0000", token, "nifi-01")
            .await
            .unwrap()
            .claimed
    );
    let mut observer = db.conn().await;
    let mut holder = hold_run_row(&db, run).await;

    let cancel = tokio::spawn({
        let ledger = ledger.clone();
        async move {
            ledger
                .cancel_run(run, "cancelled while a report waits", &actor(), None)
                .await
        }
    });
    until_waiting(&mut observer, 1, "transactionid", 1).await;
    let report = tokio::spawn({
        let ledger = ledger.clone();
        let r = chunk_report(token, &path, "0000", 0, 1, 5);
        async move { ledger.report_chunk(run, "0000", &r).await }
    });
    until_waiting(&mut observer, 2, "advisory", 1).await;
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();

    let cancelled = cancel.await.unwrap().unwrap();
    assert_eq!(cancelled.run_status, RunStatus::Cancelled);
    assert!(cancelled.changed);
    let out = report.await.unwrap().unwrap();
    assert_eq!(out.run_status, RunStatus::Cancelled, "{out:?}");
    assert_eq!(out.partition_status, PartitionStatus::Aborted, "{out:?}");
    assert!(out.recorded && !out.validation_scheduled, "{out:?}");
    assert_eq!(out.result, ChunkResult::Ignored);
    assert_eq!(out.received_chunks, 1);

    // §4.17: recorded and ignored.
    let (files, part, succeeded, status, validate): (i64, String, i32, String, i64) =
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM nifi_ops.load_file WHERE run_id = $1 AND status = 'WRITTEN'), \
                    (SELECT status FROM nifi_ops.load_partition WHERE run_id = $1), \
                    success_partition_count, status, \
                    (SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND dispatch_type = 'VALIDATE_RUN') \
               FROM nifi_ops.load_run WHERE run_id = $1",
        )
        .bind(run)
        .fetch_one(&mut observer)
        .await
        .unwrap();
    assert_eq!(
        (files, part.as_str(), succeeded, status.as_str(), validate),
        (1, "ABORTED", 0, "CANCELLED", 0)
    );
    observer.close().await.unwrap();
}

#[tokio::test]
async fn a_claim_that_waited_behind_a_cancel_answers_cancelled() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let (run, _) = extracting_run(&ledger, &[5]).await;
    let mut observer = db.conn().await;
    let mut holder = hold_run_row(&db, run).await;

    let cancel = tokio::spawn({
        let ledger = ledger.clone();
        async move {
            ledger
                .cancel_run(run, "cancelled while a claim waits", &actor(), None)
                .await
        }
    });
    until_waiting(&mut observer, 1, "transactionid", 1).await;
    let claim = tokio::spawn({
        let ledger = ledger.clone();
        async move {
            ledger
                .claim_partition(run, "0000", Uuid::new_v4(), "nifi-01")
                .await
        }
    });
    until_waiting(&mut observer, 2, "advisory", 1).await;
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();

    assert!(cancel.await.unwrap().unwrap().changed);
    let out = claim.await.unwrap().unwrap();
    assert!(!out.claimed, "{out:?}");
    assert_eq!(out.run_status, RunStatus::Cancelled, "{out:?}");
    assert_eq!(out.partition_status, PartitionStatus::Aborted, "{out:?}");
    assert_eq!(out.attempt, 0);
}

/// The decision too, not only the answer: a claim that waited behind the manifest claims the
/// partition the manifest created, instead of refusing it as if the run were still CREATED.
#[tokio::test]
async fn a_claim_that_waited_behind_the_manifest_claims() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let run = ledger.create_run(&new_run("stale")).await.unwrap().run_id;
    let mut observer = db.conn().await;
    let mut holder = hold_run_row(&db, run).await;

    let registered = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.register_manifest(run, &manifest(&[5])).await }
    });
    until_waiting(&mut observer, 1, "transactionid", 1).await;
    let claim = tokio::spawn({
        let ledger = ledger.clone();
        async move {
            ledger
                .claim_partition(run, "0000", Uuid::new_v4(), "nifi-01")
                .await
        }
    });
    until_waiting(&mut observer, 2, "advisory", 1).await;
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();

    assert_eq!(
        registered.await.unwrap().unwrap().status,
        RunStatus::Extracting
    );
    let out = claim.await.unwrap().unwrap();
    assert!(out.claimed, "{out:?}");
    assert_eq!(out.run_status, RunStatus::Extracting);
    assert_eq!(out.partition_status, PartitionStatus::Running);
    assert_eq!(out.attempt, 1);
}

/// A transaction holding the run row `FOR NO KEY UPDATE`: reports and claims pass it (`FOR KEY
/// SHARE`), but the success count update of a partition's last chunk queues behind it.
async fn hold_run_row_for_no_key_update(db: &TestDb, run: Uuid) -> PgConnection {
    holding(
        db,
        run,
        "SELECT 1 FROM nifi_ops.load_run WHERE run_id = $1 FOR NO KEY UPDATE",
    )
    .await
}

/// The completing report A of partition 0000 is held after it locked its partition and before it
/// counts its success; `then` starts (and returns) the second operation on 0000, which must wait
/// for A's partition row lock. A commits, then the second operation runs.
async fn behind_the_completing_report<T: Send + 'static>(
    then: impl FnOnce(Ledger, Uuid, Uuid, String) -> tokio::task::JoinHandle<T>,
) -> (TestDb, Uuid, T) {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let (run, path) = extracting_run(&ledger, &[5]).await;
    let token = Uuid::new_v4();
    assert!(
        ledger
            .claim_partition(run, "0000", token, "nifi-01")
            .await
            .unwrap()
            .claimed
    );
    let mut observer = db.conn().await;
    let mut holder = hold_run_row_for_no_key_update(&db, run).await;
    let completing = tokio::spawn({
        let ledger = ledger.clone();
        let r = chunk_report(token, &path, "0000", 0, 1, 5);
        async move { ledger.report_chunk(run, "0000", &r).await }
    });
    until_waiting(&mut observer, 1, "transactionid", 1).await;
    let second = then(ledger.clone(), run, token, path);
    until_waiting(&mut observer, 2, "transactionid", 2).await;
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    let done = completing.await.unwrap().unwrap();
    assert_eq!(done.result, ChunkResult::RunComplete, "{done:?}");
    assert!(done.validation_scheduled);
    let out = second.await.unwrap();
    observer.close().await.unwrap();
    (db, run, out)
}

/// NiFi's retry of a report whose answer was late waits for the first attempt, which completes
/// the run: the retry answers the completed run.
#[tokio::test]
async fn a_replayed_report_that_waited_behind_the_completion_answers_the_completed_run() {
    let (db, run, out) = behind_the_completing_report(|ledger, run, token, path| {
        tokio::spawn(async move {
            ledger
                .report_chunk(run, "0000", &chunk_report(token, &path, "0000", 0, 1, 5))
                .await
        })
    })
    .await;
    let out = out.unwrap();
    assert_eq!(out.run_status, RunStatus::ExtractedValidated, "{out:?}");
    assert_eq!(out.partition_status, PartitionStatus::Success, "{out:?}");
    assert!(!out.validation_scheduled, "{out:?}");
    assert_eq!(out.result, ChunkResult::Ignored);
    let mut conn = db.conn().await;
    let (validate, status): (i64, String) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND dispatch_type = 'VALIDATE_RUN'), status \
           FROM nifi_ops.load_run WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!((validate, status.as_str()), (1, "EXTRACTED_VALIDATED"));
}

/// A claim of the partition that waited for the completing report answers the completed run.
#[tokio::test]
async fn a_claim_that_waited_behind_the_completion_answers_the_completed_run() {
    let (_db, _run, out) = behind_the_completing_report(|ledger, run, _token, _path| {
        tokio::spawn(async move {
            ledger
                .claim_partition(run, "0000", Uuid::new_v4(), "nifi-02")
                .await
        })
    })
    .await;
    let out = out.unwrap();
    assert!(!out.claimed, "{out:?}");
    assert_eq!(out.run_status, RunStatus::ExtractedValidated, "{out:?}");
    assert_eq!(out.partition_status, PartitionStatus::Success, "{out:?}");
    assert_eq!(out.attempt, 1);
}

/// A manifest sent again (NiFi's retry after a lost answer) is answered from the stored
/// partitions as it was the first time: the partitions to dispatch are those expecting rows, and
/// the empty ones are counted apart (cargo-mutants: flipping either filter of the replay's answer
/// survived every test, none of which replayed a manifest with an empty partition).
#[tokio::test]
async fn a_replayed_manifest_is_answered_as_it_was_first() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let run = ledger
        .create_run(&new_run("manifest-replay"))
        .await
        .unwrap()
        .run_id;
    // Two partitions to dispatch and one empty: a count of either kind tells the kinds apart.
    let m = manifest(&[5, 0, 7]);
    let first = ledger.register_manifest(run, &m).await.unwrap();
    let replay = ledger.register_manifest(run, &m).await.unwrap();
    let ids = |o: &ledger::ManifestOutcome| -> Vec<String> {
        o.dispatch_partitions
            .iter()
            .map(|p| p.partition_id.clone())
            .collect()
    };
    assert_eq!(ids(&first), vec!["0000", "0002"]);
    assert_eq!(first.empty_partition_count, 1);
    assert_eq!(
        (
            ids(&replay),
            replay.empty_partition_count,
            replay.status,
            replay.validation_scheduled
        ),
        (ids(&first), 1, RunStatus::Extracting, false)
    );
}

/// A progress report, one statement on its own, still takes the run's shared lock (§5.3 rule
/// 2): it waits while a run-changing operation holds the run row (cargo-mutants: telling
/// `nifi_ops.record_chunk` that the run was already locked survived every sequential test).
#[tokio::test]
async fn a_progress_report_waits_while_the_run_is_held_for_a_change() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let (run, path) = extracting_run(&ledger, &[30]).await;
    let token = Uuid::new_v4();
    ledger
        .claim_partition(run, "0000", token, "nifi-01")
        .await
        .unwrap();
    let mut observer = db.conn().await;
    let mut holder = hold_run_row(&db, run).await;
    let report = tokio::spawn({
        let ledger = ledger.clone();
        let r = chunk_report(token, &path, "0000", 0, 3, 10);
        async move { ledger.report_chunk(run, "0000", &r).await }
    });
    until_waiting(&mut observer, 1, "transactionid", 1).await;
    assert!(!report.is_finished(), "the report ran past the held run");
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    let out = report.await.unwrap().unwrap();
    assert_eq!(
        (out.result, out.received_chunks),
        (ChunkResult::Progress, 1)
    );
}

/// The only chunk of a partition, sent again after it succeeded while the run still extracts,
/// is recorded only: one PARTITION_SUCCESS, not a second decision (cargo-mutants: `||` → `&&`
/// in the recorded-only check survived; a one-chunk report goes straight to the deciding
/// transaction, so its replay reaches that check).
#[tokio::test]
async fn a_replayed_single_chunk_of_a_succeeded_partition_is_recorded_only() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let (run, path) = extracting_run(&ledger, &[5, 5]).await;
    let token = Uuid::new_v4();
    claim_all(&ledger, run, &["0000", "0001"], token).await;
    let only = chunk_report(token, &path, "0000", 0, 1, 5);
    let first = ledger.report_chunk(run, "0000", &only).await.unwrap();
    assert_eq!(first.result, ChunkResult::PartitionSuccess);
    let replay = ledger.report_chunk(run, "0000", &only).await.unwrap();
    assert_eq!(
        (replay.result, replay.partition_status, replay.run_status),
        (
            ChunkResult::Ignored,
            PartitionStatus::Success,
            RunStatus::Extracting
        )
    );
    let mut conn = db.conn().await;
    let successes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'PARTITION_SUCCESS'",
    )
    .bind(run)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(successes, 1);
}

/// A gate mismatch ends the run, so the report decides again under the run's exclusive lock
/// (§5.3 rule 6): it waits for a sibling report in flight (the run row held FOR KEY SHARE) before
/// the run becomes FAILED_EXTRACT, instead of ending the run under the sibling (cargo-mutants:
/// dropping the escalation, or inverting it, survived).
#[tokio::test]
async fn a_mismatch_ends_the_run_only_under_the_exclusive_lock() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let (run, path) = extracting_run(&ledger, &[10, 10]).await;
    let token = Uuid::new_v4();
    claim_all(&ledger, run, &["0000", "0001"], token).await;
    let mut observer = db.conn().await;
    let mut sibling = holding(
        &db,
        run,
        "SELECT 1 FROM nifi_ops.load_run WHERE run_id = $1 FOR KEY SHARE",
    )
    .await;
    let report = tokio::spawn({
        let ledger = ledger.clone();
        // 7 rows where the manifest expects 10: the gate's verdict is a mismatch.
        let r = chunk_report(token, &path, "0000", 0, 1, 7);
        async move { ledger.report_chunk(run, "0000", &r).await }
    });
    until_waiting(&mut observer, 1, "transactionid", 1).await;
    let status: String =
        sqlx::query_scalar("SELECT status FROM nifi_ops.load_run WHERE run_id = $1")
            .bind(run)
            .fetch_one(&mut observer)
            .await
            .unwrap();
    assert_eq!(status, "EXTRACTING", "the run ended under a sibling's lock");
    sqlx::query("COMMIT").execute(&mut sibling).await.unwrap();
    let out = report.await.unwrap().unwrap();
    assert_eq!(
        (out.result, out.partition_status, out.run_status),
        (
            ChunkResult::Failed,
            PartitionStatus::Failed,
            RunStatus::FailedExtract
        )
    );
}

/// A success that may be the last takes the run row's write lock before it recounts; should the
/// run have left EXTRACTING by then (a writer that changed it under the report's shared lock:
/// none of this release's does, the statement guards against it all the same), the statement
/// undoes everything (SQLSTATE LC001) and the report decides again under the exclusive lock, where
/// it is a late report: recorded only, answered with the run as it is, the partition not
/// succeeded.
#[tokio::test]
async fn a_last_success_that_finds_the_run_gone_decides_again_under_the_exclusive_lock() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let (run, path) = extracting_run(&ledger, &[5]).await;
    let token = Uuid::new_v4();
    claim_all(&ledger, run, &["0000"], token).await;
    let mut observer = db.conn().await;
    // Cancels the run without the advisory lock: a non-key update, which the report's FOR KEY
    // SHARE passes and its FOR NO KEY UPDATE waits for.
    let mut writer = holding(
        &db,
        run,
        "UPDATE nifi_ops.load_run SET status = 'CANCELLED' WHERE run_id = $1",
    )
    .await;
    let report = tokio::spawn({
        let ledger = ledger.clone();
        let r = chunk_report(token, &path, "0000", 0, 1, 5);
        async move { ledger.report_chunk(run, "0000", &r).await }
    });
    until_waiting(&mut observer, 1, "transactionid", 1).await;
    sqlx::query("COMMIT").execute(&mut writer).await.unwrap();
    let out = report.await.unwrap().unwrap();
    assert_eq!(
        (out.result, out.partition_status, out.run_status),
        (
            ChunkResult::Ignored,
            PartitionStatus::Running,
            RunStatus::Cancelled
        )
    );
    let (status, successes, files): (String, i64, i64) = sqlx::query_as(
        "SELECT p.status, \
                (SELECT count(*) FROM nifi_ops.load_event e \
                  WHERE e.run_id = p.run_id AND e.event_name = 'PARTITION_SUCCESS'), \
                (SELECT count(*) FROM nifi_ops.load_file f WHERE f.run_id = p.run_id) \
           FROM nifi_ops.load_partition p WHERE p.run_id = $1",
    )
    .bind(run)
    .fetch_one(&mut observer)
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), successes, files),
        ("RUNNING", 0, 1),
        "recorded only: no success on a cancelled run"
    );
}

/// The run lock is taken in Rust (`run_lock::lock_run`, the exclusive lock of every run-changing
/// operation) and inside three server-side functions (the claim and the chunk report share it, the
/// validation start takes it exclusively), so that a NiFi report stays one round trip; the key has
/// one home (`run_lock_key`, passed in). This holds the copies equal: each function's call waits,
/// on the advisory lock, for a cancel that holds the run's exclusive lock in Rust. Seen failing
/// with the claim's key arguments swapped in `ops/claim.rs` (it then waited for the run row, not
/// for the key).
#[tokio::test]
async fn every_copy_of_the_run_lock_waits_for_the_exclusive_lock_taken_in_rust() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(6, LedgerConfig::default()).await;
    let mut observer = db.conn().await;
    let token = Uuid::new_v4();
    for call in ["claim", "chunk report", "validation start"] {
        let (run, path) = extracting_run(&ledger, &[5, 5]).await;
        let mut dispatch = Uuid::nil();
        if call != "claim" {
            claim_all(&ledger, run, &["0000", "0001"], token).await;
        }
        if call == "validation start" {
            for pid in ["0000", "0001"] {
                let r = chunk_report(token, &path, pid, 0, 1, 5);
                ledger.report_chunk(run, pid, &r).await.unwrap();
            }
            dispatch = sqlx::query_scalar(
                "SELECT dispatch_id FROM nifi_ops.load_dispatch WHERE run_id = $1 AND dispatch_type = 'VALIDATE_RUN'",
            )
            .bind(run)
            .fetch_one(&mut observer)
            .await
            .unwrap();
        }
        // The cancel takes the advisory lock, then waits for the run row a plain transaction
        // holds: the exclusive lock is held while the call under test starts.
        let mut holder = hold_run_row(&db, run).await;
        let cancel = tokio::spawn({
            let ledger = ledger.clone();
            async move {
                ledger
                    .cancel_run(run, "holding the run lock", &actor(), None)
                    .await
            }
        });
        until_waiting(&mut observer, 1, "transactionid", 1).await;
        let under_test = tokio::spawn({
            let ledger = ledger.clone();
            let path = path.clone();
            async move {
                match call {
                    "claim" => ledger
                        .claim_partition(run, "0000", token, "nifi-01")
                        .await
                        .map(|c| c.claimed),
                    "chunk report" => ledger
                        .report_chunk(run, "0000", &chunk_report(token, &path, "0000", 0, 1, 5))
                        .await
                        .map(|r| r.run_status == RunStatus::Extracting),
                    _ => ledger
                        .start_validation(run, dispatch, "nifi-02")
                        .await
                        .map(|s| s.started),
                }
            }
        });
        // Waiting on the advisory key, not on a row: the same key as Rust's.
        until_waiting(&mut observer, 2, "advisory", 1).await;
        sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
        assert!(cancel.await.unwrap().unwrap().changed, "{call}");
        // Decided after the cancel, on the cancelled run.
        assert!(
            !under_test.await.unwrap().unwrap(),
            "{call}: acted on a cancelled run"
        );
    }
}

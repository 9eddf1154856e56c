//! Completion without a queue on the run row (issue 30 item 3, spec/model/completion.pml): a
//! partition success pins an unfinished sibling, or locks the run row and recounts. On a real
//! PostgreSQL: concurrent last successes complete the run exactly once, a success racing a
//! cancel or a failure never completes a run that ended, and `success_partition_count` as read
//! stays exact although the successes no longer write it.
use ledger::{
    Actor, ChunkReport, ChunkResult, Decimal38, Ledger, LedgerConfig, LedgerError, Manifest,
    ManifestPartition, RunFailure, RunFilter, RunStatus,
};
use sqlx::PgConnection;
use testkit::{TestDb, new_run};
use uuid::Uuid;

fn manifest(rows: &[i64]) -> Manifest {
    let n = rows.len();
    Manifest {
        snapshot_scn: Decimal38::parse("777"),
        source_count: rows.iter().sum(),
        source_null_split_count: 0,
        source_min_split: None,
        source_max_split: None,
        planned_partition_count: n as i64,
        source_metrics: vec![],
        source_metrics_version: "v1".into(),
        partitions: rows
            .iter()
            .enumerate()
            .map(|(i, r)| ManifestPartition {
                partition_id: format!("{i:04}"),
                lower_bound: Decimal38::parse(&(i * 10).to_string()),
                upper_bound: Decimal38::parse(&((i + 1) * 10).to_string()),
                lower_text: None,
                upper_text: None,
                upper_inclusive: i + 1 == n,
                is_null_partition: false,
                expected_row_count: *r,
            })
            .collect(),
    }
}

fn chunk(path: &str, pid: &str, token: Uuid, i: i32) -> ChunkReport {
    ChunkReport {
        claim_token: token,
        chunk_index: i,
        chunk_count: 2,
        fragment_identifier: None,
        hdfs_path: format!("{path}/p={pid}/part-{i}.parquet"),
        record_count: 5,
        byte_count: Some(1),
    }
}

/// A run whose `rows` partitions (10 rows each, or 0) are claimed and have their first chunk of
/// two recorded: each waits for its last chunk. Returns the run, its path and the tokens.
async fn run_waiting_for_last_chunks(
    ledger: &Ledger,
    bk: &str,
    rows: &[i64],
) -> (Uuid, String, Vec<(String, Uuid)>) {
    let created = ledger.create_run(&new_run(bk)).await.unwrap();
    let run = created.run_id;
    ledger
        .register_manifest(run, &manifest(rows))
        .await
        .unwrap();
    let mut owners = vec![];
    for (i, r) in rows.iter().enumerate() {
        if *r == 0 {
            continue;
        }
        let pid = format!("{i:04}");
        let token = Uuid::new_v4();
        assert!(
            ledger
                .claim_partition(run, &pid, token, "nifi-01")
                .await
                .unwrap()
                .claimed
        );
        let first = ledger
            .report_chunk(run, &pid, &chunk(&created.hdfs_run_path, &pid, token, 0))
            .await
            .unwrap();
        assert_eq!(first.result, ChunkResult::Progress);
        owners.push((pid, token));
    }
    (run, created.hdfs_run_path, owners)
}

/// Every last chunk at once, each in its own task (and connection).
async fn last_chunks_at_once(
    ledger: &Ledger,
    run: Uuid,
    path: &str,
    owners: &[(String, Uuid)],
) -> Vec<tokio::task::JoinHandle<Result<ledger::ChunkOutcome, LedgerError>>> {
    owners
        .iter()
        .map(|(pid, token)| {
            let ledger = ledger.clone();
            let report = chunk(path, pid, *token, 1);
            let pid = pid.clone();
            tokio::spawn(async move { ledger.report_chunk(run, &pid, &report).await })
        })
        .collect()
}

/// (status, stored success_partition_count, SUCCESS partitions, unfinished partitions,
/// VALIDATE_RUN rows, EXTRACT_VALIDATED events)
async fn ledger_state(c: &mut PgConnection, run: Uuid) -> (String, i32, i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT status, success_partition_count, \
                (SELECT count(*) FROM nifi_ops.load_partition WHERE run_id = $1 AND status = 'SUCCESS'), \
                (SELECT count(*) FROM nifi_ops.load_partition WHERE run_id = $1 AND status IN ('PENDING','RUNNING','RETRY')), \
                (SELECT count(*) FROM nifi_ops.load_dispatch WHERE run_id = $1 AND dispatch_type = 'VALIDATE_RUN'), \
                (SELECT count(*) FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'EXTRACT_VALIDATED') \
           FROM nifi_ops.load_run WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(c)
    .await
    .unwrap()
}

/// The count the API answers, from the listing and from the detail.
async fn read_counts(ledger: &Ledger, run: Uuid, bk: &str) -> (i32, i32) {
    let listed = ledger
        .list_runs(&RunFilter {
            business_key: Some(bk.into()),
            limit: 10,
            ..RunFilter::default()
        })
        .await
        .unwrap();
    let listed = listed.iter().find(|r| r.run_id == run).unwrap();
    let detail = ledger.run_detail(run).await.unwrap();
    (
        listed.success_partition_count,
        detail.success_partition_count,
    )
}

/// Two to twelve last successes at once, each on its own connection, round after round: exactly
/// one answers `validationScheduled`, the run is EXTRACTED_VALIDATED with one VALIDATE_RUN row and
/// one EXTRACT_VALIDATED event, and the count is exact. A success that misses the other last one
/// (the naive "no unfinished partition left" check, or a recount in the statement that waited)
/// leaves a run EXTRACTING with every partition SUCCESS.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_last_successes_complete_the_run_exactly_once() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(16, LedgerConfig::default()).await;
    let mut c = db.conn().await;
    for round in 0..40usize {
        let n = 2 + round % 11;
        let mut rows = vec![10i64; n];
        if round % 4 == 3 {
            rows[0] = 0; // a zero-row partition, SUCCESS from the manifest on
        }
        let bk = format!("last-{round}");
        let (run, path, owners) = run_waiting_for_last_chunks(&ledger, &bk, &rows).await;
        let mut completions = 0;
        for h in last_chunks_at_once(&ledger, run, &path, &owners).await {
            let out = h.await.unwrap().unwrap();
            assert!(
                matches!(
                    out.result,
                    ChunkResult::PartitionSuccess | ChunkResult::RunComplete
                ),
                "round {round}: {out:?}"
            );
            if out.validation_scheduled {
                completions += 1;
                assert_eq!(out.run_status, RunStatus::ExtractedValidated);
            }
        }
        let state = ledger_state(&mut c, run).await;
        assert_eq!(
            state,
            (
                "EXTRACTED_VALIDATED".to_string(),
                n as i32,
                n as i64,
                0,
                1,
                1
            ),
            "round {round}: (status, stored count, SUCCESS rows, unfinished, VALIDATE_RUN, EXTRACT_VALIDATED)"
        );
        assert_eq!(completions, 1, "round {round}: one validationScheduled");
        assert_eq!(read_counts(&ledger, run, &bk).await, (n as i32, n as i32));
    }
}

/// While the run is EXTRACTING the successes do not write `success_partition_count`: the API
/// reads the SUCCESS partitions. A cancel stores the recount; the LoadRun-facing detail and the
/// listing agree with the rows at every step.
#[tokio::test]
async fn the_count_is_read_exactly_while_extracting_and_stored_when_the_run_ends() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let mut c = db.conn().await;
    let (run, path, owners) =
        run_waiting_for_last_chunks(&ledger, "counts", &[0, 10, 10, 10, 10]).await;
    assert_eq!(read_counts(&ledger, run, "counts").await, (1, 1));
    for (k, (pid, token)) in owners.iter().take(2).enumerate() {
        let out = ledger
            .report_chunk(run, pid, &chunk(&path, pid, *token, 1))
            .await
            .unwrap();
        assert_eq!(out.result, ChunkResult::PartitionSuccess);
        let expected = 2 + k as i32;
        assert_eq!(
            read_counts(&ledger, run, "counts").await,
            (expected, expected)
        );
    }
    // The stored column is the manifest's (the zero-row partition) until the run leaves
    // EXTRACTING: no success wrote the run row.
    let (_, stored, ..) = ledger_state(&mut c, run).await;
    assert_eq!(stored, 1);
    let actor = Actor {
        name: "ops-admin".into(),
        role: "operator".into(),
    };
    assert!(
        ledger
            .cancel_run(run, "counted when cancelled", &actor, None)
            .await
            .unwrap()
            .changed
    );
    assert_eq!(
        ledger_state(&mut c, run).await,
        ("CANCELLED".to_string(), 3, 3, 0, 0, 0)
    );
    assert_eq!(read_counts(&ledger, run, "counts").await, (3, 3));
}

/// Last successes racing a cancel or a run `/fail`: whichever wins, the run completes at most
/// once, never after it ended (a completed run may still be cancelled, its VALIDATE_RUN then
/// DEAD), no partition is left unfinished, and the stored count is the SUCCESS rows'.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn last_successes_racing_a_cancel_or_a_failure_complete_at_most_once_and_never_after_it() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(16, LedgerConfig::default()).await;
    let mut c = db.conn().await;
    let (mut completed_runs, mut ended_runs) = (0, 0);
    for round in 0..40usize {
        let n = 2 + round % 7;
        let bk = format!("race-{round}");
        let (run, path, owners) = run_waiting_for_last_chunks(&ledger, &bk, &vec![10; n]).await;
        let cancel = round % 2 == 0;
        let ender = {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                if cancel {
                    let actor = Actor {
                        name: "ops-admin".into(),
                        role: "operator".into(),
                    };
                    ledger
                        .cancel_run(run, "racing the last chunks", &actor, None)
                        .await
                        .map(|o| o.changed)
                } else {
                    ledger
                        .fail_run(
                            run,
                            &RunFailure {
                                expected_status: RunStatus::Extracting,
                                fail_status: RunStatus::FailedExtract,
                                error_stage: "EXTRACT".into(),
                                error_code: "RACE".into(),
                                message: "racing the last chunks".into(),
                            },
                        )
                        .await
                        .map(|o| o.changed)
                }
            })
        };
        let reports = last_chunks_at_once(&ledger, run, &path, &owners).await;
        let mut scheduled = 0;
        for h in reports {
            let out = h.await.unwrap().unwrap();
            scheduled += out.validation_scheduled as i64;
        }
        let ended = ender.await.unwrap();
        let (status, stored, ok, unfinished, rows, events) = ledger_state(&mut c, run).await;
        assert!(scheduled <= 1, "round {round}: {scheduled} completions");
        assert_eq!(
            (rows, events),
            (scheduled, scheduled),
            "round {round}: one VALIDATE_RUN row and event per completion"
        );
        assert_eq!(unfinished, 0, "round {round}: nothing left unfinished");
        assert_eq!(stored as i64, ok, "round {round}: the stored count");
        if scheduled == 1 {
            completed_runs += 1;
            assert_eq!(
                ok, n as i64,
                "round {round}: completed with every partition"
            );
            // The ender came after the completion: a cancel of EXTRACTED_VALIDATED, or a /fail
            // refused (the run is no longer EXTRACTING).
            if cancel {
                assert_eq!(status, "CANCELLED", "round {round}");
                assert!(ended.unwrap(), "round {round}");
            } else {
                assert_eq!(status, "EXTRACTED_VALIDATED", "round {round}");
                assert!(
                    matches!(ended, Err(LedgerError::RunStatusMismatch { .. })),
                    "round {round}: {ended:?}"
                );
            }
        } else {
            ended_runs += 1;
            assert!(ended.unwrap(), "round {round}: the ender won");
            assert_eq!(
                status,
                if cancel {
                    "CANCELLED"
                } else {
                    "FAILED_EXTRACT"
                },
                "round {round}"
            );
            assert!(
                ok < n as i64,
                "round {round}: ended before the last success"
            );
        }
    }
    eprintln!("{completed_runs} runs completed first, {ended_runs} ended first");
}

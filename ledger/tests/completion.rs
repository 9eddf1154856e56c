//! Completion without a queue on the run row (issue 30 item 3, spec/model/completion.pml): a
//! partition success pins an unfinished sibling, or locks the run row and recounts. On a real
//! PostgreSQL: concurrent last successes complete the run exactly once, a success racing a
//! cancel or a failure never completes a run that ended, and `success_partition_count` as read
//! stays exact although the successes no longer write it.
use ledger::{
    Actor, ChunkResult, Ledger, LedgerConfig, LedgerError, RunFailure, RunFilter, RunStatus,
};
use sqlx::PgConnection;
use testkit::{TestDb, chunk_report, manifest, new_run};
use uuid::Uuid;

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
            .report_chunk(
                run,
                &pid,
                &chunk_report(token, &created.hdfs_run_path, &pid, 0, 2, 5),
            )
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
            let report = chunk_report(*token, path, pid, 1, 2, 5);
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
            .report_chunk(run, pid, &chunk_report(*token, &path, pid, 1, 2, 5))
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

// ---------------------------------------------------------------------------------------------
// Mixed releases (a rolling upgrade from 0.1.0, a rollback to it): release 0.1.0's partition
// success increments `success_partition_count` and completes the run only when the returned count
// is the expected one. This release does not write the column while EXTRACTING, so the trigger of
// migration 20261203000010 makes that increment return the count of SUCCESS partitions (the model:
// spec/model/completion.pml with OLD=1). Here 0.1.0's statements are replayed verbatim, as literal
// SQL, on connections of their own, beside this release's `report_chunk`.

/// Release 0.1.0's last chunk of a partition (d7bbc1b: `Ledger::report_chunk_once` with
/// `RunLock::Shared`, `partition_succeeded`, `complete_extraction`), one open transaction,
/// statement by statement, so that a test can stop it between two statements.
struct OldSuccess<'c> {
    tx: sqlx::Transaction<'c, sqlx::Postgres>,
    run: Uuid,
    job_key: String,
    business_key: String,
    done: Option<(i32, Option<i32>)>,
}

/// 0.1.0's advisory key of a run (`store::run_lock_key`, unchanged since).
fn old_run_lock_key(run_id: Uuid) -> (i32, i32) {
    let b = run_id.as_u128();
    let h = (b >> 64) as u64 ^ b as u64;
    ((h >> 32) as i32, h as i32)
}

/// 0.1.0's `Event::insert`.
async fn old_event(
    c: &mut PgConnection,
    name: &str,
    (run, job_key, business_key): (Uuid, &str, &str),
    pid: Option<&str>,
    rows: Option<i64>,
    details: serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO nifi_ops.load_event (event_id, event_level, event_name, run_id, job_key, business_key, \
           partition_id, process_group, processor_name, attempt_no, row_count, error_class, error_code, message, details) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'LOAD_CONTROL_API', $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(Uuid::now_v7())
    .bind("INFO")
    .bind(name)
    .bind(run)
    .bind(job_key)
    .bind(business_key)
    .bind(pid)
    .bind(name.to_lowercase())
    .bind(None::<i32>)
    .bind(rows)
    .bind(None::<String>)
    .bind(None::<String>)
    .bind(None::<String>)
    .bind(sqlx::types::Json(details))
    .execute(c)
    .await?;
    Ok(())
}

impl<'c> OldSuccess<'c> {
    /// BEGIN; the run's shared advisory lock and FOR KEY SHARE; the partition FOR UPDATE; the chunk
    /// statement (last chunk of two, 5 rows each: the gate passes); the partition SUCCESS and its
    /// event. Stops before the run row.
    async fn write_success(
        c: &'c mut PgConnection,
        run: Uuid,
        pid: &str,
        token: Uuid,
        path: &str,
    ) -> Result<OldSuccess<'c>, sqlx::Error> {
        use sqlx::{Acquire, Row};
        let mut tx = c.begin().await?;
        let (k1, k2) = old_run_lock_key(run);
        // 0.1.0's SHARED_RUN_LOCK.
        let row = sqlx::query(
            "SELECT run_id, job_key, business_key, status, source_count, hdfs_run_path, \
                stage_table_name, snapshot_scn::text AS snapshot_scn, extracted_count, publish_token, parameters \
               FROM nifi_ops.load_run, pg_advisory_xact_lock_shared($2, $3) \
              WHERE run_id = $1 FOR KEY SHARE OF load_run",
        )
        .bind(run)
        .bind(k1)
        .bind(k2)
        .fetch_one(&mut *tx)
        .await?;
        let (job_key, business_key): (String, String) =
            (row.get("job_key"), row.get("business_key"));
        // 0.1.0's lock_partition.
        let part = sqlx::query(
            "SELECT status, claim_token, attempt_count, expected_row_count, \
                    (SELECT status FROM nifi_ops.load_run WHERE run_id = $1) AS run_status \
               FROM nifi_ops.load_partition WHERE run_id = $1 AND partition_id = $2 FOR UPDATE",
        )
        .bind(run)
        .bind(pid)
        .fetch_one(&mut *tx)
        .await?;
        assert_eq!(part.get::<Option<Uuid>, _>("claim_token"), Some(token));
        assert_eq!(part.get::<String, _>("status"), "RUNNING");
        // 0.1.0's chunk statement, its run_heartbeat_cte!("(SELECT count(*) FROM chunks) < $5")
        // written out.
        let report = chunk_report(token, path, pid, 1, 2, 5);
        let a = sqlx::query(
            "WITH prior AS ( \
                SELECT fragment_identifier, fragment_count, hdfs_path, record_count, byte_count, status FROM nifi_ops.load_file \
                 WHERE run_id = $1 AND partition_id = $2 AND chunk_index = $3), \
             same AS ( \
                SELECT 1 FROM prior WHERE (fragment_identifier, fragment_count, hdfs_path, record_count, byte_count, status) \
                    IS NOT DISTINCT FROM ($4, $5, $6, $7, $8, 'WRITTEN')), \
             stored AS ( \
                INSERT INTO nifi_ops.load_file (run_id, partition_id, chunk_index, fragment_identifier, fragment_count, \
                  hdfs_path, record_count, byte_count) SELECT $1, $2, $3, $4, $5, $6, $7, $8 \
                 WHERE NOT EXISTS (SELECT 1 FROM same) \
                ON CONFLICT (run_id, partition_id, chunk_index) DO UPDATE SET \
                  fragment_identifier = EXCLUDED.fragment_identifier, fragment_count = EXCLUDED.fragment_count, \
                  hdfs_path = EXCLUDED.hdfs_path, record_count = EXCLUDED.record_count, byte_count = EXCLUDED.byte_count, \
                  status = 'WRITTEN', updated_at = clock_timestamp() \
                RETURNING 1), \
             beat AS ( \
                UPDATE nifi_ops.load_partition SET heartbeat_at = clock_timestamp() \
                 WHERE run_id = $1 AND partition_id = $2 AND NOT EXISTS (SELECT 1 FROM same) RETURNING 1), \
             chunks AS ( \
                SELECT chunk_index, fragment_count, record_count, byte_count FROM nifi_ops.load_file \
                 WHERE run_id = $1 AND partition_id = $2 AND status = 'WRITTEN' AND chunk_index <> $3 \
                UNION ALL SELECT $3, $5, $7, $8), \
             run_beat AS ( \
                UPDATE nifi_ops.load_run SET heartbeat_at = clock_timestamp() \
                 WHERE run_id IN (SELECT run_id FROM nifi_ops.load_run \
                                   WHERE run_id = $1 AND status = 'EXTRACTING' \
                                     AND heartbeat_at < clock_timestamp() - interval '1 second' AND ( \
                                     (SELECT count(*) FROM chunks) < $5) FOR NO KEY UPDATE SKIP LOCKED) RETURNING 1) \
             SELECT NOT EXISTS (SELECT 1 FROM prior WHERE fragment_count = $5 AND hdfs_path = $6 \
                                   AND record_count = $7 AND byte_count IS NOT DISTINCT FROM $8) AS changed, \
                    count(*) AS files, min(chunk_index) AS lo, max(chunk_index) AS hi, \
                    COALESCE(sum(record_count), 0)::text AS rows, sum(byte_count)::text AS bytes, \
                    count(DISTINCT fragment_count) AS distinct_counts, \
                    (SELECT status FROM nifi_ops.load_run WHERE run_id = $1) AS run_status \
               FROM chunks",
        )
        .bind(run)
        .bind(pid)
        .bind(report.chunk_index)
        .bind(&report.fragment_identifier)
        .bind(report.chunk_count)
        .bind(&report.hdfs_path)
        .bind(report.record_count)
        .bind(report.byte_count)
        .fetch_one(&mut *tx)
        .await?;
        // 0.1.0's gate passes: both chunks, 10 rows as expected, the run EXTRACTING.
        assert_eq!(a.get::<i64, _>("files"), 2);
        assert_eq!(a.get::<String, _>("rows"), "10");
        assert_eq!(a.get::<String, _>("run_status"), "EXTRACTING");
        // 0.1.0's partition_succeeded: SUCCESS, its event.
        let won = sqlx::query(
            "UPDATE nifi_ops.load_partition SET status = 'SUCCESS', actual_row_count = $4, file_count = $5, \
                fragment_count = $5, byte_count = $6, completed_at = clock_timestamp(), heartbeat_at = clock_timestamp() \
              WHERE run_id = $1 AND partition_id = $2 AND status = 'RUNNING' AND claim_token = $3",
        )
        .bind(run)
        .bind(pid)
        .bind(token)
        .bind(10i64)
        .bind(2i32)
        .bind(Some(2i64))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        assert_eq!(won, 1);
        old_event(
            &mut tx,
            "PARTITION_SUCCESS",
            (run, &job_key, &business_key),
            Some(pid),
            Some(10),
            serde_json::json!({"files": 2, "bytes": 2}),
        )
        .await?;
        Ok(OldSuccess {
            tx,
            run,
            job_key,
            business_key,
            done: None,
        })
    }

    /// 0.1.0's increment of the run row (it waits for the run row's write lock).
    async fn increment(&mut self) -> Result<(i32, Option<i32>), sqlx::Error> {
        let counts: Option<(i32, Option<i32>)> = sqlx::query_as(
            "UPDATE nifi_ops.load_run SET success_partition_count = success_partition_count + 1, \
                    heartbeat_at = clock_timestamp() \
              WHERE run_id = $1 AND status = 'EXTRACTING' RETURNING success_partition_count, expected_partition_count",
        )
        .bind(self.run)
        .fetch_optional(&mut *self.tx)
        .await?;
        // None would be 0.1.0's escalation: the run left EXTRACTING (no cancel runs here).
        let counts = counts.expect("0.1.0's increment found the run EXTRACTING");
        self.done = Some(counts);
        Ok(counts)
    }

    /// 0.1.0's completion when the returned count is the expected one, then COMMIT. True when
    /// this transaction completed the run.
    async fn finish(mut self) -> Result<bool, sqlx::Error> {
        let (done, expected) = self.done.expect("increment first");
        let mut completed = false;
        if Some(done) == expected {
            // 0.1.0's complete_extraction.
            completed = sqlx::query(
                "UPDATE nifi_ops.load_run r \
                    SET status = 'EXTRACTED_VALIDATED', success_partition_count = p.ok, extracted_count = p.rows, \
                        extract_completed_at = clock_timestamp(), heartbeat_at = clock_timestamp(), \
                        version_no = r.version_no + 1 \
                   FROM (SELECT count(*) AS n, count(*) FILTER (WHERE status = 'SUCCESS') AS ok, \
                                COALESCE(sum(actual_row_count), 0) AS rows \
                           FROM nifi_ops.load_partition WHERE run_id = $1) p \
                  WHERE r.run_id = $1 AND r.status = 'EXTRACTING' \
                    AND p.n = r.expected_partition_count AND p.ok = r.expected_partition_count \
                    AND p.rows = r.source_count",
            )
            .bind(self.run)
            .execute(&mut *self.tx)
            .await?
            .rows_affected()
                == 1;
            if completed {
                sqlx::query(
                    "INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type) VALUES ($1, $2, 'VALIDATE_RUN') \
                     ON CONFLICT (run_id) WHERE dispatch_type = 'VALIDATE_RUN' DO NOTHING",
                )
                .bind(Uuid::new_v4())
                .bind(self.run)
                .execute(&mut *self.tx)
                .await?;
                sqlx::query("SELECT pg_notify('load_dispatch', $1)")
                    .bind(self.run.to_string())
                    .execute(&mut *self.tx)
                    .await?;
                sqlx::query("SELECT pg_notify('load_run', $1)")
                    .bind(self.run.to_string())
                    .execute(&mut *self.tx)
                    .await?;
                let (run, job, bk) = (self.run, self.job_key.clone(), self.business_key.clone());
                old_event(
                    &mut self.tx,
                    "EXTRACT_VALIDATED",
                    (run, &job, &bk),
                    None,
                    None,
                    serde_json::json!({}),
                )
                .await?;
            }
        }
        self.tx.commit().await?;
        Ok(completed)
    }
}

/// 0.1.0's whole last chunk in one go, retried as 0.1.0's `transaction!` retries a deadlock or a
/// serialization failure (bounded). (completed, returned count, attempts)
async fn old_last_chunk(
    c: &mut PgConnection,
    run: Uuid,
    pid: &str,
    token: Uuid,
    path: &str,
) -> (bool, i32, u32) {
    for attempt in 1..=5u32 {
        let outcome = async {
            let mut s = OldSuccess::write_success(c, run, pid, token, path).await?;
            let (done, _) = s.increment().await?;
            Ok::<_, sqlx::Error>((s.finish().await?, done))
        }
        .await;
        match outcome {
            Ok((completed, done)) => return (completed, done, attempt),
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("40P01" | "40001")) && attempt < 5 => {}
            Err(e) => panic!("0.1.0's last chunk of {pid}: {e}"),
        }
    }
    unreachable!()
}

/// Waits (bounded) until some backend of this database waits for a lock.
async fn until_a_backend_waits_for_a_lock(c: &mut PgConnection) {
    for _ in 0..500 {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut *c)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no backend waited for a lock within 5 s");
}

const COMPLETED_ONCE: (&str, i64, i64, i64) = ("EXTRACTED_VALIDATED", 0, 1, 1);

/// (status, unfinished, VALIDATE_RUN rows, EXTRACT_VALIDATED events), and the stored count checked
/// against the SUCCESS rows.
async fn completed_state(c: &mut PgConnection, run: Uuid, n: usize) -> (String, i64, i64, i64) {
    let (status, stored, ok, unfinished, rows, events) = ledger_state(c, run).await;
    assert_eq!(
        (stored, ok),
        (n as i32, n as i64),
        "stored count, SUCCESS rows"
    );
    (status, unfinished, rows, events)
}

/// After a rollback to 0.1.0 (or while its pods still serve): the run's other successes were
/// made by this release, which did not count them on the run row; 0.1.0's connections alone finish
/// it, one after another, and the last of them completes it.
#[tokio::test]
async fn old_release_successes_complete_a_run_this_release_began() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let mut c = db.conn().await;
    let mut old = db.conn().await;
    for (round, (n, new_ones)) in [(3usize, 2usize), (4, 1), (5, 3), (2, 1)]
        .into_iter()
        .enumerate()
    {
        let (run, path, owners) =
            run_waiting_for_last_chunks(&ledger, &format!("rollback-{round}"), &vec![10; n]).await;
        for (pid, token) in &owners[..new_ones] {
            let out = ledger
                .report_chunk(run, pid, &chunk_report(*token, &path, pid, 1, 2, 5))
                .await
                .unwrap();
            assert_eq!(out.result, ChunkResult::PartitionSuccess);
        }
        let mut completions = 0;
        for (k, (pid, token)) in owners[new_ones..].iter().enumerate() {
            let (completed, done, _) = old_last_chunk(&mut old, run, pid, *token, &path).await;
            // The increment returns the SUCCESS partitions, this release's included.
            assert_eq!(done, (new_ones + k + 1) as i32, "round {round}");
            completions += completed as usize;
        }
        assert_eq!(
            completions, 1,
            "round {round}: the last 0.1.0 success completes"
        );
        assert_eq!(
            completed_state(&mut c, run, n).await,
            (COMPLETED_ONCE.0.into(), 0, 1, 1)
        );
    }
}

/// The two orderings of a 0.1.0 success and this release's on the run row, forced: (a) 0.1.0's
/// SUCCESS written but uncommitted while this release's last success decides (it skips 0.1.0's
/// partition, held FOR UPDATE, locks the run row, recounts without it and leaves); 0.1.0's increment
/// then counts it and completes. (b) 0.1.0's increment holds the run row (its count one short, no
/// completion) while this release's success waits for it; after 0.1.0's commit it recounts and
/// completes. (c) two 0.1.0 successes, the second's increment waiting behind the first's: its
/// count, taken after the wait, sees the first (a STABLE trigger function would not).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn old_and_new_last_successes_in_both_orders_on_the_run_row_complete_once() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let mut c = db.conn().await;
    let mut old = db.conn().await;
    let mut old2 = db.conn().await;

    // (a)
    let (run, path, owners) = run_waiting_for_last_chunks(&ledger, "order-a", &[10, 10]).await;
    let mut s = OldSuccess::write_success(&mut old, run, &owners[0].0, owners[0].1, &path)
        .await
        .unwrap();
    let out = ledger
        .report_chunk(
            run,
            &owners[1].0,
            &chunk_report(owners[1].1, &path, &owners[1].0, 1, 2, 5),
        )
        .await
        .unwrap();
    assert_eq!(
        out.result,
        ChunkResult::PartitionSuccess,
        "(a) the new one is not last"
    );
    assert_eq!(
        s.increment().await.unwrap(),
        (2, Some(2)),
        "(a) 0.1.0 counts the new success"
    );
    assert!(s.finish().await.unwrap(), "(a) 0.1.0 completes");
    assert_eq!(
        completed_state(&mut c, run, 2).await,
        (COMPLETED_ONCE.0.into(), 0, 1, 1)
    );

    // (b)
    let (run, path, owners) = run_waiting_for_last_chunks(&ledger, "order-b", &[10, 10]).await;
    let mut s = OldSuccess::write_success(&mut old, run, &owners[0].0, owners[0].1, &path)
        .await
        .unwrap();
    assert_eq!(
        s.increment().await.unwrap(),
        (1, Some(2)),
        "(b) 0.1.0 is not last yet"
    );
    let new = {
        let ledger = ledger.clone();
        let (pid, token) = owners[1].clone();
        let report = chunk_report(token, &path, &pid, 1, 2, 5);
        tokio::spawn(async move { ledger.report_chunk(run, &pid, &report).await })
    };
    until_a_backend_waits_for_a_lock(&mut c).await;
    assert!(
        !new.is_finished(),
        "(b) the new success waits for the run row"
    );
    assert!(!s.finish().await.unwrap());
    let out = new.await.unwrap().unwrap();
    assert_eq!(
        out.result,
        ChunkResult::RunComplete,
        "(b) the new one completes"
    );
    assert_eq!(
        completed_state(&mut c, run, 2).await,
        (COMPLETED_ONCE.0.into(), 0, 1, 1)
    );

    // (c)
    let (run, path, owners) = run_waiting_for_last_chunks(&ledger, "order-c", &[10, 10]).await;
    let mut first = OldSuccess::write_success(&mut old, run, &owners[0].0, owners[0].1, &path)
        .await
        .unwrap();
    assert_eq!(first.increment().await.unwrap(), (1, Some(2)));
    let second = {
        let (pid, token) = owners[1].clone();
        let path = path.clone();
        tokio::spawn(async move {
            let mut s = OldSuccess::write_success(&mut old2, run, &pid, token, &path).await?;
            let done = s.increment().await?;
            Ok::<_, sqlx::Error>((done, s.finish().await?))
        })
    };
    until_a_backend_waits_for_a_lock(&mut c).await;
    assert!(
        !second.is_finished(),
        "(c) the second increment waits for the run row"
    );
    assert!(!first.finish().await.unwrap());
    let (done, completed) = second.await.unwrap().unwrap();
    assert_eq!(done, (2, Some(2)), "(c) counted after the wait");
    assert!(completed, "(c) the second 0.1.0 success completes");
    assert_eq!(
        completed_state(&mut c, run, 2).await,
        (COMPLETED_ONCE.0.into(), 0, 1, 1)
    );
}

/// A rolling upgrade under load: every last chunk at once, each served by 0.1.0 (its statements on
/// a connection of its own) or by this release (`report_chunk`), in every mix, round after round.
/// Each run completes exactly once, with the count exact; the orderings that need the trigger
/// occur and are counted: a 0.1.0 success completing after this release's (its counter never
/// written by them), this release completing after 0.1.0's, and a 0.1.0 increment that the trigger
/// raised above the count 0.1.0's own increments alone would give.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mixed_release_last_successes_complete_every_run_exactly_once() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(16, LedgerConfig::default()).await;
    let mut c = db.conn().await;
    let mut olds = vec![];
    for _ in 0..8 {
        olds.push(db.conn().await);
    }
    let (mut old_after_new, mut new_after_old, mut raised, mut retried) = (0, 0, 0, 0u32);
    for round in 0..60usize {
        let n = 2 + round % 7;
        let bk = format!("mixed-{round}");
        let (run, path, owners) = run_waiting_for_last_chunks(&ledger, &bk, &vec![10; n]).await;
        // Which release serves each partition: every mix of old and new over the rounds, never all
        // of one release.
        let mask = (round as u32).wrapping_mul(2654435761) >> 7;
        let is_old: Vec<bool> = (0..n).map(|i| (mask >> i) & 1 == 1).collect();
        let is_old: Vec<bool> = if is_old.iter().all(|o| *o) || is_old.iter().all(|o| !*o) {
            (0..n).map(|i| i % 2 == round % 2).collect()
        } else {
            is_old
        };
        let mut old_tasks = vec![];
        let mut new_tasks = vec![];
        for (i, (pid, token)) in owners.iter().enumerate() {
            let (pid, token, path) = (pid.clone(), *token, path.clone());
            if is_old[i] {
                let mut conn = olds.pop().unwrap();
                old_tasks.push(tokio::spawn(async move {
                    let r = old_last_chunk(&mut conn, run, &pid, token, &path).await;
                    (conn, r)
                }));
            } else {
                let ledger = ledger.clone();
                let report = chunk_report(token, &path, &pid, 1, 2, 5);
                new_tasks.push(tokio::spawn(async move {
                    ledger.report_chunk(run, &pid, &report).await
                }));
            }
        }
        let olds_in_run = old_tasks.len() as i32;
        let (mut old_completions, mut new_completions) = (0, 0);
        for t in old_tasks {
            let (conn, (completed, done, attempts)) = t.await.unwrap();
            olds.push(conn);
            old_completions += completed as usize;
            retried += attempts - 1;
            // Without the trigger 0.1.0's increments count 0.1.0's successes only.
            if done > olds_in_run {
                raised += 1;
            }
        }
        for t in new_tasks {
            let out = t.await.unwrap().unwrap();
            assert!(
                matches!(
                    out.result,
                    ChunkResult::PartitionSuccess | ChunkResult::RunComplete
                ),
                "round {round}: {out:?}"
            );
            new_completions += out.validation_scheduled as usize;
        }
        assert_eq!(
            old_completions + new_completions,
            1,
            "round {round} ({is_old:?}): exactly one completion"
        );
        assert_eq!(
            completed_state(&mut c, run, n).await,
            (COMPLETED_ONCE.0.into(), 0, 1, 1),
            "round {round} ({is_old:?})"
        );
        assert_eq!(read_counts(&ledger, run, &bk).await, (n as i32, n as i32));
        old_after_new += old_completions;
        new_after_old += new_completions;
    }
    eprintln!(
        "{old_after_new} runs completed by 0.1.0 after this release's successes, {new_after_old} by \
         this release after 0.1.0's; {raised} 0.1.0 increments counted this release's successes; \
         {retried} 0.1.0 retries"
    );
    assert!(
        old_after_new > 0 && new_after_old > 0 && raised > 0,
        "the orderings occurred"
    );
}

/// Release 0.1.0's transitions out of EXTRACTING (its cancel here, statement by statement as
/// d7bbc1b sends them: the run's exclusive advisory lock and row lock, the CAS without a recount,
/// the ABORTED partitions) beside this release's successes, which do not write the count: the
/// stored `success_partition_count` is exact once the run has left EXTRACTING (§5.4, §11 #16),
/// by the recount trigger. Seen failing with the trigger's `OLD.status = 'EXTRACTING'` arm removed
/// (`scripts/sql-mutants`, leaving-extracting-counts-nothing): stored 0, SUCCESS rows 2.
#[tokio::test]
async fn a_release_0_1_0_cancel_stores_the_exact_count() {
    use sqlx::Acquire;
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let mut c = db.conn().await;
    let (run, path, owners) =
        run_waiting_for_last_chunks(&ledger, "old-cancel", &[0, 10, 10, 10]).await;
    for (pid, token) in owners.iter().take(2) {
        let out = ledger
            .report_chunk(run, pid, &chunk_report(*token, &path, pid, 1, 2, 5))
            .await
            .unwrap();
        assert_eq!(out.result, ChunkResult::PartitionSuccess);
    }
    let mut tx = c.begin().await.unwrap();
    let (k1, k2) = old_run_lock_key(run);
    // 0.1.0's EXCLUSIVE_RUN_LOCK, its transition's CAS and its aborting of partitions.
    sqlx::query(
        "SELECT run_id FROM nifi_ops.load_run, pg_advisory_xact_lock($2, $3) WHERE run_id = $1 FOR UPDATE OF load_run",
    )
    .bind(run)
    .bind(k1)
    .bind(k2)
    .execute(&mut *tx)
    .await
    .unwrap();
    let changed = sqlx::query(
        "UPDATE nifi_ops.load_run SET status = $3, \
            error_stage = CASE $4 WHEN 'keep' THEN error_stage WHEN 'clear' THEN NULL ELSE $5 END, \
            error_code = CASE $4 WHEN 'keep' THEN error_code WHEN 'clear' THEN NULL ELSE $6 END, \
            error_message = CASE $4 WHEN 'keep' THEN error_message WHEN 'clear' THEN NULL ELSE $7 END, \
            completed_at = CASE WHEN $8 THEN clock_timestamp() ELSE completed_at END, \
            heartbeat_at = clock_timestamp(), version_no = version_no + 1 \
          WHERE run_id = $1 AND status = $2",
    )
    .bind(run)
    .bind("EXTRACTING")
    .bind("CANCELLED")
    .bind("set")
    .bind("CANCEL")
    .bind("RUN_CANCELLED")
    .bind("cancelled by 0.1.0")
    .bind(true)
    .execute(&mut *tx)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(changed, 1);
    sqlx::query(
        "UPDATE nifi_ops.load_partition SET status = 'ABORTED', completed_at = clock_timestamp(), \
            heartbeat_at = clock_timestamp(), error_code = $2, error_message = 'run ended: ' || $2 \
          WHERE run_id = $1 AND status IN ('PENDING', 'RUNNING', 'RETRY')",
    )
    .bind(run)
    .bind("CANCELLED")
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let (status, stored, success, unfinished, _, _) = ledger_state(&mut c, run).await;
    assert_eq!(
        (status.as_str(), stored, success, unfinished),
        ("CANCELLED", 3, 3, 0),
        "the zero-row partition and the two successes, stored"
    );
    assert_eq!(read_counts(&ledger, run, "old-cancel").await, (3, 3));
}

//! The store against a real PostgreSQL: migrations, whole-transaction retries and atomicity.
use ledger::migrate::run_migrations;
use ledger::{LedgerConfig, LedgerError, RunFailure, RunStatus};
use sqlx::Connection;
use testkit::{TestDb, new_run};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_are_safe_twice_and_from_four_processes_at_once() {
    let db = TestDb::empty().await;
    // Four migrators on their own threads and runtimes, released together.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (url, barrier) = (db.url.clone(), barrier.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                barrier.wait();
                rt.block_on(run_migrations(&url))
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap().expect("concurrent migration");
    }
    run_migrations(&db.url).await.expect("second run");
    let mut conn = db.conn().await;
    let (tables,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'nifi_ops'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(tables, 13);
    let (functions,): (i64,) = sqlx::query_as("SELECT count(*) FROM nifi_ops.server_function")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        functions as usize,
        ledger::functions::SERVER_FUNCTIONS.len()
    );
    let (applied,): (i64,) = sqlx::query_as("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(applied as usize, ledger::migrate::MIGRATOR.iter().count());
    let (indexes,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_indexes WHERE schemaname = 'nifi_ops' AND indexname IN \
         ('uq_load_run_active','ix_load_run_status_heartbeat','ix_load_run_job_started','ix_load_run_cleanup', \
          'ix_load_partition_live','uq_load_file_path','ix_load_validation_run_stage', \
          'uq_load_validation_metric','uq_load_dispatch_validate','ix_load_dispatch_due','ix_load_event_run_time', \
          'ix_load_event_job_time','ix_load_event_error','ix_load_event_time_brin')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    // ix_load_partition_status and ix_load_file_partition_status are dropped, and
    // ix_load_partition_recovery replaced by ix_load_partition_live (issue 30; plans.rs).
    assert_eq!(indexes, 14);
}

#[tokio::test]
async fn a_v1_ledger_is_brought_up_to_date_and_keeps_its_rows() {
    let db = TestDb::empty().await;
    let mut conn = db.conn().await;
    // The first version's run table: no CANCELLED in its status check, no load_job table.
    sqlx::raw_sql(
        "CREATE SCHEMA nifi_ops;
         CREATE TABLE nifi_ops.load_run (run_id uuid PRIMARY KEY, job_key varchar(200) NOT NULL, business_key varchar(200) NOT NULL,
           status varchar(40) NOT NULL, started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
           CONSTRAINT ck_load_run_status CHECK (status IN ('CREATED','SUCCESS')));
         INSERT INTO nifi_ops.load_run (run_id, job_key, business_key, status) VALUES (gen_random_uuid(), 'OLD', 'K', 'SUCCESS');",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    run_migrations(&db.url).await.expect("upgrade");
    let (kept,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM nifi_ops.load_run WHERE job_key = 'OLD'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(kept, 1);
    let (def,): (String,) = sqlx::query_as(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'ck_load_run_status'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(def.contains("CANCELLED"), "{def}");
    let (job_table,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'nifi_ops' AND table_name = 'load_job'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(job_table, 1);
}

/// A trigger that raises `sqlstate` on the first `times` event inserts of `event_name`.
async fn inject_fault(db: &TestDb, event_name: &str, sqlstate: &str, times: i32) {
    let mut conn = db.conn().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SEQUENCE public.fault_seq;
         CREATE FUNCTION public.fault() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           -- nextval is not rolled back with the failed attempt, so it counts attempts.
           IF NEW.event_name = '{event_name}' AND nextval('public.fault_seq') <= {times} THEN
             RAISE EXCEPTION 'injected fault' USING ERRCODE = '{sqlstate}';
           END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER fault BEFORE INSERT ON nifi_ops.load_event FOR EACH ROW EXECUTE FUNCTION public.fault();"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
}

#[tokio::test]
async fn serialization_failures_and_deadlocks_rerun_the_whole_transaction_once() {
    for state in ["40001", "40P01"] {
        let db = TestDb::fresh().await;
        // The first two attempts fail; the third (tx_attempts = 3) succeeds.
        inject_fault(&db, "RUN_STARTED", state, 2).await;
        let ledger = db
            .ledger(
                4,
                LedgerConfig {
                    tx_attempts: 3,
                    ..Default::default()
                },
            )
            .await;
        let created = ledger
            .create_run(&new_run("K"))
            .await
            .expect("retried to success");
        let mut conn = db.conn().await;
        let (runs, events): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM nifi_ops.load_run), (SELECT count(*) FROM nifi_ops.load_event WHERE run_id = $1)",
        )
        .bind(created.run_id)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!((runs, events), (1, 1), "{state}: one run, one event");
    }
}

#[tokio::test]
async fn a_change_and_its_event_commit_together_or_not_at_all() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let run = ledger.create_run(&new_run("K")).await.unwrap();
    inject_fault(&db, "RUN_FAILED", "XX000", 100).await;
    let failure = RunFailure {
        expected_status: RunStatus::Created,
        fail_status: RunStatus::FailedManifest,
        error_stage: "MANIFEST".into(),
        error_code: "X".into(),
        message: String::new(),
    };
    let err = ledger.fail_run(run.run_id, &failure).await.unwrap_err();
    assert!(matches!(err, LedgerError::Database(_)), "{err:?}");
    let mut conn = db.conn().await;
    let (status, version): (String, i32) =
        sqlx::query_as("SELECT status, version_no FROM nifi_ops.load_run WHERE run_id = $1")
            .bind(run.run_id)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), version),
        ("CREATED", 0),
        "the status change rolled back with its event"
    );
}

#[tokio::test]
async fn mirrored_runs_come_page_by_page_each_once_in_order() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(4, LedgerConfig::default()).await;
    let fence = ledger.acquire_epoch("test").await.unwrap();
    ledger
        .apply_job(
            &fence,
            "JOB",
            false,
            &serde_json::json!({}),
            "LoadJob/ns/job",
            Some(1),
        )
        .await
        .unwrap();
    let mut created = vec![];
    for n in 0..7 {
        created.push(
            ledger
                .create_run(&new_run(&format!("K{n}")))
                .await
                .unwrap()
                .run_id,
        );
    }
    let (mut seen, mut after, mut pages) = (vec![], None, 0);
    loop {
        let page = ledger.mirrored_runs_page(after, 3).await.unwrap();
        pages += 1;
        seen.extend(page.iter().map(|r| r.run_id));
        match page.last() {
            Some(last) if page.len() == 3 => after = Some((last.started_at, last.run_id)),
            _ => break,
        }
    }
    assert_eq!(pages, 3, "3 + 3 + 1");
    let mut expected = created.clone();
    expected.sort();
    let mut got = seen.clone();
    got.sort();
    assert_eq!(got, expected, "every run exactly once");
    let by_id = ledger.mirrored_runs_by_id(&created[2..4]).await.unwrap();
    assert_eq!(
        by_id.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        created[2..4].to_vec()
    );
}

/// The mirror sees active runs and those that ended within a day, never older ones (its SQL reads
/// only those two sets, issue 26).
#[tokio::test]
async fn mirrored_runs_are_the_active_ones_and_those_ended_within_a_day() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let fence = ledger.acquire_epoch("test").await.unwrap();
    ledger
        .apply_job(
            &fence,
            "JOB",
            false,
            &serde_json::json!({}),
            "LoadJob/ns/job",
            Some(1),
        )
        .await
        .unwrap();
    let mut ids = vec![];
    for n in 0..4 {
        ids.push(
            ledger
                .create_run(&new_run(&format!("K{n}")))
                .await
                .unwrap()
                .run_id,
        );
    }
    let mut conn = db.conn().await;
    // K1 ended 2 hours ago, K2 two days ago (heartbeat only), K3 is PUBLISH_UNKNOWN since a week.
    for (id, sql) in [
        (
            ids[1],
            "UPDATE nifi_ops.load_run SET status = 'SUCCESS', completed_at = now() - interval '2 hours' WHERE run_id = $1",
        ),
        (
            ids[2],
            "UPDATE nifi_ops.load_run SET status = 'FAILED_EXTRACT', heartbeat_at = now() - interval '2 days' WHERE run_id = $1",
        ),
        (
            ids[3],
            "UPDATE nifi_ops.load_run SET status = 'PUBLISH_UNKNOWN', heartbeat_at = now() - interval '7 days' WHERE run_id = $1",
        ),
    ] {
        testkit::outside_the_state_machine(&mut conn, sql, id).await;
    }
    let page = ledger.mirrored_runs_page(None, 10).await.unwrap();
    let mut seen: Vec<_> = page.iter().map(|r| r.run_id).collect();
    seen.sort();
    let mut expected = vec![ids[0], ids[1], ids[3]];
    expected.sort();
    assert_eq!(seen, expected);
    let by_id = ledger.mirrored_runs_by_id(&ids).await.unwrap();
    assert_eq!(by_id.len(), 3, "the old run is not mirrored by id either");
}

/// A LoadJob's summary: its active runs, its last final run, and what ended within 24 h (read by
/// the job's indexes, issue 26), never another job's runs.
#[tokio::test]
async fn a_job_summary_counts_the_last_day_of_its_own_runs() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let mut ids = vec![];
    for n in 0..6 {
        ids.push(
            ledger
                .create_run(&new_run(&format!("K{n}")))
                .await
                .unwrap()
                .run_id,
        );
    }
    let other = ledger
        .create_run(&ledger::NewRun {
            job_key: "OTHER".into(),
            ..new_run("K0")
        })
        .await
        .unwrap()
        .run_id;
    let mut conn = db.conn().await;
    for (id, status, ago) in [
        (ids[1], "SUCCESS", "2 hours"),
        (ids[2], "FAILED_EXTRACT", "3 hours"),
        (ids[3], "CANCELLED", "1 hour"),
        (ids[4], "SUCCESS", "2 days"),
        (ids[5], "TIMED_OUT", "30 hours"),
        (other, "SUCCESS", "10 minutes"),
    ] {
        let sql = format!(
            "UPDATE nifi_ops.load_run SET status = '{status}', completed_at = now() - interval '{ago}' WHERE run_id = $1"
        );
        testkit::outside_the_state_machine(&mut conn, &sql, id).await;
    }
    let s = ledger.job_summary("JOB").await.unwrap();
    assert_eq!(s.active_runs, 1);
    assert_eq!(s.active_run.map(|r| r.run_id), Some(ids[0]));
    assert_eq!(
        s.last_run.map(|r| (r.run_id, r.status)),
        Some((ids[3], "CANCELLED".into()))
    );
    assert_eq!((s.succeeded, s.failed, s.cancelled), (1, 1, 1));
}

/// The monitor's alert list capped at N is the first N of the whole list, whichever kinds crowd
/// it: each kind is cut to N by its own index before the kinds are merged (issue 43 item 3),
/// which must never change what is listed or in what order. Every kind has more rows than the
/// cap, their times interleaved, two of them on the same instant.
#[tokio::test]
async fn a_capped_alert_list_is_the_head_of_the_whole_list() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let mut conn = db.conn().await;
    // One instant every time is counted back from, so that equal offsets are equal times.
    let (base,): (String,) = sqlx::query_as("SELECT now()::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    for n in 0..76 {
        let id = ledger
            .create_run(&new_run(&format!("A{n}")))
            .await
            .unwrap()
            .run_id;
        // 5 to 15 hours ago (all within the day, all stale), ties on the same instant; the last
        // six runs, PUBLISH_UNKNOWN, tie at the head of the list, where a cap cuts among them.
        let ago = match n {
            70.. => "interval '2 hours'".to_string(),
            _ => format!("interval '{} minutes'", 300 + (n * 37 % 600) / 40 * 40),
        };
        let sql = match if n >= 70 { 0 } else { n % 7 } {
            0 | 1 => format!(
                "UPDATE nifi_ops.load_run SET status = 'PUBLISH_UNKNOWN', heartbeat_at = '{base}'::timestamptz - {ago} WHERE run_id = $1"
            ),
            2 => format!(
                "UPDATE nifi_ops.load_run SET status = 'STAGE_VALIDATING', heartbeat_at = '{base}'::timestamptz - {ago} WHERE run_id = $1"
            ),
            3 => format!(
                "UPDATE nifi_ops.load_run SET status = 'PUBLISHED', heartbeat_at = '{base}'::timestamptz - {ago} WHERE run_id = $1"
            ),
            4 => format!(
                "UPDATE nifi_ops.load_run SET status = 'FAILED_EXTRACT', completed_at = '{base}'::timestamptz - {ago} WHERE run_id = $1"
            ),
            5 => format!(
                "UPDATE nifi_ops.load_run SET heartbeat_at = '{base}'::timestamptz - {ago} WHERE run_id = $1"
            ),
            _ => format!(
                "UPDATE nifi_ops.load_run SET status = 'FAILED_PUBLISH', completed_at = '{base}'::timestamptz - {ago} WHERE run_id = $1"
            ),
        };
        testkit::outside_the_state_machine(&mut conn, &sql, id).await;
        // A DEAD dispatch (two on every third run, none on the last six), at the same times.
        let kinds = ["('VALIDATE_RUN', NULL)", "('REISSUE_PARTITION', '0000')"];
        let dispatches = match n {
            70.. => 0,
            _ => 1 + usize::from(n % 3 == 0),
        };
        for dispatch in &kinds[..dispatches] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type, partition_id, status, \
                   next_attempt_at, last_error) SELECT gen_random_uuid(), $1, k.t, k.p, 'DEAD', '{base}'::timestamptz - {ago}, 'HTTP 404' \
                   FROM (VALUES {dispatch}) AS k(t, p)"
            )))
            .bind(id)
            .execute(&mut conn)
            .await
            .unwrap();
        }
    }
    let whole = ledger.monitor_summary(1000).await.unwrap().alerts;
    let kinds: std::collections::BTreeMap<&str, usize> =
        whole.iter().fold(Default::default(), |mut m, a| {
            *m.entry(a.kind.as_str()).or_default() += 1;
            m
        });
    let key = |a: &ledger::ops::monitor::Alert| (a.kind.clone(), a.run_id, a.dispatch_id, a.at);
    for cap in [1, 2, 3, 5, 8, 13, 40] {
        let capped = ledger.monitor_summary(cap).await.unwrap().alerts;
        assert_eq!(
            capped.iter().map(key).collect::<Vec<_>>(),
            whole.iter().take(cap as usize).map(key).collect::<Vec<_>>(),
            "cap {cap}; kinds {kinds:?}"
        );
    }
    for kind in [
        "PUBLISH_UNKNOWN",
        "DISPATCH_DEAD",
        "RUN_FAILED",
        "RUN_STALE",
    ] {
        assert!(
            kinds.get(kind).copied().unwrap_or(0) > 13,
            "{kind}: {kinds:?}"
        );
    }
}

/// A write retried while the database is being replaced (a restore cuts every connection).
async fn until_answered<T, F, Fut>(what: &str, mut f: F) -> Result<T, LedgerError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LedgerError>>,
{
    for _ in 0..50 {
        match f().await {
            Err(LedgerError::Database(_)) => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            other => return other,
        }
    }
    panic!("{what}: the restored database never answered")
}

/// Issue 40 item 6. The ledger restored from a backup taken before a leadership change: the
/// leader of the later epoch finds its epoch ahead of the row (WentBack, nothing written), and the
/// next acquisition issues an epoch above every one issued, never the restored row's epoch + 1
/// again (seen failing with the acquisition's floor removed: epoch 2 was issued a second time, and
/// the deposed holder of the first 2 passed the fence).
#[tokio::test]
async fn after_a_restore_no_epoch_is_issued_twice() {
    let db = TestDb::fresh().await;
    let first = db.ledger(2, LedgerConfig::default()).await;
    let f1 = first.acquire_epoch("first").await.unwrap();
    assert_eq!(f1.epoch, 1);
    let backup = db.backup();
    // Another process leads: epoch 2, which it keeps holding through the restore.
    let second = db.ledger(2, LedgerConfig::default()).await;
    let f2 = second.acquire_epoch("second").await.unwrap();
    assert_eq!(f2.epoch, 2);
    second.advance_clock(&f2).await.unwrap();
    db.restore(&backup).await;

    let found = until_answered("the clock", || second.advance_clock(&f2)).await;
    match found {
        Err(LedgerError::WentBack(w)) => {
            assert_eq!((w.seen_epoch, w.ledger_epoch), (2, 1), "{w}");
            assert!(w.ledger_tick < w.seen_tick, "{w}");
        }
        other => panic!("the leader of epoch 2 did not notice the restore: {other:?}"),
    }
    // A candidate that read the Lease (epoch 2 issued) takes 3, and the holder of 2 is fenced.
    let third = db.ledger(2, LedgerConfig::default()).await;
    third.remember_epoch(second.continuity_marks().0);
    let f3 = until_answered("the acquisition", || third.acquire_epoch("third"))
        .await
        .unwrap();
    assert_eq!(f3.epoch, 3, "epoch 2 was issued before the restore");
    assert!(matches!(
        second.advance_clock(&f2).await,
        Err(LedgerError::Fenced {
            ours: 2,
            current: Some(3)
        })
    ));
    // The process that noticed it leads again above everything it saw, and goes on.
    let f4 = second.acquire_epoch("second").await.unwrap();
    assert_eq!(f4.epoch, 4);
    assert_eq!(second.went_back_count(), 1, "one restore, found once");
    second.advance_clock(&f4).await.unwrap();
}

/// Issue 40 item 6. A restore to a point after the last leadership change leaves the epoch as it
/// was: the leader notices by the ledger's clock, which it advanced since (seen failing with the
/// clock's comparison removed: the restored ledger's clock was advanced and nothing was noticed).
#[tokio::test]
async fn a_restore_under_a_running_leader_is_found_by_its_clock() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let fence = ledger.acquire_epoch("leader").await.unwrap();
    ledger.advance_clock(&fence).await.unwrap();
    let backup = db.backup();
    let mut at = 0;
    for _ in 0..3 {
        at = ledger.advance_clock(&fence).await.unwrap();
    }
    assert_eq!(at, 5, "1 at the acquisition, then one per call");
    db.restore(&backup).await;
    match until_answered("the clock", || ledger.advance_clock(&fence)).await {
        Err(LedgerError::WentBack(w)) => {
            assert_eq!((w.seen_tick, w.ledger_tick), (5, 2), "{w}");
            assert_eq!((w.seen_epoch, w.ledger_epoch), (1, 1), "{w}");
        }
        other => panic!("the restore was not noticed: {other:?}"),
    }
    let mut conn = db.conn().await;
    let (tick,): (i64,) = sqlx::query_as("SELECT tick FROM nifi_ops.ledger_clock")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(tick, 2, "nothing written when the ledger went back");
    // Leading again accepts the ledger as it is: an epoch above, the clock from its value.
    let again = ledger.acquire_epoch("leader").await.unwrap();
    assert_eq!(again.epoch, 2);
    assert_eq!(ledger.advance_clock(&again).await.unwrap(), 4);
}

/// Issue 40 item 6. A run the ledger holds at an older version than its LoadRun showed: its
/// versions go on after the shown one (never issued twice), and a run whose LoadRun had shown its
/// publish begun, held before PUBLISHING, becomes PUBLISH_UNKNOWN with its event, for a person to
/// resolve as any other; a run already publishing is left to its publish result.
#[tokio::test]
async fn a_run_published_after_the_restore_point_is_held_for_a_person() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let fence = ledger.acquire_epoch("leader").await.unwrap();
    let actor = ledger::Actor {
        name: "kubernetes:ns/lr".into(),
        role: "operator".into(),
    };
    let held = ledger.create_run(&new_run("HELD")).await.unwrap().run_id;
    let publishing = ledger.create_run(&new_run("PUB")).await.unwrap().run_id;
    let mut conn = db.conn().await;
    for (run, status) in [(held, "STAGING_VALIDATED"), (publishing, "PUBLISHING")] {
        testkit::outside_the_state_machine(
            &mut conn,
            &format!(
                "UPDATE nifi_ops.load_run SET status = '{status}', version_no = 4 WHERE run_id = $1"
            ),
            run,
        )
        .await;
    }
    let row = |run| {
        let url = db.url.clone();
        async move {
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::query_as::<_, (String, i64, Option<String>, Option<String>)>(
                "SELECT status, version_no::bigint, error_code, error_message FROM nifi_ops.load_run WHERE run_id = $1",
            )
            .bind(run)
            .fetch_one(&mut conn)
            .await
            .unwrap()
        }
    };
    // The LoadRun showed version 9, SUCCESS; the ledger holds version 4, STAGING_VALIDATED.
    let stale = ledger
        .run_went_back(&fence, held, 3, 9, RunStatus::Success, &actor)
        .await;
    assert!(
        matches!(stale, Err(LedgerError::RunStatusMismatch { .. })),
        "not the version the mirror read: nothing done, but {stale:?}"
    );
    let outcome = ledger
        .run_went_back(&fence, held, 4, 9, RunStatus::Success, &actor)
        .await
        .unwrap();
    assert!(outcome.held);
    let (status, version, code, message) = row(held).await;
    assert_eq!(
        (status.as_str(), version, code.as_deref()),
        ("PUBLISH_UNKNOWN", 10, Some("PUBLISHED_AFTER_RESTORE_POINT"))
    );
    assert!(message.unwrap().contains("showed SUCCESS"));
    let (events,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM nifi_ops.load_event WHERE run_id = $1 AND event_name = 'RUN_HELD_AFTER_RESTORE'",
    )
    .bind(held)
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(events, 1);
    // Publishing already: not held, but its versions go on after the shown one all the same.
    let outcome = ledger
        .run_went_back(&fence, publishing, 4, 7, RunStatus::Published, &actor)
        .await
        .unwrap();
    assert!(!outcome.held);
    let (status, version, _, _) = row(publishing).await;
    assert_eq!((status.as_str(), version), ("PUBLISHING", 8));
    let resolved = ledger
        .resolve_publish_unknown(held, RunStatus::Published, "in Hive", &actor, Some(&fence))
        .await
        .unwrap();
    assert_eq!(resolved.run_status, RunStatus::Published);
}

/// Issue 40 item 6. An installation on an empty database, under a Lease kept from an earlier one
/// (it says epoch 5 and clock 40 were seen): the new ledger did not go back, but no epoch the
/// Lease names is issued again (seen failing without the new-ledger case: went_back_count 1).
#[tokio::test]
async fn a_new_ledger_under_an_old_lease_did_not_go_back() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    ledger.remember_epoch(5);
    ledger.set_known_clock(40);
    let fence = ledger.acquire_epoch("new").await.unwrap();
    assert_eq!(fence.epoch, 6);
    assert_eq!(ledger.went_back_count(), 0);
    assert_eq!(ledger.advance_clock(&fence).await.unwrap(), 2);
}

/// The run heartbeat a decision holding the run lock writes (`beat_locked_run`): a validation's
/// metrics move it at once, whatever its age (a NiFi report's moves it at most once a second).
#[tokio::test]
async fn stored_metrics_beat_the_run() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let run = ledger.create_run(&new_run("metrics")).await.unwrap().run_id;
    let mut conn = db.conn().await;
    testkit::outside_the_state_machine(
        &mut conn,
        "UPDATE nifi_ops.load_run SET status = 'STAGE_VALIDATING', \
           heartbeat_at = clock_timestamp() - interval '1 hour' WHERE run_id = $1",
        run,
    )
    .await;
    let heartbeat = || {
        sqlx::query_scalar::<_, f64>(
            "SELECT extract(epoch FROM clock_timestamp() - heartbeat_at)::float8 \
               FROM nifi_ops.load_run WHERE run_id = $1",
        )
        .bind(run)
    };
    assert!(heartbeat().fetch_one(&mut conn).await.unwrap() > 3000.0);
    ledger
        .store_metrics(
            run,
            ledger::MetricStage::Staging,
            "v1",
            &[ledger::MetricItem {
                metric_name: "row_count".into(),
                expected_value: Some("5".into()),
                actual_value: Some("5".into()),
                tolerance: None,
                result: "PASS".into(),
                details: Default::default(),
            }],
        )
        .await
        .unwrap();
    let age = heartbeat().fetch_one(&mut conn).await.unwrap();
    assert!(
        age < 60.0,
        "the run's heartbeat is {age} s old after its metrics"
    );
}

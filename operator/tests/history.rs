//! History retention (CONTRACT §7.2 rule 7): what is due goes with every row of it, everything
//! the rule must keep is kept, the work per tick is bounded and done one run per transaction,
//! fencing, and the JSON-lines archive. Time is faked by moving the runs' end times into the past.
mod common;
use common::*;
use ledger::{Actor, LedgerError, MetricItem, MetricStage, RunFailure, RunStatus};
use std::collections::BTreeSet;
use std::time::Duration;
use uuid::Uuid;

const TABLES: [&str; 6] = [
    "load_run",
    "load_partition",
    "load_file",
    "load_validation",
    "load_dispatch",
    "load_event",
];

async fn sweep(env: &Env) -> ledger::SweepReport {
    let fence = env.fence().await;
    env.ledger
        .sweep(&fence)
        .await
        .unwrap()
        .expect("tick lock free")
}

/// Rows of `run` in each table of [`TABLES`].
async fn rows_of(env: &Env, run: Uuid) -> Vec<i64> {
    let mut out = vec![];
    for t in TABLES {
        out.push(
            env.scalar(
                &format!("SELECT count(*) FROM nifi_ops.{t} WHERE run_id = $1"),
                run,
            )
            .await,
        );
    }
    out
}

/// Rows in each table of [`TABLES`], all runs (and run-less events) together.
async fn totals(env: &Env) -> Vec<i64> {
    let mut out = vec![];
    for t in TABLES {
        let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM nifi_ops.{t}"
        )))
        .fetch_one(&mut env.conn().await)
        .await
        .unwrap();
        out.push(n);
    }
    out
}

/// A run that ended FAILED_STAGE_VALIDATION with rows in every table: a partition and its chunk
/// file, SOURCE-free STAGING metrics, its ACKED VALIDATE_RUN dispatch and its events.
async fn finished(env: &Env, bk: &str) -> Uuid {
    let (run, dispatch) = env.validated(bk).await;
    assert!(
        env.ledger
            .start_validation(run, dispatch, "nifi-01")
            .await
            .unwrap()
            .started
    );
    env.ledger
        .store_metrics(
            run,
            MetricStage::Staging,
            "v1",
            &[MetricItem {
                metric_name: "STAGE_COUNT".into(),
                expected_value: Some("3".into()),
                actual_value: Some("2".into()),
                tolerance: None,
                result: "FAIL".into(),
                details: Default::default(),
            }],
        )
        .await
        .unwrap();
    env.ledger
        .fail_run(
            run,
            &RunFailure {
                expected_status: RunStatus::StageValidating,
                fail_status: RunStatus::FailedStageValidation,
                error_stage: "STAGE_VALIDATION".into(),
                error_code: "STAGE_COUNT_MISMATCH".into(),
                message: "2 of 3 rows".into(),
            },
        )
        .await
        .unwrap();
    let rows = rows_of(env, run).await;
    assert!(
        rows.iter().all(|n| *n > 0),
        "a row in every table: {rows:?}"
    );
    run
}

/// Cleaned, and ended `days` ago.
async fn ended_days_ago(env: &Env, run: Uuid, days: i64) {
    env.exec(
        &format!(
            "UPDATE nifi_ops.load_run SET cleaned_at = now(), completed_at = now() - interval '{days} days' WHERE run_id = $1"
        ),
        run,
    )
    .await;
}

/// A finished, cleaned run ended 200 days ago: due under the default P180D.
async fn due(env: &Env, bk: &str) -> Uuid {
    let run = finished(env, bk).await;
    ended_days_ago(env, run, 200).await;
    run
}

async fn gone(env: &Env, run: Uuid) -> bool {
    rows_of(env, run).await.iter().all(|n| *n == 0)
}

/// One tick with a due control run besides `kept`: the control goes (so the rule did run), `kept`
/// keeps every row.
async fn assert_kept(env: &Env, kept: Uuid) {
    let before = rows_of(env, kept).await;
    let control = due(env, "CONTROL").await;
    let report = sweep(env).await;
    assert_eq!(
        report.actions.get("history_deleted"),
        Some(&1),
        "{report:?}"
    );
    assert!(gone(env, control).await);
    assert_eq!(
        rows_of(env, kept).await,
        before,
        "every row of the kept run"
    );
}

#[tokio::test]
async fn a_due_run_goes_with_every_row_of_it() {
    let env = Env::start(|_| {}).await;
    let a = due(&env, "A").await;
    let b = due(&env, "B").await;
    let recent = finished(&env, "RECENT").await;
    ended_days_ago(&env, recent, 10).await;
    let (active, _) = env.extracting("ACTIVE", &[3]).await;
    let per_run: Vec<Vec<i64>> =
        futures::future::join_all([a, b, recent, active].map(|r| rows_of(&env, r))).await;
    let before = totals(&env).await;
    let report = sweep(&env).await;
    assert_eq!(
        report.actions.get("history_deleted"),
        Some(&2),
        "{report:?}"
    );
    assert!(report.rule_errors.is_empty(), "{report:?}");
    let after = totals(&env).await;
    for (i, t) in TABLES.iter().enumerate() {
        assert_eq!(
            after[i],
            before[i] - per_run[0][i] - per_run[1][i],
            "{t}: exactly the rows of the two due runs went"
        );
    }
    assert!(gone(&env, a).await && gone(&env, b).await);
    assert_eq!(rows_of(&env, recent).await, per_run[2]);
    assert_eq!(rows_of(&env, active).await, per_run[3]);
    assert!(
        !sweep(&env).await.actions.contains_key("history_deleted"),
        "nothing left to do"
    );
}

#[tokio::test]
async fn a_run_not_cleaned_is_kept() {
    let env = Env::start(|_| {}).await;
    let run = due(&env, "K").await;
    env.exec(
        "UPDATE nifi_ops.load_run SET cleaned_at = NULL WHERE run_id = $1",
        run,
    )
    .await;
    assert_kept(&env, run).await;
}

#[tokio::test]
async fn a_run_ended_within_the_retention_is_kept() {
    let env = Env::start(|c| {
        c.cleanup.history_retention = Some(lcconfig::config::Dur::secs(200 * 86400 + 3600))
    })
    .await;
    // 200 days old, retention 200 days and an hour: kept; the end time is COALESCE(completed_at,
    // heartbeat_at), so an old heartbeat does not make it due.
    let run = due(&env, "K").await;
    env.exec(
        "UPDATE nifi_ops.load_run SET heartbeat_at = now() - interval '900 days' WHERE run_id = $1",
        run,
    )
    .await;
    let before = rows_of(&env, run).await;
    let control = finished(&env, "CONTROL").await;
    ended_days_ago(&env, control, 201).await;
    assert_eq!(sweep(&env).await.actions.get("history_deleted"), Some(&1));
    assert!(gone(&env, control).await);
    assert_eq!(rows_of(&env, run).await, before);
}

#[tokio::test]
async fn a_run_without_completed_at_ends_at_its_heartbeat() {
    let env = Env::start(|_| {}).await;
    let run = due(&env, "K").await;
    env.exec(
        "UPDATE nifi_ops.load_run SET completed_at = NULL, heartbeat_at = now() - interval '10 days' WHERE run_id = $1",
        run,
    )
    .await;
    assert_kept(&env, run).await;
    env.exec(
        "UPDATE nifi_ops.load_run SET heartbeat_at = now() - interval '181 days' WHERE run_id = $1",
        run,
    )
    .await;
    assert_eq!(sweep(&env).await.actions.get("history_deleted"), Some(&1));
    assert!(gone(&env, run).await);
}

#[tokio::test]
async fn an_active_run_is_kept() {
    let env = Env::start(|_| {}).await;
    // EXTRACTING with a cleanup marker and an end time far in the past: never history.
    let (run, _) = env.extracting("K", &[3]).await;
    ended_days_ago(&env, run, 400).await;
    env.exec(
        "UPDATE nifi_ops.load_run SET heartbeat_at = now() - interval '400 days' WHERE run_id = $1",
        run,
    )
    .await;
    assert_kept(&env, run).await;
}

#[tokio::test]
async fn a_publish_unknown_run_is_kept() {
    let env = Env::start(|_| {}).await;
    let run = due(&env, "K").await;
    // Ended runs are never left again (the state machine's trigger refuses it): placed by hand.
    testkit::outside_the_state_machine(
        &mut env.conn().await,
        "UPDATE nifi_ops.load_run SET status = 'PUBLISH_UNKNOWN' WHERE run_id = $1",
        run,
    )
    .await;
    assert_kept(&env, run).await;
}

/// A cancelled run whose VALIDATE_RUN an operator resent: PENDING again.
async fn resent_after_cancel(env: &Env, bk: &str) -> (Uuid, Uuid) {
    let (run, dispatch) = env.validated(bk).await;
    let actor = Actor {
        name: "test".into(),
        role: "operator".into(),
    };
    env.ledger
        .cancel_run(run, "stop", &actor, None)
        .await
        .unwrap();
    assert_eq!(
        env.text(
            "SELECT last_error FROM nifi_ops.load_dispatch WHERE run_id = $1",
            run
        )
        .await
        .as_deref(),
        Some("run cancelled")
    );
    env.ledger
        .resend_dispatch(run, dispatch, &actor)
        .await
        .unwrap();
    ended_days_ago(env, run, 200).await;
    (run, dispatch)
}

#[tokio::test]
async fn a_run_with_a_pending_dispatch_is_kept() {
    let env = Env::start(|_| {}).await;
    let (run, _) = resent_after_cancel(&env, "K").await;
    assert_eq!(
        env.text(
            "SELECT status FROM nifi_ops.load_dispatch WHERE run_id = $1",
            run
        )
        .await
        .as_deref(),
        Some("PENDING")
    );
    assert_kept(&env, run).await;
}

#[tokio::test]
async fn a_run_with_a_sent_dispatch_is_kept() {
    let env = Env::start(|_| {}).await;
    let (run, _) = resent_after_cancel(&env, "K").await;
    // As the dispatcher leaves it after a delivered send.
    env.exec(
        "UPDATE nifi_ops.load_dispatch SET status = 'SENT', sent_at = now() - interval '200 days', attempt_count = 1 WHERE run_id = $1",
        run,
    )
    .await;
    assert_kept(&env, run).await;
}

#[tokio::test]
async fn a_run_with_an_unresolved_dead_dispatch_is_kept_and_settled_ones_are_not() {
    let env = Env::start(|_| {}).await;
    // TIMED_OUT in REISSUE-like fashion: a REISSUE_PARTITION that went DEAD by itself (attempts
    // exhausted) before the run ended raises the DISPATCH_DEAD alert: an operator must see it.
    let dead = due(&env, "DEAD").await;
    env.exec(
        "INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type, partition_id, status, attempt_count, last_error) \
         VALUES (gen_random_uuid(), $1, 'REISSUE_PARTITION', '0000', 'DEAD', 20, 'max attempts reached: HTTP 503')",
        dead,
    )
    .await;
    // Settled because its run ended (§2.2): no alert, no reason to keep the run.
    let settled = due(&env, "SETTLED").await;
    env.exec(
        "INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type, partition_id, status, last_error) \
         VALUES (gen_random_uuid(), $1, 'REISSUE_PARTITION', '0000', 'DEAD', 'run ended: TIMED_OUT')",
        settled,
    )
    .await;
    // Cancelled: `run cancelled`.
    let (cancelled, dispatch) = env.validated("CANCELLED").await;
    env.ledger
        .cancel_run(
            cancelled,
            "stop",
            &Actor {
                name: "test".into(),
                role: "operator".into(),
            },
            None,
        )
        .await
        .unwrap();
    ended_days_ago(&env, cancelled, 200).await;
    let before = rows_of(&env, dead).await;
    let report = sweep(&env).await;
    assert_eq!(
        report.actions.get("history_deleted"),
        Some(&2),
        "{report:?}"
    );
    assert!(gone(&env, settled).await && gone(&env, cancelled).await);
    assert_eq!(
        env.scalar(
            "SELECT count(*) FROM nifi_ops.load_dispatch WHERE dispatch_id = $1",
            dispatch
        )
        .await,
        0
    );
    assert_eq!(
        rows_of(&env, dead).await,
        before,
        "the alerting run is kept"
    );
    // Once the operator resolved it (resend, then the NiFi ACK: ACKED), it goes.
    env.exec(
        "UPDATE nifi_ops.load_dispatch SET status = 'ACKED', acked_at = now() WHERE run_id = $1 AND status = 'DEAD'",
        dead,
    )
    .await;
    assert_eq!(sweep(&env).await.actions.get("history_deleted"), Some(&1));
    assert!(gone(&env, dead).await);
}

#[tokio::test]
async fn history_retention_null_turns_the_rule_off() {
    let env = Env::start(|c| c.cleanup.history_retention = None).await;
    let run = due(&env, "K").await;
    insert_runless_event(&env, 400).await;
    let before = totals(&env).await;
    let report = sweep(&env).await;
    assert!(report.actions.is_empty(), "{report:?}");
    assert_eq!(totals(&env).await, before);
    assert!(!gone(&env, run).await);
}

async fn insert_runless_event(env: &Env, days: i64) -> Uuid {
    let id = Uuid::new_v4();
    env.exec(
        &format!(
            "INSERT INTO nifi_ops.load_event (event_id, event_time, event_level, event_name, process_group, message) \
             VALUES ($1, now() - interval '{days} days', 'WARN', 'CLEANUP_FAILED', 'PG-90', 'no run yet')"
        ),
        id,
    )
    .await;
    id
}

async fn event_exists(env: &Env, id: Uuid) -> bool {
    env.scalar(
        "SELECT count(*) FROM nifi_ops.load_event WHERE event_id = $1",
        id,
    )
    .await
        == 1
}

#[tokio::test]
async fn old_runless_events_go_and_recent_ones_stay() {
    let env = Env::start(|_| {}).await;
    let old: Vec<Uuid> =
        futures::future::join_all((0..3).map(|_| insert_runless_event(&env, 181))).await;
    let recent = insert_runless_event(&env, 179).await;
    // An old event of a run that stays (not cleaned) is not run-less: kept.
    let (kept, _) = env.extracting("K", &[3]).await;
    env.exec(
        "UPDATE nifi_ops.load_event SET event_time = now() - interval '400 days' WHERE run_id = $1",
        kept,
    )
    .await;
    let kept_events = env
        .scalar(
            "SELECT count(*) FROM nifi_ops.load_event WHERE run_id = $1",
            kept,
        )
        .await;
    let report = sweep(&env).await;
    assert_eq!(report.actions.get("events_deleted"), Some(&3), "{report:?}");
    assert_eq!(report.actions.get("history_deleted"), None);
    for id in old {
        assert!(!event_exists(&env, id).await);
    }
    assert!(event_exists(&env, recent).await);
    assert_eq!(
        env.scalar(
            "SELECT count(*) FROM nifi_ops.load_event WHERE run_id = $1",
            kept
        )
        .await,
        kept_events
    );
}

#[tokio::test]
async fn a_tick_deletes_history_batch_runs_oldest_first() {
    let env = Env::start(|c| c.cleanup.history_batch = 3).await;
    let mut runs = vec![];
    for i in 0..7 {
        let run = finished(&env, &format!("R{i}")).await;
        // R0 is the oldest.
        ended_days_ago(&env, run, 300 - i).await;
        runs.push(run);
    }
    let mut per_tick = vec![];
    for _ in 0..4 {
        per_tick.push(
            sweep(&env)
                .await
                .actions
                .get("history_deleted")
                .copied()
                .unwrap_or(0),
        );
        let left: Vec<bool> = futures::future::join_all(runs.iter().map(|r| gone(&env, *r))).await;
        let gone_count = left.iter().filter(|g| **g).count();
        assert!(
            left[..gone_count].iter().all(|g| *g),
            "oldest first: {left:?}"
        );
    }
    assert_eq!(per_tick, vec![3, 3, 1, 0]);
}

#[tokio::test]
async fn a_deposed_leader_deletes_nothing() {
    let env = Env::start(|_| {}).await;
    let run = due(&env, "K").await;
    let old = env.fence().await;
    let new = env.ledger.acquire_epoch("new-leader").await.unwrap();
    let before = totals(&env).await;
    assert!(matches!(
        env.ledger.sweep_history(&old).await,
        Err(LedgerError::Fenced { .. })
    ));
    assert!(matches!(
        env.ledger.sweep(&old).await,
        Err(LedgerError::Fenced { .. })
    ));
    assert_eq!(totals(&env).await, before, "no run deleted");
    // Nothing due but run-less events: their transaction is fenced too.
    env.exec(
        "UPDATE nifi_ops.load_run SET cleaned_at = NULL WHERE run_id = $1",
        run,
    )
    .await;
    let event = insert_runless_event(&env, 400).await;
    assert!(matches!(
        env.ledger.sweep_history(&old).await,
        Err(LedgerError::Fenced { .. })
    ));
    assert!(event_exists(&env, event).await);
    let report = env.ledger.sweep_history(&new).await.unwrap();
    assert_eq!((report.runs_deleted, report.events_deleted), (0, 1));
}

/// The retention deletes run after run, each in its own transaction: held inside one run's delete
/// (a probe transaction locks that run's chunk rows), the runs before it are already gone for
/// everyone, and claims and chunk reports of active runs go through while it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reports_go_through_while_the_retention_is_in_progress() {
    let env = Env::start(|c| c.cleanup.history_batch = 50).await;
    let mut runs = vec![];
    for i in 0..12 {
        let run = finished(&env, &format!("R{i:02}")).await;
        ended_days_ago(&env, run, 400 - i).await;
        runs.push(run);
    }
    let held = runs[5];
    let (active, tokens) = env.extracting("ACTIVE", &[3, 3]).await;
    let mut probe = env.conn().await;
    sqlx::query("BEGIN").execute(&mut probe).await.unwrap();
    sqlx::query("SELECT 1 FROM nifi_ops.load_file WHERE run_id = $1 FOR UPDATE")
        .bind(held)
        .execute(&mut probe)
        .await
        .unwrap();
    let fence = env.fence().await;
    let ledger = env.ledger.clone();
    let pass = tokio::spawn(async move { ledger.sweep_history(&fence).await });
    // Wait (bounded) until the pass is stuck deleting the held run's files.
    let mut watch = env.conn().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (waiting,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
               AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM nifi_ops.load_file%'",
        )
        .fetch_one(&mut watch)
        .await
        .unwrap();
        if waiting == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the pass never reached the held run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The five older runs are committed gone while the pass is still in progress.
    for run in &runs[..5] {
        assert!(
            gone(&env, *run).await,
            "an earlier run is deleted and committed"
        );
    }
    assert!(!gone(&env, held).await);
    // Hot-path calls on other runs complete meanwhile.
    let hot = async {
        let first = env.chunk(active, "0000", tokens[0], 3).await;
        let last = env.chunk(active, "0001", tokens[1], 3).await;
        let (other, _) = env.extracting("OTHER", &[2, 2]).await;
        (first, last, other)
    };
    let (first, last, other) = tokio::time::timeout(Duration::from_secs(20), hot)
        .await
        .expect("reports and claims are not held by the retention");
    assert_eq!(first.result, ledger::ChunkResult::PartitionSuccess);
    assert!(
        last.validation_scheduled,
        "the completing report went through"
    );
    assert_eq!(
        env.text(
            "SELECT status FROM nifi_ops.load_run WHERE run_id = $1",
            other
        )
        .await
        .as_deref(),
        Some("EXTRACTING")
    );
    // ... while the pass was still held: it has not finished and still waits.
    assert!(!pass.is_finished(), "the retention was still in progress");
    let (still,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
           AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM nifi_ops.load_file%'",
    )
    .fetch_one(&mut watch)
    .await
    .unwrap();
    assert_eq!(still, 1);
    sqlx::query("ROLLBACK").execute(&mut probe).await.unwrap();
    let report = pass.await.unwrap().unwrap();
    assert_eq!(report.runs_deleted, 12);
    for run in &runs {
        assert!(gone(&env, *run).await);
    }
    assert!(!gone(&env, active).await);
}

fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("lc-history-{name}-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every id of the rows of `runs` and of the run-less events, as the archive names them.
async fn ids_in_ledger(env: &Env, runs: &[Uuid], runless: &[Uuid]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut conn = env.conn().await;
    for run in runs {
        ids.insert(format!("run {run}"));
        for (sql, kind) in [
            (
                "SELECT partition_id FROM nifi_ops.load_partition WHERE run_id = $1",
                "partition",
            ),
            (
                "SELECT partition_id || '/' || chunk_index FROM nifi_ops.load_file WHERE run_id = $1",
                "file",
            ),
            (
                "SELECT validation_id::text FROM nifi_ops.load_validation WHERE run_id = $1",
                "validation",
            ),
            (
                "SELECT dispatch_id::text FROM nifi_ops.load_dispatch WHERE run_id = $1",
                "dispatch",
            ),
            (
                "SELECT event_id::text FROM nifi_ops.load_event WHERE run_id = $1",
                "event",
            ),
        ] {
            let rows: Vec<(String,)> = sqlx::query_as(sql)
                .bind(run)
                .fetch_all(&mut conn)
                .await
                .unwrap();
            for (id,) in rows {
                ids.insert(format!("{kind} {run} {id}"));
            }
        }
    }
    for e in runless {
        ids.insert(format!("runless-event {e}"));
    }
    ids
}

/// The same ids read back from the archive's lines; checks each line's file is its day's.
fn ids_in_archive(dir: &std::path::Path) -> (BTreeSet<String>, usize) {
    let mut ids = BTreeSet::new();
    let mut lines = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let day = name
            .strip_prefix("load-history-")
            .and_then(|n| n.strip_suffix(".jsonl"))
            .unwrap_or_else(|| panic!("unexpected file {name}"))
            .to_string();
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            lines += 1;
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(run) = v.get("run") {
                let id = run["run_id"].as_str().unwrap().to_string();
                let end = run["completed_at"].as_str().unwrap();
                assert!(end.starts_with(&day), "{end} in {name}");
                assert!(run["snapshot_scn"].is_number() && run["cleaned_at"].is_string());
                ids.insert(format!("run {id}"));
                for (key, kind, field) in [
                    ("partitions", "partition", None),
                    ("files", "file", Some("chunk_index")),
                    ("validations", "validation", None),
                    ("dispatches", "dispatch", None),
                    ("events", "event", None),
                ] {
                    for row in v[key].as_array().unwrap() {
                        assert_eq!(row["run_id"].as_str(), Some(id.as_str()));
                        let own = match (kind, field) {
                            ("partition", _) => row["partition_id"].as_str().unwrap().to_string(),
                            ("file", Some(f)) => {
                                format!("{}/{}", row["partition_id"].as_str().unwrap(), row[f])
                            }
                            ("validation", _) => row["validation_id"].to_string(),
                            ("dispatch", _) => row["dispatch_id"].as_str().unwrap().to_string(),
                            _ => row["event_id"].as_str().unwrap().to_string(),
                        };
                        ids.insert(format!("{kind} {id} {own}"));
                    }
                }
            } else {
                let e = &v["event"];
                assert!(e["run_id"].is_null());
                assert!(e["event_time"].as_str().unwrap().starts_with(&day));
                ids.insert(format!("runless-event {}", e["event_id"].as_str().unwrap()));
            }
        }
    }
    (ids, lines)
}

#[tokio::test]
async fn the_archive_holds_every_deleted_row() {
    let dir = scratch_dir("archive");
    let d = dir.clone();
    let env = Env::start(move |c| {
        c.cleanup.history_archive = lcconfig::config::HistoryArchiveConfig::Dir(d);
    })
    .await;
    let a = due(&env, "A").await;
    let b = finished(&env, "B").await;
    ended_days_ago(&env, b, 250).await;
    let kept = finished(&env, "KEPT").await;
    ended_days_ago(&env, kept, 20).await;
    let runless = vec![
        insert_runless_event(&env, 181).await,
        insert_runless_event(&env, 300).await,
    ];
    let expected = ids_in_ledger(&env, &[a, b], &runless).await;
    let report = sweep(&env).await;
    assert_eq!(
        report.actions.get("history_deleted"),
        Some(&2),
        "{report:?}"
    );
    assert_eq!(report.actions.get("events_deleted"), Some(&2), "{report:?}");
    let (archived, lines) = ids_in_archive(&dir);
    assert_eq!(archived, expected, "every deleted row, nothing else");
    assert_eq!(lines, 4, "one line per run and per run-less event");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        4,
        "one file per day"
    );
    assert!(gone(&env, a).await && gone(&env, b).await && !gone(&env, kept).await);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// CONTRACT §9.2: a file outside the database never holds a token. The run's publish token, its
/// partitions' claim tokens and the tokens in event details (`PUBLISH_STARTED`'s, and one a NiFi
/// flow wrote into a row of its own) are archived as `***`; the rest of each row as it was.
#[tokio::test]
async fn the_archive_holds_no_token() {
    let dir = scratch_dir("archive-tokens");
    let d = dir.clone();
    let env = Env::start(move |c| {
        c.cleanup.history_archive = lcconfig::config::HistoryArchiveConfig::Dir(d);
    })
    .await;
    let run = due(&env, "TOKENS").await;
    let publish_token = Uuid::new_v4();
    env.exec(
        &format!(
            "UPDATE nifi_ops.load_run SET publish_token = '{publish_token}' WHERE run_id = $1"
        ),
        run,
    )
    .await;
    env.exec(
        &format!(
            "INSERT INTO nifi_ops.load_event (event_id, event_level, event_name, run_id, process_group, details) \
             VALUES (gen_random_uuid(), 'INFO', 'PUBLISH_STARTED', $1, 'LOAD_CONTROL_API', \
                     '{{\"publishToken\": \"{publish_token}\", \"kept\": 1}}'), \
                    (gen_random_uuid(), 'WARN', 'EXTRACT_RETRY', $1, 'PG-20', \
                     '{{\"claimToken\": \"{publish_token}\"}}')"
        ),
        run,
    )
    .await;
    let (claim_tokens,): (Vec<Uuid>,) = sqlx::query_as(
        "SELECT array_agg(claim_token) FROM nifi_ops.load_partition WHERE run_id = $1 AND claim_token IS NOT NULL",
    )
    .bind(run)
    .fetch_one(&mut env.conn().await)
    .await
    .unwrap();
    assert!(
        !claim_tokens.is_empty(),
        "the run's partitions were claimed"
    );
    let report = sweep(&env).await;
    assert_eq!(
        report.actions.get("history_deleted"),
        Some(&1),
        "{report:?}"
    );
    let mut text = String::new();
    for file in std::fs::read_dir(&dir).unwrap() {
        text.push_str(&std::fs::read_to_string(file.unwrap().path()).unwrap());
    }
    for token in claim_tokens.iter().chain([&publish_token]) {
        assert!(
            !text.contains(&token.to_string()),
            "{token} archived in clear: {text}"
        );
    }
    let line: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(line["run"]["publish_token"], "***");
    assert_eq!(
        line["run"]["run_id"],
        run.to_string(),
        "the rest of the row as it was"
    );
    assert!(
        line["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["claim_token"] == "***"),
        "{}",
        line["partitions"]
    );
    let events = line["events"].as_array().unwrap();
    let started = events
        .iter()
        .find(|e| e["event_name"] == "PUBLISH_STARTED")
        .unwrap();
    assert_eq!(
        started["details"],
        serde_json::json!({"publishToken": "***", "kept": 1})
    );
    let nifi = events
        .iter()
        .find(|e| e["event_name"] == "EXTRACT_RETRY")
        .unwrap();
    assert_eq!(nifi["details"], serde_json::json!({"claimToken": "***"}));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A run whose delete fails (here a trigger; in life a missing DELETE grant or a foreign key) is
/// neither deleted nor archived, and the pass goes on with the next run.
#[tokio::test]
async fn a_run_whose_delete_fails_is_not_archived_and_the_pass_goes_on() {
    let dir = scratch_dir("failing");
    let d = dir.clone();
    let env = Env::start(move |c| {
        c.cleanup.history_archive = lcconfig::config::HistoryArchiveConfig::Dir(d);
    })
    .await;
    let stuck = finished(&env, "STUCK").await;
    ended_days_ago(&env, stuck, 300).await;
    let next = due(&env, "NEXT").await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$; \
         CREATE TRIGGER refuse BEFORE DELETE ON nifi_ops.load_run FOR EACH ROW \
           WHEN (OLD.run_id = '{stuck}') EXECUTE FUNCTION refuse_delete();"
    )))
    .execute(&mut env.conn().await)
    .await
    .unwrap();
    let expected = ids_in_ledger(&env, &[next], &[]).await;
    let before = rows_of(&env, stuck).await;
    let report = sweep(&env).await;
    assert_eq!(
        report.actions.get("history_deleted"),
        Some(&1),
        "{report:?}"
    );
    assert_eq!(report.rule_errors.len(), 1, "{report:?}");
    assert_eq!(
        rows_of(&env, stuck).await,
        before,
        "every row of the stuck run"
    );
    assert!(gone(&env, next).await);
    assert_eq!(
        ids_in_archive(&dir).0,
        expected,
        "the stuck run is not archived"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn an_unwritable_archive_deletes_nothing_and_logs_an_error() {
    // A regular file where the directory should be: not writable for anyone, root included.
    let dir = scratch_dir("unwritable");
    let not_a_dir = dir.join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let d = not_a_dir.clone();
    let env = Env::start(move |c| {
        c.cleanup.history_archive = lcconfig::config::HistoryArchiveConfig::Dir(d);
    })
    .await;
    let run = due(&env, "K").await;
    let event = insert_runless_event(&env, 300).await;
    let before = totals(&env).await;
    let log = LogCapture::default();
    let report = {
        let _guard = tracing::subscriber::set_default(log.subscriber());
        sweep(&env).await
    };
    assert_eq!(report.actions.get("history_deleted"), None, "{report:?}");
    assert_eq!(report.actions.get("events_deleted"), None, "{report:?}");
    assert_eq!(totals(&env).await, before, "nothing deleted");
    assert!(!gone(&env, run).await && event_exists(&env, event).await);
    assert_eq!(
        report
            .rule_errors
            .iter()
            .filter(|(rule, e)| *rule == "history_retention" && e.starts_with("archive: "))
            .count(),
        1,
        "the pass stops at the first archive failure: {report:?}"
    );
    let text = log.text();
    assert!(
        text.contains("history_archive_error") && text.contains("ERROR"),
        "{text}"
    );
    // With no run due, the run-less events meet the same directory: kept too.
    env.exec(
        "UPDATE nifi_ops.load_run SET cleaned_at = NULL WHERE run_id = $1",
        run,
    )
    .await;
    let report = sweep(&env).await;
    assert_eq!(report.actions.get("events_deleted"), None, "{report:?}");
    assert_eq!(report.rule_errors.len(), 1, "{report:?}");
    assert!(event_exists(&env, event).await);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The §1.9 grants of the migration, for a `load_control_api` role that exists only inside this
/// test's transaction (roles are cluster-wide; the rollback leaves none behind).
#[tokio::test]
async fn the_migration_grants_deletes_to_the_api_role() {
    let env = Env::start(|_| {}).await;
    let mut conn = env.conn().await;
    sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
    sqlx::query("CREATE ROLE load_control_api")
        .execute(&mut conn)
        .await
        .unwrap();
    let can_delete = "SELECT bool_and(has_table_privilege('load_control_api', 'nifi_ops.' || t, 'DELETE')) \
        FROM unnest(ARRAY['load_run','load_partition','load_file','load_validation','load_dispatch','load_event']) t";
    let (before,): (bool,) = sqlx::query_as(can_delete)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(!before);
    let sql = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../migrations/20261203000002_history_retention.sql"),
    )
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await
        .unwrap();
    let (after,): (bool,) = sqlx::query_as(can_delete)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(after);
    sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
}

#[tokio::test]
async fn due_runs_are_found_through_the_index() {
    let env = Env::start(|_| {}).await;
    let mut conn = env.conn().await;
    // Many runs not cleaned, so a scan of load_run is not the cheaper plan, and cleaned ones
    // within the retention, so reading every cleaned run (e.g. through ix_load_run_events_due,
    // the other partial index on cleaned runs) is not either.
    sqlx::raw_sql(
        "INSERT INTO nifi_ops.load_run (run_id, job_key, business_key, status, completed_at) \
         SELECT gen_random_uuid(), 'J', 'B' || g, 'SUCCESS', now() - interval '300 days' FROM generate_series(1, 20000) g; \
         INSERT INTO nifi_ops.load_run (run_id, job_key, business_key, status, completed_at, cleaned_at) \
         SELECT gen_random_uuid(), 'J', 'C' || g, 'SUCCESS', now() - interval '10 days', now() FROM generate_series(1, 2000) g; \
         ANALYZE nifi_ops.load_run;",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let (plan,): (serde_json::Value,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (FORMAT JSON) {}",
        ledger::ops::history::DUE_RUNS
            .replace("$1", "15552000")
            .replace("$2", "100")
    )))
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(
        plan.to_string().contains("ix_load_run_cleaned_end"),
        "{plan:#}"
    );
}

/// Captures the log lines written while its subscriber is the default.
#[derive(Clone, Default)]
struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogCapture {
    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let sink = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .finish()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).to_string()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

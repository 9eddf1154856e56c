//! The invariant checker finds each kind of broken ledger (and nothing in a sound one): a
//! consistent SUCCESS run is written, then damaged one way per case.
use e2e::check::{Scope, check};
use sqlx::{Connection, PgConnection};
use testkit::TestDb;
use uuid::Uuid;

/// A consistent SUCCESS run with two partitions, one claim each, one validation, one publish.
async fn sound_run(conn: &mut PgConnection, job: &str) -> Uuid {
    let run = Uuid::new_v4();
    let stmts = [
        format!(
            "INSERT INTO nifi_ops.load_run (run_id, job_key, business_key, status, source_count, expected_partition_count, \
                 success_partition_count, extracted_count, target_count, extract_completed_at, completed_at) \
                 VALUES ('{run}', '{job}', 'bk-{run}', 'SUCCESS', 30, 2, 2, 30, 30, clock_timestamp(), clock_timestamp())"
        ),
        format!(
            "INSERT INTO nifi_ops.load_partition (run_id, partition_id, lower_bound, upper_bound, status, expected_row_count, actual_row_count, attempt_count) \
                 VALUES ('{run}', '0000', 0, 10, 'SUCCESS', 10, 10, 1), ('{run}', '0001', 10, 20, 'SUCCESS', 20, 20, 1)"
        ),
        format!(
            "INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type, status) VALUES ('{}', '{run}', 'VALIDATE_RUN', 'ACKED')",
            Uuid::new_v4()
        ),
    ];
    for s in stmts {
        sqlx::query(sqlx::AssertSqlSafe(s))
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    for (name, pid, attempt) in [
        ("PARTITION_STARTED", Some("0000"), Some(1)),
        ("PARTITION_STARTED", Some("0001"), Some(1)),
        ("STAGE_VALIDATION_STARTED", None, None),
        ("PUBLISH_STARTED", None, None),
        ("RUN_SUCCESS", None, None),
    ] {
        event(
            conn,
            run,
            name,
            pid,
            attempt,
            "clock_timestamp() - interval '1 second'",
        )
        .await;
    }
    run
}

async fn event(
    conn: &mut PgConnection,
    run: Uuid,
    name: &str,
    pid: Option<&str>,
    attempt: Option<i32>,
    at: &str,
) {
    let details = attempt
        .map(|a| format!("{{\"attempt\": {a}}}"))
        .unwrap_or_else(|| "{}".into());
    let pid = pid
        .map(|p| format!("'{p}'"))
        .unwrap_or_else(|| "NULL".into());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO nifi_ops.load_event (event_id, event_time, event_level, event_name, run_id, partition_id, details) \
         VALUES ('{}', {at}, 'INFO', '{name}', '{run}', {pid}, '{details}'::jsonb)",
        Uuid::new_v4()
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
}

async fn exec(conn: &mut PgConnection, sql: String) {
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .unwrap();
}

async fn rules(conn: &mut PgConnection, job: &str) -> Vec<&'static str> {
    let scope = Scope {
        job_keys: vec![job.into()],
        stale_after_seconds: 0.0,
    };
    let mut r: Vec<_> = check(conn, &scope)
        .await
        .unwrap()
        .violations
        .into_iter()
        .map(|v| v.rule)
        .collect();
    r.sort();
    r.dedup();
    r
}

#[tokio::test]
async fn each_broken_invariant_is_found_and_a_sound_ledger_passes() {
    let db = TestDb::fresh().await;
    let mut c = PgConnection::connect(&db.url).await.unwrap();

    sound_run(&mut c, "SOUND").await;
    assert_eq!(
        rules(&mut c, "SOUND").await,
        Vec::<&str>::new(),
        "a sound run is clean"
    );

    let r = sound_run(&mut c, "INCOMPLETE").await;
    exec(&mut c, format!("UPDATE nifi_ops.load_partition SET status = 'RUNNING' WHERE run_id = '{r}' AND partition_id = '0001'")).await;
    assert!(
        rules(&mut c, "INCOMPLETE")
            .await
            .contains(&"success_is_complete")
    );

    let r = sound_run(&mut c, "TWO_VALIDATIONS").await;
    event(
        &mut c,
        r,
        "STAGE_VALIDATION_STARTED",
        None,
        None,
        "clock_timestamp() - interval '1 second'",
    )
    .await;
    assert_eq!(
        rules(&mut c, "TWO_VALIDATIONS").await,
        vec!["success_is_complete"]
    );

    let r = sound_run(&mut c, "TWO_OWNERS").await;
    event(
        &mut c,
        r,
        "PARTITION_STARTED",
        Some("0000"),
        Some(1),
        "clock_timestamp() - interval '1 second'",
    )
    .await;
    assert_eq!(
        rules(&mut c, "TWO_OWNERS").await,
        vec!["one_owner_per_claim"]
    );

    let r = sound_run(&mut c, "TWO_PUBLISHES").await;
    event(
        &mut c,
        r,
        "PUBLISH_STARTED",
        None,
        None,
        "clock_timestamp() - interval '1 second'",
    )
    .await;
    assert_eq!(
        rules(&mut c, "TWO_PUBLISHES").await,
        vec!["one_publish_claim"]
    );

    let r = sound_run(&mut c, "REVIVED").await;
    event(
        &mut c,
        r,
        "PARTITION_SUCCESS",
        Some("0000"),
        None,
        "clock_timestamp() + interval '1 minute'",
    )
    .await;
    event(
        &mut c,
        r,
        "PUBLISH_STARTED",
        None,
        None,
        "clock_timestamp() + interval '1 minute'",
    )
    .await;
    assert!(
        rules(&mut c, "REVIVED")
            .await
            .contains(&"terminal_is_final")
    );

    let r = sound_run(&mut c, "COUNTS").await;
    exec(
        &mut c,
        format!("UPDATE nifi_ops.load_run SET success_partition_count = 1 WHERE run_id = '{r}'"),
    )
    .await;
    assert_eq!(
        rules(&mut c, "COUNTS").await,
        vec!["counts_match_partitions"]
    );

    // From here on, runs are moved where no transition leads (an ended run active again): the
    // state machine's trigger refuses that to any writer but one that turns triggers off.
    exec(&mut c, "SET session_replication_role = replica".into()).await;
    let r = sound_run(&mut c, "STUCK").await;
    exec(&mut c, format!("UPDATE nifi_ops.load_run SET status = 'STAGE_VALIDATING', completed_at = NULL, heartbeat_at = clock_timestamp() - interval '1 hour' WHERE run_id = '{r}'")).await;
    assert_eq!(rules(&mut c, "STUCK").await, vec!["explained_state"]);
    // A DEAD dispatch explains it (it raises an alert a person acts on).
    exec(
        &mut c,
        format!("UPDATE nifi_ops.load_dispatch SET status = 'DEAD' WHERE run_id = '{r}'"),
    )
    .await;
    assert_eq!(rules(&mut c, "STUCK").await, Vec::<&str>::new());

    // Two active runs of one key: only possible without the unique index that forbids it.
    exec(&mut c, "DROP INDEX nifi_ops.uq_load_run_active".into()).await;
    for _ in 0..2 {
        let r = sound_run(&mut c, "DOUBLE").await;
        exec(&mut c, format!("UPDATE nifi_ops.load_run SET business_key = 'same', status = 'PUBLISH_UNKNOWN', completed_at = NULL WHERE run_id = '{r}'")).await;
    }
    assert_eq!(
        rules(&mut c, "DOUBLE").await,
        vec!["one_active_run_per_key"]
    );
}

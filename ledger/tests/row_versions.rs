//! Issue 30 item 2, no needless row versions: a chunk report writes the partition's heartbeat as a
//! HOT update (no index holds `heartbeat_at`), every accepted report as §4.7 step 7 says (issue
//! 38: it was skipped within a second and on an identical replay); the chunk that completes
//! the partition writes no heartbeat version that its SUCCESS update replaces at once; and the
//! success update of the run changes no indexed column when the run's heartbeat is fresh (HOT).
//! Counted from PostgreSQL's own statistics (`n_tup_upd`, `n_tup_hot_upd`).
use ledger::{Decimal38, Ledger, LedgerConfig, Manifest, ManifestPartition};
use sqlx::PgConnection;
use testkit::{TestDb, claim_all, new_run};
use uuid::Uuid;

/// (updates, HOT updates) of a table so far, after the ledger's backend flushed its statistics.
async fn updates(ledger: &Ledger, admin: &mut PgConnection, table: &str) -> (i64, i64) {
    // The pool's only connection did every write: make it flush its pending statistics now
    // (a backend otherwise flushes at most once a second, up to 10 s later when idle).
    {
        let mut c = ledger.pool().acquire().await.unwrap();
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&mut *c)
            .await
            .unwrap();
        sqlx::query("SELECT 1").execute(&mut *c).await.unwrap();
    }
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *admin)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = 'nifi_ops' AND relname = $1",
    )
    .bind(table)
    .fetch_one(&mut *admin)
    .await
    .unwrap()
}

async fn heartbeat(admin: &mut PgConnection, run: Uuid) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_as::<_, (chrono::DateTime<chrono::Utc>,)>(
        "SELECT heartbeat_at FROM nifi_ops.load_partition WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(admin)
    .await
    .unwrap()
    .0
}

#[tokio::test]
async fn chunk_reports_write_no_needless_row_versions() {
    let db = TestDb::fresh().await;
    // One connection: every write of the ledger is on the backend that `updates` flushes.
    let ledger = db.ledger(1, LedgerConfig::default()).await;
    let mut admin = db.conn().await;
    let created = ledger.create_run(&new_run("versions")).await.unwrap();
    let run = created.run_id;
    let pid = "0000";
    let m = Manifest {
        snapshot_scn: Decimal38::parse("777"),
        source_count: 30,
        source_null_split_count: 0,
        source_min_split: None,
        source_max_split: None,
        planned_partition_count: 1,
        source_metrics: vec![],
        source_metrics_version: "v1".into(),
        partitions: vec![ManifestPartition {
            partition_id: pid.into(),
            lower_bound: Decimal38::parse("0"),
            upper_bound: Decimal38::parse("10"),
            lower_text: None,
            upper_text: None,
            upper_inclusive: true,
            is_null_partition: false,
            expected_row_count: 30,
        }],
    };
    ledger.register_manifest(run, &m).await.unwrap();
    let token = Uuid::new_v4();
    claim_all(&ledger, run, &[pid], token).await;
    // Both heartbeats as a report finds them after a while without one.
    sqlx::query("UPDATE nifi_ops.load_partition SET heartbeat_at = heartbeat_at - interval '10 seconds' WHERE run_id = $1")
        .bind(run)
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query("UPDATE nifi_ops.load_run SET heartbeat_at = heartbeat_at - interval '10 seconds' WHERE run_id = $1")
        .bind(run)
        .execute(&mut admin)
        .await
        .unwrap();
    let aged = heartbeat(&mut admin, run).await;
    let part0 = updates(&ledger, &mut admin, "load_partition").await;
    let run0 = updates(&ledger, &mut admin, "load_run").await;
    let report = |i: i32| testkit::chunk_report(token, &created.hdfs_run_path, pid, i, 3, 10);
    ledger.report_chunk(run, pid, &report(0)).await.unwrap();
    let beat = heartbeat(&mut admin, run).await;
    assert!(beat > aged, "a stale heartbeat is refreshed");
    let part1 = updates(&ledger, &mut admin, "load_partition").await;
    assert_eq!(part1.0 - part0.0, 1, "one heartbeat version");
    assert_eq!(part1.1 - part0.1, 1, "the heartbeat is a HOT update");
    // Within the second, and an identical replay too: refreshed again (§2.7, §4.7 step 7), HOT.
    ledger.report_chunk(run, pid, &report(1)).await.unwrap();
    let beat1 = heartbeat(&mut admin, run).await;
    assert!(
        beat1 > beat,
        "every accepted report refreshes the partition heartbeat"
    );
    ledger.report_chunk(run, pid, &report(1)).await.unwrap();
    assert!(
        heartbeat(&mut admin, run).await > beat1,
        "an identical replay refreshes it too"
    );
    let part2 = updates(&ledger, &mut admin, "load_partition").await;
    assert_eq!(part2.0 - part1.0, 2, "one heartbeat version per report");
    assert_eq!(part2.1 - part1.1, 2, "both HOT");
    // The last chunk, the heartbeat stale again: the SUCCESS update only (it writes the
    // heartbeat itself, no version of the report's refresh before it).
    sqlx::query("UPDATE nifi_ops.load_partition SET heartbeat_at = heartbeat_at - interval '10 seconds' WHERE run_id = $1")
        .bind(run)
        .execute(&mut admin)
        .await
        .unwrap();
    let beat = heartbeat(&mut admin, run).await;
    let part2 = updates(&ledger, &mut admin, "load_partition").await;
    let done = ledger.report_chunk(run, pid, &report(2)).await.unwrap();
    assert!(done.validation_scheduled, "{done:?}");
    let part3 = updates(&ledger, &mut admin, "load_partition").await;
    assert_eq!(
        part3.0 - part2.0,
        1,
        "the completing chunk writes the SUCCESS version only"
    );
    assert!(heartbeat(&mut admin, run).await > beat);
    // The run: its heartbeat refreshed once (chunk 0), then the completion. A partition success
    // writes no version of the run row (issue 30 item 3: no success counter; the last success
    // only locks the row before its recount and the completion CAS).
    let run1 = updates(&ledger, &mut admin, "load_run").await;
    assert_eq!(
        run1.0 - run0.0,
        2,
        "the heartbeat and the completion, no success-counter version: {run0:?} -> {run1:?}"
    );
}

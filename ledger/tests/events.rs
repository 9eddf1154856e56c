//! Event ids (CONTRACT §1.6, §4.22): the ledger writes time-ordered ids (UUID v7), so that its
//! inserts append to the right edge of the primary key instead of landing on random leaves, and
//! events that tie on `event_time` come out of the timeline in the order they were written.
use ledger::LedgerConfig;
use testkit::{TestDb, manifest, new_run};
use uuid::Uuid;

/// Creates a run of `n` one-chunk partitions and reports every chunk: the run completes (its
/// VALIDATE_RUN outbox row is written by the last report).
async fn complete_run(ledger: &ledger::Ledger, name: &str, n: usize) -> Uuid {
    let created = ledger.create_run(&new_run(name)).await.unwrap();
    let run = created.run_id;
    let m = manifest(&vec![5; n]);
    ledger.register_manifest(run, &m).await.unwrap();
    for i in 0..n {
        let pid = format!("{i:04}");
        let token = Uuid::new_v4();
        assert!(
            ledger
                .claim_partition(run, &pid, token, "nifi-01")
                .await
                .unwrap()
                .claimed
        );
        let r = testkit::chunk_report(token, &created.hdfs_run_path, &pid, 0, 1, 5);
        ledger.report_chunk(run, &pid, &r).await.unwrap();
    }

    run
}

#[tokio::test]
async fn event_ids_follow_the_order_the_events_were_written_and_break_timeline_ties() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let n = 4;
    let run = complete_run(&ledger, "events", n).await;
    let mut conn = db.conn().await;
    // The order of writing: event_time is clock_timestamp(), distinct for every event here.
    let written: Vec<(Uuid, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT event_id, event_name, event_time FROM nifi_ops.load_event WHERE run_id = $1 ORDER BY event_time",
    )
    .bind(run)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(written.len() > 2 * n, "{written:?}");
    assert!(written.windows(2).all(|w| w[0].2 < w[1].2), "{written:?}");
    assert!(
        written.iter().all(|(id, ..)| id.get_version_num() == 7),
        "event ids are UUID v7: {written:?}"
    );
    let ids: Vec<Uuid> = written.iter().map(|(id, ..)| *id).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(
        ids, sorted,
        "ids ascend in the order the events were written"
    );

    // §4.22: ties on event_time are ordered by event_id, i.e. by the order of writing.
    sqlx::query(
        "UPDATE nifi_ops.load_event SET event_time = '2026-01-01T00:00:00Z' WHERE run_id = $1",
    )
    .bind(run)
    .execute(&mut conn)
    .await
    .unwrap();
    let timeline: Vec<String> = ledger
        .run_events(run, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    let names: Vec<String> = written.into_iter().map(|(_, name, _)| name).collect();
    assert_eq!(timeline, names);
    // The most recent `limit` of them (the last ones written), still oldest first.
    let last: Vec<String> = ledger
        .run_events(run, 3)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(last, names[names.len() - 3..]);
}

/// §2: a dispatch id is a random UUID v4 (issue 38, found by the contract oracle: issue 30 had made
/// them v7). It travels to NiFi as `X-Dispatch-Id` and keys the validation result reports, so it
/// must not be guessable from the time it was written; nothing orders by it (the dispatcher by
/// `next_attempt_at`, reads by `created_at` first).
#[tokio::test]
async fn dispatch_ids_are_random_v4() {
    let db = TestDb::fresh().await;
    let ledger = db.ledger(2, LedgerConfig::default()).await;
    let mut runs = vec![];
    for i in 0..4 {
        runs.push(complete_run(&ledger, &format!("outbox-{i}"), 1).await);
    }
    let mut conn = db.conn().await;
    let written: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT dispatch_id, run_id FROM nifi_ops.load_dispatch WHERE run_id = ANY($1) ORDER BY created_at",
    )
    .bind(&runs)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        written.iter().map(|(_, r)| *r).collect::<Vec<_>>(),
        runs,
        "one VALIDATE_RUN per run, in the order the runs completed"
    );
    assert!(
        written
            .iter()
            .all(|(id, _)| id.get_version_num() == 4 && id.get_variant() == uuid::Variant::RFC4122),
        "dispatch ids are random UUID v4: {written:?}"
    );
}

//! The fault-injection suite (issue 10), standalone: M runs go through the NiFi simulator with
//! duplicates, lost responses, node crashes with reissue and late reports, while the api-server is
//! SIGKILLed and restarted every few seconds, the leading operator is killed (the standby takes
//! over), and PostgreSQL restarts once. Afterwards every run must have ended SUCCESS, in an
//! explained terminal state, or in PUBLISH_UNKNOWN, and the invariant checker must find nothing.
//! `LC_CHAOS_RUNS` sets M (default 20, what CI runs).
use e2e::check::{Scope, check};
use e2e::standalone::{System, sim_summary};
use serde_json::json;
use sqlx::Connection;
use std::time::{Duration, Instant};

const SIM: &str = env!("CARGO_BIN_EXE_nifi-sim");

async fn checked(db_url: &str, job: &str) -> e2e::check::Report {
    let mut conn = sqlx::PgConnection::connect(db_url).await.unwrap();
    check(
        &mut conn,
        &Scope {
            job_keys: vec![job.into()],
            stale_after_seconds: 0.0,
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_survive_kills_restarts_and_injected_faults() {
    let runs: usize = std::env::var("LC_CHAOS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let t0 = Instant::now();
    let mut sys = System::start("chaos").await.expect("standalone system");
    let runs_arg = runs.to_string();
    let mut args = vec![
        "--runs",
        &runs_arg,
        "--concurrent-runs",
        "6",
        "--partitions",
        "3",
        "--chunks",
        "3",
        "--nodes",
        "3",
        "--publish-unknown",
        "0.02",
        "--run-timeout",
        "240",
    ];
    args.extend_from_slice(e2e::nifi::CHAOS_FAULTS);
    let mut sim = sys.simulate(SIM, "CHAOS_JOB", &args);

    // The chaos: the api-server killed every 3 s, the leading operator killed once, PostgreSQL
    // restarted once, for as long as the load runs (at most 10 minutes).
    let (mut api_kills, mut leader_kills, mut pg_restarts) = (0, 0, 0);
    // The epoch of the first leader seen: leadership changes hands only when a fault takes it
    // (the leader killed, its lock's session cut by the restart), never between two live
    // operators (a session lock taken through a transaction pooler would let both hold it).
    let mut first_epoch = None;
    let chaos_start = Instant::now();
    let mut next_api_kill = Duration::from_secs(2);
    while sim.try_wait().unwrap().is_none() {
        let t = chaos_start.elapsed();
        assert!(
            t < Duration::from_secs(600),
            "the load did not finish in 10 minutes"
        );
        if t >= next_api_kill {
            sys.api.kill();
            sys.api.start().unwrap();
            api_kills += 1;
            next_api_kill += Duration::from_secs(3);
        }
        if first_epoch.is_none() && pg_restarts == 0 {
            first_epoch = sys.leader_epoch().await;
        }
        if leader_kills == 0
            && first_epoch.is_some()
            && t >= Duration::from_secs(3)
            && let Some(pid) = sys.leader_pid().await
            && let Some(o) = sys.ops.iter_mut().find(|o| o.pid() == Some(pid))
        {
            o.kill();
            leader_kills += 1;
            o.start().unwrap(); // back as the standby
        }
        if pg_restarts == 0 && t >= Duration::from_secs(5) {
            let away = sys.pg.as_ref().expect("own PostgreSQL").restart().unwrap();
            eprintln!(
                "chaos: PostgreSQL restarted ({:.1}s away)",
                away.as_secs_f64()
            );
            pg_restarts += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let summary = sim_summary(sim).await;
    let why = e2e::nifi::what_went_wrong(&summary);

    let report = checked(&sys.db_url, "CHAOS_JOB").await;
    let first_epoch = first_epoch.expect("a leader before the faults");
    let last_epoch = sys.leader_epoch().await.expect("a leader at the end");
    let line = json!({
        "bench": "chaos", "runs": runs, "final_status": summary["final_status"], "ledger": report.by_status,
        "faults_injected": summary["faults_injected"], "api_kills": api_kills, "leader_kills": leader_kills,
        "pg_restarts": pg_restarts, "violations": report.violations.len(),
        "leader_epochs": last_epoch - first_epoch + 1, "through_pgbouncer": testkit::pooler_url().is_some(),
        "gave_up": summary["gave_up"].as_array().map_or(0, Vec::len),
        "requests": summary["requests"], "wall_seconds": t0.elapsed().as_secs_f64(),
    });
    println!("{line}");
    eprintln!("chaos: {line}");
    assert!(
        report.violations.is_empty(),
        "invariants broken: {:#?}\n{}",
        report.violations,
        sys.ops[0].log_tail(30)
    );
    assert_eq!(
        summary["anomalies"],
        json!([]),
        "contract broken under faults: {why}"
    );
    assert_eq!(
        summary["receiver"]["rejected"],
        json!([]),
        "PG-05 refused a dispatch: {why}"
    );
    assert_eq!(
        summary["unfinished"],
        json!([]),
        "runs that never ended: {why}"
    );
    assert_eq!(
        report.runs as usize, runs,
        "every run was created once: {:?}",
        report.by_status
    );
    assert!(
        api_kills >= 1 && leader_kills == 1 && pg_restarts == 1,
        "the faults happened while the load ran"
    );
    assert!(
        last_epoch - first_epoch <= leader_kills + pg_restarts,
        "leadership changed hands {} times for {leader_kills} leader kill and {pg_restarts} restart: two operators held the leader lock?\n{}\n{}",
        last_epoch - first_epoch,
        sys.ops[0].log_tail(20),
        sys.ops[1].log_tail(20)
    );
    sys.stop();
}

/// A slow PG-05 (each answer after 300 ms) that refuses its first three dispatches with 503: the
/// dispatcher retries with backoff, every run still completes, and nothing is sent that PG-05 would
/// reject.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_and_refusing_pg05_still_gets_every_dispatch() {
    let sys = System::start("pg05").await.expect("standalone system");
    let sim = sys.simulate(
        SIM,
        "PG05_JOB",
        &[
            "--runs",
            "4",
            "--partitions",
            "2",
            "--chunks",
            "2",
            "--pg05-delay-ms",
            "300",
            "--pg05-refuse-first",
            "3",
            "--pg05-refuse-status",
            "503",
        ],
    );
    let summary = sim_summary(sim).await;
    let why = e2e::nifi::what_went_wrong(&summary);
    assert_eq!(summary["final_status"]["SUCCESS"], 4, "{why}");
    assert_eq!(summary["receiver"]["refused_on_purpose"], 3, "{why}");
    assert_eq!(summary["receiver"]["rejected"], json!([]), "{why}");
    let report = checked(&sys.db_url, "PG05_JOB").await;
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    // The refusals were retried, not dropped: each VALIDATE_RUN was sent more than once in total.
    let mut conn = sqlx::PgConnection::connect(&sys.db_url).await.unwrap();
    let (attempts,): (i64,) =
        sqlx::query_as("SELECT sum(attempt_count)::bigint FROM nifi_ops.load_dispatch")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        4 + 3,
        "4 dispatches delivered, after 3 refused attempts in all"
    );
    sys.stop();
}

/// PG-90 for a publish claim that never got an answer (docs/nifi.md): one claim landed and its
/// answer was lost, one never reached the api-server. Nothing was published, so the flow says so:
/// the landed one by its own token's FAILED_PUBLISH result, the other (409
/// `PUBLISH_TOKEN_MISMATCH`) by failing the run STAGING_VALIDATED → FAILED_PUBLISH. Neither run
/// is left in STAGING_VALIDATED for a person.
#[tokio::test(flavor = "multi_thread")]
async fn an_unanswered_publish_claim_ends_the_run_as_failed_publish() {
    let sys = System::start("claimlost").await.expect("standalone system");
    let sim = sys.simulate(
        SIM,
        "CLAIM_LOST_JOB",
        &[
            "--runs",
            "3",
            "--concurrent-runs",
            "1",
            "--partitions",
            "2",
            "--chunks",
            "2",
            "--unanswered-publish-claims",
            "2",
            "--run-timeout",
            "30",
        ],
    );
    let summary = sim_summary(sim).await;
    let why = e2e::nifi::what_went_wrong(&summary);
    assert_eq!(summary["final_status"]["FAILED_PUBLISH"], 2, "{why}");
    assert_eq!(summary["final_status"]["SUCCESS"], 1, "{why}");
    assert_eq!(summary["anomalies"], json!([]), "{why}");
    let report = checked(&sys.db_url, "CLAIM_LOST_JOB").await;
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    let mut conn = sqlx::PgConnection::connect(&sys.db_url).await.unwrap();
    let failed: Vec<(bool, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT publish_token IS NOT NULL, error_stage, error_code FROM nifi_ops.load_run
          WHERE job_key = 'CLAIM_LOST_JOB' AND status = 'FAILED_PUBLISH' ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let stage = Some("PUBLISH".to_string());
    let code = Some("NIFI_RETRIES_EXHAUSTED".to_string());
    assert_eq!(
        failed,
        vec![(false, stage.clone(), code.clone()), (true, stage, code)],
        "one failed by /fail (never claimed), one by its claim's token"
    );
    sys.stop();
}

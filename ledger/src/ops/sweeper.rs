//! The sweeper (CONTRACT §7.2): periodic recovery for what no request will ever report — stale
//! partitions, run deadlines, unacknowledged dispatches, stale validations and publishes, event
//! retention. One fenced transaction per tick; each rule in its own savepoint so one failing rule
//! does not stop the others.
use super::dispatch::dead_event;
use super::leader::{Fence, check_fence};
use super::transition::{ErrorFields, transition_locked};
use crate::error::{LedgerError, Result};
use crate::event::{Event, Level};
use crate::json::format_ts;
use crate::settings::{RecoveryMode, iso_duration};
use crate::status::RunStatus;
use crate::store::{JobThresholds, Ledger, notify_dispatch, transaction};
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgConnection;
use std::collections::BTreeMap;
use uuid::Uuid;

/// What one tick did: non-zero action counters by rule name (`lca_sweeper_actions_total{rule}`),
/// DEAD dispatches by type (`lca_dispatch_total{result="dead"}`), and rules that failed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SweepReport {
    pub actions: BTreeMap<&'static str, u64>,
    pub dead_by_type: BTreeMap<String, u64>,
    pub rule_errors: Vec<(&'static str, String)>,
    /// The tick's transactions: more than one when it held [`RUNS_HELD_PER_TRANSACTION`] runs
    /// and went on in another.
    pub transactions: u32,
    /// The most runs one of them held to its commit (each a subtransaction with an xid).
    pub most_held: usize,
}

/// Runs one tick transaction holds at most (each under a savepoint that took its locks and wrote,
/// hence a subtransaction with an xid of its own). PostgreSQL caches 64 subtransaction ids per
/// backend (`PGPROC_MAX_CACHED_SUBXIDS`); past that every snapshot taken anywhere in the database
/// while the tick runs must look transactions up in `pg_subtrans`. With the rules' own savepoints
/// (6) the tick stays below the cache; what is left goes on in the next transaction of the tick.
pub const RUNS_HELD_PER_TRANSACTION: usize = 48;

/// How many transactions one tick may take (a bound on a loop, not a limit anyone should meet:
/// 48 × 100 runs acted on in one tick).
const TRANSACTIONS_PER_TICK: u32 = 100;

#[derive(Default)]
struct Counts {
    actions: BTreeMap<&'static str, u64>,
    dead_by_type: BTreeMap<String, u64>,
    /// Runs this rule holds to the end of the transaction (kept savepoints).
    held: usize,
    /// How many more it may hold in this transaction.
    room: usize,
    /// A candidate was left because the transaction was full.
    deferred: bool,
}

impl Counts {
    fn with_room(room: usize) -> Counts {
        Counts {
            room,
            ..Counts::default()
        }
    }

    fn add(&mut self, rule: &'static str, n: u64) {
        if n > 0 {
            *self.actions.entry(rule).or_default() += n;
        }
    }

    /// False (and the rest deferred to the tick's next transaction) when this transaction holds
    /// as many runs as it may.
    fn may_hold_another(&mut self) -> bool {
        if self.held >= self.room {
            self.deferred = true;
            return false;
        }
        true
    }
}

const RULES: [&str; 6] = [
    "stale_partitions",
    "run_deadline",
    "unacked_dispatches",
    "stale_alert",
    "publish_stale",
    "event_retention",
];

/// Rule 1's candidates, `$1` the shortest `recovery.stale` of any job: EXTRACTING runs with a
/// stale RUNNING partition. The stale partitions come from `ix_load_partition_live` (the RUNNING
/// and RETRY partitions only; the heartbeat bound is checked on the row, since an index on
/// `heartbeat_at` would make every heartbeat a non-HOT update), or, per EXTRACTING run, from the
/// run's key: either way only live partitions are read.
pub const STALE_PARTITION_RUNS: &str = "SELECT r.run_id, r.job_key FROM nifi_ops.load_run r \
              WHERE r.status = 'EXTRACTING' AND r.run_id IN (SELECT p.run_id FROM nifi_ops.load_partition p \
                WHERE p.status = 'RUNNING' AND p.heartbeat_at < statement_timestamp() - make_interval(secs => $1)) \
              ORDER BY r.started_at, r.run_id";

/// Rule 1, one run (`$1`) with its job's threshold (`$2`). `(status || '')` is no index column on
/// purpose: with statistics from a quiet hour (few RUNNING partitions) the planner would otherwise
/// take `ix_load_partition_live` and filter every RUNNING partition of every run by `run_id`;
/// this way the run's key bounds the scan.
pub const STALE_PARTITION_DUE: &str = "SELECT EXISTS (SELECT 1 FROM nifi_ops.load_partition WHERE run_id = $1 \
                   AND (status || '') = 'RUNNING' AND heartbeat_at < clock_timestamp() - make_interval(secs => $2))";

/// Rule 1, the stale partitions of one locked run (`$1`, threshold `$2`), by the primary key in
/// partition order (see [`STALE_PARTITION_DUE`] for `(status || '')`).
pub const STALE_PARTITIONS_LOCK: &str = "SELECT partition_id, attempt_count FROM nifi_ops.load_partition WHERE run_id = $1 \
                   AND (status || '') = 'RUNNING' AND heartbeat_at < clock_timestamp() - make_interval(secs => $2) \
                   ORDER BY partition_id FOR UPDATE";

/// Rule 2's candidates, `$1` the shortest `recovery.run_timeout`: CREATED/EXTRACTING runs, each
/// with its age in seconds, judged against its own job's limit before anything is locked.
pub const DEADLINE_RUNS: &str = "SELECT run_id, job_key, extract(epoch FROM clock_timestamp() - started_at)::float8 \
               FROM nifi_ops.load_run WHERE status IN ('CREATED', 'EXTRACTING') \
               AND started_at < clock_timestamp() - make_interval(secs => $1) ORDER BY started_at, run_id";

/// Rule 3's rows, `$1` the shortest `dispatch.ack_timeout`: SENT rows (from `ix_load_dispatch_due`).
pub const UNACKED_DISPATCHES: &str = "SELECT d.dispatch_id, d.run_id, d.dispatch_type, d.partition_id, d.attempt_count, r.job_key, \
                    extract(epoch FROM clock_timestamp() - d.sent_at)::float8 AS age_s \
               FROM nifi_ops.load_dispatch d JOIN nifi_ops.load_run r ON r.run_id = d.run_id \
               LEFT JOIN nifi_ops.load_partition p ON p.run_id = d.run_id AND p.partition_id = d.partition_id \
              WHERE d.status = 'SENT' AND d.sent_at < clock_timestamp() - make_interval(secs => $1) \
                AND ((d.dispatch_type = 'VALIDATE_RUN' AND r.status = 'EXTRACTED_VALIDATED') \
                  OR (d.dispatch_type = 'REISSUE_PARTITION' AND r.status = 'EXTRACTING' AND p.status = 'RETRY')) \
              ORDER BY d.sent_at, d.dispatch_id FOR UPDATE OF d SKIP LOCKED";

/// Rule 4's candidates, `$1` the shortest `recovery.validation_stale`.
pub const STALE_ALERT_RUNS: &str = "SELECT run_id, job_key, business_key, status, heartbeat_at, extract(epoch FROM clock_timestamp() - heartbeat_at)::float8 \
               FROM nifi_ops.load_run WHERE status IN ('STAGE_VALIDATING', 'PUBLISHED') \
                AND heartbeat_at < clock_timestamp() - make_interval(secs => $1) ORDER BY heartbeat_at, run_id";

/// Rule 4, the stuck runs (`$1`) that had an alert within their window (`$2`, seconds), all in
/// one statement (a probe per run was a round trip per stuck run on every tick): each probe from
/// `ix_load_event_run_time`.
pub const RECENT_STALE_ALERTS: &str = "SELECT d.run_id FROM unnest($1::uuid[], $2::float8[]) AS d(run_id, window_s) \
         WHERE EXISTS (SELECT 1 FROM nifi_ops.load_event e WHERE e.run_id = d.run_id AND e.event_name = 'RUN_STALE_ALERT' \
                          AND e.event_time > clock_timestamp() - make_interval(secs => d.window_s))";

/// Rule 5's candidates, `$1` the shortest `recovery.publish_stale`.
pub const PUBLISH_STALE_RUNS: &str = "SELECT run_id, job_key, extract(epoch FROM clock_timestamp() - publish_started_at)::float8 FROM nifi_ops.load_run \
              WHERE status = 'PUBLISHING' AND publish_started_at < clock_timestamp() - make_interval(secs => $1) \
              ORDER BY publish_started_at, run_id";

/// Rule 6, the due cleaned runs: `$1` jobs with their own settings, `$2` their
/// `event_retention`, `$3` the global one, `$4` the shortest of them all, `$5` how many runs.
/// A run is due when its `events_kept_from` (a lower bound of its events' times, see
/// `migrations/20261203000008_event_retention_watermark.sql`) is older than its retention; the
/// shortest retention bounds the range of `ix_load_run_events_due` (an index condition: the bound
/// is stable), the run's own is checked on the row. A cleaned run with nothing due is not read.
/// Each run with its cutoff, locked without waiting (`FOR NO KEY UPDATE`: event inserts, which
/// take a key-share lock on their run, are not blocked).
pub const EVENT_RETENTION_RUNS: &str = "SELECT r.run_id, statement_timestamp() \
         - make_interval(secs => COALESCE(($2::float8[])[array_position($1::text[], r.job_key::text)], $3)) AS cutoff \
       FROM nifi_ops.load_run r \
      WHERE r.cleaned_at IS NOT NULL \
        AND r.events_kept_from < statement_timestamp() - make_interval(secs => $4) \
        AND r.events_kept_from < statement_timestamp() \
              - make_interval(secs => COALESCE(($2::float8[])[array_position($1::text[], r.job_key::text)], $3)) \
      ORDER BY r.events_kept_from, r.run_id LIMIT $5 FOR NO KEY UPDATE SKIP LOCKED";

/// Rule 6, the events: `$1` the due runs, `$2` their cutoffs; each run's old events from
/// `ix_load_event_run_time` (the inner LIMIT keeps that a parameterized index scan), at most
/// 10,000 in all, to the primary key as one array.
pub const EVENT_RETENTION: &str = "DELETE FROM nifi_ops.load_event WHERE event_id = ANY (ARRAY( \
       SELECT e.event_id FROM unnest($1::uuid[], $2::timestamptz[]) AS d(run_id, cutoff) \
        CROSS JOIN LATERAL (SELECT e.event_id FROM nifi_ops.load_event e \
                             WHERE e.run_id = d.run_id AND e.event_time < d.cutoff LIMIT 10000) e \
        LIMIT 10000))";

/// Rule 6, the runs visited get their bound again: their oldest event left (still due when the
/// 10,000 cap left some), or, with none left, the visit's time less a margin of half the
/// retention, at most a day (an event written meanwhile may carry an event_time a little older
/// than its commit). `$1` the runs, `$2` their cutoffs.
pub const EVENT_RETENTION_MARK: &str = "UPDATE nifi_ops.load_run r SET events_kept_from = LEAST( \
         COALESCE((SELECT min(e.event_time) FROM nifi_ops.load_event e WHERE e.run_id = r.run_id), 'infinity'), \
         statement_timestamp() - LEAST(interval '1 day', \
           (statement_timestamp() - ($2::timestamptz[])[array_position($1::uuid[], r.run_id)]) / 2)) \
       WHERE r.run_id = ANY ($1::uuid[])";

/// Runs rule 6 visits per tick at most (the events deleted are capped at 10,000 as well).
pub const EVENT_RETENTION_RUN_BATCH: i64 = 1000;

/// Seconds, for `make_interval(secs => …)`.
fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

impl Ledger {
    /// One tick. `None` when another sweeper holds the tick lock (nothing done).
    pub async fn sweep(&self, fence: &Fence) -> Result<Option<SweepReport>> {
        let mut report = SweepReport::default();
        loop {
            let Some(round) = self.sweep_transaction(fence).await? else {
                if report.transactions == 0 {
                    return Ok(None);
                }
                // Another sweeper took the tick lock between two of this tick's transactions:
                // what is left is its to do.
                break;
            };
            report.transactions += 1;
            for (k, v) in round.report.actions {
                *report.actions.entry(k).or_default() += v;
            }
            for (k, v) in round.report.dead_by_type {
                *report.dead_by_type.entry(k).or_default() += v;
            }
            report.rule_errors.extend(round.report.rule_errors);
            report.most_held = report.most_held.max(round.report.most_held);
            if !round.deferred || report.transactions >= TRANSACTIONS_PER_TICK {
                break;
            }
        }
        // Rule 7 (history retention) after the tick's transactions, in short ones of its own.
        self.history_into(fence, &mut report).await?;
        Ok(Some(report))
    }

    /// One transaction of a tick: rules 1–6, holding at most [`RUNS_HELD_PER_TRANSACTION`] runs.
    async fn sweep_transaction(&self, fence: &Fence) -> Result<Option<SweepRound>> {
        transaction!(self, |conn| async {
            check_fence(conn, fence).await?;
            let (got,): (bool,) = sqlx::query_as(
                "SELECT pg_try_advisory_xact_lock(hashtext('load_control_sweeper'))",
            )
            .fetch_one(&mut *conn)
            .await?;
            if !got {
                return Ok(None);
            }
            let jobs = self.job_thresholds(conn).await?;
            let mut report = SweepReport::default();
            let (mut held, mut deferred) = (0, false);
            for (i, rule) in RULES.iter().enumerate() {
                sqlx::query(sqlx::AssertSqlSafe(format!("SAVEPOINT sweeper_rule_{i}")))
                    .execute(&mut *conn)
                    .await?;
                let mut counts = Counts::with_room(RUNS_HELD_PER_TRANSACTION - held);
                let result = match i {
                    0 => self.rule_stale_partitions(conn, &jobs, &mut counts).await,
                    1 => self.rule_run_deadline(conn, &jobs, &mut counts).await,
                    2 => self.rule_unacked_dispatches(conn, &jobs, &mut counts).await,
                    3 => self.rule_stale_alert(conn, &jobs, &mut counts).await,
                    4 => self.rule_publish_stale(conn, &jobs, &mut counts).await,
                    _ => self.rule_event_retention(conn, &jobs, &mut counts).await,
                };
                match result {
                    Ok(()) => {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "RELEASE SAVEPOINT sweeper_rule_{i}"
                        )))
                        .execute(&mut *conn)
                        .await?;
                        // A rolled-back rule's subtransactions are gone with it; a kept one's
                        // stay until the commit.
                        held += counts.held;
                        deferred |= counts.deferred;
                        for (k, v) in counts.actions {
                            *report.actions.entry(k).or_default() += v;
                        }
                        for (k, v) in counts.dead_by_type {
                            *report.dead_by_type.entry(k).or_default() += v;
                        }
                    }
                    Err(e) if e.is_retryable() => return Err(e),
                    Err(e) => {
                        sqlx::query(sqlx::AssertSqlSafe(format!(
                            "ROLLBACK TO SAVEPOINT sweeper_rule_{i}"
                        )))
                        .execute(&mut *conn)
                        .await?;
                        tracing::error!(event = "sweeper_rule_error", rule, error = %e, "sweeper rule failed; its changes were rolled back");
                        report.rule_errors.push((rule, e.to_string()));
                    }
                }
            }
            report.most_held = held;
            Ok(Some(SweepRound { report, deferred }))
        })
    }

    /// Rule 1: stale RUNNING partitions of EXTRACTING runs → reissue (REISSUE mode) or time out.
    async fn rule_stale_partitions(
        &self,
        conn: &mut PgConnection,
        jobs: &JobThresholds,
        c: &mut Counts,
    ) -> Result<()> {
        let g = &self.config.thresholds;
        let min_stale = jobs.min_of(g, |t| t.stale);
        let candidates: Vec<(Uuid, String)> = sqlx::query_as(STALE_PARTITION_RUNS)
            .bind(secs(min_stale))
            .fetch_all(&mut *conn)
            .await?;
        for (run_id, job) in candidates {
            let t = jobs.of(&job, g);
            // The candidates were chosen by the smallest threshold of any job; a run is locked
            // (until the tick ends) only when its own job's threshold finds something to do.
            let due: bool = sqlx::query_scalar(STALE_PARTITION_DUE)
                .bind(run_id)
                .bind(secs(t.stale))
                .fetch_one(&mut *conn)
                .await?;
            if !due {
                continue;
            }
            if !c.may_hold_another() {
                break;
            }
            let Some(run) = self.try_lock_run(conn, run_id, "EXTRACTING").await? else {
                continue;
            };
            let stale: Vec<(String, i32)> = sqlx::query_as(STALE_PARTITIONS_LOCK)
                .bind(run_id)
                .bind(secs(t.stale))
                .fetch_all(&mut *conn)
                .await?;
            if stale.is_empty() {
                // Refreshed since the unlocked check: nothing to hold the run for.
                self.let_go_of_run(conn).await?;
                continue;
            }
            let exhausted = stale
                .iter()
                .any(|(_, attempts)| *attempts >= t.recovery_max_attempts);
            if t.recovery_mode == RecoveryMode::Reissue && !exhausted {
                for (pid, attempt) in &stale {
                    sqlx::query(
                        "UPDATE nifi_ops.load_partition SET status = 'RETRY', claim_token = NULL, worker_node = NULL, \
                            heartbeat_at = clock_timestamp(), error_code = 'HEARTBEAT_STALE', error_message = 'reset by sweeper for reissue' \
                          WHERE run_id = $1 AND partition_id = $2",
                    )
                    .bind(run_id)
                    .bind(pid)
                    .execute(&mut *conn)
                    .await?;
                    let invalidated = sqlx::query(
                        "UPDATE nifi_ops.load_file SET status = 'FAILED', updated_at = clock_timestamp() \
                          WHERE run_id = $1 AND partition_id = $2 AND status = 'WRITTEN'",
                    )
                    .bind(run_id)
                    .bind(pid)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                    sqlx::query("INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type, partition_id) VALUES ($1, $2, 'REISSUE_PARTITION', $3)")
                        .bind(super::dispatch::new_dispatch_id())
                        .bind(run_id)
                        .bind(pid)
                        .execute(&mut *conn)
                        .await?;
                    Event::new(Level::Warn, "RECOVERY_REISSUED")
                        .run(&run)
                        .partition(pid)
                        .details(json!({"attempt": attempt, "invalidatedFiles": invalidated}))
                        .insert(conn)
                        .await?;
                    c.add("reissue_partition", 1);
                }
                sqlx::query("UPDATE nifi_ops.load_run SET heartbeat_at = clock_timestamp() WHERE run_id = $1").bind(run_id).execute(&mut *conn).await?;
                notify_dispatch(conn, &run_id.to_string()).await?;
            } else {
                let code = if t.recovery_mode == RecoveryMode::Reissue {
                    "REISSUE_ATTEMPTS_EXHAUSTED"
                } else {
                    "PARTITION_STALE"
                };
                let ids: Vec<&str> = stale.iter().map(|(p, _)| p.as_str()).collect();
                time_out_partitions(conn, run_id, code).await?;
                let message = format!("stale partitions: {}", ids.join(","));
                let error = ErrorFields::Set {
                    stage: "SWEEPER",
                    code,
                    message: &message,
                };
                transition_locked(
                    conn,
                    run_id,
                    RunStatus::Extracting,
                    RunStatus::TimedOut,
                    error,
                )
                .await?;
                Event::new(Level::Error, "RUN_TIMED_OUT")
                    .run(&run)
                    .code(code)
                    .message(&message)
                    .details(json!({"stalePartitions": ids}))
                    .insert(conn)
                    .await?;
                c.add("timeout_stale_partition", 1);
            }
            self.keep_run(conn).await?;
            c.held += 1;
        }
        Ok(())
    }

    /// Rule 2: CREATED/EXTRACTING runs past `run_timeout`, fresh heartbeats or not. Waits at most
    /// 5 s per run so sustained chunk traffic cannot postpone a deadline.
    async fn rule_run_deadline(
        &self,
        conn: &mut PgConnection,
        jobs: &JobThresholds,
        c: &mut Counts,
    ) -> Result<()> {
        let g = &self.config.thresholds;
        let min = jobs.min_of(g, |t| t.run_timeout);
        let candidates: Vec<(Uuid, String, f64)> = sqlx::query_as(DEADLINE_RUNS)
            .bind(secs(min))
            .fetch_all(&mut *conn)
            .await?;
        for (run_id, job, age) in candidates {
            let t = jobs.of(&job, g);
            // The candidates were chosen by the shortest limit of any job: a run within its own
            // job's limit is not touched (its reports and claims never wait for this tick).
            // `started_at` never changes, so a run due now is due under the lock too.
            if age <= secs(t.run_timeout) {
                continue;
            }
            if !c.may_hold_another() {
                break;
            }
            sqlx::query("SAVEPOINT sweeper_deadline_run")
                .execute(&mut *conn)
                .await?;
            sqlx::query("SET LOCAL lock_timeout = '5s'")
                .execute(&mut *conn)
                .await?;
            match self.deadline_one(conn, run_id, t.run_timeout).await {
                Ok(done) => {
                    sqlx::query("SET LOCAL lock_timeout = 0")
                        .execute(&mut *conn)
                        .await?;
                    if !done {
                        // It left CREATED/EXTRACTING meanwhile: let go of its locks now rather
                        // than at the tick's end.
                        sqlx::query("ROLLBACK TO SAVEPOINT sweeper_deadline_run")
                            .execute(&mut *conn)
                            .await?;
                    }
                    sqlx::query("RELEASE SAVEPOINT sweeper_deadline_run")
                        .execute(&mut *conn)
                        .await?;
                    if done {
                        c.held += 1;
                    }
                    c.add("timeout_run_deadline", done as u64);
                }
                Err(LedgerError::Database(sqlx::Error::Database(db)))
                    if db.code().as_deref() == Some("55P03") =>
                {
                    // Still locked after 5 s: left for the next tick.
                    sqlx::query("ROLLBACK TO SAVEPOINT sweeper_deadline_run")
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query("RELEASE SAVEPOINT sweeper_deadline_run")
                        .execute(&mut *conn)
                        .await?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn deadline_one(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        limit: std::time::Duration,
    ) -> Result<bool> {
        let run = self.lock_run(conn, run_id).await?;
        let status = run.status()?;
        let (due,): (bool,) = sqlx::query_as("SELECT started_at < clock_timestamp() - make_interval(secs => $2) FROM nifi_ops.load_run WHERE run_id = $1")
            .bind(run_id)
            .bind(secs(limit))
            .fetch_one(&mut *conn)
            .await?;
        if !due || !matches!(status, RunStatus::Created | RunStatus::Extracting) {
            return Ok(false);
        }
        time_out_partitions(conn, run_id, "RUN_TIMEOUT").await?;
        let message = format!(
            "run exceeded run_timeout {} in {status}",
            iso_duration(limit)
        );
        let error = ErrorFields::Set {
            stage: "SWEEPER",
            code: "RUN_TIMEOUT",
            message: &message,
        };
        transition_locked(conn, run_id, status, RunStatus::TimedOut, error).await?;
        Event::new(Level::Error, "RUN_TIMED_OUT")
            .run(&run)
            .code("RUN_TIMEOUT")
            .message(&message)
            .details(json!({"from": status}))
            .insert(conn)
            .await?;
        Ok(true)
    }

    /// Rule 3: SENT rows not acknowledged within `ack_timeout` whose run still waits for them.
    async fn rule_unacked_dispatches(
        &self,
        conn: &mut PgConnection,
        jobs: &JobThresholds,
        c: &mut Counts,
    ) -> Result<()> {
        let g = &self.config.thresholds;
        let min = jobs.min_of(g, |t| t.ack_timeout);
        let rows: Vec<UnackedRow> = sqlx::query_as(UNACKED_DISPATCHES)
            .bind(secs(min))
            .fetch_all(&mut *conn)
            .await?;
        let mut requeued: BTreeMap<Uuid, Vec<Uuid>> = BTreeMap::new();
        for UnackedRow {
            dispatch_id,
            run_id,
            dispatch_type: kind,
            partition_id: pid,
            attempt_count: attempts,
            job_key: job,
            age_s: age,
        } in rows
        {
            let t = jobs.of(&job, g);
            if age < secs(t.ack_timeout) {
                continue;
            }
            if attempts < t.dispatch_max_attempts {
                sqlx::query(
                    "UPDATE nifi_ops.load_dispatch SET status = 'PENDING', next_attempt_at = clock_timestamp(), \
                        last_error = 'ack timeout, requeued by sweeper' WHERE dispatch_id = $1",
                )
                .bind(dispatch_id)
                .execute(&mut *conn)
                .await?;
                requeued.entry(run_id).or_default().push(dispatch_id);
                c.add("requeue_dispatch", 1);
            } else {
                let error = format!("no ack after {attempts} attempts (ack timeout)");
                sqlx::query("UPDATE nifi_ops.load_dispatch SET status = 'DEAD', last_error = $2 WHERE dispatch_id = $1")
                    .bind(dispatch_id)
                    .bind(&error)
                    .execute(&mut *conn)
                    .await?;
                dead_event(
                    conn,
                    run_id,
                    pid.as_deref(),
                    dispatch_id,
                    &kind,
                    None,
                    attempts,
                    &error,
                )
                .await?;
                c.add("dead_dispatch", 1);
                *c.dead_by_type.entry(kind).or_default() += 1;
            }
        }
        for (run_id, ids) in &requeued {
            Event::new(Level::Warn, "DISPATCH_REQUEUED")
                .run_only(*run_id)
                .details(json!({"dispatchIds": ids}))
                .insert(conn)
                .await?;
        }
        if !requeued.is_empty() {
            notify_dispatch(conn, "sweeper").await?;
        }
        Ok(())
    }

    /// Rule 4: an alert event for runs stuck in STAGE_VALIDATING or PUBLISHED, once per window.
    async fn rule_stale_alert(
        &self,
        conn: &mut PgConnection,
        jobs: &JobThresholds,
        c: &mut Counts,
    ) -> Result<()> {
        let g = &self.config.thresholds;
        let min = jobs.min_of(g, |t| t.validation_stale);
        let rows: Vec<(Uuid, String, String, String, DateTime<Utc>, f64)> =
            sqlx::query_as(STALE_ALERT_RUNS)
                .bind(secs(min))
                .fetch_all(&mut *conn)
                .await?;
        let due: Vec<_> = rows
            .into_iter()
            .map(|row| (secs(jobs.of(&row.1, g).validation_stale), row))
            .filter(|(window, row)| row.5 >= *window)
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = due.iter().map(|(_, row)| row.0).collect();
        let windows: Vec<f64> = due.iter().map(|(window, _)| *window).collect();
        let alerted: std::collections::HashSet<Uuid> = sqlx::query_scalar(RECENT_STALE_ALERTS)
            .bind(&ids)
            .bind(&windows)
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect();
        for (_, (run_id, job, bk, status, heartbeat, _)) in due {
            if alerted.contains(&run_id) {
                continue;
            }
            Event::new(Level::Error, "RUN_STALE_ALERT")
                .run_keys(run_id, &job, &bk)
                .processor("sweeper")
                .message(&format!("no progress in {status}"))
                .details(json!({"status": status, "heartbeatAt": format_ts(&heartbeat)}))
                .insert(conn)
                .await?;
            c.add("stale_alert", 1);
        }
        Ok(())
    }

    /// Rule 5: PUBLISHING past `publish_stale` → PUBLISH_UNKNOWN. Never retried, never confirmed.
    async fn rule_publish_stale(
        &self,
        conn: &mut PgConnection,
        jobs: &JobThresholds,
        c: &mut Counts,
    ) -> Result<()> {
        let g = &self.config.thresholds;
        let min = jobs.min_of(g, |t| t.publish_stale);
        let rows: Vec<(Uuid, String, f64)> = sqlx::query_as(PUBLISH_STALE_RUNS)
            .bind(secs(min))
            .fetch_all(&mut *conn)
            .await?;
        for (run_id, job, age) in rows {
            let limit = jobs.of(&job, g).publish_stale;
            if age < secs(limit) {
                continue;
            }
            if !c.may_hold_another() {
                break;
            }
            let Some(run) = self.try_lock_run(conn, run_id, "PUBLISHING").await? else {
                continue;
            };
            let message = format!(
                "no publish result within publish_stale {}",
                iso_duration(limit)
            );
            let error = ErrorFields::Set {
                stage: "PUBLISH",
                code: "PUBLISH_STALE",
                message: &message,
            };
            transition_locked(
                conn,
                run_id,
                RunStatus::Publishing,
                RunStatus::PublishUnknown,
                error,
            )
            .await?;
            Event::new(Level::Error, "PUBLISH_UNKNOWN")
                .run(&run)
                .code("PUBLISH_STALE")
                .message(&message)
                .insert(conn)
                .await?;
            c.add("publish_unknown", 1);
            self.keep_run(conn).await?;
            c.held += 1;
        }
        Ok(())
    }

    /// Rule 6 [v1-ext]: events of cleaned runs older than `event_retention`, 10,000 per tick.
    async fn rule_event_retention(
        &self,
        conn: &mut PgConnection,
        jobs: &JobThresholds,
        c: &mut Counts,
    ) -> Result<()> {
        let keys: Vec<&String> = jobs.by_job.keys().collect();
        let retention: Vec<f64> = keys
            .iter()
            .map(|k| secs(jobs.by_job[*k].event_retention))
            .collect();
        let global = secs(self.config.thresholds.event_retention);
        let shortest = retention.iter().copied().fold(global, f64::min);
        let due: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as(EVENT_RETENTION_RUNS)
            .bind(&keys)
            .bind(&retention)
            .bind(global)
            .bind(shortest)
            .bind(EVENT_RETENTION_RUN_BATCH)
            .fetch_all(&mut *conn)
            .await?;
        if due.is_empty() {
            return Ok(());
        }
        let (runs, cutoffs): (Vec<Uuid>, Vec<DateTime<Utc>>) = due.into_iter().unzip();
        let deleted = sqlx::query(EVENT_RETENTION)
            .bind(&runs)
            .bind(&cutoffs)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        sqlx::query(EVENT_RETENTION_MARK)
            .bind(&runs)
            .bind(&cutoffs)
            .execute(&mut *conn)
            .await?;
        c.add("events_deleted", deleted);
        Ok(())
    }
}

/// What one transaction of a tick did, and whether it left runs for the next one.
struct SweepRound {
    report: SweepReport,
    deferred: bool,
}

#[derive(sqlx::FromRow)]
struct UnackedRow {
    dispatch_id: Uuid,
    run_id: Uuid,
    dispatch_type: String,
    partition_id: Option<String>,
    attempt_count: i32,
    job_key: String,
    age_s: f64,
}

/// Unfinished partitions of a run the sweeper ends keep their own rule: TIMED_OUT (§7.2).
async fn time_out_partitions(conn: &mut PgConnection, run_id: Uuid, code: &str) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE nifi_ops.load_partition SET status = 'TIMED_OUT', error_code = $2, completed_at = clock_timestamp(), \
            heartbeat_at = clock_timestamp() WHERE run_id = $1 AND status IN ('PENDING', 'RUNNING', 'RETRY')",
    )
    .bind(run_id)
    .bind(code)
    .execute(&mut *conn)
    .await?
    .rows_affected())
}

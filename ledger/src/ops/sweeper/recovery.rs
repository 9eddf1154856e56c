//! Rules 1–3 (CONTRACT §7.2): stale partitions reissued or timed out, runs past their deadline
//! ended, unacknowledged dispatches sent again or given up.
use super::queries::*;
use super::{Counts, secs};
use crate::error::{LedgerError, Result};
use crate::event::{Event, Level};
use crate::job_thresholds::JobThresholds;
use crate::notify::notify_dispatch;
use crate::ops::dispatch::{self, dead_event};
use crate::ops::transition::{ErrorFields, transition_locked};
use crate::settings::{RecoveryMode, iso_duration};
use crate::status::RunStatus;
use crate::store::Ledger;
use serde_json::json;
use sqlx::PgConnection;
use std::collections::BTreeMap;
use uuid::Uuid;

impl Ledger {
    /// Rule 1: stale RUNNING partitions of EXTRACTING runs → reissue (REISSUE mode) or time out.
    pub(super) async fn rule_stale_partitions(
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
                        .bind(dispatch::new_dispatch_id())
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
                crate::run_lock::beat_locked_run(conn, run_id).await?;
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
    pub(super) async fn rule_run_deadline(
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
    pub(super) async fn rule_unacked_dispatches(
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

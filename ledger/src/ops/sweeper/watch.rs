//! Rules 4–6 (CONTRACT §7.2): alerts for stuck runs, PUBLISHING past its window to
//! PUBLISH_UNKNOWN, and event retention.
use super::queries::*;
use super::{Counts, secs};
use crate::error::Result;
use crate::event::{Event, Level};
use crate::job_thresholds::JobThresholds;
use crate::json::format_ts;
use crate::ops::transition::{ErrorFields, transition_locked};
use crate::settings::iso_duration;
use crate::status::RunStatus;
use crate::store::Ledger;
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

impl Ledger {
    /// Rule 4: an alert event for runs stuck in STAGE_VALIDATING or PUBLISHED, once per window.
    pub(super) async fn rule_stale_alert(
        &self,
        conn: &mut PgConnection,
        jobs: &JobThresholds,
        c: &mut Counts,
    ) -> Result<()> {
        let g = &self.config.thresholds;
        let shortest = jobs.min_of(g, |t| t.validation_stale);
        let longest = jobs
            .validation_stale
            .iter()
            .copied()
            .fold(secs(g.validation_stale), f64::max);
        let due: Vec<(Uuid, String, String, String, DateTime<Utc>)> =
            sqlx::query_as(STALE_ALERT_DUE)
                .bind(&jobs.jobs)
                .bind(&jobs.validation_stale)
                .bind(secs(g.validation_stale))
                .bind(secs(shortest))
                .bind(longest)
                .fetch_all(&mut *conn)
                .await?;
        for (run_id, job, bk, status, heartbeat) in due {
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
    pub(super) async fn rule_publish_stale(
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
    pub(super) async fn rule_event_retention(
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

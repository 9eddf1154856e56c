//! Per-job overrides of the global thresholds (§10.3), read for each sweeper tick and cleanup.
use crate::error::Result;
use crate::store::Ledger;
use sqlx::PgConnection;

/// The effective settings of every job with a valid override, plus the same as parallel arrays for
/// `unnest(...)` in SQL (job keys; success, failed retention; stale, validation-stale seconds).
/// Jobs without one are absent: the global values apply to them.
pub(crate) struct JobThresholds {
    pub by_job: std::collections::HashMap<String, crate::settings::Thresholds>,
    pub jobs: Vec<String>,
    pub success: Vec<f64>,
    pub failed: Vec<f64>,
    pub stale: Vec<f64>,
    pub validation_stale: Vec<f64>,
}

impl JobThresholds {
    /// The smallest value of `pick` over the global settings and every job's: the widest net a
    /// sweeper rule casts in SQL before judging each run by its own job's value.
    pub fn min_of(
        &self,
        global: &crate::settings::Thresholds,
        pick: impl Fn(&crate::settings::Thresholds) -> std::time::Duration,
    ) -> std::time::Duration {
        self.by_job
            .values()
            .map(&pick)
            .fold(pick(global), std::cmp::min)
    }

    /// The effective settings of `job`.
    pub fn of<'a>(
        &'a self,
        job: &str,
        global: &'a crate::settings::Thresholds,
    ) -> &'a crate::settings::Thresholds {
        self.by_job.get(job).unwrap_or(global)
    }
}

impl Ledger {
    /// Reads the non-removed `load_job` settings now, so a change applies from the next request.
    pub(crate) async fn job_thresholds(&self, conn: &mut PgConnection) -> Result<JobThresholds> {
        let rows: Vec<(String, sqlx::types::Json<serde_json::Value>)> = sqlx::query_as(
            "SELECT job_key, settings FROM nifi_ops.load_job WHERE removed_at IS NULL AND settings <> '{}'::jsonb",
        )
        .fetch_all(&mut *conn)
        .await?;
        let mut t = JobThresholds {
            by_job: Default::default(),
            jobs: vec![],
            success: vec![],
            failed: vec![],
            stale: vec![],
            validation_stale: vec![],
        };
        for (job, settings) in rows {
            match crate::settings::effective(
                &self.config.thresholds,
                &settings.0,
                self.config.dispatch_lease,
            ) {
                Ok(e) => {
                    t.jobs.push(job.clone());
                    t.success.push(e.success_retention.as_secs_f64());
                    t.failed.push(e.failed_retention.as_secs_f64());
                    t.stale.push(e.stale.as_secs_f64());
                    t.validation_stale.push(e.validation_stale.as_secs_f64());
                    t.by_job.insert(job, e);
                }
                Err(why) => {
                    tracing::warn!(event = "job_settings_invalid", job_key = %job, reason = %why, "job settings ignored")
                }
            }
        }
        Ok(t)
    }
}

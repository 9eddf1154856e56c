//! Cleanup accounting (CONTRACT §4.18, §4.19): which terminal runs are past retention, and the
//! record that PG-70 (or an operator) deleted their files. load-control deletes nothing itself.
use crate::error::{LedgerError, Result};
use crate::event::{Actor, Event, Level};
use crate::job_thresholds::JobThresholds;
use crate::json::ts;
use crate::status::RunStatus;
use crate::store::Ledger;
use crate::transactions::transaction;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use std::sync::LazyLock;
use uuid::Uuid;

/// `$1..$5`: per-job overrides and the global retentions; the due predicate over `r` (the job's
/// retention found by its position in `$1`, so that no join keeps an index from serving the order).
pub(crate) const JOB_CTE: &str = "WITH js AS (SELECT * FROM unnest($1::text[], $2::float8[], $3::float8[], $4::float8[], $5::float8[]) \
     AS t(job_key, success_s, failed_s, stale_s, vstale_s))";
pub(crate) const DUE: &str = "(r.cleaned_at IS NULL AND ( \
     (r.status = 'SUCCESS' AND COALESCE(r.completed_at, r.heartbeat_at) < clock_timestamp() \
        - make_interval(secs => COALESCE(($2::float8[])[array_position($1::text[], r.job_key::text)], $6))) \
  OR (r.status IN ('FAILED_MANIFEST','FAILED_EXTRACT','FAILED_STAGE_VALIDATION','FAILED_PUBLISH','FAILED_TARGET_VALIDATION', \
                   'FAILED_SNAPSHOT_EXPIRED','TIMED_OUT','CANCELLED') \
      AND COALESCE(r.completed_at, r.heartbeat_at) < clock_timestamp() \
        - make_interval(secs => COALESCE(($3::float8[])[array_position($1::text[], r.job_key::text)], $7)))))";

/// What `DUE` implies, in the terms of the partial indexes `ix_load_run_cleanup_end` and
/// `ix_load_run_cleanup_job_end`: a window on the end time, `{}` the parameter of the shortest
/// retention of any job. `statement_timestamp()` (stable) lets the bound be an index condition;
/// it is never later than `DUE`'s `clock_timestamp()`, so the window holds every run due when the
/// statement started.
fn due_window(min_retention_param: usize) -> String {
    format!(
        "(r.cleaned_at IS NULL AND r.status IN ('SUCCESS','FAILED_MANIFEST','FAILED_EXTRACT','FAILED_STAGE_VALIDATION', \
           'FAILED_PUBLISH','FAILED_TARGET_VALIDATION','FAILED_SNAPSHOT_EXPIRED','TIMED_OUT','CANCELLED') \
          AND COALESCE(r.completed_at, r.heartbeat_at) < statement_timestamp() - make_interval(secs => ${min_retention_param}))"
    )
}

/// `GET /v1/cleanup/candidates` (§4.18): `$1..$7` thresholds, `$8` limit, `$9` shortest retention.
pub static CANDIDATES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{JOB_CTE} SELECT {CANDIDATE_COLS} FROM nifi_ops.load_run r WHERE {DUE} AND {} \
          ORDER BY COALESCE(r.completed_at, r.heartbeat_at), r.run_id LIMIT $8",
        due_window(9)
    )
});
/// The same for one job: `$8` job, `$9` limit, `$10` shortest retention.
pub static CANDIDATES_OF_JOB: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{JOB_CTE} SELECT {CANDIDATE_COLS} FROM nifi_ops.load_run r WHERE {DUE} AND {} AND r.job_key = $8 \
          ORDER BY COALESCE(r.completed_at, r.heartbeat_at), r.run_id LIMIT $9",
        due_window(10)
    )
});
/// The monitor's `cleanupDue` (§4.20): `$8` cap, `$9` shortest retention.
pub static DUE_COUNT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{JOB_CTE} SELECT count(*) FROM (SELECT 1 FROM nifi_ops.load_run r WHERE {DUE} AND {} \
          ORDER BY COALESCE(r.completed_at, r.heartbeat_at), r.run_id LIMIT $8) d",
        due_window(9)
    )
});
const CANDIDATE_COLS: &str = "r.run_id, r.job_key, r.business_key, r.status, r.hdfs_run_path, r.stage_table_name AS stage_table, \
     COALESCE(r.completed_at, r.heartbeat_at) AS completed_at";

/// The shortest success or failed retention of any job, in seconds: no run ends later than this
/// and is due.
pub(crate) fn min_retention(t: &JobThresholds, g: &crate::settings::Thresholds) -> f64 {
    t.success.iter().chain(&t.failed).copied().fold(
        g.success_retention.min(g.failed_retention).as_secs_f64(),
        f64::min,
    )
}

/// Binds `$1..$7` of `JOB_CTE` + `DUE` (and the stale globals at `$8`, `$9`, for the monitor).
macro_rules! bind_thresholds {
    ($q:expr, $t:expr, $g:expr) => {
        $q.bind(&$t.jobs)
            .bind(&$t.success)
            .bind(&$t.failed)
            .bind(&$t.stale)
            .bind(&$t.validation_stale)
            .bind($g.success_retention.as_secs_f64())
            .bind($g.failed_retention.as_secs_f64())
    };
}
pub(crate) use bind_thresholds;

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct CleanupCandidate {
    pub run_id: Uuid,
    pub job_key: String,
    pub business_key: String,
    pub status: String,
    pub hdfs_run_path: Option<String>,
    pub stage_table: Option<String>,
    /// The run's end time (`COALESCE(completed_at, heartbeat_at)`).
    #[serde(serialize_with = "ts")]
    pub completed_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct CleanupRecorded {
    pub run_status: RunStatus,
    pub changed: bool,
}

impl Ledger {
    pub async fn cleanup_candidates(
        &self,
        job_key: Option<&str>,
        limit: i64,
    ) -> Result<Vec<CleanupCandidate>> {
        let limit = limit.min(self.config.cleanup_max_batch);
        let mut conn = self.acquire().await?;
        let t: JobThresholds = self.job_thresholds(&mut conn).await?;
        let g = &self.config.thresholds;
        let q = match job_key {
            Some(job) => {
                bind_thresholds!(sqlx::query_as(CANDIDATES_OF_JOB.as_str()), t, g).bind(job)
            }
            None => bind_thresholds!(sqlx::query_as(CANDIDATES.as_str()), t, g),
        };
        Ok(q.bind(limit)
            .bind(min_retention(&t, g))
            .persistent(false)
            .fetch_all(&mut *conn)
            .await?)
    }

    /// `actor` is set for operator calls, whose identity the event records.
    pub async fn record_cleanup(
        &self,
        run_id: Uuid,
        dropped_table: Option<&str>,
        deleted_path: Option<&str>,
        actor: Option<&Actor>,
    ) -> Result<CleanupRecorded> {
        transaction!(self, |conn| async {
            let t = self.job_thresholds(conn).await?;
            let run = self.lock_run(conn, run_id).await?;
            let status = run.status()?;
            let g = &self.config.thresholds;
            let sql = format!(
                "{JOB_CTE} SELECT r.cleaned_at IS NOT NULL, {DUE} FROM nifi_ops.load_run r WHERE r.run_id = $8"
            );
            let (cleaned, due): (bool, bool) =
                bind_thresholds!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), t, g)
                    .bind(run_id)
                    .fetch_one(&mut *conn)
                    .await?;
            if cleaned {
                return Ok(CleanupRecorded {
                    run_status: status,
                    changed: false,
                });
            }
            if !due {
                return Err(LedgerError::CleanupNotDue { run_status: status });
            }
            sqlx::query("UPDATE nifi_ops.load_run SET cleaned_at = clock_timestamp() WHERE run_id = $1 AND cleaned_at IS NULL")
                .bind(run_id)
                .execute(&mut *conn)
                .await?;
            let mut event = Event::new(Level::Info, "RUN_CLEANED")
                .run(&run)
                .details(json!({"droppedTable": dropped_table, "deletedPath": deleted_path}));
            if let Some(a) = actor {
                event = event.actor(a);
            }
            event.insert(conn).await?;
            Ok(CleanupRecorded {
                run_status: status,
                changed: true,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Thresholds;
    use std::time::Duration;

    fn jobs(success: &[f64], failed: &[f64]) -> JobThresholds {
        JobThresholds {
            by_job: Default::default(),
            jobs: (0..success.len()).map(|i| format!("JOB_{i}")).collect(),
            success: success.to_vec(),
            failed: failed.to_vec(),
            stale: vec![3600.0; success.len()],
            validation_stale: vec![3600.0; success.len()],
        }
    }

    /// The due window is an index bound that must hold every due run: it opens at the shortest
    /// retention of any job or of the globals, not later (a due run would be missed) and not
    /// needlessly earlier (the bound would narrow nothing).
    #[test]
    fn the_due_window_opens_at_the_shortest_retention_of_any_job_or_the_globals() {
        let days = |n: u64| Duration::from_secs(n * 86_400);
        let global = |success: u64, failed: u64| Thresholds {
            success_retention: days(success),
            failed_retention: days(failed),
            ..Thresholds::default()
        };
        let none = jobs(&[], &[]);
        assert_eq!(min_retention(&none, &global(7, 30)), 7.0 * 86_400.0);
        assert_eq!(min_retention(&none, &global(30, 2)), 2.0 * 86_400.0);
        let overrides = jobs(&[10.0 * 86_400.0, 5_400.0], &[7_200.0, 86_400.0]);
        assert_eq!(min_retention(&overrides, &global(7, 30)), 5_400.0);
        let failed_shortest = jobs(&[86_400.0], &[900.0]);
        assert_eq!(min_retention(&failed_shortest, &global(7, 30)), 900.0);
    }
}

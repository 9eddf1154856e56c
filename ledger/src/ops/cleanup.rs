//! Cleanup accounting (CONTRACT §4.18, §4.19): which terminal runs are past retention, and the
//! record that PG-70 (or an operator) deleted their files. load-control deletes nothing itself.
use crate::error::{LedgerError, LedgerResult};
use crate::event::{Actor, Event, Level};
use crate::json::ts;
use crate::status::RunStatus;
use crate::store::{JobThresholds, Ledger, RunLock, transaction};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

/// `$1..$5`: per-job overrides and the global retentions; the due predicate over `r` and `js`.
pub(crate) const JOB_CTE: &str = "WITH js AS (SELECT * FROM unnest($1::text[], $2::float8[], $3::float8[], $4::float8[], $5::float8[]) \
     AS t(job_key, success_s, failed_s, stale_s, vstale_s))";
pub(crate) const DUE: &str = "(r.cleaned_at IS NULL AND ( \
     (r.status = 'SUCCESS' AND COALESCE(r.completed_at, r.heartbeat_at) < clock_timestamp() - make_interval(secs => COALESCE(js.success_s, $6))) \
  OR (r.status IN ('FAILED_MANIFEST','FAILED_EXTRACT','FAILED_STAGE_VALIDATION','FAILED_PUBLISH','FAILED_TARGET_VALIDATION', \
                   'FAILED_SNAPSHOT_EXPIRED','TIMED_OUT','CANCELLED') \
      AND COALESCE(r.completed_at, r.heartbeat_at) < clock_timestamp() - make_interval(secs => COALESCE(js.failed_s, $7)))))";

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
    ) -> LedgerResult<Vec<CleanupCandidate>> {
        let limit = limit.min(self.config.cleanup_max_batch);
        let mut conn = self.pool.acquire().await?;
        let t: JobThresholds = self.job_thresholds(&mut conn).await?;
        let g = &self.config.thresholds;
        let sql = format!(
            "{JOB_CTE} SELECT r.run_id, r.job_key, r.business_key, r.status, r.hdfs_run_path, r.stage_table_name AS stage_table, \
                    COALESCE(r.completed_at, r.heartbeat_at) AS completed_at \
               FROM nifi_ops.load_run r LEFT JOIN js ON js.job_key = r.job_key \
              WHERE {DUE} AND ($8::text IS NULL OR r.job_key = $8) \
              ORDER BY COALESCE(r.completed_at, r.heartbeat_at), r.run_id LIMIT $9"
        );
        Ok(
            bind_thresholds!(sqlx::query_as(sqlx::AssertSqlSafe(sql)), t, g)
                .bind(job_key)
                .bind(limit)
                .fetch_all(&mut *conn)
                .await?,
        )
    }

    /// `actor` is set for operator calls, whose identity the event records.
    pub async fn record_cleanup(
        &self,
        run_id: Uuid,
        dropped_table: Option<&str>,
        deleted_path: Option<&str>,
        actor: Option<&Actor>,
    ) -> LedgerResult<CleanupRecorded> {
        transaction!(self, |conn| async {
            let t = self.job_thresholds(conn).await?;
            let run = self.lock_run(conn, run_id, RunLock::Exclusive).await?;
            let status = run.status()?;
            let g = &self.config.thresholds;
            let sql = format!(
                "{JOB_CTE} SELECT r.cleaned_at IS NOT NULL, {DUE} FROM nifi_ops.load_run r LEFT JOIN js ON js.job_key = r.job_key \
                  WHERE r.run_id = $8"
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

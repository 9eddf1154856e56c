//! The operator's view of the ledger (ARCHITECTURE loops 1–2): `load_job` rows written by the
//! LoadJob controller (fenced), per-job run summaries, and the runs the LoadRun mirror reflects.
use super::fence::{Fence, check_fence};
use crate::error::Result;
use crate::store::Ledger;
use crate::transactions::transaction;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::sync::LazyLock;
use uuid::Uuid;

/// The mirror's view of runs (LoadJob-owned; active, or ended within a day), narrowed by `$filter`.
/// Driven by the two bounded sets (active runs by status, runs ended within a day by
/// `ix_load_run_final_end`), not by a scan of every run that filters them (issue 26).
macro_rules! mirrored_runs_sql {
    ($filter:literal, $tail:literal) => {
        concat!("SELECT r.run_id, r.job_key, r.business_key, r.status, r.version_no, r.snapshot_scn::text AS snapshot_scn, r.hdfs_run_path, \
                    r.stage_table_name, r.source_count, r.extracted_count, r.staging_count, r.target_count, r.expected_partition_count, \
                    r.started_at, r.completed_at, r.error_stage, r.error_code, r.error_message, j.source, \
                    count(p.*) FILTER (WHERE p.status = 'SUCCESS') AS p_succeeded, count(p.*) FILTER (WHERE p.status = 'RUNNING') AS p_running, \
                    count(p.*) FILTER (WHERE p.status = 'PENDING') AS p_pending, count(p.*) FILTER (WHERE p.status = 'RETRY') AS p_retry, \
                    count(p.*) FILTER (WHERE p.status = 'FAILED') AS p_failed, count(p.*) FILTER (WHERE p.status = 'TIMED_OUT') AS p_timed_out, \
                    count(p.*) FILTER (WHERE p.status = 'ABORTED') AS p_aborted, \
                    (SELECT count(*) FROM nifi_ops.load_dispatch d WHERE d.run_id = r.run_id AND d.status = 'PENDING') AS d_pending, \
                    (SELECT count(*) FROM nifi_ops.load_dispatch d WHERE d.run_id = r.run_id AND d.status = 'SENT') AS d_sent, \
                    (SELECT count(*) FROM nifi_ops.load_dispatch d WHERE d.run_id = r.run_id AND d.status = 'DEAD') AS d_dead, \
                    (SELECT count(*) FROM nifi_ops.load_dispatch d WHERE d.run_id = r.run_id AND \
                        ", crate::machine::alerting_dead_dispatch!("d", "r"), ") AS d_dead_alerting \
               FROM nifi_ops.load_run r \
               JOIN nifi_ops.load_job j ON j.job_key = r.job_key AND j.removed_at IS NULL AND j.source LIKE 'LoadJob/%' \
               LEFT JOIN nifi_ops.load_partition p ON p.run_id = r.run_id \
              WHERE r.run_id = ANY (ARRAY(SELECT run_id FROM nifi_ops.load_run \
                      WHERE status IN ('CREATED','EXTRACTING','EXTRACTED_VALIDATED','STAGE_VALIDATING','STAGING_VALIDATED', \
                                       'PUBLISHING','PUBLISHED','PUBLISH_UNKNOWN') \
                     UNION ALL \
                     SELECT run_id FROM nifi_ops.load_run \
                      WHERE status NOT IN ('CREATED','EXTRACTING','EXTRACTED_VALIDATED','STAGE_VALIDATING','STAGING_VALIDATED', \
                                           'PUBLISHING','PUBLISHED','PUBLISH_UNKNOWN') \
                        AND COALESCE(completed_at, heartbeat_at) > statement_timestamp() - interval '1 day')) \
                AND (", $filter, ") \
              GROUP BY r.run_id, j.source ORDER BY r.started_at, r.run_id", $tail)
    };
}

/// The first page of the mirror's pass (`$1` limit).
pub const MIRRORED_RUNS_FIRST: &str = mirrored_runs_sql!("TRUE", " LIMIT $1");
/// A later page: after (`$2` started_at, `$3` run_id).
pub const MIRRORED_RUNS_AFTER: &str =
    mirrored_runs_sql!("(r.started_at, r.run_id) > ($2, $3)", " LIMIT $1");

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobWrite {
    Applied,
    /// Another source owns the (non-removed) row of this jobKey: nothing was written.
    Conflict {
        owner: String,
    },
}

#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RunBrief {
    pub run_id: Uuid,
    pub job_key: String,
    pub business_key: String,
    pub status: String,
    pub completed_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobSummary {
    pub active_runs: i64,
    pub active_run: Option<RunBrief>,
    pub last_run: Option<RunBrief>,
    pub succeeded: i64,
    pub failed: i64,
    pub cancelled: i64,
}

/// Everything a LoadRun's status shows, read in one statement.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct MirroredRun {
    pub run_id: Uuid,
    pub job_key: String,
    pub business_key: String,
    pub status: String,
    pub version_no: i32,
    pub snapshot_scn: Option<String>,
    pub hdfs_run_path: Option<String>,
    pub stage_table_name: Option<String>,
    pub source_count: Option<i64>,
    pub extracted_count: i64,
    pub staging_count: Option<i64>,
    pub target_count: Option<i64>,
    pub expected_partition_count: Option<i32>,
    pub started_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    pub error_stage: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    /// `LoadJob/<namespace>/<name>` of the job's row.
    pub source: String,
    pub p_succeeded: i64,
    pub p_running: i64,
    pub p_pending: i64,
    pub p_retry: i64,
    pub p_failed: i64,
    pub p_timed_out: i64,
    pub p_aborted: i64,
    pub d_pending: i64,
    pub d_sent: i64,
    pub d_dead: i64,
    /// DEAD dispatches the monitor alerts on (not settled with the run, not of a CANCELLED run).
    pub d_dead_alerting: i64,
}

const ACTIVE: &str = "('CREATED','EXTRACTING','EXTRACTED_VALIDATED','STAGE_VALIDATING','STAGING_VALIDATED','PUBLISHING','PUBLISHED','PUBLISH_UNKNOWN')";
const SUMMARY_COLS: &str =
    "run_id, job_key, business_key, status, COALESCE(completed_at, heartbeat_at) AS completed_at";

/// `job_summary`, `$1` the job: its active runs.
pub static JOB_ACTIVE_COUNT: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT count(*) FROM nifi_ops.load_run WHERE job_key = $1 AND status IN {ACTIVE}")
});
/// … its newest active run.
pub static JOB_ACTIVE_RUN: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {SUMMARY_COLS} FROM nifi_ops.load_run WHERE job_key = $1 AND status IN {ACTIVE} \
          ORDER BY started_at DESC LIMIT 1"
    )
});
/// … its last final run.
pub static JOB_LAST_RUN: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {SUMMARY_COLS} FROM nifi_ops.load_run WHERE job_key = $1 AND status NOT IN {ACTIVE} \
          ORDER BY COALESCE(completed_at, heartbeat_at) DESC LIMIT 1"
    )
});
/// … its runs that ended within 24 h, by outcome (all three counts are of final statuses).
pub static JOB_RECENT_COUNTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), count(*) FILTER (WHERE status NOT IN ('SUCCESS','CANCELLED')), \
                count(*) FILTER (WHERE status = 'CANCELLED') \
           FROM nifi_ops.load_run WHERE job_key = $1 AND status NOT IN {ACTIVE} \
            AND COALESCE(completed_at, heartbeat_at) >= statement_timestamp() - interval '24 hours'"
    )
});

impl Ledger {
    /// Writes a LoadJob's settings and suspend flag; the first source of a jobKey owns it until
    /// its row is removed.
    pub async fn apply_job(
        &self,
        fence: &Fence,
        job_key: &str,
        suspended: bool,
        settings: &Value,
        source: &str,
        generation: Option<i64>,
    ) -> Result<JobWrite> {
        transaction!(self, |conn| async {
            check_fence(conn, fence).await?;
            let row: Option<(Option<String>, bool)> =
                sqlx::query_as("SELECT source, removed_at IS NOT NULL FROM nifi_ops.load_job WHERE job_key = $1 FOR UPDATE")
                    .bind(job_key)
                    .fetch_optional(&mut *conn)
                    .await?;
            if let Some((Some(owner), false)) = &row
                && owner != source
            {
                return Ok(JobWrite::Conflict {
                    owner: owner.clone(),
                });
            }
            sqlx::query(
                "INSERT INTO nifi_ops.load_job (job_key, suspended, settings, source, generation) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (job_key) DO UPDATE SET suspended = EXCLUDED.suspended, settings = EXCLUDED.settings, \
                    source = EXCLUDED.source, generation = EXCLUDED.generation, removed_at = NULL, updated_at = clock_timestamp()",
            )
            .bind(job_key)
            .bind(suspended)
            .bind(sqlx::types::Json(settings))
            .bind(source)
            .bind(generation)
            .execute(&mut *conn)
            .await?;
            Ok(JobWrite::Applied)
        })
    }

    /// The LoadJob is gone: its row counts as absent from now on (kept for history).
    pub async fn remove_job(&self, fence: &Fence, job_key: &str, source: &str) -> Result<bool> {
        transaction!(self, |conn| async {
            check_fence(conn, fence).await?;
            Ok(sqlx::query(
                "UPDATE nifi_ops.load_job SET removed_at = clock_timestamp(), updated_at = clock_timestamp() \
                  WHERE job_key = $1 AND source = $2 AND removed_at IS NULL",
            )
            .bind(job_key)
            .bind(source)
            .execute(&mut *conn)
            .await?
            .rows_affected()
                == 1)
        })
    }

    /// The jobs a LoadJob owns now: (jobKey, source) of every row not removed whose source is a
    /// `LoadJob/<namespace>/<name>`. The mirror compares them with the LoadJobs that exist.
    pub async fn loadjob_owned_jobs(&self) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(
            "SELECT job_key, source FROM nifi_ops.load_job \
              WHERE removed_at IS NULL AND source LIKE 'LoadJob/%' ORDER BY job_key",
        )
        .fetch_all(&mut *self.acquire().await?)
        .await?)
    }

    /// Active and last runs of a job and its counts over the last 24 h. Each part reads the job's
    /// active runs (`uq_load_run_active`) or its final ones in end-time order
    /// (`ix_load_run_job_final_end`): the last one, or the last 24 h.
    pub async fn job_summary(&self, job_key: &str) -> Result<JobSummary> {
        let mut s = JobSummary::default();
        (s.active_runs,) = sqlx::query_as(JOB_ACTIVE_COUNT.as_str())
            .bind(job_key)
            .fetch_one(&mut *self.acquire().await?)
            .await?;
        s.active_run = sqlx::query_as(JOB_ACTIVE_RUN.as_str())
            .bind(job_key)
            .fetch_optional(&mut *self.acquire().await?)
            .await?;
        s.last_run = sqlx::query_as(JOB_LAST_RUN.as_str())
            .bind(job_key)
            .fetch_optional(&mut *self.acquire().await?)
            .await?;
        (s.succeeded, s.failed, s.cancelled) = sqlx::query_as(JOB_RECENT_COUNTS.as_str())
            .bind(job_key)
            .fetch_one(&mut *self.acquire().await?)
            .await?;
        Ok(s)
    }

    /// Runs of jobs that a LoadJob owns (non-removed rows with a `LoadJob/…` source): the active ones
    /// and those that ended within a day — older terminal runs no longer change.
    /// One page of the mirrored runs: at most `limit`, in (started_at, run_id) order, after
    /// `after` (the last run of the previous page). A full pass reads page by page, so its
    /// memory does not grow with the number of runs.
    pub async fn mirrored_runs_page(
        &self,
        after: Option<(DateTime<Utc>, uuid::Uuid)>,
        limit: i64,
    ) -> Result<Vec<MirroredRun>> {
        Ok(match after {
            None => {
                sqlx::query_as(MIRRORED_RUNS_FIRST)
                    .bind(limit)
                    .fetch_all(&mut *self.acquire().await?)
                    .await?
            }
            Some((started, run)) => {
                sqlx::query_as(MIRRORED_RUNS_AFTER)
                    .bind(limit)
                    .bind(started)
                    .bind(run)
                    .fetch_all(&mut *self.acquire().await?)
                    .await?
            }
        })
    }

    /// The runs of `ids` that are mirrored (selected as [`Ledger::mirrored_runs_page`] selects them):
    /// what a NOTIFY or a LoadRun request asks the mirror to look at, without reading every run.
    pub async fn mirrored_runs_by_id(&self, ids: &[uuid::Uuid]) -> Result<Vec<MirroredRun>> {
        Ok(sqlx::query_as(mirrored_runs_sql!("r.run_id = ANY($1)", ""))
            .bind(ids)
            .fetch_all(&mut *self.acquire().await?)
            .await?)
    }
}

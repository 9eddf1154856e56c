//! Read models: `GET /v1/runs` and `GET /v1/runs/{run_id}` (CONTRACT §4.4, §4.5). Unlocked reads;
//! the detail comes from one REPEATABLE READ snapshot so its parts agree.
use crate::error::{LedgerError, Result};
use crate::json::{ts, ts_opt};
use crate::status::RunStatus;
use crate::store::Ledger;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use uuid::Uuid;

#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub job_key: Option<String>,
    pub business_key: Option<String>,
    pub status: Option<RunStatus>,
    pub limit: i64,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    pub run_id: Uuid,
    pub job_key: String,
    pub business_key: String,
    pub status: String,
    pub source_count: Option<i64>,
    pub extracted_count: i64,
    pub staging_count: Option<i64>,
    pub target_count: Option<i64>,
    pub expected_partition_count: Option<i32>,
    pub success_partition_count: i32,
    pub failed_partition_count: i32,
    #[serde(serialize_with = "ts")]
    pub started_at: DateTime<Utc>,
    #[serde(serialize_with = "ts")]
    pub heartbeat_at: DateTime<Utc>,
    #[serde(serialize_with = "ts_opt")]
    pub completed_at: Option<DateTime<Utc>>,
    pub error_code: Option<String>,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PartitionView {
    pub partition_id: String,
    pub status: String,
    pub expected_row_count: i64,
    pub actual_row_count: Option<i64>,
    pub file_count: Option<i32>,
    pub attempt_count: i32,
    pub worker_node: Option<String>,
    pub error_code: Option<String>,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct DispatchView {
    pub dispatch_id: Uuid,
    pub dispatch_type: String,
    pub partition_id: Option<String>,
    pub status: String,
    pub attempt_count: i32,
    #[serde(serialize_with = "ts_opt")]
    pub sent_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "ts_opt")]
    pub acked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunDetail {
    pub run_id: Uuid,
    pub job_key: String,
    pub business_key: String,
    pub status: String,
    pub snapshot_scn: Option<String>,
    pub source_count: Option<i64>,
    pub expected_partition_count: Option<i32>,
    pub success_partition_count: i32,
    pub failed_partition_count: i32,
    pub extracted_count: i64,
    pub staging_count: Option<i64>,
    pub target_count: Option<i64>,
    pub hdfs_run_path: Option<String>,
    #[sqlx(rename = "stage_table_name")]
    pub stage_table: Option<String>,
    #[serde(serialize_with = "ts")]
    pub started_at: DateTime<Utc>,
    #[serde(serialize_with = "ts")]
    pub heartbeat_at: DateTime<Utc>,
    #[serde(serialize_with = "ts_opt")]
    pub extract_completed_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "ts_opt")]
    pub completed_at: Option<DateTime<Utc>>,
    pub error_stage: Option<String>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    #[sqlx(skip)]
    pub partition_counts: BTreeMap<String, i64>,
    #[sqlx(skip)]
    pub partitions: Vec<PartitionView>,
    #[sqlx(skip)]
    pub dispatches: Vec<DispatchView>,
}

/// `success_partition_count` as it is read: partition successes do not write it, so while the run
/// is EXTRACTING it is `nifi_ops.run_success_count` (one primary-key range of the run, counted from
/// the newest committed state, or the transaction's snapshot in a repeatable-read read); every transition out of EXTRACTING stores the same count, and no
/// partition becomes SUCCESS afterwards.
macro_rules! success_count_read {
    () => {
        "CASE WHEN load_run.status = 'EXTRACTING' \
              THEN nifi_ops.run_success_count(load_run.run_id) \
              ELSE load_run.success_partition_count END AS success_partition_count"
    };
}

/// `GET /v1/runs?jobKey=…` (§4.4): `$1` job, `$2` business key, `$3` status, `$4` limit; served by
/// `ix_load_run_job_started`.
pub const LIST_RUNS_OF_JOB: &str = concat!(
    "SELECT run_id, job_key, business_key, status, source_count, extracted_count, staging_count, target_count, \
        expected_partition_count, ",
    success_count_read!(),
    ", failed_partition_count, started_at, heartbeat_at, \
        completed_at, error_code FROM nifi_ops.load_run \
  WHERE job_key = $1 AND ($2::text IS NULL OR business_key = $2) AND ($3::text IS NULL OR status = $3) \
  ORDER BY started_at DESC, run_id LIMIT $4"
);
/// `GET /v1/runs` without a jobKey: `$1` business key, `$2` status, `$3` limit; served by
/// `ix_load_run_started`.
pub const LIST_RUNS: &str = concat!(
    "SELECT run_id, job_key, business_key, status, source_count, extracted_count, staging_count, target_count, \
        expected_partition_count, ",
    success_count_read!(),
    ", failed_partition_count, started_at, heartbeat_at, \
        completed_at, error_code FROM nifi_ops.load_run \
  WHERE ($1::text IS NULL OR business_key = $1) AND ($2::text IS NULL OR status = $2) \
  ORDER BY started_at DESC, run_id LIMIT $3"
);

impl Ledger {
    pub async fn list_runs(&self, f: &RunFilter) -> Result<Vec<RunSummary>> {
        // One statement per case (§4.4), each served by its index in `started_at DESC` order:
        // an `$1 IS NULL OR job_key = $1` form cannot use either index once it is planned
        // generically. Unnamed statements: planned with their LIMIT, never generically.
        let q = match &f.job_key {
            Some(job) => sqlx::query_as(LIST_RUNS_OF_JOB).bind(job.as_str()),
            None => sqlx::query_as(LIST_RUNS),
        };
        Ok(q.bind(&f.business_key)
            .bind(f.status.map(|s| s.as_str()))
            .bind(f.limit)
            .persistent(false)
            .fetch_all(&mut *self.acquire().await?)
            .await?)
    }

    pub async fn run_detail(&self, run_id: Uuid) -> Result<RunDetail> {
        let mut tx = self.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        let mut detail: RunDetail = sqlx::query_as(concat!(
            "SELECT run_id, job_key, business_key, status, snapshot_scn::text AS snapshot_scn, source_count, \
                    expected_partition_count, ",
            success_count_read!(),
            ", failed_partition_count, extracted_count, \
                    staging_count, target_count, hdfs_run_path, stage_table_name, started_at, heartbeat_at, \
                    extract_completed_at, completed_at, error_stage, error_code, error_message \
               FROM nifi_ops.load_run WHERE run_id = $1"
        ))
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(LedgerError::RunNotFound)?;
        detail.partitions = sqlx::query_as(
            "SELECT partition_id, status, expected_row_count, actual_row_count, file_count, attempt_count, worker_node, error_code \
               FROM nifi_ops.load_partition WHERE run_id = $1 ORDER BY partition_id",
        )
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?;
        detail.dispatches = sqlx::query_as(
            "SELECT dispatch_id, dispatch_type, partition_id, status, attempt_count, sent_at, acked_at \
               FROM nifi_ops.load_dispatch WHERE run_id = $1 ORDER BY created_at, dispatch_id",
        )
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        for p in &detail.partitions {
            *detail.partition_counts.entry(p.status.clone()).or_default() += 1;
        }
        Ok(detail)
    }
}

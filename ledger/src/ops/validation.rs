//! Stage validation, metrics and the final judgement (CONTRACT §4.9–§4.11, §4.14, §4.21).
use super::transition::{ErrorFields, transition_locked};
use crate::error::{LedgerError, Result};
use crate::event::{Event, Level};
use crate::functions::StartValidationOutcome;
use crate::json::ts;
use crate::judge::{StoredMetric, count_value, judge_metrics};
use crate::run_lock::run_lock_key;
use crate::status::RunStatus;
use crate::store::Ledger;
use crate::transactions::{alone, transaction};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct StartOutcome {
    pub started: bool,
    pub run_status: RunStatus,
    pub job_key: Option<String>,
    pub business_key: Option<String>,
    pub snapshot_scn: Option<String>,
    pub hdfs_run_path: Option<String>,
    pub stage_table: Option<String>,
    pub source_count: Option<i64>,
    pub extracted_count: Option<i64>,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub source_metrics: Map<String, Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricStage {
    Staging,
    Target,
}

impl MetricStage {
    pub fn as_str(self) -> &'static str {
        match self {
            MetricStage::Staging => "STAGING",
            MetricStage::Target => "TARGET",
        }
    }

    /// The run status in which this stage's metrics are accepted (§5.5).
    fn accepted_in(self) -> RunStatus {
        match self {
            MetricStage::Staging => RunStatus::StageValidating,
            MetricStage::Target => RunStatus::Published,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct MetricItem {
    pub metric_name: String,
    pub expected_value: Option<String>,
    pub actual_value: Option<String>,
    pub tolerance: Option<String>,
    pub result: String,
    pub details: Map<String, Value>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct MetricsRecorded {
    pub recorded: usize,
    pub fail_count: usize,
    pub run_status: RunStatus,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct StageVerdict {
    pub stage_validated: bool,
    pub run_status: RunStatus,
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SuccessVerdict {
    pub success: bool,
    pub run_status: RunStatus,
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct MetricView {
    pub stage: String,
    pub metric_name: String,
    pub expected_value: Option<String>,
    pub actual_value: Option<String>,
    pub result: String,
    #[serde(serialize_with = "ts")]
    pub measured_at: DateTime<Utc>,
    pub query_version: String,
}

async fn stored_metrics(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    stage: &str,
) -> Result<Vec<StoredMetric>> {
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT metric_name, query_version, result FROM nifi_ops.load_validation WHERE run_id = $1 AND stage = $2")
            .bind(run_id)
            .bind(stage)
            .fetch_all(&mut *conn)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(metric_name, query_version, result)| StoredMetric {
            metric_name,
            query_version,
            result,
        })
        .collect())
}

/// The most recently measured actual value of `name` in `stage` (any query version).
async fn latest_value(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    stage: &str,
    name: &str,
) -> Result<Option<String>> {
    let row: Option<(Option<String>,)> = sqlx::query_as(
        "SELECT actual_value FROM nifi_ops.load_validation WHERE run_id = $1 AND stage = $2 AND metric_name = $3 \
          ORDER BY measured_at DESC, validation_id DESC LIMIT 1",
    )
    .bind(run_id)
    .bind(stage)
    .bind(name)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.and_then(|r| r.0))
}

impl Ledger {
    /// The dispatch ACK of PG-40 and the one-time start of stage validation (§4.9).
    pub async fn start_validation(
        &self,
        run_id: Uuid,
        dispatch_id: Uuid,
        node: &str,
    ) -> Result<StartOutcome> {
        // Chosen before the first attempt and sent again with every repeat: a repeat of a start
        // whose answer was lost finds its own event and answers the start it made.
        let event_id = Uuid::now_v7();
        let row = alone!(self, |conn| call_start_validation(
            conn,
            run_id,
            dispatch_id,
            node,
            event_id
        ))?;
        row.outcome()
    }

    /// Stores STAGING or TARGET metrics (§4.10): upsert by (stage, name, query version).
    pub async fn store_metrics(
        &self,
        run_id: Uuid,
        stage: MetricStage,
        query_version: &str,
        items: &[MetricItem],
    ) -> Result<MetricsRecorded> {
        // A name repeated within one request keeps its last item.
        let mut last: Vec<&MetricItem> = Vec::new();
        for item in items {
            last.retain(|m| m.metric_name != item.metric_name);
            last.push(item);
        }
        transaction!(self, |conn| async {
            let run = self.lock_run(conn, run_id).await?;
            let status = run.status()?;
            if status != stage.accepted_in() {
                return Err(LedgerError::RunStatusMismatch {
                    run_status: status,
                    stage: Some(stage.as_str().into()),
                });
            }
            for m in &last {
                sqlx::query(
                    "INSERT INTO nifi_ops.load_validation (run_id, stage, metric_name, expected_value, actual_value, tolerance, \
                       result, query_version, details) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                     ON CONFLICT (run_id, stage, metric_name, query_version) DO UPDATE SET \
                       expected_value = EXCLUDED.expected_value, actual_value = EXCLUDED.actual_value, \
                       tolerance = EXCLUDED.tolerance, result = EXCLUDED.result, details = EXCLUDED.details, \
                       measured_at = clock_timestamp()",
                )
                .bind(run_id)
                .bind(stage.as_str())
                .bind(&m.metric_name)
                .bind(&m.expected_value)
                .bind(&m.actual_value)
                .bind(&m.tolerance)
                .bind(&m.result)
                .bind(query_version)
                .bind(sqlx::types::Json(&m.details))
                .execute(&mut *conn)
                .await?;
            }
            crate::run_lock::beat_locked_run(conn, run_id).await?;
            let failing: Vec<&str> = last
                .iter()
                .filter(|m| m.result == "FAIL")
                .map(|m| m.metric_name.as_str())
                .collect();
            if !failing.is_empty() {
                let name = if stage == MetricStage::Staging {
                    "STAGING_METRIC_FAILED"
                } else {
                    "TARGET_METRIC_FAILED"
                };
                Event::new(Level::Warn, name)
                    .run(&run)
                    .message(&failing.join(", "))
                    .insert(conn)
                    .await?;
            }
            Ok(MetricsRecorded {
                recorded: items.len(),
                fail_count: failing.len(),
                run_status: status,
            })
        })
    }

    /// Judges the stored STAGING metrics (§4.11); never trusts a verdict from NiFi.
    pub async fn stage_validated(&self, run_id: Uuid) -> Result<StageVerdict> {
        transaction!(self, |conn| async {
            let run = self.lock_run(conn, run_id).await?;
            let status = run.status()?;
            let verdict = |ok, run_status, reasons| StageVerdict {
                stage_validated: ok,
                run_status,
                reasons,
            };
            match status {
                RunStatus::StagingValidated => return Ok(verdict(true, status, vec![])),
                RunStatus::StageValidating => {}
                other => return Ok(verdict(false, other, vec![format!("RUN_STATUS {other}")])),
            }
            let reasons = judge_metrics(&stored_metrics(conn, run_id, "STAGING").await?);
            if !reasons.is_empty() {
                return Ok(verdict(false, status, reasons));
            }
            let staging_count = count_value(
                latest_value(conn, run_id, "STAGING", "STAGE_COUNT")
                    .await?
                    .as_deref(),
            );
            transition_locked(
                conn,
                run_id,
                status,
                RunStatus::StagingValidated,
                ErrorFields::Keep,
            )
            .await?;
            sqlx::query("UPDATE nifi_ops.load_run SET staging_count = $2 WHERE run_id = $1")
                .bind(run_id)
                .bind(staging_count)
                .execute(&mut *conn)
                .await?;
            Event::new(Level::Info, "STAGE_VALIDATED")
                .run(&run)
                .rows(staging_count)
                .insert(conn)
                .await?;
            Ok(verdict(true, RunStatus::StagingValidated, vec![]))
        })
    }

    /// Judges the stored TARGET metrics and finishes the run (§4.14).
    pub async fn succeed(&self, run_id: Uuid, target_count: Option<i64>) -> Result<SuccessVerdict> {
        transaction!(self, |conn| async {
            let run = self.lock_run(conn, run_id).await?;
            let status = run.status()?;
            let verdict = |ok, run_status, reasons| SuccessVerdict {
                success: ok,
                run_status,
                reasons,
            };
            match status {
                RunStatus::Success => return Ok(verdict(true, status, vec![])),
                RunStatus::Published => {}
                other => return Ok(verdict(false, other, vec![format!("RUN_STATUS {other}")])),
            }
            let reasons = judge_metrics(&stored_metrics(conn, run_id, "TARGET").await?);
            if !reasons.is_empty() {
                return Ok(verdict(false, status, reasons));
            }
            let count = match target_count {
                Some(n) => Some(n),
                None => count_value(
                    latest_value(conn, run_id, "TARGET", "TARGET_COUNT")
                        .await?
                        .as_deref(),
                ),
            };
            transition_locked(conn, run_id, status, RunStatus::Success, ErrorFields::Keep).await?;
            sqlx::query("UPDATE nifi_ops.load_run SET target_count = $2 WHERE run_id = $1")
                .bind(run_id)
                .bind(count)
                .execute(&mut *conn)
                .await?;
            Event::new(Level::Info, "RUN_SUCCESS")
                .run(&run)
                .rows(count)
                .insert(conn)
                .await?;
            Ok(verdict(true, RunStatus::Success, vec![]))
        })
    }

    /// Stored metrics ordered SOURCE, STAGING, TARGET (others last), name, query version (§4.21).
    pub async fn metrics(&self, run_id: Uuid) -> Result<Vec<MetricView>> {
        let mut tx = self.run_snapshot(run_id).await?;
        let rows = sqlx::query_as(
            "SELECT stage, metric_name, expected_value, actual_value, result, measured_at, query_version \
               FROM nifi_ops.load_validation WHERE run_id = $1 \
              ORDER BY CASE stage WHEN 'SOURCE' THEN 0 WHEN 'STAGING' THEN 1 WHEN 'TARGET' THEN 2 ELSE 3 END, \
                       metric_name, query_version",
        )
        .bind(run_id)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(rows)
    }
}

async fn call_start_validation(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    dispatch_id: Uuid,
    node: &str,
    event_id: Uuid,
) -> Result<StartRow> {
    let (k1, k2) = run_lock_key(run_id);
    let row = sqlx::query_as(
        "SELECT outcome::text AS outcome, run_status, job_key, business_key, snapshot_scn, \
                hdfs_run_path, stage_table_name, source_count, extracted_count, source_metrics \
           FROM nifi_ops.start_validation_v2($1, $2, $3, $4, $5, $6)",
    )
    .bind(run_id)
    .bind(dispatch_id)
    .bind(node)
    .bind(k1)
    .bind(k2)
    .bind(event_id)
    .fetch_one(&mut *conn)
    .await?;
    Ok(row)
}

/// What `nifi_ops.start_validation_v2` answers (ledger/functions/start_validation_v2.sql).
#[derive(sqlx::FromRow)]
struct StartRow {
    outcome: StartValidationOutcome,
    run_status: Option<String>,
    job_key: Option<String>,
    business_key: Option<String>,
    snapshot_scn: Option<String>,
    hdfs_run_path: Option<String>,
    stage_table_name: Option<String>,
    source_count: Option<i64>,
    extracted_count: Option<i64>,
    source_metrics: Option<sqlx::types::Json<Map<String, Value>>>,
}

impl StartRow {
    fn outcome(self) -> Result<StartOutcome> {
        let status = || -> Result<RunStatus> {
            let s = self
                .run_status
                .as_deref()
                .ok_or_else(|| LedgerError::Corrupt("start without a run status".into()))?;
            RunStatus::parse(s).ok_or_else(|| LedgerError::Corrupt(format!("run status {s}")))
        };
        match self.outcome {
            StartValidationOutcome::RunNotFound => Err(LedgerError::RunNotFound),
            StartValidationOutcome::DispatchMismatch => Err(LedgerError::DispatchMismatch),
            StartValidationOutcome::Refused => Ok(StartOutcome {
                started: false,
                run_status: status()?,
                job_key: None,
                business_key: None,
                snapshot_scn: None,
                hdfs_run_path: None,
                stage_table: None,
                source_count: None,
                extracted_count: None,
                source_metrics: Map::new(),
            }),
            StartValidationOutcome::Started => Ok(StartOutcome {
                started: true,
                run_status: status()?,
                job_key: self.job_key,
                business_key: self.business_key,
                snapshot_scn: self.snapshot_scn,
                hdfs_run_path: self.hdfs_run_path,
                stage_table: self.stage_table_name,
                source_count: self.source_count,
                extracted_count: self.extracted_count,
                source_metrics: self.source_metrics.map(|m| m.0).unwrap_or_default(),
            }),
        }
    }
}

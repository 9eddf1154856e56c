//! `POST /v1/runs/{run_id}/manifest` (CONTRACT §4.2): the plan of partitions, judged by the pure
//! invariants of `crate::manifest` and stored in one transaction.
use super::complete::complete_extraction;
use super::transition::{ErrorFields, transition, transition_locked};
use crate::error::{LedgerError, Result};
use crate::event::{Event, Level};
use crate::manifest::{Manifest, manifest_violations};
use crate::status::RunStatus;
use crate::store::Ledger;
use crate::transactions::transaction;
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeSet;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, PartialEq, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct DispatchPartition {
    pub partition_id: String,
    pub lower_bound: Option<String>,
    pub upper_bound: Option<String>,
    pub upper_inclusive: bool,
    pub is_null_partition: bool,
    pub expected_row_count: i64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ManifestOutcome {
    pub run_id: Uuid,
    pub status: RunStatus,
    pub dispatch_partitions: Vec<DispatchPartition>,
    pub empty_partition_count: i64,
    pub validation_scheduled: bool,
}

enum Registered {
    Accepted(ManifestOutcome),
    /// Committed as FAILED_MANIFEST; answered 422 after the commit.
    Invalid(Vec<String>),
}

impl Ledger {
    pub async fn register_manifest(&self, run_id: Uuid, m: &Manifest) -> Result<ManifestOutcome> {
        let registered = transaction!(self, |conn| async {
            let run = self.lock_run(conn, run_id).await?;
            let status = run.status()?;
            if status != RunStatus::Created {
                return replay(conn, &run.run_id, status, run.source_count, m)
                    .await
                    .map(Registered::Accepted);
            }
            let allow_empty = run
                .parameters
                .0
                .get("allowEmptySource")
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            let violations = manifest_violations(m, allow_empty);
            if !violations.is_empty() {
                let message = violations.join("; ");
                let end = (
                    RunStatus::FailedManifest,
                    ErrorFields::Set {
                        stage: "MANIFEST",
                        code: "MANIFEST_INVALID",
                        message: &message,
                    },
                );
                transition(conn, run_id, status, end.0, end.1).await?;
                Event::new(Level::Error, "MANIFEST_INVALID")
                    .run(&run)
                    .code("MANIFEST_INVALID")
                    .message(&message)
                    .insert(conn)
                    .await?;
                return Ok(Registered::Invalid(violations));
            }
            let parts = &m.partitions;
            let ids: Vec<&str> = parts.iter().map(|p| p.partition_id.as_str()).collect();
            let lower: Vec<Option<String>> = parts
                .iter()
                .map(|p| p.lower_bound.map(|d| d.to_string()))
                .collect();
            let upper: Vec<Option<String>> = parts
                .iter()
                .map(|p| p.upper_bound.map(|d| d.to_string()))
                .collect();
            let incl: Vec<bool> = parts.iter().map(|p| p.upper_inclusive).collect();
            let is_null: Vec<bool> = parts.iter().map(|p| p.is_null_partition).collect();
            let expected: Vec<i64> = parts.iter().map(|p| p.expected_row_count).collect();
            // Zero-row partitions are born SUCCESS and never dispatched (§2.3).
            sqlx::query(
                "INSERT INTO nifi_ops.load_partition (run_id, partition_id, lower_bound, upper_bound, upper_inclusive, \
                   is_null_partition, expected_row_count, status, actual_row_count, file_count, fragment_count, completed_at) \
                 SELECT $1, t.id, t.lo::numeric, t.hi::numeric, t.incl, t.nullpart, t.expected, \
                        CASE WHEN t.expected = 0 THEN 'SUCCESS' ELSE 'PENDING' END, \
                        CASE WHEN t.expected = 0 THEN 0 END, CASE WHEN t.expected = 0 THEN 0 END, \
                        CASE WHEN t.expected = 0 THEN 0 END, CASE WHEN t.expected = 0 THEN clock_timestamp() END \
                   FROM unnest($2::text[], $3::text[], $4::text[], $5::bool[], $6::bool[], $7::bigint[]) \
                        AS t(id, lo, hi, incl, nullpart, expected)",
            )
            .bind(run_id)
            .bind(&ids)
            .bind(&lower)
            .bind(&upper)
            .bind(&incl)
            .bind(&is_null)
            .bind(&expected)
            .execute(&mut *conn)
            .await?;
            let empty = expected.iter().filter(|&&e| e == 0).count() as i64;
            let scn = m.snapshot_scn.map(|d| d.to_string());
            // The manifest's fields, then the status change by its one writer (which refreshes
            // the heartbeat, counts the version and wakes the mirror).
            sqlx::query(
                "UPDATE nifi_ops.load_run SET snapshot_scn = $2::numeric, source_count = $3, \
                    source_null_split_count = $4, source_min_split = $5::numeric, source_max_split = $6::numeric, \
                    expected_partition_count = $7, success_partition_count = $8 \
                  WHERE run_id = $1 AND status = 'CREATED'",
            )
            .bind(run_id)
            .bind(&scn)
            .bind(m.source_count)
            .bind(m.source_null_split_count)
            .bind(m.source_min_split.map(|d| d.to_string()))
            .bind(m.source_max_split.map(|d| d.to_string()))
            .bind(parts.len() as i32)
            .bind(empty as i32)
            .execute(&mut *conn)
            .await?;
            transition_locked(
                conn,
                run_id,
                RunStatus::Created,
                RunStatus::Extracting,
                ErrorFields::Keep,
            )
            .await?;
            // SOURCE metrics are stored, not judged; a sent SOURCE_COUNT never replaces the computed one.
            let mut names = vec!["SOURCE_COUNT".to_string()];
            let mut values = vec![m.source_count.to_string()];
            for (k, v) in m.source_metrics.iter().filter(|(k, _)| k != "SOURCE_COUNT") {
                names.push(k.clone());
                values.push(v.clone());
            }
            sqlx::query(
                "INSERT INTO nifi_ops.load_validation (run_id, stage, metric_name, actual_value, result, query_version) \
                 SELECT $1, 'SOURCE', n, v, 'PASS', $4 FROM unnest($2::text[], $3::text[]) AS t(n, v) \
                 ON CONFLICT (run_id, stage, metric_name, query_version) DO UPDATE \
                    SET actual_value = EXCLUDED.actual_value, expected_value = NULL, tolerance = NULL, \
                        result = 'PASS', details = '{}'::jsonb, measured_at = clock_timestamp()",
            )
            .bind(run_id)
            .bind(&names)
            .bind(&values)
            .bind(&m.source_metrics_version)
            .execute(&mut *conn)
            .await?;
            Event::new(Level::Info, "MANIFEST_CREATED")
                .run(&run)
                .rows(Some(m.source_count))
                .details(json!({"partitions": parts.len(), "empty": empty, "snapshotScn": scn}))
                .insert(conn)
                .await?;
            let mut status = RunStatus::Extracting;
            let mut scheduled = false;
            if empty == parts.len() as i64 {
                scheduled = complete_extraction(conn, run.run_id).await?;
                if scheduled {
                    status = RunStatus::ExtractedValidated;
                }
            }
            let dispatch_partitions = parts
                .iter()
                .filter(|p| p.expected_row_count > 0)
                .map(|p| DispatchPartition {
                    partition_id: p.partition_id.clone(),
                    lower_bound: p.lower_text.clone(),
                    upper_bound: p.upper_text.clone(),
                    upper_inclusive: p.upper_inclusive,
                    is_null_partition: p.is_null_partition,
                    expected_row_count: p.expected_row_count,
                })
                .collect();
            Ok(Registered::Accepted(ManifestOutcome {
                run_id,
                status,
                dispatch_partitions,
                empty_partition_count: empty,
                validation_scheduled: scheduled,
            }))
        })?;
        match registered {
            Registered::Accepted(o) => Ok(o),
            Registered::Invalid(violations) => Err(LedgerError::ManifestInvalid { violations }),
        }
    }
}

/// A manifest for a run past CREATED: the same plan again gets the stored state (its first answer
/// was lost); anything else is a status mismatch (§4.2 step 2).
async fn replay(
    conn: &mut sqlx::PgConnection,
    run_id: &Uuid,
    status: RunStatus,
    source_count: Option<i64>,
    m: &Manifest,
) -> Result<ManifestOutcome> {
    let stored: Vec<DispatchPartition> = sqlx::query_as(
        "SELECT partition_id, lower_bound::text AS lower_bound, upper_bound::text AS upper_bound, upper_inclusive, \
                is_null_partition, expected_row_count \
           FROM nifi_ops.load_partition WHERE run_id = $1 ORDER BY partition_id",
    )
    .bind(run_id)
    .fetch_all(&mut *conn)
    .await?;
    let stored_ids: BTreeSet<&str> = stored.iter().map(|p| p.partition_id.as_str()).collect();
    let sent_ids: BTreeSet<&str> = m
        .partitions
        .iter()
        .map(|p| p.partition_id.as_str())
        .collect();
    if stored.is_empty() || stored_ids != sent_ids || source_count != Some(m.source_count) {
        return Err(LedgerError::RunStatusMismatch {
            run_status: status,
            stage: None,
        });
    }
    let empty = stored.iter().filter(|p| p.expected_row_count == 0).count() as i64;
    Ok(ManifestOutcome {
        run_id: *run_id,
        status,
        dispatch_partitions: stored
            .into_iter()
            .filter(|p| p.expected_row_count > 0)
            .collect(),
        empty_partition_count: empty,
        validation_scheduled: false,
    })
}

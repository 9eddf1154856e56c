//! The transactional outbox's leader side (CONTRACT §6): leasing due rows and recording what NiFi
//! answered. Each is one short fenced transaction; the HTTP call happens between them, never inside.
use super::fence::{Fence, check_fence};
use crate::error::{LedgerError, Result};
use crate::event::{Event, Level};
use crate::settings::Thresholds;
use crate::store::Ledger;
use crate::text::cut;
use crate::transactions::transaction;
use serde_json::{Value, json};
use std::time::Duration;
use uuid::Uuid;

/// The id of a new outbox row: random v4 (§2), wherever a dispatch is written. It travels to NiFi
/// as `X-Dispatch-Id` and keys the validation result reports, so it must not be guessable from
/// the time it was written.
pub(crate) fn new_dispatch_id() -> Uuid {
    Uuid::new_v4()
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct LeasedDispatch {
    pub dispatch_id: Uuid,
    pub run_id: Uuid,
    pub dispatch_type: String,
    pub partition_id: Option<String>,
    /// Already incremented by the lease.
    pub attempt_count: i32,
    pub job_key: String,
}

/// The run and partition values a REISSUE_PARTITION body carries (§6.4).
#[derive(sqlx::FromRow)]
struct ReissueRow {
    business_key: String,
    snapshot_scn: Option<String>,
    hdfs_run_path: Option<String>,
    lower_bound: Option<String>,
    upper_bound: Option<String>,
    upper_inclusive: bool,
    is_null_partition: bool,
    expected_row_count: i64,
}

/// What to send for one leased row (§6.4), or why it cannot be built.
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchRequest {
    /// `{receiver}/validate/{jobKey}` or `{receiver}/reissue/{jobKey}`.
    pub url: String,
    pub body: Value,
    /// The job's effective settings (timeout, attempts, backoff).
    pub settings: Thresholds,
}

/// What NiFi's answer means for the row (§6.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// 2xx.
    Delivered { http_status: i32 },
    /// Transport error, 3xx, 408, 425, 429 or 5xx.
    Retryable {
        http_status: Option<i32>,
        error: String,
    },
    /// Any other 4xx.
    Refused { http_status: i32, error: String },
    /// The request could not be built.
    BuildFailed { reason: String },
}

impl SendOutcome {
    /// Classifies an HTTP status (§6.5).
    pub fn from_status(status: u16, text: String) -> SendOutcome {
        let code = status as i32;
        match status {
            200..=299 => SendOutcome::Delivered { http_status: code },
            300..=399 | 408 | 425 | 429 | 500.. => SendOutcome::Retryable {
                http_status: Some(code),
                error: text,
            },
            _ => SendOutcome::Refused {
                http_status: code,
                error: text,
            },
        }
    }
}

/// What the ledger did with the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    Sent,
    Retry,
    Dead,
    /// The row was no longer PENDING (acknowledged, settled or resent meanwhile): nothing written.
    NotPending,
}

/// `min(backoff_max, backoff_min × 2^min(a−1, 30))`.
pub fn backoff(attempt: i32, min: Duration, max: Duration) -> Duration {
    let exp = (attempt.max(1) - 1).min(30) as u32;
    let secs = min.as_secs_f64() * 2f64.powi(exp as i32);
    Duration::from_secs_f64(secs.min(max.as_secs_f64()))
}

impl Ledger {
    /// Leases up to `batch` due PENDING rows for `dispatch.lease` (§6.3). **[v1-ext]** A row leased
    /// by an earlier epoch is due at once: its leader is deposed and can record nothing.
    pub async fn lease_dispatches(&self, fence: &Fence, batch: i64) -> Result<Vec<LeasedDispatch>> {
        let lease = self.config.dispatch_lease.as_secs_f64();
        transaction!(self, |conn| async {
            check_fence(conn, fence).await?;
            Ok(sqlx::query_as(LEASE)
                .bind(batch)
                .bind(lease)
                .bind(fence.epoch)
                .fetch_all(&mut *conn)
                .await?)
        })
    }

    /// Builds the request of a leased row from the run (and partition) rows and the job's settings.
    pub async fn dispatch_request(
        &self,
        d: &LeasedDispatch,
    ) -> Result<Result<DispatchRequest, String>> {
        let mut conn = self.acquire().await?;
        let jobs = self.job_thresholds(&mut conn).await?;
        let settings = jobs.of(&d.job_key, &self.config.thresholds).clone();
        let Some(receiver) = settings.receiver_url.clone() else {
            return Ok(Err(format!("no receiver URL for job {}", d.job_key)));
        };
        let receiver = receiver.trim_end_matches('/');
        let (kind, body) = match d.dispatch_type.as_str() {
            "VALIDATE_RUN" => (
                "validate",
                json!({"runId": d.run_id, "dispatchId": d.dispatch_id}),
            ),
            "REISSUE_PARTITION" => {
                let pid = d.partition_id.clone().unwrap_or_default();
                let row: Option<ReissueRow> = sqlx::query_as(
                    "SELECT r.business_key, r.snapshot_scn::text AS snapshot_scn, r.hdfs_run_path, p.lower_bound::text AS lower_bound, p.upper_bound::text AS upper_bound, \
                            p.upper_inclusive, p.is_null_partition, p.expected_row_count \
                       FROM nifi_ops.load_run r JOIN nifi_ops.load_partition p ON p.run_id = r.run_id \
                      WHERE r.run_id = $1 AND p.partition_id = $2",
                )
                .bind(d.run_id)
                .bind(&pid)
                .fetch_optional(&mut *conn)
                .await?;
                let Some(ReissueRow {
                    business_key: bk,
                    snapshot_scn: scn,
                    hdfs_run_path: path,
                    lower_bound: lo,
                    upper_bound: hi,
                    upper_inclusive: incl,
                    is_null_partition: is_null,
                    expected_row_count: expected,
                }) = row
                else {
                    return Ok(Err(format!("partition row {pid} missing")));
                };
                (
                    "reissue",
                    json!({"runId": d.run_id, "dispatchId": d.dispatch_id, "partitionId": pid, "businessKey": bk, "snapshotScn": scn,
                           "hdfsRunPath": path, "lowerBound": lo, "upperBound": hi, "upperInclusive": incl,
                           "isNullPartition": is_null, "expectedRowCount": expected}),
                )
            }
            other => return Ok(Err(format!("unknown dispatch type {other}"))),
        };
        Ok(Ok(DispatchRequest {
            url: format!("{receiver}/{kind}/{}", d.job_key),
            body,
            settings,
        }))
    }

    /// Records one send's outcome, only if the row is still PENDING (§6.5).
    pub async fn record_dispatch_outcome(
        &self,
        fence: &Fence,
        d: &LeasedDispatch,
        outcome: &SendOutcome,
        settings: &Thresholds,
    ) -> Result<Recorded> {
        transaction!(self, |conn| async {
            check_fence(conn, fence).await?;
            let (target, http_status, error): (&str, Option<i32>, Option<String>) = match outcome {
                SendOutcome::Delivered { http_status } => ("SENT", Some(*http_status), None),
                SendOutcome::Retryable { http_status, error }
                    if d.attempt_count >= settings.dispatch_max_attempts =>
                {
                    (
                        "DEAD",
                        *http_status,
                        Some(format!("max attempts reached: {error}")),
                    )
                }
                SendOutcome::Retryable { http_status, error } => {
                    ("RETRY", *http_status, Some(error.clone()))
                }
                SendOutcome::Refused { http_status, error } => {
                    ("DEAD", Some(*http_status), Some(error.clone()))
                }
                SendOutcome::BuildFailed { reason } => {
                    ("DEAD", None, Some(format!("build failed: {reason}")))
                }
            };
            let error = error.map(|e| cut(&e, 2000));
            let changed = match target {
                "SENT" => sqlx::query(
                    "UPDATE nifi_ops.load_dispatch SET status = 'SENT', sent_at = clock_timestamp(), leased_epoch = NULL, last_http_status = $2, last_error = NULL \
                      WHERE dispatch_id = $1 AND status = 'PENDING'",
                )
                .bind(d.dispatch_id)
                .bind(http_status),
                "RETRY" => sqlx::query(
                    "UPDATE nifi_ops.load_dispatch SET next_attempt_at = clock_timestamp() + make_interval(secs => $4), \
                        leased_epoch = NULL, last_http_status = $2, last_error = $3 WHERE dispatch_id = $1 AND status = 'PENDING'",
                )
                .bind(d.dispatch_id)
                .bind(http_status)
                .bind(&error)
                .bind(backoff(d.attempt_count, settings.backoff_min, settings.backoff_max).as_secs_f64()),
                _ => sqlx::query(
                    "UPDATE nifi_ops.load_dispatch SET status = 'DEAD', leased_epoch = NULL, last_http_status = $2, last_error = $3 \
                      WHERE dispatch_id = $1 AND status = 'PENDING'",
                )
                .bind(d.dispatch_id)
                .bind(http_status)
                .bind(&error),
            }
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if changed == 0 {
                return Ok(Recorded::NotPending);
            }
            Ok(match target {
                "SENT" => Recorded::Sent,
                "RETRY" => Recorded::Retry,
                _ => {
                    dead_event(
                        conn,
                        d.run_id,
                        d.partition_id.as_deref(),
                        d.dispatch_id,
                        &d.dispatch_type,
                        http_status,
                        d.attempt_count,
                        error.as_deref().unwrap_or(""),
                    )
                    .await?;
                    Recorded::Dead
                }
            })
        })
    }

    /// Raw outbox and run counts for the operator's gauges, and the database's transaction-id and
    /// MultiXact ages (no fence: read-only). Every part is index-served: see [`RUN_COUNTS`].
    pub async fn backlog_gauges(&self) -> Result<Gauges> {
        let mut conn = self.acquire().await?;
        let dispatches = sqlx::query_as(super::monitor::DISPATCH_COUNTS)
            .fetch_all(&mut *conn)
            .await?;
        let runs = sqlx::query_as(RUN_COUNTS).fetch_all(&mut *conn).await?;
        let (xid_age, mxid_age) = sqlx::query_as(DATABASE_AGE).fetch_one(&mut *conn).await?;
        Ok(Gauges {
            dispatches,
            runs,
            xid_age,
            mxid_age,
        })
    }
}

/// What [`Ledger::backlog_gauges`] read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gauges {
    /// `lca_dispatch_backlog{status}`: PENDING, SENT, DEAD (those with rows).
    pub dispatches: Vec<(String, i64)>,
    /// `lca_active_runs{status}`: every status with runs.
    pub runs: Vec<(String, i64)>,
    /// `age(datfrozenxid)` of the ledger's database (`lca_database_xid_age`).
    pub xid_age: i64,
    /// `mxid_age(datminmxid)` of the ledger's database (`lca_database_mxid_age`).
    pub mxid_age: i64,
}

/// `lca_active_runs` counts runs in every status over all history (§9.1). The active ones come
/// from `ix_load_run_status_heartbeat`; the final ones from an index-only scan of the narrow
/// partial `ix_load_run_final_status` (deduplicated: a few pages for tens of thousands of runs)
/// rather than from the table.
pub const RUN_COUNTS: &str = "SELECT status, count(*) FROM nifi_ops.load_run \
     WHERE status IN ('CREATED','EXTRACTING','EXTRACTED_VALIDATED','STAGE_VALIDATING','STAGING_VALIDATED','PUBLISHING','PUBLISHED','PUBLISH_UNKNOWN') GROUP BY status \
     UNION ALL SELECT status, count(*) FROM nifi_ops.load_run \
     WHERE status NOT IN ('CREATED','EXTRACTING','EXTRACTED_VALIDATED','STAGE_VALIDATING','STAGING_VALIDATED','PUBLISHING','PUBLISHED','PUBLISH_UNKNOWN') GROUP BY status";

/// Transaction-id and MultiXact age of the current database (wraparound guard, docs/operations.md).
pub const DATABASE_AGE: &str = "SELECT age(datfrozenxid)::bigint, mxid_age(datminmxid)::bigint FROM pg_database WHERE datname = current_database()";

/// The lease scan (§6.3), `$1` batch, `$2` lease seconds, `$3` this leader's epoch. Two
/// index-bounded branches instead of `next_attempt_at <= now OR leased_epoch < $3`, which no index
/// serves (every PENDING row was read when nothing was due): rows due now, from
/// `ix_load_dispatch_due` up to the statement's start (`statement_timestamp()` is stable, so it is
/// an index condition), and **[v1-ext]** rows leased by an earlier epoch, from
/// `ix_load_dispatch_leased`. Both lock with SKIP LOCKED; the batch is the earliest `$1` of the two, updated by
/// primary key.
pub const LEASE: &str = "WITH due AS ( \
        SELECT dispatch_id, next_attempt_at FROM nifi_ops.load_dispatch \
         WHERE status = 'PENDING' AND next_attempt_at <= statement_timestamp() \
         ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED), \
     orphaned AS ( \
        SELECT dispatch_id, next_attempt_at FROM nifi_ops.load_dispatch \
         WHERE status = 'PENDING' AND leased_epoch < $3 \
         LIMIT $1 FOR UPDATE SKIP LOCKED) \
 UPDATE nifi_ops.load_dispatch d \
    SET attempt_count = d.attempt_count + 1, next_attempt_at = clock_timestamp() + make_interval(secs => $2), \
        leased_epoch = $3 \
   FROM nifi_ops.load_run r \
  WHERE d.dispatch_id = ANY (ARRAY(SELECT dispatch_id FROM (SELECT * FROM due UNION SELECT * FROM orphaned) u \
                                  ORDER BY next_attempt_at LIMIT $1)) \
    AND r.run_id = d.run_id \
RETURNING d.dispatch_id, d.run_id, d.dispatch_type, d.partition_id, d.attempt_count, r.job_key";

/// `DISPATCH_DEAD` (§6.5): run and partition only, never job or business key.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn dead_event(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    partition_id: Option<&str>,
    dispatch_id: Uuid,
    kind: &str,
    http_status: Option<i32>,
    attempt: i32,
    error: &str,
) -> Result<()> {
    Event::new(Level::Error, "DISPATCH_DEAD")
        .run_only(run_id)
        .partition_opt(partition_id)
        .message(error)
        .details(json!({"dispatchId": dispatch_id, "type": kind, "httpStatus": http_status, "attempt": attempt}))
        .insert(conn)
        .await
        .map_err(|e: LedgerError| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_min_and_caps_at_max() {
        let (min, max) = (Duration::from_secs(5), Duration::from_secs(300));
        let secs: Vec<u64> = (1..=8).map(|a| backoff(a, min, max).as_secs()).collect();
        assert_eq!(secs, vec![5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(backoff(1000, min, max).as_secs(), 300);
    }

    #[test]
    fn statuses_are_classified_as_the_contract_says() {
        assert_eq!(
            SendOutcome::from_status(202, String::new()),
            SendOutcome::Delivered { http_status: 202 }
        );
        for s in [301, 408, 425, 429, 500, 503] {
            assert!(
                matches!(
                    SendOutcome::from_status(s, String::new()),
                    SendOutcome::Retryable { .. }
                ),
                "{s}"
            );
        }
        for s in [400, 401, 404, 409, 422] {
            assert!(
                matches!(
                    SendOutcome::from_status(s, String::new()),
                    SendOutcome::Refused { .. }
                ),
                "{s}"
            );
        }
    }
}

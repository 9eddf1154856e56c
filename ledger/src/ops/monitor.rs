//! The monitor summary and the event timeline (CONTRACT §4.20, §4.22): read-only, one snapshot.
use super::cleanup::{DUE_COUNT, JOB_CTE, bind_thresholds, min_retention};
use crate::error::Result;
use crate::json::{ts, ts_opt};
use crate::store::Ledger;
use crate::text::cut;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::LazyLock;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    pub kind: String,
    pub severity: String,
    pub run_id: Uuid,
    pub job_key: String,
    pub business_key: String,
    pub status: Option<String>,
    #[serde(serialize_with = "ts_opt")]
    pub at: Option<DateTime<Utc>>,
    pub message: Option<String>,
    pub dispatch_id: Option<Uuid>,
}

#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct MonitorSummary {
    #[serde(serialize_with = "ts")]
    pub server_time: DateTime<Utc>,
    pub active_runs: BTreeMap<String, i64>,
    pub recent_runs: BTreeMap<String, i64>,
    pub recent_window_hours: i64,
    pub dispatches: BTreeMap<String, i64>,
    pub cleanup_due: i64,
    pub alerts: Vec<Alert>,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    #[serde(serialize_with = "ts")]
    pub event_time: DateTime<Utc>,
    pub level: String,
    pub name: String,
    pub partition_id: Option<String>,
    pub process_group: Option<String>,
    pub error_code: Option<String>,
    pub message: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub details: sqlx::types::Json<Value>,
}

const ACTIVE: &str = "('CREATED','EXTRACTING','EXTRACTED_VALIDATED','STAGE_VALIDATING','STAGING_VALIDATED','PUBLISHING','PUBLISHED','PUBLISH_UNKNOWN')";

/// `activeRuns` (§4.20): served by `ix_load_run_status_heartbeat`.
pub static ACTIVE_RUNS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT status, count(*) FROM nifi_ops.load_run WHERE status IN {ACTIVE} GROUP BY status"
    )
});
/// `recentRuns`: `$1` the window's start (serverTime − 24 h); served by `ix_load_run_final_end`.
pub static RECENT_RUNS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT status, count(*) FROM nifi_ops.load_run WHERE status NOT IN {ACTIVE} \
           AND COALESCE(completed_at, heartbeat_at) >= $1 GROUP BY status"
    )
});
/// `dispatches` and `lca_dispatch_backlog`: PENDING/SENT from `ix_load_dispatch_due`, DEAD (every
/// one, as the contract counts them) from the index-only `ix_load_dispatch_dead`.
pub const DISPATCH_COUNTS: &str = "SELECT status, count(*) FROM nifi_ops.load_dispatch WHERE status IN ('PENDING','SENT') GROUP BY status \
     UNION ALL SELECT 'DEAD', count(*) FROM nifi_ops.load_dispatch WHERE status = 'DEAD'";
/// The rows of `alerts`, as the CTE `alerts`: `$1..$7` thresholds, `$8`/`$9` the global stale
/// thresholds, `$10` the cap, `$11` the window's start (serverTime − 24 h). Each kind is served by
/// its own index and capped at `$10` rows in the list's order (the latest first), so a kind with
/// many rows (hundreds of runs awaiting a person, a thousand DEAD dispatches) costs `$10` rows, not
/// all of them: the list's first `$10` are among the kinds' first `$10`. (`DESC` without `NULLS
/// LAST` where the list says `NULLS LAST`: every `at` is NOT NULL, and a backward index scan
/// yields `DESC NULLS FIRST`.) PUBLISH_UNKNOWN and
/// RUN_STALE by `ix_load_run_status_heartbeat` (STAGE_VALIDATING and PUBLISHED by the covering
/// `ix_load_run_stuck`), DISPATCH_DEAD by `ix_load_dispatch_dead_alert` read backwards (the run
/// by its key), RUN_FAILED by `ix_load_run_final_end`, CLEANUP_FAILED by
/// `ix_load_event_cleanup_failed`.
static ALERT_ROWS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{JOB_CTE},
         cleanup_failed AS (
           SELECT DISTINCT ON (e.run_id) e.run_id, e.event_time, e.message FROM nifi_ops.load_event e
            WHERE e.event_name = 'CLEANUP_FAILED' AND e.event_time >= $11
            ORDER BY e.run_id, e.event_time DESC, e.event_id DESC),
         alerts AS (
           (SELECT 'PUBLISH_UNKNOWN' AS kind, 'ERROR' AS severity, r.run_id, r.job_key, r.business_key, r.status,
                  r.heartbeat_at AS at, r.error_message AS message, NULL::uuid AS dispatch_id
             FROM nifi_ops.load_run r WHERE r.status = 'PUBLISH_UNKNOWN'
            ORDER BY r.heartbeat_at DESC, r.run_id LIMIT $10)
           UNION ALL
           (SELECT 'DISPATCH_DEAD', 'ERROR', r.run_id, r.job_key, r.business_key, r.status, d.next_attempt_at,
                  d.dispatch_type || ': ' || COALESCE(d.last_error, ''), d.dispatch_id
             FROM nifi_ops.load_dispatch d
            CROSS JOIN LATERAL (SELECT r.run_id, r.job_key, r.business_key, r.status FROM nifi_ops.load_run r
                                 WHERE r.run_id = d.run_id LIMIT 1) r
            WHERE {dead_alerting}
            ORDER BY d.next_attempt_at DESC, r.run_id, d.dispatch_id LIMIT $10)
           UNION ALL
           (SELECT 'RUN_FAILED', 'ERROR', r.run_id, r.job_key, r.business_key, r.status, COALESCE(r.completed_at, r.heartbeat_at),
                  COALESCE(r.error_code, '') || ' ' || COALESCE(r.error_message, ''), NULL
             FROM nifi_ops.load_run r
            WHERE r.status IN ('FAILED_MANIFEST','FAILED_EXTRACT','FAILED_STAGE_VALIDATION','FAILED_PUBLISH',
                               'FAILED_TARGET_VALIDATION','FAILED_SNAPSHOT_EXPIRED','TIMED_OUT')
              AND r.status NOT IN {ACTIVE} AND COALESCE(r.completed_at, r.heartbeat_at) >= $11
            ORDER BY COALESCE(r.completed_at, r.heartbeat_at) DESC, r.run_id LIMIT $10)
           UNION ALL
           (SELECT 'RUN_STALE', 'WARN', r.run_id, r.job_key, r.business_key, r.status, r.heartbeat_at, 'no change for a long time', NULL
             FROM nifi_ops.load_run r LEFT JOIN js ON js.job_key = r.job_key
            WHERE r.status IN ('STAGE_VALIDATING','PUBLISHED')
              AND r.heartbeat_at < clock_timestamp() - make_interval(secs => COALESCE(js.vstale_s, $9))
            ORDER BY r.heartbeat_at DESC, r.run_id LIMIT $10)
           UNION ALL
           (SELECT 'RUN_STALE', 'WARN', r.run_id, r.job_key, r.business_key, r.status, r.heartbeat_at, 'no change for a long time', NULL
             FROM nifi_ops.load_run r LEFT JOIN js ON js.job_key = r.job_key
            WHERE (r.status IN ('EXTRACTED_VALIDATED','STAGING_VALIDATED')
                   AND r.heartbeat_at < clock_timestamp() - make_interval(secs => COALESCE(js.vstale_s, $9)))
               OR (r.status IN ('CREATED','EXTRACTING')
                   AND r.heartbeat_at < clock_timestamp() - make_interval(secs => COALESCE(js.stale_s, $8)))
            ORDER BY r.heartbeat_at DESC, r.run_id LIMIT $10)
           UNION ALL
           (SELECT 'CLEANUP_FAILED', 'WARN', r.run_id, r.job_key, r.business_key, NULL, c.event_time, c.message, NULL
             FROM cleanup_failed c JOIN nifi_ops.load_run r ON r.run_id = c.run_id WHERE r.cleaned_at IS NULL
            ORDER BY c.event_time DESC, r.run_id LIMIT $10))",
        dead_alerting = crate::machine::alerting_dead_dispatch!("d", "r"),
    )
});
/// A statement over [`ALERT_ROWS`] with its parameters: the thresholds, the global stale ones,
/// `$10` the cap and `$11` the window's start.
macro_rules! bind_alert_rows {
    ($sql:expr, $t:expr, $g:expr, $cap:expr, $since:expr) => {
        bind_thresholds!(sqlx::query_as($sql.as_str()), $t, $g)
            .bind($g.stale.as_secs_f64())
            .bind($g.validation_stale.as_secs_f64())
            .bind($cap)
            .bind($since)
            .persistent(false)
    };
}

/// `alerts` (§4.20): the rows of [`ALERT_ROWS`], errors first, the latest first, `$10` at most.
pub static ALERTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} SELECT kind, severity, run_id, job_key, business_key, status, at, message, dispatch_id FROM alerts
          ORDER BY CASE severity WHEN 'ERROR' THEN 0 ELSE 1 END, at DESC NULLS LAST, kind, run_id, dispatch_id
          LIMIT $10",
        *ALERT_ROWS
    )
});
/// `lca_monitor_alerts{kind}`: the same rows counted by kind, `$10` rows at most.
pub static ALERT_COUNTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{} SELECT kind, count(*) FROM (SELECT kind FROM alerts LIMIT $10) a GROUP BY kind",
        *ALERT_ROWS
    )
});
/// Every kind [`ALERT_ROWS`] yields, for gauges that show a zero rather than nothing.
pub const ALERT_KINDS: [&str; 5] = [
    "PUBLISH_UNKNOWN",
    "DISPATCH_DEAD",
    "RUN_FAILED",
    "RUN_STALE",
    "CLEANUP_FAILED",
];
/// The most alert rows [`Ledger::alert_counts`] counts: a bound on the scan, far above what an
/// operator could work through.
pub const ALERT_COUNT_CAP: i64 = 100_000;

impl Ledger {
    /// Every part reads a bounded slice of the ledger (issue 26): the active runs, the last 24 h
    /// (from `serverTime`, passed as a parameter so that the window is an index condition), the
    /// live outbox rows and the alert-worthy DEAD ones. Unnamed statements: each is planned with
    /// its actual window.
    pub async fn monitor_summary(&self, alert_limit: i64) -> Result<MonitorSummary> {
        let mut tx = self.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        let t = self.job_thresholds(&mut tx).await?;
        let g = &self.config.thresholds;
        let (server_time,): (DateTime<Utc>,) = sqlx::query_as("SELECT clock_timestamp()")
            .fetch_one(&mut *tx)
            .await?;
        let since = server_time - chrono::Duration::hours(24);
        let counts = |sql: &'static str| sqlx::query_as::<_, (String, i64)>(sql).persistent(false);
        let active_runs: BTreeMap<String, i64> = counts(ACTIVE_RUNS.as_str())
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect();
        let recent_runs: BTreeMap<String, i64> = counts(RECENT_RUNS.as_str())
            .bind(since)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect();
        let mut dispatches: BTreeMap<String, i64> = ["PENDING", "SENT", "DEAD"]
            .iter()
            .map(|s| (s.to_string(), 0))
            .collect();
        for (status, n) in counts(DISPATCH_COUNTS).fetch_all(&mut *tx).await? {
            dispatches.insert(status, n);
        }
        let (cleanup_due,): (i64,) = bind_thresholds!(sqlx::query_as(DUE_COUNT.as_str()), t, g)
            .bind(self.config.cleanup_max_batch)
            .bind(min_retention(&t, g))
            .persistent(false)
            .fetch_one(&mut *tx)
            .await?;
        let mut alerts: Vec<Alert> = bind_alert_rows!(ALERTS, t, g, alert_limit, since)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        for a in &mut alerts {
            a.message = a
                .message
                .as_deref()
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(|m| cut(m, 500));
        }
        Ok(MonitorSummary {
            server_time,
            active_runs,
            recent_runs,
            recent_window_hours: 24,
            dispatches,
            cleanup_due,
            alerts,
        })
    }

    /// The monitor's alerts counted by kind (`lca_monitor_alerts`), by the same rules as
    /// [`Ledger::monitor_summary`]'s list: the alerting rules of Prometheus and `loadctl monitor`
    /// see the same runs. Each count is capped at [`ALERT_COUNT_CAP`].
    pub async fn alert_counts(&self) -> Result<Vec<(String, i64)>> {
        let mut tx = self.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        let t = self.job_thresholds(&mut tx).await?;
        let g = &self.config.thresholds;
        let (since,): (DateTime<Utc>,) =
            sqlx::query_as("SELECT clock_timestamp() - interval '24 hours'")
                .fetch_one(&mut *tx)
                .await?;
        let counts: Vec<(String, i64)> =
            bind_alert_rows!(ALERT_COUNTS, t, g, ALERT_COUNT_CAP, since)
                .fetch_all(&mut *tx)
                .await?;
        tx.commit().await?;
        Ok(ALERT_KINDS
            .iter()
            .map(|kind| {
                let n = counts
                    .iter()
                    .find(|(k, _)| k == kind)
                    .map_or(0, |(_, n)| *n);
                (kind.to_string(), n)
            })
            .collect())
    }

    /// The most recent `limit` events of the run, oldest first (§4.22).
    pub async fn run_events(&self, run_id: Uuid, limit: i64) -> Result<Vec<EventView>> {
        let mut tx = self.run_snapshot(run_id).await?;
        let rows = sqlx::query_as(
            "SELECT event_time, level, name, partition_id, process_group, error_code, message, details FROM ( \
               SELECT event_time, event_level AS level, event_name AS name, partition_id, process_group, error_code, message, details, event_id \
                 FROM nifi_ops.load_event WHERE run_id = $1 ORDER BY event_time DESC, event_id DESC LIMIT $2) e \
              ORDER BY event_time, event_id",
        )
        .bind(run_id)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(rows)
    }
}

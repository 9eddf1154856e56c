//! The ledger invariant checker: reads the ledger after a load (or a chaos run) and reports every
//! row that breaks a promise of the product. It only reads.
//!
//! | rule | what it catches |
//! |---|---|
//! | `one_active_run_per_key` | more than one active run for a (jobKey, businessKey) |
//! | `success_is_complete` | a SUCCESS run without every partition SUCCESS, with row sums that differ from the source count, or without exactly one VALIDATE_RUN (and one validation start) |
//! | `one_owner_per_claim` | a partition whose claim history has two owners for one attempt, or more claims than attempts |
//! | `explained_state` | a run left active with no explanation: not PUBLISH_UNKNOWN, no DEAD dispatch, and past its deadline |
//! | `terminal_is_final` | a terminal run that moved again (any progress after its end, two endings, or a terminal status without completed_at) |
//! | `one_publish_claim` | a publish claimed more than once |
//! | `counts_match_partitions` | run counters that differ from the sums of its partitions |
use serde::Serialize;
use sqlx::PgConnection;
use std::collections::BTreeMap;
use uuid::Uuid;

pub const ACTIVE: &[&str] = &[
    "CREATED",
    "EXTRACTING",
    "EXTRACTED_VALIDATED",
    "STAGE_VALIDATING",
    "STAGING_VALIDATED",
    "PUBLISHING",
    "PUBLISHED",
    "PUBLISH_UNKNOWN",
];

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Violation {
    pub rule: &'static str,
    pub run_id: Option<Uuid>,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    pub runs: i64,
    pub by_status: BTreeMap<String, i64>,
    pub violations: Vec<Violation>,
}

/// What to check.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Only runs of these job keys (all when empty).
    pub job_keys: Vec<String>,
    /// An active run whose heartbeat is older than this is unexplained unless PUBLISH_UNKNOWN or
    /// holding a DEAD dispatch; 0 means every such run (use it once the load has settled).
    pub stale_after_seconds: f64,
}

async fn rows(
    conn: &mut PgConnection,
    scope: &Scope,
    rule: &'static str,
    sql: &str,
) -> sqlx::Result<Vec<Violation>> {
    let found: Vec<(Option<Uuid>, String)> = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(&scope.job_keys)
        .bind(scope.stale_after_seconds)
        .fetch_all(&mut *conn)
        .await?;
    Ok(found
        .into_iter()
        .map(|(run_id, detail)| Violation {
            rule,
            run_id,
            detail,
        })
        .collect())
}

/// Runs every rule; `$1` is the job-key filter, `$2` the staleness threshold.
pub async fn check(conn: &mut PgConnection, scope: &Scope) -> sqlx::Result<Report> {
    const RUNS: &str = "(SELECT * FROM nifi_ops.load_run WHERE cardinality($1::text[]) = 0 OR job_key = ANY($1::text[]))";
    let active = ACTIVE
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(",");
    let rules: Vec<(&'static str, String)> = vec![
        (
            "one_active_run_per_key",
            format!(
                "SELECT NULL::uuid, job_key || '/' || business_key || ': ' || count(*) || ' active runs' FROM {RUNS} r \
              WHERE status IN ({active}) AND $2::float8 IS NOT NULL GROUP BY job_key, business_key HAVING count(*) > 1"
            ),
        ),
        (
            "success_is_complete",
            format!(
                "SELECT r.run_id, concat_ws('; ', \
                    CASE WHEN p.not_success > 0 THEN p.not_success || ' partitions not SUCCESS' END, \
                    CASE WHEN p.rows IS DISTINCT FROM r.source_count THEN 'partition rows ' || coalesce(p.rows::text, 'none') || ' <> source ' || coalesce(r.source_count::text, 'null') END, \
                    CASE WHEN r.extracted_count IS DISTINCT FROM r.source_count THEN 'extracted ' || r.extracted_count || ' <> source ' || coalesce(r.source_count::text, 'null') END, \
                    CASE WHEN d.validates <> 1 THEN d.validates || ' VALIDATE_RUN rows' END, \
                    CASE WHEN e.starts <> 1 THEN e.starts || ' validation starts' END) \
               FROM {RUNS} r \
               CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE status <> 'SUCCESS') AS not_success, sum(actual_row_count) AS rows \
                                     FROM nifi_ops.load_partition WHERE run_id = r.run_id) p \
               CROSS JOIN LATERAL (SELECT count(*) AS validates FROM nifi_ops.load_dispatch WHERE run_id = r.run_id AND dispatch_type = 'VALIDATE_RUN') d \
               CROSS JOIN LATERAL (SELECT count(*) AS starts FROM nifi_ops.load_event WHERE run_id = r.run_id AND event_name = 'STAGE_VALIDATION_STARTED') e \
              WHERE r.status = 'SUCCESS' AND $2::float8 IS NOT NULL \
                AND (p.not_success > 0 OR p.rows IS DISTINCT FROM r.source_count OR r.extracted_count IS DISTINCT FROM r.source_count \
                     OR d.validates <> 1 OR e.starts <> 1)"
            ),
        ),
        (
            "one_owner_per_claim",
            format!(
                "SELECT p.run_id, 'partition ' || p.partition_id || ': ' || c.claims || ' claims, ' || c.attempts || ' distinct attempts, attempt_count ' || p.attempt_count \
               FROM nifi_ops.load_partition p JOIN {RUNS} r USING (run_id) \
               CROSS JOIN LATERAL (SELECT count(*) AS claims, count(DISTINCT details->>'attempt') AS attempts FROM nifi_ops.load_event e \
                                    WHERE e.run_id = p.run_id AND e.partition_id = p.partition_id AND e.event_name = 'PARTITION_STARTED') c \
              WHERE $2::float8 IS NOT NULL AND (c.claims <> c.attempts OR c.claims <> p.attempt_count)"
            ),
        ),
        (
            "explained_state",
            format!(
                "SELECT r.run_id, r.status || ' since ' || r.heartbeat_at || ' with no DEAD dispatch' FROM {RUNS} r \
              WHERE r.status IN ({active}) AND r.status <> 'PUBLISH_UNKNOWN' \
                AND r.heartbeat_at < clock_timestamp() - make_interval(secs => $2::float8) \
                AND NOT EXISTS (SELECT 1 FROM nifi_ops.load_dispatch d WHERE d.run_id = r.run_id AND d.status = 'DEAD')"
            ),
        ),
        (
            "terminal_is_final",
            format!(
                "SELECT r.run_id, r.status || CASE WHEN r.completed_at IS NULL THEN ' without completed_at' \
                    ELSE ': ' || x.after || ' progress events after its end, ' || x.endings || ' endings' END \
               FROM {RUNS} r \
               CROSS JOIN LATERAL ( \
                 SELECT count(*) FILTER (WHERE e.event_name IN ('RUN_SUCCESS','RUN_FAILED','RUN_CANCELLED','RUN_TIMED_OUT','MANIFEST_INVALID') \
                                            OR (e.event_name = 'PUBLISH_UNKNOWN_RESOLVED' AND e.details->>'resolution' = 'FAILED_PUBLISH')) AS endings, \
                        count(*) FILTER (WHERE e.event_name IN ('PARTITION_STARTED','PARTITION_SUCCESS','EXTRACT_VALIDATED','STAGE_VALIDATION_STARTED', \
                                                                'STAGE_VALIDATED','PUBLISH_STARTED','PUBLISH_FINISHED') \
                                           AND e.event_time > r.completed_at) AS after \
                   FROM nifi_ops.load_event e WHERE e.run_id = r.run_id) x \
              WHERE r.status NOT IN ({active}) AND $2::float8 IS NOT NULL \
                AND (r.completed_at IS NULL OR x.after > 0 OR x.endings > 1)"
            ),
        ),
        (
            "one_publish_claim",
            format!(
                "SELECT r.run_id, count(*) || ' publish claims' FROM {RUNS} r JOIN nifi_ops.load_event e ON e.run_id = r.run_id \
              WHERE e.event_name = 'PUBLISH_STARTED' AND $2::float8 IS NOT NULL GROUP BY r.run_id HAVING count(*) > 1"
            ),
        ),
        (
            "counts_match_partitions",
            format!(
                "SELECT r.run_id, concat_ws('; ', \
                    CASE WHEN r.status <> 'EXTRACTING' AND r.success_partition_count <> p.success THEN 'success_partition_count ' || r.success_partition_count || ' <> ' || p.success || ' SUCCESS rows' END, \
                    CASE WHEN r.failed_partition_count <> p.failed THEN 'failed_partition_count ' || r.failed_partition_count || ' <> ' || p.failed || ' FAILED rows' END, \
                    CASE WHEN p.total > 0 AND r.expected_partition_count IS DISTINCT FROM p.total THEN 'expected_partition_count ' || coalesce(r.expected_partition_count::text, 'null') || ' <> ' || p.total || ' rows' END, \
                    CASE WHEN r.extract_completed_at IS NOT NULL AND r.extracted_count <> p.rows THEN 'extracted_count ' || r.extracted_count || ' <> ' || p.rows || ' partition rows' END, \
                    CASE WHEN r.extract_completed_at IS NULL AND r.extracted_count <> 0 THEN 'extracted_count ' || r.extracted_count || ' before completion' END) \
               FROM {RUNS} r \
               CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE status = 'SUCCESS') AS success, count(*) FILTER (WHERE status = 'FAILED') AS failed, \
                                          count(*) AS total, coalesce(sum(actual_row_count) FILTER (WHERE status = 'SUCCESS'), 0) AS rows \
                                     FROM nifi_ops.load_partition WHERE run_id = r.run_id) p \
              WHERE $2::float8 IS NOT NULL AND ((r.status <> 'EXTRACTING' AND r.success_partition_count <> p.success) OR r.failed_partition_count <> p.failed \
                 OR (p.total > 0 AND r.expected_partition_count IS DISTINCT FROM p.total) \
                 OR (r.extract_completed_at IS NOT NULL AND r.extracted_count <> p.rows) \
                 OR (r.extract_completed_at IS NULL AND r.extracted_count <> 0))"
            ),
        ),
    ];
    let mut report = Report::default();
    for (rule, sql) in rules {
        report
            .violations
            .extend(rows(conn, scope, rule, &sql).await?);
    }
    let counts: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT status, count(*) FROM {RUNS} r WHERE $2::float8 IS NOT NULL GROUP BY status"
    )))
    .bind(&scope.job_keys)
    .bind(scope.stale_after_seconds)
    .fetch_all(&mut *conn)
    .await?;
    report.runs = counts.iter().map(|(_, n)| n).sum();
    report.by_status = counts.into_iter().collect();
    Ok(report)
}

/// Effects nifi-sim was told of (its summary's `acknowledged`) that the ledger does not have: each
/// one a lost acknowledged write (e.g. a failover onto a standby that had not received it).
pub async fn lost_acknowledgements(
    conn: &mut PgConnection,
    acknowledged: &[serde_json::Value],
) -> sqlx::Result<Vec<String>> {
    let mut lost = vec![];
    for a in acknowledged {
        let run = a["runId"]
            .as_str()
            .and_then(|r| uuid::Uuid::parse_str(r).ok());
        let Some(run) = run else {
            lost.push(format!("unreadable acknowledgement {a}"));
            continue;
        };
        let status: Option<(String,)> =
            sqlx::query_as("SELECT status FROM nifi_ops.load_run WHERE run_id = $1")
                .bind(run)
                .fetch_optional(&mut *conn)
                .await?;
        let status = status.map(|s| s.0);
        let kept = match (a["kind"].as_str().unwrap_or(""), status.as_deref()) {
            (_, None) => false,
            ("created", Some(_)) => true,
            ("chunk", Some(_)) => {
                let (n,): (i64,) = sqlx::query_as(
                    "SELECT count(*) FROM nifi_ops.load_file WHERE run_id = $1 AND partition_id = $2 AND chunk_index = $3",
                )
                .bind(run)
                .bind(a["partitionId"].as_str().unwrap_or(""))
                .bind(a["chunkIndex"].as_i64().unwrap_or(-1) as i32)
                .fetch_one(&mut *conn)
                .await?;
                n == 1
            }
            ("stage_validated", Some(s)) => !matches!(
                s,
                "CREATED" | "EXTRACTING" | "EXTRACTED_VALIDATED" | "STAGE_VALIDATING"
            ),
            ("publish_claimed", Some(s)) => matches!(
                s,
                "PUBLISHING"
                    | "PUBLISHED"
                    | "SUCCESS"
                    | "FAILED_PUBLISH"
                    | "PUBLISH_UNKNOWN"
                    | "FAILED_TARGET_VALIDATION"
            ),
            ("final", Some(s)) => a["status"].as_str() == Some(s),
            _ => false,
        };
        if !kept {
            lost.push(format!("{a} (ledger: {status:?})"));
        }
    }
    Ok(lost)
}

//! Expected answers of the reads (CONTRACT §4.4, §4.5, §4.18, §4.21, §4.22), computed from the
//! model's rows (timestamps as learned from the ledger, written as §3.4 says).
use super::compare::{Cell, Row, Ts, api_time};
use super::model::*;
use super::ops_run::{Ctx, not_found};
use super::request::{Op, Target};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

fn t(row: &Row, col: &str) -> Value {
    match row.get(col) {
        Some(Cell::Ts(Ts::At(x))) => json!(api_time(*x)),
        _ => Value::Null,
    }
}

/// End time (§2.7): `COALESCE(completed_at, heartbeat_at)`.
fn end_time(row: &Row) -> Option<DateTime<Utc>> {
    row.time("completed_at").or(row.time("heartbeat_at"))
}

impl Model {
    pub(super) fn apply_read(&self, op: &Op, ctx: &Ctx) -> Option<Expected> {
        let run = |target: &Target| match target {
            Target::Run(i) => Some(&self.runs[*i]),
            Target::Missing(_) => None,
        };
        Some(match op {
            Op::GetRun(target, _) => match run(target) {
                None => not_found("RUN_NOT_FOUND", ctx),
                Some(rs) => ok(detail(rs)),
            },
            Op::ListRuns {
                business_key,
                status,
                limit,
                ..
            } => {
                let mut runs: Vec<&RunState> = self
                    .runs
                    .iter()
                    .filter(|r| {
                        business_key
                            .as_ref()
                            .is_none_or(|b| r.row.text("business_key").as_ref() == Some(b))
                    })
                    .filter(|r| status.as_ref().is_none_or(|s| &r.status() == s))
                    .collect();
                runs.sort_by_key(|r| std::cmp::Reverse(r.row.time("started_at")));
                runs.truncate(limit.unwrap_or(50) as usize);
                ok(Value::Array(runs.into_iter().map(summary).collect()))
            }
            Op::Events(target, limit) => match run(target) {
                None => not_found("RUN_NOT_FOUND", ctx),
                Some(rs) => {
                    let mut ev: Vec<&Row> = rs.events.iter().collect();
                    ev.sort_by_key(|e| (e.time("event_time"), e.text("event_id")));
                    let keep = limit.unwrap_or(200) as usize;
                    let ev = &ev[ev.len().saturating_sub(keep)..];
                    ok(
                        json!({"events": ev.iter().map(|e| json!({"eventTime": t(e, "event_time"),
                        "level": e.val("event_level"), "name": e.val("event_name"), "partitionId": e.val("partition_id"),
                        "processGroup": e.val("process_group"), "errorCode": e.val("error_code"),
                        "message": e.val("message"), "details": e.val("details")})).collect::<Vec<_>>()}),
                    )
                }
            },
            Op::GetValidations(target) => match run(target) {
                None => not_found("RUN_NOT_FOUND", ctx),
                Some(rs) => {
                    let rank = |s: &str| {
                        ["SOURCE", "STAGING", "TARGET"]
                            .iter()
                            .position(|x| *x == s)
                            .unwrap_or(3)
                    };
                    let mut v: Vec<&Row> = rs.validations.iter().map(|(r, _)| r).collect();
                    v.sort_by_key(|r| {
                        (
                            rank(&r.text("stage").unwrap_or_default()),
                            r.text("metric_name"),
                            r.text("query_version"),
                        )
                    });
                    ok(
                        json!({"metrics": v.iter().map(|r| json!({"stage": r.val("stage"),
                        "metricName": r.val("metric_name"), "expectedValue": r.val("expected_value"),
                        "actualValue": r.val("actual_value"), "result": r.val("result"),
                        "measuredAt": t(r, "measured_at"), "queryVersion": r.val("query_version")})).collect::<Vec<_>>()}),
                    )
                }
            },
            Op::CleanupCandidates { limit, .. } => {
                let mut due: Vec<&RunState> = self.runs.iter().filter(|r| self.due(r)).collect();
                due.sort_by_key(|r| (end_time(&r.row), r.id.to_string()));
                // Effective limit: min(limit, cleanup.max_batch = 200).
                due.truncate(limit.unwrap_or(50).min(200) as usize);
                ok(
                    json!({"runs": due.iter().map(|r| json!({"runId": r.id.to_string(),
                    "jobKey": r.row.val("job_key"), "businessKey": r.row.val("business_key"),
                    "status": r.status(), "hdfsRunPath": r.row.val("hdfs_run_path"),
                    "stageTable": r.row.val("stage_table_name"),
                    "completedAt": end_time(&r.row).map(api_time)})).collect::<Vec<_>>()}),
                )
            }
            _ => return None,
        })
    }
}

/// §4.5. `successPartitionCount` is the count of SUCCESS rows (exact in the column too once the
/// run has left EXTRACTING, §5.4).
fn detail(rs: &RunState) -> Value {
    let r = &rs.row;
    let mut counts = serde_json::Map::new();
    for p in rs.partitions.values() {
        let s = p.text("status").unwrap_or_default();
        let n = counts.get(&s).and_then(Value::as_i64).unwrap_or(0);
        counts.insert(s, json!(n + 1));
    }
    let partitions: Vec<Value> = rs
        .partitions
        .values()
        .map(|p| {
            json!({"partitionId": p.val("partition_id"), "status": p.val("status"),
                "expectedRowCount": p.val("expected_row_count"), "actualRowCount": p.val("actual_row_count"),
                "fileCount": p.val("file_count"), "attemptCount": p.val("attempt_count"),
                "workerNode": p.val("worker_node"), "errorCode": p.val("error_code")})
        })
        .collect();
    let dispatches: Vec<Value> = rs
        .dispatches
        .iter()
        .map(|d| {
            json!({"dispatchId": d.val("dispatch_id"), "dispatchType": d.val("dispatch_type"),
                "partitionId": d.val("partition_id"), "status": d.val("status"),
                "attemptCount": d.val("attempt_count"), "sentAt": t(d, "sent_at"), "ackedAt": t(d, "acked_at")})
        })
        .collect();
    json!({"runId": rs.id.to_string(), "jobKey": r.val("job_key"), "businessKey": r.val("business_key"),
        "status": rs.status(), "snapshotScn": r.val("snapshot_scn"), "sourceCount": r.val("source_count"),
        "expectedPartitionCount": r.val("expected_partition_count"), "successPartitionCount": rs.success_rows(),
        "failedPartitionCount": r.val("failed_partition_count"), "extractedCount": r.val("extracted_count"),
        "stagingCount": r.val("staging_count"), "targetCount": r.val("target_count"),
        "hdfsRunPath": r.val("hdfs_run_path"), "stageTable": r.val("stage_table_name"),
        "startedAt": t(r, "started_at"), "heartbeatAt": t(r, "heartbeat_at"),
        "extractCompletedAt": t(r, "extract_completed_at"), "completedAt": t(r, "completed_at"),
        "errorStage": r.val("error_stage"), "errorCode": r.val("error_code"), "errorMessage": r.val("error_message"),
        "partitionCounts": counts, "partitions": partitions, "dispatches": dispatches})
}

/// §4.4 list item.
fn summary(rs: &RunState) -> Value {
    let r = &rs.row;
    json!({"runId": rs.id.to_string(), "jobKey": r.val("job_key"), "businessKey": r.val("business_key"),
        "status": rs.status(), "sourceCount": r.val("source_count"), "extractedCount": r.val("extracted_count"),
        "stagingCount": r.val("staging_count"), "targetCount": r.val("target_count"),
        "expectedPartitionCount": r.val("expected_partition_count"), "successPartitionCount": rs.success_rows(),
        "failedPartitionCount": r.val("failed_partition_count"), "startedAt": t(r, "started_at"),
        "heartbeatAt": t(r, "heartbeat_at"), "completedAt": t(r, "completed_at"), "errorCode": r.val("error_code")})
}

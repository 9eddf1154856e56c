//! Expected effects after the extraction (CONTRACT §4.9–4.17, §4.19): validation start and
//! metrics, the stage and target judgements, the publish, and the operator actions.
use super::compare::Cell;
use super::model::*;
use super::ops_run::{Ctx, not_found, status_mismatch, with_aborted_details};
use super::request::{MetricReq, Op, Opt, Target};
use serde_json::{Map, Value, json};
use uuid::Uuid;

fn numeric(v: &Value) -> Option<i64> {
    v.as_str()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
}

/// §5.5: NO_METRICS, or one `FAIL <name>` per failing row ordered by name then query version.
fn judge(rs: &RunState, stage: &str) -> Vec<String> {
    let rows = rs.metrics_of(stage);
    if rows.is_empty() {
        return vec!["NO_METRICS".into()];
    }
    let mut fails: Vec<(String, String)> = rows
        .iter()
        .filter(|r| r.text("result").as_deref() == Some("FAIL"))
        .map(|r| {
            (
                r.text("metric_name").unwrap(),
                r.text("query_version").unwrap(),
            )
        })
        .collect();
    fails.sort();
    fails
        .into_iter()
        .map(|(n, _)| format!("FAIL {n}"))
        .collect()
}

/// The most recently measured actual value of metric `name` of `stage` (any query version).
fn latest(rs: &RunState, stage: &str, name: &str) -> Value {
    rs.metrics_of(stage)
        .into_iter()
        .rev()
        .find(|r| r.text("metric_name").as_deref() == Some(name))
        .map(|r| r.val("actual_value").clone())
        .unwrap_or(Value::Null)
}

impl Model {
    pub(super) fn apply_late(&mut self, op: &Op, ctx: &Ctx) -> Expected {
        let target = match op {
            Op::ValidationStart { run, .. }
            | Op::Validations { run, .. }
            | Op::StageValidated(run)
            | Op::PublishClaim(run, _)
            | Op::PublishResult { run, .. }
            | Op::Success(run, _)
            | Op::Resend(run, _)
            | Op::Resolve { run, .. }
            | Op::Cancel(run, _)
            | Op::Cleanup { run, .. } => *run,
            other => unreachable!("not a late operation: {other:?}"),
        };
        let Target::Run(i) = target else {
            return not_found("RUN_NOT_FOUND", ctx);
        };
        let operator = (self.operator_identity.clone(), "operator");
        let due = self.due(&self.runs[i]);
        let rs = &mut self.runs[i];
        let cur = rs.status();
        let run_id = rs.id.to_string();
        match op {
            Op::ValidationStart { dispatch, node, .. } => {
                let Some(d) = rs.dispatches.iter_mut().find(|d| {
                    d.text("dispatch_id").as_deref() == Some(&dispatch.to_string())
                        && d.text("dispatch_type").as_deref() == Some("VALIDATE_RUN")
                }) else {
                    return error(
                        409,
                        "DISPATCH_MISMATCH",
                        "DISPATCH_MISMATCH",
                        None,
                        ctx.request_id,
                    );
                };
                if d.text("status").as_deref() != Some("ACKED") {
                    d.put("status", "ACKED");
                    d.now("acked_at");
                }
                if cur != "EXTRACTED_VALIDATED" {
                    return ok(
                        json!({"started": false, "runStatus": cur, "jobKey": null, "businessKey": null,
                        "snapshotScn": null, "hdfsRunPath": null, "stageTable": null, "sourceCount": null,
                        "extractedCount": null, "sourceMetrics": {}}),
                    );
                }
                rs.change_status("STAGE_VALIDATING");
                let mut e = rs.event("STAGE_VALIDATION_STARTED", "INFO");
                e.put("details", json!({"dispatchId": dispatch.to_string(), "node": node.clone().unwrap_or_default()}));
                rs.push_event(e);
                let mut metrics = Map::new();
                for r in rs.metrics_of("SOURCE") {
                    metrics.insert(
                        r.text("metric_name").unwrap(),
                        r.val("actual_value").clone(),
                    );
                }
                let r = &rs.row;
                ok(
                    json!({"started": true, "runStatus": "STAGE_VALIDATING", "jobKey": r.val("job_key"),
                    "businessKey": r.val("business_key"), "snapshotScn": r.val("snapshot_scn"),
                    "hdfsRunPath": r.val("hdfs_run_path"), "stageTable": r.val("stage_table_name"),
                    "sourceCount": r.val("source_count"), "extractedCount": r.val("extracted_count"),
                    "sourceMetrics": metrics}),
                )
            }
            Op::Validations {
                stage,
                query_version,
                metrics,
                ..
            } => {
                let needed = if stage == "STAGING" {
                    "STAGE_VALIDATING"
                } else {
                    "PUBLISHED"
                };
                if cur != needed {
                    return error(
                        409,
                        "RUN_STATUS_MISMATCH",
                        "RUN_STATUS_MISMATCH",
                        Some(json!({"runStatus": cur, "stage": stage})),
                        ctx.request_id,
                    );
                }
                let qv = query_version.clone().unwrap_or_else(|| "v1".into());
                for m in metrics {
                    upsert_metric(rs, &run_id, stage, &qv, m, ctx.step);
                }
                rs.row.now("heartbeat_at");
                let fails: Vec<&str> = metrics
                    .iter()
                    .filter(|m| m.result == "FAIL")
                    .map(|m| m.name.as_str())
                    .collect();
                if !fails.is_empty() {
                    let mut e = rs.event(&format!("{stage}_METRIC_FAILED"), "WARN");
                    e.put("message", message_value(&fails.join(", ")));
                    rs.push_event(e);
                }
                ok(json!({"recorded": metrics.len(), "failCount": fails.len(), "runStatus": cur}))
            }
            Op::StageValidated(_) => {
                if cur == "STAGING_VALIDATED" {
                    return ok(json!({"stageValidated": true, "runStatus": cur, "reasons": []}));
                }
                if cur != "STAGE_VALIDATING" {
                    return ok(
                        json!({"stageValidated": false, "runStatus": cur, "reasons": [format!("RUN_STATUS {cur}")]}),
                    );
                }
                let reasons = judge(rs, "STAGING");
                if !reasons.is_empty() {
                    return ok(
                        json!({"stageValidated": false, "runStatus": cur, "reasons": reasons}),
                    );
                }
                let count = json!(numeric(&latest(rs, "STAGING", "STAGE_COUNT")));
                rs.change_status("STAGING_VALIDATED");
                rs.row.put("staging_count", count.clone());
                let mut e = rs.event("STAGE_VALIDATED", "INFO");
                e.put("row_count", count);
                rs.push_event(e);
                ok(json!({"stageValidated": true, "runStatus": "STAGING_VALIDATED", "reasons": []}))
            }
            Op::PublishClaim(_, token) => {
                if cur == "PUBLISHING" {
                    let same = rs.row.text("publish_token").as_deref() == Some(&token.to_string());
                    return ok(json!({"claimed": same, "runStatus": cur}));
                }
                if cur != "STAGING_VALIDATED" {
                    return ok(json!({"claimed": false, "runStatus": cur}));
                }
                rs.change_status("PUBLISHING");
                rs.row.put("publish_token", token.to_string());
                rs.row.now("publish_started_at");
                let mut e = rs.event("PUBLISH_STARTED", "INFO");
                e.put("details", json!({"publishToken": token.to_string()}));
                rs.push_event(e);
                ok(json!({"claimed": true, "runStatus": "PUBLISHING"}))
            }
            Op::PublishResult {
                token,
                outcome,
                error_code,
                message,
                ..
            } => {
                if rs.row.text("publish_token").as_deref() != Some(&token.to_string()) {
                    return error(
                        409,
                        "PUBLISH_TOKEN_MISMATCH",
                        "PUBLISH_TOKEN_MISMATCH",
                        None,
                        ctx.request_id,
                    );
                }
                if cur == *outcome {
                    return ok(json!({"runStatus": cur, "changed": false}));
                }
                if cur != "PUBLISHING" {
                    return status_mismatch(&cur, ctx);
                }
                let msg = message.clone().unwrap_or_default();
                rs.change_status(outcome);
                if outcome == "PUBLISHED" {
                    rs.row.now("published_at");
                    let mut e = rs.event("PUBLISH_FINISHED", "INFO");
                    e.put("message", message_value(&msg));
                    rs.push_event(e);
                } else {
                    let code = error_code
                        .value()
                        .cloned()
                        .unwrap_or_else(|| outcome.clone());
                    rs.row.put("error_stage", "PUBLISH");
                    rs.row.put("error_code", code.clone());
                    rs.row.put("error_message", message_value(&msg));
                    let (name, details) = if outcome == "FAILED_PUBLISH" {
                        let aborted = rs.end_effects(outcome, false);
                        (
                            "RUN_FAILED",
                            with_aborted_details(
                                json!({"stage": "PUBLISH", "from": "PUBLISHING", "to": outcome}),
                                aborted,
                            ),
                        )
                    } else {
                        ("PUBLISH_UNKNOWN", json!({}))
                    };
                    let mut e = rs.event(name, "ERROR");
                    e.put("error_code", code);
                    e.put("message", message_value(&msg));
                    e.put("details", details);
                    rs.push_event(e);
                }
                ok(json!({"runStatus": outcome, "changed": true}))
            }
            Op::Success(_, target) => {
                if cur == "SUCCESS" {
                    return ok(json!({"success": true, "runStatus": cur, "reasons": []}));
                }
                if cur != "PUBLISHED" {
                    return ok(
                        json!({"success": false, "runStatus": cur, "reasons": [format!("RUN_STATUS {cur}")]}),
                    );
                }
                let reasons = judge(rs, "TARGET");
                if !reasons.is_empty() {
                    return ok(json!({"success": false, "runStatus": cur, "reasons": reasons}));
                }
                let count = match target {
                    Opt::Some(n) => json!(n),
                    _ => json!(numeric(&latest(rs, "TARGET", "TARGET_COUNT"))),
                };
                rs.change_status("SUCCESS");
                rs.row.put("target_count", count.clone());
                rs.end_effects("SUCCESS", false);
                let mut e = rs.event("RUN_SUCCESS", "INFO");
                e.put("row_count", count);
                rs.push_event(e);
                ok(json!({"success": true, "runStatus": "SUCCESS", "reasons": []}))
            }
            Op::Resend(_, dispatch) => {
                let Some(pos) = rs
                    .dispatches
                    .iter()
                    .position(|d| d.text("dispatch_id").as_deref() == Some(&dispatch.to_string()))
                else {
                    return not_found("DISPATCH_NOT_FOUND", ctx);
                };
                let d = &mut rs.dispatches[pos];
                let prev = d.text("status").unwrap_or_default();
                if prev != "DEAD" && prev != "SENT" {
                    return error(
                        409,
                        "DISPATCH_STATUS_MISMATCH",
                        "DISPATCH_STATUS_MISMATCH",
                        Some(json!({"status": prev})),
                        ctx.request_id,
                    );
                }
                d.put("status", "PENDING");
                d.put("attempt_count", 0);
                d.now("next_attempt_at");
                d.put("last_error", Value::Null);
                let pid = d.val("partition_id").clone();
                let mut e = rs.event("DISPATCH_RESENT", "WARN");
                e.put("partition_id", pid);
                e.put(
                    "details",
                    json!({"dispatchId": dispatch.to_string(), "previousStatus": prev,
                    "operator": operator.0, "operatorRole": operator.1}),
                );
                rs.push_event(e);
                ok(json!({"dispatchId": dispatch.to_string(), "status": "PENDING"}))
            }
            Op::Resolve {
                resolution, reason, ..
            } => {
                if cur == *resolution {
                    return ok(json!({"runStatus": cur, "changed": false}));
                }
                if cur != "PUBLISH_UNKNOWN" {
                    return status_mismatch(&cur, ctx);
                }
                rs.change_status(resolution);
                if resolution == "PUBLISHED" {
                    rs.row.now("published_at");
                    for c in ["error_stage", "error_code", "error_message"] {
                        rs.row.put(c, Value::Null);
                    }
                } else {
                    rs.row.put("error_code", "PUBLISH_UNKNOWN_RESOLVED");
                    rs.row.put("error_message", message_value(reason));
                    rs.end_effects(resolution, false);
                }
                let mut e = rs.event("PUBLISH_UNKNOWN_RESOLVED", "WARN");
                e.put("message", message_value(reason));
                e.put("details", json!({"resolution": resolution, "operatorRole": operator.1, "operator": operator.0}));
                rs.push_event(e);
                ok(json!({"runStatus": resolution, "changed": true}))
            }
            Op::Cancel(_, reason) => {
                if cur == "CANCELLED" {
                    return ok(json!({"runId": run_id, "runStatus": cur, "changed": false}));
                }
                if ![
                    "CREATED",
                    "EXTRACTING",
                    "EXTRACTED_VALIDATED",
                    "STAGE_VALIDATING",
                    "STAGING_VALIDATED",
                ]
                .contains(&cur.as_str())
                {
                    return status_mismatch(&cur, ctx);
                }
                rs.change_status("CANCELLED");
                rs.row.put("error_stage", "CANCEL");
                rs.row.put("error_code", "RUN_CANCELLED");
                rs.row.put("error_message", message_value(reason));
                let aborted = rs.end_effects("CANCELLED", true);
                let mut e = rs.event("RUN_CANCELLED", "WARN");
                e.put("message", message_value(reason));
                e.put(
                    "details",
                    with_aborted_details(
                        json!({"from": cur, "operator": operator.0, "operatorRole": operator.1}),
                        aborted,
                    ),
                );
                rs.push_event(e);
                ok(json!({"runId": run_id, "runStatus": "CANCELLED", "changed": true}))
            }
            Op::Cleanup {
                dropped,
                deleted,
                operator: as_operator,
                ..
            } => {
                if !matches!(rs.row.get("cleaned_at"), Some(Cell::Val(Value::Null))) {
                    return ok(json!({"runStatus": cur, "changed": false}));
                }
                if !due {
                    return error(
                        409,
                        "CLEANUP_NOT_DUE",
                        "CLEANUP_NOT_DUE",
                        Some(json!({"runStatus": cur})),
                        ctx.request_id,
                    );
                }
                rs.row.now("cleaned_at");
                let text = |o: &Opt<String>| json!(o.value());
                let mut details =
                    json!({"droppedTable": text(dropped), "deletedPath": text(deleted)});
                if *as_operator {
                    details["operator"] = json!(operator.0);
                    details["operatorRole"] = json!(operator.1);
                }
                let mut e = rs.event("RUN_CLEANED", "INFO");
                e.put("details", details);
                rs.push_event(e);
                ok(json!({"runStatus": cur, "changed": true}))
            }
            other => unreachable!("not a late operation: {other:?}"),
        }
    }
}

/// UPSERT on `uq_load_validation_metric` (§4.10): the row keeps its identity, every other
/// value is overwritten and `measured_at` is now.
fn upsert_metric(
    rs: &mut RunState,
    run_id: &str,
    stage: &str,
    qv: &str,
    m: &MetricReq,
    step: usize,
) {
    let pos = rs.validations.iter().position(|(r, _)| {
        r.text("stage").as_deref() == Some(stage)
            && r.text("metric_name").as_deref() == Some(&m.name)
            && r.text("query_version").as_deref() == Some(qv)
    });
    let mut row = match pos {
        Some(p) => rs.validations.remove(p).0,
        None => {
            let mut v = blank(&VALIDATION_COLS);
            v.insert("validation_id", Cell::NewSerial);
            v.put("run_id", run_id);
            v.put("stage", stage);
            v.put("metric_name", m.name.clone());
            v.put("query_version", qv);
            v
        }
    };
    row.put("expected_value", json!(m.expected.value()));
    row.put("actual_value", json!(m.actual.value()));
    row.put("tolerance", json!(m.tolerance.value()));
    row.put("result", m.result.clone());
    row.put("details", m.details.clone().unwrap_or_else(|| json!({})));
    row.now("measured_at");
    rs.validations.push((row, step));
}

/// A random id no run has (for the 404 paths).
pub fn missing_id(u: Uuid) -> Target {
    Target::Missing(u)
}

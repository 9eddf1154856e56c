//! Expected effects of the run-level operations (CONTRACT §4.1–4.3, §4.9–4.17, §4.19): the
//! answer, and the rows the model changes (only when the contract says the change commits).
use super::compare::{Cell, Diff, is_uuid_v4};
use super::manifest_rules::{self, canonical, is_null_partition};
use super::model::*;
use super::request::{ManifestReq, Op, Opt, Request, Target};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

/// What the model may read from the real answer: generated values it cannot know (the runId
/// of a created run), and the request id it sent.
pub struct Ctx<'a> {
    pub actual: &'a Value,
    pub request_id: &'a str,
    pub step: usize,
}

const FAIL_PAIRS: [(&str, &str); 5] = [
    ("CREATED", "FAILED_MANIFEST"),
    ("EXTRACTING", "FAILED_EXTRACT"),
    ("STAGE_VALIDATING", "FAILED_STAGE_VALIDATION"),
    ("STAGING_VALIDATED", "FAILED_PUBLISH"),
    ("PUBLISHED", "FAILED_TARGET_VALIDATION"),
];

fn mismatch(status: &str, ctx: &Ctx) -> Expected {
    error(
        409,
        "RUN_STATUS_MISMATCH",
        "RUN_STATUS_MISMATCH",
        Some(json!({"runStatus": status})),
        ctx.request_id,
    )
}

pub fn not_found(code: &str, ctx: &Ctx) -> Expected {
    error(404, code, code, None, ctx.request_id)
}

fn with_aborted(mut details: Value, aborted: i64) -> Value {
    if aborted > 0 {
        details["abortedPartitions"] = json!(aborted);
    }
    details
}

impl Model {
    pub fn index(&self, t: Target) -> Option<usize> {
        match t {
            Target::Run(i) => Some(i),
            Target::Missing(_) => None,
        }
    }

    /// The expected answer to `req`, with the model's rows changed as the contract says.
    pub fn apply(&mut self, req: &Request, ctx: &Ctx) -> Result<Expected, Diff> {
        let op = &req.op;
        if let Some(e) = self.apply_extract(op, ctx) {
            return Ok(e);
        }
        if let Some(e) = self.apply_read(op, ctx) {
            return Ok(e);
        }
        match op {
            Op::Create {
                job,
                business_key,
                hdfs_root,
                prefix,
                allow_empty,
                parameters,
            } => self.create(
                job,
                business_key,
                hdfs_root,
                prefix,
                *allow_empty,
                parameters,
                ctx,
            ),
            Op::RunFail {
                run,
                expected,
                fail,
                stage,
                code,
                message,
            } => Ok(self.run_fail(*run, expected, fail, stage, code, message, ctx)),
            Op::Manifest(run, m) => Ok(self.manifest(*run, m, ctx)),
            _ => Ok(self.apply_late(op, ctx)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &mut self,
        job: &str,
        bk: &str,
        root: &str,
        prefix: &str,
        allow_empty: Option<bool>,
        parameters: &Option<Map<String, Value>>,
        ctx: &Ctx,
    ) -> Result<Expected, Diff> {
        let invalid = || {
            error(
                422,
                "INVALID_HDFS_ROOT",
                "INVALID_HDFS_ROOT",
                None,
                ctx.request_id,
            )
        };
        if root.split('/').any(|s| s == "..") {
            return Ok(invalid());
        }
        // [v1-ext] hdfsRoot normalisation: repeated '/' collapsed, trailing '/' removed.
        let norm: String = root
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| format!("/{s}"))
            .collect();
        if norm.len() + job.len() + "/run_id=".len() + 37 > 1000 {
            return Ok(invalid());
        }
        let dup = self
            .runs
            .iter()
            .any(|r| r.row.text("business_key").as_deref() == Some(bk) && is_active(&r.status()));
        if dup {
            return Ok(error(
                409,
                "DUPLICATE_ACTIVE_RUN",
                "DUPLICATE_ACTIVE_RUN",
                Some(json!({"jobKey": job, "businessKey": bk})),
                ctx.request_id,
            ));
        }
        let id = match ctx.actual.get("runId").and_then(Value::as_str) {
            Some(s) if is_uuid_v4(s) && !self.runs.iter().any(|r| r.id.to_string() == s) => {
                uuid::Uuid::parse_str(s).unwrap()
            }
            other => {
                return Err(Diff::new(
                    "$.runId",
                    "a new lower-case uuid v4",
                    format!("{other:?}"),
                ));
            }
        };
        let path = format!("{norm}/{job}/run_id={id}");
        let stage = format!("{prefix}{}", id.simple()).to_lowercase();
        let mut params = parameters.clone().unwrap_or_default();
        params.insert(
            "allowEmptySource".into(),
            json!(allow_empty.unwrap_or(false)),
        );
        let mut row = blank(&RUN_COLS);
        row.put("run_id", id.to_string());
        row.put("job_key", job);
        row.put("business_key", bk);
        row.put("status", "CREATED");
        for c in [
            "success_partition_count",
            "failed_partition_count",
            "extracted_count",
            "version_no",
        ] {
            row.put(c, 0);
        }
        row.put("hdfs_run_path", path.clone());
        row.put("stage_table_name", stage.clone());
        row.put("parameters", Value::Object(params));
        row.now("started_at");
        row.now("heartbeat_at");
        let mut rs = RunState {
            id,
            row,
            partitions: Default::default(),
            files: Default::default(),
            validations: vec![],
            dispatches: vec![],
            events: vec![],
        };
        let e = rs.event("RUN_STARTED", "INFO");
        rs.push_event(e);
        self.runs.push(rs);
        Ok(ok(
            json!({"runId": id.to_string(), "status": "CREATED", "hdfsRunPath": path, "stageTable": stage}),
        ))
    }

    fn manifest(&mut self, t: Target, m: &ManifestReq, ctx: &Ctx) -> Expected {
        let Some(i) = self.index(t) else {
            return not_found("RUN_NOT_FOUND", ctx);
        };
        let rs = &mut self.runs[i];
        let status = rs.status();
        if status != "CREATED" {
            let ids: BTreeSet<&String> = m.partitions.iter().map(|p| &p.partition_id).collect();
            let stored: BTreeSet<&String> = rs.partitions.keys().collect();
            if !stored.is_empty()
                && ids == stored
                && rs.row.int("source_count") == Some(m.source_count)
            {
                let dispatch: Vec<Value> = rs
                    .partitions
                    .values()
                    .filter(|p| p.int("expected_row_count") > Some(0))
                    .map(|p| {
                        json!({"partitionId": p.val("partition_id"), "lowerBound": p.val("lower_bound"),
                            "upperBound": p.val("upper_bound"), "upperInclusive": p.val("upper_inclusive"),
                            "isNullPartition": p.val("is_null_partition"), "expectedRowCount": p.val("expected_row_count")})
                    })
                    .collect();
                let empty = rs.partitions.len() - dispatch.len();
                return ok(
                    json!({"runId": rs.id.to_string(), "status": status, "dispatchPartitions": dispatch,
                    "emptyPartitionCount": empty, "validationScheduled": false}),
                );
            }
            return mismatch(&status, ctx);
        }
        let allow = rs.row.val("parameters")["allowEmptySource"]
            .as_bool()
            .unwrap_or(false);
        let violations = manifest_rules::violations(m, allow);
        if !violations.is_empty() {
            let text = violations.join("; ");
            rs.change_status("FAILED_MANIFEST");
            rs.row.put("error_stage", "MANIFEST");
            rs.row.put("error_code", "MANIFEST_INVALID");
            rs.row.put("error_message", message_value(&text));
            rs.end_effects("FAILED_MANIFEST", false);
            let mut e = rs.event("MANIFEST_INVALID", "ERROR");
            e.put("error_code", "MANIFEST_INVALID");
            e.put("message", message_value(&text));
            rs.push_event(e);
            return error(
                422,
                "MANIFEST_INVALID",
                &text,
                Some(json!({"violations": violations})),
                ctx.request_id,
            );
        }
        let run_id = rs.id.to_string();
        let mut empty = 0;
        for p in &m.partitions {
            let mut row = blank(&PARTITION_COLS);
            row.put("run_id", run_id.clone());
            row.put("partition_id", p.partition_id.clone());
            row.put("lower_bound", json!(canonical(&p.lower)));
            row.put("upper_bound", json!(canonical(&p.upper)));
            row.put("upper_inclusive", p.upper_inclusive.unwrap_or(false));
            row.put("is_null_partition", is_null_partition(p));
            row.put("expected_row_count", p.expected);
            row.put("attempt_count", 0);
            if p.expected == 0 {
                empty += 1;
                row.put("status", "SUCCESS");
                row.put("actual_row_count", 0);
                row.put("file_count", 0);
                row.put("fragment_count", 0);
                row.now("completed_at");
            } else {
                row.put("status", "PENDING");
            }
            rs.partitions.insert(p.partition_id.clone(), row);
        }
        let scn = canonical(&m.snapshot_scn);
        rs.change_status("EXTRACTING");
        let r = &mut rs.row;
        r.put("snapshot_scn", json!(scn));
        r.put("source_count", m.source_count);
        r.put(
            "source_null_split_count",
            m.source_null_split_count.unwrap_or(0),
        );
        r.put("source_min_split", json!(canonical(&m.source_min_split)));
        r.put("source_max_split", json!(canonical(&m.source_max_split)));
        r.put("expected_partition_count", m.partitions.len() as i64);
        let version = m
            .source_metrics_version
            .clone()
            .unwrap_or_else(|| "v1".into());
        let mut metrics = vec![("SOURCE_COUNT".to_string(), m.source_count.to_string())];
        for (k, v) in m.source_metrics.iter().flatten() {
            // [v1-ext] an entry named SOURCE_COUNT is ignored: the computed row stands.
            if k != "SOURCE_COUNT" {
                metrics.push((k.clone(), v.clone()));
            }
        }
        for (name, value) in metrics {
            let mut v = blank(&VALIDATION_COLS);
            v.insert("validation_id", Cell::NewSerial);
            v.put("run_id", run_id.clone());
            v.put("stage", "SOURCE");
            v.put("metric_name", name);
            v.put("actual_value", value);
            v.put("result", "PASS");
            v.put("query_version", version.clone());
            v.put("details", json!({}));
            v.now("measured_at");
            rs.validations.push((v, ctx.step));
        }
        let mut e = rs.event("MANIFEST_CREATED", "INFO");
        e.put("row_count", m.source_count);
        e.put(
            "details",
            json!({"partitions": m.partitions.len(), "empty": empty, "snapshotScn": scn}),
        );
        rs.push_event(e);
        let all_empty = m.partitions.iter().all(|p| p.expected == 0);
        if all_empty {
            complete(rs);
        }
        let dispatch: Vec<Value> = m
            .partitions
            .iter()
            .filter(|p| p.expected > 0)
            .map(|p| {
                let text = |d: &Opt<super::request::Decimal>| json!(d.value().map(|d| d.text.clone()));
                json!({"partitionId": p.partition_id, "lowerBound": text(&p.lower), "upperBound": text(&p.upper),
                    "upperInclusive": p.upper_inclusive.unwrap_or(false), "isNullPartition": is_null_partition(p),
                    "expectedRowCount": p.expected})
            })
            .collect();
        ok(
            json!({"runId": run_id, "status": rs.status(), "dispatchPartitions": dispatch,
            "emptyPartitionCount": empty, "validationScheduled": all_empty}),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn run_fail(
        &mut self,
        t: Target,
        expected: &str,
        fail: &str,
        stage: &str,
        code: &str,
        message: &Option<String>,
        ctx: &Ctx,
    ) -> Expected {
        if !FAIL_PAIRS.contains(&(expected, fail)) {
            return error(
                422,
                "FAIL_TRANSITION_NOT_ALLOWED",
                "FAIL_TRANSITION_NOT_ALLOWED",
                Some(json!({"expectedStatus": expected, "failStatus": fail})),
                ctx.request_id,
            );
        }
        let Some(i) = self.index(t) else {
            return not_found("RUN_NOT_FOUND", ctx);
        };
        let rs = &mut self.runs[i];
        let cur = rs.status();
        if cur == fail {
            return ok(json!({"runId": rs.id.to_string(), "runStatus": cur, "changed": false}));
        }
        if cur != expected {
            return mismatch(&cur, ctx);
        }
        let msg = message.clone().unwrap_or_default();
        rs.change_status(fail);
        rs.row.put("error_stage", cut(stage, 80));
        rs.row.put("error_code", code);
        rs.row.put("error_message", message_value(&msg));
        let aborted = rs.end_effects(fail, false);
        let mut e = rs.event("RUN_FAILED", "ERROR");
        e.put("error_code", code);
        e.put("message", message_value(&msg));
        e.put(
            "details",
            with_aborted(
                json!({"stage": cut(stage, 80), "from": expected, "to": fail}),
                aborted,
            ),
        );
        rs.push_event(e);
        ok(json!({"runId": rs.id.to_string(), "runStatus": fail, "changed": true}))
    }
}

/// The completion CAS of §5.4 (always won here: the caller checked that every partition
/// succeeded, and each success matched its expected count, whose sum is the source count).
pub fn complete(rs: &mut RunState) {
    rs.change_status("EXTRACTED_VALIDATED");
    let rows: i64 = rs
        .partitions
        .values()
        .filter_map(|p| p.int("actual_row_count"))
        .sum();
    rs.row.put("extracted_count", rows);
    rs.row.now("extract_completed_at");
    let mut d = blank(&DISPATCH_COLS);
    d.insert("dispatch_id", Cell::NewUuid(true));
    d.put("run_id", rs.id.to_string());
    d.put("dispatch_type", "VALIDATE_RUN");
    d.put("status", "PENDING");
    d.put("attempt_count", 0);
    d.now("next_attempt_at");
    d.now("created_at");
    rs.dispatches.push(d);
    let mut e = rs.event("EXTRACT_VALIDATED", "INFO");
    e.put("row_count", rs.row.val("source_count").clone());
    rs.push_event(e);
}

pub fn with_aborted_details(details: Value, aborted: i64) -> Value {
    with_aborted(details, aborted)
}

pub fn status_mismatch(status: &str, ctx: &Ctx) -> Expected {
    mismatch(status, ctx)
}

//! Expected effects of the PG-20 calls (CONTRACT §4.6–4.8, the chunk gate of §5.3, the
//! completion of §5.4).
use super::compare::{Cell, Row};
use super::model::*;
use super::ops_run::{Ctx, complete, not_found, with_aborted_details};
use super::request::{ChunkReq, Op, Opt, Target};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use uuid::Uuid;

impl Model {
    pub(super) fn apply_extract(&mut self, op: &Op, ctx: &Ctx) -> Option<Expected> {
        let (target, pid) = match op {
            Op::Claim { run, pid, .. }
            | Op::Chunk(run, pid, _)
            | Op::PartitionFail { run, pid, .. } => (*run, pid),
            _ => return None,
        };
        if let Op::Chunk(_, _, c) = op
            && c.index >= c.count
        {
            return Some(error(
                422,
                "CHUNK_INDEX_OUT_OF_RANGE",
                "CHUNK_INDEX_OUT_OF_RANGE",
                None,
                ctx.request_id,
            ));
        }
        let Target::Run(i) = target else {
            return Some(not_found("RUN_NOT_FOUND", ctx));
        };
        if !self.runs[i].partitions.contains_key(pid) {
            return Some(not_found("PARTITION_NOT_FOUND", ctx));
        }
        Some(match op {
            Op::Claim { token, worker, .. } => claim(&mut self.runs[i], pid, *token, worker),
            Op::Chunk(_, _, c) => {
                // uq_load_file_path is ledger-wide: a path another chunk row holds.
                let taken = self.runs.iter().any(|r| {
                    r.files.iter().any(|((p, idx), f)| {
                        f.text("hdfs_path").as_deref() == Some(&c.path)
                            && !(r.id == self.runs[i].id && p == pid && *idx == c.index)
                    })
                });
                chunk(&mut self.runs[i], pid, c, taken, ctx)
            }
            Op::PartitionFail {
                token,
                stage,
                class,
                code,
                message,
                attempt,
                ..
            } => partition_fail(
                &mut self.runs[i],
                pid,
                *token,
                stage,
                class,
                code,
                message,
                attempt,
                ctx,
            ),
            _ => unreachable!(),
        })
    }
}

fn token_is(p: &Value, token: Uuid) -> bool {
    p.as_str() == Some(token.to_string().as_str())
}

fn claim(rs: &mut RunState, pid: &str, token: Uuid, worker: &str) -> Expected {
    let run_status = rs.status();
    let p = rs.partitions.get_mut(pid).unwrap();
    let ps = p.text("status").unwrap_or_default();
    let attempt = p.int("attempt_count").unwrap_or(0);
    let refused = json!({"claimed": false, "runStatus": run_status, "partitionStatus": ps, "attempt": attempt});
    if run_status != "EXTRACTING" {
        return ok(refused);
    }
    if ps == "RUNNING" && token_is(p.val("claim_token"), token) {
        p.now("heartbeat_at");
        return ok(
            json!({"claimed": true, "runStatus": run_status, "partitionStatus": "RUNNING", "attempt": attempt}),
        );
    }
    if ps != "PENDING" && ps != "RETRY" {
        return ok(refused);
    }
    p.put("status", "RUNNING");
    p.put("claim_token", token.to_string());
    p.put("worker_node", worker);
    p.put("attempt_count", attempt + 1);
    if matches!(p.get("started_at"), Some(Cell::Val(Value::Null))) {
        p.now("started_at");
    }
    p.now("heartbeat_at");
    p.put("error_code", Value::Null);
    p.put("error_message", Value::Null);
    rs.row.now_or_keep("heartbeat_at");
    let mut e = rs.event("PARTITION_STARTED", "INFO");
    e.put("partition_id", pid);
    e.put(
        "details",
        json!({"workerNode": worker, "attempt": attempt + 1}),
    );
    rs.push_event(e);
    ok(
        json!({"claimed": true, "runStatus": run_status, "partitionStatus": "RUNNING", "attempt": attempt + 1}),
    )
}

fn chunk(rs: &mut RunState, pid: &str, c: &ChunkReq, path_taken: bool, ctx: &Ctx) -> Expected {
    let p = &rs.partitions[pid];
    if !token_is(p.val("claim_token"), c.token) {
        return error(
            409,
            "CLAIM_MISMATCH",
            "CLAIM_MISMATCH",
            None,
            ctx.request_id,
        );
    }
    // §4.7 step 4, with load-control's reading (docs/oracle.md, "Readings of the contract"): one
    // spelling per file below the run directory, so besides `..` an empty or `.` segment (and so
    // a trailing `/`) is refused too; `p//f` and `p/./f` would record one file as two chunks.
    let inside = rs.row.text("hdfs_run_path").is_some_and(|root| {
        c.path.strip_prefix(&format!("{root}/")).is_some_and(|rel| {
            !rel.split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
        })
    });
    if !inside {
        return error(
            422,
            "HDFS_PATH_OUTSIDE_RUN",
            "HDFS_PATH_OUTSIDE_RUN",
            None,
            ctx.request_id,
        );
    }
    let bytes = json!(c.bytes.value());
    let key = (pid.to_string(), c.index);
    let changed = match rs.files.get(&key) {
        None => true,
        Some(f) => {
            f.int("fragment_count") != Some(c.count)
                || f.text("hdfs_path").as_deref() != Some(&c.path)
                || f.int("record_count") != Some(c.records)
                || *f.val("byte_count") != bytes
        }
    };
    // Step 5 (the path's unique index) is judged before step 6 (CHUNK_CONFLICT).
    if path_taken {
        return error(
            409,
            "UNIQUE_VIOLATION",
            "unique constraint violated",
            Some(json!({"constraint": "uq_load_file_path"})),
            ctx.request_id,
        );
    }
    let ps = p.text("status").unwrap_or_default();
    if ps == "SUCCESS" && changed {
        return error(
            409,
            "CHUNK_CONFLICT",
            "CHUNK_CONFLICT",
            None,
            ctx.request_id,
        );
    }
    let mut f = rs.files.remove(&key).unwrap_or_else(|| {
        let mut f = blank(&FILE_COLS);
        f.put("run_id", rs.id.to_string());
        f.put("partition_id", pid);
        f.put("chunk_index", c.index);
        f.now("written_at");
        f
    });
    f.put("fragment_identifier", json!(c.fragment.value()));
    f.put("fragment_count", c.count);
    f.put("hdfs_path", c.path.clone());
    f.put("record_count", c.records);
    f.put("byte_count", bytes);
    f.put("status", "WRITTEN");
    // Ambiguity: §4.7 step 5 says the UPSERT sets `updated_at = now`; whether a re-report that
    // changes none of the compared values (an identical replay) rewrites it is read as open:
    // either is accepted. A changed report must set it.
    if changed {
        f.now("updated_at");
    } else {
        f.now_or_keep("updated_at");
    }
    rs.files.insert(key, f);
    // §4.7 step 7 and §2.7: every accepted chunk report refreshes the partition's heartbeat
    // (unlike the run's, §5.3 rule 5, no skip is allowed).
    rs.partitions.get_mut(pid).unwrap().now("heartbeat_at");
    rs.row.now_or_keep("heartbeat_at");

    let written: Vec<&Row> = rs
        .files
        .iter()
        .filter(|((p, _), f)| p == pid && f.text("status").as_deref() == Some("WRITTEN"))
        .map(|(_, f)| f)
        .collect();
    let files = written.len() as i64;
    let lo = written
        .iter()
        .filter_map(|f| f.int("chunk_index"))
        .min()
        .unwrap_or(0);
    let hi = written
        .iter()
        .filter_map(|f| f.int("chunk_index"))
        .max()
        .unwrap_or(-1);
    let rows: i64 = written.iter().filter_map(|f| f.int("record_count")).sum();
    let reported: Vec<i64> = written.iter().filter_map(|f| f.int("byte_count")).collect();
    let bytes_sum = (!reported.is_empty()).then(|| reported.iter().sum::<i64>());
    let counts: BTreeSet<i64> = written
        .iter()
        .filter_map(|f| f.int("fragment_count"))
        .collect();
    let run_status = rs.status();
    let answer = |ps: &str, rs_: &str, scheduled: bool| {
        ok(
            json!({"recorded": true, "partitionStatus": ps, "runStatus": rs_, "receivedChunks": files,
            "chunkCount": c.count, "validationScheduled": scheduled}),
        )
    };
    if run_status != "EXTRACTING" || ps != "RUNNING" || files < c.count {
        return answer(&ps, &run_status, false);
    }
    let expected = rs.partitions[pid].int("expected_row_count").unwrap_or(0);
    let complete_set = files == c.count && lo == 0 && hi == c.count - 1 && counts.len() == 1;
    if complete_set && rows == expected {
        let p = rs.partitions.get_mut(pid).unwrap();
        p.put("status", "SUCCESS");
        p.put("actual_row_count", rows);
        p.put("file_count", files);
        p.put("fragment_count", files);
        // §5.3: NULL when no chunk reported bytes.
        p.put("byte_count", json!(bytes_sum));
        p.now("completed_at");
        let mut e = rs.event("PARTITION_SUCCESS", "INFO");
        e.put("partition_id", pid);
        e.put("row_count", rows);
        e.put("details", json!({"files": files, "bytes": bytes_sum}));
        rs.push_event(e);
        if rs.success_rows() == rs.row.int("expected_partition_count").unwrap_or(-1) {
            complete(rs);
            return answer("SUCCESS", "EXTRACTED_VALIDATED", true);
        }
        return answer("SUCCESS", "EXTRACTING", false);
    }
    let text = format!(
        "files={files} chunkCount={} distinctCounts={} rows={rows} expected={expected}",
        c.count,
        counts.len()
    );
    let p = rs.partitions.get_mut(pid).unwrap();
    p.put("status", "FAILED");
    p.put("error_code", "ROW_COUNT_MISMATCH");
    p.put("error_message", message_value(&text));
    p.now("completed_at");
    p.now("heartbeat_at");
    let failed = rs.row.int("failed_partition_count").unwrap_or(0);
    rs.row.put("failed_partition_count", failed + 1);
    rs.change_status("FAILED_EXTRACT");
    let run_message = format!("partition {pid}: {text}");
    rs.row.put("error_stage", "PARTITION_GATE");
    rs.row.put("error_code", "ROW_COUNT_MISMATCH");
    rs.row.put("error_message", message_value(&run_message));
    let aborted = rs.end_effects("FAILED_EXTRACT", false);
    let mut e = rs.event("PARTITION_FAILED", "ERROR");
    e.put("partition_id", pid);
    e.put("error_code", "ROW_COUNT_MISMATCH");
    e.put("message", message_value(&text));
    rs.push_event(e);
    let mut e = rs.event("RUN_FAILED", "ERROR");
    e.put("partition_id", pid);
    e.put("error_code", "ROW_COUNT_MISMATCH");
    e.put("message", message_value(&run_message));
    e.put(
        "details",
        with_aborted_details(
            json!({"stage": "PARTITION_GATE", "from": "EXTRACTING", "to": "FAILED_EXTRACT"}),
            aborted,
        ),
    );
    rs.push_event(e);
    answer("FAILED", "FAILED_EXTRACT", false)
}

#[allow(clippy::too_many_arguments)]
fn partition_fail(
    rs: &mut RunState,
    pid: &str,
    token: Uuid,
    stage: &str,
    class: &str,
    code: &str,
    message: &Option<String>,
    attempt: &Opt<i64>,
    ctx: &Ctx,
) -> Expected {
    let run_status = rs.status();
    let p = rs.partitions.get_mut(pid).unwrap();
    if !token_is(p.val("claim_token"), token) {
        return error(
            409,
            "CLAIM_MISMATCH",
            "CLAIM_MISMATCH",
            None,
            ctx.request_id,
        );
    }
    let ps = p.text("status").unwrap_or_default();
    if ps == "FAILED" || ps == "ABORTED" {
        return ok(json!({"partitionStatus": ps, "runStatus": run_status, "changed": false}));
    }
    if ps != "RUNNING" {
        return error(
            409,
            "PARTITION_STATUS_MISMATCH",
            "PARTITION_STATUS_MISMATCH",
            Some(json!({"partitionStatus": ps})),
            ctx.request_id,
        );
    }
    let msg = message.clone().unwrap_or_default();
    p.put("status", "FAILED");
    p.put("error_code", code);
    p.put("error_message", message_value(&msg));
    p.now("completed_at");
    p.now("heartbeat_at");
    let failed = rs.row.int("failed_partition_count").unwrap_or(0);
    rs.row.put("failed_partition_count", failed + 1);
    let attempt = json!(attempt.value());
    let mut e = rs.event("PARTITION_FAILED", "ERROR");
    e.put("partition_id", pid);
    e.put("error_class", cut(class, 40));
    e.put("error_code", code);
    e.put("message", message_value(&msg));
    e.put("attempt_no", attempt.clone());
    e.put(
        "details",
        json!({"stage": cut(stage, 80), "attempt": attempt}),
    );
    rs.push_event(e);
    let mut now_status = run_status.clone();
    if run_status == "EXTRACTING" {
        let snapshot = ["ORA-01555", "ORA-08180"].contains(&code.to_uppercase().as_str())
            || class.to_uppercase() == "SNAPSHOT";
        let to = if snapshot {
            "FAILED_SNAPSHOT_EXPIRED"
        } else {
            "FAILED_EXTRACT"
        };
        rs.change_status(to);
        rs.row.put("error_stage", cut(stage, 80));
        rs.row.put("error_code", code);
        rs.row.put("error_message", message_value(&msg));
        let aborted = rs.end_effects(to, false);
        let mut e = rs.event("RUN_FAILED", "ERROR");
        e.put("partition_id", pid);
        e.put("error_code", code);
        e.put("message", message_value(&format!("partition {pid}: {msg}")));
        e.put(
            "details",
            with_aborted_details(
                json!({"stage": cut(stage, 80), "from": "EXTRACTING", "to": to}),
                aborted,
            ),
        );
        rs.push_event(e);
        now_status = to.to_string();
    }
    ok(json!({"partitionStatus": "FAILED", "runStatus": now_status, "changed": true}))
}

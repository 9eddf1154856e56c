//! Request shapes of the extraction endpoints (CONTRACT §4.1–§4.8): each turns the lenient input
//! into the ledger's typed request, collecting every problem.
use crate::input::*;
use ledger::{
    ChunkReport, Decimal38, LedgerError, Manifest, ManifestPartition, MetricItem, MetricStage,
    NewRun, PartitionFailure, RunFailure, RunFilter, RunStatus,
};
use regex::Regex;
use std::sync::LazyLock;
use uuid::Uuid;

macro_rules! re {
    ($name:ident, $pat:literal) => {
        pub static $name: LazyLock<Regex> =
            LazyLock::new(|| Regex::new($pat).expect("valid pattern"));
    };
}
re!(JOB_KEY, r"^[A-Z0-9_]{1,200}$");
re!(BUSINESS_KEY, r"^[0-9A-Za-z_.:\-]{1,200}$");
re!(PARTITION_ID, r"^([0-9]{4}|NULL)$");
re!(DECIMAL, r"^-?[0-9]{1,38}$");
re!(TABLE_PREFIX, r"^[A-Za-z_][A-Za-z0-9_]{0,60}$");
re!(HDFS_PATH, r"^/[A-Za-z0-9_.=/\-]{1,1499}$");

const RUN_STATUSES: &str = "the 17 run statuses";

fn decimal(v: &JVal) -> Conv<Option<(Decimal38, String)>> {
    let s = pattern(&DECIMAL)(v)?;
    Ok(Decimal38::parse(&s).map(|d| (d, s)))
}

fn run_status(v: &JVal) -> Conv<Option<RunStatus>> {
    enumeration(RunStatus::parse, RUN_STATUSES)(v)
}

/// `path.run_id`.
pub fn run_id(raw: Option<&str>, p: &mut Problems) -> Uuid {
    match raw.and_then(parse_uuid) {
        Some(id) => id,
        None => {
            p.push("path.run_id", "must be a UUID");
            Uuid::nil()
        }
    }
}

/// `path.partition_id`.
pub fn partition_id(raw: Option<&str>, p: &mut Problems) -> String {
    match raw {
        Some(s) if PARTITION_ID.is_match(s) => s.to_string(),
        _ => {
            p.push(
                "path.partition_id",
                format!("does not match {}", PARTITION_ID.as_str()),
            );
            String::new()
        }
    }
}

pub fn create_run(o: &mut ObjReader<'_>, p: &mut Problems) -> NewRun {
    NewRun {
        job_key: o.required("jobKey", p, pattern(&JOB_KEY)),
        business_key: o.required("businessKey", p, pattern(&BUSINESS_KEY)),
        hdfs_root: o.required("hdfsRoot", p, pattern(&HDFS_PATH)),
        stage_table_prefix: o.required("stageTablePrefix", p, pattern(&TABLE_PREFIX)),
        allow_empty_source: o.optional("allowEmptySource", false, p, boolean),
        parameters: o.optional("parameters", Default::default(), p, object),
    }
}

pub fn manifest(o: &mut ObjReader<'_>, p: &mut Problems) -> Manifest {
    let scn = o
        .optional("snapshotScn", None, p, nullable(decimal))
        .flatten();
    let source_count = o.required("sourceCount", p, min_int(0));
    let source_null_split_count = o.optional("sourceNullSplitCount", 0, p, min_int(0));
    let min = o
        .optional("sourceMinSplit", None, p, nullable(decimal))
        .flatten();
    let max = o
        .optional("sourceMaxSplit", None, p, nullable(decimal))
        .flatten();
    let planned = o.required("plannedPartitionCount", p, int_range(1, 10_000));
    let metrics_raw: Option<&JVal> = o.optional("sourceMetrics", None, p, |v| Ok(Some(v)));
    let version = o.optional("sourceMetricsVersion", "v1".to_string(), p, text(0, 50));
    let parts: &[JVal] = o.required("partitions", p, |v| match v {
        JVal::Arr(a) if (1..=10_000).contains(&a.len()) => Ok(a.as_slice()),
        JVal::Arr(_) => Err("must hold 1..10000 partitions".into()),
        _ => Err("must be a list".into()),
    });
    let partitions = parts
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let mut item = ObjReader::new(v, &format!("$.partitions[{i}]"), p)?;
            let lower = item
                .optional("lowerBound", None, p, nullable(decimal))
                .flatten();
            let upper = item
                .optional("upperBound", None, p, nullable(decimal))
                .flatten();
            let part = ManifestPartition {
                partition_id: item.required("partitionId", p, pattern(&PARTITION_ID)),
                lower_bound: lower.as_ref().map(|d| d.0),
                upper_bound: upper.as_ref().map(|d| d.0),
                lower_text: lower.map(|d| d.1),
                upper_text: upper.map(|d| d.1),
                upper_inclusive: item.optional("upperInclusive", false, p, boolean),
                is_null_partition: item.optional("isNullPartition", false, p, boolean),
                expected_row_count: item.required("expectedRowCount", p, min_int(0)),
            };
            item.finish(p);
            Some(part)
        })
        .collect();
    let metrics = metrics_raw
        .map(|v| source_metrics(v, p))
        .unwrap_or_default();
    Manifest {
        snapshot_scn: scn.map(|d| d.0),
        source_count,
        source_null_split_count,
        source_min_split: min.map(|d| d.0),
        source_max_split: max.map(|d| d.0),
        planned_partition_count: planned,
        source_metrics: metrics,
        source_metrics_version: version,
        partitions,
    }
}

/// `sourceMetrics`: ≤ 200 entries, keys 1..150 chars, values Message; per-entry problems are
/// reported at `$.sourceMetrics.<key>`.
fn source_metrics(v: &JVal, p: &mut Problems) -> Vec<(String, String)> {
    let JVal::Obj(fields) = v else {
        p.push("$.sourceMetrics", "must be a JSON object");
        return Vec::new();
    };
    if fields.len() > 200 {
        p.push("$.sourceMetrics", "must hold at most 200 entries");
        return Vec::new();
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, val) in fields {
        let n = k.chars().count();
        if !(1..=150).contains(&n) {
            p.push(
                format!("$.sourceMetrics.{k}"),
                "key must be 1..150 characters",
            );
            continue;
        }
        match text(0, 2000)(val) {
            Ok(s) => {
                // A repeated key keeps its last value.
                out.retain(|(name, _)| name != k);
                out.push((k.clone(), s));
            }
            Err(m) => p.push(format!("$.sourceMetrics.{k}"), m),
        }
    }
    out
}

pub fn run_failure(o: &mut ObjReader<'_>, p: &mut Problems) -> Option<RunFailure> {
    let expected = o.required("expectedStatus", p, run_status);
    let fail = o.required("failStatus", p, run_status);
    let error_stage = o.required("errorStage", p, text(0, 100));
    let error_code = o.required("errorCode", p, text(0, 100));
    let message = o.optional("message", String::new(), p, text(0, 2000));
    Some(RunFailure {
        expected_status: expected?,
        fail_status: fail?,
        error_stage,
        error_code,
        message,
    })
}

pub fn claim(o: &mut ObjReader<'_>, p: &mut Problems) -> (Uuid, String) {
    (
        o.required("claimToken", p, uuid),
        o.required("workerNode", p, text(1, 200)),
    )
}

/// `ChunkIndexOutOfRange` when `chunkIndex ≥ chunkCount` (judged before any lookup).
pub fn chunk(o: &mut ObjReader<'_>, p: &mut Problems) -> Result<ChunkReport, LedgerError> {
    let claim_token = o.required("claimToken", p, uuid);
    let chunk_index = o.required("chunkIndex", p, min_int(0));
    let chunk_count = o.required("chunkCount", p, int_range(1, 1_000_000));
    let fragment_identifier = o.optional("fragmentIdentifier", None, p, nullable(text(0, 100)));
    let hdfs_path = o.required("hdfsPath", p, |v| {
        let s = text(1, 1500)(v)?;
        if s.len() > 2000 {
            Err("must be at most 2000 UTF-8 bytes".into())
        } else {
            Ok(s)
        }
    });
    let record_count = o.required("recordCount", p, min_int(0));
    let byte_count = o.optional("byteCount", None, p, nullable(min_int(0)));
    if p.is_empty() && chunk_index >= chunk_count {
        return Err(LedgerError::ChunkIndexOutOfRange);
    }
    Ok(ChunkReport {
        claim_token,
        chunk_index: i32::try_from(chunk_index).unwrap_or(i32::MAX),
        chunk_count: chunk_count as i32,
        fragment_identifier,
        hdfs_path,
        record_count,
        byte_count,
    })
}

pub fn partition_failure(o: &mut ObjReader<'_>, p: &mut Problems) -> PartitionFailure {
    PartitionFailure {
        claim_token: o.required("claimToken", p, uuid),
        error_stage: o.required("errorStage", p, text(0, 100)),
        error_class: o.required("errorClass", p, text(0, 100)),
        error_code: o.required("errorCode", p, text(0, 100)),
        message: o.optional("message", String::new(), p, text(0, 2000)),
        attempt: o
            .optional("attempt", None, p, nullable(int_range(0, i32::MAX as i64)))
            .map(|a| a as i32),
    }
}

/// `GET /v1/runs` query (§4.4); unknown parameters are ignored.
pub fn run_filter(query: &[(String, String)], p: &mut Problems) -> RunFilter {
    let key = |names: &[&str], p: &mut Problems| {
        let v = query_value(query, names, p)?;
        if v.chars().count() <= 200 {
            Some(v.to_string())
        } else {
            p.push(
                format!("query.{}", names[0]),
                "must be at most 200 characters",
            );
            None
        }
    };
    let job_key = key(&["jobKey", "job_key"], p);
    let business_key = key(&["businessKey", "business_key"], p);
    let status = query_value(query, &["status"], p).and_then(|v| {
        RunStatus::parse(v).or_else(|| {
            p.push("query.status", format!("must be one of {RUN_STATUSES}"));
            None
        })
    });
    RunFilter {
        job_key,
        business_key,
        status,
        limit: query_int(query, "limit", 1, 500, 50, p),
    }
}

// ---- validation, publish, operator and read endpoints (CONTRACT §4.9–§4.22) ----

re!(METRIC_NAME, r"^[A-Za-z0-9_.:\-]{1,150}$");

pub fn validation_start(o: &mut ObjReader<'_>, p: &mut Problems) -> (Uuid, String) {
    (
        o.required("dispatchId", p, uuid),
        o.optional("node", String::new(), p, text(0, 200)),
    )
}

pub fn metrics(
    o: &mut ObjReader<'_>,
    p: &mut Problems,
) -> Option<(MetricStage, String, Vec<MetricItem>)> {
    let stage = o.required("stage", p, |v| match v {
        JVal::Str(s) if s == "STAGING" => Ok(Some(MetricStage::Staging)),
        JVal::Str(s) if s == "TARGET" => Ok(Some(MetricStage::Target)),
        _ => Err("must be STAGING or TARGET".into()),
    });
    // ShortText allows the empty string (§4.10).
    let version = o.optional("queryVersion", "v1".to_string(), p, text(0, 50));
    let raw: &[JVal] = o.required("metrics", p, |v| match v {
        JVal::Arr(a) if (1..=500).contains(&a.len()) => Ok(a.as_slice()),
        JVal::Arr(_) => Err("must hold 1..500 metrics".into()),
        _ => Err("must be a list".into()),
    });
    let items = raw
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let mut m = ObjReader::new(v, &format!("$.metrics[{i}]"), p)?;
            let item = MetricItem {
                metric_name: m.required("metricName", p, pattern(&METRIC_NAME)),
                expected_value: m.optional("expectedValue", None, p, nullable(text(0, 2000))),
                actual_value: m.optional("actualValue", None, p, nullable(text(0, 2000))),
                tolerance: m.optional("tolerance", None, p, nullable(text(0, 100))),
                result: m.required("result", p, |v| match v {
                    JVal::Str(s) if ["PASS", "FAIL", "WARN"].contains(&s.as_str()) => Ok(s.clone()),
                    _ => Err("must be one of PASS, FAIL, WARN".into()),
                }),
                details: m.optional("details", Default::default(), p, object),
            };
            m.finish(p);
            Some(item)
        })
        .collect();
    Some((stage?, version, items))
}

pub fn publish_token(o: &mut ObjReader<'_>, p: &mut Problems) -> Uuid {
    o.required("publishToken", p, uuid)
}

pub struct PublishResult {
    pub token: Uuid,
    pub outcome: RunStatus,
    pub error_code: Option<String>,
    pub message: String,
}

pub fn publish_result(o: &mut ObjReader<'_>, p: &mut Problems) -> Option<PublishResult> {
    let token = o.required("publishToken", p, uuid);
    let outcome = o.required("outcome", p, |v| match v {
        JVal::Str(s)
            if ["PUBLISHED", "FAILED_PUBLISH", "PUBLISH_UNKNOWN"].contains(&s.as_str()) =>
        {
            Ok(RunStatus::parse(s))
        }
        _ => Err("must be one of PUBLISHED, FAILED_PUBLISH, PUBLISH_UNKNOWN".into()),
    });
    let error_code = o.optional("errorCode", None, p, nullable(text(0, 100)));
    let message = o.optional("message", String::new(), p, text(0, 2000));
    Some(PublishResult {
        token,
        outcome: outcome?,
        error_code,
        message,
    })
}

pub fn success(o: &mut ObjReader<'_>, p: &mut Problems) -> Option<i64> {
    o.optional("targetCount", None, p, nullable(min_int(0)))
}

pub fn resolution(o: &mut ObjReader<'_>, p: &mut Problems) -> Option<(RunStatus, String)> {
    let resolution = o.required("resolution", p, |v| match v {
        JVal::Str(s) if s == "PUBLISHED" || s == "FAILED_PUBLISH" => Ok(RunStatus::parse(s)),
        _ => Err("must be PUBLISHED or FAILED_PUBLISH".into()),
    });
    let reason = o.required("reason", p, text(5, 2000));
    Some((resolution?, reason))
}

pub fn reason(o: &mut ObjReader<'_>, p: &mut Problems) -> String {
    o.required("reason", p, text(5, 2000))
}

pub fn cleanup_report(o: &mut ObjReader<'_>, p: &mut Problems) -> (Option<String>, Option<String>) {
    (
        o.optional("droppedTable", None, p, nullable(text(0, 300))),
        o.optional("deletedPath", None, p, nullable(pattern(&HDFS_PATH))),
    )
}

/// The one value of a query parameter under any of its spellings, `None` when absent. A parameter
/// given more than once with different values is refused (422 `query.<name>`): which of them the
/// client meant is not ours to guess, and taking the first or the last would let a bad value pass
/// beside a good one.
fn query_value<'q>(
    query: &'q [(String, String)],
    names: &[&str],
    p: &mut Problems,
) -> Option<&'q str> {
    let mut values = query
        .iter()
        .filter(|(k, _)| names.contains(&k.as_str()))
        .map(|(_, v)| v.as_str());
    let first = values.next()?;
    if values.all(|v| v == first) {
        Some(first)
    } else {
        p.push(
            format!("query.{}", names[0]),
            "is given more than once with different values",
        );
        None
    }
}

/// An integer query parameter in `min..=max`, `default` when absent.
pub fn query_int(
    query: &[(String, String)],
    name: &str,
    min: i64,
    max: i64,
    default: i64,
    p: &mut Problems,
) -> i64 {
    match query_value(query, &[name], p) {
        None => default,
        Some(v) => int_range(min, max)(&JVal::Str(v.to_string())).unwrap_or_else(|m| {
            p.push(format!("query.{name}"), m);
            default
        }),
    }
}

/// `jobKey` of the cleanup candidates query: the JobKey pattern or 422.
pub fn query_job_key(query: &[(String, String)], p: &mut Problems) -> Option<String> {
    let v = query_value(query, &["jobKey", "job_key"], p)?;
    if JOB_KEY.is_match(v) {
        Some(v.to_string())
    } else {
        p.push(
            "query.jobKey",
            format!("does not match {}", JOB_KEY.as_str()),
        );
        None
    }
}

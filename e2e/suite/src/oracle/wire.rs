//! How a request is written on the wire: the forms §3.2 accepts (numbers and booleans as JSON
//! strings as NiFi's AttributesToJSON sends them, snake_case names, UUID spellings, optional
//! fields absent or `null`).
use super::request::{Decimal, Enc, Op, Opt, Request, Target};
use serde_json::{Map, Value, json};
use uuid::Uuid;

/// What goes over HTTP.
pub struct Wire {
    pub method: &'static str,
    pub path: String,
    pub body: Option<Value>,
    pub operator: bool,
}

impl Enc {
    fn key(&self, camel: &str) -> String {
        if !self.snake {
            return camel.to_string();
        }
        let mut s = String::new();
        for c in camel.chars() {
            if c.is_ascii_uppercase() {
                s.push('_');
                s.push(c.to_ascii_lowercase());
            } else {
                s.push(c);
            }
        }
        s
    }
    fn int(&self, n: i64) -> Value {
        if self.strings {
            json!(n.to_string())
        } else {
            json!(n)
        }
    }
    fn boolean(&self, b: bool) -> Value {
        if self.strings {
            json!(if b { "true" } else { "false" })
        } else {
            json!(b)
        }
    }
    pub fn uuid(&self, u: Uuid) -> String {
        match self.uuid_form {
            1 => u.hyphenated().to_string().to_uppercase(),
            2 => u.simple().to_string(),
            _ => u.hyphenated().to_string(),
        }
    }
}

fn decimal(d: &Decimal) -> Value {
    match (d.as_number, d.text.parse::<i64>()) {
        (true, Ok(n)) => json!(n),
        _ => json!(d.text),
    }
}

/// A JSON object built field by field under the encoding's names.
struct Body<'a> {
    enc: &'a Enc,
    map: Map<String, Value>,
}

impl<'a> Body<'a> {
    fn new(enc: &'a Enc) -> Self {
        Body {
            enc,
            map: Map::new(),
        }
    }
    fn put(mut self, camel: &str, v: Value) -> Self {
        self.map.insert(self.enc.key(camel), v);
        self
    }
    fn opt<T>(self, camel: &str, o: &Opt<T>, f: impl Fn(&T) -> Value) -> Self {
        match o {
            Opt::Absent => self,
            Opt::Null => self.put(camel, Value::Null),
            Opt::Some(v) => {
                let v = f(v);
                self.put(camel, v)
            }
        }
    }
    fn maybe<T>(self, camel: &str, o: &Option<T>, f: impl Fn(&T) -> Value) -> Self {
        match o {
            None => self,
            Some(v) => {
                let v = f(v);
                self.put(camel, v)
            }
        }
    }
    fn done(self) -> Option<Value> {
        Some(Value::Object(self.map))
    }
}

impl Request {
    /// The HTTP request; `run_id` resolves a [`Target`] to the id to put in the path.
    pub fn wire(&self, run_id: impl Fn(Target) -> Uuid) -> Wire {
        let e = &self.enc;
        let run = |t: Target| format!("/v1/runs/{}", e.uuid(run_id(t)));
        let post = |path: String, body: Option<Value>| Wire {
            method: "POST",
            path,
            body,
            operator: false,
        };
        let get = |path: String, operator: bool| Wire {
            method: "GET",
            path,
            body: None,
            operator,
        };
        match &self.op {
            Op::Create {
                job,
                business_key,
                hdfs_root,
                prefix,
                allow_empty,
                parameters,
            } => post(
                "/v1/runs".into(),
                Body::new(e)
                    .put("jobKey", json!(job))
                    .put("businessKey", json!(business_key))
                    .put("hdfsRoot", json!(hdfs_root))
                    .put("stageTablePrefix", json!(prefix))
                    .maybe("allowEmptySource", allow_empty, |b| e.boolean(*b))
                    .maybe("parameters", parameters, |p| Value::Object(p.clone()))
                    .done(),
            ),
            Op::Manifest(t, m) => {
                let parts: Vec<Value> = m
                    .partitions
                    .iter()
                    .map(|p| {
                        Body::new(e)
                            .put("partitionId", json!(p.partition_id))
                            .opt("lowerBound", &p.lower, decimal)
                            .opt("upperBound", &p.upper, decimal)
                            .maybe("upperInclusive", &p.upper_inclusive, |b| e.boolean(*b))
                            .maybe("isNullPartition", &p.is_null, |b| e.boolean(*b))
                            .put("expectedRowCount", e.int(p.expected))
                            .done()
                            .unwrap()
                    })
                    .collect();
                let metrics = m.source_metrics.as_ref().map(|ms| {
                    Value::Object(ms.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
                });
                post(
                    format!("{}/manifest", run(*t)),
                    Body::new(e)
                        .opt("snapshotScn", &m.snapshot_scn, decimal)
                        .put("sourceCount", e.int(m.source_count))
                        .maybe("sourceNullSplitCount", &m.source_null_split_count, |n| {
                            e.int(*n)
                        })
                        .opt("sourceMinSplit", &m.source_min_split, decimal)
                        .opt("sourceMaxSplit", &m.source_max_split, decimal)
                        .put("plannedPartitionCount", e.int(m.planned))
                        .maybe("sourceMetrics", &metrics, Clone::clone)
                        .maybe("sourceMetricsVersion", &m.source_metrics_version, |v| {
                            json!(v)
                        })
                        .put("partitions", Value::Array(parts))
                        .done(),
                )
            }
            Op::RunFail {
                run: t,
                expected,
                fail,
                stage,
                code,
                message,
            } => post(
                format!("{}/fail", run(*t)),
                Body::new(e)
                    .put("expectedStatus", json!(expected))
                    .put("failStatus", json!(fail))
                    .put("errorStage", json!(stage))
                    .put("errorCode", json!(code))
                    .maybe("message", message, |m| json!(m))
                    .done(),
            ),
            Op::Claim {
                run: t,
                pid,
                token,
                worker,
            } => post(
                format!("{}/partitions/{pid}/claim", run(*t)),
                Body::new(e)
                    .put("claimToken", json!(e.uuid(*token)))
                    .put("workerNode", json!(worker))
                    .done(),
            ),
            Op::Chunk(t, pid, c) => post(
                format!("{}/partitions/{pid}/chunks", run(*t)),
                Body::new(e)
                    .put("claimToken", json!(e.uuid(c.token)))
                    .put("chunkIndex", e.int(c.index))
                    .put("chunkCount", e.int(c.count))
                    .opt("fragmentIdentifier", &c.fragment, |f| json!(f))
                    .put("hdfsPath", json!(c.path))
                    .put("recordCount", e.int(c.records))
                    .opt("byteCount", &c.bytes, |b| e.int(*b))
                    .done(),
            ),
            Op::PartitionFail {
                run: t,
                pid,
                token,
                stage,
                class,
                code,
                message,
                attempt,
            } => post(
                format!("{}/partitions/{pid}/fail", run(*t)),
                Body::new(e)
                    .put("claimToken", json!(e.uuid(*token)))
                    .put("errorStage", json!(stage))
                    .put("errorClass", json!(class))
                    .put("errorCode", json!(code))
                    .maybe("message", message, |m| json!(m))
                    .opt("attempt", attempt, |a| e.int(*a))
                    .done(),
            ),
            Op::ValidationStart {
                run: t,
                dispatch,
                node,
            } => post(
                format!("{}/validation/start", run(*t)),
                Body::new(e)
                    .put("dispatchId", json!(e.uuid(*dispatch)))
                    .maybe("node", node, |n| json!(n))
                    .done(),
            ),
            Op::Validations {
                run: t,
                stage,
                query_version,
                metrics,
            } => {
                let items: Vec<Value> = metrics
                    .iter()
                    .map(|m| {
                        Body::new(e)
                            .put("metricName", json!(m.name))
                            .opt("expectedValue", &m.expected, |v| json!(v))
                            .opt("actualValue", &m.actual, |v| json!(v))
                            .opt("tolerance", &m.tolerance, |v| json!(v))
                            .put("result", json!(m.result))
                            .maybe("details", &m.details, Clone::clone)
                            .done()
                            .unwrap()
                    })
                    .collect();
                post(
                    format!("{}/validations", run(*t)),
                    Body::new(e)
                        .put("stage", json!(stage))
                        .maybe("queryVersion", query_version, |q| json!(q))
                        .put("metrics", Value::Array(items))
                        .done(),
                )
            }
            // "no body": NiFi sends `{}` (§12); the endpoint ignores it.
            Op::StageValidated(t) => post(format!("{}/stage-validated", run(*t)), Some(json!({}))),
            Op::PublishClaim(t, token) => post(
                format!("{}/publish/claim", run(*t)),
                Body::new(e)
                    .put("publishToken", json!(e.uuid(*token)))
                    .done(),
            ),
            Op::PublishResult {
                run: t,
                token,
                outcome,
                error_code,
                message,
            } => post(
                format!("{}/publish/result", run(*t)),
                Body::new(e)
                    .put("publishToken", json!(e.uuid(*token)))
                    .put("outcome", json!(outcome))
                    .opt("errorCode", error_code, |c| json!(c))
                    .maybe("message", message, |m| json!(m))
                    .done(),
            ),
            Op::Success(t, target) => post(
                format!("{}/success", run(*t)),
                Body::new(e)
                    .opt("targetCount", target, |n| e.int(*n))
                    .done(),
            ),
            Op::Resend(t, d) => Wire {
                operator: true,
                ..post(
                    format!("{}/dispatches/{}/resend", run(*t), e.uuid(*d)),
                    None,
                )
            },
            Op::Resolve {
                run: t,
                resolution,
                reason,
            } => Wire {
                operator: true,
                ..post(
                    format!("{}/publish-unknown/resolve", run(*t)),
                    Body::new(e)
                        .put("resolution", json!(resolution))
                        .put("reason", json!(reason))
                        .done(),
                )
            },
            Op::Cancel(t, reason) => Wire {
                operator: true,
                ..post(
                    format!("{}/cancel", run(*t)),
                    Body::new(e).put("reason", json!(reason)).done(),
                )
            },
            Op::CleanupCandidates { job, limit } => {
                let mut path = format!("/v1/cleanup/candidates?jobKey={job}");
                if let Some(l) = limit {
                    path.push_str(&format!("&limit={l}"));
                }
                get(path, false)
            }
            Op::Cleanup {
                run: t,
                dropped,
                deleted,
                operator,
            } => Wire {
                operator: *operator,
                ..post(
                    format!("{}/cleanup", run(*t)),
                    Body::new(e)
                        .opt("droppedTable", dropped, |d| json!(d))
                        .opt("deletedPath", deleted, |d| json!(d))
                        .done(),
                )
            },
            Op::GetRun(t, operator) => get(run(*t), *operator),
            Op::ListRuns {
                job,
                business_key,
                status,
                limit,
            } => {
                let mut path = format!("/v1/runs?jobKey={job}");
                if let Some(b) = business_key {
                    path.push_str(&format!("&businessKey={b}"));
                }
                if let Some(s) = status {
                    path.push_str(&format!("&status={s}"));
                }
                if let Some(l) = limit {
                    path.push_str(&format!("&limit={l}"));
                }
                get(path, true)
            }
            Op::Events(t, limit) => get(
                match limit {
                    Some(l) => format!("{}/events?limit={l}", run(*t)),
                    None => format!("{}/events", run(*t)),
                },
                false,
            ),
            Op::GetValidations(t) => get(format!("{}/validations", run(*t)), true),
        }
    }
}

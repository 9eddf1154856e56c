//! Tables for people (`-o json` prints the API's JSON instead).
use serde_json::Value;

/// Left-aligned columns, two spaces apart.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = *w));
            }
        }
        out.trim_end().to_string()
    };
    let mut out = vec![line(headers.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.into_iter().map(line));
    out.join("\n")
}

/// One table row per element of a JSON array (none when it is not an array).
pub fn rows(v: &Value, row: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    v.as_array()
        .map(|a| a.iter().map(row).collect())
        .unwrap_or_default()
}

/// `{"SUCCESS": 3, "FAILED_EXTRACT": 1}` as `SUCCESS 3<sep>FAILED_EXTRACT 1`, or `none`.
pub fn counts(m: &Value, sep: &str) -> String {
    m.as_object()
        .map(|o| {
            o.iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(sep)
        })
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "none".into())
}

/// A cell: strings as they are, `-` for null or empty, other values as JSON.
pub fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `2026-09-28T03:12:44.512Z` → `2026-09-28 03:12:44`.
fn time(v: &Value) -> String {
    match v.as_str() {
        Some(t) if t.len() >= 19 => t[..19].replace('T', " "),
        _ => s(v),
    }
}

pub fn runs(v: &Value) -> String {
    let rows = rows(v, |r| {
        vec![
            s(&r["runId"]),
            s(&r["jobKey"]),
            s(&r["businessKey"]),
            s(&r["status"]),
            format!(
                "{}/{}",
                s(&r["successPartitionCount"]),
                s(&r["expectedPartitionCount"])
            ),
            format!("{}/{}", s(&r["extractedCount"]), s(&r["sourceCount"])),
            time(&r["startedAt"]),
            s(&r["errorCode"]),
        ]
    });
    table(
        &[
            "RUN ID",
            "JOB",
            "BUSINESS KEY",
            "STATUS",
            "PARTITIONS",
            "ROWS",
            "STARTED",
            "ERROR",
        ],
        rows,
    )
}

pub fn run(v: &Value) -> String {
    let r = &v["run"];
    let mut out = vec![
        format!(
            "Run {}  {} / {}",
            s(&r["runId"]),
            s(&r["jobKey"]),
            s(&r["businessKey"])
        ),
        format!("Status:      {}", s(&r["status"])),
        format!(
            "Partitions:  {}/{} succeeded, {} failed",
            s(&r["successPartitionCount"]),
            s(&r["expectedPartitionCount"]),
            s(&r["failedPartitionCount"])
        ),
        format!(
            "Rows:        source {}, extracted {}, staging {}, target {}",
            s(&r["sourceCount"]),
            s(&r["extractedCount"]),
            s(&r["stagingCount"]),
            s(&r["targetCount"])
        ),
        format!(
            "Started:     {}   heartbeat {}   completed {}",
            time(&r["startedAt"]),
            time(&r["heartbeatAt"]),
            time(&r["completedAt"])
        ),
        format!(
            "HDFS:        {}   stage table {}",
            s(&r["hdfsRunPath"]),
            s(&r["stageTable"])
        ),
    ];
    if !r["errorCode"].is_null() {
        out.push(format!(
            "Error:       {} {}: {}",
            s(&r["errorStage"]),
            s(&r["errorCode"]),
            s(&r["errorMessage"])
        ));
    }
    let parts: Vec<Vec<String>> = rows(&r["partitions"], |p| {
        vec![
            s(&p["partitionId"]),
            s(&p["status"]),
            format!("{}/{}", s(&p["actualRowCount"]), s(&p["expectedRowCount"])),
            s(&p["fileCount"]),
            s(&p["attemptCount"]),
            s(&p["workerNode"]),
            s(&p["errorCode"]),
        ]
    });
    out.push(String::new());
    out.push(table(
        &[
            "PARTITION",
            "STATUS",
            "ROWS",
            "FILES",
            "ATTEMPTS",
            "WORKER",
            "ERROR",
        ],
        parts,
    ));
    let dispatches: Vec<Vec<String>> = rows(&r["dispatches"], |d| {
        vec![
            s(&d["dispatchId"]),
            s(&d["dispatchType"]),
            s(&d["partitionId"]),
            s(&d["status"]),
            s(&d["attemptCount"]),
            time(&d["sentAt"]),
            time(&d["ackedAt"]),
        ]
    });
    out.push(String::new());
    out.push(table(
        &[
            "DISPATCH",
            "TYPE",
            "PARTITION",
            "STATUS",
            "ATTEMPTS",
            "SENT",
            "ACKED",
        ],
        dispatches,
    ));
    let metrics: Vec<Vec<String>> = rows(&v["validations"]["metrics"], |m| {
        vec![
            s(&m["stage"]),
            s(&m["metricName"]),
            s(&m["expectedValue"]),
            s(&m["actualValue"]),
            s(&m["result"]),
            s(&m["queryVersion"]),
        ]
    });
    out.push(String::new());
    out.push(table(
        &["STAGE", "METRIC", "EXPECTED", "ACTUAL", "RESULT", "VERSION"],
        metrics,
    ));
    let events: Vec<Vec<String>> = rows(&v["events"]["events"], |e| {
        vec![
            time(&e["eventTime"]),
            s(&e["level"]),
            s(&e["name"]),
            s(&e["partitionId"]),
            s(&e["message"]),
        ]
    });
    out.push(String::new());
    out.push(table(
        &["TIME", "LEVEL", "EVENT", "PARTITION", "MESSAGE"],
        events,
    ));
    out.join("\n")
}

pub fn change(v: &Value) -> String {
    let changed = v["changed"].as_bool().unwrap_or(false);
    format!(
        "run {}: {}",
        s(&v["runStatus"]),
        if changed {
            "changed"
        } else {
            "already so; nothing changed"
        }
    )
}

pub fn resent(v: &Value) -> String {
    format!(
        "dispatch {} is {}: the operator sends it at its next scan",
        s(&v["dispatchId"]),
        s(&v["status"])
    )
}

/// `resend --all-dead`: one line per dispatch, then the counts.
pub fn resent_in_bulk(v: &Value) -> String {
    let rows: Vec<Vec<String>> = rows(&v["dispatches"], |d| {
        vec![
            s(&d["runId"]),
            s(&d["dispatchId"]),
            s(&d["jobKey"]),
            s(&d["deadAt"]),
            s(&d["result"]),
        ]
    });
    let mut out = if rows.is_empty() {
        "no DEAD dispatch matches".to_string()
    } else {
        table(
            &["RUN ID", "DISPATCH ID", "JOB", "DEAD SINCE", "RESULT"],
            rows,
        )
    };
    if v["dryRun"] == true {
        out.push_str(&format!(
            "\n{} would be sent again (dry run: nothing sent)",
            s(&v["matched"])
        ));
        if v["moreThanShown"] == true {
            out.push_str("; the monitor shows 500 alerts at most, so there may be more");
        }
    } else {
        out.push_str(&format!(
            "\n{} matched: {} resent, {} refused, {} failed",
            s(&v["matched"]),
            s(&v["resent"]),
            s(&v["refused"]),
            s(&v["failed"])
        ));
    }
    out
}

pub fn summary(v: &Value) -> String {
    let mut out = vec![
        format!("Active runs:  {}", counts(&v["activeRuns"], ", ")),
        format!(
            "Last {}h:     {}",
            s(&v["recentWindowHours"]),
            counts(&v["recentRuns"], ", ")
        ),
        format!("Dispatches:   {}", counts(&v["dispatches"], ", ")),
        format!("Cleanup due:  {}", s(&v["cleanupDue"])),
        String::new(),
    ];
    let alerts: Vec<Vec<String>> = rows(&v["alerts"], |x| {
        vec![
            s(&x["severity"]),
            s(&x["kind"]),
            s(&x["runId"]),
            s(&x["jobKey"]),
            s(&x["businessKey"]),
            s(&x["status"]),
            time(&x["at"]),
            s(&x["message"]),
        ]
    });
    if alerts.is_empty() {
        out.push("No alerts.".into());
    } else {
        out.push(table(
            &[
                "SEVERITY",
                "ALERT",
                "RUN ID",
                "JOB",
                "BUSINESS KEY",
                "STATUS",
                "AT",
                "MESSAGE",
            ],
            alerts,
        ));
    }
    out.join("\n")
}

pub fn candidates(v: &Value) -> String {
    let rows = rows(&v["runs"], |r| {
        vec![
            s(&r["runId"]),
            s(&r["jobKey"]),
            s(&r["businessKey"]),
            s(&r["status"]),
            time(&r["completedAt"]),
            s(&r["hdfsRunPath"]),
            s(&r["stageTable"]),
        ]
    });
    table(
        &[
            "RUN ID",
            "JOB",
            "BUSINESS KEY",
            "STATUS",
            "ENDED",
            "HDFS RUN PATH",
            "STAGE TABLE",
        ],
        rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_and_show_missing_values_as_dashes() {
        let t = runs(
            &json!([{"runId": "r1", "jobKey": "J", "businessKey": "b", "status": "SUCCESS",
            "successPartitionCount": 4, "expectedPartitionCount": 4, "extractedCount": 10, "sourceCount": 10,
            "startedAt": "2026-09-28T03:12:44.512Z", "errorCode": null}]),
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("RUN ID  JOB  BUSINESS KEY  STATUS"));
        assert!(
            lines[1].contains("4/4")
                && lines[1].contains("10/10")
                && lines[1].contains("2026-09-28 03:12:44")
        );
        assert!(lines[1].ends_with('-'));
    }
}

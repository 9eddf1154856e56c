//! Metric judgement (CONTRACT §5.5): a stage passes only when it has at least one stored row and
//! none is FAIL (WARN passes). NiFi's own verdict is never trusted.

/// One stored metric row of the stage being judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMetric {
    pub metric_name: String,
    pub query_version: String,
    pub result: String,
}

/// The reasons a stage does not pass; empty when it passes. `FAIL <name>` per failing row, ordered
/// by metric name then query version.
pub fn judge_metrics(rows: &[StoredMetric]) -> Vec<String> {
    if rows.is_empty() {
        return vec!["NO_METRICS".to_string()];
    }
    let mut failing: Vec<&StoredMetric> = rows.iter().filter(|r| r.result == "FAIL").collect();
    failing.sort_by(|a, b| {
        (&a.metric_name, &a.query_version).cmp(&(&b.metric_name, &b.query_version))
    });
    failing
        .into_iter()
        .map(|r| format!("FAIL {}", r.metric_name))
        .collect()
}

/// A count metric's value when it is a plain non-negative integer (`^[0-9]+$`), else `None`.
pub fn count_value(actual: Option<&str>) -> Option<i64> {
    let s = actual?;
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, version: &str, result: &str) -> StoredMetric {
        StoredMetric {
            metric_name: name.into(),
            query_version: version.into(),
            result: result.into(),
        }
    }

    #[test]
    fn no_rows_fail_with_no_metrics() {
        assert_eq!(judge_metrics(&[]), vec!["NO_METRICS"]);
    }

    #[test]
    fn warn_passes_and_fails_are_listed_in_order() {
        assert!(judge_metrics(&[m("A", "v1", "PASS"), m("B", "v1", "WARN")]).is_empty());
        assert_eq!(
            judge_metrics(&[
                m("MIN_TS", "v2", "FAIL"),
                m("DUP", "v1", "PASS"),
                m("MIN_TS", "v1", "FAIL"),
                m("AMOUNT", "v1", "FAIL")
            ]),
            vec!["FAIL AMOUNT", "FAIL MIN_TS", "FAIL MIN_TS"]
        );
    }

    #[test]
    fn counts_must_be_plain_integers() {
        assert_eq!(count_value(Some("30")), Some(30));
        assert_eq!(count_value(Some("-1")), None);
        assert_eq!(count_value(Some("NULL")), None);
        assert_eq!(count_value(Some("")), None);
        assert_eq!(count_value(None), None);
    }
}

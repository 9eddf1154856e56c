//! The manifest PG-10 registers and its invariants (CONTRACT §5.2): a pure function that collects
//! every violation, in the contract's order, so one 422 tells NiFi everything that is wrong.
use crate::decimal::Decimal38;
use std::collections::HashSet;

#[derive(Debug, Clone, PartialEq)]
pub struct ManifestPartition {
    pub partition_id: String,
    pub lower_bound: Option<Decimal38>,
    pub upper_bound: Option<Decimal38>,
    /// The bounds exactly as the request wrote them (the response echoes them, §4.2).
    pub lower_text: Option<String>,
    pub upper_text: Option<String>,
    pub upper_inclusive: bool,
    pub is_null_partition: bool,
    pub expected_row_count: i64,
}

impl ManifestPartition {
    /// A range partition written as text, as a request would send it.
    pub fn range(id: &str, lower: &str, upper: &str, upper_inclusive: bool, rows: i64) -> Self {
        ManifestPartition {
            partition_id: id.into(),
            lower_bound: Decimal38::parse(lower),
            upper_bound: Decimal38::parse(upper),
            lower_text: Some(lower.into()),
            upper_text: Some(upper.into()),
            upper_inclusive,
            is_null_partition: false,
            expected_row_count: rows,
        }
    }

    /// The partition of rows whose split column is NULL.
    pub fn null(rows: i64) -> Self {
        ManifestPartition {
            partition_id: "NULL".into(),
            lower_bound: None,
            upper_bound: None,
            lower_text: None,
            upper_text: None,
            upper_inclusive: false,
            is_null_partition: true,
            expected_row_count: rows,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub snapshot_scn: Option<Decimal38>,
    pub source_count: i64,
    pub source_null_split_count: i64,
    pub source_min_split: Option<Decimal38>,
    pub source_max_split: Option<Decimal38>,
    pub planned_partition_count: i64,
    /// Metric name → value, in request order.
    pub source_metrics: Vec<(String, String)>,
    pub source_metrics_version: String,
    pub partitions: Vec<ManifestPartition>,
}

pub fn manifest_violations(m: &Manifest, allow_empty_source: bool) -> Vec<String> {
    let mut v = Vec::new();
    let mut seen = HashSet::new();
    if !m
        .partitions
        .iter()
        .all(|p| seen.insert(p.partition_id.as_str()))
    {
        v.push("DUPLICATE_PARTITION_ID".to_string());
    }
    let actual = m.partitions.len() as i64;
    if actual != m.planned_partition_count {
        v.push(format!(
            "PARTITION_COUNT_MISMATCH planned={} actual={actual}",
            m.planned_partition_count
        ));
    }
    // i128: 10,000 partitions of at most i64::MAX rows cannot overflow it.
    let sum: i128 = m
        .partitions
        .iter()
        .map(|p| p.expected_row_count as i128)
        .sum();
    if sum != m.source_count as i128 {
        v.push(format!(
            "EXPECTED_SUM_MISMATCH sum={sum} source={}",
            m.source_count
        ));
    }
    if m.source_count == 0 && !allow_empty_source {
        v.push("EMPTY_SOURCE_BLOCKED".to_string());
    }
    let nulls: Vec<&ManifestPartition> = m
        .partitions
        .iter()
        .filter(|p| p.is_null_partition)
        .collect();
    if nulls.len() > 1 {
        v.push("MULTIPLE_NULL_PARTITIONS".to_string());
    }
    for p in &nulls {
        if p.partition_id != "NULL" || p.lower_bound.is_some() || p.upper_bound.is_some() {
            v.push(format!("INVALID_NULL_PARTITION {}", p.partition_id));
        }
        if p.expected_row_count != m.source_null_split_count {
            v.push(format!(
                "NULL_COUNT_MISMATCH expected={} source={}",
                p.expected_row_count, m.source_null_split_count
            ));
        }
    }
    if nulls.is_empty() && m.source_null_split_count > 0 {
        v.push("NULL_ROWS_WITHOUT_NULL_PARTITION".to_string());
    }
    let mut ranged: Vec<(Decimal38, Decimal38, &ManifestPartition)> = Vec::new();
    for p in m.partitions.iter().filter(|p| !p.is_null_partition) {
        match (p.lower_bound, p.upper_bound) {
            (Some(lo), Some(hi)) if p.partition_id != "NULL" && lo <= hi => {
                ranged.push((lo, hi, p))
            }
            _ => v.push(format!("INVALID_BOUNDS {}", p.partition_id)),
        }
    }
    ranged.sort_by(|a, b| (a.0, &a.2.partition_id).cmp(&(b.0, &b.2.partition_id)));
    let last = ranged.len().saturating_sub(1);
    for (i, (_, _, p)) in ranged.iter().enumerate() {
        if p.upper_inclusive != (i == last) {
            v.push(format!("UPPER_INCLUSIVE_INVALID {}", p.partition_id));
        }
    }
    for pair in ranged.windows(2) {
        let (_, hi, p) = pair[0];
        let (next_lo, _, next) = pair[1];
        if hi != next_lo {
            v.push(format!(
                "RANGE_GAP_OR_OVERLAP {}->{}",
                p.partition_id, next.partition_id
            ));
        }
    }
    if let (Some(first), Some(last)) = (ranged.first(), ranged.last()) {
        if m.source_min_split.is_some_and(|min| min != first.0) {
            v.push("MIN_SPLIT_MISMATCH".to_string());
        }
        if m.source_max_split.is_some_and(|max| max != last.1) {
            v.push("MAX_SPLIT_MISMATCH".to_string());
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Option<Decimal38> {
        Decimal38::parse(s)
    }

    fn part(id: &str, lo: &str, hi: &str, incl: bool, rows: i64) -> ManifestPartition {
        ManifestPartition::range(id, lo, hi, incl, rows)
    }

    fn null_part(rows: i64) -> ManifestPartition {
        ManifestPartition::null(rows)
    }

    fn manifest(parts: Vec<ManifestPartition>, source: i64) -> Manifest {
        Manifest {
            snapshot_scn: d("1234567890"),
            source_count: source,
            source_null_split_count: 0,
            source_min_split: d("0"),
            source_max_split: d("3000"),
            planned_partition_count: parts.len() as i64,
            source_metrics: vec![],
            source_metrics_version: "v1".into(),
            partitions: parts,
        }
    }

    #[test]
    fn the_contract_example_is_valid() {
        let m = manifest(
            vec![
                part("0000", "0", "1000", false, 10),
                part("0001", "1000", "2000", false, 20),
                part("0002", "2000", "3000", true, 0),
            ],
            30,
        );
        assert!(manifest_violations(&m, false).is_empty());
    }

    #[test]
    fn every_violation_is_collected_in_order() {
        let mut m = manifest(
            vec![
                part("0000", "0", "1000", true, 10),
                part("0000", "1001", "2000", false, 20),
                part("0002", "3000", "2000", false, 5),
                null_part(4),
                null_part(1),
            ],
            30,
        );
        m.planned_partition_count = 9;
        m.source_null_split_count = 4;
        m.source_min_split = d("1");
        m.source_max_split = d("2000");
        assert_eq!(
            manifest_violations(&m, false),
            vec![
                "DUPLICATE_PARTITION_ID",
                "PARTITION_COUNT_MISMATCH planned=9 actual=5",
                "EXPECTED_SUM_MISMATCH sum=40 source=30",
                "MULTIPLE_NULL_PARTITIONS",
                "NULL_COUNT_MISMATCH expected=1 source=4",
                "INVALID_BOUNDS 0002",
                "UPPER_INCLUSIVE_INVALID 0000",
                "UPPER_INCLUSIVE_INVALID 0000",
                "RANGE_GAP_OR_OVERLAP 0000->0000",
                "MIN_SPLIT_MISMATCH",
            ]
        );
    }

    #[test]
    fn empty_source_needs_permission_and_null_rows_need_a_null_partition() {
        let mut m = manifest(vec![part("0000", "0", "10", true, 0)], 0);
        m.source_max_split = d("10");
        assert_eq!(manifest_violations(&m, false), vec!["EMPTY_SOURCE_BLOCKED"]);
        assert!(manifest_violations(&m, true).is_empty());
        m.source_null_split_count = 3;
        assert_eq!(
            manifest_violations(&m, true),
            vec!["NULL_ROWS_WITHOUT_NULL_PARTITION"]
        );
    }

    #[test]
    fn null_partition_rules() {
        let mut bad_null = null_part(2);
        bad_null.partition_id = "0009".into();
        bad_null.lower_bound = d("1");
        let mut m = manifest(vec![part("0000", "0", "3000", true, 10), bad_null], 12);
        m.source_null_split_count = 2;
        assert_eq!(
            manifest_violations(&m, false),
            vec!["INVALID_NULL_PARTITION 0009"]
        );
        let ranged_named_null = part("NULL", "0", "3000", true, 12);
        let m = manifest(vec![ranged_named_null], 12);
        assert_eq!(manifest_violations(&m, false), vec!["INVALID_BOUNDS NULL"]);
    }

    /// Each of the three marks of an invalid null partition is enough on its own (a wrong id, a
    /// lower bound, an upper bound): cargo-mutants' `||` → `&&` mutants of that check survived a
    /// test whose bad null partition had two of them.
    #[test]
    fn each_mark_of_an_invalid_null_partition_suffices() {
        let marks: [fn(&mut ManifestPartition); 3] = [
            |p| p.partition_id = "0009".into(),
            |p| p.lower_bound = d("1"),
            |p| p.upper_bound = d("1"),
        ];
        for mark in marks {
            let mut bad_null = null_part(2);
            mark(&mut bad_null);
            let id = bad_null.partition_id.clone();
            let mut m = manifest(vec![part("0000", "0", "3000", true, 10), bad_null], 12);
            m.source_null_split_count = 2;
            assert_eq!(
                manifest_violations(&m, false),
                vec![format!("INVALID_NULL_PARTITION {id}")]
            );
        }
    }

    #[test]
    fn sum_cannot_overflow() {
        let m = manifest(
            vec![
                part("0000", "0", "1", false, i64::MAX),
                part("0001", "1", "3000", true, i64::MAX),
            ],
            5,
        );
        let v = manifest_violations(&m, false);
        assert_eq!(
            v,
            vec![format!(
                "EXPECTED_SUM_MISMATCH sum={} source=5",
                2 * (i64::MAX as i128)
            )]
        );
    }

    #[test]
    fn decimal_bounds_compare_exactly() {
        let big = "12345678901234567890123456789012345678";
        let next = "12345678901234567890123456789012345679";
        let mut m = manifest(
            vec![
                part("0000", "0", big, false, 1),
                part("0001", next, next, true, 1),
            ],
            2,
        );
        m.source_max_split = d(next);
        assert_eq!(
            manifest_violations(&m, false),
            vec!["RANGE_GAP_OR_OVERLAP 0000->0001"]
        );
    }
}

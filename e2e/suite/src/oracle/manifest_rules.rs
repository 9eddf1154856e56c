//! The manifest invariants of CONTRACT §5.2, as a pure function of the request and the run's
//! `allowEmptySource`. Decimals are compared exactly (38 digits fit an i128).
use super::request::{Decimal, ManifestReq, Opt};
use std::collections::BTreeSet;

pub fn dec(d: &Opt<Decimal>) -> Option<i128> {
    d.value().and_then(|d| d.text.parse::<i128>().ok())
}

/// The canonical decimal text the ledger stores (and answers on a replay).
pub fn canonical(d: &Opt<Decimal>) -> Option<String> {
    dec(d).map(|n| n.to_string())
}

pub fn is_null_partition(p: &super::request::PartitionItem) -> bool {
    p.is_null.unwrap_or(false)
}

/// Every violation, in the order of §5.2.
///
/// Ambiguity resolved: rule 9 lists every `UPPER_INCLUSIVE_INVALID` (in sorted order) before
/// every `RANGE_GAP_OR_OVERLAP` (the order of the sentence).
pub fn violations(m: &ManifestReq, allow_empty: bool) -> Vec<String> {
    let mut v = Vec::new();
    let mut seen = BTreeSet::new();
    if m.partitions
        .iter()
        .any(|p| !seen.insert(p.partition_id.clone()))
    {
        v.push("DUPLICATE_PARTITION_ID".to_string());
    }
    if m.partitions.len() as i64 != m.planned {
        v.push(format!(
            "PARTITION_COUNT_MISMATCH planned={} actual={}",
            m.planned,
            m.partitions.len()
        ));
    }
    let sum: i128 = m.partitions.iter().map(|p| p.expected as i128).sum();
    if sum != m.source_count as i128 {
        v.push(format!(
            "EXPECTED_SUM_MISMATCH sum={sum} source={}",
            m.source_count
        ));
    }
    if m.source_count == 0 && !allow_empty {
        v.push("EMPTY_SOURCE_BLOCKED".to_string());
    }
    let nulls: Vec<_> = m
        .partitions
        .iter()
        .filter(|p| is_null_partition(p))
        .collect();
    if nulls.len() > 1 {
        v.push("MULTIPLE_NULL_PARTITIONS".to_string());
    }
    let null_split = m.source_null_split_count.unwrap_or(0);
    for p in &nulls {
        if p.partition_id != "NULL" || p.lower.value().is_some() || p.upper.value().is_some() {
            v.push(format!("INVALID_NULL_PARTITION {}", p.partition_id));
        }
        if p.expected != null_split {
            v.push(format!(
                "NULL_COUNT_MISMATCH expected={} source={null_split}",
                p.expected
            ));
        }
    }
    if nulls.is_empty() && null_split > 0 {
        v.push("NULL_ROWS_WITHOUT_NULL_PARTITION".to_string());
    }
    let mut ranged = Vec::new();
    for p in m.partitions.iter().filter(|p| !is_null_partition(p)) {
        match (dec(&p.lower), dec(&p.upper)) {
            (Some(lo), Some(hi)) if p.partition_id != "NULL" && lo <= hi => ranged.push((
                lo,
                p.partition_id.clone(),
                hi,
                p.upper_inclusive.unwrap_or(false),
            )),
            _ => v.push(format!("INVALID_BOUNDS {}", p.partition_id)),
        }
    }
    ranged.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let last = ranged.len().saturating_sub(1);
    for (i, (_, id, _, inclusive)) in ranged.iter().enumerate() {
        if *inclusive != (i == last) {
            v.push(format!("UPPER_INCLUSIVE_INVALID {id}"));
        }
    }
    for w in ranged.windows(2) {
        if w[0].2 != w[1].0 {
            v.push(format!("RANGE_GAP_OR_OVERLAP {}->{}", w[0].1, w[1].1));
        }
    }
    if let (Some(first), Some(lastp)) = (ranged.first(), ranged.last()) {
        if dec(&m.source_min_split).is_some_and(|min| min != first.0) {
            v.push("MIN_SPLIT_MISMATCH".to_string());
        }
        if dec(&m.source_max_split).is_some_and(|max| max != lastp.2) {
            v.push("MAX_SPLIT_MISMATCH".to_string());
        }
    }
    v
}

//! Request contents the generator draws: manifests (valid, and broken one way at a time), chunk
//! plans of a partition (right, or with a gate mismatch), metric reports.
use super::request::{ChunkReq, Decimal, ManifestReq, MetricReq, Opt, PartitionItem};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;
use uuid::Uuid;

pub fn uuid(rng: &mut StdRng) -> Uuid {
    uuid::Builder::from_random_bytes(rng.random()).into_uuid()
}

/// `Absent`, `Null` or `Some(v)`, with `Some` most often.
pub fn opt<T>(rng: &mut StdRng, v: T) -> Opt<T> {
    match rng.random_range(0..10) {
        0 | 1 => Opt::Absent,
        2 => Opt::Null,
        _ => Opt::Some(v),
    }
}

fn decimal(rng: &mut StdRng, n: i128) -> Decimal {
    let canonical = n.to_string();
    match rng.random_range(0..10) {
        // Leading zeros: echoed as sent, stored canonical (§3.4, §4.2).
        0 if n > 0 => Decimal {
            text: format!("00{canonical}"),
            as_number: false,
        },
        1..=4 if n.abs() < i64::MAX as i128 => Decimal {
            text: canonical,
            as_number: true,
        },
        _ => Decimal {
            text: canonical,
            as_number: false,
        },
    }
}

fn flag(rng: &mut StdRng, v: bool) -> Option<bool> {
    if !v && rng.random_bool(0.5) {
        None
    } else {
        Some(v)
    }
}

/// A valid manifest: 1..4 ranged partitions (some expecting 0 rows), maybe a NULL partition.
/// `allow_empty`: the run allows an empty source (otherwise at least one row is planned).
pub fn manifest(rng: &mut StdRng, allow_empty: bool) -> ManifestReq {
    let n = rng.random_range(1..=4);
    let mut lower: i128 = if rng.random_bool(0.1) {
        // 38 digits: exact decimals, never floats.
        99_999_999_999_999_999_999_999_999_999_999_000
    } else {
        rng.random_range(-50..1000)
    };
    let empty_source = allow_empty && rng.random_bool(0.3);
    let mut partitions = Vec::new();
    for i in 0..n {
        let upper = lower + rng.random_range(1..100);
        let expected = if empty_source || rng.random_bool(0.2) {
            0
        } else {
            rng.random_range(1..9)
        };
        partitions.push(PartitionItem {
            partition_id: format!("{i:04}"),
            lower: Opt::Some(decimal(rng, lower)),
            upper: Opt::Some(decimal(rng, upper)),
            upper_inclusive: flag(rng, i + 1 == n),
            is_null: flag(rng, false),
            expected,
        });
        lower = upper;
    }
    let mut null_split = 0;
    if !empty_source && rng.random_bool(0.3) {
        null_split = rng.random_range(0..4);
        partitions.push(PartitionItem {
            partition_id: "NULL".into(),
            lower: if rng.random_bool(0.5) {
                Opt::Absent
            } else {
                Opt::Null
            },
            upper: if rng.random_bool(0.5) {
                Opt::Absent
            } else {
                Opt::Null
            },
            upper_inclusive: None,
            is_null: Some(true),
            expected: null_split,
        });
    }
    if !allow_empty && partitions.iter().all(|p| p.expected == 0) {
        partitions[0].expected = 3;
    }
    if rng.random_bool(0.3) {
        partitions.reverse();
    }
    let first = partitions
        .iter()
        .filter_map(|p| p.lower.value())
        .map(|d| d.text.parse::<i128>().unwrap())
        .min();
    let last = partitions
        .iter()
        .filter_map(|p| p.upper.value())
        .map(|d| d.text.parse::<i128>().unwrap())
        .max();
    let scn: i128 = if rng.random_bool(0.2) {
        12_345_678_901_234_567_890_123_456_789_012_345_678
    } else {
        rng.random_range(1..1_000_000_000)
    };
    let scn_text = Decimal {
        text: scn.to_string(),
        as_number: scn < i64::MAX as i128 && rng.random_bool(0.5),
    };
    let min_split = decimal(rng, first.unwrap_or(0));
    let max_split = decimal(rng, last.unwrap_or(0));
    ManifestReq {
        snapshot_scn: opt(rng, scn_text),
        source_count: partitions.iter().map(|p| p.expected).sum(),
        source_null_split_count: if null_split == 0 && rng.random_bool(0.5) {
            None
        } else {
            Some(null_split)
        },
        source_min_split: opt(rng, min_split),
        source_max_split: opt(rng, max_split),
        planned: partitions.len() as i64,
        source_metrics: match rng.random_range(0..4) {
            0 => None,
            1 => Some(vec![]),
            // [v1-ext] a SOURCE_COUNT entry is ignored.
            2 => Some(vec![
                ("AMOUNT_SUM".into(), "123.45".into()),
                ("SOURCE_COUNT".into(), "999".into()),
            ]),
            _ => Some(vec![
                ("AMOUNT_SUM".into(), "98.6".into()),
                ("MAX_TS".into(), "2026-09-28 23:59:59".into()),
            ]),
        },
        source_metrics_version: match rng.random_range(0..3) {
            0 => None,
            1 => Some("v1".into()),
            _ => Some("v2".into()),
        },
        partitions,
    }
}

/// A manifest broken in one way (§5.2), or an empty source the run does not allow.
pub fn broken_manifest(rng: &mut StdRng, allow_empty: bool) -> ManifestReq {
    let mut m = manifest(rng, allow_empty);
    let ranged: Vec<usize> = (0..m.partitions.len())
        .filter(|i| m.partitions[*i].partition_id != "NULL")
        .collect();
    match rng.random_range(0..7) {
        0 => m.planned += 1,
        1 => m.partitions[0].expected += 1,
        2 => {
            let i = ranged[rng.random_range(0..ranged.len())];
            let p = &mut m.partitions[i];
            p.upper_inclusive = Some(!p.upper_inclusive.unwrap_or(false));
        }
        3 => {
            let i = ranged[0];
            let p = m.partitions[i].clone();
            m.partitions.push(p);
            m.planned += 1;
            m.source_count += m.partitions[i].expected;
        }
        4 => m.source_null_split_count = Some(m.source_null_split_count.unwrap_or(0) + 1),
        5 => {
            let i = ranged[rng.random_range(0..ranged.len())];
            let p = &mut m.partitions[i];
            let up: i128 = p.upper.value().unwrap().text.parse().unwrap();
            p.upper = Opt::Some(Decimal {
                text: (up + 1).to_string(),
                as_number: false,
            });
        }
        _ => {
            m.source_count = 0;
            for p in &mut m.partitions {
                p.expected = 0;
            }
            m.source_null_split_count = None;
        }
    }
    m
}

/// How a worker will report a partition: its chunks, right or with one gate flaw.
pub fn chunk_plan(
    rng: &mut StdRng,
    run_path: &str,
    pid: &str,
    expected: i64,
    token: Uuid,
) -> Vec<ChunkReq> {
    let count = rng.random_range(1..=3i64).min(expected.max(1));
    let mut rows = vec![0i64; count as usize];
    for _ in 0..expected {
        let i = rng.random_range(0..count as usize);
        rows[i] += 1;
    }
    // Bytes: all reported, none reported (the partition's byte_count is then NULL, §5.3),
    // or some as JSON null.
    let bytes_mode = rng.random_range(0..4);
    // Any depth below the run directory is accepted (§4.7 step 4; only `..` segments refused).
    let dir = match rng.random_range(0..40) {
        0..=7 => format!("{run_path}/p={pid}/sub"),
        8 => format!("{run_path}/p={pid}/./sub"),
        _ => format!("{run_path}/p={pid}"),
    };
    let mut plan: Vec<ChunkReq> = (0..count)
        .map(|i| ChunkReq {
            token,
            index: i,
            count,
            fragment: opt(rng, format!("f-{pid}-{i}")),
            path: format!("{dir}/part-{i}.parquet"),
            records: rows[i as usize],
            bytes: match bytes_mode {
                0 => Opt::Absent,
                1 if i == 0 => Opt::Null,
                _ => Opt::Some(rng.random_range(0..5000)),
            },
        })
        .collect();
    match rng.random_range(0..12) {
        0 => plan[0].records += 1,
        1 if count > 1 => plan[1].count = count + 1,
        _ => {}
    }
    plan
}

const STAGING_NAMES: [&str; 5] = [
    "STAGE_COUNT",
    "DUP_PK_COUNT",
    "AMOUNT_SUM",
    "NULL_SPLIT_COUNT",
    "MIN_TS",
];
const TARGET_NAMES: [&str; 4] = ["TARGET_COUNT", "DUP_PK_COUNT", "AMOUNT_SUM", "MAX_TS"];

/// 1..3 metrics of `stage` with distinct names; `count` is the run's row count (for the
/// STAGE_COUNT / TARGET_COUNT values), results mostly PASS.
pub fn metrics(rng: &mut StdRng, stage: &str, count: i64) -> Vec<MetricReq> {
    let names: &[&str] = if stage == "STAGING" {
        &STAGING_NAMES
    } else {
        &TARGET_NAMES
    };
    let k = rng.random_range(1..=3);
    let mut picked: Vec<&str> = Vec::new();
    while picked.len() < k {
        let n = if picked.is_empty() && rng.random_bool(0.7) {
            names[0]
        } else {
            names[rng.random_range(0..names.len())]
        };
        if !picked.contains(&n) {
            picked.push(n);
        }
    }
    picked
        .into_iter()
        .map(|name| {
            let actual = if name.ends_with("_COUNT") && name != "DUP_PK_COUNT" {
                match rng.random_range(0..8) {
                    0 => String::new(),
                    1 => "NULL".into(),
                    _ => count.to_string(),
                }
            } else {
                "0".into()
            };
            MetricReq {
                name: name.into(),
                expected: opt(rng, count.to_string()),
                actual: if rng.random_bool(0.1) {
                    Opt::Null
                } else {
                    Opt::Some(actual)
                },
                tolerance: opt(rng, "0".into()),
                result: match rng.random_range(0..10) {
                    0 => "FAIL",
                    1 => "WARN",
                    _ => "PASS",
                }
                .into(),
                details: rng
                    .random_bool(0.3)
                    .then(|| json!({"sql": "q7", "Mixed.Case": [1, 2]})),
            }
        })
        .collect()
}

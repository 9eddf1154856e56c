//! Property tests of the pure rules the model checker abstracts (docs/model.md): the manifest
//! invariants (CONTRACT §5.2), against generated inputs and against a
//! reference written straight from the contract's words.
use ledger::Decimal38;
use ledger::manifest::{Manifest, ManifestPartition, manifest_violations};
use proptest::prelude::*;

fn dec(v: i128) -> Option<Decimal38> {
    Decimal38::parse(&v.to_string())
}

/// A valid manifest: contiguous ranges between increasing boundaries, only the last inclusive,
/// counts summing to the source count, and maybe a NULL partition; partitions in any order.
fn valid_manifest() -> impl Strategy<Value = Manifest> {
    (
        prop::collection::vec(1i128..1_000_000, 1..40),
        -1_000_000_000i128..1_000_000_000,
        prop::option::of(0i64..1_000),
        any::<u64>(),
    )
        .prop_flat_map(|(steps, start, nulls, shuffle)| {
            let n = steps.len();
            (
                Just(steps),
                Just(start),
                Just(nulls),
                Just(shuffle),
                prop::collection::vec(0i64..1_000_000_000, n),
            )
        })
        .prop_map(|(steps, start, nulls, shuffle, rows)| {
            let mut bounds = vec![start];
            for s in &steps {
                bounds.push(bounds.last().unwrap() + s);
            }
            let n = steps.len();
            let mut partitions: Vec<ManifestPartition> = (0..n)
                .map(|i| {
                    ManifestPartition::range(
                        &format!("{i:04}"),
                        &bounds[i].to_string(),
                        &bounds[i + 1].to_string(),
                        i == n - 1,
                        rows[i],
                    )
                })
                .collect();
            if let Some(rows) = nulls {
                partitions.push(ManifestPartition::null(rows));
            }
            // Order must not matter: rotate by a generated amount.
            let len = partitions.len();
            partitions.rotate_left((shuffle as usize) % len);
            let source: i64 = rows.iter().sum::<i64>() + nulls.unwrap_or(0);
            Manifest {
                snapshot_scn: dec(1_234_567_890),
                source_count: source,
                source_null_split_count: nulls.unwrap_or(0),
                source_min_split: dec(bounds[0]),
                source_max_split: dec(*bounds.last().unwrap()),
                planned_partition_count: len as i64,
                source_metrics: vec![],
                source_metrics_version: "v1".into(),
                partitions,
            }
        })
}

fn has(violations: &[String], code: &str) -> bool {
    violations.iter().any(|v| v.starts_with(code))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn a_valid_manifest_has_no_violation(m in valid_manifest()) {
        prop_assert_eq!(manifest_violations(&m, true), Vec::<String>::new());
    }

    #[test]
    fn a_changed_count_is_an_expected_sum_mismatch(m in valid_manifest(), pick in any::<usize>(), delta in 1i64..1_000) {
        let mut m = m;
        let i = pick % m.partitions.len();
        m.partitions[i].expected_row_count += delta;
        let v = manifest_violations(&m, true);
        prop_assert!(has(&v, "EXPECTED_SUM_MISMATCH"), "{:?}", v);
    }

    #[test]
    fn a_moved_boundary_is_a_gap_or_an_overlap(m in valid_manifest(), pick in any::<usize>(), shift in prop_oneof![-1_000i128..0, 1i128..1_000]) {
        let mut m = m;
        let ranged: Vec<usize> = (0..m.partitions.len()).filter(|i| !m.partitions[*i].is_null_partition).collect();
        prop_assume!(ranged.len() >= 2);
        // Move the lower bound of a partition that is not the first one.
        let first = ranged.iter().copied().min_by_key(|i| m.partitions[*i].lower_bound).unwrap();
        let i = ranged.iter().copied().filter(|i| *i != first).nth(pick % (ranged.len() - 1)).unwrap();
        let p = &mut m.partitions[i];
        let lo = p.lower_bound.unwrap().value() + shift;
        prop_assume!(lo <= p.upper_bound.unwrap().value());
        p.lower_bound = dec(lo);
        let v = manifest_violations(&m, true);
        prop_assert!(has(&v, "RANGE_GAP_OR_OVERLAP") || has(&v, "UPPER_INCLUSIVE_INVALID"), "{:?}", v);
    }

    #[test]
    fn a_duplicated_id_or_a_wrong_planned_count_is_refused(m in valid_manifest(), pick in any::<usize>()) {
        let mut dup = m.clone();
        let copy = dup.partitions[pick % dup.partitions.len()].clone();
        dup.partitions.push(copy);
        let v = manifest_violations(&dup, true);
        prop_assert!(has(&v, "DUPLICATE_PARTITION_ID"), "{:?}", v);
        prop_assert!(has(&v, "PARTITION_COUNT_MISMATCH"), "{:?}", v);
        let mut planned = m;
        planned.planned_partition_count += 1;
        let v = manifest_violations(&planned, true);
        prop_assert!(has(&v, "PARTITION_COUNT_MISMATCH"), "{:?}", v);
    }

    #[test]
    fn an_inclusive_upper_bound_anywhere_but_last_is_refused(m in valid_manifest(), pick in any::<usize>()) {
        let mut m = m;
        let i = pick % m.partitions.len();
        prop_assume!(!m.partitions[i].is_null_partition);
        m.partitions[i].upper_inclusive = !m.partitions[i].upper_inclusive;
        let v = manifest_violations(&m, true);
        prop_assert!(has(&v, "UPPER_INCLUSIVE_INVALID"), "{:?}", v);
    }
}

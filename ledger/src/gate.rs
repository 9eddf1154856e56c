//! The chunk gate (CONTRACT §5.3): judges a partition from the ledger's aggregate of its WRITTEN
//! chunk rows, never from the current report alone.

/// Aggregate of one partition's WRITTEN `load_file` rows (§4.7 step 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkAggregate {
    pub files: i64,
    pub lo: Option<i32>,
    pub hi: Option<i32>,
    /// Σ record_count; i128 because a sum of bigints may exceed i64.
    pub rows: i128,
    pub bytes: Option<i128>,
    pub distinct_counts: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateVerdict {
    Success,
    Mismatch(String),
}

/// Whether the report must be judged at all (§4.7 step 9): enough chunks are in.
pub fn gate_due(agg: &ChunkAggregate, chunk_count: i64) -> bool {
    agg.files >= chunk_count
}

pub fn judge_chunk_gate(agg: &ChunkAggregate, chunk_count: i64, expected_rows: i64) -> GateVerdict {
    let complete = agg.files == chunk_count
        && agg.lo == Some(0)
        // hi + 1 rather than chunk_count − 1: no overflow whatever the caller passes.
        && agg.hi.map(|hi| i64::from(hi) + 1) == Some(chunk_count)
        && agg.distinct_counts == 1;
    if complete && agg.rows == expected_rows as i128 {
        GateVerdict::Success
    } else {
        GateVerdict::Mismatch(format!(
            "files={} chunkCount={chunk_count} distinctCounts={} rows={} expected={expected_rows}",
            agg.files, agg.distinct_counts, agg.rows
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agg(files: i64, lo: i32, hi: i32, rows: i128, distinct: i64) -> ChunkAggregate {
        ChunkAggregate {
            files,
            lo: Some(lo),
            hi: Some(hi),
            rows,
            bytes: None,
            distinct_counts: distinct,
        }
    }

    #[test]
    fn complete_and_counted_passes() {
        assert_eq!(
            judge_chunk_gate(&agg(2, 0, 1, 10, 1), 2, 10),
            GateVerdict::Success
        );
        assert_eq!(
            judge_chunk_gate(&agg(1, 0, 0, 0, 1), 1, 0),
            GateVerdict::Success
        );
    }

    #[test]
    fn wrong_rows_extra_chunks_or_mixed_counts_fail_with_the_contract_message() {
        assert_eq!(
            judge_chunk_gate(&agg(2, 0, 1, 9, 1), 2, 10),
            GateVerdict::Mismatch(
                "files=2 chunkCount=2 distinctCounts=1 rows=9 expected=10".into()
            )
        );
        assert!(matches!(
            judge_chunk_gate(&agg(3, 0, 2, 10, 1), 2, 10),
            GateVerdict::Mismatch(_)
        ));
        assert!(matches!(
            judge_chunk_gate(&agg(2, 0, 1, 10, 2), 2, 10),
            GateVerdict::Mismatch(_)
        ));
        assert!(matches!(
            judge_chunk_gate(&agg(2, 1, 2, 10, 1), 2, 10),
            GateVerdict::Mismatch(_)
        ));
    }

    #[test]
    fn judged_only_once_enough_chunks_are_in() {
        assert!(!gate_due(&agg(1, 0, 0, 5, 1), 2));
        assert!(gate_due(&agg(2, 0, 1, 5, 1), 2));
        assert!(gate_due(&agg(3, 0, 2, 5, 1), 2));
    }
}

//! The chunk gate (CONTRACT §5.3) lives in one place, `nifi_ops.chunk_gate` (migration
//! 20261204000015), where the deciding report runs it: judged here on the real server, against
//! cases written from the contract's words and against generated chunk sets compared with a
//! reference written straight from the contract.
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use sqlx::PgConnection;
use std::collections::BTreeMap;
use testkit::TestDb;

/// An aggregate as `nifi_ops.record_chunk` computes it over a partition's WRITTEN chunks.
#[derive(Debug, Clone)]
struct Aggregate {
    files: i64,
    lo: Option<i32>,
    hi: Option<i32>,
    /// Σ record_count (a sum of bigints may exceed one).
    rows: i128,
    distinct_counts: i64,
}

/// One gate question: the aggregate, the report's chunkCount, the partition's expected rows.
type Case = (Aggregate, i32, i64);

/// The gate's answers to `cases`, in order, from one statement: NULL (passes) or the mismatch's
/// message.
async fn judged(conn: &mut PgConnection, cases: &[Case]) -> Vec<Option<String>> {
    let col = |f: fn(&Case) -> Option<String>| cases.iter().map(f).collect::<Vec<_>>();
    sqlx::query_scalar(
        "SELECT nifi_ops.chunk_gate(f::bigint, l::integer, h::integer, r::numeric, d::bigint, c::integer, e::bigint) \
           FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) \
                WITH ORDINALITY AS u(f, l, h, r, d, c, e, n) ORDER BY n",
    )
    .bind(col(|c| Some(c.0.files.to_string())))
    .bind(col(|c| c.0.lo.map(|v| v.to_string())))
    .bind(col(|c| c.0.hi.map(|v| v.to_string())))
    .bind(col(|c| Some(c.0.rows.to_string())))
    .bind(col(|c| Some(c.0.distinct_counts.to_string())))
    .bind(col(|c| Some(c.1.to_string())))
    .bind(col(|c| Some(c.2.to_string())))
    .fetch_all(conn)
    .await
    .expect("the gate judges every case")
}

fn agg(files: i64, lo: i32, hi: i32, rows: i128, distinct_counts: i64) -> Aggregate {
    Aggregate {
        files,
        lo: Some(lo),
        hi: Some(hi),
        rows,
        distinct_counts,
    }
}

#[tokio::test]
async fn the_gate_passes_complete_counted_partitions_and_names_every_mismatch() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    let cases = [
        (agg(2, 0, 1, 10, 1), 2, 10),
        (agg(1, 0, 0, 0, 1), 1, 0),
        // Wrong rows, an extra chunk, mixed chunkCounts, indexes off by one, too few chunks.
        (agg(2, 0, 1, 9, 1), 2, 10),
        (agg(3, 0, 2, 10, 1), 2, 10),
        (agg(2, 0, 1, 10, 2), 2, 10),
        (agg(2, 1, 2, 10, 1), 2, 10),
        (agg(1, 0, 0, 10, 1), 2, 10),
        // A lowest index that is not 0, whatever else agrees (no real aggregate is this one:
        // two distinct indexes cannot both be 1; the gate states the contract all the same).
        (agg(2, 1, 1, 10, 1), 2, 10),
        // No chunk at all, and a sum beyond any bigint.
        (
            Aggregate {
                files: 0,
                lo: None,
                hi: None,
                rows: 0,
                distinct_counts: 0,
            },
            1,
            0,
        ),
        (agg(2, 0, 1, i128::from(i64::MAX) * 2, 1), 2, i64::MAX),
    ];
    let answers = judged(&mut conn, &cases).await;
    let m = |s: &str| Some(s.to_string());
    assert_eq!(
        answers,
        vec![
            None,
            None,
            m("files=2 chunkCount=2 distinctCounts=1 rows=9 expected=10"),
            m("files=3 chunkCount=2 distinctCounts=1 rows=10 expected=10"),
            m("files=2 chunkCount=2 distinctCounts=2 rows=10 expected=10"),
            m("files=2 chunkCount=2 distinctCounts=1 rows=10 expected=10"),
            m("files=1 chunkCount=2 distinctCounts=1 rows=10 expected=10"),
            m("files=2 chunkCount=2 distinctCounts=1 rows=10 expected=10"),
            m("files=0 chunkCount=1 distinctCounts=0 rows=0 expected=0"),
            m(&format!(
                "files=2 chunkCount=2 distinctCounts=1 rows={} expected={}",
                i128::from(i64::MAX) * 2,
                i64::MAX
            )),
        ]
    );
}

/// The aggregate §4.7 step 8 computes over WRITTEN rows (chunk index is the primary key).
fn aggregate(chunks: &BTreeMap<i32, (i64, i64)>) -> Aggregate {
    let mut counts: Vec<i64> = chunks.values().map(|(c, _)| *c).collect();
    counts.sort();
    counts.dedup();
    Aggregate {
        files: chunks.len() as i64,
        lo: chunks.keys().next().copied(),
        hi: chunks.keys().next_back().copied(),
        rows: chunks.values().map(|(_, r)| *r as i128).sum(),
        distinct_counts: counts.len() as i64,
    }
}

/// §5.3 in words: every index 0..chunkCount−1 reported exactly once with this chunkCount, nothing
/// else, and the rows add up to the expected count.
fn contract_success(chunks: &BTreeMap<i32, (i64, i64)>, chunk_count: i64, expected: i64) -> bool {
    chunks.len() as i64 == chunk_count
        && (0..chunk_count).all(|i| {
            i32::try_from(i)
                .ok()
                .and_then(|i| chunks.get(&i))
                .is_some_and(|(c, _)| *c == chunk_count)
        })
        && chunks.values().map(|(_, r)| *r as i128).sum::<i128>() == expected as i128
}

/// Stored chunks (index → chunkCount, recordCount), the judged report's chunkCount, the expected
/// rows.
fn chunk_sets() -> impl Strategy<Value = (BTreeMap<i32, (i64, i64)>, i64, i64)> {
    (1i64..8, 0i64..50)
        .prop_flat_map(|(count, per_chunk)| {
            // Mostly well-formed reports, with extra, missing and disagreeing chunks mixed in.
            let chunk = (
                0i32..(count as i32 + 2),
                prop_oneof![8 => Just(count), 1 => 1i64..9],
                prop_oneof![8 => Just(per_chunk), 1 => 0i64..60],
            );
            (
                prop::collection::vec(chunk.clone(), 0..(count as usize + 3)),
                chunk,
                prop_oneof![3 => Just(count * per_chunk), 1 => 0i64..400],
            )
        })
        .prop_map(|(earlier, current, expected)| {
            let mut stored = BTreeMap::new();
            for (i, c, r) in earlier {
                stored.insert(i, (c, r));
            }
            // The report being judged is upserted last.
            stored.insert(current.0, (current.1, current.2));
            (stored, current.1, expected)
        })
}

/// Whole partitions (every index once, one chunkCount, the rows adding up), then one of the
/// mistakes a flow makes, or none: the random sets above rarely hit a passing partition.
fn whole_partitions() -> impl Strategy<Value = (BTreeMap<i32, (i64, i64)>, i64, i64)> {
    (1i64..8, 0i64..50, 0u8..5, any::<prop::sample::Index>()).prop_map(
        |(count, per_chunk, mistake, pick)| {
            let mut stored: BTreeMap<i32, (i64, i64)> =
                (0..count as i32).map(|i| (i, (count, per_chunk))).collect();
            let mut expected = count * per_chunk;
            // Never the judged report's own chunk (the last index), which is stored as reported.
            let i = pick.index((count as usize - 1).max(1)) as i32;
            match mistake {
                1 if count > 1 => stored
                    .insert(i, (count + 1, per_chunk))
                    .map(drop)
                    .unwrap_or(()),
                2 if count > 1 => stored.remove(&i).map(drop).unwrap_or(()),
                3 => stored
                    .insert(count as i32, (count, per_chunk))
                    .map(drop)
                    .unwrap_or(()),
                4 => expected += 1,
                _ => {}
            }
            (stored, count, expected)
        },
    )
}

/// Generated without shrinking (the cases go to the server in one statement); a failure prints
/// the chunk set.
fn generated<T: std::fmt::Debug>(strategy: impl Strategy<Value = T>, n: usize) -> Vec<T> {
    let mut runner = TestRunner::new(Config::default());
    (0..n)
        .map(|_| strategy.new_tree(&mut runner).expect("a case").current())
        .collect()
}

#[tokio::test]
async fn the_gate_passes_exactly_when_the_contract_says() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    let mut sets = generated(chunk_sets(), 4_000);
    sets.extend(generated(whole_partitions(), 1_000));
    let cases: Vec<Case> = sets
        .iter()
        .map(|(stored, count, expected)| (aggregate(stored), *count as i32, *expected))
        .collect();
    let answers = judged(&mut conn, &cases).await;
    let mut passed = 0;
    for ((stored, count, expected), answer) in sets.iter().zip(&answers) {
        assert_eq!(
            answer.is_none(),
            contract_success(stored, *count, *expected),
            "{stored:?} chunkCount={count} expected={expected}: {answer:?}"
        );
        passed += usize::from(answer.is_none());
    }
    // Both sides of the gate were exercised.
    assert!(passed > 250 && passed < 2_500, "{passed} of 5000 passed");
}

#[tokio::test]
async fn the_gate_judges_any_aggregate_without_an_error() {
    let db = TestDb::fresh().await;
    let mut conn = db.conn().await;
    let any_case = (
        any::<i64>(),
        any::<Option<i32>>(),
        any::<Option<i32>>(),
        any::<i128>(),
        any::<i64>(),
        any::<i32>(),
        any::<i64>(),
    )
        .prop_map(|(files, lo, hi, rows, distinct_counts, count, expected)| {
            (
                Aggregate {
                    files,
                    lo,
                    hi,
                    rows,
                    distinct_counts,
                },
                count,
                expected,
            )
        });
    let mut cases = generated(any_case, 2_000);
    // The edges of every type.
    cases.push((
        agg(i64::MAX, i32::MIN, i32::MAX, i128::MAX, i64::MIN),
        i32::MAX,
        i64::MIN,
    ));
    cases.push((
        agg(i64::MIN, i32::MAX, i32::MAX, i128::MIN, i64::MAX),
        i32::MIN,
        i64::MAX,
    ));
    assert_eq!(judged(&mut conn, &cases).await.len(), cases.len());
}

/// No function of the schema claims IMMUTABLE: PostgreSQL may evaluate an IMMUTABLE call once at
/// plan time and reuse the result, so the claim must hold for every input, and each of ours reads
/// tables or calls a STABLE function (the gate calls `format()`, which depends on settings).
/// Seen failing with the gate's original `IMMUTABLE` (migration 20261204000015 alone).
#[tokio::test]
async fn no_function_claims_to_be_immutable() {
    let db = TestDb::fresh().await;
    let immutable: Vec<String> = sqlx::query_scalar(
        "SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
          WHERE n.nspname = 'nifi_ops' AND p.provolatile = 'i' ORDER BY 1",
    )
    .fetch_all(&mut db.conn().await)
    .await
    .unwrap();
    assert_eq!(immutable, Vec::<String>::new());
    let gate: String = sqlx::query_scalar(
        "SELECT p.provolatile::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
          WHERE n.nspname = 'nifi_ops' AND p.proname = 'chunk_gate'",
    )
    .fetch_one(&mut db.conn().await)
    .await
    .unwrap();
    assert_eq!(gate, "s", "chunk_gate is STABLE");
}

//! The completion CAS (CONTRACT §5.4): exactly one caller moves the run to EXTRACTED_VALIDATED and
//! enqueues its one VALIDATE_RUN dispatch.
use crate::error::Result;
use crate::event::{Event, Level};
use crate::store::RunRow;
use sqlx::PgConnection;
use uuid::Uuid;

/// The CAS wakes the dispatcher and the LoadRun mirror itself (its `RETURNING pg_notify(…)`,
/// delivered at commit, only when it won): no statement of its own for either.
///
/// Must run while this transaction holds the run row's write lock (the manifest's FOR UPDATE, or
/// a possibly-last success's `FOR NO KEY UPDATE`), in a statement after the one that waited for it,
/// so the recount sees every committed success. Release 0.1.0's copy of this CAS runs after its
/// `success_partition_count + 1`, whose value the trigger of migration 20261203000010 recounts.
pub(crate) async fn complete_extraction(conn: &mut PgConnection, run: &RunRow) -> Result<bool> {
    let won = sqlx::query(
        "UPDATE nifi_ops.load_run r \
            SET status = 'EXTRACTED_VALIDATED', success_partition_count = p.ok, extracted_count = p.rows, \
                extract_completed_at = clock_timestamp(), heartbeat_at = clock_timestamp(), \
                version_no = r.version_no + 1 \
           FROM (SELECT count(*) AS n, count(*) FILTER (WHERE status = 'SUCCESS') AS ok, \
                        COALESCE(sum(actual_row_count), 0) AS rows \
                   FROM nifi_ops.load_partition WHERE run_id = $1) p \
          WHERE r.run_id = $1 AND r.status = 'EXTRACTING' \
            AND p.n = r.expected_partition_count AND p.ok = r.expected_partition_count \
            AND p.rows = r.source_count \
         RETURNING pg_notify('load_dispatch', $1::text), pg_notify('load_run', $1::text)",
    )
    .bind(run.run_id)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        == 1;
    if !won {
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO nifi_ops.load_dispatch (dispatch_id, run_id, dispatch_type) VALUES ($1, $2, 'VALIDATE_RUN') \
         ON CONFLICT (run_id) WHERE dispatch_type = 'VALIDATE_RUN' DO NOTHING",
    )
    .bind(Uuid::now_v7())
    .bind(run.run_id)
    .execute(&mut *conn)
    .await?;
    Event::new(Level::Info, "EXTRACT_VALIDATED")
        .run(run)
        .rows(run.source_count)
        .insert(conn)
        .await?;
    Ok(true)
}

//! The completion CAS (CONTRACT §5.4): exactly one caller moves the run to EXTRACTED_VALIDATED and
//! enqueues its one VALIDATE_RUN dispatch.
use crate::error::Result;
use crate::event::Event;
use sqlx::PgConnection;
use uuid::Uuid;

/// `nifi_ops.complete_extraction` (ledger/functions/), the CAS's one copy, which the
/// deciding chunk report runs inside `nifi_ops.report_chunk_v2`: the status, the VALIDATE_RUN outbox
/// row, the EXTRACT_VALIDATED event and both NOTIFYs (delivered at commit, only when it won).
///
/// Must run while this transaction holds the run row's write lock (the manifest's FOR UPDATE), in
/// a statement after the one that waited for it, so the recount sees every committed success.
pub(crate) async fn complete_extraction(conn: &mut PgConnection, run_id: Uuid) -> Result<bool> {
    let won: bool = sqlx::query_scalar("SELECT nifi_ops.complete_extraction($1, $2, $3)")
        .bind(run_id)
        // The VALIDATE_RUN dispatch's id.
        .bind(super::dispatch::new_dispatch_id())
        // The transaction's witness should its COMMIT's answer be lost.
        .bind(Event::id_of_commit())
        .fetch_one(&mut *conn)
        .await?;
    Ok(won)
}

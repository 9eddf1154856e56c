//! `POST /v1/runs/{run_id}/partitions/{partition_id}/claim` (CONTRACT §4.6): the partition row
//! lock decides ownership; the run row is only held FOR KEY SHARE. The claim is one server-side
//! function, `nifi_ops.claim_partition_v2` (ledger/functions/), run on its own: one round trip.
use crate::error::{LedgerError, Result};
use crate::functions::ClaimPartitionOutcome;
use crate::run_lock::run_lock_key;
use crate::status::{PartitionStatus, RunStatus};
use crate::store::Ledger;
use crate::transactions::alone;
use serde::Serialize;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ClaimOutcome {
    pub claimed: bool,
    pub run_status: RunStatus,
    pub partition_status: PartitionStatus,
    pub attempt: i32,
}

pub(crate) fn parse_run_status(s: &str) -> Result<RunStatus> {
    RunStatus::parse(s).ok_or_else(|| LedgerError::Corrupt(format!("run status {s}")))
}

/// `nifi_ops.claim_partition_v2` on its own (one statement, one transaction, one round trip).
const CLAIM_PARTITION: &str = "SELECT outcome::text AS outcome, claimed, run_status, partition_status, attempt, lock_wait_seconds \
     FROM nifi_ops.claim_partition_v2($1, $2, $3, $4, $5, $6, $7)";

/// What `nifi_ops.claim_partition_v2` answers (ledger/functions/claim_partition_v2.sql).
#[derive(sqlx::FromRow)]
struct Claimed {
    outcome: ClaimPartitionOutcome,
    claimed: Option<bool>,
    /// The run's status as the claim's locks left it.
    run_status: Option<String>,
    partition_status: Option<String>,
    attempt: Option<i32>,
    lock_wait_seconds: Option<f64>,
}

impl Ledger {
    /// A claim is idempotent for its token (the same token finds its partition RUNNING and is
    /// answered the same attempt), so it may run [`alone!`], repeated after a lost connection.
    pub async fn claim_partition(
        &self,
        run_id: Uuid,
        pid: &str,
        token: Uuid,
        worker: &str,
    ) -> Result<ClaimOutcome> {
        let (k1, k2) = run_lock_key(run_id);
        let c: Claimed = alone!(self, |conn| async {
            let claimed: Claimed = sqlx::query_as(CLAIM_PARTITION)
                .bind(run_id)
                .bind(pid)
                .bind(token)
                .bind(worker)
                .bind(k1)
                .bind(k2)
                // Time-ordered, like every event id the ledger writes (`Event::insert`).
                .bind(Uuid::now_v7())
                .fetch_one(&mut *conn)
                .await?;
            Result::Ok(claimed)
        })?;
        match c.outcome {
            ClaimPartitionOutcome::Answered => {}
            ClaimPartitionOutcome::RunNotFound => return Err(LedgerError::RunNotFound),
            ClaimPartitionOutcome::PartitionNotFound => return Err(LedgerError::PartitionNotFound),
        }
        if let (Some(o), Some(waited)) = (&self.lock_wait, c.lock_wait_seconds) {
            o.observe(waited);
        }
        let corrupt = |what: &str| LedgerError::Corrupt(format!("claim_partition {what}"));
        let partition_status = c
            .partition_status
            .as_deref()
            .ok_or_else(|| corrupt("partition status"))?;
        Ok(ClaimOutcome {
            claimed: c.claimed.ok_or_else(|| corrupt("claimed"))?,
            run_status: parse_run_status(
                c.run_status
                    .as_deref()
                    .ok_or_else(|| corrupt("run status"))?,
            )?,
            partition_status: PartitionStatus::parse(partition_status).ok_or_else(|| {
                LedgerError::Corrupt(format!("partition status {partition_status}"))
            })?,
            attempt: c.attempt.ok_or_else(|| corrupt("attempt"))?,
        })
    }
}

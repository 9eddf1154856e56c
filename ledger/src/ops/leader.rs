//! Leadership epochs (CONTRACT §1.8, §7.1): acquiring one, and reading the current one.
use super::fence::Fence;
use crate::error::Result;
use crate::store::Ledger;
use crate::transactions::transaction;

/// The `leader_epoch` row of a deployment.
pub const LEADER_NAME: &str = "load-control";

impl Ledger {
    /// Bumps the epoch after winning the Lease or the advisory lock. Waits for the deposed
    /// leader's in-flight transactions (they hold the row FOR SHARE); none of its later ones can
    /// write once this commits.
    pub async fn acquire_epoch(&self, holder: &str) -> Result<Fence> {
        // A binary that does not run on the schema never leads (the transaction begins with the
        // schema check): a compatible one takes over. Nor does one of another installation while
        // that installation's claim on the ledger is fresh (`super::owner`): nothing is bumped.
        let (epoch, tick) = transaction!(self, |conn| async {
            super::owner::claim_in_tx(self, conn, holder).await?;
            // Locked first: the acquisition waits here for the deposed leader's transactions.
            let row: Option<(i64,)> = sqlx::query_as(
                "SELECT epoch FROM nifi_ops.leader_epoch WHERE name = $1 FOR UPDATE",
            )
            .bind(LEADER_NAME)
            .fetch_optional(&mut *conn)
            .await?;
            // Above the row's epoch and above every epoch known to have been issued: after a
            // restore from backup the row is behind, and its epoch + 1 was issued already.
            let (floor, tick) =
                super::continuity::acquisition_in_tx(self, conn, row.map(|r| r.0)).await?;
            let (epoch,): (i64,) = sqlx::query_as(
                "INSERT INTO nifi_ops.leader_epoch (name, epoch, holder) VALUES ($1, $3, $2) \
                 ON CONFLICT (name) DO UPDATE SET epoch = GREATEST(leader_epoch.epoch + 1, $3), \
                    holder = EXCLUDED.holder, acquired_at = clock_timestamp() RETURNING epoch",
            )
            .bind(LEADER_NAME)
            .bind(holder)
            .bind(floor)
            .fetch_one(&mut *conn)
            .await?;
            Ok((epoch, tick))
        })?;
        super::continuity::acquired(self, epoch, tick);
        Ok(Fence {
            name: LEADER_NAME.to_string(),
            epoch,
            holder: holder.to_string(),
        })
    }

    /// The current epoch and its holder, for probes and logs.
    pub async fn current_epoch(&self) -> Result<Option<(i64, String)>> {
        Ok(
            sqlx::query_as("SELECT epoch, holder FROM nifi_ops.leader_epoch WHERE name = $1")
                .bind(LEADER_NAME)
                .fetch_optional(&mut *self.acquire().await?)
                .await?,
        )
    }
}

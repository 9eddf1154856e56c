//! The fence (CONTRACT §1.8, §7.1): the epoch a leader won, checked first by every transaction
//! it makes, so that a deposed leader writes nothing.
use crate::error::{LedgerError, Result};
use sqlx::PgConnection;

/// The epoch this process won; valid until a later acquisition bumps the row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub name: String,
    pub epoch: i64,
    pub holder: String,
}

/// The first statement of every leader transaction: `Fenced` (write nothing) unless our epoch is
/// still the current one. The FOR SHARE lock makes a new acquisition wait for this transaction.
pub(crate) async fn check_fence(conn: &mut PgConnection, fence: &Fence) -> Result<()> {
    let current: Option<(i64,)> =
        sqlx::query_as("SELECT epoch FROM nifi_ops.leader_epoch WHERE name = $1 FOR SHARE")
            .bind(&fence.name)
            .fetch_optional(&mut *conn)
            .await?;
    match current {
        Some((epoch,)) if epoch == fence.epoch => Ok(()),
        other => Err(LedgerError::Fenced {
            ours: fence.epoch,
            current: other.map(|c| c.0),
        }),
    }
}

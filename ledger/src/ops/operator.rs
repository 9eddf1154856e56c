//! Operator actions on a run: cancel ([v1-ext] CONTRACT §4.17) and dispatch resend (§4.15).
use super::transition::{ErrorFields, transition_locked};
use crate::error::{LedgerError, Result};
use crate::event::{Actor, Event, Level};
use crate::notify::notify_dispatch;
use crate::status::{DispatchStatus, RunStatus};
use crate::store::Ledger;
use crate::transactions::transaction;
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct CancelOutcome {
    pub run_id: Uuid,
    pub run_status: RunStatus,
    pub changed: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ResendOutcome {
    pub dispatch_id: Uuid,
    pub status: DispatchStatus,
}

/// Statuses a cancel may leave: never a publishing state, where an INSERT OVERWRITE may have run.
pub fn cancellable(s: RunStatus) -> bool {
    crate::machine::allowed(s, RunStatus::Cancelled)
}

impl Ledger {
    /// `fence` is set when the Kubernetes operator acts on a LoadRun's `spec.cancel` (§7.1).
    pub async fn cancel_run(
        &self,
        run_id: Uuid,
        reason: &str,
        actor: &Actor,
        fence: Option<&super::fence::Fence>,
    ) -> Result<CancelOutcome> {
        transaction!(self, |conn| async {
            if let Some(f) = fence {
                super::fence::check_fence(conn, f).await?;
            }
            let run = self.lock_run(conn, run_id).await?;
            let status = run.status()?;
            if status == RunStatus::Cancelled {
                return Ok(CancelOutcome {
                    run_id,
                    run_status: status,
                    changed: false,
                });
            }
            if !cancellable(status) {
                return Err(LedgerError::RunStatusMismatch {
                    run_status: status,
                    stage: None,
                });
            }
            let error = ErrorFields::Set {
                stage: "CANCEL",
                code: "RUN_CANCELLED",
                message: reason,
            };
            let aborted =
                transition_locked(conn, run_id, status, RunStatus::Cancelled, error).await?;
            Event::new(Level::Warn, "RUN_CANCELLED")
                .run(&run)
                .message(reason)
                .details(json!({"from": status}))
                .actor(actor)
                .aborted(aborted)
                .insert(conn)
                .await?;
            tracing::warn!(event = "run_cancelled", run_id = %run_id, operator = %actor.name, "run cancelled by an operator");
            Ok(CancelOutcome {
                run_id,
                run_status: RunStatus::Cancelled,
                changed: true,
            })
        })
    }

    pub async fn resend_dispatch(
        &self,
        run_id: Uuid,
        dispatch_id: Uuid,
        actor: &Actor,
    ) -> Result<ResendOutcome> {
        transaction!(self, |conn| async {
            let run = self.lock_run(conn, run_id).await?;
            let row: Option<(Uuid, String)> =
                sqlx::query_as("SELECT run_id, status FROM nifi_ops.load_dispatch WHERE dispatch_id = $1 FOR UPDATE")
                    .bind(dispatch_id)
                    .fetch_optional(&mut *conn)
                    .await?;
            let previous = match row {
                Some((owner, status)) if owner == run_id => DispatchStatus::parse(&status)
                    .ok_or_else(|| LedgerError::Corrupt(format!("dispatch status {status}")))?,
                _ => return Err(LedgerError::DispatchNotFound),
            };
            if !matches!(previous, DispatchStatus::Dead | DispatchStatus::Sent) {
                return Err(LedgerError::DispatchStatusMismatch { status: previous });
            }
            sqlx::query(
                "UPDATE nifi_ops.load_dispatch SET status = 'PENDING', attempt_count = 0, next_attempt_at = clock_timestamp(), \
                    last_error = NULL WHERE dispatch_id = $1",
            )
            .bind(dispatch_id)
            .execute(&mut *conn)
            .await?;
            notify_dispatch(conn, &run_id.to_string()).await?;
            Event::new(Level::Warn, "DISPATCH_RESENT")
                .run(&run)
                .details(json!({"dispatchId": dispatch_id, "previousStatus": previous}))
                .actor(actor)
                .insert(conn)
                .await?;
            Ok(ResendOutcome {
                dispatch_id,
                status: DispatchStatus::Pending,
            })
        })
    }
}

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

/// What [`Ledger::run_went_back`] did: `held` when the run became PUBLISH_UNKNOWN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WentBackOutcome {
    pub held: bool,
}

/// Statuses a run reaches only once its publish has begun (the publish claim).
pub fn publish_begun(s: RunStatus) -> bool {
    matches!(
        s,
        RunStatus::Publishing
            | RunStatus::Published
            | RunStatus::PublishUnknown
            | RunStatus::Success
            | RunStatus::FailedTargetValidation
            | RunStatus::FailedPublish
    )
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

    /// The ledger went back (restored from backup): the run's LoadRun showed `shown_version`
    /// (`shown_status`), the ledger holds `expected_version`, older. In one transaction:
    ///
    /// * the run's `version_no` continues after `shown_version`, so that no version the LoadRun
    ///   showed is ever issued again with another meaning (as no epoch is issued twice,
    ///   `ops::continuity`), and the mirror's LoadRun moves to what the ledger holds;
    /// * a run whose publish had begun (`shown_status` PUBLISHING or later) and which the ledger
    ///   holds before PUBLISHING becomes PUBLISH_UNKNOWN, so that nothing (a VALIDATE_RUN dispatch
    ///   sent again, NiFi's flow replayed) publishes it a second time until a person has checked
    ///   Hive and resolved it;
    /// * its event (RUN_HELD_AFTER_RESTORE, or RUN_WENT_BACK) and the mirror's NOTIFY.
    ///
    /// Fenced: only the leader decides it. `RunStatusMismatch` when the run changed meanwhile
    /// (the mirror reads it again).
    pub async fn run_went_back(
        &self,
        fence: &super::fence::Fence,
        run_id: Uuid,
        expected_version: i64,
        shown_version: i64,
        shown_status: RunStatus,
        actor: &Actor,
    ) -> Result<WentBackOutcome> {
        transaction!(self, |conn| async {
            super::fence::check_fence(conn, fence).await?;
            let run = self.lock_run(conn, run_id).await?;
            let status = run.status()?;
            let (version,): (i64,) = sqlx::query_as(
                "SELECT version_no::bigint FROM nifi_ops.load_run WHERE run_id = $1",
            )
            .bind(run_id)
            .fetch_one(&mut *conn)
            .await?;
            if version != expected_version || version >= shown_version {
                return Err(LedgerError::RunStatusMismatch {
                    run_status: status,
                    stage: None,
                });
            }
            // Held, the transition's own increment makes it shown + 1; else one increment here.
            let held = publish_begun(shown_status) && cancellable(status);
            sqlx::query("UPDATE nifi_ops.load_run SET version_no = $2 WHERE run_id = $1")
                .bind(run_id)
                .bind(if held {
                    shown_version
                } else {
                    shown_version + 1
                })
                .execute(&mut *conn)
                .await?;
            let details = json!({"shownVersion": shown_version, "shownStatus": shown_status,
                "ledgerVersion": version, "ledgerStatus": status});
            // Before PUBLISHING only: a publishing run's own result (or the sweeper) decides it.
            if held {
                let why = format!(
                    "its LoadRun showed {shown_status}, but the ledger was restored to a point \
                     before that, to {status}: a publish may have run since; check the Hive \
                     partition, then resolve PUBLISHED or FAILED_PUBLISH"
                );
                let error = ErrorFields::Set {
                    stage: "RESTORE",
                    code: "PUBLISHED_AFTER_RESTORE_POINT",
                    message: &why,
                };
                transition_locked(conn, run_id, status, RunStatus::PublishUnknown, error).await?;
                Event::new(Level::Error, "RUN_HELD_AFTER_RESTORE")
                    .run(&run)
                    .message(&why)
                    .details(details)
                    .actor(actor)
                    .insert(conn)
                    .await?;
                tracing::error!(event = "run_held_after_restore", run_id = %run_id, from = %status,
                    shown = %shown_status, "{why}");
            } else {
                crate::notify::notify_run(conn, run_id).await?;
                Event::new(Level::Warn, "RUN_WENT_BACK")
                    .run(&run)
                    .message(
                        "the ledger was restored to an earlier point: the run is as it was then",
                    )
                    .details(details)
                    .actor(actor)
                    .insert(conn)
                    .await?;
                tracing::warn!(event = "run_went_back", run_id = %run_id, status = %status,
                    shown = %shown_status, shown_version, ledger_version = version,
                    "the ledger holds an older state of this run than its LoadRun showed");
            }
            Ok(WentBackOutcome { held })
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

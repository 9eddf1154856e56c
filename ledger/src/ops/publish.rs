//! The token-owned publish (CONTRACT §4.12, §4.13) and the operator's resolution of a publish whose
//! outcome is unknown (§4.16). Nothing here ever confirms a publish automatically.
use super::transition::{ErrorFields, transition_locked};
use crate::error::{LedgerError, Result};
use crate::event::{Actor, Event, Level};
use crate::status::RunStatus;
use crate::store::Ledger;
use crate::transactions::transaction;
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PublishClaim {
    pub claimed: bool,
    pub run_status: RunStatus,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct StatusChange {
    pub run_status: RunStatus,
    pub changed: bool,
}

impl Ledger {
    pub async fn claim_publish(&self, run_id: Uuid, token: Uuid) -> Result<PublishClaim> {
        transaction!(self, |conn| async {
            let run = self.lock_run(conn, run_id).await?;
            let status = run.status()?;
            if status == RunStatus::Publishing {
                return Ok(PublishClaim {
                    claimed: run.publish_token == Some(token),
                    run_status: status,
                });
            }
            if status != RunStatus::StagingValidated {
                return Ok(PublishClaim {
                    claimed: false,
                    run_status: status,
                });
            }
            transition_locked(
                conn,
                run_id,
                status,
                RunStatus::Publishing,
                ErrorFields::Keep,
            )
            .await?;
            sqlx::query("UPDATE nifi_ops.load_run SET publish_token = $2, publish_started_at = clock_timestamp() WHERE run_id = $1")
                .bind(run_id)
                .bind(token)
                .execute(&mut *conn)
                .await?;
            Event::new(Level::Info, "PUBLISH_STARTED")
                .run(&run)
                .details(json!({"publishToken": token}))
                .insert(conn)
                .await?;
            Ok(PublishClaim {
                claimed: true,
                run_status: RunStatus::Publishing,
            })
        })
    }

    /// `outcome` is PUBLISHED, FAILED_PUBLISH or PUBLISH_UNKNOWN (validated by the caller).
    pub async fn publish_result(
        &self,
        run_id: Uuid,
        token: Uuid,
        outcome: RunStatus,
        error_code: Option<&str>,
        message: &str,
    ) -> Result<StatusChange> {
        transaction!(self, |conn| async {
            let run = self.lock_run(conn, run_id).await?;
            if run.publish_token != Some(token) {
                return Err(LedgerError::PublishTokenMismatch);
            }
            let status = run.status()?;
            if status == outcome {
                return Ok(StatusChange {
                    run_status: status,
                    changed: false,
                });
            }
            if status != RunStatus::Publishing {
                // e.g. a late PUBLISHED after PUBLISH_UNKNOWN: a person decides, never this call.
                return Err(LedgerError::RunStatusMismatch {
                    run_status: status,
                    stage: None,
                });
            }
            if outcome == RunStatus::Published {
                transition_locked(conn, run_id, status, outcome, ErrorFields::Keep).await?;
                sqlx::query("UPDATE nifi_ops.load_run SET published_at = clock_timestamp() WHERE run_id = $1")
                    .bind(run_id)
                    .execute(&mut *conn)
                    .await?;
                // §8: the request's message is kept (empty: none).
                Event::new(Level::Info, "PUBLISH_FINISHED")
                    .run(&run)
                    .message(message)
                    .insert(conn)
                    .await?;
            } else {
                let code = error_code
                    .filter(|c| !c.is_empty())
                    .unwrap_or(outcome.as_str());
                let error = ErrorFields::Set {
                    stage: "PUBLISH",
                    code,
                    message,
                };
                let aborted = transition_locked(conn, run_id, status, outcome, error).await?;
                let event = if outcome == RunStatus::FailedPublish {
                    Event::new(Level::Error, "RUN_FAILED")
                        .details(json!({"stage": "PUBLISH", "from": status, "to": outcome}))
                        .aborted(aborted)
                } else {
                    Event::new(Level::Error, "PUBLISH_UNKNOWN")
                };
                event
                    .run(&run)
                    .code(code)
                    .message(message)
                    .insert(conn)
                    .await?;
            }
            Ok(StatusChange {
                run_status: outcome,
                changed: true,
            })
        })
    }

    /// `resolution` is PUBLISHED or FAILED_PUBLISH (validated by the caller). No token check: the
    /// operator verified the target table by other means.
    pub async fn resolve_publish_unknown(
        &self,
        run_id: Uuid,
        resolution: RunStatus,
        reason: &str,
        actor: &Actor,
        fence: Option<&super::fence::Fence>,
    ) -> Result<StatusChange> {
        transaction!(self, |conn| async {
            if let Some(f) = fence {
                super::fence::check_fence(conn, f).await?;
            }
            let run = self.lock_run(conn, run_id).await?;
            let status = run.status()?;
            if status == resolution {
                return Ok(StatusChange {
                    run_status: status,
                    changed: false,
                });
            }
            if status != RunStatus::PublishUnknown {
                return Err(LedgerError::RunStatusMismatch {
                    run_status: status,
                    stage: None,
                });
            }
            if resolution == RunStatus::Published {
                transition_locked(conn, run_id, status, resolution, ErrorFields::Clear).await?;
                sqlx::query("UPDATE nifi_ops.load_run SET published_at = clock_timestamp() WHERE run_id = $1")
                    .bind(run_id)
                    .execute(&mut *conn)
                    .await?;
            } else {
                let error = ErrorFields::Set {
                    stage: "PUBLISH",
                    code: "PUBLISH_UNKNOWN_RESOLVED",
                    message: reason,
                };
                transition_locked(conn, run_id, status, resolution, error).await?;
            }
            Event::new(Level::Warn, "PUBLISH_UNKNOWN_RESOLVED")
                .run(&run)
                .message(reason)
                .details(json!({"resolution": resolution}))
                .actor(actor)
                .insert(conn)
                .await?;
            Ok(StatusChange {
                run_status: resolution,
                changed: true,
            })
        })
    }
}

//! `POST /v1/runs/{run_id}/fail` (CONTRACT §4.3): a non-partition stage failure.
use super::transition::{ErrorFields, transition_locked};
use crate::error::{LedgerError, Result};
use crate::event::{Event, Level};
use crate::status::{RunStatus, fail_transition_allowed};
use crate::store::Ledger;
use crate::text::cut;
use crate::transactions::transaction;
use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct RunFailure {
    pub expected_status: RunStatus,
    pub fail_status: RunStatus,
    pub error_stage: String,
    pub error_code: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunFailOutcome {
    pub run_id: Uuid,
    pub run_status: RunStatus,
    pub changed: bool,
}

impl Ledger {
    pub async fn fail_run(&self, run_id: Uuid, req: &RunFailure) -> Result<RunFailOutcome> {
        if !fail_transition_allowed(req.expected_status, req.fail_status) {
            return Err(LedgerError::FailTransitionNotAllowed {
                expected: req.expected_status,
                fail: req.fail_status,
            });
        }
        transaction!(self, |conn| async {
            let run = self.lock_run(conn, run_id).await?;
            let current = run.status()?;
            if current == req.fail_status {
                return Ok(RunFailOutcome {
                    run_id,
                    run_status: current,
                    changed: false,
                });
            }
            if current != req.expected_status {
                return Err(LedgerError::RunStatusMismatch {
                    run_status: current,
                    stage: None,
                });
            }
            let end = (
                req.fail_status,
                ErrorFields::Set {
                    stage: &req.error_stage,
                    code: &req.error_code,
                    message: &req.message,
                },
            );
            let aborted = transition_locked(conn, run_id, current, end.0, end.1).await?;
            Event::new(Level::Error, "RUN_FAILED")
                .run(&run)
                .code(&req.error_code)
                .message(&req.message)
                .details(json!({"stage": cut(&req.error_stage, 80), "from": current, "to": req.fail_status}))
                .aborted(aborted)
                .insert(conn)
                .await?;
            Ok(RunFailOutcome {
                run_id,
                run_status: req.fail_status,
                changed: true,
            })
        })
    }
}

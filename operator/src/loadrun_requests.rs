//! The kubectl actions: `spec.cancel` and `spec.resolution` of a LoadRun carried out through the
//! same fenced ledger operations as the HTTP operator endpoints, and the pure check that names a
//! request the ledger would refuse.
use crate::kube_context::{Context, LoopError, publish};
use crds::{LoadRun, ResolutionOutcome};
use kube::ResourceExt;
use kube::runtime::events::EventType;
use ledger::{Actor, Fence, MirroredRun, RunStatus};

/// Why the ledger would refuse (or did not carry out) the request written on a LoadRun, if it
/// would (pure). A cancel is refused once the run is past STAGING_VALIDATED or ended otherwise; a
/// resolution needs PUBLISH_UNKNOWN, and is taken as carried out once the run is where its
/// outcome leads.
pub fn request_refusal(spec: &crds::LoadRunSpec, phase: Option<RunStatus>) -> Option<String> {
    let phase = phase?;
    if spec.cancel.is_some()
        && phase != RunStatus::Cancelled
        && !ledger::ops::operator::cancellable(phase)
    {
        let why = match phase {
            RunStatus::Publishing | RunStatus::Published | RunStatus::PublishUnknown => {
                ": an INSERT OVERWRITE may have happened (resolve a PUBLISH_UNKNOWN run instead)"
            }
            _ => ": it has ended",
        };
        return Some(format!(
            "spec.cancel refused (RUN_STATUS_MISMATCH): the run is {phase}{why}"
        ));
    }
    if let Some(res) = &spec.resolution {
        let carried_out = match res.outcome {
            ResolutionOutcome::Published => matches!(
                phase,
                RunStatus::Published | RunStatus::Success | RunStatus::FailedTargetValidation
            ),
            ResolutionOutcome::FailedPublish => phase == RunStatus::FailedPublish,
        };
        if phase != RunStatus::PublishUnknown && !carried_out {
            return Some(format!(
                "spec.resolution refused (RUN_STATUS_MISMATCH): the run is {phase}, not PUBLISH_UNKNOWN"
            ));
        }
    }
    None
}

/// Carries out `spec.cancel` / `spec.resolution` through the same (fenced) ledger operations as
/// the HTTP operator endpoints. `true` when the ledger changed.
pub(crate) async fn act_on_requests(
    ctx: &Context,
    fence: &Fence,
    lr: &LoadRun,
    run: &MirroredRun,
    ns: &str,
) -> Result<bool, LoopError> {
    let actor = Actor {
        name: format!("kubernetes:{ns}/{}", lr.name_any()),
        role: "operator".into(),
    };
    let phase = RunStatus::parse(&run.status);
    if let Some(cancel) = &lr.spec.cancel
        && phase.is_some_and(ledger::ops::operator::cancellable)
    {
        let out = ctx
            .ledger
            .cancel_run(run.run_id, &cancel.reason, &actor, Some(fence))
            .await?;
        let note = format!("cancelled by {}: {}", actor.name, cancel.reason);
        return Ok(carried_out(ctx, fence, lr, out.changed, "Cancelled", note, "Cancel").await);
    }
    if let Some(res) = &lr.spec.resolution
        && phase == Some(RunStatus::PublishUnknown)
    {
        let outcome = match res.outcome {
            ResolutionOutcome::Published => RunStatus::Published,
            ResolutionOutcome::FailedPublish => RunStatus::FailedPublish,
        };
        let out = ctx
            .ledger
            .resolve_publish_unknown(run.run_id, outcome, &res.reason, &actor, Some(fence))
            .await?;
        let note = format!("resolved as {outcome} by {}: {}", actor.name, res.reason);
        return Ok(carried_out(ctx, fence, lr, out.changed, "Resolved", note, "Resolve").await);
    }
    Ok(false)
}

/// A Normal Event on the LoadRun when its request changed the run; whether it did.
async fn carried_out(
    ctx: &Context,
    fence: &Fence,
    lr: &LoadRun,
    changed: bool,
    reason: &str,
    note: String,
    action: &str,
) -> bool {
    if changed {
        publish(ctx, fence, lr, EventType::Normal, reason, note, action).await;
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_the_ledger_would_refuse_are_named() {
        use crds::{CancelRequest, LoadRunSpec, ResolutionRequest};
        let spec = |cancel: bool, resolution: Option<ResolutionOutcome>| LoadRunSpec {
            job_key: "J".into(),
            business_key: "b".into(),
            run_id: "r".into(),
            cancel: cancel.then(|| CancelRequest {
                reason: "wrong date".into(),
            }),
            resolution: resolution.map(|outcome| ResolutionRequest {
                outcome,
                reason: "checked".into(),
            }),
        };
        let cancel = spec(true, None);
        assert_eq!(request_refusal(&cancel, Some(RunStatus::Extracting)), None);
        assert_eq!(request_refusal(&cancel, Some(RunStatus::Cancelled)), None);
        assert!(
            request_refusal(&cancel, Some(RunStatus::Publishing))
                .unwrap()
                .contains("INSERT OVERWRITE")
        );
        assert!(
            request_refusal(&cancel, Some(RunStatus::Success))
                .unwrap()
                .contains("RUN_STATUS_MISMATCH")
        );
        let publish = spec(false, Some(ResolutionOutcome::Published));
        assert_eq!(
            request_refusal(&publish, Some(RunStatus::PublishUnknown)),
            None
        );
        assert_eq!(
            request_refusal(&publish, Some(RunStatus::Success)),
            None,
            "carried out"
        );
        assert!(request_refusal(&publish, Some(RunStatus::Extracting)).is_some());
        let failed = spec(false, Some(ResolutionOutcome::FailedPublish));
        assert_eq!(
            request_refusal(&failed, Some(RunStatus::FailedPublish)),
            None
        );
        assert!(request_refusal(&failed, Some(RunStatus::Success)).is_some());
        assert_eq!(
            request_refusal(&spec(false, None), Some(RunStatus::Success)),
            None
        );
    }
}

//! What a LoadRun shows for a ledger run (pure): its status, conditions merged with the previous
//! ones, and the Event worth a human's attention when its phase changes.
use crate::kube_context::set_condition;
use crds::{DispatchCounts, LoadRunStatus, PartitionCounts, RunCounts, RunError};
use kube::runtime::events::EventType;
use ledger::{MirroredRun, RunStatus};

/// The LoadRun status the ledger's row implies (conditions merged with the previous ones).
pub fn run_status(run: &MirroredRun, previous: Option<&LoadRunStatus>) -> LoadRunStatus {
    let phase = RunStatus::parse(&run.status);
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    let success = phase == Some(RunStatus::Success);
    let cancelled = phase == Some(RunStatus::Cancelled);
    let failed = phase.is_some_and(|p| p.is_failed_class()) && !cancelled;
    let msg = |s: &str| format!("{s}: {}", run.error_message.clone().unwrap_or_default());
    set_condition(
        &mut conditions,
        "Succeeded",
        success,
        if success {
            "RunSucceeded"
        } else {
            "NotSucceeded"
        },
        &run.status,
        None,
    );
    set_condition(
        &mut conditions,
        "Failed",
        failed,
        if failed { "RunFailed" } else { "NotFailed" },
        &if failed {
            msg(run.error_code.as_deref().unwrap_or(""))
        } else {
            String::new()
        },
        None,
    );
    set_condition(
        &mut conditions,
        "Cancelled",
        cancelled,
        if cancelled {
            "RunCancelled"
        } else {
            "NotCancelled"
        },
        &if cancelled {
            msg("cancelled")
        } else {
            String::new()
        },
        None,
    );
    let (needs, reason, message) = if phase == Some(RunStatus::PublishUnknown) {
        (
            true,
            "PublishUnknown",
            "The publish outcome is unknown. Check the target table, then set spec.resolution {outcome: PUBLISHED|FAILED_PUBLISH, reason} \
             (or POST /v1/runs/{id}/publish-unknown/resolve)."
                .to_string(),
        )
    } else if run.d_dead_alerting > 0 {
        (
            true,
            "DispatchDead",
            format!(
                "{} dispatch(es) are DEAD; resend them with POST /v1/runs/{{id}}/dispatches/{{dispatchId}}/resend.",
                run.d_dead_alerting
            ),
        )
    } else {
        (false, "NoActionNeeded", String::new())
    };
    set_condition(
        &mut conditions,
        "NeedsOperator",
        needs,
        reason,
        &message,
        None,
    );
    let expected = run.expected_partition_count.unwrap_or(0) as i64;
    LoadRunStatus {
        phase: run.status.clone(),
        snapshot_scn: run.snapshot_scn.clone(),
        hdfs_run_path: run.hdfs_run_path.clone(),
        stage_table: run.stage_table_name.clone(),
        counts: RunCounts {
            source: run.source_count,
            extracted: run.extracted_count,
            staging: run.staging_count,
            target: run.target_count,
        },
        partitions: PartitionCounts {
            expected,
            succeeded: run.p_succeeded,
            running: run.p_running,
            pending: run.p_pending,
            retry: run.p_retry,
            failed: run.p_failed,
            timed_out: run.p_timed_out,
            aborted: run.p_aborted,
        },
        partitions_summary: format!("{}/{expected}", run.p_succeeded),
        started_at: Some(ledger::json::format_ts(&run.started_at)),
        completed_at: run.completed_at.as_ref().map(ledger::json::format_ts),
        error: (run.error_code.is_some() || run.error_stage.is_some()).then(|| RunError {
            stage: run.error_stage.clone(),
            code: run.error_code.clone(),
            message: run.error_message.clone(),
        }),
        dispatches: DispatchCounts {
            pending: run.d_pending,
            sent: run.d_sent,
            dead: run.d_dead,
        },
        ledger_version: run.version_no as i64,
        conditions,
        // Set by the writer, which knows which spec it has seen.
        observed_generation: previous.and_then(|p| p.observed_generation),
    }
}

/// The Kubernetes Event worth a human's attention when a run enters `phase`, if any.
pub fn phase_event(
    previous: Option<&str>,
    run: &MirroredRun,
) -> Option<(EventType, &'static str, String)> {
    if previous == Some(run.status.as_str()) {
        return None;
    }
    // A LoadRun made for a run that ended long ago (the mirror catching up on history) is no
    // news: an Event each would flood the namespace and the API server.
    if previous.is_none()
        && run
            .completed_at
            .is_some_and(|t| t < chrono::Utc::now() - chrono::Duration::minutes(10))
    {
        return None;
    }
    let phase = RunStatus::parse(&run.status)?;
    let detail = format!(
        "{} {}",
        run.error_code.as_deref().unwrap_or(""),
        run.error_message.as_deref().unwrap_or("")
    )
    .trim()
    .to_string();
    match phase {
        RunStatus::PublishUnknown => Some((
            EventType::Warning,
            "PublishUnknown",
            format!("publish outcome unknown, needs an operator: {detail}"),
        )),
        RunStatus::Cancelled => Some((EventType::Normal, "Cancelled", detail)),
        p if p.is_failed_class() => Some((
            EventType::Warning,
            "RunFailed",
            format!("{}: {detail}", run.status),
        )),
        _ => None,
    }
}

//! Retention of finished LoadRuns: which are past it (pure, read from either side) and their
//! deletion on the resync, a few at a time.
use super::WRITE_CONCURRENCY;
use super::store::Stores;
use crate::kube_context::{Context, LoopError};
use crds::{LoadRun, LoadRunStatus};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use ledger::{Fence, MirroredRun};
use std::time::Duration;

/// Whether a LoadRun is past retention: its run ended (completedAt set) longer than `retention`
/// before `now` (pure). Active runs, PUBLISH_UNKNOWN included, are never past retention.
pub fn past_retention(
    status: Option<&LoadRunStatus>,
    now: chrono::DateTime<chrono::Utc>,
    retention: Duration,
) -> bool {
    let Some(done) = status.and_then(|s| s.completed_at.as_deref()) else {
        return false;
    };
    let Ok(done) = chrono::DateTime::parse_from_rfc3339(done) else {
        return false;
    };
    chrono::Duration::from_std(retention).is_ok_and(|r| done.with_timezone(&chrono::Utc) + r < now)
}

/// Whether a ledger run ended longer than `retention` before `now` (pure): its LoadRun is not
/// (re)created. The same rule as [`past_retention`], read from the ledger's side.
pub fn run_past_retention(
    run: &MirroredRun,
    now: chrono::DateTime<chrono::Utc>,
    retention: Duration,
) -> bool {
    run.completed_at
        .is_some_and(|done| chrono::Duration::from_std(retention).is_ok_and(|r| done + r < now))
}

/// Deletes the LoadRuns past retention in the watched namespaces, [`WRITE_CONCURRENCY`] at a
/// time (a first pass over a long history must not hold the mirror up for one delete after
/// another); how many.
pub(super) async fn prune_loadruns(
    ctx: &Context,
    fence: &Fence,
    stores: &Stores,
) -> Result<usize, LoopError> {
    let now = chrono::Utc::now();
    let due: Vec<_> = stores
        .all_runs()
        .into_iter()
        .filter(|lr| past_retention(lr.status.as_ref(), now, ctx.loadrun_retention))
        .collect();
    let results: Vec<Result<bool, LoopError>> = futures::stream::iter(due)
        .map(|lr| async move {
            ctx.still_leads(fence)?;
            let ns: Api<LoadRun> =
                Api::namespaced(ctx.client.clone(), &lr.namespace().unwrap_or_default());
            match ns.delete(&lr.name_any(), &Default::default()).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                Err(e) => Err(e.into()),
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    let deleted = results.iter().filter(|r| matches!(r, Ok(true))).count();
    if deleted > 0 {
        tracing::info!(
            event = "loadruns_pruned",
            deleted,
            retention_s = ctx.loadrun_retention.as_secs(),
            "finished LoadRuns past retention deleted; the ledger keeps the runs"
        );
    }
    match results.into_iter().find(|r| r.is_err()) {
        Some(Err(e)) => Err(e),
        _ => Ok(deleted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loadruns_of_runs_ended_long_ago_are_past_retention() {
        let now = chrono::Utc::now();
        let week = Duration::from_secs(7 * 86400);
        let ended = |days: i64| LoadRunStatus {
            completed_at: Some(ledger::json::format_ts(
                &(now - chrono::Duration::days(days)),
            )),
            ..Default::default()
        };
        assert!(past_retention(Some(&ended(8)), now, week));
        assert!(!past_retention(Some(&ended(6)), now, week));
        assert!(
            !past_retention(Some(&LoadRunStatus::default()), now, week),
            "still active"
        );
        assert!(!past_retention(None, now, week));
    }
}

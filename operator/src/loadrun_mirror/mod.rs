//! Loop 2, the LoadRun mirror: every mirrored ledger run as a LoadRun (created with its owner,
//! status applied when it changed), Events on phase changes, and retention of finished LoadRuns.
//! Kubernetes writes happen only while this process leads. `run_status` and `past_retention` are
//! the pure decisions.
use crate::kube_context::{Context, LoopError};
use futures::StreamExt;
use ledger::{Fence, MirroredRun};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::watch;
use uuid::Uuid;

mod apply;
mod retention;
mod status;
mod store;

pub use crate::mirror_queue::{MirrorQueue, listen_for_runs};
pub use apply::mirror_retry_delay;
pub use retention::{past_retention, run_past_retention};
pub use status::{phase_event, run_status};
pub use store::{Applied, asks_for_action, compact, newest_known};

use apply::mirror_one;
use retention::prune_loadruns;
use store::Stores;

/// At most this many LoadRuns are written at once by one pass.
pub(super) const WRITE_CONCURRENCY: usize = 8;

/// The mirror's own memory: its stores, and what it last applied to each run's LoadRun.
struct Mirror {
    stores: Stores,
    applied: std::sync::Mutex<HashMap<Uuid, Applied>>,
    /// Runs whose mirroring failed since the current full pass began: a pass with failures has
    /// not compared every LoadRun with the ledger.
    failed_in_pass: std::sync::atomic::AtomicUsize,
}

/// Loop 2: ledger → LoadRuns (`listen_for_runs` names the changed run; LoadRun and LoadJob
/// watches feed reflector stores; a periodic full resync), and LoadRun requests → ledger. The
/// watches and wakers it starts live only as long as it does: when one of them ends (only a panic
/// ends them) the mirror ends too, so that its supervisor restarts the whole of it, counts the
/// restart and reports it in `/healthz`, rather than mirroring on from a store that no longer
/// changes.
pub async fn run_mirror(ctx: Arc<Context>, resync: Duration, mut shutdown: watch::Receiver<bool>) {
    let queue = ctx.mirror_queue.clone();
    // Owned by this loop: dropping it (the loop ends or its task is aborted) aborts them all.
    let mut wakers = tokio::task::JoinSet::new();
    crate::mirror_queue::spawn_wakers(&queue, ctx.fence.clone(), &mut wakers);
    let stores = store::spawn_watches(&ctx, &queue, &mut wakers);
    // Until each store has listed once, a LoadRun missing from it may exist.
    let ready = async {
        for s in &stores.runs {
            let _ = s.wait_until_ready().await;
        }
        for s in &stores.jobs {
            let _ = s.wait_until_ready().await;
        }
    };
    tokio::select! {
        _ = ready => {}
        _ = shutdown.changed() => return,
        Some(ended) = wakers.join_next() => return subtask_ended(ended),
    }
    let mirror = Mirror {
        stores,
        applied: Default::default(),
        failed_in_pass: Default::default(),
    };
    let mut mirrored_epoch = None;
    let mut tick = tokio::time::interval(resync);
    let mut pruned_under: Option<i64> = None;
    loop {
        let periodic = tokio::select! {
            _ = shutdown.changed() => break,
            _ = tick.tick() => true,
            _ = queue.wake.notified() => false,
            Some(ended) = wakers.join_next() => return subtask_ended(ended),
        };
        // A pass is given up at shutdown, however many writes it has left: the Lease is
        // released only once this loop has stopped, and the next leader compares every run
        // afresh (a write cut off mid-way is looked at again, never half-applied).
        let work = async {
            let current = ctx.fence.borrow().clone();
            let Some(fence) = current else { return };
            let (everything, ids) = queue.take();
            let full = everything || periodic;
            if !full && ids.is_empty() {
                return;
            }
            if mirrored_epoch != Some(fence.epoch) {
                // A new leadership compares every run afresh: no backoff carried over from before.
                mirrored_epoch = Some(fence.epoch);
                ctx.mirror_backoff.lock().expect("backoff lock").clear();
            }
            let passed = if full {
                mirror.failed_in_pass.store(0, Ordering::Relaxed);
                let passed = full_pass(&ctx, &fence, &mirror).await;
                if passed.is_ok() {
                    if mirror.failed_in_pass.load(Ordering::Relaxed) == 0 {
                        ctx.mirror_compared.send_replace(fence.epoch);
                    } else if *ctx.mirror_compared.borrow() < fence.epoch {
                        // The dispatcher and sweeper may be waiting for a complete comparison
                        // (crate::leadership::lead): the failed runs' retries bring a full pass.
                        queue.everything.store(true, Ordering::SeqCst);
                    }
                }
                passed
            } else {
                match ctx.ledger.mirrored_runs_by_id(&ids).await {
                    Ok(runs) => mirror_pass(&ctx, &fence, &mirror, &runs).await,
                    Err(e) => Err(e.into()),
                }
            };
            match passed {
                Ok(()) => {}
                Err(e @ LoopError::NotLeading(_)) => {
                    tracing::warn!(event = "loadrun_mirror_error", error = %e, "mirroring the ledger into LoadRuns stopped")
                }
                Err(e) => {
                    // The next wake-up or the periodic resync looks at everything again.
                    queue.everything.store(true, Ordering::SeqCst);
                    tracing::warn!(event = "loadrun_mirror_error", error = %e, "reading the runs to mirror failed; retrying");
                }
            }
            // Retention is no hurry: on the periodic resync and once when leadership is won, not on
            // every wake-up.
            if periodic || pruned_under != Some(fence.epoch) {
                pruned_under = Some(fence.epoch);
                if let Err(e) = prune_loadruns(&ctx, &fence, &mirror.stores).await {
                    tracing::warn!(event = "loadrun_prune_error", error = %e, "deleting LoadRuns past retention failed; retrying at the next resync");
                }
                let shown = |ns: &str, name: &str| mirror.stores.job(ns, name).is_some();
                if let Err(e) = crate::orphan_jobs::remove_orphans(&ctx, &fence, shown).await {
                    tracing::warn!(event = "orphan_job_error", error = %e, "checking for ledger jobs whose LoadJob is gone failed; retrying at the next resync");
                }
            }
        };
        tokio::select! {
            _ = work => {}
            _ = shutdown.wait_for(|s| *s) => break,
        }
    }
    wakers.abort_all();
}

/// A watch or waker of the mirror ended: says why; the mirror then ends (dropping the others).
fn subtask_ended(ended: Result<(), tokio::task::JoinError>) {
    let why = match ended {
        Ok(()) => "ended".to_string(),
        Err(e) if e.is_panic() => format!("panicked: {e}"),
        Err(e) => format!("was stopped: {e}"),
    };
    tracing::error!(event = "loadrun_mirror_subtask_failed", error = %why,
        "a watch or waker of the LoadRun mirror stopped; restarting the mirror");
}

/// Runs a full pass reads at a time.
const PAGE: i64 = 500;

/// Every mirrored run, page by page (memory bounded by a page, not by the number of runs); then
/// forgets what it kept about runs no longer mirrored.
async fn full_pass(ctx: &Context, fence: &Fence, mirror: &Mirror) -> Result<(), LoopError> {
    let mut current = HashSet::new();
    let mut after = None;
    loop {
        let page = ctx.ledger.mirrored_runs_page(after, PAGE).await?;
        current.extend(page.iter().map(|r| r.run_id));
        mirror_pass(ctx, fence, mirror, &page).await?;
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => after = Some((last.started_at, last.run_id)),
            _ => break,
        }
    }
    mirror
        .applied
        .lock()
        .expect("applied lock")
        .retain(|id, _| current.contains(id));
    mirror
        .stores
        .observed
        .lock()
        .expect("observed lock")
        .retain(|id, _| current.contains(id));
    ctx.mirror_backoff
        .lock()
        .expect("backoff lock")
        .retain(|id, _| current.contains(id));
    Ok(())
}

/// Mirrors `runs`, at most [`WRITE_CONCURRENCY`] at once. One run's failure never stops the
/// others (it backs off on its own); losing leadership stops every write.
async fn mirror_pass(
    ctx: &Context,
    fence: &Fence,
    mirror: &Mirror,
    runs: &[MirroredRun],
) -> Result<(), LoopError> {
    // Made one at a time as slots free up (a future per run made up front would hold every
    // run's state at once); indexed, because a stream of closures over borrowed runs is not
    // `Send` for every lifetime, which `tokio::spawn` needs.
    let results: Vec<Result<(), LoopError>> = futures::stream::iter(0..runs.len())
        .map(|i| mirror_one(ctx, fence, mirror, &runs[i]))
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().find(|r| r.is_err()).unwrap_or(Ok(()))
}

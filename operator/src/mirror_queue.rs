//! (Shared by the mirror and the Context every controller holds: a module of its own, so that the
//! Context depends on no controller.)
//! What wakes the mirror and what it looks at next: a NOTIFY naming a run, a LoadRun carrying a
//! request, leadership won, or everything.
use ledger::Fence;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

/// What the mirror looks at next: single runs (a NOTIFY names its run; a LoadRun carrying a
/// request, or deleted) or everything (start, leadership won, a restarted LISTEN or watch, a
/// newly applied LoadJob, the periodic resync).
#[derive(Default)]
pub struct MirrorQueue {
    pub(crate) runs: std::sync::Mutex<HashSet<Uuid>>,
    pub(crate) everything: AtomicBool,
    pub(crate) wake: Notify,
}

impl MirrorQueue {
    pub fn run(&self, id: Uuid) {
        self.runs.lock().expect("queue lock").insert(id);
        self.wake.notify_one();
    }

    pub fn everything(&self) {
        self.everything.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Empties the queue: (a full pass is due, the single runs asked for).
    pub(crate) fn take(&self) -> (bool, Vec<Uuid>) {
        let everything = self.everything.swap(false, Ordering::SeqCst);
        let runs = std::mem::take(&mut *self.runs.lock().expect("queue lock"));
        (everything, runs.into_iter().collect())
    }
}

/// LISTEN `load_run` for the mirror (reconnected; a reconnect asks for everything, since changes
/// made while nobody listened were not heard). Runs until aborted: its own supervised task, so a
/// panic here is restarted and counted instead of leaving the mirror deaf until the next resync.
pub async fn listen_for_runs(queue: Arc<MirrorQueue>, listen: ledger::Dsn) {
    loop {
        if let Ok(mut l) = listen.listener().await
            && l.listen("load_run").await.is_ok()
        {
            queue.everything();
            while let Ok(Some(n)) = l.try_recv().await {
                match Uuid::parse_str(n.payload()) {
                    Ok(id) => queue.run(id),
                    Err(_) => queue.everything(),
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Starts what wakes the mirror besides the watches and the LISTEN: leadership won. It belongs to
/// `wakers`: dropping it stops it.
pub(crate) fn spawn_wakers(
    queue: &Arc<MirrorQueue>,
    fence: watch::Receiver<Option<Fence>>,
    wakers: &mut tokio::task::JoinSet<()>,
) {
    {
        // Winning leadership is a reason to look at everything (mirror and retention).
        let (queue, mut fence) = (queue.clone(), fence);
        wakers.spawn(async move {
            while fence.changed().await.is_ok() {
                if fence.borrow_and_update().is_some() {
                    queue.everything();
                }
            }
        });
    }
}

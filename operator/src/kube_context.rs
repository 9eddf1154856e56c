//! What the operator's Kubernetes loops share: their context, typed errors and the error
//! policy by class, conditions, Events, and the field manager their status is applied under.
use crds::{Condition, LoadRun};
use kube::api::PatchParams;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use ledger::{Fence, Ledger};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub(crate) fn now() -> String {
    ledger::json::format_ts(&chrono::Utc::now())
}

/// Sets a condition, keeping its transition time when the status did not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let time = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(now);
    conditions.retain(|c| c.type_ != type_);
    conditions.push(Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message: message.into(),
        last_transition_time: time,
        observed_generation: generation,
    });
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

pub struct Context {
    pub client: Client,
    pub ledger: Ledger,
    pub fence: watch::Receiver<Option<Fence>>,
    /// The Lease's renew deadline: checked with the fence before every Kubernetes write.
    pub leading_until: crate::lease::LeadingUntil,
    pub recorder: Recorder,
    pub lease: Duration,
    /// What the LoadRun mirror should look at next.
    pub mirror_queue: Arc<crate::mirror_queue::MirrorQueue>,
    /// The epoch under which the mirror last compared every LoadRun with the ledger (a full
    /// pass): after a restore, the dispatcher and sweeper wait for it (`crate::leadership::lead`).
    pub mirror_compared: watch::Sender<i64>,
    /// The namespaces whose LoadJobs and LoadRuns this installation owns.
    pub scope: crate::scope::WatchScope,
    /// Finished LoadRuns older than this are deleted (etcd does not grow without limit).
    pub loadrun_retention: Duration,
    /// This installation's instance label value, if it has one (two installations that watch
    /// the same namespaces tell their objects apart by it).
    pub instance: Option<String>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Consecutive reconcile failures per LoadJob (namespace/name), for the error policy.
    pub job_failures: std::sync::Mutex<HashMap<String, u32>>,
    /// (namespace, name) of a LoadJob whose runs changed phase: its summary is due.
    pub summary_changed: tokio::sync::broadcast::Sender<(String, String)>,
    /// Runs whose mirroring failed, and when to try each again.
    pub mirror_backoff: std::sync::Mutex<HashMap<uuid::Uuid, RetryAfter>>,
}

/// A run's mirroring failed `failures` times in a row; it is skipped until `next`.
#[derive(Debug, Clone, Copy)]
pub struct RetryAfter {
    pub failures: u32,
    pub next: std::time::Instant,
}

impl Context {
    /// Whether this process still holds the epoch `fence` was won with, and its last Lease
    /// renewal is within the renew deadline: every Kubernetes write checks it first, so a deposed
    /// or stalled leader stops writing at once, not at the end of its pass or when its renew loop
    /// next runs.
    pub(crate) fn still_leads(&self, fence: &Fence) -> Result<(), LoopError> {
        match self.fence.borrow().as_ref() {
            Some(f) if f.epoch == fence.epoch && self.leading_until.holds() => Ok(()),
            _ => Err(LoopError::NotLeading(fence.epoch)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    #[error("ledger: {0}")]
    Ledger(#[from] ledger::LedgerError),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<LoopError>>),
    #[error("leadership of epoch {0} lost: nothing more is written")]
    NotLeading(i64),
    #[error("cannot be read: {0}")]
    Unreadable(String),
}

impl LoopError {
    /// What kind of failure this is, for the error policy and the metrics: `invalid` (the object
    /// or request cannot be applied as it is: wait for it to change), `conflict` (someone else
    /// wrote first: retry soon), `not_leading` (this process was deposed), `transient` (the API
    /// server or the database: back off).
    pub fn class(&self) -> &'static str {
        use kube::runtime::finalizer::Error as F;
        match self {
            LoopError::Finalizer(f) => match f.as_ref() {
                F::ApplyFailed(e) | F::CleanupFailed(e) => e.class(),
                F::AddFinalizer(e) | F::RemoveFinalizer(e) => kube_class(e),
                _ => "invalid",
            },
            LoopError::Kube(e) => kube_class(e),
            LoopError::Unreadable(_) => "invalid",
            LoopError::Ledger(ledger::LedgerError::Fenced { .. }) | LoopError::NotLeading(_) => {
                "not_leading"
            }
            _ => "transient",
        }
    }
}

/// The class of a Kubernetes API error (see [`LoopError::class`]).
fn kube_class(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(e) if e.code == 409 => "conflict",
        kube::Error::Api(e) if e.code == 400 || e.code == 422 => "invalid",
        _ => "transient",
    }
}

/// The error policy's delay for a class after the n-th consecutive failure (pure): conflicts
/// retry at once, transient failures back off 1 s, 2 s, 4 s, … up to 5 minutes; None means wait
/// for the object to change (invalid), or for leadership (not_leading).
pub fn retry_delay(class: &str, failures: u32) -> Option<Duration> {
    match class {
        "invalid" | "not_leading" => None,
        "conflict" => Some(Duration::from_millis(200)),
        _ => Some(Duration::from_secs(
            2u64.saturating_pow(failures.saturating_sub(1).min(9))
                .min(300),
        )),
    }
}

/// The field manager that owns the status this operator writes.
pub const FIELD_MANAGER: &str = "load-control-operator";

/// Status is written by server-side apply under [`FIELD_MANAGER`]; forced, because the status of
/// our objects is ours alone (a previous writer's fields are taken over, not fought over).
pub(crate) fn status_apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Emits once each time this process starts leading.
pub(crate) fn leadership_won(
    fence: watch::Receiver<Option<Fence>>,
) -> impl futures::Stream<Item = ()> + Send {
    futures::stream::unfold(fence, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if rx.borrow_and_update().is_some() {
                return Some(((), rx));
            }
        }
    })
}

/// A Kubernetes Event on `lr`, written only while `fence` still leads (an Event is a Kubernetes
/// write like the others: a deposed or stalled leader writes none). Best effort: a failure is
/// logged, never retried.
pub(crate) async fn publish(
    ctx: &Context,
    fence: &Fence,
    lr: &LoadRun,
    type_: EventType,
    reason: &str,
    note: String,
    action: &str,
) {
    let ev = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if ctx.still_leads(fence).is_err() {
        tracing::debug!(event = "kube_event_skipped", reason = %ev.reason, "not leading: Event not written");
        return;
    }
    if let Err(e) = ctx.recorder.publish(&ev, &lr.object_ref(&())).await {
        tracing::warn!(event = "kube_event_error", error = %e, "publishing a Kubernetes Event failed");
    }
}

pub fn recorder(client: Client, identity: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: "load-control-operator".into(),
            instance: Some(identity.to_string()),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizer_errors_keep_the_class_of_what_failed() {
        use kube::runtime::finalizer::Error as F;
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("x", "Reason")
                    .with_code(code)
                    .boxed(),
            )
        };
        let fin = |e| LoopError::Finalizer(Box::new(e));
        assert_eq!(
            fin(F::ApplyFailed(LoopError::NotLeading(3))).class(),
            "not_leading"
        );
        assert_eq!(
            fin(F::CleanupFailed(LoopError::Unreadable("x".into()))).class(),
            "invalid"
        );
        assert_eq!(fin(F::AddFinalizer(api(409))).class(), "conflict");
        assert_eq!(fin(F::RemoveFinalizer(api(503))).class(), "transient");
        assert_eq!(
            fin(F::ApplyFailed(LoopError::Kube(api(422)))).class(),
            "invalid"
        );
    }

    #[test]
    fn the_error_policy_follows_the_class() {
        assert_eq!(retry_delay("invalid", 3), None);
        assert_eq!(retry_delay("not_leading", 1), None);
        assert_eq!(retry_delay("conflict", 5), Some(Duration::from_millis(200)));
        let transient: Vec<u64> = (1..=12)
            .map(|n| retry_delay("transient", n).unwrap().as_secs())
            .collect();
        assert_eq!(&transient[..4], &[1, 2, 4, 8]);
        assert_eq!(*transient.last().unwrap(), 300);
    }

    #[test]
    fn conditions_keep_their_transition_time_while_unchanged() {
        let mut c = vec![];
        set_condition(&mut c, "Ready", true, "Applied", "", Some(1));
        let t = c[0].last_transition_time.clone();
        std::thread::sleep(Duration::from_millis(5));
        set_condition(&mut c, "Ready", true, "Applied", "again", Some(2));
        assert_eq!(
            (
                c.len(),
                c[0].last_transition_time.as_str(),
                c[0].observed_generation
            ),
            (1, t.as_str(), Some(2))
        );
        set_condition(&mut c, "Ready", false, "InvalidSpec", "x", Some(3));
        assert_ne!(c[0].last_transition_time, t);
    }
}

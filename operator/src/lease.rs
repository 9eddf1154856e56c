//! Leadership on a `coordination.k8s.io/v1` Lease (CONTRACT §7.1; default name
//! `load-control-leader`, the chart names it after the release) with client-go's semantics and
//! default timings: 15 s lease, 10 s renew deadline, 2 s retry. Every write is a compare-and-swap
//! on the Lease's resourceVersion, so two candidates never both win.
//!
//! The renew deadline is measured from the last *successful* write of the Lease (acquisition or
//! renewal), whichever call is running: bumping the epoch, renewing, or a process resumed after a
//! stall. Once it passes, the fence is withdrawn and [`LeadingUntil`] says no, so every leader
//! task stops before any candidate can take the Lease (renew deadline + one retry < lease
//! duration, checked by [`LeaseSettings::validate`]).
//!
//! As in client-go, a candidate judges expiry on its own clock: it takes another holder's Lease
//! only when it has seen the same record (holder, renew time, resourceVersion) unchanged for the
//! lease duration since it first observed it. A holder's `renewTime` is never compared with the
//! candidate's clock, so clock skew between nodes cannot hand a healthy Lease over.
use crate::leadership::{Leadership, RETRY_PERIOD};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use ledger::{Fence, Ledger};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const LEASE_NAME: &str = "load-control-leader";

/// The ledger's schema version as a leader read it when it took the Lease, written on the Lease:
/// the chart reads it with `lookup` and refuses an upgrade to a chart whose binaries do not run on
/// that schema, before any hook changes anything. Never lowered, like the ledger's own schema
/// version; left as it is when the ledger cannot be read at that moment.
pub const SCHEMA_ANNOTATION: &str = "load-control.io/ledger-schema-version";
/// Which release wrote [`SCHEMA_ANNOTATION`].
pub const SCHEMA_WRITER_ANNOTATION: &str = "load-control.io/ledger-schema-written-by";

/// `meta` with the schema mark raised to `ledger_schema` (if it is not above it already).
fn schema_marked(mut meta: ObjectMeta, ledger_schema: Option<i32>) -> ObjectMeta {
    let Some(version) = ledger_schema else {
        return meta;
    };
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    let marked = annotations
        .get(SCHEMA_ANNOTATION)
        .and_then(|v| v.parse::<i32>().ok());
    if marked.is_none_or(|v| v < version) {
        annotations.insert(SCHEMA_ANNOTATION.into(), version.to_string());
        annotations.insert(
            SCHEMA_WRITER_ANNOTATION.into(),
            concat!("load-control ", env!("CARGO_PKG_VERSION")).into(),
        );
    }
    meta
}
/// The highest leader epoch issued, and the ledger clock its leader last saw committed
/// (`ledger::ops::continuity`): written by the leader on every renewal, read by every candidate.
/// They live outside the database, so a restore of the ledger from backup does not take them back:
/// a new leader never takes an epoch issued before the restore, and finds the clock behind.
pub const EPOCH_ANNOTATION: &str = "load-control.io/leader-epoch";
pub const CLOCK_ANNOTATION: &str = "load-control.io/ledger-clock";

/// `meta` with this process's continuity marks: the epoch raised (never lowered), the clock as
/// this process knows it (lowered too, once a leader accepted a restored ledger). Nothing is
/// written before the process has seen any.
fn continuity_marked(mut meta: ObjectMeta, (epoch, clock): (i64, i64)) -> ObjectMeta {
    if epoch <= 0 {
        return meta;
    }
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    let marked = annotations
        .get(EPOCH_ANNOTATION)
        .and_then(|v| v.parse::<i64>().ok());
    if marked.is_none_or(|v| v < epoch) {
        annotations.insert(EPOCH_ANNOTATION.into(), epoch.to_string());
    }
    annotations.insert(CLOCK_ANNOTATION.into(), clock.to_string());
    meta
}

/// What a Lease says of the ledger's past, fed into the ledger's memory.
fn learn_continuity(ledger: &Ledger, lease: &Lease) {
    let annotations = lease.metadata.annotations.as_ref();
    let read = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .and_then(|v| v.parse::<i64>().ok())
    };
    if let Some(epoch) = read(EPOCH_ANNOTATION) {
        ledger.remember_epoch(epoch);
    }
    if let Some(clock) = read(CLOCK_ANNOTATION) {
        ledger.set_known_clock(clock);
    }
}

pub const LEASE_SECONDS: i32 = 15;
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// The Lease's name and timings (flags `--lease-name`, `--lease-duration`, `--renew-deadline`,
/// `--retry-period`; chart values `leaderElection.*`).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseSettings {
    pub name: String,
    /// How long a candidate waits, on its own clock, for an unchanged record before taking it.
    pub duration: Duration,
    /// How long a leader goes on without a successful renewal before it stops leading.
    pub renew_deadline: Duration,
    /// How often a leader renews and a candidate tries.
    pub retry: Duration,
}

impl Default for LeaseSettings {
    fn default() -> LeaseSettings {
        LeaseSettings {
            name: LEASE_NAME.into(),
            duration: Duration::from_secs(LEASE_SECONDS as u64),
            renew_deadline: RENEW_DEADLINE,
            retry: RETRY_PERIOD,
        }
    }
}

impl LeaseSettings {
    /// A leader must have stopped (renew deadline) and noticed it (one retry) before any
    /// candidate can acquire (lease duration); the name must be a Kubernetes object name.
    pub fn validate(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 253
            && self.name.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !name_ok {
            return Err(format!(
                "lease name {:?} is not a Kubernetes object name (lowercase letters, digits, '-' and '.')",
                self.name
            ));
        }
        if self.retry.is_zero() || self.duration.as_secs() == 0 || self.duration.subsec_nanos() != 0
        {
            return Err(
                "the lease duration must be whole seconds and the retry period above zero".into(),
            );
        }
        if self.duration.as_secs() > i32::MAX as u64 {
            return Err("the lease duration is too long".into());
        }
        if self.renew_deadline + self.retry >= self.duration {
            return Err(format!(
                "renew deadline ({:?}) + retry period ({:?}) must be shorter than the lease duration ({:?}): otherwise a candidate may take the Lease while the old leader still acts",
                self.renew_deadline, self.retry, self.duration
            ));
        }
        if self.retry >= self.renew_deadline {
            return Err(format!(
                "the retry period ({:?}) must be shorter than the renew deadline ({:?}): a leader must get a second try",
                self.retry, self.renew_deadline
            ));
        }
        Ok(())
    }
}

/// Until when this process may act as leader: the last successful Lease write plus the renew
/// deadline (None: not leading). Kubernetes writes check it right before they are sent, so a
/// process resumed after a stall writes nothing, even before its renew loop has run again.
#[derive(Clone, Default)]
pub struct LeadingUntil(Arc<Mutex<Option<Instant>>>);

impl LeadingUntil {
    pub fn set(&self, until: Option<Instant>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }

    /// Whether the deadline is still ahead.
    pub fn holds(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| Instant::now() < t)
    }
}

/// What a candidate saw of another holder's Lease, and when (on its own clock).
#[derive(Debug, Clone, PartialEq)]
struct Observed {
    record: (Option<String>, Option<String>, Option<String>),
    since: Instant,
}

pub struct KubeLeaseLeadership {
    api: Api<Lease>,
    ledger: Ledger,
    holder: String,
    /// The Lease as we last wrote it (its resourceVersion is the CAS token of the next renewal).
    held: Option<Lease>,
    /// The other holder's record as last seen.
    observed: Option<Observed>,
    settings: LeaseSettings,
    /// When the Lease was last written by us with success (acquired or renewed).
    renewed: Option<Instant>,
    leading_until: LeadingUntil,
}

/// Whether `holder` may take the lease now (pure, for unit tests): it is free or ours, or the
/// other holder's record has not changed for its whole duration on our own clock.
pub fn may_take(spec: &LeaseSpec, holder: &str, unchanged_for: Duration) -> bool {
    let Some(current) = spec.holder_identity.as_deref().filter(|h| !h.is_empty()) else {
        return true;
    };
    if current == holder {
        return true;
    }
    let duration = spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS).max(1) as u64;
    unchanged_for > Duration::from_secs(duration)
}

fn record(lease: &Lease) -> (Option<String>, Option<String>, Option<String>) {
    let spec = lease.spec.as_ref();
    (
        spec.and_then(|s| s.holder_identity.clone()),
        spec.and_then(|s| s.renew_time.as_ref())
            .map(|MicroTime(t)| t.to_string()),
        lease.metadata.resource_version.clone(),
    )
}

impl KubeLeaseLeadership {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        ledger: Ledger,
        holder: String,
        settings: LeaseSettings,
    ) -> Self {
        KubeLeaseLeadership {
            api: Api::namespaced(client, namespace),
            ledger,
            holder,
            held: None,
            observed: None,
            settings,
            renewed: None,
            leading_until: LeadingUntil::default(),
        }
    }

    /// Until when this process may act as leader (shared with the Kubernetes loops).
    pub fn leading_until(&self) -> LeadingUntil {
        self.leading_until.clone()
    }

    /// A successful write of the Lease at `at`.
    fn renewed_at(&mut self, lease: Lease, at: Instant) {
        self.held = Some(lease);
        self.renewed = Some(at);
        self.leading_until
            .set(Some(at + self.settings.renew_deadline));
    }

    /// Leadership is over (lost, or given up).
    fn stop_leading(&mut self) {
        self.held = None;
        self.renewed = None;
        self.leading_until.set(None);
    }

    fn spec(&self, previous: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
        let ours =
            previous.and_then(|p| p.holder_identity.as_deref()) == Some(self.holder.as_str());
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.holder.clone()),
            lease_duration_seconds: Some(self.settings.duration.as_secs() as i32),
            acquire_time: if ours {
                previous.and_then(|p| p.acquire_time.clone())
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if ours || previous.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..Default::default()
        }
    }

    /// The ledger's schema version for the Lease's mark, or none when it cannot be read within a
    /// second (the mark then stays as it is; taking the Lease does not wait for the database).
    async fn ledger_schema(&self) -> Option<i32> {
        tokio::time::timeout(Duration::from_secs(1), self.ledger.schema_version())
            .await
            .ok()?
            .ok()
    }

    /// One attempt; `Ok(true)` when we hold the lease afterwards.
    pub async fn try_acquire(&mut self) -> anyhow::Result<bool> {
        match self.api.get_opt(&self.settings.name).await? {
            None => {
                let schema = self.ledger_schema().await;
                // The deadline counts from before the request was sent: the API server may have
                // written it at any moment until the answer came.
                let (now, sent) = (Timestamp::now(), Instant::now());
                let lease = Lease {
                    metadata: continuity_marked(
                        schema_marked(
                            ObjectMeta {
                                name: Some(self.settings.name.clone()),
                                ..Default::default()
                            },
                            schema,
                        ),
                        self.ledger.continuity_marks(),
                    ),
                    spec: Some(self.spec(None, now)),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(l) => {
                        self.renewed_at(l, sent);
                        Ok(true)
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Some(existing) => {
                learn_continuity(&self.ledger, &existing);
                let spec = existing.spec.clone().unwrap_or_default();
                let seen = record(&existing);
                let observed = match self.observed.take() {
                    Some(o) if o.record == seen => o,
                    _ => Observed {
                        record: seen,
                        since: Instant::now(),
                    },
                };
                let unchanged_for = observed.since.elapsed();
                self.observed = Some(observed);
                if !may_take(&spec, &self.holder, unchanged_for) {
                    return Ok(false);
                }
                let schema = self.ledger_schema().await;
                let (now, sent) = (Timestamp::now(), Instant::now());
                let lease = Lease {
                    metadata: continuity_marked(
                        schema_marked(existing.metadata.clone(), schema),
                        self.ledger.continuity_marks(),
                    ),
                    spec: Some(self.spec(Some(&spec), now)),
                };
                match self
                    .api
                    .replace(&self.settings.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(l) => {
                        self.renewed_at(l, sent);
                        self.observed = None;
                        Ok(true)
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Renews with the last resourceVersion; `Ok(false)` when someone else holds it now, or
    /// when the Lease was deleted.
    async fn renew(&mut self) -> anyhow::Result<bool> {
        let Some(held) = self.held.clone() else {
            return Ok(false);
        };
        let lease = Lease {
            metadata: continuity_marked(held.metadata.clone(), self.ledger.continuity_marks()),
            spec: Some(self.spec(held.spec.as_ref(), Timestamp::now())),
        };
        let sent = Instant::now();
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(l) => {
                self.renewed_at(l, sent);
                Ok(true)
            }
            // Deleted under us: whoever creates it next leads; we do not.
            Err(kube::Error::Api(e)) if e.code == 404 => {
                self.stop_leading();
                Ok(false)
            }
            // Written by someone else since our last write. Still ours only if we wrote it
            // (an answer lost in transit); that read is no renewal, so the deadline stays.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let current = self.api.get_opt(&self.settings.name).await?;
                let ours = current
                    .as_ref()
                    .and_then(|l| l.spec.as_ref())
                    .and_then(|s| s.holder_identity.as_deref())
                    == Some(self.holder.as_str());
                match current.filter(|_| ours) {
                    Some(l) => self.held = Some(l),
                    None => self.stop_leading(),
                }
                Ok(ours)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Renews every retry period until the renew deadline, counted from the last successful
    /// write whenever that was, passes without another (each attempt bounded by the time left, so
    /// a hung API call cannot keep a lost Lease looking held), or someone else holds the Lease.
    async fn keep_renewing(&mut self) {
        loop {
            let Some(renewed) = self.renewed else { return };
            if renewed.elapsed() >= self.settings.renew_deadline {
                tracing::warn!(
                    event = "leader_renew_deadline",
                    since_last_renewal_s = renewed.elapsed().as_secs_f64(),
                    "no renewal within the renew deadline: giving leadership up"
                );
                self.stop_leading();
                return;
            }
            let left = self
                .settings
                .renew_deadline
                .saturating_sub(renewed.elapsed());
            tokio::time::sleep(self.settings.retry.min(left)).await;
            let left = self
                .settings
                .renew_deadline
                .saturating_sub(renewed.elapsed());
            if left.is_zero() {
                continue;
            }
            let attempt = tokio::time::timeout(left, self.renew());
            match attempt.await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => return,
                Ok(Err(e)) => {
                    tracing::warn!(event = "leader_renew_error", error = %e, "renewing the Lease failed")
                }
                Err(_) => {
                    tracing::warn!(
                        event = "leader_renew_timeout",
                        "renewing the Lease did not answer in time"
                    )
                }
            }
        }
    }
}

impl Leadership for KubeLeaseLeadership {
    async fn acquire(&mut self) -> anyhow::Result<Fence> {
        loop {
            match self.try_acquire().await {
                Ok(true) => {
                    // Bumping the epoch may wait for a deposed leader's last transaction: the
                    // Lease is renewed meanwhile, so it does not expire under us.
                    let holder = self.holder.clone();
                    let ledger = self.ledger.clone();
                    let epoch = tokio::select! {
                        e = ledger.acquire_epoch(&holder) => Some(e),
                        _ = self.keep_renewing() => None,
                    };
                    match epoch {
                        Some(Ok(fence)) => {
                            // The new epoch onto the Lease at once (not at the next renewal): a
                            // restore in between must not let the next leader issue it again.
                            let _ = tokio::time::timeout(self.settings.retry, self.renew()).await;
                            return Ok(fence);
                        }
                        Some(Err(e)) => {
                            // No epoch, no leadership: hand the Lease on at once rather than
                            // hold it idle until it expires.
                            crate::leadership::epoch_refused(
                                &e,
                                "won the Lease but could not bump the epoch; releasing it",
                            );
                            self.release().await;
                        }
                        None => {
                            tracing::warn!(
                                event = "leader_lost",
                                "the Lease was lost while the epoch was being bumped"
                            )
                        }
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(event = "leader_lease_error", lease = %self.settings.name, error = %e, "cannot read or write the Lease")
                }
            }
            tokio::time::sleep(self.settings.retry).await;
        }
    }

    async fn lost(&mut self) {
        self.keep_renewing().await;
    }

    /// Gives the Lease up at once (holder cleared, 1 s duration), as client-go does on cancel.
    async fn release(&mut self) {
        let held = self.held.take();
        self.stop_leading();
        if let Some(held) = held {
            let mut spec = held.spec.clone().unwrap_or_default();
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            let lease = Lease {
                metadata: held.metadata,
                spec: Some(spec),
            };
            let released = tokio::time::timeout(
                self.settings.renew_deadline,
                self.api
                    .replace(&self.settings.name, &PostParams::default(), &lease),
            )
            .await;
            if !matches!(released, Ok(Ok(_))) {
                tracing::warn!(
                    event = "leader_release_error",
                    "releasing the Lease failed; it expires by itself"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_mark_is_raised_never_lowered() {
        let mark = |v: Option<&str>| {
            let meta = ObjectMeta {
                annotations: v.map(|v| [(SCHEMA_ANNOTATION.to_string(), v.to_string())].into()),
                ..Default::default()
            };
            schema_marked(meta, Some(2)).annotations.unwrap()[SCHEMA_ANNOTATION].clone()
        };
        assert_eq!(mark(None), "2");
        assert_eq!(mark(Some("1")), "2");
        assert_eq!(mark(Some("garbage")), "2");
        assert_eq!(mark(Some("3")), "3", "never lowered");
        // The ledger unread: the Lease keeps what it has.
        assert_eq!(schema_marked(ObjectMeta::default(), None).annotations, None);
    }

    /// The epoch on the Lease is raised, never lowered (a candidate that knows less writes no
    /// lower floor); the clock is what the leader knows now, lowered too once a restore was
    /// accepted (a higher mark left behind would make every later leader find the ledger gone
    /// back again); a process that has seen nothing writes nothing.
    #[test]
    fn the_continuity_marks_raise_the_epoch_and_carry_the_clock() {
        let marked = |epoch: Option<&str>, marks| {
            let meta = ObjectMeta {
                annotations: epoch.map(|v| [(EPOCH_ANNOTATION.to_string(), v.to_string())].into()),
                ..Default::default()
            };
            let a = continuity_marked(meta, marks)
                .annotations
                .unwrap_or_default();
            (
                a.get(EPOCH_ANNOTATION).cloned(),
                a.get(CLOCK_ANNOTATION).cloned(),
            )
        };
        let some = |s: &str| Some(s.to_string());
        assert_eq!(marked(None, (3, 40)), (some("3"), some("40")));
        assert_eq!(marked(Some("2"), (3, 40)), (some("3"), some("40")));
        assert_eq!(
            marked(Some("7"), (3, 12)),
            (some("7"), some("12")),
            "never lowered"
        );
        assert_eq!(marked(Some("junk"), (3, 1)), (some("3"), some("1")));
        assert_eq!(
            marked(None, (0, 0)),
            (None, None),
            "nothing seen, nothing written"
        );
    }

    fn spec(holder: Option<&str>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }
    }

    #[test]
    fn lease_timings_must_stop_a_leader_before_a_candidate_can_take_over() {
        let s = Duration::from_secs;
        let ok = LeaseSettings::default();
        assert_eq!(ok.validate(), Ok(()));
        let with = |duration, renew_deadline, retry| LeaseSettings {
            duration: s(duration),
            renew_deadline: s(renew_deadline),
            retry: s(retry),
            ..LeaseSettings::default()
        };
        assert!(with(60, 40, 5).validate().is_ok());
        // 10 + 5 is not below 15: the old leader may still act when a candidate takes over.
        assert!(
            with(15, 10, 5)
                .validate()
                .unwrap_err()
                .contains("shorter than the lease duration")
        );
        assert!(with(15, 14, 2).validate().is_err());
        assert!(
            with(15, 2, 2)
                .validate()
                .unwrap_err()
                .contains("second try")
        );
        assert!(with(15, 10, 0).validate().is_err());
        let bad_name = LeaseSettings {
            name: "Not_A_Name".into(),
            ..LeaseSettings::default()
        };
        assert!(bad_name.validate().is_err());
    }

    #[test]
    fn leading_until_holds_only_before_its_deadline() {
        let l = LeadingUntil::default();
        assert!(!l.holds(), "never leading");
        l.set(Some(Instant::now() + Duration::from_secs(5)));
        assert!(l.holds());
        l.set(Some(Instant::now() - Duration::from_millis(1)));
        assert!(
            !l.holds(),
            "the deadline passed (a stalled process resumed)"
        );
        l.set(None);
        assert!(!l.holds());
    }

    #[test]
    fn a_lease_is_taken_when_free_ours_or_unchanged_for_its_duration() {
        let s = Duration::from_secs;
        assert!(may_take(&spec(None), "me", s(0)));
        assert!(may_take(&spec(Some("")), "me", s(0)));
        assert!(may_take(&spec(Some("me")), "me", s(0)));
        assert!(!may_take(&spec(Some("other")), "me", s(5)));
        assert!(!may_take(&spec(Some("other")), "me", s(15)));
        assert!(may_take(&spec(Some("other")), "me", s(16)));
    }
}

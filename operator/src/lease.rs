//! Leadership on the `coordination.k8s.io/v1` Lease `load-control-leader` (CONTRACT §7.1), with
//! client-go's fixed timings: 15 s lease, 10 s renew deadline, 2 s retry. Every write is a
//! compare-and-swap on the Lease's resourceVersion, so two candidates never both win.
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
use std::time::{Duration, Instant};

pub const LEASE_NAME: &str = "load-control-leader";
pub const LEASE_SECONDS: i32 = 15;
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

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
    pub fn new(client: kube::Client, namespace: &str, ledger: Ledger, holder: String) -> Self {
        KubeLeaseLeadership {
            api: Api::namespaced(client, namespace),
            ledger,
            holder,
            held: None,
            observed: None,
        }
    }

    fn spec(&self, previous: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
        let ours =
            previous.and_then(|p| p.holder_identity.as_deref()) == Some(self.holder.as_str());
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.holder.clone()),
            lease_duration_seconds: Some(LEASE_SECONDS),
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

    /// One attempt; `Ok(true)` when we hold the lease afterwards.
    pub async fn try_acquire(&mut self) -> anyhow::Result<bool> {
        let now = Timestamp::now();
        match self.api.get_opt(LEASE_NAME).await? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(LEASE_NAME.into()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(None, now)),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(l) => {
                        self.held = Some(l);
                        Ok(true)
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Some(existing) => {
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
                let lease = Lease {
                    metadata: existing.metadata.clone(),
                    spec: Some(self.spec(Some(&spec), now)),
                };
                match self
                    .api
                    .replace(LEASE_NAME, &PostParams::default(), &lease)
                    .await
                {
                    Ok(l) => {
                        self.held = Some(l);
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
            metadata: held.metadata.clone(),
            spec: Some(self.spec(held.spec.as_ref(), Timestamp::now())),
        };
        match self
            .api
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await
        {
            Ok(l) => {
                self.held = Some(l);
                Ok(true)
            }
            // Deleted under us: whoever creates it next leads; we do not.
            Err(kube::Error::Api(e)) if e.code == 404 => {
                self.held = None;
                Ok(false)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let current = self.api.get_opt(LEASE_NAME).await?;
                let ours = current
                    .as_ref()
                    .and_then(|l| l.spec.as_ref())
                    .and_then(|s| s.holder_identity.as_deref())
                    == Some(self.holder.as_str());
                self.held = current.filter(|_| ours);
                Ok(ours)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Renews every retry period until the renew deadline passes without a successful renewal
    /// (each attempt bounded, so a hung API call cannot keep a lost Lease looking held), or
    /// someone else holds the Lease.
    async fn keep_renewing(&mut self) {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(RETRY_PERIOD).await;
            let left = RENEW_DEADLINE.saturating_sub(renewed.elapsed());
            let attempt = tokio::time::timeout(left.max(Duration::from_millis(100)), self.renew());
            match attempt.await {
                Ok(Ok(true)) => renewed = Instant::now(),
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
            if renewed.elapsed() >= RENEW_DEADLINE {
                tracing::warn!(
                    event = "leader_renew_deadline",
                    "no renewal within the renew deadline: giving leadership up"
                );
                self.held = None;
                return;
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
                        Some(Ok(fence)) => return Ok(fence),
                        Some(Err(e)) => {
                            // No epoch, no leadership: hand the Lease on at once rather than
                            // hold it idle until it expires.
                            tracing::warn!(event = "leader_epoch_error", error = %e, "won the Lease but could not bump the epoch; releasing it");
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
                    tracing::warn!(event = "leader_lease_error", error = %e, "cannot read or write the Lease")
                }
            }
            tokio::time::sleep(RETRY_PERIOD).await;
        }
    }

    async fn lost(&mut self) {
        self.keep_renewing().await;
    }

    /// Gives the Lease up at once (holder cleared, 1 s duration), as client-go does on cancel.
    async fn release(&mut self) {
        if let Some(held) = self.held.take() {
            let mut spec = held.spec.clone().unwrap_or_default();
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            let lease = Lease {
                metadata: held.metadata,
                spec: Some(spec),
            };
            let released = tokio::time::timeout(
                RENEW_DEADLINE,
                self.api.replace(LEASE_NAME, &PostParams::default(), &lease),
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

    fn spec(holder: Option<&str>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }
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

//! Leadership on the `coordination.k8s.io/v1` Lease `load-control-leader` (CONTRACT §7.1), with
//! client-go's fixed timings: 15 s lease, 10 s renew deadline, 2 s retry. Every write is a
//! compare-and-swap on the Lease's resourceVersion, so two candidates never both win.
use crate::leadership::{Leadership, RETRY_PERIOD};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;
use ledger::{Fence, Ledger};
use std::time::{Duration, Instant};

pub const LEASE_NAME: &str = "load-control-leader";
pub const LEASE_SECONDS: i32 = 15;
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

pub struct KubeLeaseLeadership {
    api: Api<Lease>,
    ledger: Ledger,
    holder: String,
    /// The Lease as we last wrote it (its resourceVersion is the CAS token of the next renewal).
    held: Option<Lease>,
    /// When the other holder's lease expires, as last observed; the next try is made then.
    expires_in: Option<Duration>,
}

/// Whether `holder` may take the lease now: free, ours, or expired (pure, for unit tests).
pub fn may_take(spec: &LeaseSpec, holder: &str, now: Timestamp) -> bool {
    let Some(current) = spec.holder_identity.as_deref().filter(|h| !h.is_empty()) else {
        return true;
    };
    if current == holder {
        return true;
    }
    let duration = spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS) as i64;
    match spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) {
        Some(MicroTime(renewed)) => *renewed + SignedDuration::from_secs(duration) < now,
        None => true,
    }
}

impl KubeLeaseLeadership {
    pub fn new(client: kube::Client, namespace: &str, ledger: Ledger, holder: String) -> Self {
        KubeLeaseLeadership {
            api: Api::namespaced(client, namespace),
            ledger,
            holder,
            held: None,
            expires_in: None,
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
                if !may_take(&spec, &self.holder, now) {
                    let duration = spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS) as i64;
                    self.expires_in = spec
                        .renew_time
                        .as_ref()
                        .or(spec.acquire_time.as_ref())
                        .and_then(|MicroTime(t)| {
                            let left =
                                (*t + SignedDuration::from_secs(duration)).duration_since(now);
                            Duration::try_from(left).ok()
                        });
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
                        Ok(true)
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Renews with the last resourceVersion; `Ok(false)` when someone else holds it now.
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
}

impl Leadership for KubeLeaseLeadership {
    async fn acquire(&mut self) -> anyhow::Result<Fence> {
        loop {
            match self.try_acquire().await {
                Ok(true) => return Ok(self.ledger.acquire_epoch(&self.holder).await?),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(event = "leader_lease_error", error = %e, "cannot read or write the Lease")
                }
            }
            // Every retry period, or right when the holder's lease runs out if that is sooner.
            let wait = self.expires_in.take().map_or(RETRY_PERIOD, |left| {
                left.clamp(Duration::from_millis(50), RETRY_PERIOD)
            });
            tokio::time::sleep(wait).await;
        }
    }

    async fn lost(&mut self) {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(RETRY_PERIOD).await;
            match self.renew().await {
                Ok(true) => renewed = Instant::now(),
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(event = "leader_renew_error", error = %e, "renewing the Lease failed");
                    if renewed.elapsed() > RENEW_DEADLINE {
                        self.held = None;
                        return;
                    }
                }
            }
        }
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
            if let Err(e) = self
                .api
                .replace(LEASE_NAME, &PostParams::default(), &lease)
                .await
            {
                tracing::warn!(event = "leader_release_error", error = %e, "releasing the Lease failed; it expires by itself");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed_secs_ago: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(
                Timestamp::now() - SignedDuration::from_secs(renewed_secs_ago),
            )),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_is_taken_when_free_ours_or_expired() {
        let now = Timestamp::now();
        assert!(may_take(&spec(None, 0), "me", now));
        assert!(may_take(&spec(Some(""), 0), "me", now));
        assert!(may_take(&spec(Some("me"), 0), "me", now));
        assert!(!may_take(&spec(Some("other"), 5), "me", now));
        assert!(may_take(&spec(Some("other"), 16), "me", now));
        assert!(may_take(
            &LeaseSpec {
                holder_identity: Some("other".into()),
                ..Default::default()
            },
            "me",
            now
        ));
    }
}

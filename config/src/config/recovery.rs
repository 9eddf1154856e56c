//! `recovery` and `dispatch`: the sweeper's deadlines and the dispatcher's retries.
use super::Dur;
use crate::error::{ConfigError, invalid};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `recovery`: when the sweeper takes a run or a partition for stuck, and what it does then.
/// Every key but `sweeper_interval` may be set per job (a LoadJob's `spec.recovery`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    /// A run still CREATED or EXTRACTING this long after it started is TIMED_OUT.
    pub run_timeout: Dur,
    /// Must equal NiFi's extract query timeout: a partition's extraction may be silent this long.
    pub extract_query_timeout: Dur,
    /// A RUNNING partition whose heartbeat is older than this is stale (must be longer than
    /// `extract_query_timeout`); `mode` says what happens to it.
    pub stale: Dur,
    /// What the sweeper does with a RUNNING partition whose heartbeat is older than `stale`:
    /// `FAIL` ends the run TIMED_OUT, `REISSUE` reissues the partition to NiFi (at most
    /// `max_attempts` claims).
    pub mode: RecoveryMode,
    /// Claims of one partition before `REISSUE` gives up and fails the run.
    #[schemars(range(min = 1))]
    pub max_attempts: u32,
    /// A run VALIDATING this long is reported stale (monitor, alert).
    pub validation_stale: Dur,
    /// A run PUBLISHING this long becomes PUBLISH_UNKNOWN, for a person to resolve.
    pub publish_stale: Dur,
    /// How often the sweeper runs (leader only).
    pub sweeper_interval: Dur,
}

/// Defined once, in the ledger, which applies it.
pub use ledger::settings::RecoveryMode;

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            run_timeout: Dur::secs(6 * 3600),
            extract_query_timeout: Dur::secs(3600),
            stale: Dur::secs(90 * 60),
            mode: RecoveryMode::Fail,
            max_attempts: 3,
            validation_stale: Dur::secs(2 * 3600),
            publish_stale: Dur::secs(2 * 3600),
            sweeper_interval: Dur::secs(60),
        }
    }
}

/// `dispatch`: how the operator delivers the outbox to NiFi's PG-05 and retries it.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DispatchConfig {
    /// Sends of one dispatch, resends after `ack_timeout` included, before it is DEAD (then
    /// `loadctl resend`). Per job.
    #[schemars(range(min = 1))]
    pub max_attempts: u32,
    /// The first wait before a failed send is retried; doubled each time. Per job.
    pub backoff_min: Dur,
    /// The longest wait between retries. Per job.
    pub backoff_max: Dur,
    /// A sent dispatch that the flow it starts has not acknowledged (PG-40's validation start,
    /// PG-10's claim of a reissued partition) this long is sent again. Per job.
    pub ack_timeout: Dur,
    /// How long a claimed dispatch is held by the sender; longer than `nifi.timeout_seconds`, so
    /// a row is never sent twice at once.
    pub lease: Dur,
    /// How often the dispatcher looks for due rows when no NOTIFY woke it.
    pub poll_interval: Dur,
    /// Rows claimed per round.
    #[schemars(range(min = 1))]
    pub batch: u32,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            max_attempts: 20,
            backoff_min: Dur::secs(5),
            backoff_max: Dur::secs(300),
            ack_timeout: Dur::secs(600),
            lease: Dur::secs(60),
            poll_interval: Dur::secs(5),
            batch: 20,
        }
    }
}

impl RecoveryConfig {
    /// §10.4's checks of the `recovery` section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.stale.0 <= self.extract_query_timeout.0 {
            return Err(invalid(
                "recovery.stale",
                "must be greater than recovery.extract_query_timeout",
            ));
        }
        if self.max_attempts < 1 {
            return Err(invalid("recovery.max_attempts", "must be at least 1"));
        }
        Ok(())
    }
}

impl DispatchConfig {
    /// §10.4's checks of the `dispatch` section (its lease against `nifi.timeout_seconds` is
    /// checked across sections).
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.backoff_min.0 > self.backoff_max.0 {
            return Err(invalid(
                "dispatch.backoff_min",
                "must not exceed dispatch.backoff_max",
            ));
        }
        Ok(())
    }
}

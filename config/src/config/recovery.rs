//! `recovery` and `dispatch`: the sweeper's deadlines and the dispatcher's retries.
use super::Dur;
use crate::error::{ConfigError, invalid};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    pub run_timeout: Dur,
    pub extract_query_timeout: Dur,
    pub stale: Dur,
    pub mode: RecoveryMode,
    pub max_attempts: u32,
    pub validation_stale: Dur,
    pub publish_stale: Dur,
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatchConfig {
    pub max_attempts: u32,
    pub backoff_min: Dur,
    pub backoff_max: Dur,
    pub ack_timeout: Dur,
    pub lease: Dur,
    pub poll_interval: Dur,
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

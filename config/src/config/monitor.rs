//! `monitor` (what `loadctl` reads) and `worker` (the operator's metrics listener).
use crate::error::{ConfigError, invalid};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorConfig {
    pub api_url: Option<String>,
    pub token: Option<String>,
    pub operator_token: Option<String>,
    pub refresh_seconds: f64,
    pub log_dir: String,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            api_url: None,
            token: None,
            operator_token: None,
            refresh_seconds: 5.0,
            log_dir: "logs".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    pub metrics_host: String,
    pub metrics_port: Option<i64>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            metrics_host: "0.0.0.0".into(),
            metrics_port: Some(9100),
        }
    }
}

impl MonitorConfig {
    /// §10.4's checks of the `monitor` section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.refresh_seconds < 1.0 {
            return Err(invalid("monitor.refresh_seconds", "must be at least 1"));
        }
        Ok(())
    }
}

impl WorkerConfig {
    /// §10.4's checks of the `worker` section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(p) = self.metrics_port
            && !(1..=65535).contains(&p)
        {
            return Err(invalid(
                "worker.metrics_port",
                format!("{p} is outside 1..65535"),
            ));
        }
        Ok(())
    }
}

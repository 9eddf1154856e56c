//! `logging`: level, format, the rotated file and the access log.
use crate::error::{ConfigError, invalid};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const LOG_LEVELS: &[&str] = &["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"];

/// `logging.file`: a log file rotated by size.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogFileConfig {
    /// Required: the file; `{service}` becomes `server` or `worker`.
    pub path: String,
    /// `text` or `json`.
    #[serde(default = "default_file_format")]
    #[schemars(extend("enum" = ["text", "json"]))]
    pub format: String,
    /// The size at which the file is rotated; at least 1024.
    #[serde(default = "default_max_bytes")]
    #[schemars(range(min = 1024))]
    pub max_bytes: u64,
    /// Rotated files kept.
    #[serde(default = "default_backup_count")]
    pub backup_count: u32,
}

fn default_file_format() -> String {
    "text".into()
}
fn default_max_bytes() -> u64 {
    104_857_600
}
fn default_backup_count() -> u32 {
    10
}

/// `logging`: what is logged, where, and in which format. Secrets the configuration holds are
/// scrubbed from every line.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// `DEBUG`, `INFO`, `WARNING`, `ERROR` or `CRITICAL`.
    #[schemars(extend("enum" = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]))]
    pub level: String,
    /// Format of the lines on standard output: `json` (one object per line) or `text`;
    /// `console` is text with colours on a terminal.
    #[schemars(extend("enum" = ["json", "text", "console"]))]
    pub format: String,
    /// Log to standard output; at least one of `stdout` and `file` is required.
    pub stdout: bool,
    /// A file rotated by size: `{path, format, max_bytes, backup_count}`.
    pub file: Option<LogFileConfig>,
    /// The access log (logger `load_control.access`): `api_request` and `api_response` for every
    /// request but `/healthz`, `/readyz` and `/metrics`.
    pub access_log: bool,
    /// Log request and response bodies in the access log (token fields shown as `***`); turn it
    /// off where bodies must not reach the log store.
    pub access_body: bool,
    /// Characters of a body logged before it is cut.
    pub access_body_max: usize,
    /// Levels by logger (a module path prefix), over `level`.
    pub loggers: BTreeMap<String, String>,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        let loggers = ["sqlx", "hyper", "reqwest", "h2", "rustls"]
            .iter()
            .map(|l| (l.to_string(), "WARNING".to_string()))
            .collect();
        LoggingConfig {
            level: "INFO".into(),
            format: "json".into(),
            stdout: true,
            file: None,
            access_log: true,
            access_body: true,
            access_body_max: 2000,
            loggers,
        }
    }
}

impl LoggingConfig {
    /// §10.4's checks of the `logging` section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let l = self;
        if !l.stdout && l.file.is_none() {
            return Err(invalid(
                "logging.stdout",
                "no log output: stdout is false and logging.file is not set",
            ));
        }
        if !LOG_LEVELS.contains(&l.level.to_uppercase().as_str()) {
            return Err(invalid(
                "logging.level",
                format!(
                    "unknown level {:?} (one of {})",
                    l.level,
                    LOG_LEVELS.join(", ")
                ),
            ));
        }
        for (logger, level) in &l.loggers {
            if !LOG_LEVELS.contains(&level.to_uppercase().as_str()) {
                return Err(invalid(
                    &format!("logging.loggers.{logger}"),
                    format!("unknown level {level:?}"),
                ));
            }
        }
        if !["json", "text", "console"].contains(&l.format.as_str()) {
            return Err(invalid("logging.format", "must be json, text or console"));
        }
        if let Some(f) = &l.file {
            if f.max_bytes < 1024 {
                return Err(invalid("logging.file.max_bytes", "must be at least 1024"));
            }
            if !["text", "json"].contains(&f.format.as_str()) {
                return Err(invalid("logging.file.format", "must be text or json"));
            }
        }
        Ok(())
    }
}

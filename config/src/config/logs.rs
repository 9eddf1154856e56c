//! `logging`: level, format, the rotated file and the access log.
use crate::error::{ConfigError, invalid};
use serde::Deserialize;
use std::collections::BTreeMap;

pub const LOG_LEVELS: &[&str] = &["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogFileConfig {
    pub path: String,
    #[serde(default = "default_file_format")]
    pub format: String,
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    pub level: String,
    pub format: String,
    pub stdout: bool,
    pub file: Option<LogFileConfig>,
    pub access_log: bool,
    pub access_body: bool,
    pub access_body_max: usize,
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

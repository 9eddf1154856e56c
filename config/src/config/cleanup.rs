//! `cleanup`: how long finished runs, events and history are kept.
use super::Dur;
use crate::error::{ConfigError, invalid};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;

/// `cleanup`: when a finished run's files are due for NiFi's cleanup, and how long the ledger
/// keeps its events and the run itself.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CleanupConfig {
    /// A SUCCEEDED run's files are due for cleanup this long after it ended. Per job.
    pub success_retention: Dur,
    /// A FAILED, TIMED_OUT or CANCELLED run's files are due for cleanup this long after it
    /// ended. Per job.
    pub failed_retention: Dur,
    /// The most runs one cleanup candidates answer (and the monitor's `cleanupDue`) lists.
    #[schemars(range(min = 1))]
    pub max_batch: u32,
    /// Events older than this are deleted by the sweeper. Per job.
    pub event_retention: Dur,
    /// Cleaned runs that ended longer ago than this are deleted with all their rows; `null`
    /// turns it off. At least the longest cleanup retention of any job.
    pub history_retention: Option<Dur>,
    /// Runs history retention deletes per sweeper tick at most.
    #[schemars(range(min = 1))]
    pub history_batch: u32,
    /// `none`, or `{dir: PATH}`: one JSON line per deleted run in a file per day under PATH,
    /// fsynced before the delete commits.
    pub history_archive: HistoryArchiveConfig,
}

impl Default for CleanupConfig {
    fn default() -> Self {
        CleanupConfig {
            success_retention: Dur::secs(3 * 86400),
            failed_retention: Dur::secs(14 * 86400),
            max_batch: 200,
            event_retention: Dur::secs(90 * 86400),
            history_retention: Some(Dur::secs(180 * 86400)),
            history_batch: 100,
            history_archive: HistoryArchiveConfig::None,
        }
    }
}

/// `cleanup.history_archive`: `none` (or null), or `{dir: PATH}` for JSON lines per day in PATH.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum HistoryArchiveConfig {
    #[default]
    None,
    Dir(PathBuf),
}

impl Serialize for HistoryArchiveConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            HistoryArchiveConfig::None => s.serialize_str("none"),
            HistoryArchiveConfig::Dir(dir) => {
                use serde::ser::SerializeMap;
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("dir", dir)?;
                map.end()
            }
        }
    }
}

impl JsonSchema for HistoryArchiveConfig {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "HistoryArchive".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "oneOf": [
                {"type": "null"},
                {"const": "none"},
                {
                    "type": "object",
                    "properties": {"dir": {"type": "string", "minLength": 1}},
                    "required": ["dir"],
                    "additionalProperties": false
                }
            ]
        })
    }
}

impl<'de> Deserialize<'de> for HistoryArchiveConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTED: &str = "expected `none` or `{dir: PATH}`";
        match Value::deserialize(d)? {
            Value::Null => Ok(HistoryArchiveConfig::None),
            Value::String(s) if s == "none" => Ok(HistoryArchiveConfig::None),
            Value::Object(map) => {
                if let Some(other) = map.keys().find(|k| k.as_str() != "dir") {
                    return Err(serde::de::Error::custom(format!(
                        "unknown key {other:?}: {EXPECTED}"
                    )));
                }
                match map.get("dir") {
                    Some(Value::String(dir)) if !dir.trim().is_empty() => {
                        Ok(HistoryArchiveConfig::Dir(PathBuf::from(dir)))
                    }
                    _ => Err(serde::de::Error::custom(format!(
                        "dir must be a non-empty path: {EXPECTED}"
                    ))),
                }
            }
            other => Err(serde::de::Error::custom(format!("{other}: {EXPECTED}"))),
        }
    }
}

impl CleanupConfig {
    /// §10.4's checks of the `cleanup` section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let c = self;
        if let Some(history) = c.history_retention {
            for (key, d) in [
                ("cleanup.success_retention", c.success_retention),
                ("cleanup.failed_retention", c.failed_retention),
            ] {
                if history.0 < d.0 {
                    return Err(invalid(
                        "cleanup.history_retention",
                        format!(
                            "must be at least {key} ({}); null turns history retention off",
                            ledger::settings::iso_duration(d.0)
                        ),
                    ));
                }
            }
        }
        if !(1..=10_000).contains(&c.history_batch) {
            return Err(invalid(
                "cleanup.history_batch",
                "must be between 1 and 10000",
            ));
        }
        Ok(())
    }
}

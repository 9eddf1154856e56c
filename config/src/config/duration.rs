//! The one duration type of the configuration; its formats are the ledger's (`parse_duration`).
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

/// A duration: ISO-8601 (`PT90M`, `P3D`), a number of seconds, or `<n>s|m|h|d` (CONTRACT §10.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl Dur {
    pub fn secs(s: u64) -> Self {
        Dur(Duration::from_secs(s))
    }
}

pub use ledger::settings::parse_duration;

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let text = match &v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => {
                return Err(serde::de::Error::custom(
                    "expected a duration (PT90M, 90m, or seconds)",
                ));
            }
        };
        parse_duration(&text).map(Dur).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "invalid duration {text:?} (use PT90M, 90m, 2h, 3d or seconds)"
            ))
        })
    }
}

/// Written in the largest unit that divides it (`90m`, `6h`, `3d`), seconds otherwise: the form a
/// person would type, read back by `parse_duration`.
impl Serialize for Dur {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let d = self.0;
        if d.subsec_nanos() != 0 {
            return s.serialize_f64(d.as_secs_f64());
        }
        let secs = d.as_secs();
        let text = [(86_400, 'd'), (3_600, 'h'), (60, 'm')]
            .iter()
            .find(|(unit, _)| secs > 0 && secs.is_multiple_of(*unit))
            .map_or_else(
                || format!("{secs}s"),
                |(unit, c)| format!("{}{c}", secs / unit),
            );
        s.serialize_str(&text)
    }
}

impl JsonSchema for Dur {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": ["string", "number"],
            "pattern": DURATION_PATTERN,
            "minimum": 0,
            "description": "A duration: ISO-8601 (PT90M, P3D), a number of seconds, or <n>s|m|h|d (90m, 2h, 3d)."
        })
    }
}

/// The shapes `parse_duration` reads, for a schema that checks a value before the program does:
/// looser than the parser (the program names what is wrong), never stricter.
pub const DURATION_PATTERN: &str =
    r"^\s*(P[0-9.WD]*(T[0-9.HMS]*)?|\+?[0-9.]+([eE][+-]?[0-9]+)?[smhd]?)\s*$";

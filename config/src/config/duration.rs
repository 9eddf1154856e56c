//! The one duration type of the configuration; its formats are the ledger's (`parse_duration`).
use serde::Deserialize;
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

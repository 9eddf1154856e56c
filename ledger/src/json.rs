//! JSON shapes shared by every reader of the ledger's answers (CONTRACT §3.4).
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serializer;

/// RFC 3339 in UTC with `Z`; the fraction omitted when zero, else 3 or 6 digits.
pub fn format_ts(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

pub fn ts<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_ts(t))
}

pub fn ts_opt<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&format_ts(t)),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn fraction_digits_follow_the_value() {
        let t = Utc.with_ymd_and_hms(2026, 5, 1, 12, 34, 56).unwrap();
        assert_eq!(format_ts(&t), "2026-05-01T12:34:56Z");
        let ms = t + chrono::Duration::milliseconds(512);
        assert_eq!(format_ts(&ms), "2026-05-01T12:34:56.512Z");
        let us = t + chrono::Duration::microseconds(123456);
        assert_eq!(format_ts(&us), "2026-05-01T12:34:56.123456Z");
    }
}

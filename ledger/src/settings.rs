//! Durations in the configuration's formats, and the per-job settings of `load_job.settings`
//! (CONTRACT §10.3) that the ledger itself applies (cleanup retention, stale thresholds).
use serde_json::Value;
use std::time::Duration;

/// ISO-8601 (`PT90M`, `P3D`), a number of seconds, or `<n>s|m|h|d` (CONTRACT §10.1).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        return (secs >= 0.0 && secs.is_finite()).then(|| Duration::from_secs_f64(secs));
    }
    if let Some(rest) = s.strip_prefix('P') {
        let (date, time) = rest.split_once('T').unwrap_or((rest, ""));
        let mut total = 0f64;
        let mut any = false;
        for (part, units) in [
            (date, &[('W', 604800.0), ('D', 86400.0)][..]),
            (time, &[('H', 3600.0), ('M', 60.0), ('S', 1.0)][..]),
        ] {
            let mut num = String::new();
            for c in part.chars() {
                if c.is_ascii_digit() || c == '.' {
                    num.push(c);
                } else {
                    let unit = units.iter().find(|(u, _)| *u == c)?.1;
                    total += num.parse::<f64>().ok()? * unit;
                    num.clear();
                    any = true;
                }
            }
            if !num.is_empty() {
                return None;
            }
        }
        return any.then(|| Duration::from_secs_f64(total));
    }
    let (num, unit) = s.split_at(s.len().checked_sub(1)?);
    let mult = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => return None,
    };
    let n: f64 = num.parse().ok()?;
    (n >= 0.0 && n.is_finite()).then(|| Duration::from_secs_f64(n * mult))
}

/// ISO-8601 in the largest whole units (`PT6H`, `PT1H30M`, `P3D`), for messages (§7.2).
pub fn iso_duration(d: Duration) -> String {
    let mut secs = d.as_secs();
    if secs == 0 {
        return "PT0S".into();
    }
    let days = secs / 86400;
    secs %= 86400;
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut out = String::from("P");
    if days > 0 {
        out.push_str(&format!("{days}D"));
    }
    if h + m + s > 0 {
        out.push('T');
        for (v, u) in [(h, 'H'), (m, 'M'), (s, 'S')] {
            if v > 0 {
                out.push_str(&format!("{v}{u}"));
            }
        }
    }
    out
}

/// A duration value of a settings object: a string in the formats above, or a number of seconds.
fn duration_value(v: &Value) -> Option<Duration> {
    match v {
        Value::String(s) => parse_duration(s),
        Value::Number(n) => n
            .as_f64()
            .filter(|f| *f >= 0.0)
            .map(Duration::from_secs_f64),
        _ => None,
    }
}

/// The global values the ledger applies per job (§10.2), overridable by `load_job.settings`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    pub success_retention: Duration,
    pub failed_retention: Duration,
    pub stale: Duration,
    pub validation_stale: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            success_retention: Duration::from_secs(3 * 86400),
            failed_retention: Duration::from_secs(14 * 86400),
            stale: Duration::from_secs(90 * 60),
            validation_stale: Duration::from_secs(2 * 3600),
        }
    }
}

/// The effective thresholds of a job: its settings over the globals. An invalid settings object is
/// ignored as a whole (`Err` says why, for the `job_settings_invalid` log).
pub fn effective(global: &Thresholds, settings: &Value) -> Result<Thresholds, String> {
    let Some(obj) = settings.as_object() else {
        return Err("settings is not an object".into());
    };
    let mut t = *global;
    let get = |section: &str, key: &str| -> Result<Option<Duration>, String> {
        match obj.get(section).and_then(|s| s.get(key)) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => duration_value(v)
                .map(Some)
                .ok_or_else(|| format!("{section}.{key} is not a duration")),
        }
    };
    if let Some(d) = get("cleanup", "success_retention")? {
        t.success_retention = d;
    }
    if let Some(d) = get("cleanup", "failed_retention")? {
        t.failed_retention = d;
    }
    if let Some(d) = get("recovery", "stale")? {
        t.stale = d;
    }
    if let Some(d) = get("recovery", "validation_stale")? {
        t.validation_stale = d;
    }
    let extract_timeout =
        get("recovery", "extract_query_timeout")?.unwrap_or(Duration::from_secs(3600));
    if t.stale <= extract_timeout {
        return Err("recovery.stale must exceed recovery.extract_query_timeout".into());
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn durations_in_every_form() {
        assert_eq!(parse_duration("PT90M"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("P3D"), Some(Duration::from_secs(3 * 86400)));
        assert_eq!(parse_duration("PT1H30M"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("90m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_duration("45"), Some(Duration::from_secs(45)));
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(parse_duration("P"), None);
    }

    #[test]
    fn iso_in_largest_whole_units() {
        assert_eq!(iso_duration(Duration::from_secs(6 * 3600)), "PT6H");
        assert_eq!(iso_duration(Duration::from_secs(5400)), "PT1H30M");
        assert_eq!(iso_duration(Duration::from_secs(3 * 86400)), "P3D");
        assert_eq!(iso_duration(Duration::from_secs(86400 + 60)), "P1DT1M");
    }

    #[test]
    fn job_settings_override_and_invalid_ones_are_ignored_whole() {
        let g = Thresholds::default();
        let t = effective(
            &g,
            &json!({"cleanup": {"failed_retention": "P30D"}, "recovery": {"stale": "PT2H"}}),
        )
        .unwrap();
        assert_eq!(t.failed_retention, Duration::from_secs(30 * 86400));
        assert_eq!(t.stale, Duration::from_secs(7200));
        assert_eq!(t.success_retention, g.success_retention);
        assert!(effective(&g, &json!({"recovery": {"stale": "30m"}})).is_err());
        assert!(effective(&g, &json!({"cleanup": {"failed_retention": true}})).is_err());
        assert!(effective(&g, &json!([])).is_err());
    }
}

//! Durations in the configuration's formats, and the per-job settings of `load_job.settings`
//! (CONTRACT §10.3) that the ledger itself applies (cleanup retention, stale thresholds).
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// The longest duration any setting may have: 100 years. Longer values are refused as invalid
/// (a LoadJob reports them; the configuration refuses to start), never accepted and then
/// overflowing — `Duration::from_secs_f64` panics past u64 seconds, and PostgreSQL's interval
/// arithmetic fails on `now() + P3000000D`.
pub const MAX_DURATION_SECS: f64 = 100.0 * 365.25 * 86400.0;

/// Seconds within [0, MAX_DURATION_SECS] as a Duration; None otherwise (NaN and ∞ included).
pub fn bounded_secs(secs: f64) -> Option<Duration> {
    (secs.is_finite() && (0.0..=MAX_DURATION_SECS).contains(&secs))
        .then(|| Duration::from_secs_f64(secs))
}

/// ISO-8601 (`PT90M`, `P3D`), a number of seconds, or `<n>s|m|h|d` (CONTRACT §10.1), at most
/// [`MAX_DURATION_SECS`].
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        return bounded_secs(secs);
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
        return if any { bounded_secs(total) } else { None };
    }
    // The unit is the last character, which may be more than one byte (`5µ`: no unit).
    let (num, unit) = s.split_at(s.len() - s.chars().next_back()?.len_utf8());
    let mult = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => return None,
    };
    let n: f64 = num.parse().ok()?;
    bounded_secs(n * mult)
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
        Value::Number(n) => n.as_f64().and_then(bounded_secs),
        _ => None,
    }
}

// `recovery.mode`: what the sweeper does with a RUNNING partition whose heartbeat is older than
// `recovery.stale`. The one definition for the configuration file, the job overrides (`parse`)
// and the LoadJob CRD. A plain comment, not a doc comment: the CRDs' schema must stay the one
// release 0.1.0 stored (crds/tests/generated.rs), which has no description here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum RecoveryMode {
    #[serde(rename = "FAIL")]
    Fail,
    #[serde(rename = "REISSUE")]
    Reissue,
}

impl RecoveryMode {
    /// The configuration's spelling, `FAIL` or `REISSUE`.
    pub fn parse(s: &str) -> Option<RecoveryMode> {
        match s {
            "FAIL" => Some(RecoveryMode::Fail),
            "REISSUE" => Some(RecoveryMode::Reissue),
            _ => None,
        }
    }
}

/// Every value a job may override (the keys marked "job" in CONTRACT §10.2), effective for one
/// job: its `load_job.settings` over the global configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Thresholds {
    pub success_retention: Duration,
    pub failed_retention: Duration,
    pub event_retention: Duration,
    pub stale: Duration,
    pub extract_query_timeout: Duration,
    pub run_timeout: Duration,
    pub validation_stale: Duration,
    pub publish_stale: Duration,
    pub recovery_mode: RecoveryMode,
    pub recovery_max_attempts: i32,
    pub dispatch_max_attempts: i32,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub ack_timeout: Duration,
    pub receiver_url: Option<String>,
    pub timeout_seconds: f64,
    /// `nifi.receiver_path_allowed` [v1-ext]: global only, never a job setting. When true a
    /// receiver URL may carry a path (a proxy in front of NiFi strips it), see
    /// [`receiver_url_problem`].
    pub receiver_path_allowed: bool,
    /// `cleanup.history_retention` (§7.2 rule 7; None = off). Global only, never a job key: it is
    /// here so that a job's effective cleanup retentions are held below it (§10.2).
    pub history_retention: Option<Duration>,
}

impl Default for Thresholds {
    fn default() -> Self {
        let h = |n: u64| Duration::from_secs(n * 3600);
        Thresholds {
            success_retention: h(72),
            failed_retention: h(14 * 24),
            event_retention: h(90 * 24),
            stale: Duration::from_secs(90 * 60),
            extract_query_timeout: h(1),
            run_timeout: h(6),
            validation_stale: h(2),
            publish_stale: h(2),
            recovery_mode: RecoveryMode::Fail,
            recovery_max_attempts: 3,
            dispatch_max_attempts: 20,
            backoff_min: Duration::from_secs(5),
            backoff_max: Duration::from_secs(300),
            ack_timeout: Duration::from_secs(600),
            receiver_url: None,
            timeout_seconds: 10.0,
            receiver_path_allowed: false,
            history_retention: Some(h(180 * 24)),
        }
    }
}

/// `cleanup.history_archive` (§7.2 rule 7 [v1-ext]): where history retention writes a run before
/// it deletes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum HistoryArchive {
    /// Nothing is kept (the default).
    #[default]
    None,
    /// One JSON line per run, appended to `<dir>/load-history-<YYYY-MM-DD>.jsonl` (the UTC day of
    /// the run's end time) and fsynced before the delete commits.
    JsonLines { dir: PathBuf },
}

/// Rule 7's global settings besides the retention (which lives in [`Thresholds`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistorySettings {
    /// `cleanup.history_batch`: runs deleted per sweeper tick at most.
    pub batch: u32,
    pub archive: HistoryArchive,
}

impl Default for HistorySettings {
    fn default() -> Self {
        HistorySettings {
            batch: 100,
            archive: HistoryArchive::None,
        }
    }
}

/// What is wrong with a receiver URL (`nifi.receiver_url`, global or a job's), as the rest of a
/// sentence that starts with the key; None when it is fine. It must be `http(s)://host[:port]`,
/// optionally ending in `/`, without query or fragment (the dispatcher appends
/// `/validate/<jobKey>` and `/reissue/<jobKey>`, CONTRACT §6.4). A path is refused unless
/// `path_allowed` (`nifi.receiver_path_allowed`): NiFi's PG-05 is a HandleHttpRequest whose
/// Allowed Paths are `/(validate|reissue)/<jobKey>`, so `https://nifi:9443/lca` makes it answer
/// 404 to `/lca/validate/…`, and a 404 makes the dispatch DEAD at once (§6.5).
pub fn receiver_url_problem(url: &str, path_allowed: bool) -> Option<String> {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return Some(format!(
            "{url:?} is not an http(s) URL: give NiFi PG-05's scheme, host and port, e.g. https://nifi.example:9443"
        ));
    };
    let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(split);
    if authority.is_empty() {
        return Some(format!(
            "{url:?} has no host: give NiFi PG-05's scheme, host and port, e.g. https://nifi.example:9443"
        ));
    }
    let origin = &url[..url.len() - tail.len()];
    if tail.contains(['?', '#']) {
        return Some(format!(
            "{url:?} carries a query or fragment: the dispatcher appends /validate/<jobKey> and \
             /reissue/<jobKey> to it; give scheme, host and port only, e.g. {origin}"
        ));
    }
    if tail.is_empty() || tail == "/" || path_allowed {
        return None;
    }
    let path = tail.trim_end_matches('/');
    Some(format!(
        "{url:?} has the path {path}: NiFi's PG-05 listens on /validate/<jobKey> and \
         /reissue/<jobKey> only and answers 404 to {path}/validate/<jobKey>, which makes every \
         dispatch DEAD at once. Give scheme, host and port only ({origin}), or, when a proxy in \
         front of NiFi strips {path}, set nifi.receiver_path_allowed: true"
    ))
}

const JOB_KEYS: &[(&str, &[&str])] = &[
    ("nifi", &["receiver_url", "timeout_seconds"]),
    (
        "recovery",
        &[
            "run_timeout",
            "extract_query_timeout",
            "stale",
            "mode",
            "max_attempts",
            "validation_stale",
            "publish_stale",
        ],
    ),
    (
        "dispatch",
        &["max_attempts", "backoff_min", "backoff_max", "ack_timeout"],
    ),
    (
        "cleanup",
        &["success_retention", "failed_retention", "event_retention"],
    ),
];

/// The effective values of a job: `settings` over `global`. Anything invalid — an unknown key, a
/// bad value, or an invalid combination (§10.4) — rejects the object as a whole (`Err` says why,
/// for the LoadJob's condition or the `job_settings_invalid` log). `lease` is the global
/// `dispatch.lease`, which a job's `nifi.timeout_seconds` must stay below.
pub fn effective(
    global: &Thresholds,
    settings: &Value,
    lease: Duration,
) -> Result<Thresholds, String> {
    let Some(obj) = settings.as_object() else {
        return Err("settings must be an object".into());
    };
    let mut t = global.clone();
    for (section, values) in obj {
        let keys = JOB_KEYS
            .iter()
            .find(|(s, _)| s == section)
            .map(|(_, k)| *k)
            .ok_or_else(|| format!("unknown section {section}"))?;
        let Some(values) = values.as_object() else {
            return Err(format!("{section} must be an object"));
        };
        for (key, v) in values {
            if !keys.contains(&key.as_str()) {
                return Err(format!("{section}.{key} is not a job setting"));
            }
            let name = format!("{section}.{key}");
            let dur = || duration_value(v).ok_or_else(|| format!("{name} is not a duration"));
            let count = || {
                v.as_i64()
                    .filter(|n| *n >= 1 && *n <= i32::MAX as i64)
                    .map(|n| n as i32)
                    .ok_or_else(|| format!("{name} must be an integer >= 1"))
            };
            match (section.as_str(), key.as_str()) {
                ("nifi", "receiver_url") => {
                    let url = v
                        .as_str()
                        .ok_or_else(|| format!("{name} must be an http(s) URL"))?;
                    if let Some(problem) = receiver_url_problem(url, global.receiver_path_allowed) {
                        return Err(format!("{name} {problem}"));
                    }
                    t.receiver_url = Some(url.to_string());
                }
                ("nifi", "timeout_seconds") => {
                    t.timeout_seconds = v
                        .as_f64()
                        .filter(|f| *f > 0.0)
                        .ok_or_else(|| format!("{name} must be a positive number"))?
                }
                ("recovery", "run_timeout") => t.run_timeout = dur()?,
                ("recovery", "extract_query_timeout") => t.extract_query_timeout = dur()?,
                ("recovery", "stale") => t.stale = dur()?,
                ("recovery", "validation_stale") => t.validation_stale = dur()?,
                ("recovery", "publish_stale") => t.publish_stale = dur()?,
                ("recovery", "mode") => {
                    t.recovery_mode = v
                        .as_str()
                        .and_then(RecoveryMode::parse)
                        .ok_or_else(|| format!("{name} must be FAIL or REISSUE"))?
                }
                ("recovery", "max_attempts") => t.recovery_max_attempts = count()?,
                ("dispatch", "max_attempts") => t.dispatch_max_attempts = count()?,
                ("dispatch", "backoff_min") => t.backoff_min = dur()?,
                ("dispatch", "backoff_max") => t.backoff_max = dur()?,
                ("dispatch", "ack_timeout") => t.ack_timeout = dur()?,
                ("cleanup", "success_retention") => t.success_retention = dur()?,
                ("cleanup", "failed_retention") => t.failed_retention = dur()?,
                ("cleanup", "event_retention") => t.event_retention = dur()?,
                _ => unreachable!("JOB_KEYS lists exactly the keys matched above"),
            }
        }
    }
    if t.stale <= t.extract_query_timeout {
        return Err("recovery.stale must exceed recovery.extract_query_timeout".into());
    }
    if t.timeout_seconds >= lease.as_secs_f64() {
        return Err("nifi.timeout_seconds must stay below dispatch.lease".into());
    }
    if t.backoff_min > t.backoff_max {
        return Err("dispatch.backoff_min must not exceed dispatch.backoff_max".into());
    }
    if let Some(history) = t.history_retention {
        for (key, d) in [
            ("cleanup.success_retention", t.success_retention),
            ("cleanup.failed_retention", t.failed_retention),
        ] {
            if d > history {
                return Err(format!(
                    "{key} must not exceed cleanup.history_retention {}",
                    iso_duration(history)
                ));
            }
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {

    #[test]
    fn huge_durations_are_invalid_not_a_panic() {
        for huge in [
            "99999999999999999999",
            "P3000000D",
            "PT99999999999999999999S",
            "1e300s",
            "101000000000",
            // A unit of more than one byte (found by config/tests/environment.rs's property).
            "𑦪",
            "5µ",
            "10秒",
        ] {
            assert_eq!(parse_duration(huge), None, "{huge}");
        }
        assert_eq!(duration_value(&serde_json::json!("3日")), None);
        assert_eq!(
            parse_duration("P36500D"),
            Some(Duration::from_secs(36500 * 86400))
        );
        assert_eq!(duration_value(&serde_json::json!(1e30)), None);
        assert_eq!(
            duration_value(&serde_json::json!(90)),
            Some(Duration::from_secs(90))
        );
    }

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
    fn job_settings_override_and_invalid_ones_are_rejected_whole() {
        let g = Thresholds::default();
        let lease = Duration::from_secs(60);
        let t = effective(
            &g,
            &json!({"cleanup": {"failed_retention": "P30D"}, "recovery": {"stale": "PT2H", "mode": "REISSUE", "max_attempts": 5},
                    "nifi": {"receiver_url": "https://nifi-b:9443"}, "dispatch": {"max_attempts": 30}}),
            lease,
        )
        .unwrap();
        assert_eq!(t.failed_retention, Duration::from_secs(30 * 86400));
        assert_eq!(t.stale, Duration::from_secs(7200));
        assert_eq!(
            (
                t.recovery_mode,
                t.recovery_max_attempts,
                t.dispatch_max_attempts
            ),
            (RecoveryMode::Reissue, 5, 30)
        );
        assert_eq!(t.receiver_url.as_deref(), Some("https://nifi-b:9443"));
        assert_eq!(t.success_retention, g.success_retention);
        let off = Thresholds {
            history_retention: None,
            ..g.clone()
        };
        assert!(
            effective(
                &off,
                &json!({"cleanup": {"failed_retention": "P400D"}}),
                lease
            )
            .is_ok()
        );
        for bad in [
            json!({"recovery": {"stale": "30m"}}),
            json!({"cleanup": {"failed_retention": true}}),
            json!({"recovery": {"mode": "RETRY"}}),
            json!({"server": {"port": 1}}),
            json!({"recovery": {"sweeper_interval": "1m"}}),
            json!({"nifi": {"timeout_seconds": 60}}),
            json!({"nifi": {"receiver_url": "nifi-b:9443"}}),
            json!({"nifi": {"receiver_path_allowed": true}}),
            json!({"cleanup": {"failed_retention": "P181D"}}),
            json!({"cleanup": {"history_retention": "P365D"}}),
            json!([]),
        ] {
            assert!(effective(&g, &bad, lease).is_err(), "{bad}");
        }
    }

    /// A job's receiver URL with a path is refused like any invalid setting (PG-05 would answer
    /// 404 and every dispatch of the job would go DEAD), unless the global
    /// `nifi.receiver_path_allowed` says a proxy strips it.
    #[test]
    fn a_job_receiver_url_with_a_path_is_refused_unless_a_proxy_strips_it() {
        let lease = Duration::from_secs(60);
        let g = Thresholds::default();
        for ok in [
            "https://nifi-b:9443",
            "https://nifi-b:9443/",
            "http://10.0.0.7",
        ] {
            let t = effective(&g, &json!({"nifi": {"receiver_url": ok}}), lease).unwrap();
            assert_eq!(t.receiver_url.as_deref(), Some(ok));
        }
        let with_path = json!({"nifi": {"receiver_url": "https://nifi-b:9443/lca"}});
        let err = effective(&g, &with_path, lease).unwrap_err();
        assert!(
            err.starts_with("nifi.receiver_url")
                && err.contains("/lca")
                && err.contains("https://nifi-b:9443)")
                && err.contains("nifi.receiver_path_allowed"),
            "{err}"
        );
        for bad in [
            "https://nifi-b:9443/lca/",
            "https://nifi-b:9443?x=1",
            "https://nifi-b:9443/#a",
            "https:///lca",
        ] {
            assert!(
                effective(&g, &json!({"nifi": {"receiver_url": bad}}), lease).is_err(),
                "{bad}"
            );
        }
        let proxied = Thresholds {
            receiver_path_allowed: true,
            ..Thresholds::default()
        };
        let t = effective(&proxied, &with_path, lease).unwrap();
        assert_eq!(t.receiver_url.as_deref(), Some("https://nifi-b:9443/lca"));
        assert!(
            effective(
                &proxied,
                &json!({"nifi": {"receiver_url": "https://nifi-b:9443?x=1"}}),
                lease
            )
            .is_err(),
            "a query is refused even behind a proxy"
        );
    }
}

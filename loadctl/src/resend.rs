//! `loadctl resend --all-dead`: after a NiFi outage longer than the dispatcher's retries, every
//! dispatch is DEAD and one resend per dispatch is not a procedure. This takes the DEAD dispatches
//! the monitor summary alerts on (DISPATCH_DEAD: those of runs still waiting for them), narrowed
//! by job and by when they went DEAD, and sends each again — or, with a dry run, only lists them.
use crate::client::{Api, Failure};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// Which DEAD dispatches to send again.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Only this job's.
    pub job: Option<String>,
    /// Only those that went DEAD at or after this instant (the alert's `at`).
    pub since: Option<DateTime<Utc>>,
    /// List, send nothing.
    pub dry_run: bool,
}

/// `--since`: an RFC 3339 instant (2026-12-05T02:00:00Z) or a duration back from now (90m, 6h, 2d).
pub fn parse_since(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: i64 = number
        .parse()
        .map_err(|_| format!("--since {text:?}: an RFC 3339 time (2026-12-05T02:00:00Z) or a duration back from now (90m, 6h, 2d)"))?;
    let back = match unit {
        "m" => chrono::Duration::minutes(n),
        "h" => chrono::Duration::hours(n),
        "d" => chrono::Duration::days(n),
        _ => {
            return Err(format!(
                "--since {text:?}: the unit must be m, h or d (90m, 6h, 2d), or give an RFC 3339 time"
            ));
        }
    };
    Ok(now - back)
}

/// The summary's alert limit: the most DEAD dispatches one page of alerts shows.
const ALERT_PAGE: u32 = 500;
/// Pages of alerts read at most (each page's dispatches resent before the next is read).
const MAX_PAGES: usize = 100;

fn wanted(alert: &Value, sel: &Selection) -> bool {
    alert["kind"] == "DISPATCH_DEAD"
        && sel.job.as_deref().is_none_or(|j| alert["jobKey"] == j)
        && sel.since.is_none_or(|since| {
            alert["at"]
                .as_str()
                .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
                .is_some_and(|at| at >= since)
        })
}

/// Sends the selected DEAD dispatches again, page by page of the summary's alerts (a resent
/// dispatch is PENDING and leaves the alerts, so the next page shows the ones after it). Each
/// dispatch is tried once; one refused (409: already resent or acknowledged meanwhile) or failed
/// does not stop the others. The result lists every dispatch with what happened to it, and counts.
pub async fn resend_dead(api: &Api, sel: &Selection) -> Result<Value, Failure> {
    let mut seen = BTreeSet::new();
    let mut rows = vec![];
    let (mut resent, mut refused, mut failed) = (0u64, 0u64, 0u64);
    let mut truncated = false;
    for _ in 0..MAX_PAGES {
        let summary = api
            .get(
                "/v1/monitor/summary",
                &[("alertLimit", ALERT_PAGE.to_string())],
            )
            .await?;
        let alerts = summary["alerts"].as_array().cloned().unwrap_or_default();
        let page_full = alerts.len() as u32 >= ALERT_PAGE;
        let new: Vec<Value> = alerts
            .into_iter()
            .filter(|a| wanted(a, sel))
            .filter(|a| seen.insert(a["dispatchId"].as_str().unwrap_or_default().to_string()))
            .collect();
        if new.is_empty() {
            break;
        }
        for alert in new {
            let (run, dispatch) = (
                alert["runId"].as_str().unwrap_or_default(),
                alert["dispatchId"].as_str().unwrap_or_default(),
            );
            let result = if sel.dry_run {
                "would resend".to_string()
            } else {
                match api
                    .act(
                        &format!("/v1/runs/{run}/dispatches/{dispatch}/resend"),
                        None,
                    )
                    .await
                {
                    Ok(_) => {
                        resent += 1;
                        "resent".to_string()
                    }
                    Err(Failure::Refused { code, message, .. }) => {
                        refused += 1;
                        format!("refused: {code}: {message}")
                    }
                    Err(e @ Failure::Denied { .. }) => return Err(e),
                    Err(e) => {
                        failed += 1;
                        format!("failed: {e}")
                    }
                }
            };
            rows.push(
                json!({"runId": run, "dispatchId": dispatch, "jobKey": alert["jobKey"],
                "deadAt": alert["at"], "message": alert["message"], "result": result}),
            );
        }
        if sel.dry_run {
            // Nothing changed: the next page would be this one again.
            truncated = page_full;
            break;
        }
    }
    Ok(
        json!({"dryRun": sel.dry_run, "matched": rows.len(), "resent": resent, "refused": refused,
        "failed": failed, "moreThanShown": truncated, "dispatches": rows}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_time_or_a_duration_back() {
        let now = DateTime::parse_from_rfc3339("2026-12-05T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            parse_since("2026-12-05T02:00:00Z", now)
                .unwrap()
                .to_rfc3339(),
            "2026-12-05T02:00:00+00:00"
        );
        assert_eq!(
            parse_since("90m", now).unwrap().to_rfc3339(),
            "2026-12-05T10:30:00+00:00"
        );
        assert_eq!(
            parse_since("2d", now).unwrap().to_rfc3339(),
            "2026-12-03T12:00:00+00:00"
        );
        for bad in ["", "h", "6w", "yesterday", "-3h"] {
            assert!(parse_since(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_dead_dispatches_of_the_job_since_the_time_are_selected() {
        let alert =
            |kind: &str, job: &str, at: &str| json!({"kind": kind, "jobKey": job, "at": at});
        let sel = Selection {
            job: Some("A".into()),
            since: Some(parse_since("2026-12-05T02:00:00Z", Utc::now()).unwrap()),
            dry_run: false,
        };
        assert!(wanted(
            &alert("DISPATCH_DEAD", "A", "2026-12-05T02:00:00Z"),
            &sel
        ));
        assert!(!wanted(
            &alert("DISPATCH_DEAD", "A", "2026-12-05T01:59:59Z"),
            &sel
        ));
        assert!(!wanted(
            &alert("DISPATCH_DEAD", "B", "2026-12-05T03:00:00Z"),
            &sel
        ));
        assert!(!wanted(
            &alert("RUN_STALE", "A", "2026-12-05T03:00:00Z"),
            &sel
        ));
        assert!(wanted(
            &alert("DISPATCH_DEAD", "B", "2020-01-01T00:00:00Z"),
            &Selection::default()
        ));
    }
}

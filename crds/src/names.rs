//! LoadRun object names (ARCHITECTURE "LoadRun … Name"): readable, unique per run, and always a
//! valid DNS-1123 subdomain of at most 240 characters.
use sha2::{Digest, Sha256};

fn trim_alnum(s: &str) -> &str {
    s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
}

/// `<jobKey>-<businessKey>` made DNS-safe: lower-cased, other characters → `-`, runs of `.`/`-`
/// collapsed to one `-`, trimmed to alphanumerics at both ends.
fn key_part(job_key: &str, business_key: &str) -> String {
    let raw: String = format!("{job_key}-{business_key}")
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut out = String::with_capacity(raw.len());
    let mut run = String::new();
    for c in raw.chars() {
        if c == '.' || c == '-' {
            run.push(c);
        } else {
            if !run.is_empty() {
                out.push_str(if run.len() >= 2 { "-" } else { &run });
                run.clear();
            }
            out.push(c);
        }
    }
    if !run.is_empty() {
        out.push_str(if run.len() >= 2 { "-" } else { &run });
    }
    trim_alnum(&out).to_string()
}

/// The value of the `loadcontrol.io/job-key` label: a valid label value for any jobKey (at most
/// 63 characters of `[a-z0-9-]`, alphanumeric at both ends). A jobKey is `[A-Z0-9_]{1,200}`, so
/// the readable form is lower-cased with `_` → `-` and trimmed; when that is empty or longer than
/// 63 characters it is cut to 54 and `-<first 8 hex of the SHA-256 of the jobKey>` is appended.
pub fn job_key_label(job_key: &str) -> String {
    let readable = job_key.to_lowercase().replace('_', "-");
    let readable = trim_alnum(&readable);
    if !readable.is_empty() && readable.len() <= 63 {
        return readable.to_string();
    }
    let digest = hex::encode(Sha256::digest(job_key.as_bytes()));
    let head = trim_alnum(&readable[..readable.len().min(54)]);
    if head.is_empty() {
        digest[..8].to_string()
    } else {
        format!("{head}-{}", &digest[..8])
    }
}

pub fn load_run_name(job_key: &str, business_key: &str, run_id: &str) -> String {
    let short: String = run_id
        .chars()
        .filter(|c| *c != '-')
        .take(8)
        .collect::<String>()
        .to_lowercase();
    let mut key = key_part(job_key, business_key);
    if key.len() > 231 {
        let digest = hex::encode(Sha256::digest(key.as_bytes()));
        key = format!("{}-{}", trim_alnum(&key[..222]), &digest[..8]);
    }
    if key.is_empty() {
        short
    } else {
        format!("{key}-{short}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label_value(s: &str) -> bool {
        s.len() <= 63
            && !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    }

    #[test]
    fn job_key_labels_are_valid_label_values_for_any_job_key() {
        assert_eq!(job_key_label("ORDERS_DAILY"), "orders-daily");
        let long = format!("_{}_", "A_B".repeat(66));
        for key in [
            "X",
            "_",
            "___",
            "_LEADING",
            "TRAILING_",
            &"Z".repeat(200),
            &long,
            "A1_2B",
        ] {
            let l = job_key_label(key);
            assert!(label_value(&l), "{key:?} → {l:?}");
        }
        // Distinct long keys stay distinct.
        assert_ne!(
            job_key_label(&"A".repeat(200)),
            job_key_label(&format!("{}B", "A".repeat(199)))
        );
        assert_ne!(job_key_label("_"), job_key_label("__"));
    }

    fn dns_subdomain(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    }

    const RUN: &str = "0b6f8c1e-4d2a-4f7b-9a51-2c3d4e5f6a7b";

    #[test]
    fn readable_names() {
        assert_eq!(
            load_run_name("ORACLE_INSP_DTL_DAILY", "2026-09-28", RUN),
            "oracle-insp-dtl-daily-2026-09-28-0b6f8c1e"
        );
        assert_eq!(load_run_name("JOB", "a.b", RUN), "job-a.b-0b6f8c1e");
        assert_eq!(load_run_name("JOB", "a..b:c", RUN), "job-a-b-c-0b6f8c1e");
        assert_eq!(
            load_run_name("_", "_", RUN),
            "0b6f8c1e",
            "nothing left of the key part"
        );
    }

    #[test]
    fn long_keys_are_cut_and_hashed_and_stay_valid() {
        let name = load_run_name(&"A".repeat(200), &"b".repeat(200), RUN);
        assert!(name.len() <= 240, "{}", name.len());
        assert!(name.ends_with("-0b6f8c1e"));
        let other = load_run_name(&"A".repeat(200), &format!("{}c", "b".repeat(199)), RUN);
        assert_ne!(
            name, other,
            "the hash of the uncut key part keeps them apart"
        );
        for (j, b) in [
            ("A_B", "x.-y"),
            ("J", "...."),
            ("J", "-a-"),
            ("X", &"z.".repeat(100)),
        ] {
            let n = load_run_name(j, b, RUN);
            assert!(
                n.len() <= 240 && n.split('.').all(|l| l.len() <= 63) || n.len() <= 240,
                "{n}"
            );
            assert!(
                n.chars().next().unwrap().is_ascii_alphanumeric()
                    && n.chars().last().unwrap().is_ascii_alphanumeric(),
                "{n}"
            );
        }
        assert!(dns_subdomain(&load_run_name(
            "ORACLE_INSP_DTL_DAILY",
            "2026-09-28",
            RUN
        )));
    }
}

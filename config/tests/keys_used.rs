//! Every configuration key the binaries parse is used by them (issue 20 item 5): a key that is
//! accepted and then ignored silently breaks what the configuration promises (a site that swapped
//! the first API for this one and collected logs from `logging.file` saw nothing). For each field
//! of the configuration structs this test looks for a read of it (`.field`) in the sources of the
//! binaries and the crates they use; it fails for any field no code reads, unless the field is
//! listed below with the reason.
use std::path::{Path, PathBuf};

/// Keys the contract itself documents as accepted and unused (CONTRACT §10.2).
const IGNORED_BY_CONTRACT: &[&str] = &["MonitorConfig.log_dir", "Config.clients"];

/// Keys parsed and not used yet (none today). Adding one is a decision to document in the README.
const NOT_YET_USED: &[&str] = &[];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// (struct, field) of every `pub struct …Config` (and `Config`) in config.rs.
fn fields(config_rs: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    let mut current: Option<String> = None;
    for line in config_rs.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("pub struct ") {
            let name = rest.split([' ', '{', '(']).next().unwrap_or("").to_string();
            current = (name.ends_with("Config") && t.ends_with('{')).then_some(name);
            continue;
        }
        if t == "}" {
            current = None;
            continue;
        }
        if let (Some(s), Some(rest)) = (&current, t.strip_prefix("pub "))
            && let Some((field, _)) = rest.split_once(':')
            && field
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
        {
            out.push((s.clone(), field.to_string()));
        }
    }
    out
}

fn reads(text: &str, field: &str) -> bool {
    let needle = format!(".{field}");
    text.match_indices(&needle).any(|(i, _)| {
        !text[i + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[test]
fn every_parsed_configuration_key_is_used() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The configuration's sections, one file each (config/src/config/).
    let section_files: Vec<PathBuf> = {
        let mut v = vec![];
        sources(&root.join("config/src/config"), &mut v);
        v
    };
    let config_rs: String = section_files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let all = fields(&config_rs);
    assert!(
        all.len() > 60,
        "the struct parser found the fields: {}",
        all.len()
    );
    let mut files = vec![];
    for dir in [
        "api-server/src",
        "operator/src",
        "serving-tls/src",
        "ledger/src",
        "loadctl/src",
        "config/src",
    ] {
        sources(&root.join(dir), &mut files);
    }
    // The sections read their own fields in validation and defaults: that is parsing, not using —
    // except in the functions that hand the values to the binaries (ledger_config, thresholds…),
    // which are in config/mod.rs, so the sections count only below its `impl Config` accessors.
    let used_here = config_rs
        .split_once("impl Config {\n    /// Global values")
        .map(|(_, rest)| rest.to_string())
        .unwrap_or_default();
    let text: String = files
        .iter()
        .filter(|p| !section_files.contains(p))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .chain(std::iter::once(used_here))
        .collect::<Vec<_>>()
        .join("\n");
    let mut unused = vec![];
    for (s, f) in &all {
        let key = format!("{s}.{f}");
        let listed =
            IGNORED_BY_CONTRACT.contains(&key.as_str()) || NOT_YET_USED.contains(&key.as_str());
        match (reads(&text, f), listed) {
            (false, false) => unused.push(format!("{key} is parsed and never read")),
            (true, true) if NOT_YET_USED.contains(&key.as_str()) => {
                unused.push(format!("{key} is read now: remove it from NOT_YET_USED"))
            }
            _ => {}
        }
    }
    assert!(unused.is_empty(), "{unused:#?}");
}

//! The configuration reference is generated from the types that read the file, and says
//! something about every key.
use lcconfig::config::{Config, LOG_LEVELS};
use lcconfig::reference;
use std::path::Path;

fn committed(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path))
        .unwrap_or_default()
}

#[test]
fn the_committed_reference_is_what_the_types_generate() {
    for (path, text) in [
        ("docs/configuration.md", reference::markdown()),
        ("config/config.schema.json", reference::schema_json()),
    ] {
        assert!(
            committed(path) == text,
            "{path} is stale: run `cargo run -p load-control-config --bin config-reference`"
        );
    }
}

#[test]
fn every_key_has_a_description_and_an_environment_variable() {
    let keys = reference::keys();
    assert!(keys.len() > 60, "{} keys", keys.len());
    let undescribed: Vec<&str> = keys
        .iter()
        .filter(|k| k.description.trim().is_empty())
        .map(|k| k.path.as_str())
        .collect();
    assert!(
        undescribed.is_empty(),
        "keys without a description: {undescribed:?}"
    );
    for k in keys.iter().filter(|k| !k.path.contains("[]")) {
        assert!(
            k.env.as_deref().is_some_and(|e| e.starts_with("LCA_")),
            "{k:?}"
        );
    }
}

/// Each environment variable the reference names is one the loader takes for that key: set to
/// a value the default does not have, it reaches the key.
#[test]
fn the_environment_variables_it_names_are_read() {
    let with = |name: &str, value: &str| {
        Config::from_sources("", &[(name.to_string(), value.to_string())])
            .unwrap_or_else(|e| panic!("{name}={value}: {e}"))
    };
    let keys = reference::keys();
    let env = |path: &str| {
        keys.iter()
            .find(|k| k.path == path)
            .and_then(|k| k.env.clone())
            .unwrap_or_else(|| panic!("{path} is not in the reference"))
    };
    assert_eq!(with(&env("server.port"), "9999").server.port, 9999);
    assert_eq!(
        with(&env("recovery.stale"), "2h")
            .recovery
            .stale
            .0
            .as_secs(),
        7200
    );
    assert_eq!(
        with(&env("logging.file.path"), "/x/{service}.log")
            .logging
            .file
            .map(|f| f.path),
        Some("/x/{service}.log".into())
    );
    assert_eq!(
        with(
            &env("auth.token_digests.nifi"),
            &format!("[{}]", "a".repeat(64))
        )
        .auth
        .token_digests
        .nifi,
        vec!["a".repeat(64)]
    );
}

/// The defaults the reference prints are the ones a configuration without the key gets.
#[test]
fn the_defaults_it_prints_are_the_defaults() {
    let keys = reference::keys();
    let default = |path: &str| {
        keys.iter()
            .find(|k| k.path == path)
            .unwrap()
            .default
            .clone()
    };
    let c = Config::default();
    assert_eq!(default("server.port"), c.server.port.to_string());
    assert_eq!(default("dispatch.ack_timeout"), "10m");
    assert_eq!(c.dispatch.ack_timeout.0.as_secs(), 600);
    assert_eq!(default("cleanup.history_retention"), "180d");
    assert_eq!(default("cleanup.history_archive"), "none");
    assert_eq!(default("recovery.mode"), "FAIL");
    assert_eq!(default("database.url"), "none");
    assert_eq!(default("logging.file.max_bytes"), "104857600");
    // Every printed duration reads back as the default it came from.
    for k in keys
        .iter()
        .filter(|k| k.kind == "duration" && k.default != "none")
    {
        let d = lcconfig::config::parse_duration(&k.default)
            .unwrap_or_else(|| panic!("{}: {}", k.path, k.default));
        assert!(d.as_secs() > 0, "{k:?}");
    }
    let levels = &keys
        .iter()
        .find(|k| k.path == "logging.level")
        .unwrap()
        .kind;
    assert_eq!(levels, &LOG_LEVELS.join(" \\| "));
}

/// The schema's duration pattern is looser than the parser, never stricter: every form the
/// parser reads matches it.
#[test]
fn the_duration_pattern_admits_what_the_parser_reads() {
    let pattern = regex::Regex::new(lcconfig::config::DURATION_PATTERN).unwrap();
    for text in [
        "90", "1.5", "90m", "2h", "3d", "45s", "PT90M", "P3D", "P1W", "PT1H30M", " 5m ",
    ] {
        assert!(lcconfig::config::parse_duration(text).is_some(), "{text}");
        assert!(pattern.is_match(text), "{text}");
    }
    for text in ["ninety", "5 minutes", "-5", "m5"] {
        assert!(!pattern.is_match(text), "{text}");
    }
}

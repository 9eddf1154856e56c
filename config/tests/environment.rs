//! `LCA_` environment overrides (CONTRACT §10.1, issue 28 item 5) through the public loading
//! path, `Config::load` on a real file: the field's type decides how a value is read, keys nest
//! at any depth, a value of the wrong type names the variable, and the environment is over the
//! file, over the defaults.
use lcconfig::config::{Config, ConfigError, Dur};
use std::path::PathBuf;

/// A configuration file in the temporary directory, removed at the end of the test.
struct File(PathBuf);

impl File {
    fn new(yaml: &str) -> File {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("lc-config-env-{}-{n}.yaml", std::process::id()));
        std::fs::write(&path, yaml).unwrap();
        File(path)
    }

    fn load(&self, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::load(
            &self.0,
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const MINIMAL: &str = "database:\n  url: postgres://u@127.0.0.1/db\n";

/// A value that YAML reads as a number, a boolean or null stays the text written in a field that
/// takes text, whatever the key: a password `123456`, a token `true`, a path `0123`.
#[test]
fn a_numeric_or_boolean_looking_value_stays_text_in_a_string_field() {
    let file = File::new(MINIMAL);
    // YAML would also have refused `*` (an alias) and cut `s3cret #1` at its comment.
    for text in [
        "123456",
        "0123",
        "1.50",
        "1e3",
        "true",
        "yes",
        "null",
        "~",
        "- x",
        "a: b",
        "*",
        "s3cret #1",
        "[x]",
    ] {
        let c = file
            .load(&[
                ("LCA_MONITOR__TOKEN", text),
                ("LCA_MONITOR__OPERATOR_TOKEN", text),
                ("LCA_WORKER__METRICS_HOST", text),
                ("LCA_NIFI__SIGNING_SECRET", text),
                ("LCA_SERVER__SSL_CA_CERTS", text),
                ("LCA_LOGGING__LOGGERS__SQLX", text),
            ])
            .unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(c.monitor.token.as_deref(), Some(text));
        assert_eq!(c.monitor.operator_token.as_deref(), Some(text));
        assert_eq!(c.worker.metrics_host, text);
        assert_eq!(c.nifi.signing_secret.as_deref(), Some(text));
        assert_eq!(c.server.ssl_ca_certs, Some(PathBuf::from(text)));
        assert_eq!(c.logging.loggers["sqlx"], text);
    }
    // A database URL whose password and database name look like numbers.
    let c = file
        .load(&[("LCA_DATABASE__URL", "postgres://u:123456@h:5432/2024")])
        .unwrap();
    assert_eq!(c.database_url(), "postgres://u:123456@h:5432/2024");
}

/// And where the field takes no text, the value is read as YAML: numbers, booleans, `null` for
/// an optional number or duration, lists and mappings.
#[test]
fn other_fields_read_the_value_as_yaml() {
    let c = File::new(MINIMAL)
        .load(&[
            ("LCA_SERVER__PORT", "9100"),
            ("LCA_SERVER__PROXY_HEADERS", "false"),
            ("LCA_SERVER__TIMEOUT_KEEP_ALIVE", "7.5"),
            ("LCA_SERVER__LIMIT_CONCURRENCY", "64"),
            ("LCA_WORKER__METRICS_PORT", "null"),
            ("LCA_CLEANUP__HISTORY_RETENTION", "null"),
            ("LCA_CLEANUP__HISTORY_ARCHIVE", "{dir: /var/lib/lc}"),
            ("LCA_DISPATCH__LEASE", "90"),
            (
                "LCA_AUTH__TOKEN_DIGESTS__NIFI",
                &format!("[{}]", "ab".repeat(32)),
            ),
        ])
        .unwrap();
    assert_eq!(c.server.port, 9100);
    assert!(!c.server.proxy_headers);
    assert_eq!(c.server.timeout_keep_alive, 7.5);
    assert_eq!(c.server.limit_concurrency, Some(64));
    assert_eq!(c.worker.metrics_port, None);
    assert_eq!(c.cleanup.history_retention, None);
    assert_eq!(
        c.cleanup.history_archive,
        lcconfig::config::HistoryArchiveConfig::Dir("/var/lib/lc".into())
    );
    assert_eq!(c.dispatch.lease, Dur::secs(90));
    assert_eq!(c.auth.token_digests.nifi, vec!["ab".repeat(32)]);
    c.validate().unwrap();
}

/// `LCA_A__B` sets one key of a section and leaves the file's other keys of it; `__` nests
/// deeper too (`LCA_LOGGING__FILE__MAX_BYTES` inside the file's `logging.file`).
#[test]
fn a_nested_override_sets_one_key_and_keeps_the_rest_of_the_section() {
    let file = File::new(&format!(
        "{MINIMAL}server:\n  host: 127.0.0.2\n  port: 9000\n  workers: 3\nlogging:\n  file:\n    path: /tmp/lc.log\n    max_bytes: 4096\n"
    ));
    let c = file
        .load(&[
            ("LCA_SERVER__PORT", "9100"),
            ("LCA_LOGGING__FILE__MAX_BYTES", "8192"),
            ("LCA_LOGGING__FILE__FORMAT", "json"),
            ("LCA_DATABASE__POOL_SIZE", "4"),
        ])
        .unwrap();
    assert_eq!(
        (c.server.host.as_str(), c.server.port, c.server.workers),
        ("127.0.0.2", 9100, 3)
    );
    let f = c.logging.file.as_ref().unwrap();
    assert_eq!(
        (f.path.as_str(), f.max_bytes, f.format.as_str()),
        ("/tmp/lc.log", 8192, "json")
    );
    assert_eq!(c.database.pool_size, 4);
    assert_eq!(c.database.url.as_deref(), Some("postgres://u@127.0.0.1/db"));
    c.validate().unwrap();
    // A whole section as a YAML mapping, with a key inside it from its own variable.
    let c = file
        .load(&[
            ("LCA_RECOVERY", "{mode: REISSUE, max_attempts: 5}"),
            ("LCA_RECOVERY__MAX_ATTEMPTS", "7"),
        ])
        .unwrap();
    assert_eq!(
        (c.recovery.mode, c.recovery.max_attempts),
        (lcconfig::config::RecoveryMode::Reissue, 7)
    );
    let e = file
        .load(&[
            ("LCA_RECOVERY", "REISSUE"),
            ("LCA_RECOVERY__MAX_ATTEMPTS", "7"),
        ])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("LCA_RECOVERY:") && e.contains("LCA_RECOVERY__MAX_ATTEMPTS"),
        "{e}"
    );
}

/// A value its field cannot take refuses to start with an error naming the variable and the
/// key, never a panic; from the file, the key.
#[test]
fn a_value_of_the_wrong_type_names_the_variable_and_the_key() {
    let file = File::new(MINIMAL);
    for (var, value, key) in [
        ("LCA_SERVER__PORT", "abc", "server.port"),
        ("LCA_SERVER__PORT", "", "server.port"),
        ("LCA_SERVER__PROXY_HEADERS", "maybe", "server.proxy_headers"),
        ("LCA_DISPATCH__BATCH", "-1", "dispatch.batch"),
        ("LCA_WORKER__METRICS_PORT", "[1]", "worker.metrics_port"),
        ("LCA_RECOVERY__MODE", "SOMETIMES", "recovery.mode"),
        (
            "LCA_NIFI__SIGNING_KEYS",
            "[{id: a}]",
            "nifi.signing_keys[0]",
        ),
        ("LCA_LOGGING__FILE__FORMAT", "json", "logging.file"),
        ("LCA_SERVER__PROT", "1", "prot"),
        ("LCA_SEVER__PORT", "1", "sever"),
        ("LCA_DISPATCH__LEASE", "soon", "dispatch.lease"),
    ] {
        let e = file.load(&[(var, value)]).unwrap_err();
        assert!(matches!(e, ConfigError::Env { .. }), "{var}={value}: {e:?}");
        let e = e.to_string();
        assert!(
            e.contains(&format!("environment variable {var}:")) && e.contains(key),
            "{var}={value}: {e}"
        );
    }
    let e = file
        .load(&[("LCA_SERVER__PORT", "abc")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("abc") && e.contains("expected i64"), "{e}");
    let e = file
        .load(&[("LCA_AUTH__TOKENS", "[{name: a, role: nifi")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("LCA_AUTH__TOKENS") && e.contains("not a YAML value"),
        "{e}"
    );
    let e = File::new(&format!("{MINIMAL}server: {{port: abc}}\n"))
        .load(&[])
        .unwrap_err();
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "server.port"),
        "{e:?}"
    );
}

/// Each key from the environment if set there, else from the file, else the default; the file
/// beside its variables: only `LCA_CONFIG` names it and is no key.
#[test]
fn the_environment_is_over_the_file_over_the_defaults() {
    let file = File::new(&format!(
        "{MINIMAL}server:\n  port: 9000\n  workers: 2\ndispatch:\n  lease: 2m\n"
    ));
    let env = [
        ("LCA_CONFIG", "/somewhere/else.yaml"),
        ("LCA_SERVER__PORT", "9100"),
        ("LCA_DISPATCH__LEASE", "PT3M"),
        ("DATABASE_URL", "postgres://fallback/d"),
        ("PATH", "/usr/bin"),
    ];
    let c = file.load(&env).unwrap();
    // environment over file
    assert_eq!(c.server.port, 9100);
    assert_eq!(c.dispatch.lease, Dur::secs(180));
    // file over defaults
    assert_eq!(c.server.workers, 2);
    assert_eq!(c.database.url.as_deref(), Some("postgres://u@127.0.0.1/db"));
    // defaults
    assert_eq!(c.server.host, "0.0.0.0");
    assert_eq!(c.dispatch.batch, 20);
    // Without the variables: the file's values.
    let c = file.load(&[]).unwrap();
    assert_eq!((c.server.port, c.dispatch.lease), (9000, Dur::secs(120)));
    // An empty file: the defaults, under the environment; DATABASE_URL last of all.
    let empty = File::new("");
    let c = empty
        .load(&[("DATABASE_URL", "postgres://fallback/d")])
        .unwrap();
    assert_eq!((c.server.port, c.server.workers), (8080, 1));
    assert_eq!(c.database.url.as_deref(), Some("postgres://fallback/d"));
    let c = empty
        .load(&[
            ("DATABASE_URL", "postgres://fallback/d"),
            ("LCA_DATABASE__URL", "postgres://env/d"),
        ])
        .unwrap();
    assert_eq!(c.database.url.as_deref(), Some("postgres://env/d"));
}

/// Every variable the chart sets (charts/load-control/templates), with values of the kind it
/// gives them, loads and passes the start-up checks: numeric-looking secrets and DSNs included.
#[test]
fn the_variables_the_chart_sets_load_as_before() {
    let file = File::new("logging: {format: json}\n");
    let common = [
        ("DATABASE_URL", "postgresql://lc:123456@pg:5432/lc"),
        ("LCA_CONFIG", "/etc/load-control/config.yaml"),
        ("POD_NAME", "lc-0"),
        ("LC_LEASE_DURATION", "15"),
    ];
    let api = [
        (
            "LCA_AUTH__TOKENS_FILE",
            "/etc/load-control/tokens/tokens.yaml",
        ),
        (
            "LCA_SERVER__SSL_CERTFILE",
            "/etc/load-control/tls/api/tls.crt",
        ),
        (
            "LCA_SERVER__SSL_KEYFILE",
            "/etc/load-control/tls/api/tls.key",
        ),
        (
            "LCA_SERVER__SSL_CA_CERTS",
            "/etc/load-control/tls/api/client-ca.crt",
        ),
        ("LCA_SERVER__SSL_CLIENT_CERT_REQUIRED", "true"),
    ];
    let c = file.load(&[&common[..], &api[..]].concat()).unwrap();
    c.validate().unwrap();
    assert!(c.server.ssl_client_cert_required);
    assert_eq!(
        c.auth.tokens_file,
        Some(PathBuf::from("/etc/load-control/tokens/tokens.yaml"))
    );
    assert_eq!(c.database_url(), "postgresql://lc:123456@pg:5432/lc");
    let operator = [
        (
            "LCA_DATABASE__LISTEN_DSN",
            "host=pg user=lc password=123456 dbname=2024",
        ),
        ("LCA_NIFI__SIGNING_SECRET", "20261203"),
        (
            "LCA_NIFI__CLIENT_CERT",
            "/etc/load-control/tls/nifi/client.crt",
        ),
        (
            "LCA_NIFI__CLIENT_KEY",
            "/etc/load-control/tls/nifi/client.key",
        ),
        ("LCA_NIFI__CA_BUNDLE", "/etc/load-control/tls/nifi/ca.crt"),
    ];
    let c = file.load(&[&common[..], &operator[..]].concat()).unwrap();
    c.validate().unwrap();
    assert_eq!(
        c.database.listen_dsn.as_deref(),
        Some("host=pg user=lc password=123456 dbname=2024")
    );
    assert_eq!(c.nifi.signer().unwrap().secret, "20261203");
    let keys = "- id: k-2026-12\n  secret: '0042'\n- id: k-2026-06\n  secret: old\n";
    let c = file
        .load(&[&common[..], &[("LCA_NIFI__SIGNING_KEYS", keys)]].concat())
        .unwrap();
    c.validate().unwrap();
    let signer = c.nifi.signer().unwrap();
    assert_eq!(
        (signer.key_id.as_deref(), signer.secret.as_str()),
        (Some("k-2026-12"), "0042")
    );
    let migration = [
        (
            "LCA_DATABASE__MIGRATION_URL",
            "postgresql://owner:000@pg/lc",
        ),
        ("LCA_LOGGING__FORMAT", "text"),
    ];
    let c = file.load(&[&common[..], &migration[..]].concat()).unwrap();
    c.validate().unwrap();
    assert_eq!(c.migration_dsn().url, "postgresql://owner:000@pg/lc");
    assert_eq!(c.logging.format, "text");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Whatever the values (and however many variables nest), loading answers a configuration
    /// or an error, never a panic; an error from the environment names a variable that was set.
    #[test]
    fn any_environment_loads_or_is_refused_without_a_panic(
        vars in proptest::collection::vec(
            (
                proptest::sample::select(vec![
                    "LCA_SERVER__PORT", "LCA_SERVER", "LCA_SERVER__SSL_CERTFILE",
                    "LCA_NIFI__SIGNING_KEYS", "LCA_NIFI__SIGNING_SECRET", "LCA_LOGGING__FILE",
                    "LCA_LOGGING__FILE__PATH", "LCA_LOGGING__LOGGERS__SQLX",
                    "LCA_CLEANUP__HISTORY_ARCHIVE", "LCA_CLEANUP__HISTORY_RETENTION",
                    "LCA_WORKER__METRICS_PORT", "LCA_RECOVERY__MODE", "LCA_AUTH__TOKENS",
                    "LCA_X", "LCA_", "LCA_SERVER____PORT", "DATABASE_URL", "LCA_CLIENTS__A__B",
                ]),
                "(\\PC{0,12}|[\\[\\]{}:, a-z0-9'\"-]{0,16})",
            ),
            0..6,
        )
    ) {
        let env: Vec<(String, String)> =
            vars.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        if let Err(ConfigError::Env { var, .. }) = Config::from_sources(MINIMAL, &env) {
            proptest::prop_assert!(env.iter().any(|(k, _)| *k == var), "{var}");
        }
    }
}

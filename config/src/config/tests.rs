//! The configuration's loading and start-up checks.
use super::*;

const MINIMAL: &str = "database:\n  url: postgres://u@127.0.0.1/db\n";

#[test]
fn a_tokens_file_is_the_list_of_auth_tokens_or_the_auth_sections() {
    let d = "ab".repeat(32);
    let list = TokensFile::parse(
        format!("- {{name: nifi-a, role: nifi, sha256: {d}}}\n- {{name: nifi-b, role: nifi, sha256: {d}}}\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(list.tokens.len(), 2);
    assert_eq!(list.tokens[1].name, "nifi-b");
    let json = TokensFile::parse(
        format!("[{{\"name\": \"ops\", \"role\": \"operator\", \"sha256\": \"{d}\"}}]").as_bytes(),
    )
    .unwrap();
    assert_eq!(json.tokens[0].role, "operator");
    let sections = TokensFile::parse(
        format!(
            "tokens: [{{name: a, role: nifi, sha256: {d}}}]\ntoken_digests: {{operator: [{d}]}}\n"
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        (sections.tokens.len(), sections.token_digests.operator.len()),
        (1, 1)
    );
    assert!(TokensFile::parse(b"").unwrap().is_empty());
    assert!(TokensFile::parse(b"# nothing yet\n").unwrap().is_empty());
    // Refusals name the entry, never quote the text (a raw token pasted by mistake).
    let e = TokensFile::parse(b"- {name: a, role: nifi, sha256: my-raw-token-123}\n").unwrap_err();
    assert!(e.contains("tokens[0].sha256"), "{e}");
    assert!(!e.contains("my-raw-token-123"), "{e}");
    let e = TokensFile::parse(b"nifi: my-raw-token-123\n").unwrap_err();
    assert!(!e.contains("my-raw-token-123"), "{e}");
    let e = TokensFile::parse(b"- {name: a, role: nifi\n").unwrap_err();
    assert!(e.contains("line"), "{e}");
    assert!(TokensFile::parse(&[0xff, 0xfe]).is_err());
    assert!(
        TokensFile::parse(format!("- {{name: a, role: admin, sha256: {d}}}").as_bytes())
            .unwrap_err()
            .contains("tokens[0].role")
    );
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn defaults_match_the_contract() {
    let c = Config::from_sources(MINIMAL, &[]).unwrap();
    c.validate().unwrap();
    assert_eq!(c.server.port, 8080);
    assert_eq!(c.server.max_body_bytes, 16 * 1024 * 1024);
    assert_eq!(c.database.tx_attempts, 3);
    assert_eq!(c.recovery.stale, Dur::secs(5400));
    assert_eq!(c.dispatch.lease, Dur::secs(60));
    assert_eq!(c.cleanup.failed_retention, Dur::secs(14 * 86400));
    assert_eq!(c.cleanup.history_retention, Some(Dur::secs(180 * 86400)));
    assert_eq!(c.cleanup.history_batch, 100);
    assert_eq!(c.cleanup.history_archive, HistoryArchiveConfig::None);
    assert_eq!(c.logging.format, "json");
}

#[test]
fn history_retention_keys() {
    let c = Config::from_sources(
        &format!(
            "{MINIMAL}cleanup:\n  history_retention: null\n  history_batch: 7\n  history_archive: {{dir: /var/lib/lc}}\n"
        ),
        &[],
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.cleanup.history_retention, None);
    assert_eq!(c.thresholds().history_retention, None);
    let l = c.ledger_config();
    assert_eq!(l.history.batch, 7);
    assert_eq!(
        l.history.archive,
        ledger::settings::HistoryArchive::JsonLines {
            dir: "/var/lib/lc".into()
        }
    );
    let c = Config::from_sources(
        MINIMAL,
        &env(&[
            ("LCA_CLEANUP__HISTORY_RETENTION", "P400D"),
            ("LCA_CLEANUP__HISTORY_ARCHIVE", "none"),
        ]),
    )
    .unwrap();
    assert_eq!(c.cleanup.history_retention, Some(Dur::secs(400 * 86400)));
    assert_eq!(c.cleanup.history_archive, HistoryArchiveConfig::None);
    for bad in [
        "{kind: s3}",
        "{dir: ''}",
        "{dir: /x, mode: 1}",
        "jsonl",
        "[/x]",
    ] {
        let e = Config::from_sources(
            &format!("{MINIMAL}cleanup: {{history_archive: {bad}}}\n"),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cleanup.history_archive"), "{bad}: {e}");
    }
}

#[test]
fn unknown_keys_are_refused_by_name() {
    let e = Config::from_sources("server:\n  prot: 1\n", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("server"), "{e}");
    assert!(e.contains("prot"), "{e}");
    let e = Config::from_sources("sever: {}\n", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("sever"), "{e}");
    let e = Config::from_sources(MINIMAL, &env(&[("LCA_SERVER__PROT", "1")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("prot"), "{e}");
}

#[test]
fn forwarded_allow_ips_is_star_or_addresses() {
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    assert_eq!(TrustedProxies::parse("*").unwrap(), TrustedProxies::Any);
    let some = TrustedProxies::parse("127.0.0.1, ::1,10.0.0.2").unwrap();
    assert!(some.trusts(ip("127.0.0.1")) && some.trusts(ip("::1")) && some.trusts(ip("10.0.0.2")));
    assert!(
        some.trusts(ip("::ffff:127.0.0.1")),
        "IPv4 seen through an IPv6 socket"
    );
    assert!(!some.trusts(ip("10.0.0.3")));
    assert!(!TrustedProxies::parse("").unwrap().trusts(ip("127.0.0.1")));
    let e = Config::from_sources(
        &format!("{MINIMAL}server:\n  forwarded_allow_ips: 127.0.0.1,proxy.local\n"),
        &[],
    )
    .unwrap()
    .validate()
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("forwarded_allow_ips") && e.contains("proxy.local"),
        "{e}"
    );
}

#[test]
fn secrets_and_urls_from_the_environment_are_taken_as_written() {
    for secret in ["123", "yes", "a: b", "- x", "{not yaml", "null"] {
        let c =
            Config::from_sources(MINIMAL, &env(&[("LCA_NIFI__SIGNING_SECRET", secret)])).unwrap();
        assert_eq!(c.nifi.signing_secret.as_deref(), Some(secret));
    }
}

/// §6.4 key rotation: the first key signs, with its id; from the file or from
/// `LCA_NIFI__SIGNING_KEYS` (a YAML list, as every other override).
#[test]
fn signing_keys_the_first_signs_with_its_id() {
    let c = Config::from_sources(
        &format!(
            "{MINIMAL}nifi:\n  signing_keys:\n    - {{id: k-2026.12, secret: 'n3w s3cret'}}\n    - {{id: k_2026.06, secret: 0ld-s3cret}}\n"
        ),
        &[],
    )
    .unwrap();
    c.validate().unwrap();
    let signer = c.nifi.signer().unwrap();
    assert_eq!(signer.key_id.as_deref(), Some("k-2026.12"));
    assert_eq!(signer.secret, "n3w s3cret");
    assert_eq!(c.nifi.signing_keys.as_ref().unwrap().len(), 2);
    let c = Config::from_sources(
        MINIMAL,
        &env(&[(
            "LCA_NIFI__SIGNING_KEYS",
            "- id: env-key\n  secret: \"123\"\n- {id: b, secret: x}\n",
        )]),
    )
    .unwrap();
    c.validate().unwrap();
    let signer = c.nifi.signer().unwrap();
    assert_eq!(
        (signer.key_id.as_deref(), signer.secret.as_str()),
        (Some("env-key"), "123")
    );
    // signing_secret alone: no key id.
    let c = Config::from_sources(MINIMAL, &env(&[("LCA_NIFI__SIGNING_SECRET", "legacy")])).unwrap();
    c.validate().unwrap();
    assert_eq!(
        c.nifi.signer(),
        Some(Signer {
            key_id: None,
            secret: "legacy".into()
        })
    );
    assert_eq!(
        Config::from_sources(MINIMAL, &[]).unwrap().nifi.signer(),
        None
    );
}

/// Each mistake refuses to start naming the key, and no message (nor any Debug output)
/// carries a secret.
#[test]
fn signing_keys_mistakes_refuse_to_start_without_showing_a_secret() {
    const SECRET: &str = "Sup3r-S3cret";
    let check = |nifi: &str| -> String {
        match Config::from_sources(&format!("{MINIMAL}nifi: {nifi}\n"), &[]) {
            Ok(c) => c.validate().unwrap_err().to_string(),
            Err(e) => e.to_string(),
        }
    };
    for (nifi, key, says) in [
        (
            format!("{{signing_secret: {SECRET}, signing_keys: [{{id: a, secret: {SECRET}}}]}}"),
            "`nifi.signing_keys`",
            "not both",
        ),
        (
            "{signing_keys: []}".to_string(),
            "`nifi.signing_keys`",
            "empty list",
        ),
        (
            format!("{{signing_keys: [{{id: 'a b', secret: {SECRET}}}]}}"),
            "`nifi.signing_keys[0].id`",
            "[A-Za-z0-9._-]",
        ),
        (
            format!("{{signing_keys: [{{id: '', secret: {SECRET}}}]}}"),
            "`nifi.signing_keys[0].id`",
            "1..64",
        ),
        (
            format!(
                "{{signing_keys: [{{id: {}, secret: {SECRET}}}]}}",
                "k".repeat(65)
            ),
            "`nifi.signing_keys[0].id`",
            "1..64",
        ),
        (
            format!(
                "{{signing_keys: [{{id: a, secret: {SECRET}}}, {{id: b, secret: x}}, {{id: a, secret: y}}]}}"
            ),
            "`nifi.signing_keys[2].id`",
            "already the id of nifi.signing_keys[0]",
        ),
        (
            "{signing_keys: [{id: a, secret: ''}]}".to_string(),
            "`nifi.signing_keys[0].secret`",
            "must not be empty",
        ),
        (
            "{signing_keys: [{id: a, secret: 12345678}]}".to_string(),
            "nifi.signing_keys[0].secret",
            "must be a string, not a number",
        ),
        (
            format!("{{signing_keys: [{{id: a, scret: {SECRET}}}]}}"),
            "nifi.signing_keys[0]",
            "unknown field",
        ),
    ] {
        let e = check(&nifi);
        assert!(e.contains(key) && e.contains(says), "{nifi}: {e}");
        assert!(!e.contains(SECRET) && !e.contains("12345678"), "{e}");
    }
    // Through the environment too.
    let e = Config::from_sources(
        &format!("{MINIMAL}nifi: {{signing_secret: {SECRET}}}\n"),
        &env(&[("LCA_NIFI__SIGNING_KEYS", "[{id: a, secret: b}]")]),
    )
    .unwrap()
    .validate()
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("nifi.signing_keys") && !e.contains(SECRET),
        "{e}"
    );
    let c = Config::from_sources(
        &format!(
            "{MINIMAL}nifi: {{signing_keys: [{{id: key-1, secret: {SECRET}}}]}}\nmonitor: {{}}\n"
        ),
        &[],
    )
    .unwrap();
    for shown in [
        format!("{c:?}"),
        format!("{:?}", c.nifi.signer()),
        format!(
            "{:?}",
            Config::from_sources(
                &format!("{MINIMAL}nifi: {{signing_secret: {SECRET}}}\n"),
                &[]
            )
            .unwrap()
        ),
    ] {
        assert!(!shown.contains(SECRET), "{shown}");
    }
    assert!(format!("{c:?}").contains("key-1"));
}

#[test]
fn environment_overrides_file_and_database_url_is_the_last_fallback() {
    let c = Config::from_sources(
        "server:\n  port: 9000\n",
        &env(&[
            ("LCA_SERVER__PORT", "9100"),
            ("LCA_RECOVERY__MODE", "REISSUE"),
            ("DATABASE_URL", "postgres://x@h/d"),
        ]),
    )
    .unwrap();
    assert_eq!(c.server.port, 9100);
    assert_eq!(c.recovery.mode, RecoveryMode::Reissue);
    assert_eq!(c.database.url.as_deref(), Some("postgres://x@h/d"));
    let c = Config::from_sources(MINIMAL, &env(&[("DATABASE_URL", "postgres://other/d")])).unwrap();
    assert_eq!(c.database.url.as_deref(), Some("postgres://u@127.0.0.1/db"));
}

#[test]
fn startup_checks_name_the_key() {
    let check = |yaml: &str| {
        Config::from_sources(yaml, &[])
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string()
    };
    assert!(
        check("database: {url: 'postgres://h/d'}\nrecovery: {stale: 30m}\n")
            .contains("recovery.stale")
    );
    assert!(check("server: {port: 70000}\n").contains("server.port"));
    assert!(
        check("database: {url: 'postgres://h/d'}\nserver: {header_read_timeout: 0}\n")
            .contains("server.header_read_timeout")
    );
    assert!(check("{}").contains("database.url"));
    assert!(
        check("database: {url: 'postgres://h/d'}\ndispatch: {lease: 5s}\n")
            .contains("dispatch.lease")
    );
    assert!(
        check("database: {url: 'postgres://h/d', pool_max_lifetime: 0}\n")
            .contains("database.pool_max_lifetime")
    );
    assert!(
        check("database: {url: 'postgres://h/d'}\nlogging: {stdout: false}\n")
            .contains("logging.stdout")
    );
    assert!(
        check("database: {url: 'postgres://h/d'}\nlogging: {level: LOUD}\n")
            .contains("logging.level")
    );
    assert!(
        check("database: {url: 'postgres://h/d'}\nauth: {tokens: [{name: a, role: admin, sha256: x}]}\n")
            .contains("auth.tokens[0].role")
    );
    assert!(check("database: {url: 'mysql://h/d'}\n").contains("database.url"));
    assert!(
        check("database: {url: 'postgres://h/d'}\nserver: {reload_interval: 0}\n")
            .contains("server.reload_interval")
    );
    let e = check("database: {url: 'postgres://h/d'}\ncleanup: {history_retention: P10D}\n");
    assert!(
        e.contains("cleanup.history_retention") && e.contains("cleanup.failed_retention"),
        "{e}"
    );
    let e = check(
        "database: {url: 'postgres://h/d'}\ncleanup: {success_retention: P200D, failed_retention: P1D}\n",
    );
    assert!(
        e.contains("cleanup.history_retention") && e.contains("cleanup.success_retention"),
        "{e}"
    );
    assert!(
        check("database: {url: 'postgres://h/d'}\ncleanup: {history_batch: 0}\n")
            .contains("cleanup.history_batch")
    );
    // The operator's listener: its probes port of its own, TLS only with a certificate.
    let db = "database: {url: 'postgres://h/d'}\n";
    assert!(check(&format!("{db}worker: {{health_port: 0}}\n")).contains("worker.health_port"));
    let e = check(&format!("{db}worker: {{health_port: 9100}}\n"));
    assert!(
        e.contains("worker.health_port") && e.contains("worker.metrics_port"),
        "{e}"
    );
    let e = check(&format!("{db}worker: {{metrics_tls: true}}\n"));
    assert!(
        e.contains("worker.metrics_tls") && e.contains("server.ssl_certfile"),
        "{e}"
    );
    let e = check(&format!(
        "{db}worker: {{metrics_tls: true, metrics_port: null}}\nserver: {{ssl_certfile: c, ssl_keyfile: k}}\n"
    ));
    assert!(
        e.contains("worker.metrics_tls") && e.contains("worker.metrics_port"),
        "{e}"
    );
    Config::from_sources(
        &format!("{db}worker: {{metrics_tls: true, health_port: 9101}}\nserver: {{ssl_certfile: c, ssl_keyfile: k}}\n"),
        &[],
    )
    .unwrap()
    .validate()
    .unwrap();
    // Off: no bound on the cleanup retentions.
    Config::from_sources(
        "database: {url: 'postgres://h/d'}\ncleanup: {history_retention: null, failed_retention: P400D}\n",
        &[],
    )
    .unwrap()
    .validate()
    .unwrap();
}

/// NiFi's PG-05 answers 404 under any path prefix, and a 404 makes a dispatch DEAD at once:
/// a receiver URL with a path refuses to start, naming the key and the way out.
#[test]
fn a_receiver_url_with_a_path_refuses_to_start_unless_a_proxy_strips_it() {
    let with = |nifi: &str| {
        Config::from_sources(&format!("{MINIMAL}nifi: {nifi}\n"), &[])
            .unwrap()
            .validate()
    };
    with("{receiver_url: 'https://nifi.example:9443'}").unwrap();
    with("{receiver_url: 'https://nifi.example:9443/'}").unwrap();
    let e = with("{receiver_url: 'https://nifi.example:9443/lca'}")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nifi.receiver_url")
            && e.contains("/lca")
            && e.contains("(https://nifi.example:9443)")
            && e.contains("nifi.receiver_path_allowed: true"),
        "{e}"
    );
    let e = with("{receiver_url: 'nifi.example:9443'}")
        .unwrap_err()
        .to_string();
    assert!(e.contains("nifi.receiver_url"), "{e}");
    with("{receiver_url: 'https://proxy.example/nifi-pg05', receiver_path_allowed: true}").unwrap();
    let c = Config::from_sources(
        MINIMAL,
        &env(&[
            ("LCA_NIFI__RECEIVER_URL", "https://proxy.example/nifi-pg05"),
            ("LCA_NIFI__RECEIVER_PATH_ALLOWED", "true"),
        ]),
    )
    .unwrap();
    c.validate().unwrap();
    assert!(
        c.thresholds().receiver_path_allowed,
        "jobs are judged by it too"
    );
}

#[test]
fn driver_suffix_is_ignored() {
    assert_eq!(
        normalize_database_url("postgresql+psycopg://u@h/d").as_deref(),
        Some("postgresql://u@h/d")
    );
    assert_eq!(normalize_database_url("mysql://h"), None);
}

#[test]
fn every_signing_key_is_scrubbed_from_the_configuration() {
    let c = Config::from_sources(
        "nifi:\n  signing_keys:\n    - {id: new, secret: n3w-s3cret}\n    - {id: old, secret: 0ld-s3cret}\n",
        &[],
    )
    .unwrap();
    let s = c.secrets();
    assert_eq!(
        s.scrub("signed with n3w-s3cret, once with 0ld-s3cret"),
        "signed with ***, once with ***"
    );
}

//! Configuration (CONTRACT §10): the settings, their defaults and their start-up checks. Loading
//! (one YAML file, `LCA_<SECTION>__<KEY>` environment overrides, `DATABASE_URL` as the last
//! fallback for `database.url`) is in `load.rs`; command-line flags come on top, in the
//! binaries. Unknown sections or keys and invalid values refuse to start with a message naming
//! the key.
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid YAML: {source}")]
    Yaml {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("invalid configuration at `{key}`: {message}")]
    Invalid { key: String, message: String },
}

/// `server.forwarded_allow_ips`: the peers whose `X-Forwarded-For` is believed (§10.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrustedProxies {
    /// `*`: every peer.
    Any,
    Only(Vec<std::net::IpAddr>),
}

impl TrustedProxies {
    /// `*`, or addresses separated by commas (spaces allowed around them).
    pub fn parse(text: &str) -> Result<TrustedProxies, String> {
        let entries: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .collect();
        if entries.contains(&"*") {
            return Ok(TrustedProxies::Any);
        }
        entries
            .iter()
            .map(|e| {
                e.parse()
                    .map_err(|_| format!("`{e}` is not an IP address (nor `*`)"))
            })
            .collect::<Result<_, _>>()
            .map(TrustedProxies::Only)
    }

    pub fn trusts(&self, ip: std::net::IpAddr) -> bool {
        match self {
            TrustedProxies::Any => true,
            TrustedProxies::Only(ips) => ips.contains(&ip) || ips.contains(&ip.to_canonical()),
        }
    }
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        message: message.into(),
    }
}

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub host: String,
    pub port: i64,
    pub workers: i64,
    pub root_path: String,
    pub proxy_headers: bool,
    pub forwarded_allow_ips: String,
    pub timeout_keep_alive: f64,
    /// **[v1-ext]** Seconds a client has for a whole request head once it started sending it
    /// (and for a TLS handshake).
    pub header_read_timeout: f64,
    /// **[v1-ext]** Seconds a client has for a whole request body; then 408 and the connection
    /// is closed.
    pub body_read_timeout: f64,
    /// **[v1-ext]** Open connections per process (default 1024), and as many TLS handshakes in
    /// progress. At the cap a new connection takes the place of an open one: one that never
    /// presented a valid bearer token and has no request in flight (the earliest accepted),
    /// else the authenticated one idle longest (TLS: the oldest handshake in progress); it is
    /// closed at once only when every open connection is busy.
    pub max_connections: usize,
    pub timeout_graceful_shutdown: f64,
    /// `/v1` requests handled at once (default none: no limit); beyond it 503
    /// `SERVICE_UNAVAILABLE`. **[v1-ext]** A request takes its permit once its body has arrived
    /// (after authentication, 413 and 408), so a body being trickled in holds none; the bytes of
    /// bodies being read or handled are bounded by `limit_concurrency × max_body_bytes` in all (a
    /// body waits for its share, within `body_read_timeout`).
    pub limit_concurrency: Option<usize>,
    pub ssl_certfile: Option<PathBuf>,
    pub ssl_keyfile: Option<PathBuf>,
    pub ssl_ca_certs: Option<PathBuf>,
    pub ssl_client_cert_required: bool,
    pub max_body_bytes: usize,
    /// **[v1-ext]** How often the api-server reads `ssl_certfile`/`ssl_keyfile` and
    /// `auth.tokens_file` again, so that a rotated Secret is used without a restart.
    pub reload_interval: Dur,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "0.0.0.0".into(),
            port: 8080,
            workers: 1,
            root_path: String::new(),
            proxy_headers: true,
            forwarded_allow_ips: "127.0.0.1".into(),
            timeout_keep_alive: 5.0,
            header_read_timeout: 10.0,
            body_read_timeout: 10.0,
            max_connections: 1024,
            timeout_graceful_shutdown: 30.0,
            limit_concurrency: None,
            ssl_certfile: None,
            ssl_keyfile: None,
            ssl_ca_certs: None,
            ssl_client_cert_required: false,
            max_body_bytes: 16 * 1024 * 1024,
            reload_interval: Dur::secs(5),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    pub url: Option<String>,
    pub migration_url: Option<String>,
    pub listen_dsn: Option<String>,
    pub pool_size: u32,
    pub max_overflow: u32,
    pub tx_attempts: u32,
    /// **[v1-ext]** No pooled connection is used after this age, so that a pool behind a moving
    /// service address ends up on the current primary even if nothing ever fails.
    pub pool_max_lifetime: Dur,
    /// A file holding the password of `url` and `listen_dsn` (and of `migration_url` when unset):
    /// read again while running, so a rotated password is used without a restart.
    pub password_file: Option<std::path::PathBuf>,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: None,
            migration_url: None,
            listen_dsn: None,
            pool_size: 10,
            max_overflow: 5,
            tx_attempts: 3,
            pool_max_lifetime: Dur::secs(600),
            password_file: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub name: String,
    pub role: String,
    pub sha256: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenDigests {
    pub nifi: Vec<String>,
    pub operator: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub token_digests: TokenDigests,
    pub tokens: Vec<TokenEntry>,
    /// **[v1-ext]** A file (a mounted Secret) holding more token entries, read at start and again
    /// every `server.reload_interval` while the process runs ([`TokensFile`]).
    pub tokens_file: Option<PathBuf>,
}

/// The contents of `auth.tokens_file`: YAML (or JSON), either the list `auth.tokens` takes
/// (`[{name, role, sha256}]`) or a mapping with `tokens` and/or `token_digests`, as in the `auth`
/// section. Only digests, never tokens: `load-control-api hash-token` makes them.
#[derive(Debug, Clone, Default)]
pub struct TokensFile {
    pub tokens: Vec<TokenEntry>,
    pub token_digests: TokenDigests,
}

impl TokensFile {
    /// Parses and checks the file's bytes. The error names the place (entry index, line and
    /// column) but never quotes the file's text, which could hold a token pasted by mistake.
    pub fn parse(bytes: &[u8]) -> Result<TokensFile, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Sections {
            #[serde(default)]
            tokens: Vec<TokenEntry>,
            #[serde(default)]
            token_digests: TokenDigests,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            List(Vec<TokenEntry>),
            Sections(Sections),
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())?;
        let form: Option<Form> = serde_yaml::from_str(text).map_err(|e| match e.location() {
            Some(l) => format!(
                "is not a list of {{name, role, sha256}} nor a mapping of tokens/token_digests (YAML error at line {}, column {})",
                l.line(),
                l.column()
            ),
            None => "is not a list of {name, role, sha256} nor a mapping of tokens/token_digests"
                .to_string(),
        })?;
        let file = match form {
            // An empty file: no entries.
            None => TokensFile::default(),
            Some(Form::List(tokens)) => TokensFile {
                tokens,
                ..Default::default()
            },
            Some(Form::Sections(s)) => TokensFile {
                tokens: s.tokens,
                token_digests: s.token_digests,
            },
        };
        check_token_entries(&file.tokens, &file.token_digests, "").map_err(|e| match e {
            ConfigError::Invalid { key, message } => format!("{key}: {message}"),
            other => other.to_string(),
        })?;
        Ok(file)
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
            && self.token_digests.nifi.is_empty()
            && self.token_digests.operator.is_empty()
    }
}

/// The checks of §10.4 on token entries; keys are named under `prefix` (`auth.` in the
/// configuration, nothing in a tokens file). Messages never quote a digest.
fn check_token_entries(
    tokens: &[TokenEntry],
    digests: &TokenDigests,
    prefix: &str,
) -> Result<(), ConfigError> {
    for (i, t) in tokens.iter().enumerate() {
        let key = format!("{prefix}tokens[{i}]");
        if t.role != "nifi" && t.role != "operator" {
            return Err(invalid(&format!("{key}.role"), "is not nifi or operator"));
        }
        if !is_digest(&t.sha256) {
            return Err(invalid(
                &format!("{key}.sha256"),
                "must be 64 hex characters (SHA-256 of the token)",
            ));
        }
        let name_ok = (1..=100).contains(&t.name.chars().count())
            && t.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._@:/-".contains(c));
        if !name_ok {
            return Err(invalid(
                &format!("{key}.name"),
                "must be 1..100 characters of [A-Za-z0-9._@:/-]",
            ));
        }
    }
    for (role, list) in [("nifi", &digests.nifi), ("operator", &digests.operator)] {
        for (i, d) in list.iter().enumerate() {
            if !is_digest(d) {
                return Err(invalid(
                    &format!("{prefix}token_digests.{role}[{i}]"),
                    "must be 64 hex characters",
                ));
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    pub require_registered: bool,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NifiConfig {
    pub receiver_url: Option<String>,
    /// [v1-ext] A proxy in front of NiFi strips the receiver URL's path: allow one.
    pub receiver_path_allowed: bool,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub ca_bundle: Option<PathBuf>,
    pub timeout_seconds: f64,
    pub signing_secret: Option<String>,
    /// [v1-ext] §6.4 key rotation: the first key signs and its id goes in `X-LCA-Key-Id`.
    pub signing_keys: Option<Vec<SigningKey>>,
}

/// Never prints a secret: `signing_secret` and every key's secret are shown as `***`.
impl std::fmt::Debug for NifiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NifiConfig")
            .field("receiver_url", &self.receiver_url)
            .field("receiver_path_allowed", &self.receiver_path_allowed)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key)
            .field("ca_bundle", &self.ca_bundle)
            .field("timeout_seconds", &self.timeout_seconds)
            .field(
                "signing_secret",
                &self.signing_secret.as_ref().map(|_| crate::redact::MASK),
            )
            .field("signing_keys", &self.signing_keys)
            .finish()
    }
}

/// One entry of `nifi.signing_keys` (§6.4): `{id, secret}`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigningKey {
    pub id: String,
    #[serde(deserialize_with = "secret_string")]
    pub secret: String,
}

/// Shows the id only.
impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("id", &self.id)
            .field("secret", &crate::redact::MASK)
            .finish()
    }
}

/// A secret must be a string. Serde's own message would quote the value it refused (a secret
/// YAML read as a number or a boolean) into the start-up error; this one never does.
fn secret_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => Ok(s),
        other => Err(serde::de::Error::custom(format!(
            "must be a string, not a {} (quote a secret that YAML reads as a number, a boolean or null)",
            match other {
                Value::Null => "null",
                Value::Bool(_) => "boolean",
                Value::Number(_) => "number",
                Value::Array(_) => "list",
                Value::Object(_) => "mapping",
                Value::String(_) => unreachable!(),
            }
        ))),
    }
}

/// A key id of `nifi.signing_keys`: `[A-Za-z0-9._-]{1,64}` (§6.4).
pub fn is_signing_key_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The key dispatches are signed with (§6.4): the first of `signing_keys` (with its id), else
/// `signing_secret` (without one), else none.
#[derive(Clone, PartialEq, Eq)]
pub struct Signer {
    pub key_id: Option<String>,
    pub secret: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key_id", &self.key_id)
            .field("secret", &crate::redact::MASK)
            .finish()
    }
}

impl NifiConfig {
    /// See [`Signer`]; a validated configuration never has both.
    pub fn signer(&self) -> Option<Signer> {
        match (&self.signing_keys, &self.signing_secret) {
            (Some(keys), _) => keys.first().map(|k| Signer {
                key_id: Some(k.id.clone()),
                secret: k.secret.clone(),
            }),
            (None, Some(secret)) => Some(Signer {
                key_id: None,
                secret: secret.clone(),
            }),
            (None, None) => None,
        }
    }

    /// The §6.4 checks of `signing_keys`.
    fn validate_signing_keys(&self) -> Result<(), ConfigError> {
        let Some(keys) = &self.signing_keys else {
            return Ok(());
        };
        if self.signing_secret.is_some() {
            return Err(invalid(
                "nifi.signing_keys",
                "set either nifi.signing_secret or nifi.signing_keys, not both \
                 (signing_keys replaces signing_secret: to keep the current secret, make it an \
                 entry of signing_keys with an id)",
            ));
        }
        if keys.is_empty() {
            return Err(invalid(
                "nifi.signing_keys",
                "is an empty list: give at least one {id, secret} (the first signs), or leave \
                 it unset",
            ));
        }
        for (i, k) in keys.iter().enumerate() {
            if !is_signing_key_id(&k.id) {
                return Err(invalid(
                    &format!("nifi.signing_keys[{i}].id"),
                    format!("{:?} must be 1..64 characters of [A-Za-z0-9._-]", k.id),
                ));
            }
            if let Some(j) = keys[..i].iter().position(|o| o.id == k.id) {
                return Err(invalid(
                    &format!("nifi.signing_keys[{i}].id"),
                    format!("{:?} is already the id of nifi.signing_keys[{j}]", k.id),
                ));
            }
            if k.secret.is_empty() {
                return Err(invalid(
                    &format!("nifi.signing_keys[{i}].secret"),
                    "must not be empty",
                ));
            }
        }
        Ok(())
    }
}

impl Default for NifiConfig {
    fn default() -> Self {
        NifiConfig {
            receiver_url: None,
            receiver_path_allowed: false,
            client_cert: None,
            client_key: None,
            ca_bundle: None,
            timeout_seconds: 10.0,
            signing_secret: None,
            signing_keys: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    pub run_timeout: Dur,
    pub extract_query_timeout: Dur,
    pub stale: Dur,
    pub mode: RecoveryMode,
    pub max_attempts: u32,
    pub validation_stale: Dur,
    pub publish_stale: Dur,
    pub sweeper_interval: Dur,
}

/// Defined once, in the ledger, which applies it.
pub use ledger::settings::RecoveryMode;

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            run_timeout: Dur::secs(6 * 3600),
            extract_query_timeout: Dur::secs(3600),
            stale: Dur::secs(90 * 60),
            mode: RecoveryMode::Fail,
            max_attempts: 3,
            validation_stale: Dur::secs(2 * 3600),
            publish_stale: Dur::secs(2 * 3600),
            sweeper_interval: Dur::secs(60),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatchConfig {
    pub max_attempts: u32,
    pub backoff_min: Dur,
    pub backoff_max: Dur,
    pub ack_timeout: Dur,
    pub lease: Dur,
    pub poll_interval: Dur,
    pub batch: u32,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            max_attempts: 20,
            backoff_min: Dur::secs(5),
            backoff_max: Dur::secs(300),
            ack_timeout: Dur::secs(600),
            lease: Dur::secs(60),
            poll_interval: Dur::secs(5),
            batch: 20,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CleanupConfig {
    pub success_retention: Dur,
    pub failed_retention: Dur,
    pub max_batch: u32,
    pub event_retention: Dur,
    /// §7.2 rule 7: cleaned runs whose end time is older are deleted; `null` turns it off.
    pub history_retention: Option<Dur>,
    /// Runs history retention deletes per sweeper tick at most.
    pub history_batch: u32,
    pub history_archive: HistoryArchiveConfig,
}

impl Default for CleanupConfig {
    fn default() -> Self {
        CleanupConfig {
            success_retention: Dur::secs(3 * 86400),
            failed_retention: Dur::secs(14 * 86400),
            max_batch: 200,
            event_retention: Dur::secs(90 * 86400),
            history_retention: Some(Dur::secs(180 * 86400)),
            history_batch: 100,
            history_archive: HistoryArchiveConfig::None,
        }
    }
}

/// `cleanup.history_archive`: `none` (or null), or `{dir: PATH}` for JSON lines per day in PATH.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum HistoryArchiveConfig {
    #[default]
    None,
    Dir(PathBuf),
}

impl<'de> Deserialize<'de> for HistoryArchiveConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const EXPECTED: &str = "expected `none` or `{dir: PATH}`";
        match Value::deserialize(d)? {
            Value::Null => Ok(HistoryArchiveConfig::None),
            Value::String(s) if s == "none" => Ok(HistoryArchiveConfig::None),
            Value::Object(map) => {
                if let Some(other) = map.keys().find(|k| k.as_str() != "dir") {
                    return Err(serde::de::Error::custom(format!(
                        "unknown key {other:?}: {EXPECTED}"
                    )));
                }
                match map.get("dir") {
                    Some(Value::String(dir)) if !dir.trim().is_empty() => {
                        Ok(HistoryArchiveConfig::Dir(PathBuf::from(dir)))
                    }
                    _ => Err(serde::de::Error::custom(format!(
                        "dir must be a non-empty path: {EXPECTED}"
                    ))),
                }
            }
            other => Err(serde::de::Error::custom(format!("{other}: {EXPECTED}"))),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorConfig {
    pub api_url: Option<String>,
    pub token: Option<String>,
    pub operator_token: Option<String>,
    pub refresh_seconds: f64,
    pub log_dir: String,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            api_url: None,
            token: None,
            operator_token: None,
            refresh_seconds: 5.0,
            log_dir: "logs".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    pub metrics_host: String,
    pub metrics_port: Option<i64>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            metrics_host: "0.0.0.0".into(),
            metrics_port: Some(9100),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogFileConfig {
    pub path: String,
    #[serde(default = "default_file_format")]
    pub format: String,
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    #[serde(default = "default_backup_count")]
    pub backup_count: u32,
}

fn default_file_format() -> String {
    "text".into()
}
fn default_max_bytes() -> u64 {
    104_857_600
}
fn default_backup_count() -> u32 {
    10
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    pub level: String,
    pub format: String,
    pub stdout: bool,
    pub file: Option<LogFileConfig>,
    pub access_log: bool,
    pub access_body: bool,
    pub access_body_max: usize,
    pub loggers: BTreeMap<String, String>,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        let loggers = ["sqlx", "hyper", "reqwest", "h2", "rustls"]
            .iter()
            .map(|l| (l.to_string(), "WARNING".to_string()))
            .collect();
        LoggingConfig {
            level: "INFO".into(),
            format: "json".into(),
            stdout: true,
            file: None,
            access_log: true,
            access_body: true,
            access_body_max: 2000,
            loggers,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub database: DatabaseConfig,
    pub auth: AuthConfig,
    pub jobs: JobsConfig,
    pub nifi: NifiConfig,
    pub recovery: RecoveryConfig,
    pub dispatch: DispatchConfig,
    pub cleanup: CleanupConfig,
    pub monitor: MonitorConfig,
    pub worker: WorkerConfig,
    pub logging: LoggingConfig,
    /// Accepted for compatibility and ignored (§10.2).
    pub clients: Option<Value>,
}

pub const LOG_LEVELS: &[&str] = &["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"];

/// Which file to read: `--config`, else `LCA_CONFIG`, else `./config/config.yaml` (§10.1).
pub fn config_path(flag: Option<&Path>) -> PathBuf {
    flag.map(Path::to_path_buf)
        .or_else(|| std::env::var_os("LCA_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("config/config.yaml"))
}

impl Config {
    /// Loads file + environment, without the start-up checks (see [`Config::validate`]).
    pub fn load(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let env: Vec<(String, String)> = env.into_iter().collect();
        Config::from_sources(&text, &env).map_err(|e| match e {
            ConfigError::Yaml { source, .. } => ConfigError::Yaml {
                path: path.into(),
                source,
            },
            other => other,
        })
    }

    /// The file's YAML text under the `LCA_` variables of `env` (see `load.rs`), then
    /// `DATABASE_URL` for `database.url` when neither sets it.
    pub fn from_sources(yaml: &str, env: &[(String, String)]) -> Result<Config, ConfigError> {
        let file = crate::load::file_values(yaml).map_err(|e| match e {
            Some(source) => ConfigError::Yaml {
                path: PathBuf::new(),
                source,
            },
            None => invalid("$", "the file must hold a mapping of sections"),
        })?;
        let mut config: Config = crate::load::extract(file, env)?;
        if config.database.url.is_none() {
            config.database.url = env
                .iter()
                .find(|(var, _)| var == "DATABASE_URL")
                .map(|(_, url)| url.clone());
        }
        Ok(config)
    }

    /// The start-up checks of §10.4 that concern every process.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.recovery.stale.0 <= self.recovery.extract_query_timeout.0 {
            return Err(invalid(
                "recovery.stale",
                "must be greater than recovery.extract_query_timeout",
            ));
        }
        if self.recovery.max_attempts < 1 {
            return Err(invalid("recovery.max_attempts", "must be at least 1"));
        }
        let s = &self.server;
        if s.ssl_certfile.is_some() != s.ssl_keyfile.is_some() {
            return Err(invalid(
                "server.ssl_certfile",
                "ssl_certfile and ssl_keyfile go together",
            ));
        }
        if s.ssl_client_cert_required && (s.ssl_certfile.is_none() || s.ssl_ca_certs.is_none()) {
            return Err(invalid(
                "server.ssl_client_cert_required",
                "needs ssl_certfile, ssl_keyfile and ssl_ca_certs",
            ));
        }
        if let Some(url) = &self.nifi.receiver_url
            && let Some(problem) =
                ledger::settings::receiver_url_problem(url, self.nifi.receiver_path_allowed)
        {
            return Err(invalid("nifi.receiver_url", problem));
        }
        self.nifi.validate_signing_keys()?;
        if self.nifi.client_cert.is_some() != self.nifi.client_key.is_some() {
            return Err(invalid(
                "nifi.client_cert",
                "client_cert and client_key go together",
            ));
        }
        TrustedProxies::parse(&s.forwarded_allow_ips)
            .map_err(|m| invalid("server.forwarded_allow_ips", m))?;
        if !(1..=65535).contains(&s.port) {
            return Err(invalid(
                "server.port",
                format!("{} is outside 1..65535", s.port),
            ));
        }
        if s.workers < 1 {
            return Err(invalid("server.workers", "must be at least 1"));
        }
        if s.max_body_bytes == 0 {
            return Err(invalid("server.max_body_bytes", "must be positive"));
        }
        for (key, v) in [
            ("server.timeout_keep_alive", s.timeout_keep_alive),
            ("server.header_read_timeout", s.header_read_timeout),
            ("server.body_read_timeout", s.body_read_timeout),
        ] {
            if !(v.is_finite() && (0.1..=3600.0).contains(&v)) {
                return Err(invalid(key, "must be between 0.1 and 3600 seconds"));
            }
        }
        if s.max_connections == 0 {
            return Err(invalid("server.max_connections", "must be at least 1"));
        }
        if let Some(p) = self.worker.metrics_port
            && !(1..=65535).contains(&p)
        {
            return Err(invalid(
                "worker.metrics_port",
                format!("{p} is outside 1..65535"),
            ));
        }
        let l = &self.logging;
        if !l.stdout && l.file.is_none() {
            return Err(invalid(
                "logging.stdout",
                "no log output: stdout is false and logging.file is not set",
            ));
        }
        if !LOG_LEVELS.contains(&l.level.to_uppercase().as_str()) {
            return Err(invalid(
                "logging.level",
                format!(
                    "unknown level {:?} (one of {})",
                    l.level,
                    LOG_LEVELS.join(", ")
                ),
            ));
        }
        for (logger, level) in &l.loggers {
            if !LOG_LEVELS.contains(&level.to_uppercase().as_str()) {
                return Err(invalid(
                    &format!("logging.loggers.{logger}"),
                    format!("unknown level {level:?}"),
                ));
            }
        }
        if !["json", "text", "console"].contains(&l.format.as_str()) {
            return Err(invalid("logging.format", "must be json, text or console"));
        }
        if let Some(f) = &l.file {
            if f.max_bytes < 1024 {
                return Err(invalid("logging.file.max_bytes", "must be at least 1024"));
            }
            if !["text", "json"].contains(&f.format.as_str()) {
                return Err(invalid("logging.file.format", "must be text or json"));
            }
        }
        if self.monitor.refresh_seconds < 1.0 {
            return Err(invalid("monitor.refresh_seconds", "must be at least 1"));
        }
        check_token_entries(&self.auth.tokens, &self.auth.token_digests, "auth.")?;
        if self.server.reload_interval.0 < std::time::Duration::from_millis(100) {
            return Err(invalid(
                "server.reload_interval",
                "must be at least 0.1 seconds",
            ));
        }
        match &self.database.url {
            None => return Err(invalid("database.url", "is required (or set DATABASE_URL)")),
            Some(u) if normalize_database_url(u).is_none() => {
                return Err(invalid(
                    "database.url",
                    "must be a postgres:// or postgresql:// URL",
                ));
            }
            _ => {}
        }
        if let Err(e) = self.database_dsn().file_password() {
            return Err(invalid(
                "database.password_file",
                format!(
                    "cannot be read ({}): {e}",
                    self.database
                        .password_file
                        .as_deref()
                        .unwrap_or(std::path::Path::new(""))
                        .display()
                ),
            ));
        }
        if self.dispatch.lease.0.as_secs_f64() <= self.nifi.timeout_seconds {
            return Err(invalid(
                "dispatch.lease",
                "must exceed nifi.timeout_seconds",
            ));
        }
        if self.database.pool_max_lifetime.0 < std::time::Duration::from_secs(1) {
            return Err(invalid(
                "database.pool_max_lifetime",
                "must be at least 1 second",
            ));
        }
        if self.dispatch.backoff_min.0 > self.dispatch.backoff_max.0 {
            return Err(invalid(
                "dispatch.backoff_min",
                "must not exceed dispatch.backoff_max",
            ));
        }
        let c = &self.cleanup;
        if let Some(history) = c.history_retention {
            for (key, d) in [
                ("cleanup.success_retention", c.success_retention),
                ("cleanup.failed_retention", c.failed_retention),
            ] {
                if history.0 < d.0 {
                    return Err(invalid(
                        "cleanup.history_retention",
                        format!(
                            "must be at least {key} ({}); null turns history retention off",
                            ledger::settings::iso_duration(d.0)
                        ),
                    ));
                }
            }
        }
        if !(1..=10_000).contains(&c.history_batch) {
            return Err(invalid(
                "cleanup.history_batch",
                "must be between 1 and 10000",
            ));
        }
        Ok(())
    }

    /// The database URL with a `postgresql+<driver>://` scheme reduced to `postgresql://`.
    pub fn database_url(&self) -> String {
        self.database
            .url
            .as_deref()
            .and_then(normalize_database_url)
            .unwrap_or_default()
    }

    /// `database.url` with the password of `database.password_file`.
    pub fn database_dsn(&self) -> ledger::Dsn {
        ledger::Dsn::new(self.database_url())
            .with_password_file(self.database.password_file.clone())
    }

    /// Where LISTEN connections go: `database.listen_dsn`, else `database.url`; with the password
    /// of `database.password_file`.
    pub fn listen_dsn(&self) -> ledger::Dsn {
        ledger::Dsn::new(
            self.database
                .listen_dsn
                .clone()
                .unwrap_or_else(|| self.database_url()),
        )
        .with_password_file(self.database.password_file.clone())
    }
}

impl Config {
    /// Global values every job may override (§10.3), in the ledger's terms.
    pub fn thresholds(&self) -> ledger::settings::Thresholds {
        ledger::settings::Thresholds {
            success_retention: self.cleanup.success_retention.0,
            failed_retention: self.cleanup.failed_retention.0,
            event_retention: self.cleanup.event_retention.0,
            stale: self.recovery.stale.0,
            extract_query_timeout: self.recovery.extract_query_timeout.0,
            run_timeout: self.recovery.run_timeout.0,
            validation_stale: self.recovery.validation_stale.0,
            publish_stale: self.recovery.publish_stale.0,
            recovery_mode: self.recovery.mode,
            recovery_max_attempts: self.recovery.max_attempts.min(i32::MAX as u32) as i32,
            dispatch_max_attempts: self.dispatch.max_attempts.min(i32::MAX as u32) as i32,
            backoff_min: self.dispatch.backoff_min.0,
            backoff_max: self.dispatch.backoff_max.0,
            ack_timeout: self.dispatch.ack_timeout.0,
            receiver_url: self.nifi.receiver_url.clone(),
            timeout_seconds: self.nifi.timeout_seconds,
            receiver_path_allowed: self.nifi.receiver_path_allowed,
            history_retention: self.cleanup.history_retention.map(|d| d.0),
        }
    }

    /// The account `migrate` uses for DDL: `database.migration_url` (its own password), else
    /// `database.url` with the password of `database.password_file`.
    pub fn migration_dsn(&self) -> ledger::Dsn {
        match self
            .database
            .migration_url
            .as_deref()
            .and_then(normalize_database_url)
        {
            Some(url) => ledger::Dsn::new(url),
            None => self.database_dsn(),
        }
    }

    pub fn ledger_config(&self) -> ledger::LedgerConfig {
        ledger::LedgerConfig {
            tx_attempts: self.database.tx_attempts.max(1),
            require_registered: self.jobs.require_registered,
            thresholds: self.thresholds(),
            cleanup_max_batch: self.cleanup.max_batch as i64,
            dispatch_lease: self.dispatch.lease.0,
            pool_max_lifetime: self.database.pool_max_lifetime.0,
            password_file: self.database.password_file.clone(),
            history: ledger::settings::HistorySettings {
                batch: self.cleanup.history_batch,
                archive: match &self.cleanup.history_archive {
                    HistoryArchiveConfig::None => ledger::settings::HistoryArchive::None,
                    HistoryArchiveConfig::Dir(dir) => {
                        ledger::settings::HistoryArchive::JsonLines { dir: dir.clone() }
                    }
                },
            },
        }
    }
}

fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

pub fn normalize_database_url(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let base = scheme.split('+').next()?;
    matches!(base, "postgres" | "postgresql").then(|| format!("{base}://{rest}"))
}

#[cfg(test)]
mod tests {
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
            format!("[{{\"name\": \"ops\", \"role\": \"operator\", \"sha256\": \"{d}\"}}]")
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(json.tokens[0].role, "operator");
        let sections = TokensFile::parse(
            format!("tokens: [{{name: a, role: nifi, sha256: {d}}}]\ntoken_digests: {{operator: [{d}]}}\n").as_bytes(),
        )
        .unwrap();
        assert_eq!(
            (sections.tokens.len(), sections.token_digests.operator.len()),
            (1, 1)
        );
        assert!(TokensFile::parse(b"").unwrap().is_empty());
        assert!(TokensFile::parse(b"# nothing yet\n").unwrap().is_empty());
        // Refusals name the entry, never quote the text (a raw token pasted by mistake).
        let e =
            TokensFile::parse(b"- {name: a, role: nifi, sha256: my-raw-token-123}\n").unwrap_err();
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
        assert!(
            some.trusts(ip("127.0.0.1")) && some.trusts(ip("::1")) && some.trusts(ip("10.0.0.2"))
        );
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
            let c = Config::from_sources(MINIMAL, &env(&[("LCA_NIFI__SIGNING_SECRET", secret)]))
                .unwrap();
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
        let c =
            Config::from_sources(MINIMAL, &env(&[("LCA_NIFI__SIGNING_SECRET", "legacy")])).unwrap();
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
                format!(
                    "{{signing_secret: {SECRET}, signing_keys: [{{id: a, secret: {SECRET}}}]}}"
                ),
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
        let c =
            Config::from_sources(MINIMAL, &env(&[("DATABASE_URL", "postgres://other/d")])).unwrap();
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
        with("{receiver_url: 'https://proxy.example/nifi-pg05', receiver_path_allowed: true}")
            .unwrap();
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
}

//! Configuration (CONTRACT §10): the settings, their defaults and their start-up checks. Loading
//! (one YAML file, `LCA_<SECTION>__<KEY>` environment overrides, `DATABASE_URL` as the last
//! fallback for `database.url`) is in `load.rs`; command-line flags come on top, in the
//! binaries. Unknown sections or keys and invalid values refuse to start with a message naming
//! the key.
//!
//! One module per section, each with its defaults and its own checks; this one holds the whole,
//! the checks across sections and the ledger's view of it.
mod auth;
mod cleanup;
mod database;
mod duration;
mod logs;
mod monitor;
mod nifi;
mod recovery;
mod server;

pub use crate::error::ConfigError;
use crate::error::invalid;
use crate::redact::{Secrets, database_passwords};
use auth::check_token_entries;
pub use auth::{AuthConfig, TokenDigests, TokenEntry, TokensFile};
pub use cleanup::{CleanupConfig, HistoryArchiveConfig};
pub use database::{DatabaseConfig, normalize_database_url};
pub use duration::{DURATION_PATTERN, Dur, parse_duration};
pub use logs::{LOG_LEVELS, LogFileConfig, LoggingConfig};
pub use monitor::{MonitorConfig, WorkerConfig};
pub use nifi::{NifiConfig, Signer, SigningKey, is_signing_key_id};
pub use recovery::{DispatchConfig, RecoveryConfig, RecoveryMode};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
pub use server::{ServerConfig, TrustedProxies};
use std::path::{Path, PathBuf};

/// `jobs`: which job keys may start runs.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct JobsConfig {
    /// Refuse to create a run (422 `JOB_NOT_REGISTERED`) for a job key that no LoadJob registers.
    pub require_registered: bool,
}

/// The configuration file of `load-control-api`, `load-control-operator` and `loadctl`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
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
    /// Accepted for compatibility and ignored.
    pub clients: Option<Value>,
}

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

    /// The start-up checks of §10.4 that concern every process: each section's own, then the
    /// ones across sections.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.recovery.validate()?;
        self.server.validate()?;
        self.nifi.validate()?;
        self.worker.validate()?;
        if self.worker.metrics_tls && self.server.ssl_certfile.is_none() {
            return Err(invalid(
                "worker.metrics_tls",
                "needs server.ssl_certfile and server.ssl_keyfile (the API's certificate, which the operator's metrics listener serves too)",
            ));
        }
        self.logging.validate()?;
        self.monitor.validate()?;
        check_token_entries(&self.auth.tokens, &self.auth.token_digests, "auth.")?;
        self.database.validate()?;
        if self.dispatch.lease.0.as_secs_f64() <= self.nifi.timeout_seconds {
            return Err(invalid(
                "dispatch.lease",
                "must exceed nifi.timeout_seconds",
            ));
        }
        self.dispatch.validate()?;
        self.cleanup.validate()?;
        Ok(())
    }

    /// The database URL with a `postgresql+<driver>://` scheme reduced to `postgresql://`.
    pub fn database_url(&self) -> String {
        self.database.url()
    }

    /// `database.url` with the password of `database.password_file`.
    pub fn database_dsn(&self) -> ledger::Dsn {
        self.database.dsn()
    }

    /// Where the connections that keep session state go: LISTEN, and the standalone leader's
    /// advisory lock. A transaction pooler hands each transaction a server connection of its
    /// choosing, so a session lock taken through it outlives its holder on a connection the
    /// pooler keeps, and a LISTEN hears nothing.
    pub fn session_dsn(&self) -> ledger::Dsn {
        self.listen_dsn()
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

    /// The secrets of this configuration, to scrub from logs: the signing secret and every
    /// signing key's, the database passwords (of `url`, `migration_url` and `listen_dsn`) and the
    /// raw tokens `loadctl` reads (`monitor.*`).
    pub fn secrets(&self) -> Secrets {
        let mut values: Vec<String> = vec![];
        values.extend(self.nifi.signing_secret.clone());
        for key in self.nifi.signing_keys.iter().flatten() {
            values.push(key.secret.clone());
        }
        for url in [
            &self.database.url,
            &self.database.migration_url,
            &self.database.listen_dsn,
        ]
        .into_iter()
        .flatten()
        {
            values.extend(database_passwords(url));
        }
        values.extend(self.monitor.token.clone());
        values.extend(self.monitor.operator_token.clone());
        Secrets::new(values)
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

#[cfg(test)]
mod tests;

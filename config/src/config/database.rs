//! `database`: where the ledger is, the pool, and the password file.
use super::Dur;
use crate::error::{ConfigError, invalid};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `database`: the ledger's PostgreSQL and the connection pool.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// Required: the ledger, a `postgres://` or `postgresql://` URL (a `postgresql+<driver>://`
    /// scheme is accepted, the suffix ignored); `DATABASE_URL` supplies it when nothing else does.
    /// Its password is never logged.
    #[serde(skip_serializing)]
    pub url: Option<String>,
    /// The account `migrate` applies the schema with (DDL, under a session advisory lock: behind
    /// a transaction pooler, a URL straight to PostgreSQL); none: `url`.
    #[serde(skip_serializing)]
    pub migration_url: Option<String>,
    /// The connection that LISTENs for wake-ups and, with `--standalone`, holds the leader's
    /// advisory lock. Both keep session state: behind a transaction pooler (PgBouncer), a URL
    /// straight to PostgreSQL. None: `url`.
    #[serde(skip_serializing)]
    pub listen_dsn: Option<String>,
    /// Connections kept open per process.
    #[schemars(range(min = 1))]
    pub pool_size: u32,
    /// Extra connections above `pool_size`, closed when idle.
    pub max_overflow: u32,
    /// Attempts per transaction on a deadlock or serialization failure (40P01/40001), the first
    /// included.
    #[schemars(range(min = 1))]
    pub tx_attempts: u32,
    /// No pooled connection is used after this age, so that a pool behind a moving service
    /// address ends up on the current primary even if nothing ever fails.
    pub pool_max_lifetime: Dur,
    /// A file (a mounted Secret key) holding the password of `url`'s user, and of `listen_dsn`'s
    /// and of the migration when `migration_url` is unset. Read at start (unreadable or empty:
    /// the start is refused) and again every 5 s: new connections use a rotated password without
    /// a restart, open ones keep their session.
    pub password_file: Option<std::path::PathBuf>,
    /// The role the pods connect as, when it is not named `load_control_api`: `migrate` grants
    /// it what the pods need (schema, tables, sequences, the ledger's functions) after the
    /// migrations. It must exist; none: the migrations grant to `load_control_api` if that exists.
    pub runtime_role: Option<String>,
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
            runtime_role: None,
        }
    }
}

impl DatabaseConfig {
    /// `url` with a `postgresql+<driver>://` scheme reduced to `postgresql://`.
    pub fn url(&self) -> String {
        self.url
            .as_deref()
            .and_then(normalize_database_url)
            .unwrap_or_default()
    }

    /// `url` with the password of `password_file`.
    pub fn dsn(&self) -> ledger::Dsn {
        ledger::Dsn::new(self.url()).with_password_file(self.password_file.clone())
    }

    /// §10.4's checks of the `database` section.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        match &self.url {
            None => return Err(invalid("database.url", "is required (or set DATABASE_URL)")),
            Some(u) if normalize_database_url(u).is_none() => {
                return Err(invalid(
                    "database.url",
                    "must be a postgres:// or postgresql:// URL",
                ));
            }
            _ => {}
        }
        if let Err(e) = self.dsn().file_password() {
            return Err(invalid(
                "database.password_file",
                format!(
                    "cannot be read ({}): {e}",
                    self.password_file
                        .as_deref()
                        .unwrap_or(std::path::Path::new(""))
                        .display()
                ),
            ));
        }
        if self.pool_max_lifetime.0 < std::time::Duration::from_secs(1) {
            return Err(invalid(
                "database.pool_max_lifetime",
                "must be at least 1 second",
            ));
        }
        Ok(())
    }
}

pub fn normalize_database_url(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let base = scheme.split('+').next()?;
    matches!(base, "postgres" | "postgresql").then(|| format!("{base}://{rest}"))
}

//! Where a connection to the ledger's database goes and with which password: a URL and, when the
//! password is rotated, a file holding it (a mounted Secret key, `database.password_file`). The
//! file is read whenever a dedicated connection is opened, and the pool's password is refreshed
//! from it every [`PASSWORD_RECHECK`], so a rotated password is used without a restart: open
//! connections keep the session they authenticated (PostgreSQL never asks again), new ones use the
//! new password, and every connection is renewed within `database.pool_max_lifetime`.
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// How often the pool's password is compared with the file.
pub const PASSWORD_RECHECK: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dsn {
    pub url: String,
    /// A file whose content (one line, surrounding whitespace dropped) replaces the URL's password.
    pub password_file: Option<PathBuf>,
}

impl From<&str> for Dsn {
    fn from(url: &str) -> Dsn {
        Dsn::new(url)
    }
}

impl From<&String> for Dsn {
    fn from(url: &String) -> Dsn {
        Dsn::new(url.as_str())
    }
}

impl From<String> for Dsn {
    fn from(url: String) -> Dsn {
        Dsn::new(url)
    }
}

impl Dsn {
    pub fn new(url: impl Into<String>) -> Dsn {
        Dsn {
            url: url.into(),
            password_file: None,
        }
    }

    pub fn with_password_file(mut self, password_file: Option<PathBuf>) -> Dsn {
        self.password_file = password_file;
        self
    }

    /// The password the file holds now (`None` without a file). An empty file is an error: a
    /// Secret being rewritten is read again at the next check rather than tried as a password.
    pub fn file_password(&self) -> std::io::Result<Option<String>> {
        let Some(path) = &self.password_file else {
            return Ok(None);
        };
        let password = std::fs::read_to_string(path)?.trim().to_string();
        if password.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the file is empty",
            ));
        }
        Ok(Some(password))
    }

    /// The URL's options with the file's password.
    pub fn options(&self) -> Result<PgConnectOptions, sqlx::Error> {
        match self.file_password() {
            Ok(password) => self.options_with(password.as_deref()),
            Err(e) => Err(sqlx::Error::Configuration(
                format!(
                    "database.password_file {}: {e}",
                    self.password_file
                        .as_deref()
                        .unwrap_or(std::path::Path::new(""))
                        .display()
                )
                .into(),
            )),
        }
    }

    /// The URL's options with `password` (read from the file) in place of the URL's.
    pub fn options_with(&self, password: Option<&str>) -> Result<PgConnectOptions, sqlx::Error> {
        let options = PgConnectOptions::from_str(&self.url)?;
        Ok(match password {
            Some(password) => options.password(password),
            None => options,
        })
    }

    /// A dedicated connection (the leader's advisory lock, a migration).
    pub async fn connect(&self) -> Result<PgConnection, sqlx::Error> {
        PgConnection::connect_with(&self.options()?).await
    }

    /// A LISTEN connection. A lost connection is not re-established by the listener (that would
    /// reuse these options, and the password they were made with): `try_recv` answers `Ok(None)`
    /// and the caller makes a new listener, which reads the password file again.
    pub async fn listener(&self) -> Result<PgListener, sqlx::Error> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_with(self.options()?)
            .await?;
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.ignore_pool_close_event(true);
        listener.eager_reconnect(false);
        Ok(listener)
    }
}

/// Keeps the pool's password equal to the file's; `current` is the one the pool was made with.
/// Ends when the last clone of its ledger is dropped (`PasswordRefresh`). A file that cannot be
/// read (a Secret being rewritten, a mount gone) keeps the last password, logged once until it can
/// be read again.
pub(crate) async fn keep_password_fresh(
    pool: PgPool,
    dsn: Dsn,
    mut current: Option<String>,
    options: impl Fn(&Dsn, Option<&str>) -> Result<PgConnectOptions, sqlx::Error> + Send + 'static,
    reloads: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let mut unreadable = false;
    loop {
        tokio::time::sleep(PASSWORD_RECHECK).await;
        if pool.is_closed() {
            return;
        }
        match dsn.file_password() {
            Ok(read) => {
                unreadable = false;
                if read == current {
                    continue;
                }
                match options(&dsn, read.as_deref()) {
                    Ok(new) => {
                        pool.set_connect_options(new);
                        current = read;
                        reloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::info!(
                            event = "database_password_reloaded",
                            file = %dsn.password_file.as_deref().unwrap_or(std::path::Path::new("")).display(),
                            "the database password file changed: new connections use the new password, open ones are kept until renewed (database.pool_max_lifetime)"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(event = "database_password_unreadable", error = %e, "the database password file changed but cannot be used; new connections keep the previous password")
                    }
                }
            }
            Err(e) if !unreadable => {
                unreadable = true;
                tracing::warn!(
                    event = "database_password_unreadable",
                    file = %dsn.password_file.as_deref().unwrap_or(std::path::Path::new("")).display(),
                    error = %e,
                    "cannot read the database password file; new connections keep the previous password"
                );
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_password_replaces_the_urls() {
        let dir = std::env::temp_dir().join(format!("lc-dsn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("password");
        let dsn =
            Dsn::new("postgres://u:old@127.0.0.1:5432/d").with_password_file(Some(file.clone()));
        assert!(dsn.options().is_err(), "a missing file is an error");
        std::fs::write(&file, "new-one\n").unwrap();
        assert_eq!(dsn.file_password().unwrap().as_deref(), Some("new-one"));
        std::fs::write(&file, "  \n").unwrap();
        assert!(
            dsn.file_password().is_err(),
            "an empty file is not a password"
        );
        assert_eq!(
            Dsn::new("postgres://u:old@h/d").file_password().unwrap(),
            None
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

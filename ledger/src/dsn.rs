//! Where a connection to the ledger's database goes and with which password: a URL and, when the
//! password is rotated, a file holding it (a mounted Secret key, `database.password_file`).
//!
//! A rotation changes two things that cannot change at the same instant: the Secret (the file)
//! and the role's password in PostgreSQL. So a password read from the file is used only once
//! PostgreSQL accepts it: until then the password that last opened a connection stays in force.
//! Rotated Secret first, then `ALTER ROLE`, no connection is refused: the file's new password is
//! tried (and refused) until the role has it, and the first refusal of the old one takes the new
//! one at once ([`PoolPassword::follow_file`]). Open connections keep the session they
//! authenticated (PostgreSQL never asks again) and are renewed within `database.pool_max_lifetime`.
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the pool's password is compared with the file.
pub const PASSWORD_RECHECK: Duration = Duration::from_secs(5);

#[derive(Clone, Default)]
pub struct Dsn {
    pub url: String,
    /// A file whose content (one line, surrounding whitespace dropped) replaces the URL's password.
    pub password_file: Option<PathBuf>,
    /// The file's password that last opened a connection, shared by the clones: the one kept
    /// while PostgreSQL refuses a newer one the file holds.
    accepted: Arc<Mutex<Option<String>>>,
}

/// Two DSNs are equal when they name the same place and password file (what was accepted is
/// state, not identity).
impl PartialEq for Dsn {
    fn eq(&self, other: &Dsn) -> bool {
        self.url == other.url && self.password_file == other.password_file
    }
}

impl Eq for Dsn {}

/// Without any password: the URL's is masked and the accepted one left out.
impl std::fmt::Debug for Dsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dsn")
            .field("url", &masked_password(&self.url))
            .field("password_file", &self.password_file)
            .finish_non_exhaustive()
    }
}

/// `url` with the password of its user information (`user:password@`) replaced by `***`.
fn masked_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
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
            accepted: Default::default(),
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
        let password = self.file_password().map_err(|e| self.unreadable(e))?;
        self.options_with(password.as_deref())
    }

    /// The URL's options with `password` (read from the file) in place of the URL's.
    pub fn options_with(&self, password: Option<&str>) -> Result<PgConnectOptions, sqlx::Error> {
        let options = PgConnectOptions::from_str(&self.url)?;
        Ok(match password {
            Some(password) => options.password(password),
            None => options,
        })
    }

    /// A dedicated connection (the leader's advisory lock, a migration): with the file's
    /// password, or, while PostgreSQL refuses that one, with the one it last accepted.
    pub async fn connect(&self) -> Result<PgConnection, sqlx::Error> {
        self.connect_shaped(|o| o).await
    }

    /// [`Dsn::connect`] with `shape` applied to the options (an application name, TLS).
    pub async fn connect_shaped(
        &self,
        shape: impl Fn(PgConnectOptions) -> PgConnectOptions,
    ) -> Result<PgConnection, sqlx::Error> {
        Ok(self.connect_accepted(shape).await?.0)
    }

    /// A connection, and the password that opened it: the file's, or while PostgreSQL refuses
    /// that one (or the file cannot be read), the one this DSN or a clone of it last opened a
    /// connection with (a rotation half done: the Secret ahead of the role).
    async fn connect_accepted(
        &self,
        shape: impl Fn(PgConnectOptions) -> PgConnectOptions,
    ) -> Result<(PgConnection, Option<String>), sqlx::Error> {
        let previous = self.accepted.lock().expect("not poisoned").clone();
        let file = match (self.file_password(), &previous) {
            (Ok(file), _) => file,
            (Err(e), Some(_)) => {
                tracing::warn!(event = "database_password_unreadable", error = %e, "cannot read the database password file; connecting with the password last accepted");
                previous.clone()
            }
            (Err(e), None) => return Err(self.unreadable(e)),
        };
        let refused =
            match PgConnection::connect_with(&shape(self.options_with(file.as_deref())?)).await {
                Ok(conn) => {
                    self.accept(file.clone());
                    return Ok((conn, file));
                }
                Err(e) if password_refused(&e) => e,
                Err(e) => return Err(e),
            };
        match previous {
            Some(previous) if Some(&previous) != file.as_ref() => {
                tracing::info!(
                    event = "database_password_previous_used",
                    "PostgreSQL refuses the database password file's password (the role not altered yet?): connecting with the one it accepted before"
                );
                let options = shape(self.options_with(Some(&previous))?);
                let conn = PgConnection::connect_with(&options).await?;
                Ok((conn, Some(previous)))
            }
            _ => Err(refused),
        }
    }

    fn unreadable(&self, e: std::io::Error) -> sqlx::Error {
        sqlx::Error::Configuration(
            format!(
                "database.password_file {}: {e}",
                self.password_file
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display()
            )
            .into(),
        )
    }

    fn accept(&self, password: Option<String>) {
        if password.is_some() {
            *self.accepted.lock().expect("not poisoned") = password;
        }
    }

    /// A LISTEN connection. A lost connection is not re-established by the listener (that would
    /// reuse these options, and the password they were made with): `try_recv` answers `Ok(None)`
    /// and the caller makes a new listener, which reads the password file again.
    pub async fn listener(&self) -> Result<PgListener, sqlx::Error> {
        let (probe, password) = self.connect_accepted(|o| o).await?;
        drop(probe.close().await);
        let options = self.options_with(password.as_deref())?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_with(options)
            .await?;
        let mut listener = PgListener::connect_with(&pool).await?;
        listener.ignore_pool_close_event(true);
        listener.eager_reconnect(false);
        Ok(listener)
    }
}

/// PostgreSQL refused the password (or the role's sign-in): `invalid_password` or
/// `invalid_authorization_specification`.
pub(crate) fn password_refused(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("28P01" | "28000")))
}

/// The pool's password, following the file: a new one is taken once PostgreSQL accepts it.
pub(crate) struct PoolPassword {
    pool: PgPool,
    dsn: Dsn,
    options: fn(&Dsn, Option<&str>) -> Result<PgConnectOptions, sqlx::Error>,
    /// Held across a check: concurrent refusals wait for one check instead of each probing.
    state: tokio::sync::Mutex<PasswordState>,
    /// How many new passwords the pool took: also which one it has now.
    reloads: AtomicU64,
    /// How many checks of the file were begun: a caller refused before the last one began takes
    /// its result instead of checking again (a check begun after a refusal sees the role as
    /// PostgreSQL had it then).
    checks: AtomicU64,
}

/// How long a new password's probe may take (as long as the pool waits for a connection).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct PasswordState {
    /// The pool's password now.
    current: Option<String>,
    /// The file could not be read at the last check (logged once until it can).
    unreadable: bool,
    /// A password of the file PostgreSQL refused (logged once per password).
    refused: Option<String>,
    /// A password of the file that could not be tried (logged once per password).
    untried: Option<String>,
}

impl PoolPassword {
    pub(crate) fn new(
        pool: PgPool,
        dsn: Dsn,
        current: Option<String>,
        options: fn(&Dsn, Option<&str>) -> Result<PgConnectOptions, sqlx::Error>,
    ) -> PoolPassword {
        PoolPassword {
            pool,
            dsn,
            options,
            state: tokio::sync::Mutex::new(PasswordState {
                current,
                ..Default::default()
            }),
            reloads: AtomicU64::new(0),
            checks: AtomicU64::new(0),
        }
    }

    /// How many checks of the file were made (see [`PoolPassword::follow_file`]).
    pub(crate) fn checks(&self) -> u64 {
        self.checks.load(Ordering::Relaxed)
    }

    /// How many new passwords the pool took: a caller refused with the password of one
    /// generation may try again under a later one.
    pub(crate) fn generation(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Compares the pool's password with the file's and takes the file's when PostgreSQL accepts
    /// it (tried on a connection of its own, for [`PROBE_TIMEOUT`] at most). A file that cannot
    /// be read, or whose password is refused or cannot be tried, keeps the pool's password.
    /// `seen` is [`PoolPassword::checks`] when the caller was refused: a check begun since
    /// answers for it too, so a burst of refusals costs one probe.
    pub(crate) async fn follow_file(&self, seen: u64) {
        let mut state = self.state.lock().await;
        if self.checks() != seen {
            return;
        }
        self.checks.fetch_add(1, Ordering::Relaxed);
        let file = self
            .dsn
            .password_file
            .as_deref()
            .unwrap_or(std::path::Path::new(""));
        let read = match self.dsn.file_password() {
            Ok(read) => read,
            Err(e) => {
                if !std::mem::replace(&mut state.unreadable, true) {
                    tracing::warn!(
                        event = "database_password_unreadable",
                        file = %file.display(),
                        error = %e,
                        "cannot read the database password file; new connections keep the previous password"
                    );
                }
                return;
            }
        };
        state.unreadable = false;
        if read == state.current {
            return;
        }
        let new = match (self.options)(&self.dsn, read.as_deref()) {
            Ok(new) => new,
            Err(e) => {
                tracing::warn!(event = "database_password_unreadable", error = %e, "the database password file changed but cannot be used; new connections keep the previous password");
                return;
            }
        };
        match tokio::time::timeout(PROBE_TIMEOUT, PgConnection::connect_with(&new)).await {
            Ok(Ok(probe)) => drop(probe.close().await),
            Ok(Err(e)) if password_refused(&e) => {
                if state.refused != read {
                    state.refused = read;
                    tracing::info!(
                        event = "database_password_not_yet_accepted",
                        file = %file.display(),
                        "the database password file changed, but PostgreSQL refuses its password (the role not altered yet?): new connections keep the previous password, and the file's is tried again every 5 s and at the first refusal of the previous"
                    );
                }
                return;
            }
            // Nothing learnt (the database unreachable or full): the next check tries again.
            outcome => {
                if state.untried != read {
                    state.untried = read;
                    let error = match outcome {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no connection within {PROBE_TIMEOUT:?}"),
                    };
                    tracing::warn!(
                        event = "database_password_untried",
                        error = %error,
                        "the database password file changed, but its password could not be tried: new connections keep the previous password, and it is tried again every 5 s"
                    );
                }
                return;
            }
        }
        self.pool.set_connect_options(new);
        self.dsn.accept(read.clone());
        state.current = read;
        state.refused = None;
        state.untried = None;
        self.reloads.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            event = "database_password_reloaded",
            file = %file.display(),
            "the database password file changed and PostgreSQL accepts it: new connections use the new password, open ones are kept until renewed (database.pool_max_lifetime)"
        );
    }
}

/// Checks the file every [`PASSWORD_RECHECK`]; ends when the pool is closed or the last clone of
/// its ledger dropped (`PasswordRefresh` aborts it).
pub(crate) async fn keep_password_fresh(password: Arc<PoolPassword>) {
    loop {
        tokio::time::sleep(PASSWORD_RECHECK).await;
        if password.pool.is_closed() {
            return;
        }
        password.follow_file(password.checks()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dsn_shows_no_password() {
        let dsn = Dsn::new("postgres://u:secret@h:5432/d");
        dsn.accept(Some("accepted-secret".into()));
        let shown = format!("{dsn:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("postgres://u:***@h:5432/d"), "{shown}");
        assert_eq!(
            masked_password("postgres://u@h/d"),
            "postgres://u@h/d",
            "no password, nothing masked"
        );
    }

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

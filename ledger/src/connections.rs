//! Which pooled connections may still be trusted with a write.
//!
//! Behind a replicated PostgreSQL the service address moves on failover and switchover, but
//! established connections do not follow it (a Kubernetes Service keeps them): a pool that kept
//! them would fail every write against the old primary, now a read-only standby, for as long as
//! traffic keeps them busy. So an error meaning "this server cannot take writes now" retires every
//! connection opened before it, a new connection is refused unless its server takes writes, and no
//! connection outlives `database.pool_max_lifetime`.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a database error says about the server behind the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseFault {
    /// The connection or the server went away (I/O error, closed pool, timeout acquiring).
    Unreachable,
    /// The server is a standby or read-only (`25006`, recovery): writes must go elsewhere.
    ReadOnly,
    /// The server is shutting down or starting up (`57P01`–`57P03`, class `08`).
    Shutdown,
    /// A lock or statement timeout, a deadlock or serialization failure: this server is fine.
    Contention,
    /// Anything else (a data error, a bug): nothing to say about the server.
    Other,
}

impl DatabaseFault {
    pub fn of(e: &sqlx::Error) -> DatabaseFault {
        match e {
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
                DatabaseFault::Unreachable
            }
            sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => DatabaseFault::Unreachable,
            sqlx::Error::Database(db) => match db.code().as_deref() {
                Some("25006") => DatabaseFault::ReadOnly,
                Some("57P01" | "57P02" | "57P03") => DatabaseFault::Shutdown,
                Some(c) if c.starts_with("08") => DatabaseFault::Shutdown,
                Some("40P01" | "40001" | "55P03" | "57014") => DatabaseFault::Contention,
                _ => DatabaseFault::Other,
            },
            _ => DatabaseFault::Other,
        }
    }

    /// Whether the connection that saw it points at a server that cannot take writes now.
    pub fn retires_connections(self) -> bool {
        matches!(self, DatabaseFault::ReadOnly | DatabaseFault::Shutdown)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DatabaseFault::Unreachable => "unreachable",
            DatabaseFault::ReadOnly => "read_only",
            DatabaseFault::Shutdown => "shutdown",
            DatabaseFault::Contention => "contention",
            DatabaseFault::Other => "other",
        }
    }
}

/// The pool's retirement line: connections opened before it are closed instead of being handed
/// out again (checked when a connection is acquired and when it is released).
#[derive(Debug, Clone)]
pub struct Retirement {
    origin: Instant,
    /// Milliseconds after `origin`; 0 = nothing retired yet.
    retire_before_ms: Arc<AtomicU64>,
    retired_total: Arc<AtomicU64>,
}

impl Default for Retirement {
    fn default() -> Self {
        Retirement {
            origin: Instant::now(),
            retire_before_ms: Arc::new(AtomicU64::new(0)),
            retired_total: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Retirement {
    /// Every connection opened until now is retired.
    pub fn retire_all(&self, fault: DatabaseFault) {
        let now = self.origin.elapsed().as_millis() as u64 + 1;
        let before = self.retire_before_ms.fetch_max(now, Ordering::AcqRel);
        if before < now.saturating_sub(1_000) {
            // Logged once per burst, not once per failing request.
            tracing::warn!(
                event = "db_connections_retired",
                fault = fault.as_str(),
                "the database cannot take writes through the pooled connections; reconnecting through the service address"
            );
        }
    }

    /// Whether a connection of this age must be closed rather than used.
    pub fn is_retired(&self, age: Duration) -> bool {
        let line = self.retire_before_ms.load(Ordering::Acquire);
        if line == 0 {
            return false;
        }
        let opened_ms = self.origin.elapsed().saturating_sub(age).as_millis() as u64;
        let retired = opened_ms < line;
        if retired {
            self.retired_total.fetch_add(1, Ordering::Relaxed);
        }
        retired
    }

    /// Connections closed by retirement so far (`lc_db_connections_retired_total`).
    pub fn retired_total(&self) -> u64 {
        self.retired_total.load(Ordering::Relaxed)
    }
}

/// The connection itself is gone (its server closed it, or the socket broke), not the statement
/// refused: `Ledger::begin` may take another connection.
pub(crate) fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("57P01" | "57P02")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connections_opened_before_the_line_are_retired() {
        let r = Retirement::default();
        std::thread::sleep(Duration::from_millis(5));
        assert!(
            !r.is_retired(Duration::from_millis(4)),
            "nothing retired yet"
        );
        r.retire_all(DatabaseFault::ReadOnly);
        // Opened at the origin: before the line.
        assert!(r.is_retired(r.origin.elapsed()));
        std::thread::sleep(Duration::from_millis(5));
        // Opened just now: after the line.
        assert!(!r.is_retired(Duration::ZERO));
        assert_eq!(r.retired_total(), 1);
    }

    #[test]
    fn only_faults_of_the_server_retire_connections() {
        assert!(DatabaseFault::ReadOnly.retires_connections());
        assert!(DatabaseFault::Shutdown.retires_connections());
        assert!(!DatabaseFault::Contention.retires_connections());
        assert!(!DatabaseFault::Other.retires_connections());
        assert_eq!(
            DatabaseFault::of(&sqlx::Error::PoolTimedOut),
            DatabaseFault::Unreachable
        );
    }
}

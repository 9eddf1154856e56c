//! Lock waits seen from outside while a migration runs: every 50 ms, the sessions of the ledger's
//! database waiting for a lock and for how long their statement has run. The migration's session
//! (`ledger::migrate::APPLICATION_NAME`) is told apart from everyone else's (NiFi's writes through
//! the api-server, the operator), and its statement named by the migration file it runs.
use serde::Serialize;
use sqlx::Connection;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The longest lock waits seen (a statement's age while it waited for a lock).
#[derive(Clone, Debug, Default, Serialize)]
pub struct LockWaits {
    /// Migration version → the longest wait of its statement.
    pub migrations: BTreeMap<i64, f64>,
    /// The longest wait of any other session, and its statement (cut to 120 chars).
    pub others_longest_seconds: f64,
    pub others_longest_query: String,
    pub samples: u64,
}

pub struct LockWatch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<LockWaits>>,
}

/// The migration whose SQL the statement text begins. PostgreSQL cuts the text it shows at
/// `track_activity_query_size` (1 kB by default), so the whole shown text is the prefix: the
/// online migrations share a header longer than any shorter cut, and a text that more than one
/// migration begins with names none.
fn migration_of(query: &str) -> Option<i64> {
    let shown = query.trim();
    if shown.is_empty() {
        return None;
    }
    let mut begun = ledger::migrate::MIGRATOR
        .iter()
        .filter(|m| m.sql.as_str().trim().starts_with(shown));
    match (begun.next(), begun.next()) {
        (Some(m), None) => Some(m.version),
        _ => None,
    }
}

impl LockWatch {
    pub async fn start(url: &str) -> anyhow::Result<LockWatch> {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut w = LockWaits::default();
            while !stopped.load(Ordering::Relaxed) {
                let waiting: Vec<(String, String, f64)> = sqlx::query_as(
                    "SELECT application_name, query, \
                            extract(epoch FROM clock_timestamp() - query_start)::float8 \
                       FROM pg_stat_activity \
                      WHERE datname = current_database() AND wait_event_type = 'Lock' \
                        AND pid <> pg_backend_pid() AND query_start IS NOT NULL",
                )
                .fetch_all(&mut conn)
                .await?;
                w.samples += 1;
                for (app, query, waited) in waiting {
                    if app == ledger::migrate::APPLICATION_NAME {
                        let at = w
                            .migrations
                            .entry(migration_of(&query).unwrap_or(-1))
                            .or_default();
                        *at = at.max(waited);
                    } else if waited > w.others_longest_seconds {
                        w.others_longest_seconds = waited;
                        w.others_longest_query = query.chars().take(120).collect();
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(w)
        });
        Ok(LockWatch { stop, task })
    }

    pub async fn finish(self) -> anyhow::Result<LockWaits> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}

/// One applied migration: how long it took (sqlx's `execution_time`, the attempt that succeeded)
/// and the longest lock wait seen while it ran.
#[derive(Clone, Debug, Serialize)]
pub struct MigrationFigure {
    pub version: i64,
    pub description: String,
    pub seconds: f64,
    pub longest_lock_wait_seconds: f64,
}

/// The migrations applied after `after` (a version), with their durations and lock waits.
pub async fn migrations_applied_after(
    conn: &mut sqlx::PgConnection,
    after: i64,
    waits: &LockWaits,
) -> anyhow::Result<Vec<MigrationFigure>> {
    let rows: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT version, description, execution_time FROM _sqlx_migrations \
          WHERE version > $1 ORDER BY version",
    )
    .bind(after)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(version, description, ns)| MigrationFigure {
            version,
            description,
            seconds: ns as f64 / 1e9,
            longest_lock_wait_seconds: waits.migrations.get(&version).copied().unwrap_or(0.0),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_statement_is_named_by_the_migration_it_begins() {
        // Every migration, cut as PostgreSQL shows it: the online ones share a long header.
        for m in ledger::migrate::MIGRATOR.iter() {
            let shown: String = m.sql.as_str().chars().take(1023).collect();
            assert_eq!(
                super::migration_of(&shown),
                Some(m.version),
                "{}",
                m.description
            );
        }
        assert_eq!(
            super::migration_of("UPDATE nifi_ops.load_run SET x = 1"),
            None
        );
        assert_eq!(super::migration_of(""), None);
    }
}

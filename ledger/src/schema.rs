//! The schema version contract (docs/operations.md, "Schema versions, upgrades and rollbacks").
//!
//! `migrate` writes the schema version its migrations produce ([`SCHEMA_VERSION`]) into
//! `nifi_ops.schema_version`, raising it and never lowering it. Every process reads it at start, on
//! each readiness probe and, before a write, when its last reading is older than
//! [`SCHEMA_RECHECK`]; outside [`SUPPORTED_SCHEMA`] it neither serves (readiness fails with
//! [`SchemaMismatch`]'s message) nor writes (every ledger write is refused with
//! [`crate::LedgerError::SchemaUnsupported`]).
//!
//! Migrations follow expand/contract: the schema of the next release never breaks this release's
//! binary (it only adds: tables, nullable or defaulted columns, indexes), so a binary runs on its
//! own schema version and on the next one — which is what a rolling upgrade and a rollback of one
//! release need. Whatever a release stops using is dropped one release later at the earliest.
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The schema version this binary's migrations produce. Raised by one in the first migration of a
/// release that adds migrations (and recorded in [`SCHEMA_HISTORY`]); never more than once per
/// release.
pub const SCHEMA_VERSION: i32 = 1;

/// The schema versions this binary runs on: its own, and the next release's (which, by the
/// expand/contract rule, only adds to it).
pub const SUPPORTED_SCHEMA: RangeInclusive<i32> = SCHEMA_VERSION..=SCHEMA_VERSION + 1;

/// Every schema version with the newest migration it includes, oldest first. Version 0 is the
/// unversioned schema of release 0.1.0 (no `schema_version` row). A new migration belongs to the
/// last entry: its version is changed there, or a new entry is added with [`SCHEMA_VERSION`]
/// raised (the `schema_history_names_the_newest_migration` test refuses anything else).
pub const SCHEMA_HISTORY: &[(i32, i64)] = &[(0, 20261203000003), (1, 20261207000026)];

/// How long a reading of the schema version is trusted before a write reads it again.
pub const SCHEMA_RECHECK: Duration = Duration::from_secs(30);

/// The database's schema version is outside what this binary runs on. The message names both and
/// what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaMismatch {
    pub database: i32,
    pub supported: RangeInclusive<i32>,
}

impl std::fmt::Display for SchemaMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (min, max) = (self.supported.start(), self.supported.end());
        let binary = concat!("load-control ", env!("CARGO_PKG_VERSION"));
        if self.database > *max {
            write!(
                f,
                "database schema version {} is newer than this binary ({binary}) supports (≤{max}): \
                 roll forward to a release that supports it, or restore the database from before \
                 the upgrade",
                self.database
            )
        } else {
            write!(
                f,
                "database schema version {} is older than this binary ({binary}) needs (≥{min}): \
                 run `load-control-api migrate` of this release (the chart's migration hook)",
                self.database
            )
        }
    }
}

impl std::error::Error for SchemaMismatch {}

/// `Ok` when `version` is in [`SUPPORTED_SCHEMA`].
pub fn judge(version: i32) -> std::result::Result<(), SchemaMismatch> {
    if SUPPORTED_SCHEMA.contains(&version) {
        Ok(())
    } else {
        Err(SchemaMismatch {
            database: version,
            supported: SUPPORTED_SCHEMA,
        })
    }
}

/// The last reading of the schema version, shared by every clone of a `Ledger`.
#[derive(Debug, Clone)]
pub(crate) struct SchemaGate {
    last: Arc<Mutex<Option<(Instant, i32)>>>,
    pub(crate) recheck: Duration,
}

impl Default for SchemaGate {
    fn default() -> Self {
        SchemaGate {
            last: Default::default(),
            recheck: SCHEMA_RECHECK,
        }
    }
}

impl SchemaGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, i32)>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn record(&self, version: i32) {
        *self.lock() = Some((Instant::now(), version));
    }

    /// The last reading when it is recent enough to be trusted.
    pub(crate) fn fresh(&self) -> Option<i32> {
        self.lock()
            .filter(|(at, _)| at.elapsed() < self.recheck)
            .map(|(_, v)| v)
    }
}

/// `SELECT version FROM nifi_ops.schema_version` on `conn`; 0 when there is no row or no table
/// (a schema migrated by release 0.1.0, or not at all).
// COMPAT(unversioned-schema, 0.3.0): 0.1.0's ledger has no version row; from 0.3.0 on it is
// upgraded through 0.2.0 first, and a missing row means "not migrated" only.
pub async fn read_version(conn: &mut sqlx::PgConnection) -> std::result::Result<i32, sqlx::Error> {
    let row: std::result::Result<Option<(i32,)>, sqlx::Error> =
        sqlx::query_as("SELECT version FROM nifi_ops.schema_version")
            .fetch_optional(&mut *conn)
            .await;
    match row {
        Ok(row) => Ok(row.map_or(0, |r| r.0)),
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01") => Ok(0),
        Err(e) => Err(e),
    }
}

//! Every refusal a ledger operation can give. The api-server maps each variant to the contract's
//! HTTP status and code in one place (CONTRACT §3.7); nothing here knows HTTP.
use crate::status::{DispatchStatus, PartitionStatus, RunStatus};

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("run not found")]
    RunNotFound,
    #[error("partition not found")]
    PartitionNotFound,
    #[error("dispatch not found")]
    DispatchNotFound,
    #[error("an active run exists for {job_key}/{business_key}")]
    DuplicateActiveRun {
        job_key: String,
        business_key: String,
    },
    #[error("run is {run_status}")]
    RunStatusMismatch {
        run_status: RunStatus,
        stage: Option<String>,
    },
    #[error("claim token does not own the partition")]
    ClaimMismatch,
    #[error("chunk differs from the one recorded for a succeeded partition")]
    ChunkConflict,
    #[error("dispatch does not belong to this run's validation")]
    DispatchMismatch,
    #[error("publish token does not own the publish")]
    PublishTokenMismatch,
    #[error("partition is {partition_status}")]
    PartitionStatusMismatch { partition_status: PartitionStatus },
    #[error("dispatch is {status}")]
    DispatchStatusMismatch { status: DispatchStatus },
    #[error("run is not due for cleanup ({run_status})")]
    CleanupNotDue { run_status: RunStatus },
    #[error("job {job_key} is suspended")]
    JobSuspended { job_key: String },
    #[error("job {job_key} is not registered")]
    JobNotRegistered { job_key: String },
    #[error("fail transition {expected} -> {fail} is not allowed")]
    FailTransitionNotAllowed {
        expected: RunStatus,
        fail: RunStatus,
    },
    #[error("manifest invalid: {}", violations.join("; "))]
    ManifestInvalid { violations: Vec<String> },
    #[error("invalid hdfsRoot")]
    InvalidHdfsRoot,
    #[error("chunkIndex out of range")]
    ChunkIndexOutOfRange,
    #[error("hdfsPath outside the run directory")]
    HdfsPathOutsideRun,
    #[error("unique constraint violated ({constraint:?})")]
    UniqueViolation { constraint: Option<String> },
    #[error("referenced row not found ({constraint:?})")]
    ReferenceNotFound { constraint: Option<String> },
    #[error("constraint violated ({constraint:?})")]
    ConstraintViolation { constraint: Option<String> },
    /// This process's leadership epoch is no longer the current one: it wrote nothing (§7.1).
    #[error("fenced: epoch {ours} is not the current epoch {current:?}")]
    Fenced { ours: i64, current: Option<i64> },
    /// The ledger holds an older past than this process saw (`crate::ops::continuity`): a restore
    /// from backup or a failover that lost commits. Nothing was written.
    #[error("{0}")]
    WentBack(crate::continuity::WentBack),
    /// A chunk report's verdict ends the run: roll back and re-run under the run row's FOR UPDATE
    /// (§5.3 rule 6). Never leaves the ledger.
    #[error("escalate to an exclusive run lock")]
    Escalate,
    /// A row the ledger itself wrote is not what the schema allows (a bug, not a client mistake).
    #[error("ledger invariant broken: {0}")]
    Corrupt(String),
    /// The server cannot take writes now (a standby, read-only): found by the readiness check.
    #[error("the database cannot take writes: it {0}")]
    Unwritable(String),
    /// This binary does not run on the database's schema version: it writes nothing, and its
    /// readiness fails (`crate::schema`). The message names both versions and what to do.
    #[error("{0}")]
    SchemaUnsupported(crate::schema::SchemaMismatch),
    /// Another installation (release) owns this ledger and refreshed its claim recently: this
    /// process does not lead (`crate::ops::owner`). The message names both and what to do.
    #[error("{0}")]
    OwnedByOther(crate::owner::OwnerConflict),
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
}

impl LedgerError {
    /// SQLSTATE 40P01 (deadlock) and 40001 (serialization failure) re-run the whole transaction.
    pub fn is_retryable(&self) -> bool {
        matches!(self, LedgerError::Database(sqlx::Error::Database(db))
            if matches!(db.code().as_deref(), Some("40P01") | Some("40001")))
    }
}

impl From<sqlx::Error> for LedgerError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            let constraint = db.constraint().map(str::to_string);
            match db.code().as_deref() {
                Some("23505") => return LedgerError::UniqueViolation { constraint },
                Some("23503") => return LedgerError::ReferenceNotFound { constraint },
                Some(c) if c.starts_with("23") => {
                    return LedgerError::ConstraintViolation { constraint };
                }
                _ => {}
            }
        }
        LedgerError::Database(e)
    }
}

/// The ledger's result. Named `Result` (the error defaulting to [`LedgerError`]) so that tools which
/// read signatures by name see a `Result`: cargo-mutants then mutates an operation's body into
/// `Ok(…)` of its value, which it cannot for an alias of another name (its mutants of
/// `LedgerResult<T>` were all unviable). Two-parameter uses still name their error.
pub type Result<T, E = LedgerError> = std::result::Result<T, E>;

// COMPAT(ledger-result-alias, 0.3.0): the result type's earlier name, for code written against it.
pub type LedgerResult<T> = Result<T>;

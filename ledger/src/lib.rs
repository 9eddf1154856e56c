//! The load-control ledger: the domain (the run state machine of `machine`, partition and dispatch
//! statuses, manifest invariants, the metric judge) and the PostgreSQL store that applies it as
//! compare-and-set transactions. Every decision is made here or in the server-side functions of
//! `ledger/functions/` that this crate calls (the chunk report, the gate, a partition's success, the
//! completion, the claim, the validation start, every status change): docs/architecture.md names
//! the one place of each rule. Nothing here knows HTTP or Kubernetes.
pub mod connections;
mod continuity;
pub mod decimal;
pub mod dsn;
pub mod error;
pub mod event;
pub mod functions;
mod job_thresholds;
pub mod json;
pub mod judge;
pub mod machine;
pub mod manifest;
pub mod migrate;
mod notify;
pub mod ops;
mod owner;
mod run_lock;
pub mod schema;
pub mod settings;
pub mod status;
pub mod store;
pub mod text;
mod transactions;

pub use continuity::WentBack;
pub use decimal::Decimal38;
pub use dsn::Dsn;
pub use error::{LedgerError, LedgerResult};
pub use event::Actor;
pub use manifest::{Manifest, ManifestPartition};
pub use ops::chunk::{ChunkOutcome, ChunkReport, ChunkResult};
pub use ops::claim::ClaimOutcome;
pub use ops::cleanup::{CleanupCandidate, CleanupRecorded};
pub use ops::create::{CreatedRun, NewRun};
pub use ops::dispatch::{DispatchRequest, Gauges, LeasedDispatch, Recorded, SendOutcome};
pub use ops::fence::Fence;
pub use ops::history::HistoryReport;
pub use ops::jobs::{JobSummary, JobWrite, MirroredRun, RunBrief};
pub use ops::leader::LEADER_NAME;
pub use ops::manifest::{DispatchPartition, ManifestOutcome};
pub use ops::monitor::{Alert, EventView, MonitorSummary};
pub use ops::operator::{CancelOutcome, ResendOutcome};
pub use ops::partition_fail::{PartitionFailOutcome, PartitionFailure};
pub use ops::publish::{PublishClaim, StatusChange};
pub use ops::read::{RunDetail, RunFilter, RunSummary};
pub use ops::run_fail::{RunFailOutcome, RunFailure};
pub use ops::sweeper::{RUNS_HELD_PER_TRANSACTION, SweepReport};
pub use ops::validation::{
    MetricItem, MetricStage, MetricView, MetricsRecorded, StageVerdict, StartOutcome,
    SuccessVerdict,
};
pub use owner::{MIN_OWNER_STALE, OwnerConflict, default_owner_stale};
pub use schema::{SCHEMA_VERSION, SUPPORTED_SCHEMA, SchemaMismatch};
pub use status::{DispatchStatus, DispatchType, PartitionStatus, RunStatus};
pub use store::{Ledger, LedgerConfig, LockWaitObserver};

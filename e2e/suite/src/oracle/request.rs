//! The requests of CONTRACT §4 as values (what a request means), and how each is written on the
//! wire (which of the forms §3.2 accepts: numbers as JSON strings as NiFi's AttributesToJSON
//! sends them, snake_case names, UUID spellings, optional fields absent or `null`).
use serde_json::{Map, Value};
use uuid::Uuid;

/// An optional request field: left out, sent as JSON `null`, or given.
#[derive(Clone, Debug, PartialEq)]
pub enum Opt<T> {
    Absent,
    Null,
    Some(T),
}

impl<T> Opt<T> {
    pub fn value(&self) -> Option<&T> {
        match self {
            Opt::Some(v) => Some(v),
            _ => None,
        }
    }
}

/// Which run a request names: one the model knows (by creation order) or an id no run has.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    Run(usize),
    Missing(Uuid),
}

/// A decimal bound or SCN as sent: its text, and whether it goes out as a JSON number (only
/// for texts that are canonical and fit an i64, so the JSON stays valid and exact).
#[derive(Clone, Debug)]
pub struct Decimal {
    pub text: String,
    pub as_number: bool,
}

#[derive(Clone, Debug)]
pub struct PartitionItem {
    pub partition_id: String,
    pub lower: Opt<Decimal>,
    pub upper: Opt<Decimal>,
    pub upper_inclusive: Option<bool>,
    pub is_null: Option<bool>,
    pub expected: i64,
}

#[derive(Clone, Debug)]
pub struct ManifestReq {
    pub snapshot_scn: Opt<Decimal>,
    pub source_count: i64,
    pub source_null_split_count: Option<i64>,
    pub source_min_split: Opt<Decimal>,
    pub source_max_split: Opt<Decimal>,
    pub planned: i64,
    pub source_metrics: Option<Vec<(String, String)>>,
    pub source_metrics_version: Option<String>,
    pub partitions: Vec<PartitionItem>,
}

#[derive(Clone, Debug)]
pub struct ChunkReq {
    pub token: Uuid,
    pub index: i64,
    pub count: i64,
    pub fragment: Opt<String>,
    pub path: String,
    pub records: i64,
    pub bytes: Opt<i64>,
}

#[derive(Clone, Debug)]
pub struct MetricReq {
    pub name: String,
    pub expected: Opt<String>,
    pub actual: Opt<String>,
    pub tolerance: Opt<String>,
    pub result: String,
    pub details: Option<Value>,
}

#[derive(Clone, Debug)]
pub enum Op {
    Create {
        job: String,
        business_key: String,
        hdfs_root: String,
        prefix: String,
        allow_empty: Option<bool>,
        parameters: Option<Map<String, Value>>,
    },
    Manifest(Target, ManifestReq),
    RunFail {
        run: Target,
        expected: String,
        fail: String,
        stage: String,
        code: String,
        message: Option<String>,
    },
    Claim {
        run: Target,
        pid: String,
        token: Uuid,
        worker: String,
    },
    Chunk(Target, String, ChunkReq),
    PartitionFail {
        run: Target,
        pid: String,
        token: Uuid,
        stage: String,
        class: String,
        code: String,
        message: Option<String>,
        attempt: Opt<i64>,
    },
    ValidationStart {
        run: Target,
        dispatch: Uuid,
        node: Option<String>,
    },
    Validations {
        run: Target,
        stage: String,
        query_version: Option<String>,
        metrics: Vec<MetricReq>,
    },
    StageValidated(Target),
    PublishClaim(Target, Uuid),
    PublishResult {
        run: Target,
        token: Uuid,
        outcome: String,
        error_code: Opt<String>,
        message: Option<String>,
    },
    Success(Target, Opt<i64>),
    Resend(Target, Uuid),
    Resolve {
        run: Target,
        resolution: String,
        reason: String,
    },
    Cancel(Target, String),
    CleanupCandidates {
        job: String,
        limit: Option<i64>,
    },
    Cleanup {
        run: Target,
        dropped: Opt<String>,
        deleted: Opt<String>,
        operator: bool,
    },
    GetRun(Target, bool),
    ListRuns {
        job: String,
        business_key: Option<String>,
        status: Option<String>,
        limit: Option<i64>,
    },
    Events(Target, Option<i64>),
    GetValidations(Target),
}

impl Op {
    /// The operation's name, for the coverage tally.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Create { .. } => "create",
            Op::Manifest(..) => "manifest",
            Op::RunFail { .. } => "run fail",
            Op::Claim { .. } => "claim",
            Op::Chunk(..) => "chunks",
            Op::PartitionFail { .. } => "partition fail",
            Op::ValidationStart { .. } => "validation start",
            Op::Validations { .. } => "validations",
            Op::StageValidated(_) => "stage-validated",
            Op::PublishClaim(..) => "publish claim",
            Op::PublishResult { .. } => "publish result",
            Op::Success(..) => "success",
            Op::Resend(..) => "resend",
            Op::Resolve { .. } => "resolve",
            Op::Cancel(..) => "cancel",
            Op::CleanupCandidates { .. } => "cleanup candidates",
            Op::Cleanup { .. } => "cleanup",
            Op::GetRun(..) => "GET run",
            Op::ListRuns { .. } => "GET runs",
            Op::Events(..) => "GET events",
            Op::GetValidations(_) => "GET validations",
        }
    }
}

/// How a request is spelled on the wire.
#[derive(Clone, Copy, Debug)]
pub struct Enc {
    /// Integers and booleans as JSON strings (`"7"`, `"false"`), as NiFi's manifest sends them.
    pub strings: bool,
    /// Field names in snake_case (`job_key`) instead of camelCase.
    pub snake: bool,
    /// 0: lower-case hyphenated, 1: upper-case hyphenated, 2: 32 hex digits (§3.2 UUID forms).
    pub uuid_form: u8,
}

#[derive(Clone, Debug)]
pub struct Request {
    pub op: Op,
    pub enc: Enc,
}

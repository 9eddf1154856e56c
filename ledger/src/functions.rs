//! The server-side functions of `nifi_ops`: one file per function in `ledger/functions/`, its
//! current definition. `migrate` applies a file after the migrations when its hash differs from the
//! one `nifi_ops.server_function` records (history stays in `migrations/`).
//!
//! A released file is never edited (ledger/tests/schema_version.rs compares the files with every
//! release of `RELEASES`): the previous release's pods run beside this schema during an upgrade and
//! after a rollback, and they call the functions by name, so a changed body or a new outcome would
//! change what they run. A new behaviour is a new function (`report_chunk_v2` after
//! `report_chunk`); the old one stays one release and is dropped by a contract migration.
//!
//! The outcome of each function whose answer this crate reads is a PostgreSQL enum and a Rust enum
//! here, with the same values (held equal by a test), so a mismatch fails the suite, not a request.
use crate::error::Result;
use crate::schema::SCHEMA_VERSION;
use sqlx::Connection;
use sqlx::postgres::PgConnection;

/// One server-side function: its name in `nifi_ops` and the file that defines it.
#[derive(Debug, Clone, Copy)]
pub struct ServerFunction {
    pub name: &'static str,
    pub sql: &'static str,
}

macro_rules! functions {
    ($($name:literal),+ $(,)?) => {
        /// Every file of `ledger/functions/` (ledger/tests/schema_version.rs holds the list to the
        /// directory), in the order `migrate` applies them: a function after every function it
        /// calls, so that none is ever called missing or in an older form by a request served
        /// while `migrate` runs.
        pub const SERVER_FUNCTIONS: &[ServerFunction] = &[$(ServerFunction {
            name: $name,
            sql: include_str!(concat!("../functions/", $name, ".sql")),
        }),+];
    };
}

functions!(
    "beat_run",
    "chunk_gate",
    "record_event",
    "run_success_count",
    "transition",
    "load_run_transition_allowed",
    "load_run_success_recount",
    "claim_partition_v2",
    "complete_extraction",
    "partition_success",
    "record_chunk",
    "report_chunk_v2",
    "start_validation_v2",
);

/// Who `migrate` says applied a function.
const WRITTEN_BY: &str = concat!("load-control ", env!("CARGO_PKG_VERSION"));

/// Applies every function whose file's hash is not the one recorded, each in its own transaction
/// with its privileges and its record; returns how many it applied. A function recorded by a newer
/// schema version (a rollback's hook on the next release's schema) is left as that release wrote
/// it.
pub(crate) async fn apply_server_functions(conn: &mut PgConnection) -> Result<usize> {
    let mut applied = 0;
    // The role the migrations grant to when it exists (their history); `database.runtime_role`
    // is granted the same by `grant_server_functions` after every migrate.
    let api_role: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'load_control_api')",
    )
    .fetch_one(&mut *conn)
    .await?;
    for f in SERVER_FUNCTIONS {
        let mut tx = conn.begin().await?;
        let sha256: String =
            sqlx::query_scalar("SELECT encode(sha256(convert_to($1, 'UTF8')), 'hex')")
                .bind(f.sql)
                .fetch_one(&mut *tx)
                .await?;
        let recorded: Option<(String, i32, String)> = sqlx::query_as(
            "SELECT sha256, schema_version, written_by FROM nifi_ops.server_function \
              WHERE function_name = $1 FOR UPDATE",
        )
        .bind(f.name)
        .fetch_optional(&mut *tx)
        .await?;
        match &recorded {
            Some((hash, _, _)) if *hash == sha256 => continue,
            Some((_, version, by)) if *version > SCHEMA_VERSION => {
                tracing::warn!(
                    event = "server_function_kept",
                    function = f.name,
                    "nifi_ops.{} differs from this release's but was written by {by} for schema \
                     version {version}: kept as it is",
                    f.name
                );
                continue;
            }
            _ => {}
        }
        sqlx::raw_sql(sqlx::AssertSqlSafe(f.sql))
            .execute(&mut *tx)
            .await?;
        for signature in signatures(&mut tx, f.name).await? {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "REVOKE ALL ON FUNCTION {signature} FROM PUBLIC"
            )))
            .execute(&mut *tx)
            .await?;
        }
        if api_role {
            grant_function(&mut tx, f.name, "load_control_api").await?;
        }
        sqlx::query(
            "INSERT INTO nifi_ops.server_function (function_name, sha256, schema_version, written_by) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (function_name) DO UPDATE \
                SET sha256 = EXCLUDED.sha256, schema_version = EXCLUDED.schema_version, \
                    written_by = EXCLUDED.written_by, applied_at = clock_timestamp()",
        )
        .bind(f.name)
        .bind(&sha256)
        .bind(SCHEMA_VERSION)
        .bind(WRITTEN_BY)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        applied += 1;
        tracing::info!(
            event = "server_function_applied",
            function = f.name,
            sha256 = %sha256,
            "applied nifi_ops.{} ({})",
            f.name,
            match recorded {
                Some((_, _, by)) => format!("replacing the definition of {by}"),
                None => "new".to_string(),
            }
        );
    }
    Ok(applied)
}

/// The signatures (`regprocedure`) of every overload of `nifi_ops.<name>`.
async fn signatures(conn: &mut PgConnection, name: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p \
          WHERE p.pronamespace = 'nifi_ops'::regnamespace AND p.proname = $1 ORDER BY 1",
    )
    .bind(name)
    .fetch_all(&mut *conn)
    .await?)
}

/// EXECUTE on every overload of `nifi_ops.<name>` to `role` (quoted as an identifier), but for a
/// trigger's function, which only its trigger calls.
async fn grant_function(conn: &mut PgConnection, name: &str, role: &str) -> Result<()> {
    let callable: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p \
          WHERE p.pronamespace = 'nifi_ops'::regnamespace AND p.proname = $1 \
            AND p.prorettype <> 'trigger'::regtype ORDER BY 1",
    )
    .bind(name)
    .fetch_all(&mut *conn)
    .await?;
    for signature in callable {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "GRANT EXECUTE ON FUNCTION {signature} TO {role}"
        )))
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// What the pods' role needs of the functions of [`SERVER_FUNCTIONS`]: EXECUTE on each (`role`
/// quoted as an identifier).
pub async fn grant_server_functions(conn: &mut PgConnection, role: &str) -> Result<()> {
    for f in SERVER_FUNCTIONS {
        grant_function(conn, f.name, role).await?;
    }
    Ok(())
}

/// An outcome the database answered that this release does not know: a function changed under a
/// running release (the rule of this module broken).
#[derive(Debug, thiserror::Error)]
#[error("{function} answered outcome {value:?}, which this release does not know")]
pub struct UnknownOutcome {
    pub function: &'static str,
    pub value: String,
}

macro_rules! outcome {
    ($(#[$m:meta])* $name:ident = $function:literal, $pg:literal { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($variant),+ }
        impl $name {
            /// The function that answers it.
            pub const FUNCTION: &'static str = $function;
            /// Its PostgreSQL type.
            pub const PG_TYPE: &'static str = $pg;
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub fn as_str(self) -> &'static str { match self { $($name::$variant => $text),+ } }
        }
        // Read from the outcome's text (`outcome::text`): a value this release does not know is
        // a decoding error that names it.
        impl sqlx::Type<sqlx::Postgres> for $name {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <String as sqlx::Type<sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <String as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }
        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $name {
            fn decode(value: sqlx::postgres::PgValueRef<'r>) -> std::result::Result<Self, sqlx::error::BoxDynError> {
                let text = <String as sqlx::Decode<'r, sqlx::Postgres>>::decode(value)?;
                Ok($name::try_from(text)?)
            }
        }
        impl TryFrom<String> for $name {
            type Error = UnknownOutcome;
            fn try_from(value: String) -> std::result::Result<Self, UnknownOutcome> {
                match value.as_str() {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownOutcome { function: $function, value }),
                }
            }
        }
    };
}

outcome!(
    /// What `nifi_ops.claim_partition_v2` answers.
    ClaimPartitionOutcome = "nifi_ops.claim_partition_v2", "nifi_ops.claim_partition_outcome" {
        RunNotFound = "RUN_NOT_FOUND",
        PartitionNotFound = "PARTITION_NOT_FOUND",
        Answered = "ANSWERED",
    }
);

outcome!(
    /// What `nifi_ops.report_chunk_v2` answers.
    ReportChunkOutcome = "nifi_ops.report_chunk_v2", "nifi_ops.report_chunk_outcome" {
        RunNotFound = "RUN_NOT_FOUND",
        PartitionNotFound = "PARTITION_NOT_FOUND",
        ClaimMismatch = "CLAIM_MISMATCH",
        HdfsPathOutsideRun = "HDFS_PATH_OUTSIDE_RUN",
        Conflict = "CONFLICT",
        Recorded = "RECORDED",
        Escalate = "ESCALATE",
        Mismatch = "MISMATCH",
        PartitionSuccess = "PARTITION_SUCCESS",
        RunComplete = "RUN_COMPLETE",
    }
);

outcome!(
    /// What `nifi_ops.start_validation_v2` answers.
    StartValidationOutcome = "nifi_ops.start_validation_v2", "nifi_ops.start_validation_outcome" {
        RunNotFound = "RUN_NOT_FOUND",
        DispatchMismatch = "DISPATCH_MISMATCH",
        Refused = "REFUSED",
        Started = "STARTED",
    }
);

/// Every outcome type: (its PostgreSQL type, the function that answers it, its values).
pub fn outcome_types() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    fn values<T: Copy>(all: &[T], as_str: fn(T) -> &'static str) -> Vec<&'static str> {
        all.iter().map(|v| as_str(*v)).collect()
    }
    vec![
        (
            ClaimPartitionOutcome::PG_TYPE,
            ClaimPartitionOutcome::FUNCTION,
            values(ClaimPartitionOutcome::ALL, ClaimPartitionOutcome::as_str),
        ),
        (
            ReportChunkOutcome::PG_TYPE,
            ReportChunkOutcome::FUNCTION,
            values(ReportChunkOutcome::ALL, ReportChunkOutcome::as_str),
        ),
        (
            StartValidationOutcome::PG_TYPE,
            StartValidationOutcome::FUNCTION,
            values(StartValidationOutcome::ALL, StartValidationOutcome::as_str),
        ),
    ]
}

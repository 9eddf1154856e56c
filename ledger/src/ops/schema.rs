//! Reading and judging the database's schema version: at start, in every readiness probe, and
//! before a write when the last reading is older than `SCHEMA_RECHECK` (`crate::schema`).
use crate::error::{LedgerError, Result};
use crate::schema::{SUPPORTED_SCHEMA, judge, read_version};
use crate::store::Ledger;
use std::time::Duration;

impl Ledger {
    /// How long a reading of the schema version is trusted before a write reads it again
    /// (default [`SCHEMA_RECHECK`]).
    pub fn with_schema_recheck(mut self, recheck: Duration) -> Self {
        self.schema.recheck = recheck;
        self
    }

    /// The database's schema version, read now (and remembered for the writes that follow).
    pub async fn schema_version(&self) -> Result<i32> {
        let outcome: Result<i32> = async {
            let mut conn = self.acquire().await?;
            Ok(read_version(&mut conn).await?)
        }
        .await;
        match &outcome {
            Ok(v) => self.schema.record(*v),
            Err(e) => self.observe_error(e),
        }
        outcome
    }

    /// Reads the schema version now: `SchemaUnsupported` (naming both versions and what to do)
    /// when this binary does not run on it. At start and in every readiness probe.
    pub async fn check_schema(&self) -> Result<i32> {
        let version = self.schema_version().await?;
        judge(version).map_err(LedgerError::SchemaUnsupported)?;
        Ok(version)
    }

    /// Before every write: the last reading if recent, else a new one. No round trip on the hot
    /// path but one per [`SCHEMA_RECHECK`]; a readiness probe refreshes it too.
    pub(crate) async fn admit_write(&self) -> Result<()> {
        let version = match self.schema.fresh() {
            Some(v) => v,
            None => self.schema_version().await?,
        };
        judge(version).map_err(LedgerError::SchemaUnsupported)
    }
}

impl Ledger {
    /// At a process's start: reads and judges the schema version within `limit` and logs the
    /// verdict — an unsupported version at error level, with both versions and what to do. Serves
    /// nothing by itself: readiness and every write check again.
    pub async fn log_schema_at_start(&self, limit: Duration) {
        match tokio::time::timeout(limit, self.check_schema()).await {
            Ok(Ok(version)) => tracing::info!(
                event = "schema_supported",
                database = version,
                supported = %format!("{}..={}", SUPPORTED_SCHEMA.start(), SUPPORTED_SCHEMA.end()),
                "this binary runs on the database's schema version"
            ),
            Ok(Err(e @ LedgerError::SchemaUnsupported(_))) => tracing::error!(
                event = "schema_unsupported",
                error = %e,
                "this binary does not run on the database's schema version: not ready, and it writes nothing"
            ),
            Ok(Err(e)) => tracing::warn!(
                event = "schema_unchecked",
                error = %e,
                "the schema version could not be read at start; readiness checks it again"
            ),
            Err(_) => tracing::warn!(
                event = "schema_unchecked",
                error = %format!("no answer within {limit:?}"),
                "the schema version could not be read at start; readiness checks it again"
            ),
        }
    }
}

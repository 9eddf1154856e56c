//! Rows of `load_event` (CONTRACT §8), always inserted in the transaction of the change they record.
use crate::error::Result;
use crate::run_lock::RunRow;
use crate::text::cut;
use serde_json::{Value, json};
use sqlx::PgConnection;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
    }
}

/// Who asked for an operator action; recorded in the event's details ([v1-ext] §8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// Token identity name, or `kubernetes:<namespace>/<name>` for an action on a LoadRun.
    pub name: String,
    /// Authenticated role name (`operator` for every operator action).
    pub role: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Event {
    level: Level,
    name: &'static str,
    processor_name: Option<&'static str>,
    run_id: Option<Uuid>,
    job_key: Option<String>,
    business_key: Option<String>,
    partition_id: Option<String>,
    attempt_no: Option<i32>,
    row_count: Option<i64>,
    error_class: Option<String>,
    error_code: Option<String>,
    message: Option<String>,
    details: Value,
}

impl Event {
    pub fn new(level: Level, name: &'static str) -> Self {
        Event {
            level,
            name,
            processor_name: None,
            run_id: None,
            job_key: None,
            business_key: None,
            partition_id: None,
            attempt_no: None,
            row_count: None,
            error_class: None,
            error_code: None,
            message: None,
            details: json!({}),
        }
    }

    /// Run id, job key and business key of the run (the usual case, §8).
    pub fn run(self, run: &RunRow) -> Self {
        self.run_keys(run.run_id, &run.job_key, &run.business_key)
    }

    pub fn run_keys(mut self, run_id: Uuid, job_key: &str, business_key: &str) -> Self {
        self.run_id = Some(run_id);
        self.job_key = Some(job_key.to_string());
        self.business_key = Some(business_key.to_string());
        self
    }

    /// Run id only (dispatch events carry no job or business key, §6.5).
    pub fn run_only(mut self, run_id: Uuid) -> Self {
        self.run_id = Some(run_id);
        self
    }

    pub fn processor(mut self, name: &'static str) -> Self {
        self.processor_name = Some(name);
        self
    }

    pub fn partition(mut self, pid: &str) -> Self {
        self.partition_id = Some(pid.to_string());
        self
    }

    pub fn partition_opt(mut self, pid: Option<&str>) -> Self {
        self.partition_id = pid.map(str::to_string);
        self
    }

    pub fn rows(mut self, n: Option<i64>) -> Self {
        self.row_count = n;
        self
    }

    pub fn attempt(mut self, n: Option<i32>) -> Self {
        self.attempt_no = n;
        self
    }

    pub fn error_class(mut self, c: &str) -> Self {
        self.error_class = Some(cut(c, 40));
        self
    }

    pub fn code(mut self, c: &str) -> Self {
        self.error_code = Some(cut(c, 100));
        self
    }

    pub fn message(mut self, m: &str) -> Self {
        self.message = crate::text::message(m);
        self
    }

    pub fn details(mut self, d: Value) -> Self {
        self.details = d;
        self
    }

    /// Adds `abortedPartitions` when partitions were closed with the run (§2.2).
    pub fn aborted(mut self, n: u64) -> Self {
        if n > 0 {
            self.details["abortedPartitions"] = json!(n);
        }
        self
    }

    pub fn actor(mut self, actor: &Actor) -> Self {
        self.details["operator"] = json!(actor.name);
        self.details["operatorRole"] = json!(actor.role);
        self
    }

    /// A new event id, time-ordered (UUID v7), for an event this transaction inserts, here or in
    /// a server-side function: the transaction's witness of its commit
    /// (`Ledger::committed_after_all`), should the COMMIT's answer be lost.
    pub fn id_of_commit() -> Uuid {
        let event_id = Uuid::now_v7();
        let _ = crate::transactions::COMMIT_MARKER.try_with(|m| m.set(Some(event_id)));
        event_id
    }

    /// Inserts the row through `nifi_ops.record_event`, the one writer of event rows (its
    /// conventions: the process group, the processor named after the event).
    pub async fn insert(self, conn: &mut PgConnection) -> Result<()> {
        let event_id = Event::id_of_commit();
        sqlx::query(
            "SELECT nifi_ops.record_event($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        )
        // Time-ordered (UUID v7, monotonic within the process): inserts append to the right edge
        // of the primary key instead of dirtying a random leaf each, and events that tie on
        // event_time come out of the timeline (§4.22) in the order they were written.
        .bind(event_id)
        .bind(self.level.as_str())
        .bind(self.name)
        .bind(self.processor_name)
        .bind(self.run_id)
        .bind(self.job_key)
        .bind(self.business_key)
        .bind(self.partition_id)
        .bind(self.attempt_no)
        .bind(self.row_count)
        .bind(self.error_class)
        .bind(self.error_code)
        .bind(self.message)
        .bind(sqlx::types::Json(self.details))
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

//! `POST /v1/runs` (CONTRACT §4.1, §5.1).
use crate::error::{LedgerError, Result};
use crate::event::{Event, Level};
use crate::notify::notify_run;
use crate::run_lock::{RUN_COLUMNS, RunRow};
use crate::status::RunStatus;
use crate::store::Ledger;
use crate::transactions::transaction;
use serde::Serialize;
use serde_json::{Map, Value};
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct NewRun {
    pub job_key: String,
    pub business_key: String,
    pub hdfs_root: String,
    pub stage_table_prefix: String,
    pub allow_empty_source: bool,
    pub parameters: Map<String, Value>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct CreatedRun {
    pub run_id: Uuid,
    pub status: RunStatus,
    pub hdfs_run_path: String,
    pub stage_table: String,
}

/// `<hdfsRoot without trailing or doubled slashes>/<jobKey>/run_id=<runId>`; `None` when the root
/// has a `..` segment or the path would not fit `load_run.hdfs_run_path`.
pub fn hdfs_run_path(hdfs_root: &str, job_key: &str, run_id: Uuid) -> Option<String> {
    if hdfs_root.split('/').any(|seg| seg == "..") {
        return None;
    }
    let mut root = String::with_capacity(hdfs_root.len());
    for seg in hdfs_root.split('/').filter(|s| !s.is_empty()) {
        root.push('/');
        root.push_str(seg);
    }
    let path = format!("{root}/{job_key}/run_id={run_id}");
    (path.chars().count() <= 1000).then_some(path)
}

pub fn stage_table(prefix: &str, run_id: Uuid) -> String {
    format!("{prefix}{}", run_id.simple()).to_lowercase()
}

impl Ledger {
    pub async fn create_run(&self, req: &NewRun) -> Result<CreatedRun> {
        let run_id = Uuid::new_v4();
        let path = hdfs_run_path(&req.hdfs_root, &req.job_key, run_id)
            .ok_or(LedgerError::InvalidHdfsRoot)?;
        let table = stage_table(&req.stage_table_prefix, run_id);
        let mut parameters = req.parameters.clone();
        parameters.insert(
            "allowEmptySource".into(),
            Value::Bool(req.allow_empty_source),
        );
        let parameters = Value::Object(parameters);
        let created = transaction!(self, |conn| async {
            // FOR SHARE: a committed suspend excludes every later create (§1.7).
            let job: Option<(bool,)> = sqlx::query_as(
                "SELECT suspended FROM nifi_ops.load_job WHERE job_key = $1 AND removed_at IS NULL FOR SHARE",
            )
            .bind(&req.job_key)
            .fetch_optional(&mut *conn)
            .await?;
            match job {
                None if self.config.require_registered => {
                    return Err(LedgerError::JobNotRegistered {
                        job_key: req.job_key.clone(),
                    });
                }
                Some((true,)) => {
                    return Err(LedgerError::JobSuspended {
                        job_key: req.job_key.clone(),
                    });
                }
                _ => {}
            }
            let inserted: Result<RunRow, sqlx::Error> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "INSERT INTO nifi_ops.load_run (run_id, job_key, business_key, status, hdfs_run_path, stage_table_name, parameters) \
                 VALUES ($1, $2, $3, 'CREATED', $4, $5, $6) RETURNING {RUN_COLUMNS}"
            )))
            .bind(run_id)
            .bind(&req.job_key)
            .bind(&req.business_key)
            .bind(&path)
            .bind(&table)
            .bind(sqlx::types::Json(&parameters))
            .fetch_one(&mut *conn)
            .await;
            let run = match inserted.map_err(LedgerError::from) {
                Ok(run) => run,
                // Only the partial unique index decides duplicates: no read-then-insert (§5.1).
                Err(LedgerError::UniqueViolation { constraint })
                    if constraint.is_none()
                        || constraint.as_deref() == Some("uq_load_run_active") =>
                {
                    return Err(LedgerError::DuplicateActiveRun {
                        job_key: req.job_key.clone(),
                        business_key: req.business_key.clone(),
                    });
                }
                Err(e) => return Err(e),
            };
            notify_run(conn, run_id).await?;
            Event::new(Level::Info, "RUN_STARTED")
                .run(&run)
                .insert(conn)
                .await?;
            Ok(CreatedRun {
                run_id,
                status: RunStatus::Created,
                hdfs_run_path: path.clone(),
                stage_table: table.clone(),
            })
        })?;
        tracing::info!(event = "run_created", run_id = %run_id, job_key = %req.job_key, business_key = %req.business_key, "run created");
        Ok(created)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_path_collapses_slashes_and_refuses_dot_dot() {
        let id = Uuid::parse_str("0b6f8c1e-4d2a-4f7b-9a51-2c3d4e5f6a7b").unwrap();
        assert_eq!(
            hdfs_run_path("/data/nifi/stage/", "JOB", id).unwrap(),
            "/data/nifi/stage/JOB/run_id=0b6f8c1e-4d2a-4f7b-9a51-2c3d4e5f6a7b"
        );
        assert_eq!(
            hdfs_run_path("//data//x//", "J", id).unwrap(),
            format!("/data/x/J/run_id={id}")
        );
        assert_eq!(
            hdfs_run_path("/", "J", id).unwrap(),
            format!("/J/run_id={id}")
        );
        assert!(hdfs_run_path("/data/../etc", "J", id).is_none());
        assert!(hdfs_run_path(&format!("/{}", "a".repeat(990)), "J", id).is_none());
        assert_eq!(
            stage_table("TMP_X_", id),
            "tmp_x_0b6f8c1e4d2a4f7b9a512c3d4e5f6a7b"
        );
    }
}

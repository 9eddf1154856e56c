//! The common error body (CONTRACT §3.7) and the one place where ledger outcomes become HTTP
//! statuses and contract codes.
use crate::input::Problems;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ledger::LedgerError;
use serde::Serialize;
use serde_json::{Value, json};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// Carried on an error response until the request frame renders it with the request id.
#[derive(Debug, Clone)]
pub struct PendingError(pub ApiError);

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody<'a> {
    pub code: &'a str,
    pub message: &'a str,
    pub request_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<&'a Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str) -> Self {
        ApiError {
            status,
            code,
            message: code.to_string(),
            details: None,
        }
    }

    pub fn with_message(mut self, m: impl Into<String>) -> Self {
        self.message = m.into();
        self
    }

    pub fn with_details(mut self, d: Value) -> Self {
        self.details = Some(d);
        self
    }

    pub fn unauthenticated() -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED").with_message("Unauthorized")
    }

    pub fn forbidden() -> Self {
        ApiError::new(StatusCode::FORBIDDEN, "FORBIDDEN").with_message("Forbidden")
    }

    pub fn not_found() -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND").with_message("Not Found")
    }

    pub fn method_not_allowed() -> Self {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED")
            .with_message("Method Not Allowed")
    }

    pub fn payload_too_large(limit: usize) -> Self {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE")
            .with_message("Payload Too Large")
            .with_details(json!({"limit": limit}))
    }

    /// **[v1-ext]** The body did not arrive within `server.body_read_timeout`.
    pub fn request_timeout(deadline: std::time::Duration) -> Self {
        ApiError::new(StatusCode::REQUEST_TIMEOUT, "REQUEST_TIMEOUT")
            .with_message("the request body did not arrive in time")
            .with_details(json!({"bodyReadTimeoutSeconds": deadline.as_secs_f64()}))
    }

    pub fn service_unavailable() -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "SERVICE_UNAVAILABLE")
            .with_message("Service Unavailable")
    }

    pub fn internal() -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_ERROR")
            .with_message("internal error")
    }

    /// 422 REQUEST_INVALID listing every problem (§3.7).
    pub fn invalid(problems: Problems) -> Self {
        let first = problems
            .0
            .first()
            .map(|p| format!("{} {}", p.field, p.message))
            .unwrap_or_default();
        let more = problems.0.len().saturating_sub(1);
        let mut message = format!("request validation failed: {first}");
        if more > 0 {
            message.push_str(&format!(" (+{more} more)"));
        }
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "REQUEST_INVALID")
            .with_message(message)
            .with_details(json!({"errors": problems.0}))
    }
}

impl Problems {
    /// `Err(422)` when anything was wrong.
    pub fn check(self) -> Result<(), ApiError> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(self))
        }
    }
}

impl From<LedgerError> for ApiError {
    fn from(e: LedgerError) -> Self {
        use LedgerError as L;
        use StatusCode as S;
        match e {
            L::RunNotFound => ApiError::new(S::NOT_FOUND, "RUN_NOT_FOUND"),
            L::PartitionNotFound => ApiError::new(S::NOT_FOUND, "PARTITION_NOT_FOUND"),
            L::DispatchNotFound => ApiError::new(S::NOT_FOUND, "DISPATCH_NOT_FOUND"),
            L::DuplicateActiveRun {
                job_key,
                business_key,
            } => ApiError::new(S::CONFLICT, "DUPLICATE_ACTIVE_RUN")
                .with_details(json!({"jobKey": job_key, "businessKey": business_key})),
            L::RunStatusMismatch { run_status, stage } => {
                let mut d = json!({"runStatus": run_status});
                if let Some(stage) = stage {
                    d["stage"] = json!(stage);
                }
                ApiError::new(S::CONFLICT, "RUN_STATUS_MISMATCH").with_details(d)
            }
            L::ClaimMismatch => ApiError::new(S::CONFLICT, "CLAIM_MISMATCH"),
            L::ChunkConflict => ApiError::new(S::CONFLICT, "CHUNK_CONFLICT"),
            L::DispatchMismatch => ApiError::new(S::CONFLICT, "DISPATCH_MISMATCH"),
            L::PublishTokenMismatch => ApiError::new(S::CONFLICT, "PUBLISH_TOKEN_MISMATCH"),
            L::PartitionStatusMismatch { partition_status } => {
                ApiError::new(S::CONFLICT, "PARTITION_STATUS_MISMATCH")
                    .with_details(json!({"partitionStatus": partition_status}))
            }
            L::DispatchStatusMismatch { status } => {
                ApiError::new(S::CONFLICT, "DISPATCH_STATUS_MISMATCH")
                    .with_details(json!({"status": status}))
            }
            L::CleanupNotDue { run_status } => ApiError::new(S::CONFLICT, "CLEANUP_NOT_DUE")
                .with_details(json!({"runStatus": run_status})),
            L::JobSuspended { job_key } => {
                ApiError::new(S::CONFLICT, "JOB_SUSPENDED").with_details(json!({"jobKey": job_key}))
            }
            L::JobNotRegistered { job_key } => {
                ApiError::new(S::UNPROCESSABLE_ENTITY, "JOB_NOT_REGISTERED")
                    .with_details(json!({"jobKey": job_key}))
            }
            L::FailTransitionNotAllowed { expected, fail } => {
                ApiError::new(S::UNPROCESSABLE_ENTITY, "FAIL_TRANSITION_NOT_ALLOWED")
                    .with_details(json!({"expectedStatus": expected, "failStatus": fail}))
            }
            L::ManifestInvalid { violations } => {
                ApiError::new(S::UNPROCESSABLE_ENTITY, "MANIFEST_INVALID")
                    .with_message(violations.join("; "))
                    .with_details(json!({"violations": violations}))
            }
            L::InvalidHdfsRoot => ApiError::new(S::UNPROCESSABLE_ENTITY, "INVALID_HDFS_ROOT"),
            L::ChunkIndexOutOfRange => {
                ApiError::new(S::UNPROCESSABLE_ENTITY, "CHUNK_INDEX_OUT_OF_RANGE")
            }
            // §3.7: the message is the code (docs/api.md says what the flow did wrong).
            L::HdfsPathOutsideRun => {
                ApiError::new(S::UNPROCESSABLE_ENTITY, "HDFS_PATH_OUTSIDE_RUN")
            }
            L::UniqueViolation { constraint } => ApiError::new(S::CONFLICT, "UNIQUE_VIOLATION")
                .with_message("unique constraint violated")
                .with_details(json!({"constraint": constraint})),
            L::ReferenceNotFound { constraint } => {
                ApiError::new(S::UNPROCESSABLE_ENTITY, "REFERENCE_NOT_FOUND")
                    .with_message("referenced row not found")
                    .with_details(json!({"constraint": constraint}))
            }
            L::ConstraintViolation { constraint } => {
                ApiError::new(S::UNPROCESSABLE_ENTITY, "CONSTRAINT_VIOLATION")
                    .with_message("constraint violated")
                    .with_details(json!({"constraint": constraint}))
            }
            e @ (L::Database(_) | L::Unwritable(_)) => {
                tracing::error!(event = "database_error", error = %e, "database error");
                ApiError::new(S::SERVICE_UNAVAILABLE, "DATABASE_UNAVAILABLE")
                    .with_message("database error, retry later")
            }
            e @ L::SchemaUnsupported(_) => {
                // Readiness fails too, so the Service sends nothing here for long: the request
                // that raced the probe is told to retry (and the log says why).
                tracing::error!(event = "schema_unsupported", error = %e, "write refused: this binary does not run on the database's schema version");
                ApiError::new(S::SERVICE_UNAVAILABLE, "DATABASE_UNAVAILABLE")
                    .with_message("database error, retry later")
            }
            // Only a leader's epoch bump, claim refresh or clock is refused so; never an API
            // request.
            e @ (L::Escalate
            | L::Corrupt(_)
            | L::Fenced { .. }
            | L::OwnedByOther(_)
            | L::WentBack(_)) => {
                tracing::error!(event = "internal_error", error = %e, "internal error");
                ApiError::internal()
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = self.status.into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        res.extensions_mut().insert(PendingError(self));
        res
    }
}

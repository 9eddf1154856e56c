//! The API's handlers, one module per resource. Each `/v1` operation's OpenAPI description is
//! written with [`v1_operation!`], which adds the error answers every such operation can give
//! (declared here once).

/// An operation of `/v1`: `#[utoipa::path(...)]` with the given method, path, description,
/// request body, parameters and 200 body, plus the common error answers (401, 403, 404, 409, 413,
/// 422, 503 with the contract's error body).
macro_rules! v1_operation {
    (
        $method:ident $path:literal, $description:literal
        $(, request_body = [$($body:tt)*])?
        $(, params = [$($params:tt)*])?
        , ok = [$($ok:tt)*];
        $($item:tt)*
    ) => {
        #[utoipa::path($method, path = $path, description = $description
            $(, request_body = $($body)*)?
            $(, params($($params)*))?,
            responses(
                (status = 200, body = $($ok)*),
                (status = 401, body = crate::bodies::ErrorDoc),
                (status = 403, body = crate::bodies::ErrorDoc),
                (status = 404, body = crate::bodies::ErrorDoc),
                (status = 409, body = crate::bodies::ErrorDoc),
                (status = 413, body = crate::bodies::ErrorDoc),
                (status = 422, body = crate::bodies::ErrorDoc),
                (status = 503, body = crate::bodies::ErrorDoc)
            ))]
        $($item)*
    };
}

pub mod cleanup;
pub mod health;
pub mod monitor;
pub mod operator;
pub mod partitions;
pub mod publish;
pub mod runs;
pub mod validation;

pub use cleanup::*;
pub use health::*;
pub use monitor::*;
pub use operator::*;
pub use partitions::*;
pub use publish::*;
pub use runs::*;
pub use validation::*;

/// What every handler module uses.
mod prelude {
    #![allow(unused_imports)]
    pub(crate) use crate::auth::{Authenticator, Caller, Role};
    pub(crate) use crate::config::Config;
    pub(crate) use crate::error::{ApiError, ErrorBody, PendingError};
    pub(crate) use crate::extract::*;
    pub(crate) use crate::input::{JVal, ObjReader, Problems, parse_json};
    pub(crate) use crate::requests;
    pub(crate) use axum::body::Body;
    pub(crate) use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
    pub(crate) use axum::http::{HeaderValue, StatusCode, header, request::Parts};
    pub(crate) use axum::middleware::{self, Next};
    pub(crate) use axum::response::{IntoResponse, Response};
    pub(crate) use axum::routing::{get, post};
    pub(crate) use axum::{Json, Router};
    pub(crate) use futures::FutureExt;
    pub(crate) use http_body_util::{BodyExt, LengthLimitError, Limited};
    pub(crate) use ledger::{
        Actor, CancelOutcome, ChunkOutcome, ClaimOutcome, CreatedRun, Ledger, ManifestOutcome,
        MetricsRecorded, PartitionFailOutcome, PublishClaim, ResendOutcome, RunFailOutcome,
        StageVerdict, StartOutcome, StatusChange, SuccessVerdict,
    };
    pub(crate) use serde_json::json;
    pub(crate) use std::collections::HashMap;
    pub(crate) use std::panic::AssertUnwindSafe;
    pub(crate) use std::sync::{Arc, Mutex};
    pub(crate) use std::time::{Duration, Instant};
    pub(crate) use tokio::sync::Semaphore;
    pub(crate) use uuid::Uuid;

    pub(crate) type ApiResult<T> = Result<Json<T>, ApiError>;
}

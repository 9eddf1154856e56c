//! Probes, metrics and the OpenAPI document (§4.23, §4.24): no authentication.
use super::prelude::*;

#[utoipa::path(get, path = "/healthz", description = "Liveness.", responses((status = 200, description = "OK")))]
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

#[utoipa::path(get, path = "/readyz", description = "Readiness: this binary runs on the database's schema version, and the database takes a write within 2 s — a transaction that is given an id and commits (waiting for a synchronous standby as any write does); 503 while the schema version is outside this binary's range, another release (installation) holds a fresh claim on the ledger, or the database is read-only, in recovery or unreachable (the cause is logged as readyz_failed).", responses((status = 200, description = "OK"), (status = 503, description = "the database cannot take this binary's writes now")))]
pub async fn readyz(State(s): State<AppState>) -> Response {
    let checks = async {
        s.0.ledger.write_check().await?;
        // Another release's ledger (two releases on one database): not this one's to serve.
        s.0.ledger.check_owner().await
    };
    match tokio::time::timeout(Duration::from_secs(2), checks).await {
        Ok(Ok(())) => Json(json!({"status": "ok"})).into_response(),
        outcome => {
            let cause = match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out after 2s".to_string(),
            };
            tracing::warn!(event = "readyz_failed", cause = %cause, "readiness check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable"})),
            )
                .into_response()
        }
    }
}

#[utoipa::path(get, path = "/metrics", description = "Prometheus exposition, negotiated on `Accept` as Prometheus's client_golang does: OpenMetrics 1.0.0 when the scraper asks for `application/openmetrics-text`, otherwise the classic text format (`text/plain; version=0.0.4`), also without `Accept`.", responses((status = 200, description = "OK")))]
pub async fn metrics(State(s): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    s.0.metrics
        .connections_retired(s.0.ledger.connections_retired());
    s.0.metrics.edge(&s.0.edge);
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = exposition::Format::respond(accept, s.0.metrics.render());
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

#[utoipa::path(get, path = "/openapi.json", description = "This document.", responses((status = 200, description = "OK")))]
pub async fn openapi_json(State(s): State<AppState>) -> Response {
    Json(s.0.openapi.clone()).into_response()
}

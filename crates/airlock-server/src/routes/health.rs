//! `/healthz` (the process answers) and `/readyz` (the store answers and
//! this replica takes work).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::error::ApiError;

pub async fn healthz() -> Response {
    axum::Json(serde_json::json!({ "status": "ok" })).into_response()
}

pub async fn readyz(State(app): State<AppState>) -> Response {
    if !app.is_ready() || app.is_stopping() {
        return ApiError::unavailable("this replica is starting or stopping").into_response();
    }
    match app.store().schema_version().await {
        Ok(_) => (
            StatusCode::OK,
            axum::Json(serde_json::json!({
                "status": "ready",
                "replica": app.replica(),
                "backend": app.orch().backend.name(),
                "running": app.running_count(),
            })),
        )
            .into_response(),
        Err(e) => {
            tracing::warn!("readyz: store: {e}");
            ApiError::unavailable("the store does not answer").into_response()
        }
    }
}

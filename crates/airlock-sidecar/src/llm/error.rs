//! The relay's own error answers, in a shape both SDKs parse:
//! `{"type":"error","error":{"type","code","message"}}`.

use airlock_egress::EgressError;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::json;

pub(super) fn error(
    status: StatusCode,
    kind: &str,
    code: &str,
    message: impl Into<String>,
) -> Response {
    let message = message.into();
    (
        status,
        axum::Json(
            json!({"type": "error", "error": {"type": kind, "code": code, "message": message}}),
        ),
    )
        .into_response()
}

/// A guard refusal (403, `blocked`) or an upstream failure (502).
pub(super) fn egress_error(e: &EgressError) -> Response {
    if e.http_status() == 403 {
        error(
            StatusCode::FORBIDDEN,
            "blocked",
            e.code.as_str(),
            format!("the model provider is not reachable: {e}"),
        )
    } else {
        error(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            e.code.as_str(),
            format!("the model provider failed: {e}"),
        )
    }
}

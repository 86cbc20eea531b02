//! `POST /artifacts`: the runtime hands over one file the agent left in its
//! output directory (or says why it did not read it); the sidecar passes it
//! to the platform under the run's token, which checks its path and stores
//! it within the run's and the organization's quota. The runtime never
//! holds the run token: this is its only way to store a file.

use std::sync::Arc;

use airlock_platform_api::PlatformError;
use airlock_platform_api::files::{
    ARTIFACT_PATH_HEADER, ARTIFACT_REFUSED_HEADER, ArtifactRefusal, MAX_ARTIFACT_FILE_BYTES,
};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;

use crate::state::Sidecar;

pub async fn put(State(sidecar): State<Arc<Sidecar>>, headers: HeaderMap, body: Bytes) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Some(path) = header(ARTIFACT_PATH_HEADER).and_then(|p| {
        percent_encoding::percent_decode_str(p)
            .decode_utf8()
            .ok()
            .map(|p| p.into_owned())
    }) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("{ARTIFACT_PATH_HEADER}: missing or not UTF-8"),
        );
    };
    let refused = match header(ARTIFACT_REFUSED_HEADER).map(|v| v.split_once(' ')) {
        None => None,
        Some(Some((why, n))) => match (why.parse::<ArtifactRefusal>(), n.parse::<u64>()) {
            (Ok(why), Ok(bytes)) => Some((why, bytes)),
            _ => return not_a_reason(),
        },
        Some(None) => return not_a_reason(),
    };
    if body.len() as u64 > MAX_ARTIFACT_FILE_BYTES {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("an artifact is limited to {MAX_ARTIFACT_FILE_BYTES} bytes"),
        );
    }
    let body = match refused {
        Some(r) => Err(r),
        None => Ok(body),
    };
    match sidecar.platform.put_artifact(&path, body).await {
        Ok(answer) => (StatusCode::OK, Json(answer)).into_response(),
        Err(PlatformError::Refused {
            status,
            code,
            message,
        }) => refuse(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            &code,
            message,
        ),
        Err(e) => refuse(
            StatusCode::BAD_GATEWAY,
            "platform_unavailable",
            e.to_string(),
        ),
    }
}

fn not_a_reason() -> Response {
    refuse(
        StatusCode::BAD_REQUEST,
        "bad_request",
        format!("{ARTIFACT_REFUSED_HEADER}: not a reason and a size"),
    )
}

fn refuse(status: StatusCode, code: &str, message: String) -> Response {
    (status, Json(json!({"error": code, "message": message}))).into_response()
}

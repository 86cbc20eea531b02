//! The API's one error type: every failure is a typed JSON body
//! ([`airlock_api::v1::Error`]: `{"error": {"code": "...", "message": "..."}}`)
//! with its HTTP status.
//! Input never produces a 500; a 500 says only that the platform failed (the
//! cause goes to the log, never to the client).

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds, for a 429.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
    /// Also what another organization's id gets: nothing says it exists.
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such {what}"),
        )
    }
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }
    pub fn too_many(retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after.max(1)),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many requests with this API key; retry after the time in Retry-After",
            )
        }
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
    /// The store is out of space: nothing was written.
    pub fn storage_full() -> Self {
        Self::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "storage_full",
            "the platform's store is out of space; nothing was written. Try again once space is freed",
        )
    }
    /// The platform failed: logged here (with every cause), the client gets
    /// no detail.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!("API: {e}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the platform failed; see its log",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            axum::Json(airlock_api::v1::Error::new(self.code, self.message)),
        )
            .into_response();
        if let Some(s) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        r
    }
}

impl From<airlock_store::StoreError> for ApiError {
    fn from(e: airlock_store::StoreError) -> Self {
        use airlock_store::StoreError as E;
        match e {
            E::Invalid { what, reason } => Self::invalid(format!("{what}: {reason}")),
            E::ConnectionExists(n) => Self::conflict(format!("connection {n:?} already exists")),
            E::RunExists(n) => Self::conflict(format!("run {n:?} already exists")),
            E::Locked(_) | E::Unavailable { .. } => {
                tracing::warn!("API: store: {}", e.chain());
                Self::unavailable("the store is unavailable; try again")
            }
            E::QuotaExceeded { .. } => {
                Self::new(StatusCode::FORBIDDEN, "quota_exceeded", e.to_string())
            }
            E::Full { .. } => {
                tracing::error!("API: store: {}", e.chain());
                Self::storage_full()
            }
            other => Self::internal(other.chain()),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::JsonDataError(e) => Self::invalid(e.body_text()),
            JsonRejection::JsonSyntaxError(e) => Self::bad_request(e.body_text()),
            JsonRejection::MissingJsonContentType(_) => Self::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as JSON with Content-Type: application/json",
            ),
            JsonRejection::BytesRejection(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Self::too_large("the request body is larger than this route accepts")
            }
            other => Self::bad_request(other.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self::bad_request(r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        Self::bad_request(r.body_text())
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

// The failures many routes share, for the OpenAPI document: a route's
// `#[utoipa::path]` lists the sets it can answer beside its own statuses.
// Never built: each variant documents one status and its body.

/// What every route behind an API key can answer besides its own outcomes.
#[derive(utoipa::IntoResponses)]
pub enum KeyedFailures {
    /// unauthorized: no valid API key (missing, malformed, unknown or revoked)
    #[response(status = 401)]
    Unauthorized(airlock_api::v1::Error),
    /// rate_limited: too many requests with this key, or too many failed
    /// keys from this address; `Retry-After` says when to try again
    #[response(status = 429)]
    RateLimited(airlock_api::v1::Error),
    /// internal: the platform failed (its log has the cause)
    #[response(status = 500)]
    Internal(airlock_api::v1::Error),
    /// unavailable: the store does not answer, or the replica is starting
    #[response(status = 503)]
    Unavailable(airlock_api::v1::Error),
}

/// What a route that reads a JSON body can answer about it.
#[derive(utoipa::IntoResponses)]
pub enum BodyFailures {
    /// bad_request: the body is not JSON
    #[response(status = 400)]
    Malformed(airlock_api::v1::Error),
    /// too_large: the body (or a part of it) is larger than the route takes
    #[response(status = 413)]
    TooLarge(airlock_api::v1::Error),
    /// unsupported_media_type: the body is not sent as application/json
    #[response(status = 415)]
    NotJson(airlock_api::v1::Error),
    /// invalid: well-formed but not acceptable (an unknown or missing
    /// field, a value out of its rules)
    #[response(status = 422)]
    Invalid(airlock_api::v1::Error),
}

/// What a route that writes to the store can answer.
#[derive(utoipa::IntoResponses)]
pub enum WriteFailures {
    /// storage_full: the store is out of space; nothing was written
    #[response(status = 507)]
    StorageFull(airlock_api::v1::Error),
}

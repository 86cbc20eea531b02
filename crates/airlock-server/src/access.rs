//! Who may call `/v1`: every request but the document itself presents a
//! live API key ([`crate::auth`]) and stays within the key's rate limit; a
//! client address that keeps failing is slowed down.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

/// The `Authorization: Bearer` key of a request.
fn bearer(parts: &axum::http::HeaderMap) -> Option<&str> {
    let v = parts
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, rest) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// Whole seconds to wait, rounded up (a `Retry-After`).
fn ceil_secs(wait: std::time::Duration) -> u64 {
    wait.as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0))
}

/// Authenticates every `/v1` request but the document itself, and applies
/// the key's rate limit.
pub async fn require_key(State(app): State<AppState>, mut req: Request, next: Next) -> Response {
    // A client address that keeps failing gets 429 instead of 401 (a good
    // key from it still works: one tenant behind a shared address is never
    // locked out by another's mistakes).
    let client = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip().to_string());
    let failed = |e: ApiError| match client.as_deref().map(|c| app.auth_failures().check(c)) {
        Some(Err(wait)) => ApiError::too_many(ceil_secs(wait)).into_response(),
        _ => e.into_response(),
    };
    let Some(key) = bearer(req.headers()) else {
        return failed(ApiError::unauthorized(
            "send an API key as Authorization: Bearer alk_…",
        ));
    };
    let tenant = match app.auth().authenticate(app.store(), key).await {
        Ok(t) => t,
        Err(e) if e.status == axum::http::StatusCode::UNAUTHORIZED => return failed(e),
        Err(e) => return e.into_response(),
    };
    if let Err(wait) = app.limiter().check(&tenant.key_id) {
        return ApiError::too_many(ceil_secs(wait)).into_response();
    }
    req.extensions_mut().insert(tenant);
    next.run(req).await
}

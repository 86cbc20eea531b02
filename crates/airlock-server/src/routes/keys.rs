//! The caller's organization and its API keys.

use airlock_api::v1;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult};
use crate::error::{BodyFailures, KeyedFailures, WriteFailures};
use crate::extract::{Json, Path};
use crate::state::AppState;

/// The caller's organization.
#[utoipa::path(
    get,
    path = "/v1/org",
    operation_id = "get_org",
    tag = "org",
    security(("apiKey" = [])),
    responses(
        (status = 200, description = "the caller's organization", body = v1::Organization),
        (status = 404, description = "not_found: the organization was deleted", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn get_org(
    State(app): State<AppState>,
    t: Tenant,
) -> ApiResult<axum::Json<v1::Organization>> {
    let org = app
        .store()
        .get_org(&t.org_id)
        .await?
        .ok_or_else(|| ApiError::not_found("organization"))?;
    Ok(axum::Json(v1::Organization::from(&org)))
}

/// The organization's API keys (never a key itself).
#[utoipa::path(
    get,
    path = "/v1/api-keys",
    operation_id = "list_api_keys",
    tag = "api_keys",
    security(("apiKey" = [])),
    responses(
        (status = 200, description = "every key, revoked ones too", body = v1::ApiKeyList),
        KeyedFailures,
    ),
)]
pub async fn list(State(app): State<AppState>, t: Tenant) -> ApiResult<axum::Json<v1::ApiKeyList>> {
    let keys = app.store().list_api_keys(&t.org_id).await?;
    Ok(axum::Json(v1::ApiKeyList {
        api_keys: keys.iter().map(v1::ApiKey::from).collect(),
    }))
}

/// Creates an API key; the key is in this answer only.
#[utoipa::path(
    post,
    path = "/v1/api-keys",
    operation_id = "create_api_key",
    tag = "api_keys",
    security(("apiKey" = [])),
    request_body = v1::NewApiKey,
    responses(
        (status = 201, description = "created; `key` is shown in this answer only", body = v1::NewApiKeyAnswer),
        (status = 403, description = "quota_exceeded: the organization has ORG_MAX_API_KEYS live keys; nothing was written", body = v1::Error),
        BodyFailures,
        WriteFailures,
        KeyedFailures,
    ),
)]
pub async fn create(
    State(app): State<AppState>,
    t: Tenant,
    Json(b): Json<v1::NewApiKey>,
) -> ApiResult<Response> {
    super::check_name("API key name", &b.name)?;
    let (row, key) = app
        .auth()
        .create_key(app.store(), &t.org_id, &b.name, app.cfg().quotas.api_keys)
        .await?;
    // Shown once: only its hash is kept.
    let answer =
        v1::NewApiKeyAnswer::new(v1::ApiKey::from(&row), crate::auth::expose(&key).to_owned());
    Ok((StatusCode::CREATED, axum::Json(answer)).into_response())
}

/// Revokes an API key.
#[utoipa::path(
    delete,
    path = "/v1/api-keys/{id}",
    operation_id = "revoke_api_key",
    tag = "api_keys",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the key's id")),
    responses(
        (status = 204, description = "revoked: open event streams opened with it close"),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such key in the caller's organization", body = v1::Error),
        WriteFailures,
        KeyedFailures,
    ),
)]
pub async fn revoke(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    if app.store().revoke_api_key(&t.org_id, &id).await? {
        // This replica's open streams check their key at once (others'
        // within their recheck interval).
        app.key_revoked();
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found("API key"))
    }
}

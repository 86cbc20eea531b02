//! The caller's organization and its API keys.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::extract::{Json, Path};
use crate::{AppState, Tenant};

pub async fn get_org(State(app): State<AppState>, t: Tenant) -> ApiResult<Response> {
    let org = app
        .store()
        .get_org(&t.org_id)
        .await?
        .ok_or_else(|| ApiError::not_found("organization"))?;
    Ok(axum::Json(serde_json::json!({
        "id": org.id,
        "name": org.name,
        "max_concurrent_runs": org.max_concurrent_runs,
        "created_at": org.created_at,
    }))
    .into_response())
}

fn key_json(k: &airlock_store::ApiKeyRow) -> serde_json::Value {
    serde_json::json!({
        "id": k.id,
        "name": k.name,
        "created_at": k.created_at,
        "revoked_at": k.revoked_at,
    })
}

pub async fn list(State(app): State<AppState>, t: Tenant) -> ApiResult<Response> {
    let keys = app.store().list_api_keys(&t.org_id).await?;
    Ok(axum::Json(serde_json::json!({
        "api_keys": keys.iter().map(key_json).collect::<Vec<_>>()
    }))
    .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewKey {
    name: String,
}

pub async fn create(
    State(app): State<AppState>,
    t: Tenant,
    Json(b): Json<NewKey>,
) -> ApiResult<Response> {
    super::check_name("API key name", &b.name)?;
    let (row, key) = app
        .auth()
        .create_key(app.store(), &t.org_id, &b.name, app.cfg().quotas.api_keys)
        .await?;
    let mut v = key_json(&row);
    // Shown once: only its hash is kept.
    v["key"] = serde_json::Value::String(crate::auth::expose(&key).to_owned());
    Ok((StatusCode::CREATED, axum::Json(v)).into_response())
}

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

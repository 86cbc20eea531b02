//! Connections: an organization's encrypted credentials. No route ever
//! returns a secret: not on creation, listing, rotation or deletion.

use std::collections::BTreeMap;

use airlock_platform::connections::{ConnectionError, Fields};
use airlock_store::{AuthType, ConnectionInfo};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use zeroize::Zeroizing;

use crate::error::{ApiError, ApiResult};
use crate::extract::{Json, Path};
use crate::{AppState, Tenant};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewConnection {
    name: String,
    integration: String,
    #[serde(rename = "type")]
    auth_type: String,
    fields: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rotate {
    fields: BTreeMap<String, String>,
}

fn fields(f: BTreeMap<String, String>) -> Fields {
    f.into_iter().map(|(k, v)| (k, Zeroizing::new(v))).collect()
}

fn info_json(c: &ConnectionInfo) -> serde_json::Value {
    serde_json::json!({
        "name": c.name,
        "integration": c.integration,
        "type": c.auth_type.as_str(),
        "kid": c.kid,
        "created_at": c.created_at,
        "updated_at": c.updated_at,
    })
}

fn map_err(e: ConnectionError) -> ApiError {
    match e {
        ConnectionError::Fields(m) => ApiError::invalid(m),
        ConnectionError::Store(s) => s.into(),
        ConnectionError::Vault(v) => ApiError::internal(v),
    }
}

async fn info(app: &AppState, org: &str, name: &str) -> ApiResult<ConnectionInfo> {
    app.store()
        .get_connection(org, name)
        .await?
        .map(|r| r.info)
        .ok_or_else(|| ApiError::not_found("connection"))
}

pub async fn create(
    State(app): State<AppState>,
    t: Tenant,
    Json(b): Json<NewConnection>,
) -> ApiResult<Response> {
    super::check_name("connection name", &b.name)?;
    super::check_name("integration", &b.integration)?;
    let auth_type = AuthType::parse(&b.auth_type).ok_or_else(|| {
        ApiError::invalid(format!(
            "type {:?} is not one of {}",
            b.auth_type,
            AuthType::ALL.map(AuthType::as_str).join(", ")
        ))
    })?;
    airlock_platform::connections::store_connection(
        app.store(),
        app.keyring(),
        &t.org_id,
        &b.name,
        &b.integration,
        auth_type,
        &fields(b.fields),
    )
    .await
    .map_err(map_err)?;
    let c = info(&app, &t.org_id, &b.name).await?;
    Ok((StatusCode::CREATED, axum::Json(info_json(&c))).into_response())
}

pub async fn list(State(app): State<AppState>, t: Tenant) -> ApiResult<Response> {
    let list = app.store().list_connections(&t.org_id).await?;
    Ok(axum::Json(serde_json::json!({
        "connections": list.iter().map(info_json).collect::<Vec<_>>()
    }))
    .into_response())
}

pub async fn get(
    State(app): State<AppState>,
    t: Tenant,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    Ok(axum::Json(info_json(&info(&app, &t.org_id, &name).await?)).into_response())
}

pub async fn rotate(
    State(app): State<AppState>,
    t: Tenant,
    Path(name): Path<String>,
    Json(b): Json<Rotate>,
) -> ApiResult<Response> {
    let found = airlock_platform::connections::rotate_connection(
        app.store(),
        app.keyring(),
        &t.org_id,
        &name,
        &fields(b.fields),
    )
    .await
    .map_err(map_err)?;
    if !found {
        return Err(ApiError::not_found("connection"));
    }
    Ok(axum::Json(info_json(&info(&app, &t.org_id, &name).await?)).into_response())
}

pub async fn delete(
    State(app): State<AppState>,
    t: Tenant,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    if app.store().delete_connection(&t.org_id, &name).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found("connection"))
    }
}

//! Connections: an organization's encrypted credentials. No route ever
//! returns a secret: not on creation, listing, rotation or deletion.

use std::collections::BTreeMap;

use airlock_api::v1;
use airlock_platform::connections::{ConnectionError, Fields};
use airlock_store::{AuthType, ConnectionInfo};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use zeroize::Zeroizing;

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult, BodyFailures, KeyedFailures, WriteFailures};
use crate::extract::{Json, Path};
use crate::state::AppState;

fn fields(f: BTreeMap<String, String>) -> Fields {
    f.into_iter().map(|(k, v)| (k, Zeroizing::new(v))).collect()
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

/// Stores a credential, encrypted; no route returns it.
#[utoipa::path(
    post,
    path = "/v1/connections",
    operation_id = "create_connection",
    tag = "connections",
    security(("apiKey" = [])),
    request_body = v1::NewConnection,
    responses(
        (status = 201, description = "stored (never the secret in the answer)", body = v1::Connection),
        (status = 403, description = "quota_exceeded: the organization has ORG_MAX_CONNECTIONS connections; nothing was written", body = v1::Error),
        (status = 409, description = "conflict: a connection of that name exists (rotate it with PUT)", body = v1::Error),
        BodyFailures,
        WriteFailures,
        KeyedFailures,
    ),
)]
pub async fn create(
    State(app): State<AppState>,
    t: Tenant,
    Json(b): Json<v1::NewConnection>,
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
    let owner = airlock_platform::connections::Owner {
        org: &t.org_id,
        max_connections: app.cfg().quotas.connections,
    };
    airlock_platform::connections::store_connection(
        app.store(),
        app.keyring(),
        owner,
        &b.name,
        &b.integration,
        auth_type,
        &fields(b.fields),
    )
    .await
    .map_err(map_err)?;
    let c = info(&app, &t.org_id, &b.name).await?;
    Ok((StatusCode::CREATED, axum::Json(v1::Connection::from(&c))).into_response())
}

/// The organization's connections (never a secret).
#[utoipa::path(
    get,
    path = "/v1/connections",
    operation_id = "list_connections",
    tag = "connections",
    security(("apiKey" = [])),
    responses(
        (status = 200, description = "every connection, never a secret", body = v1::ConnectionList),
        KeyedFailures,
    ),
)]
pub async fn list(
    State(app): State<AppState>,
    t: Tenant,
) -> ApiResult<axum::Json<v1::ConnectionList>> {
    let list = app.store().list_connections(&t.org_id).await?;
    Ok(axum::Json(v1::ConnectionList {
        connections: list.iter().map(v1::Connection::from).collect(),
    }))
}

/// One connection (never its secret).
#[utoipa::path(
    get,
    path = "/v1/connections/{name}",
    operation_id = "get_connection",
    tag = "connections",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "the connection's name")),
    responses(
        (status = 200, description = "the connection, never its secret", body = v1::Connection),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such connection in the caller's organization", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn get(
    State(app): State<AppState>,
    t: Tenant,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<v1::Connection>> {
    Ok(axum::Json(v1::Connection::from(
        &info(&app, &t.org_id, &name).await?,
    )))
}

/// Replaces a connection's secret (a rotation).
#[utoipa::path(
    put,
    path = "/v1/connections/{name}",
    operation_id = "put_connection",
    tag = "connections",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "the connection's name")),
    request_body = v1::RotateConnection,
    responses(
        (status = 200, description = "rotated", body = v1::Connection),
        (status = 404, description = "not_found: no such connection in the caller's organization", body = v1::Error),
        BodyFailures,
        WriteFailures,
        KeyedFailures,
    ),
)]
pub async fn rotate(
    State(app): State<AppState>,
    t: Tenant,
    Path(name): Path<String>,
    Json(b): Json<v1::RotateConnection>,
) -> ApiResult<axum::Json<v1::Connection>> {
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
    Ok(axum::Json(v1::Connection::from(
        &info(&app, &t.org_id, &name).await?,
    )))
}

/// Removes a connection.
#[utoipa::path(
    delete,
    path = "/v1/connections/{name}",
    operation_id = "delete_connection",
    tag = "connections",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "the connection's name")),
    responses(
        (status = 204, description = "removed"),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such connection in the caller's organization", body = v1::Error),
        WriteFailures,
        KeyedFailures,
    ),
)]
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

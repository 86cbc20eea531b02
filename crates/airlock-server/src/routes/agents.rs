//! Agents: a manifest (`airlock.toml`'s text) and the files of its
//! directory, registered under the manifest's `agent.name`. A run starts
//! from what is registered when it starts.

use airlock_api::v1;
use airlock_platform::manifest::Manifest;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::auth::Tenant;
use crate::bundle::{MAX_BUNDLE_BYTES, MAX_FILES, check_path};
use crate::error::{ApiError, ApiResult, BodyFailures, KeyedFailures, WriteFailures};
use crate::extract::{Json, Path};
use crate::state::AppState;

/// The agents route's body limit: the one route above the API's 1 MiB
/// elsewhere, because its body carries a whole agent directory. Its files
/// may hold [`MAX_BUNDLE_BYTES`] (4 MiB), and JSON
/// escaping can nearly double a file that is mostly quotes, backslashes or
/// newlines: twice the bundle, so any bundle within its own cap arrives
/// and is judged by that cap (a typed 413 naming the files' size) rather
/// than cut at the transport.
pub const MAX_BODY: usize = 2 * MAX_BUNDLE_BYTES;

/// Registers an agent (manifest and files) under its agent.name; 200 when it replaces one.
#[utoipa::path(
    post,
    path = "/v1/agents",
    operation_id = "register_agent",
    tag = "agents",
    security(("apiKey" = [])),
    request_body = v1::RegisterAgent,
    responses(
        (status = 201, description = "registered", body = v1::Agent),
        (status = 200, description = "registered in place of the agent of that name", body = v1::Agent),
        (status = 403, description = "quota_exceeded: the organization has ORG_MAX_AGENTS agents and this name is a new one; nothing was written", body = v1::Error),
        BodyFailures,
        WriteFailures,
        KeyedFailures,
    ),
)]
pub async fn register(
    State(app): State<AppState>,
    t: Tenant,
    Json(b): Json<v1::RegisterAgent>,
) -> ApiResult<Response> {
    // Every mistake is found here, before anything is stored or started.
    let m =
        Manifest::parse(&b.manifest).map_err(|e| ApiError::invalid(format!("manifest: {e}")))?;
    m.validate()
        .map_err(|e| ApiError::invalid(format!("manifest: {e}")))?;
    let name = m.agent.name.as_str().to_owned();
    super::check_name("agent.name", &name)?;
    if b.files.len() > MAX_FILES {
        return Err(ApiError::invalid(format!("at most {MAX_FILES} files")));
    }
    let mut total = 0usize;
    for (p, body) in &b.files {
        check_path(p)?;
        total += body.len();
    }
    if total > MAX_BUNDLE_BYTES {
        return Err(ApiError::too_large(format!(
            "the files hold more than {MAX_BUNDLE_BYTES} bytes"
        )));
    }
    let files = serde_json::to_string(&b.files).map_err(ApiError::internal)?;
    let existed = app.store().get_agent(&t.org_id, &name).await?.is_some();
    let row = app
        .store()
        .put_agent(
            &t.org_id,
            &name,
            &b.manifest,
            &files,
            app.cfg().quotas.agents,
        )
        .await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, axum::Json(v1::Agent::of(&row, false))).into_response())
}

/// The organization's agents.
#[utoipa::path(
    get,
    path = "/v1/agents",
    operation_id = "list_agents",
    tag = "agents",
    security(("apiKey" = [])),
    responses(
        (status = 200, description = "every agent, without its manifest", body = v1::AgentList),
        KeyedFailures,
    ),
)]
pub async fn list(State(app): State<AppState>, t: Tenant) -> ApiResult<axum::Json<v1::AgentList>> {
    let agents = app.store().list_agents(&t.org_id).await?;
    Ok(axum::Json(v1::AgentList {
        agents: agents.iter().map(|a| v1::Agent::of(a, false)).collect(),
    }))
}

/// One agent, with its manifest.
#[utoipa::path(
    get,
    path = "/v1/agents/{name}",
    operation_id = "get_agent",
    tag = "agents",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "the agent's name")),
    responses(
        (status = 200, description = "the agent and its manifest's text", body = v1::Agent),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such agent in the caller's organization", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn get(
    State(app): State<AppState>,
    t: Tenant,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<v1::Agent>> {
    let a = app
        .store()
        .get_agent(&t.org_id, &name)
        .await?
        .ok_or_else(|| ApiError::not_found("agent"))?;
    Ok(axum::Json(v1::Agent::of(&a, true)))
}

/// Removes an agent.
#[utoipa::path(
    delete,
    path = "/v1/agents/{name}",
    operation_id = "delete_agent",
    tag = "agents",
    security(("apiKey" = [])),
    params(("name" = String, Path, description = "the agent's name")),
    responses(
        (status = 204, description = "removed (runs already queued fail when they start)"),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such agent in the caller's organization", body = v1::Error),
        WriteFailures,
        KeyedFailures,
    ),
)]
pub async fn delete(
    State(app): State<AppState>,
    t: Tenant,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    if app.store().delete_agent(&t.org_id, &name).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found("agent"))
    }
}

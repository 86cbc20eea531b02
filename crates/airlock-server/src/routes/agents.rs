//! Agents: a manifest (`airlock.toml`'s text) and the files of its
//! directory, registered under the manifest's `agent.name`. A run starts
//! from what is registered when it starts.

use std::collections::BTreeMap;

use airlock_platform::manifest::Manifest;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::extract::{Json, Path};
use crate::{AppState, Tenant};

/// At most this many files in a bundle.
pub const MAX_FILES: usize = 256;
/// At most this many bytes of file content in a bundle.
pub const MAX_BUNDLE_BYTES: usize = 4 << 20;
/// The agents route's body limit (JSON escaping included).
pub const MAX_BODY: usize = 8 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Register {
    /// The manifest's TOML text.
    manifest: String,
    /// Relative path → UTF-8 content.
    #[serde(default)]
    files: BTreeMap<String, String>,
}

/// A bundle path: relative, `/`-separated, no `.`/`..`/empty segment, no
/// control characters, at most 200 bytes.
pub fn check_path(p: &str) -> Result<(), ApiError> {
    let bad = |why: &str| Err(ApiError::invalid(format!("file path {p:?}: {why}")));
    if p.is_empty() || p.len() > 200 {
        return bad("must be 1-200 bytes");
    }
    if p.starts_with('/') || p.contains('\\') {
        return bad("must be relative, with / between segments");
    }
    if p.chars().any(char::is_control) {
        return bad("has a control character");
    }
    if p.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return bad("has an empty, . or .. segment");
    }
    Ok(())
}

fn agent_json(a: &airlock_store::AgentRow, with_manifest: bool) -> serde_json::Value {
    let files: BTreeMap<String, String> = serde_json::from_str(&a.files).unwrap_or_default();
    let mut v = serde_json::json!({
        "name": a.name,
        "files": files.keys().collect::<Vec<_>>(),
        "created_at": a.created_at,
        "updated_at": a.updated_at,
    });
    if with_manifest {
        v["manifest"] = serde_json::Value::String(a.manifest.clone());
    }
    v
}

pub async fn register(
    State(app): State<AppState>,
    t: Tenant,
    Json(b): Json<Register>,
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
        .put_agent(&t.org_id, &name, &b.manifest, &files)
        .await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, axum::Json(agent_json(&row, false))).into_response())
}

pub async fn list(State(app): State<AppState>, t: Tenant) -> ApiResult<Response> {
    let agents = app.store().list_agents(&t.org_id).await?;
    Ok(axum::Json(serde_json::json!({
        "agents": agents.iter().map(|a| agent_json(a, false)).collect::<Vec<_>>()
    }))
    .into_response())
}

pub async fn get(
    State(app): State<AppState>,
    t: Tenant,
    Path(name): Path<String>,
) -> ApiResult<Response> {
    let a = app
        .store()
        .get_agent(&t.org_id, &name)
        .await?
        .ok_or_else(|| ApiError::not_found("agent"))?;
    Ok(axum::Json(agent_json(&a, true)).into_response())
}

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

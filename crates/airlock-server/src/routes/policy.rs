//! A running run's live egress rules (docs/egress.md, "Live policy"):
//! shown, and changed within its manifest's rules; the sidecar applies a
//! change through its long-poll (`airlock_platform::internal_api`).
//!
//! Contracts: a run of another organization is 404 like an unknown id; a
//! change to a run that is not running is 409; a rule no manifest rule of
//! its list contains is a 422 naming it; whatever is refused changes
//! nothing. Each change is stored with its actor (the API key) and is a
//! `policy_change` event on the run's stream and in its audit.

use std::time::Duration;

use airlock_api::v1;
use airlock_platform_api::policy::{POLICY_CHANGE_EVENT, PolicyChange, PolicyError, PolicyRules};
use airlock_store::{NewEvent, RunStatus, StoreError};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult, BodyFailures, KeyedFailures, WriteFailures};
use crate::extract::{Json, Path, Query};
use crate::routes::runs::the_run;
use crate::state::AppState;

/// How long `?wait=true` waits for the sidecar.
const WAIT_APPLIED: Duration = Duration::from_secs(10);
/// How often a wait reads the store besides being woken (a report taken
/// by another replica wakes this one only through its watcher).
const WAIT_POLL: Duration = Duration::from_millis(250);

/// A run's live egress rules, their version and the version its sidecar applied.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/policy",
    operation_id = "get_run_policy",
    tag = "runs",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id")),
    responses(
        (status = 200, description = "the live rules, the manifest's, and the versions", body = v1::RunPolicy),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such run in the caller's organization", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn get(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<v1::RunPolicy>> {
    the_run(&app, &t, &id).await?;
    Ok(axum::Json(view(&app, &id).await?))
}

/// Replaces a running run's live egress rules within its manifest's (or `reset` to them).
#[utoipa::path(
    patch,
    path = "/v1/runs/{id}/policy",
    operation_id = "set_run_policy",
    tag = "runs",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the run's id"), v1::PolicyQuery),
    request_body = v1::SetRunPolicy,
    responses(
        (status = 200, description = "changed (with wait: and applied by the run's sidecar)", body = v1::RunPolicy),
        (status = 202, description = "changed; with wait, the sidecar had not applied it within 10 s", body = v1::RunPolicy),
        (status = 404, description = "not_found: no such run in the caller's organization", body = v1::Error),
        (status = 409, description = "conflict: the run is not running, or its policy changed since expect_version; policy_changes_exhausted: the run's 256 changes are used; nothing changed", body = v1::Error),
        BodyFailures,
        WriteFailures,
        KeyedFailures,
        // After BodyFailures: these are the ones documented.
        (status = 422, description = "beyond_manifest: a rule no manifest rule of its list contains (named); invalid: a rule that does not load, an unknown integration, neither or both of rules and reset; nothing changed", body = v1::Error),
    ),
)]
pub async fn set(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
    Query(q): Query<v1::PolicyQuery>,
    Json(b): Json<v1::SetRunPolicy>,
) -> ApiResult<Response> {
    let run = the_run(&app, &t, &id).await?;
    if run.status != RunStatus::Running {
        return Err(ApiError::conflict(format!(
            "the run is {}: only a running run's policy changes",
            run.status
        )));
    }
    let ceiling = ceiling(&app, &id).await?;
    let rules = match (b.rules, b.reset) {
        (Some(lists), false) => from_v1(&lists)?,
        (None, true) => ceiling.clone(),
        _ => return Err(ApiError::invalid("give exactly one of rules and reset")),
    };
    rules.compile(&ceiling).map_err(refused)?;
    let store = app.store();
    let current = store.policy_version(&id).await?;
    if let Some(expected) = b.expect_version.filter(|v| *v != current) {
        return Err(ApiError::conflict(format!(
            "the policy is at version {current}, not {expected}; nothing changed"
        )));
    }
    let old = live_rules(&app, &id, current, &ceiling).await?;
    let actor = format!("key {}", t.key_id);
    let text = serde_json::to_string(&rules).map_err(ApiError::internal)?;
    let version = match store.change_policy(&id, current, &text, &actor).await {
        Ok(v) => v,
        Err(e @ StoreError::PolicyChanged { .. }) => return Err(ApiError::conflict(e.to_string())),
        Err(e @ StoreError::PolicyChangesExhausted { .. }) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "policy_changes_exhausted",
                e.to_string(),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let change = PolicyChange {
        at: airlock_store::now_ms(),
        actor,
        version,
        old_version: current,
        old_rules: old.rule_ids(),
        new_rules: rules.rule_ids(),
        reset: b.reset,
    };
    let payload = serde_json::to_string(&change).map_err(ApiError::internal)?;
    store
        .append_event(&NewEvent {
            run_id: &id,
            at: change.at,
            kind: POLICY_CHANGE_EVENT,
            payload: &payload,
        })
        .await?;
    let applied = !q.wait.unwrap_or(false) || wait_applied(&app, &id, version).await?;
    let status = if applied {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, axum::Json(view(&app, &id).await?)).into_response())
}

/// Whether the run's sidecar reported `version` applied within
/// [`WAIT_APPLIED`] (woken by each report this process stores or its
/// watcher sees; the run's end ends the wait).
async fn wait_applied(app: &AppState, id: &str, version: i64) -> ApiResult<bool> {
    let store = app.store();
    let mut writes = store.policy_watch();
    let deadline = tokio::time::Instant::now() + WAIT_APPLIED;
    loop {
        writes.borrow_and_update();
        if store.policy_applied(id).await? >= version {
            return Ok(true);
        }
        let running = store
            .get_run(id)
            .await?
            .is_some_and(|r| r.status == RunStatus::Running);
        if !running || tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        let poll = tokio::time::sleep(WAIT_POLL);
        tokio::select! {
            _ = writes.changed() => {}
            () = poll => {}
        }
    }
}

fn refused(e: PolicyError) -> ApiError {
    match e.rule() {
        Some(_) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "beyond_manifest",
            format!("{e}; nothing changed"),
        ),
        None => ApiError::invalid(format!("{e}; nothing changed")),
    }
}

/// The run's manifest rules (version 0; none stored: none).
async fn ceiling(app: &AppState, id: &str) -> ApiResult<PolicyRules> {
    match app.store().policy_at(id, 0).await? {
        Some(row) => serde_json::from_str(&row.rules).map_err(ApiError::internal),
        None => Ok(PolicyRules::default()),
    }
}

/// The rules of `version` (0: the manifest's).
async fn live_rules(
    app: &AppState,
    id: &str,
    version: i64,
    ceiling: &PolicyRules,
) -> ApiResult<PolicyRules> {
    if version == 0 {
        return Ok(ceiling.clone());
    }
    match app.store().policy_at(id, version).await? {
        Some(row) => serde_json::from_str(&row.rules).map_err(ApiError::internal),
        None => Err(ApiError::internal(format!(
            "run {id}'s policy version {version} is not stored"
        ))),
    }
}

async fn view(app: &AppState, id: &str) -> ApiResult<v1::RunPolicy> {
    let store = app.store();
    let version = store.policy_version(id).await?;
    let row = store.policy_at(id, version).await?;
    let ceiling = ceiling(app, id).await?;
    let rules = live_rules(app, id, version, &ceiling).await?;
    Ok(v1::RunPolicy {
        actor: row
            .as_ref()
            .map_or_else(|| "manifest".to_owned(), |r| r.actor.clone()),
        applied_version: store.policy_applied(id).await?,
        at: row.map(|r| r.at),
        manifest: to_v1(&ceiling)?,
        rules: to_v1(&rules)?,
        version,
    })
}

/// The API's lists as the contract's: the same JSON, read by the rule
/// grammar's own types (a rule that does not read is a 422).
fn from_v1(lists: &v1::PolicyLists) -> ApiResult<PolicyRules> {
    let value = serde_json::to_value(lists).map_err(ApiError::internal)?;
    serde_json::from_value(value).map_err(|e| ApiError::invalid(format!("rules: {e}")))
}

fn to_v1(rules: &PolicyRules) -> ApiResult<v1::PolicyLists> {
    let value = serde_json::to_value(rules).map_err(ApiError::internal)?;
    serde_json::from_value(value).map_err(ApiError::internal)
}

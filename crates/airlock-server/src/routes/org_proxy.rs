//! The organization's choice among the operator's upstream proxies
//! (`SYSTEM_PROXIES`), by name: the choice is stored, the URL never leaves
//! the platform's settings (`airlock_platform::proxies`).

use airlock_api::v1;
use axum::extract::State;

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult, BodyFailures, KeyedFailures, WriteFailures};
use crate::extract::Json;
use crate::state::AppState;

/// The operator proxies offered and the one the organization chose.
#[utoipa::path(
    get,
    path = "/v1/org/proxy",
    operation_id = "get_org_proxy",
    tag = "org",
    security(("apiKey" = [])),
    responses(
        (status = 200, description = "the proxies offered, by name, and the organization's choice", body = v1::OrgProxy),
        KeyedFailures,
    ),
)]
pub async fn get(State(app): State<AppState>, t: Tenant) -> ApiResult<axum::Json<v1::OrgProxy>> {
    answer(&app, &t.org_id).await.map(axum::Json)
}

/// Chooses the operator proxy the organization's runs go through (`null`:
/// none); runs started from then use it.
#[utoipa::path(
    put,
    path = "/v1/org/proxy",
    operation_id = "set_org_proxy",
    tag = "org",
    security(("apiKey" = [])),
    request_body = v1::SetOrgProxy,
    responses(
        (status = 200, description = "set: the proxies offered and the choice", body = v1::OrgProxy),
        BodyFailures,
        WriteFailures,
        KeyedFailures,
    ),
)]
pub async fn set(
    State(app): State<AppState>,
    t: Tenant,
    Json(b): Json<v1::SetOrgProxy>,
) -> ApiResult<axum::Json<v1::OrgProxy>> {
    let offered = &app.orch().settings.system_proxies;
    if let Some(name) = &b.proxy
        && !offered.offers(name)
    {
        return Err(ApiError::invalid(format!(
            "proxy: {name:?} is not offered (offered: {})",
            offered.names().join(", ")
        )));
    }
    app.store()
        .set_org_proxy(&t.org_id, b.proxy.as_deref())
        .await?;
    answer(&app, &t.org_id).await.map(axum::Json)
}

async fn answer(app: &AppState, org: &str) -> ApiResult<v1::OrgProxy> {
    Ok(v1::OrgProxy {
        offered: app.orch().settings.system_proxies.names(),
        proxy: app.store().org_proxy(org).await?,
    })
}

//! The organization's model budgets: set here, kept by every run's relay
//! (each model call is reserved against them before it leaves; see
//! `docs/budgets.md`).

use airlock_api::v1;
use axum::extract::State;

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult, BodyFailures, KeyedFailures, WriteFailures};
use crate::extract::Json;
use crate::state::AppState;

/// The organization's model budgets and what today and this month (UTC) spent.
#[utoipa::path(
    get,
    path = "/v1/org/budget",
    operation_id = "get_org_budget",
    tag = "org",
    security(("apiKey" = [])),
    responses(
        (status = 200, description = "the budgets (`null`: no limit) and the spend of the current day and month", body = v1::OrgBudget),
        KeyedFailures,
    ),
)]
pub async fn get(State(app): State<AppState>, t: Tenant) -> ApiResult<axum::Json<v1::OrgBudget>> {
    answer(&app, &t.org_id).await.map(axum::Json)
}

/// Sets the organization's model budgets and the thresholds at which its
/// webhooks hear of each budget's spend; runs already going keep them from
/// their next model call.
#[utoipa::path(
    put,
    path = "/v1/org/budget",
    operation_id = "set_org_budget",
    tag = "org",
    security(("apiKey" = [])),
    request_body = v1::SetOrgBudget,
    responses(
        (status = 200, description = "set: the budgets and the current spend", body = v1::OrgBudget),
        BodyFailures,
        WriteFailures,
        KeyedFailures,
    ),
)]
pub async fn set(
    State(app): State<AppState>,
    t: Tenant,
    Json(b): Json<v1::SetOrgBudget>,
) -> ApiResult<axum::Json<v1::OrgBudget>> {
    for (period, l) in [("day", &b.day), ("month", &b.month)] {
        for (measure, v) in [
            ("tokens", l.tokens),
            ("cost_microusd", l.cost_microusd),
            ("requests", l.requests),
        ] {
            if v.is_some_and(|v| v < 1) {
                return Err(ApiError::invalid(format!(
                    "{period}.{measure} must be at least 1 (null: no limit)"
                )));
            }
        }
    }
    let thresholds = match &b.thresholds {
        None => airlock_store::Thresholds::default(),
        Some(f) => airlock_store::Thresholds::from_fractions(f)
            .map_err(|e| ApiError::invalid(format!("thresholds: {e}")))?,
    };
    let budget = airlock_store::OrgBudget {
        day: b.day.into(),
        month: b.month.into(),
    };
    app.store().set_org_budget(&t.org_id, &budget).await?;
    app.store()
        .set_budget_thresholds(&t.org_id, &thresholds)
        .await?;
    answer(&app, &t.org_id).await.map(axum::Json)
}

async fn answer(app: &AppState, org: &str) -> ApiResult<v1::OrgBudget> {
    let budget = app.store().org_budget(org).await?;
    let periods = airlock_platform::budget::periods_at(airlock_store::now_ms());
    let (day, month) = app.store().org_spend(org, &periods).await?;
    Ok(v1::OrgBudget {
        day: budget.day.into(),
        day_spend: v1::PeriodSpend::new(&periods.day, &day),
        month: budget.month.into(),
        month_spend: v1::PeriodSpend::new(&periods.month, &month),
        thresholds: app.store().budget_thresholds(org).await?.fractions(),
    })
}

//! Webhooks: the URL is judged by the egress guard here (and again at every
//! delivery); the signing secret is shown once, then kept encrypted.

use airlock_api::v1;
use airlock_store::WebhookRow;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::auth::Tenant;
use crate::error::{ApiError, ApiResult, BodyFailures, KeyedFailures, WriteFailures};
use crate::extract::{Json, Path, Query};
use crate::state::AppState;

/// Subscribes a URL to run events; the signing secret is in this answer only.
#[utoipa::path(
    post,
    path = "/v1/webhooks",
    operation_id = "create_webhook",
    tag = "webhooks",
    security(("apiKey" = [])),
    request_body = v1::NewWebhook,
    responses(
        (status = 201, description = "subscribed; `secret` is shown in this answer only", body = v1::NewWebhookAnswer),
        (status = 403, description = "quota_exceeded: the organization has ORG_MAX_WEBHOOKS webhooks; nothing was written", body = v1::Error),
        BodyFailures,
        WriteFailures,
        KeyedFailures,
        // After BodyFailures: this 422 is the one documented.
        (status = 422, description = "invalid, or url_refused: the egress guard refuses the URL (the message names the rule)", body = v1::Error),
    ),
)]
pub async fn create(
    State(app): State<AppState>,
    t: Tenant,
    Json(b): Json<v1::NewWebhook>,
) -> ApiResult<Response> {
    if b.url.len() > 2048 {
        return Err(ApiError::invalid("url is longer than 2048 bytes"));
    }
    if b.events.is_empty() {
        return Err(ApiError::invalid(format!(
            "events must name at least one of {}",
            crate::webhooks::EVENTS.join(", ")
        )));
    }
    let mut events = Vec::new();
    for e in &b.events {
        if !crate::webhooks::EVENTS.contains(&e.as_str()) {
            return Err(ApiError::invalid(format!(
                "event {e:?} is not one of {}",
                crate::webhooks::EVENTS.join(", ")
            )));
        }
        if !events.contains(e) {
            events.push(e.clone());
        }
    }
    // The guard's decision, now: a URL it refuses is never stored. The
    // tenant reads the rule; the operator's log also the address.
    let refused = |e: airlock_egress::EgressError| {
        tracing::info!(org = %t.org_id, "webhook URL refused: {}", e.operator_message());
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "url_refused",
            format!("the egress guard refuses this URL: {}", e.tenant_message()),
        )
    };
    let authorized = crate::webhooks::authorized_for(&b.url).map_err(refused)?;
    app.webhook_client()
        .admit(
            &b.url,
            &http::Method::POST,
            &crate::webhooks::rules(&authorized),
        )
        .await
        .map_err(refused)?;
    let secret = format!(
        "whsec_{}",
        airlock_vault::random_hex::<32>().map_err(ApiError::internal)?
    );
    let envelope = app
        .keyring()
        .encrypt(secret.as_bytes())
        .map_err(ApiError::internal)?;
    let row = WebhookRow {
        id: format!(
            "wh_{}",
            airlock_vault::random_hex::<8>().map_err(ApiError::internal)?
        ),
        org_id: t.org_id.clone(),
        url: b.url,
        events: serde_json::to_string(&events).map_err(ApiError::internal)?,
        secret_envelope: envelope,
        created_at: airlock_store::now_ms(),
    };
    app.store()
        .create_webhook(&row, app.cfg().quotas.webhooks)
        .await?;
    let answer = v1::NewWebhookAnswer::new(v1::Webhook::from(&row), secret);
    Ok((StatusCode::CREATED, axum::Json(answer)).into_response())
}

/// The organization's webhooks.
#[utoipa::path(
    get,
    path = "/v1/webhooks",
    operation_id = "list_webhooks",
    tag = "webhooks",
    security(("apiKey" = [])),
    responses(
        (status = 200, description = "every webhook (never a secret)", body = v1::WebhookList),
        KeyedFailures,
    ),
)]
pub async fn list(
    State(app): State<AppState>,
    t: Tenant,
) -> ApiResult<axum::Json<v1::WebhookList>> {
    let hooks = app.store().list_webhooks(&t.org_id).await?;
    Ok(axum::Json(v1::WebhookList {
        webhooks: hooks.iter().map(v1::Webhook::from).collect(),
    }))
}

async fn hook(app: &AppState, org: &str, id: &str) -> ApiResult<WebhookRow> {
    app.store()
        .get_webhook(org, id)
        .await?
        .ok_or_else(|| ApiError::not_found("webhook"))
}

/// One webhook.
#[utoipa::path(
    get,
    path = "/v1/webhooks/{id}",
    operation_id = "get_webhook",
    tag = "webhooks",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the webhook's id")),
    responses(
        (status = 200, description = "the webhook (never its secret)", body = v1::Webhook),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such webhook in the caller's organization", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn get(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
) -> ApiResult<axum::Json<v1::Webhook>> {
    Ok(axum::Json(v1::Webhook::from(
        &hook(&app, &t.org_id, &id).await?,
    )))
}

/// Removes a webhook.
#[utoipa::path(
    delete,
    path = "/v1/webhooks/{id}",
    operation_id = "delete_webhook",
    tag = "webhooks",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the webhook's id")),
    responses(
        (status = 204, description = "removed"),
        (status = 400, description = "bad_request: the path is malformed", body = v1::Error),
        (status = 404, description = "not_found: no such webhook in the caller's organization", body = v1::Error),
        WriteFailures,
        KeyedFailures,
    ),
)]
pub async fn delete(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    if app.store().delete_webhook(&t.org_id, &id).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found("webhook"))
    }
}

/// A webhook's deliveries and how each went, newest first (limit, cursor).
#[utoipa::path(
    get,
    path = "/v1/webhooks/{id}/deliveries",
    operation_id = "list_webhook_deliveries",
    tag = "webhooks",
    security(("apiKey" = [])),
    params(("id" = String, Path, description = "the webhook's id"), v1::PageQuery),
    responses(
        (status = 200, description = "one page of deliveries, newest first", body = v1::DeliveryList),
        (status = 400, description = "bad_request: the query or path is malformed, or limit is out of range", body = v1::Error),
        (status = 404, description = "not_found: no such webhook in the caller's organization", body = v1::Error),
        KeyedFailures,
    ),
)]
pub async fn deliveries(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
    Query(q): Query<v1::PageQuery>,
) -> ApiResult<axum::Json<v1::DeliveryList>> {
    let limit = super::page_limit(q.limit)?;
    let cursor = super::page_cursor(q.cursor.as_deref())?;
    hook(&app, &t.org_id, &id).await?;
    let list = app
        .store()
        .list_deliveries(
            &t.org_id,
            &id,
            i64::from(limit),
            cursor.as_ref().map(|c| (c.created_at, c.id.as_str())),
        )
        .await?;
    let next_cursor = super::next_cursor(&list, limit, |d| (d.created_at, d.id.as_str()));
    Ok(axum::Json(v1::DeliveryList {
        deliveries: list.iter().map(v1::Delivery::from).collect(),
        next_cursor,
    }))
}

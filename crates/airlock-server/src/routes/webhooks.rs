//! Webhooks: the URL is judged by the egress guard here (and again at every
//! delivery); the signing secret is shown once, then kept encrypted.

use airlock_store::WebhookRow;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::extract::{Json, Path, Query};
use crate::{AppState, Tenant};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewWebhook {
    url: String,
    events: Vec<String>,
}

fn hook_json(h: &WebhookRow) -> serde_json::Value {
    let events: Vec<String> = serde_json::from_str(&h.events).unwrap_or_default();
    serde_json::json!({
        "id": h.id,
        "url": h.url,
        "events": events,
        "created_at": h.created_at,
    })
}

pub async fn create(
    State(app): State<AppState>,
    t: Tenant,
    Json(b): Json<NewWebhook>,
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
        tracing::info!(org = %t.org_id, "webhook URL refused: {e}");
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "url_refused",
            format!("the egress guard refuses this URL: {}", e.tenant_message()),
        )
    };
    let authorized = crate::webhooks::authorized_for(&b.url).map_err(refused)?;
    app.webhook_client()
        .admit(&b.url, &crate::webhooks::rules(&authorized))
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
    let mut v = hook_json(&row);
    v["secret"] = serde_json::Value::String(secret);
    Ok((StatusCode::CREATED, axum::Json(v)).into_response())
}

pub async fn list(State(app): State<AppState>, t: Tenant) -> ApiResult<Response> {
    let hooks = app.store().list_webhooks(&t.org_id).await?;
    Ok(axum::Json(serde_json::json!({
        "webhooks": hooks.iter().map(hook_json).collect::<Vec<_>>()
    }))
    .into_response())
}

async fn hook(app: &AppState, org: &str, id: &str) -> ApiResult<WebhookRow> {
    app.store()
        .get_webhook(org, id)
        .await?
        .ok_or_else(|| ApiError::not_found("webhook"))
}

pub async fn get(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    Ok(axum::Json(hook_json(&hook(&app, &t.org_id, &id).await?)).into_response())
}

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

pub async fn deliveries(
    State(app): State<AppState>,
    t: Tenant,
    Path(id): Path<String>,
    Query(q): Query<super::Page>,
) -> ApiResult<Response> {
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
    let next = super::next_cursor(&list, limit, |d| (d.created_at, d.id.as_str()));
    Ok(axum::Json(serde_json::json!({
        "deliveries": list.iter().map(|d| serde_json::json!({
            "id": d.id,
            "run_id": d.run_id,
            "event": d.event,
            "state": d.state,
            "attempts": d.attempts,
            "last_status": d.last_status,
            "last_error": d.last_error,
            "next_attempt_at": d.next_attempt_at,
            "created_at": d.created_at,
            "delivered_at": d.delivered_at,
        })).collect::<Vec<_>>(),
        "next_cursor": next,
    }))
    .into_response())
}

//! The one table of the API's routes. The router is built from it and the
//! OpenAPI document (`GET /v1/openapi.json`) is generated from it, so the two
//! cannot disagree; a test checks that every listed route answers.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post, put};
use serde_json::{Value, json};

use crate::AppState;
use crate::error::ApiError;
use crate::routes::{agents, connections, health, keys, runs, webhooks};

/// One route.
pub struct Route {
    pub method: &'static str,
    /// axum's path syntax, which is also OpenAPI's (`{id}`).
    pub path: &'static str,
    pub summary: &'static str,
    /// Needs an API key.
    pub auth: bool,
    /// The request body's schema (in [`schemas`]).
    pub body: Option<&'static str>,
    /// The success status.
    pub ok: u16,
    /// The success answer's schema (in [`schemas`]); `None`: no body (204)
    /// or not JSON.
    pub answer: Option<&'static str>,
    pub handler: fn() -> MethodRouter<AppState>,
}

macro_rules! r {
    ($m:literal $p:literal $auth:literal $ok:literal $body:expr => $answer:expr, $s:literal, $h:expr) => {
        Route {
            method: $m,
            path: $p,
            summary: $s,
            auth: $auth,
            body: $body,
            ok: $ok,
            answer: $answer,
            handler: || $h,
        }
    };
}

/// Every route of the server.
pub const ROUTES: &[Route] = &[
    r!("get" "/healthz" false 200 None => Some("Health"), "The process answers.", get(health::healthz)),
    r!("get" "/readyz" false 200 None => Some("Ready"), "The store answers and this replica takes work (503 otherwise).", get(health::readyz)),
    r!("get" "/v1/openapi.json" false 200 None => None, "This document.", get(document)),
    r!("get" "/v1/org" true 200 None => Some("Organization"), "The caller's organization.", get(keys::get_org)),
    r!("get" "/v1/api-keys" true 200 None => Some("ApiKeyList"), "The organization's API keys (never a key itself).", get(keys::list)),
    r!("post" "/v1/api-keys" true 201 Some("NewApiKey") => Some("NewApiKeyAnswer"), "Creates an API key; the key is in this answer only.", post(keys::create)),
    r!("delete" "/v1/api-keys/{id}" true 204 None => None, "Revokes an API key.", delete(keys::revoke)),
    r!("post" "/v1/agents" true 201 Some("RegisterAgent") => Some("Agent"), "Registers an agent (manifest and files) under its agent.name; 200 when it replaces one.", post(agents::register).layer(DefaultBodyLimit::max(agents::MAX_BODY))),
    r!("get" "/v1/agents" true 200 None => Some("AgentList"), "The organization's agents.", get(agents::list)),
    r!("get" "/v1/agents/{name}" true 200 None => Some("Agent"), "One agent, with its manifest.", get(agents::get)),
    r!("delete" "/v1/agents/{name}" true 204 None => None, "Removes an agent.", delete(agents::delete)),
    r!("post" "/v1/runs" true 202 Some("NewRun") => Some("Run"), "Queues a run of an agent; it starts when a slot is free.", post(runs::create)),
    r!("get" "/v1/runs" true 200 None => Some("RunList"), "Runs, newest first (status, agent, limit, cursor).", get(runs::list)),
    r!("get" "/v1/runs/{id}" true 200 None => Some("Run"), "One run (queue_position while queued).", get(runs::get)),
    r!("post" "/v1/runs/{id}/cancel" true 202 None => Some("Run"), "Cancels a queued or running run (409 when it has ended).", post(runs::cancel)),
    r!("get" "/v1/runs/{id}/events" true 200 None => Some("EventPage"), "The run's events: JSON (after, limit), or Server-Sent Events with Accept: text/event-stream (resume with Last-Event-ID); the stream ends with an `end` event.", get(runs::events)),
    r!("get" "/v1/runs/{id}/logs" true 200 None => Some("EventPage"), "The run's log events only, as /events.", get(runs::logs)),
    r!("get" "/v1/runs/{id}/egress" true 200 None => Some("EgressLog"), "Every request that left the run's sandbox, and every refusal.", get(runs::egress)),
    r!("get" "/v1/runs/{id}/cost" true 200 None => Some("Cost"), "Tokens and cost metered by the run's model relay.", get(runs::cost)),
    r!("get" "/v1/runs/{id}/result" true 200 None => None, "The run's last reported result.", get(runs::result)),
    r!("get" "/v1/runs/{id}/results/{result_id}" true 200 None => None, "A large result the run stored, with its content type.", get(runs::stored_result)),
    r!("post" "/v1/connections" true 201 Some("NewConnection") => Some("Connection"), "Stores a credential, encrypted; no route returns it.", post(connections::create)),
    r!("get" "/v1/connections" true 200 None => Some("ConnectionList"), "The organization's connections (never a secret).", get(connections::list)),
    r!("get" "/v1/connections/{name}" true 200 None => Some("Connection"), "One connection (never its secret).", get(connections::get)),
    r!("put" "/v1/connections/{name}" true 200 Some("RotateConnection") => Some("Connection"), "Replaces a connection's secret (a rotation).", put(connections::rotate)),
    r!("delete" "/v1/connections/{name}" true 204 None => None, "Removes a connection.", delete(connections::delete)),
    r!("post" "/v1/webhooks" true 201 Some("NewWebhook") => Some("NewWebhookAnswer"), "Subscribes a URL to run events; the signing secret is in this answer only.", post(webhooks::create)),
    r!("get" "/v1/webhooks" true 200 None => Some("WebhookList"), "The organization's webhooks.", get(webhooks::list)),
    r!("get" "/v1/webhooks/{id}" true 200 None => Some("Webhook"), "One webhook.", get(webhooks::get)),
    r!("delete" "/v1/webhooks/{id}" true 204 None => None, "Removes a webhook.", delete(webhooks::delete)),
    r!("get" "/v1/webhooks/{id}/deliveries" true 200 None => Some("DeliveryList"), "A webhook's deliveries and how each went, newest first (limit, cursor).", get(webhooks::deliveries)),
];

/// Largest body of every route but agent registration.
pub const MAX_BODY: usize = 1 << 20;

pub fn router(app: AppState) -> Router {
    let mut open = Router::new();
    let mut keyed = Router::new();
    for r in ROUTES {
        if r.auth {
            keyed = keyed.route(r.path, (r.handler)());
        } else {
            open = open.route(r.path, (r.handler)());
        }
    }
    let keyed = keyed.route_layer(axum::middleware::from_fn_with_state(
        app.clone(),
        crate::auth::require_key,
    ));
    open.merge(keyed)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(app)
}

async fn not_found() -> Response {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found",
        "no such route (GET /v1/openapi.json lists them)",
    )
    .into_response()
}

async fn method_not_allowed() -> Response {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method (GET /v1/openapi.json lists them)",
    )
    .into_response()
}

async fn document() -> Response {
    axum::Json(spec()).into_response()
}

fn error_response(d: &str) -> Value {
    json!({ "description": d, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } })
}

/// The OpenAPI 3.1 document.
pub fn spec() -> Value {
    let mut paths = serde_json::Map::new();
    for r in ROUTES {
        let params: Vec<Value> = r
            .path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .map(|p| json!({ "name": p, "in": "path", "required": true, "schema": { "type": "string" } }))
            .collect();
        let mut responses = serde_json::Map::new();
        let success = match r.answer {
            Some(a) => {
                json!({ "description": "success", "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{a}") } } } })
            }
            None => json!({ "description": "success" }),
        };
        responses.insert(r.ok.to_string(), success);
        for (code, d) in [
            ("400", "malformed input"),
            ("404", "no such thing in the caller's organization"),
            ("413", "the body is too large"),
            ("422", "the input is well-formed but not acceptable"),
        ] {
            responses.insert(code.into(), error_response(d));
        }
        responses.insert(
            "503".into(),
            error_response("the store does not answer (or, /readyz, the replica starts or stops)"),
        );
        if r.auth {
            responses.insert(
                "507".into(),
                error_response("storage_full: the store is out of space; nothing was written"),
            );
            responses.insert("401".into(), error_response("no valid API key"));
            if r.method == "post" && matches!(r.path, "/v1/runs" | "/v1/api-keys" | "/v1/webhooks")
            {
                responses.insert(
                    "403".into(),
                    error_response(
                        "quota_exceeded: the organization is at its quota (ORG_MAX_STORED_BYTES, ORG_MAX_API_KEYS, ORG_MAX_WEBHOOKS); nothing was written",
                    ),
                );
            }
            responses.insert(
                "429".into(),
                error_response("rate limited; see Retry-After"),
            );
        }
        let mut op = json!({
            "summary": r.summary,
            "operationId": format!("{}{}", r.method, r.path.replace(['/', '{', '}', '.', '-'], "_")),
            "parameters": params,
            "responses": responses,
        });
        if r.auth {
            op["security"] = json!([{ "apiKey": [] }]);
        } else {
            op["security"] = json!([]);
        }
        if let Some(b) = r.body {
            op["requestBody"] = json!({
                "required": true,
                "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{b}") } } }
            });
        }
        let entry = paths.entry(r.path.to_owned()).or_insert_with(|| json!({}));
        entry[r.method] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Airlock",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "airlock serve: agents run in sandboxes whose only way out is their sidecar. Every id is scoped to the caller's organization. Errors are {\"error\": {\"code\", \"message\"}}. Times are Unix milliseconds.",
        },
        "components": {
            "securitySchemes": { "apiKey": { "type": "http", "scheme": "bearer", "description": "Authorization: Bearer alk_…" } },
            "schemas": schemas(),
        },
        "paths": paths,
    })
}

/// The request bodies' schemas (every body refuses unknown fields).
pub fn schemas() -> Value {
    let strict = |props: Value, required: &[&str]| json!({ "type": "object", "additionalProperties": false, "properties": props, "required": required });
    let object = |props: Value| json!({ "type": "object", "properties": props });
    let list = |key: &str, item: &str| json!({ "type": "object", "properties": { key: { "type": "array", "items": { "$ref": format!("#/components/schemas/{item}") } } } });
    let ms = json!({ "type": "integer", "description": "Unix milliseconds" });
    let ms_or_null = json!({ "type": ["integer", "null"], "description": "Unix milliseconds" });
    let text_or_null = json!({ "type": ["string", "null"] });
    let cost = object(json!({
        "tokens_in": { "type": "integer" }, "tokens_out": { "type": "integer" },
        "cost_microusd": { "type": "integer" }, "cost_usd": { "type": "number" },
    }));
    let mut answers = json!({
        "Health": object(json!({ "status": { "const": "ok" } })),
        "Ready": object(json!({ "status": { "const": "ready" }, "replica": { "type": "string" }, "backend": { "type": "string" }, "running": { "type": "integer" } })),
        "Organization": object(json!({ "id": { "type": "string" }, "name": { "type": "string" }, "max_concurrent_runs": { "type": ["integer", "null"] }, "created_at": ms })),
        "ApiKey": object(json!({ "id": { "type": "string" }, "name": { "type": "string" }, "created_at": ms, "revoked_at": ms_or_null })),
        "NewApiKeyAnswer": object(json!({ "id": { "type": "string" }, "name": { "type": "string" }, "created_at": ms, "key": { "type": "string", "description": "shown in this answer only" } })),
        "Agent": object(json!({ "name": { "type": "string" }, "files": { "type": "array", "items": { "type": "string" } }, "manifest": { "type": "string", "description": "GET /v1/agents/{name} only" }, "created_at": ms, "updated_at": ms })),
        "Run": object(json!({
            "id": { "type": "string" }, "agent": { "type": "string" },
            "status": { "enum": airlock_store::RunStatus::ALL.map(airlock_store::RunStatus::as_str) },
            "backend": { "type": "string" }, "model": text_or_null, "replica": text_or_null,
            "created_at": ms, "started_at": ms_or_null, "ended_at": ms_or_null,
            "exit_code": { "type": ["integer", "null"] }, "error": text_or_null,
            "queue_position": { "type": "integer", "description": "while queued: how many queued runs are ahead" },
            "cost": cost,
        })),
        "RunList": object(json!({ "runs": { "type": "array", "items": { "$ref": "#/components/schemas/Run" } }, "next_cursor": text_or_null })),
        "Event": object(json!({ "id": { "type": "integer" }, "at": ms, "kind": { "type": "string" }, "payload": { "type": "object" } })),
        "EventPage": object(json!({ "events": { "type": "array", "items": { "$ref": "#/components/schemas/Event" } }, "next_after": { "type": "integer" } })),
        "EgressLog": object(json!({ "egress": { "type": "array", "items": { "type": "object" } } })),
        "Cost": cost,
        "Connection": object(json!({ "name": { "type": "string" }, "integration": { "type": "string" }, "type": { "type": "string" }, "kid": { "type": "string" }, "created_at": ms, "updated_at": ms })),
        "Webhook": object(json!({ "id": { "type": "string" }, "url": { "type": "string" }, "events": { "type": "array", "items": { "type": "string" } }, "created_at": ms })),
        "NewWebhookAnswer": object(json!({ "id": { "type": "string" }, "url": { "type": "string" }, "events": { "type": "array", "items": { "type": "string" } }, "created_at": ms, "secret": { "type": "string", "description": "the signing secret, in this answer only" } })),
        "Delivery": object(json!({
            "id": { "type": "string" }, "run_id": { "type": "string" }, "event": { "type": "string" },
            "state": { "enum": ["pending", "delivered", "failed"] }, "attempts": { "type": "integer" },
            "last_status": { "type": ["integer", "null"] }, "last_error": text_or_null,
            "next_attempt_at": ms, "created_at": ms, "delivered_at": ms_or_null,
        })),
    });
    for (name, key, item) in [
        ("ApiKeyList", "api_keys", "ApiKey"),
        ("AgentList", "agents", "Agent"),
        ("ConnectionList", "connections", "Connection"),
        ("WebhookList", "webhooks", "Webhook"),
    ] {
        answers[name] = list(key, item);
    }
    answers["DeliveryList"] = object(
        json!({ "deliveries": { "type": "array", "items": { "$ref": "#/components/schemas/Delivery" } }, "next_cursor": text_or_null }),
    );
    let mut all = json!({
        "Error": strict(json!({ "error": { "type": "object", "properties": { "code": { "type": "string" }, "message": { "type": "string" } } } }), &["error"]),
        "NewApiKey": strict(json!({ "name": { "type": "string" } }), &["name"]),
        "RegisterAgent": strict(json!({
            "manifest": { "type": "string", "description": "airlock.toml's text" },
            "files": { "type": "object", "additionalProperties": { "type": "string" }, "description": "relative path → UTF-8 content" },
        }), &["manifest"]),
        "NewRun": strict(json!({
            "agent": { "type": "string" },
            "prompt": { "type": "string" },
            "limits": strict(json!({
                "memory_mb": { "type": "integer", "minimum": airlock_platform::manifest::MIN_MEMORY_MB },
                "cpus": { "type": "number", "exclusiveMinimum": 0, "maximum": airlock_platform::manifest::MAX_CPUS },
                "timeout_seconds": { "type": "integer", "minimum": 1 },
            }), &[]),
        }), &["agent"]),
        "NewConnection": strict(json!({
            "name": { "type": "string" },
            "integration": { "type": "string" },
            "type": { "enum": airlock_store::AuthType::ALL.map(airlock_store::AuthType::as_str) },
            "fields": { "type": "object", "additionalProperties": { "type": "string" } },
        }), &["name", "integration", "type", "fields"]),
        "RotateConnection": strict(json!({ "fields": { "type": "object", "additionalProperties": { "type": "string" } } }), &["fields"]),
        "NewWebhook": strict(json!({
            "url": { "type": "string", "format": "uri" },
            "events": { "type": "array", "items": { "enum": crate::webhooks::EVENTS } },
        }), &["url", "events"]),
    });
    if let (Some(all), Some(answers)) = (all.as_object_mut(), answers.as_object()) {
        all.extend(answers.clone());
    }
    all
}

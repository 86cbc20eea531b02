//! The one table of the API's routes ([`ROUTES`]), the router built from
//! it, and the OpenAPI document (`GET /v1/openapi.json`) derived from it.
//!
//! The document is utoipa's derivation: each handler's `#[utoipa::path]`
//! gives its operation (id, tag, parameters, every status it can answer),
//! and `airlock_api::v1`'s types give the schemas. The macro that writes
//! the table also lists its handlers for the derivation, so a route cannot
//! be routed without being documented; the tests check that the two agree
//! route by route (method, path, key, body, answer), and each operation's
//! id and tag against a table.

use std::sync::LazyLock;

use airlock_api::v1;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use utoipa::OpenApi as _;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

use crate::error::ApiError;
use crate::routes::{
    agents, approvals, artifacts, audit, budget, connections, health, identity, keys, org_proxy,
    policy, runs, webhooks,
};
use crate::state::AppState;

/// One route.
pub struct Route {
    /// Lowercase, as OpenAPI spells it.
    pub method: &'static str,
    /// axum's path syntax, which is also OpenAPI's (`{id}`).
    pub path: &'static str,
    /// Needs an API key.
    pub auth: bool,
    /// The request body's schema (an `airlock_api::v1` type).
    pub body: Option<&'static str>,
    /// The success answer's schema (an `airlock_api::v1` type); `None`: no
    /// body (204) or not a schema of the document.
    pub answer: Option<&'static str>,
    pub handler: fn() -> MethodRouter<AppState>,
}

/// Writes [`ROUTES`] and the derived document's list of handlers from one
/// list: `method "path" auth body => answer, handler [, layer L];`.
macro_rules! routes {
    ($($m:ident $p:literal $auth:literal $body:expr => $answer:expr,
        $($h:ident)::+ $(, layer $l:expr)?;)*) => {
        /// Every route of the server.
        pub const ROUTES: &[Route] = &[$(
            Route {
                method: stringify!($m),
                path: $p,
                auth: $auth,
                body: $body,
                answer: $answer,
                handler: || axum::routing::$m($($h)::+)$(.layer($l))?,
            },
        )*];

        /// The document, derived from the handlers' `#[utoipa::path]` and
        /// the types they name.
        #[derive(utoipa::OpenApi)]
        #[openapi(
            info(
                title = "Airlock",
                description = "airlock serve: agents run in sandboxes whose only way out is their sidecar. Every id is scoped to the caller's organization. Errors are {\"error\": {\"code\", \"message\"}}. Times are Unix milliseconds."
            ),
            paths($($($h)::+),*),
            // Named by no operation's body: the error body (named by the
            // shared failure sets) and a webhook delivery's body.
            components(schemas(v1::Error, v1::WebhookEvent)),
            modifiers(&ApiKeyScheme),
            tags(
                (name = "health", description = "The process and this replica's readiness"),
                (name = "org", description = "The caller's organization"),
                (name = "api_keys", description = "The organization's API keys"),
                (name = "agents", description = "Agents: a manifest and the files of its directory"),
                (name = "runs", description = "Runs: queued, started in order, followed live"),
                (name = "artifacts", description = "Files a run's agent left in its output directory"),
                (name = "connections", description = "Credentials, stored encrypted; never returned"),
                (name = "webhooks", description = "Signed deliveries of run events"),
                (name = "identity", description = "The issuer of the runs' workload identity tokens (OpenID Connect discovery)"),
                (name = "document", description = "This document"),
            ),
        )]
        struct Document;
    };
}

routes! {
    get "/healthz" false None => Some("Health"), health::healthz;
    get "/readyz" false None => Some("Ready"), health::readyz;
    get "/.well-known/openid-configuration" false None => Some("OpenIdConfiguration"), identity::openid_configuration;
    get "/.well-known/jwks.json" false None => Some("Jwks"), identity::jwks;
    get "/v1/openapi.json" false None => None, document;
    get "/v1/org" true None => Some("Organization"), keys::get_org;
    get "/v1/org/budget" true None => Some("OrgBudget"), budget::get;
    put "/v1/org/budget" true Some("SetOrgBudget") => Some("OrgBudget"), budget::set;
    get "/v1/org/proxy" true None => Some("OrgProxy"), org_proxy::get;
    put "/v1/org/proxy" true Some("SetOrgProxy") => Some("OrgProxy"), org_proxy::set;
    get "/v1/api-keys" true None => Some("ApiKeyList"), keys::list;
    post "/v1/api-keys" true Some("NewApiKey") => Some("NewApiKeyAnswer"), keys::create;
    delete "/v1/api-keys/{id}" true None => None, keys::revoke;
    post "/v1/agents" true Some("RegisterAgent") => Some("Agent"), agents::register,
        layer DefaultBodyLimit::max(agents::MAX_BODY);
    get "/v1/agents" true None => Some("AgentList"), agents::list;
    get "/v1/agents/{name}" true None => Some("Agent"), agents::get;
    delete "/v1/agents/{name}" true None => None, agents::delete;
    post "/v1/runs" true Some("NewRun") => Some("Run"), runs::create,
        layer DefaultBodyLimit::max(runs::MAX_BODY);
    get "/v1/runs" true None => Some("RunList"), runs::list;
    get "/v1/runs/{id}" true None => Some("Run"), runs::get;
    post "/v1/runs/{id}/cancel" true None => Some("Run"), runs::cancel;
    get "/v1/runs/{id}/events" true None => Some("EventPage"), runs::events;
    get "/v1/runs/{id}/logs" true None => Some("EventPage"), runs::logs;
    get "/v1/runs/{id}/egress" true None => Some("EgressLog"), runs::egress;
    get "/v1/runs/{id}/cost" true None => Some("RunCost"), runs::cost;
    get "/v1/runs/{id}/policy" true None => Some("RunPolicy"), policy::get;
    patch "/v1/runs/{id}/policy" true Some("SetRunPolicy") => Some("RunPolicy"), policy::set;
    get "/v1/runs/{id}/audit.jsonl" true None => None, audit::audit;
    get "/v1/runs/{id}/approvals" true None => Some("ApprovalList"), approvals::list;
    post "/v1/runs/{id}/approvals/{approval_id}" true Some("AnswerApproval") => Some("Approval"), approvals::answer;
    get "/v1/runs/{id}/result" true None => None, runs::result;
    get "/v1/runs/{id}/results/{result_id}" true None => None, runs::stored_result;
    get "/v1/runs/{id}/artifacts" true None => Some("ArtifactList"), artifacts::list;
    get "/v1/runs/{id}/artifacts/download" false None => None, artifacts::download;
    post "/v1/connections" true Some("NewConnection") => Some("Connection"), connections::create;
    get "/v1/connections" true None => Some("ConnectionList"), connections::list;
    get "/v1/connections/{name}" true None => Some("Connection"), connections::get;
    put "/v1/connections/{name}" true Some("RotateConnection") => Some("Connection"), connections::rotate;
    delete "/v1/connections/{name}" true None => None, connections::delete;
    post "/v1/webhooks" true Some("NewWebhook") => Some("NewWebhookAnswer"), webhooks::create;
    get "/v1/webhooks" true None => Some("WebhookList"), webhooks::list;
    get "/v1/webhooks/{id}" true None => Some("Webhook"), webhooks::get;
    delete "/v1/webhooks/{id}" true None => None, webhooks::delete;
    get "/v1/webhooks/{id}/deliveries" true None => Some("DeliveryList"), webhooks::deliveries;
}

/// The security scheme the keyed routes name (`security(("apiKey" = []))`).
struct ApiKeyScheme;

impl utoipa::Modify for ApiKeyScheme {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc
            .components
            .get_or_insert_with(utoipa::openapi::Components::new);
        components.add_security_scheme(
            "apiKey",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("Authorization: Bearer alk_…"))
                    .build(),
            ),
        );
    }
}

/// Largest body of every route but agent registration and run creation.
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
        crate::access::require_key,
    ));
    open.merge(keyed)
        .merge(crate::console::router(&app))
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

/// The document, derived once.
static DOCUMENT: LazyLock<utoipa::openapi::OpenApi> = LazyLock::new(Document::openapi);

/// This document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "get_openapi",
    tag = "document",
    responses(
        (status = 200, description = "the OpenAPI 3.1 document of this API"),
        (status = 503, description = "unavailable: the replica is starting", body = v1::Error),
    ),
)]
pub async fn document() -> Response {
    axum::Json(&*DOCUMENT).into_response()
}

/// The OpenAPI 3.1 document, as JSON.
pub fn spec() -> serde_json::Value {
    serde_json::to_value(&*DOCUMENT).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// Each route's operation id and tag: what generated clients name their
    /// methods and group them by (the SDKs are written against these).
    #[rustfmt::skip]
    const OPERATIONS: &[(&str, &str, &str, &str)] = &[
        ("get", "/healthz", "healthz", "health"),
        ("get", "/.well-known/openid-configuration", "get_openid_configuration", "identity"),
        ("get", "/.well-known/jwks.json", "get_jwks", "identity"),
        ("get", "/readyz", "readyz", "health"),
        ("get", "/v1/openapi.json", "get_openapi", "document"),
        ("get", "/v1/org", "get_org", "org"),
        ("get", "/v1/org/budget", "get_org_budget", "org"),
        ("put", "/v1/org/budget", "set_org_budget", "org"),
        ("get", "/v1/org/proxy", "get_org_proxy", "org"),
        ("put", "/v1/org/proxy", "set_org_proxy", "org"),
        ("get", "/v1/api-keys", "list_api_keys", "api_keys"),
        ("post", "/v1/api-keys", "create_api_key", "api_keys"),
        ("delete", "/v1/api-keys/{id}", "revoke_api_key", "api_keys"),
        ("post", "/v1/agents", "register_agent", "agents"),
        ("get", "/v1/agents", "list_agents", "agents"),
        ("get", "/v1/agents/{name}", "get_agent", "agents"),
        ("delete", "/v1/agents/{name}", "delete_agent", "agents"),
        ("post", "/v1/runs", "create_run", "runs"),
        ("get", "/v1/runs", "list_runs", "runs"),
        ("get", "/v1/runs/{id}", "get_run", "runs"),
        ("post", "/v1/runs/{id}/cancel", "cancel_run", "runs"),
        ("get", "/v1/runs/{id}/events", "stream_run_events", "runs"),
        ("get", "/v1/runs/{id}/logs", "get_run_logs", "runs"),
        ("get", "/v1/runs/{id}/egress", "list_run_egress", "runs"),
        ("get", "/v1/runs/{id}/cost", "get_run_cost", "runs"),
        ("get", "/v1/runs/{id}/policy", "get_run_policy", "runs"),
        ("patch", "/v1/runs/{id}/policy", "set_run_policy", "runs"),
        ("get", "/v1/runs/{id}/audit.jsonl", "get_run_audit", "runs"),
        ("get", "/v1/runs/{id}/approvals", "list_run_approvals", "runs"),
        ("post", "/v1/runs/{id}/approvals/{approval_id}", "answer_run_approval", "runs"),
        ("get", "/v1/runs/{id}/result", "get_run_result", "runs"),
        ("get", "/v1/runs/{id}/results/{result_id}", "get_result", "runs"),
        ("get", "/v1/runs/{id}/artifacts", "list_run_artifacts", "artifacts"),
        ("get", "/v1/runs/{id}/artifacts/download", "download_artifact", "artifacts"),
        ("post", "/v1/connections", "create_connection", "connections"),
        ("get", "/v1/connections", "list_connections", "connections"),
        ("get", "/v1/connections/{name}", "get_connection", "connections"),
        ("put", "/v1/connections/{name}", "put_connection", "connections"),
        ("delete", "/v1/connections/{name}", "delete_connection", "connections"),
        ("post", "/v1/webhooks", "create_webhook", "webhooks"),
        ("get", "/v1/webhooks", "list_webhooks", "webhooks"),
        ("get", "/v1/webhooks/{id}", "get_webhook", "webhooks"),
        ("delete", "/v1/webhooks/{id}", "delete_webhook", "webhooks"),
        ("get", "/v1/webhooks/{id}/deliveries", "list_webhook_deliveries", "webhooks"),
    ];

    #[test]
    fn every_operation_has_its_id_and_tag() {
        let doc = spec();
        assert_eq!(
            OPERATIONS.len(),
            ROUTES.len(),
            "a route missing from the table"
        );
        let mut ids = std::collections::BTreeSet::new();
        for (method, path, id, tag) in OPERATIONS {
            let op = &doc["paths"][path][method];
            assert_eq!(op["operationId"], *id, "{method} {path}");
            assert_eq!(op["tags"], serde_json::json!([tag]), "{method} {path}");
            assert!(ids.insert(id), "{id} twice");
        }
        let tags: Vec<&str> = doc["tags"]
            .as_array()
            .expect("tags")
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        for (.., tag) in OPERATIONS {
            assert!(tags.contains(tag), "the tag {tag} is not described");
        }
    }

    /// The schema name a `$ref` points to.
    fn ref_name(schema: &Value) -> Option<&str> {
        schema["$ref"]
            .as_str()?
            .strip_prefix("#/components/schemas/")
    }

    #[test]
    fn every_route_of_the_router_is_in_the_document_as_the_table_says() {
        let doc = spec();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().expect("paths");
        let documented: usize = paths
            .values()
            .map(|ops| ops.as_object().map_or(0, |o| o.len()))
            .sum();
        assert_eq!(documented, ROUTES.len(), "an operation no route serves");
        for r in ROUTES {
            let what = format!("{} {}", r.method, r.path);
            let op = &doc["paths"][r.path][r.method];
            assert!(op.is_object(), "{what} is not in the document");
            assert!(op["operationId"].is_string(), "{what} has no id");
            assert!(op["tags"][0].is_string(), "{what} has no tag");
            let keyed = op["security"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s.get("apiKey").is_some()));
            assert_eq!(keyed, r.auth, "{what}: the key it needs");
            let body = ref_name(&op["requestBody"]["content"]["application/json"]["schema"]);
            assert_eq!(body, r.body, "{what}: its body");
            let responses = op["responses"].as_object().expect("responses");
            let answers: Vec<Option<&str>> = responses
                .iter()
                .filter(|(code, _)| code.starts_with('2'))
                .map(|(_, a)| ref_name(&a["content"]["application/json"]["schema"]))
                .collect();
            assert!(!answers.is_empty(), "{what} has no success");
            assert!(
                answers.iter().all(|a| *a == r.answer),
                "{what}: its answer {answers:?}"
            );
            // Every failure is the typed error body.
            for (code, a) in responses.iter().filter(|(c, _)| !c.starts_with('2')) {
                assert_eq!(
                    ref_name(&a["content"]["application/json"]["schema"]),
                    Some("Error"),
                    "{what} {code}"
                );
            }
            if r.auth {
                for code in ["401", "429", "500", "503"] {
                    assert!(responses.contains_key(code), "{what} answers {code}");
                }
            }
            if r.body.is_some() {
                for code in ["400", "413", "415", "422", "507"] {
                    assert!(responses.contains_key(code), "{what} answers {code}");
                }
            }
            if r.path.contains('{') {
                assert!(responses.contains_key("404"), "{what} answers 404");
            }
        }
    }

    #[test]
    fn every_schema_the_document_names_is_in_it() {
        let doc = spec();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        for piece in text.split("\"#/components/schemas/").skip(1) {
            let name = piece.split('"').next().unwrap_or_default();
            assert!(schemas.contains_key(name), "{name} is named, not defined");
        }
        assert!(doc["components"]["securitySchemes"]["apiKey"].is_object());
        for name in ["Error", "WebhookEvent", "Run", "Cost", "RunLimits"] {
            assert!(schemas.contains_key(name), "{name}");
        }
        // The enumerated fields list their values from the store.
        assert_eq!(schemas["Run"]["properties"]["status"]["enum"][0], "queued");
        assert_eq!(
            schemas["NewRun"]["additionalProperties"], false,
            "request bodies refuse unknown fields"
        );
    }
}

//! `/mcp`: the agent's tools over MCP (Streamable HTTP), served with the
//! official `rmcp` SDK. rmcp is used only inside this module.
//!
//! Both protocol revisions are answered on the same endpoint: a client that
//! starts with `initialize` (2025-11-25 and older) gets an rmcp session
//! (`Mcp-Session-Id`); a request that carries its protocol version in
//! `_meta` (2026-07-28, no handshake) is served statelessly. rmcp routes
//! each POST by what it carries.
//!
//! Before rmcp sees a POST, [`entry`] reads the body within
//! `limits.max_request_bytes` (413 naming the limit) and checks the JSON-RPC
//! envelope ([`args::check_envelope`]) so malformed input gets a JSON-RPC
//! error rather than rmcp's plain-text 415. The hot request, a stateless
//! `tools/call` of an `api_call` tool, is answered by [`stateless_call`] with rmcp's
//! own types, exactly as rmcp would answer it.

pub mod api_call;
pub mod args;
pub mod remote;
mod stateless_call;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use http_body_util::BodyExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ResourceContents,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{
    SessionId, SessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{RoleServer, ServerHandler};
use serde_json::{Value, json};

use crate::state::Sidecar;
use args::{ToolCall, ToolError};

/// `Host` values accepted on `/mcp` (rmcp's DNS-rebinding check). The agent
/// reaches the sidecar on a unix socket (clients send `localhost`), on
/// 127.0.0.1/::1, or, on a docker run network, as `sidecar`. Every request
/// also needs the sidecar token, which a rebinding page cannot have.
pub const ALLOWED_HOSTS: &[&str] = &["localhost", "127.0.0.1", "::1", "sidecar"];

// The Streamable HTTP headers the sidecar reads or sets itself, as
// `HeaderName`s: a lookup by `&str` parses the name on every request, one by
// `HeaderName` only hashes it.
/// The tool a `tools/call` calls (SEP-2243).
pub(crate) static MCP_NAME: http::HeaderName = http::HeaderName::from_static("mcp-name");
/// The request's JSON-RPC method (SEP-2243).
pub(crate) static MCP_METHOD: http::HeaderName = http::HeaderName::from_static("mcp-method");
pub(crate) static MCP_PROTOCOL_VERSION: http::HeaderName =
    http::HeaderName::from_static("mcp-protocol-version");
pub(crate) static MCP_SESSION_ID: http::HeaderName =
    http::HeaderName::from_static("mcp-session-id");
pub(crate) static LAST_EVENT_ID: http::HeaderName = http::HeaderName::from_static("last-event-id");

/// A JSON-RPC message from the client, as rmcp parses it (for the fuzz target).
pub type ClientMessage = rmcp::model::ClientJsonRpcMessage;

/// The URI of a stored result: `airlock://result/<runId>/<id>`.
pub fn result_uri(run_id: &str, id: &str) -> String {
    format!("airlock://result/{run_id}/{id}")
}

/// The result id of `uri` when it names a result of `run_id`.
pub fn parse_result_uri<'a>(uri: &'a str, run_id: &str) -> Option<&'a str> {
    let rest = uri.strip_prefix("airlock://result/")?;
    let (run, id) = rest.split_once('/')?;
    let ok = run == run_id
        && !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then_some(id)
}

/// Per-run state of the MCP service, shared by every session.
pub struct McpState {
    pub sidecar: Arc<Sidecar>,
    tools: Vec<Tool>,
    /// Bytes stored through `put_result` by this run (`limits.run_result_bytes`).
    stored_bytes: AtomicU64,
    /// Parsed `authorized_uris` of the integrations without
    /// `{$credential.…}` templates (the others are rendered per call).
    static_uris: foldhash::HashMap<String, airlock_egress::AuthorizedUris>,
    /// Stateless `api_call`s bypass rmcp's per-request machinery ([`stateless_call`]).
    stateless_calls: bool,
    /// The integrations backed by an MCP server, remote or a local runner
    /// ([`remote`]), by namespace: a tool name is routed by an exact lookup
    /// of the namespace [`args::split_tool_name`] reads from it, never by a
    /// prefix match.
    remotes: std::collections::BTreeMap<String, Arc<remote::Remote>>,
}

impl McpState {
    pub fn new(sidecar: Arc<Sidecar>) -> Self {
        let mut tools: Vec<Tool> = sidecar
            .integrations
            .iter()
            .filter(|(ns, i)| {
                let allowed = i.allows_tool("api_call");
                if !allowed {
                    hidden(&sidecar, ns, "api_call", false);
                }
                allowed
            })
            .map(|(ns, _)| api_call_tool(ns))
            .collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools.push(run_history_tool());
        tools.push(recall_memory_tool());
        let static_uris = sidecar
            .integrations
            .iter()
            .filter(|(_, i)| !airlock_egress::AuthorizedUris::has_templates(&i.authorized_uris))
            .map(|(ns, i)| (ns.clone(), i.authorized()))
            .collect();
        let mut runners = sidecar
            .runner_mcp
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default();
        let remotes = sidecar
            .integrations
            .iter()
            .filter_map(|(ns, i)| {
                match (&i.mcp_url, runners.remove(ns)) {
                    (Some(url), _) => Some(remote::Remote::new(ns, url)),
                    (None, Some(listener)) => Some(remote::Remote::runner(ns, listener)),
                    (None, None) => None,
                }
                .map(|r| Arc::new(r.with_tools(i.tools.clone())))
            })
            .map(|r| (r.namespace().to_owned(), r))
            .collect();
        McpState {
            sidecar,
            tools,
            stored_bytes: AtomicU64::new(0),
            static_uris,
            stateless_calls: true,
            remotes,
        }
    }

    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// Every tool of the run: the sidecar's own and each remote server's
    /// (a server that cannot be reached contributes none, and is logged),
    /// each name once. A remote tool left out for its name (a duplicate, or
    /// a name another tool has) is logged by its server and listed in the
    /// second part, the notes `tools/list` carries in its `_meta`.
    pub async fn all_tools(&self) -> (Vec<Tool>, Vec<remote::Dropped>) {
        let mut all = self.tools.clone();
        let mut dropped = Vec::new();
        let lists = futures::future::join_all(
            self.remotes
                .values()
                .map(|r| async move { (r, r.tools(&self.sidecar).await) }),
        )
        .await;
        let mut names: std::collections::HashSet<String> =
            all.iter().map(|t| t.name.to_string()).collect();
        for (server, listed) in lists {
            dropped.extend(server.dropped().iter().cloned());
            let Ok(tools) = listed else { continue };
            for t in tools.iter() {
                if names.insert(t.name.to_string()) {
                    all.push(t.clone());
                } else {
                    // Unreachable while namespaces keep their rules; kept
                    // so that no name is ever listed twice.
                    tracing::warn!(integration = %server.namespace(), tool = %t.name,
                        "a remote tool's name is another tool's: it is not served");
                    dropped.push(remote::Dropped {
                        name: t.name.to_string(),
                        reason: "the name is another tool's",
                    });
                }
            }
        }
        (all, dropped)
    }

    /// The remote server and tool that `name` names, if any: the namespace
    /// looked up exactly.
    fn remote_tool<'a>(&self, name: &'a str) -> Option<(&Arc<remote::Remote>, &'a str)> {
        let (ns, tool) = args::split_tool_name(name)?;
        let server = self.remotes.get(ns)?;
        (tool != "api_call").then_some((server, tool))
    }

    /// The tool allowlist's refusal of a call by `name` (`{namespace}__{tool}`)
    /// the integration hides: named directly, it is refused before anything
    /// is parsed or sent, and audited. `None`: the name is not hidden (an
    /// unknown name is the caller's to refuse).
    fn hidden_call(&self, name: &str) -> Option<api_call::Answer> {
        let (ns, tool) = args::split_tool_name(name)?;
        let integration = self.sidecar.integrations.get(ns)?;
        if integration.allows_tool(tool) {
            return None;
        }
        hidden(&self.sidecar, ns, tool, true);
        Some(
            api_call::error_result(
                "tool_not_allowed",
                &format!(
                    "the integration {ns} does not allow the tool {tool:?} (its tools allowlist)"
                ),
                403,
            )
            .into(),
        )
    }

    /// Parses and runs one tool call.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<&serde_json::Map<String, Value>>,
        prefetch: Option<&CredentialPrefetch>,
    ) -> Result<CallToolResult, ErrorData> {
        self.call_answer(name, arguments, prefetch)
            .await
            .map(api_call::Answer::into_result)
    }

    /// [`McpState::call`], with an `api_call`'s inline text answer kept as
    /// its parts (for the stateless call path to write).
    pub(crate) async fn call_answer(
        &self,
        name: &str,
        arguments: Option<&serde_json::Map<String, Value>>,
        prefetch: Option<&CredentialPrefetch>,
    ) -> Result<api_call::Answer, ErrorData> {
        if let Some(refused) = self.hidden_call(name) {
            return Ok(refused);
        }
        if let Some((server, tool)) = self.remote_tool(name) {
            let Ok(_permit) = self.sidecar.api_calls.acquire().await else {
                return Ok(api_call::error_result(
                    "unavailable",
                    "the sidecar is shutting down",
                    503,
                )
                .into());
            };
            let result = server.call(&self.sidecar, tool, arguments).await?;
            return Ok(remote::bound_result(self, result).await.into());
        }
        let limit = self.sidecar.limits.max_request_bytes;
        let call = match args::parse_tool_call(
            name,
            arguments,
            |ns| self.sidecar.integrations.contains_key(ns),
            limit,
        ) {
            Ok(c) => c,
            Err(ToolError::UnknownTool(n)) => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool {n:?}"),
                    None,
                ));
            }
            Err(ToolError::Invalid(e)) => return Ok(api_call::arg_error(&e).into()),
        };
        Ok(match call {
            ToolCall::ApiCall { namespace, args } => {
                match self.sidecar.integrations.get(&namespace) {
                    Some(integration) => {
                        api_call::run_answer(self, integration, args, prefetch).await
                    }
                    None => {
                        return Err(ErrorData::invalid_params(
                            format!("unknown tool {name:?}"),
                            None,
                        ));
                    }
                }
            }
            ToolCall::RunHistory { limit, fields } => {
                match self.sidecar.platform.history(limit, &fields).await {
                    Ok(h) => json_result(&h),
                    Err(e) => api_call::error_result(
                        "platform_error",
                        &format!("run history is unavailable: {e}"),
                        502,
                    ),
                }
                .into()
            }
            ToolCall::RecallMemory { q, limit } => {
                match self.sidecar.platform.memories(&q, limit).await {
                    Ok(m) => json_result(&m),
                    Err(e) => api_call::error_result(
                        "platform_error",
                        &format!("memories are unavailable: {e}"),
                        502,
                    ),
                }
                .into()
            }
        })
    }

    /// `resources/read` of a stored result of this run.
    pub async fn read(&self, uri: &str) -> Result<ReadResourceResult, ErrorData> {
        let not_found = || {
            ErrorData::resource_not_found(
                format!(
                    "resource not found: {}",
                    uri.chars().take(300).collect::<String>()
                ),
                None,
            )
        };
        let id = parse_result_uri(uri, &self.sidecar.run_id).ok_or_else(not_found)?;
        match self.sidecar.platform.get_result(id).await {
            Ok((ct, body)) => {
                let contents = match String::from_utf8(body.to_vec()) {
                    Ok(text) => ResourceContents::text(text, uri).with_mime_type(ct),
                    Err(_) => ResourceContents::blob(
                        base64::engine::general_purpose::STANDARD.encode(&body),
                        uri,
                    )
                    .with_mime_type(ct),
                };
                Ok(ReadResourceResult::new(vec![contents]))
            }
            Err(e) if e.status() == Some(404) || e.status() == Some(403) => Err(not_found()),
            Err(e) => Err(ErrorData::internal_error(
                format!("the platform could not read the result: {e}"),
                None,
            )),
        }
    }
}

fn json_result<T: serde::Serialize>(v: &T) -> CallToolResult {
    let value = serde_json::to_value(v).unwrap_or(Value::Null);
    let mut r = CallToolResult::success(vec![ContentBlock::text(value.to_string())]);
    r.structured_content = Some(value);
    r
}

fn schema(v: Value) -> Arc<serde_json::Map<String, Value>> {
    match v {
        Value::Object(o) => Arc::new(o),
        _ => Arc::default(),
    }
}

/// The audit of a tool an integration's allowlist hides (left out of a
/// list, or refused when called by name).
pub(crate) fn hidden(sidecar: &Sidecar, namespace: &str, tool: &str, called: bool) {
    sidecar
        .exclusions
        .record(&sidecar.keep, namespace, tool, called);
}

fn api_call_tool(ns: &str) -> Tool {
    Tool::new(
        format!("{ns}{}", args::API_CALL_SUFFIX),
        format!(
            "Call the {ns} API with the connection's credential injected by the sidecar (you never see it). \
             Use {{{{field}}}} placeholders for credential fields in the target and header values \
             (and in the body with substituteBody). Only the integration's authorized URLs are reachable."
        ),
        schema(json!({
            "type": "object",
            "properties": {
                "target": {"type": "string", "description": "Absolute URL; may hold {{field}} placeholders"},
                "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"], "default": "GET"},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "body": {
                    "description": "A string, a JSON object or array, or {\"fromBytes\": \"<base64>\", \"encoding\": \"base64\"}",
                    "anyOf": [
                        {"type": "string"},
                        {"type": "array"},
                        {"type": "object"}
                    ]
                },
                "substituteBody": {"type": "boolean", "default": false, "description": "Fill {{field}} placeholders in the body too"}
            },
            "required": ["target"],
            "additionalProperties": false
        })),
    )
}

fn run_history_tool() -> Tool {
    Tool::new(
        args::RUN_HISTORY,
        "Earlier runs of this agent, newest first.",
        schema(json!({
            "type": "object",
            "properties": {
                "limit": {"type": "integer", "minimum": 1, "maximum": args::MAX_LIMIT, "default": 10},
                "fields": {"type": "array", "items": {"type": "string", "enum": ["checkpoint", "result"]}}
            },
            "additionalProperties": false
        })),
    )
}

fn recall_memory_tool() -> Tool {
    Tool::new(
        args::RECALL_MEMORY,
        "Search this agent's memories.",
        schema(json!({
            "type": "object",
            "properties": {
                "q": {"type": "string", "maxLength": args::MAX_QUERY_CHARS},
                "limit": {"type": "integer", "minimum": 1, "maximum": args::MAX_LIMIT, "default": 10}
            },
            "required": ["q"],
            "additionalProperties": false
        })),
    )
}

/// The rmcp handler: one per session or stateless request, all sharing [`McpState`].
#[derive(Clone)]
pub struct AirlockMcp {
    state: Arc<McpState>,
}

impl ServerHandler for AirlockMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().build())
            .with_server_info(Implementation::new("airlock-sidecar", env!("CARGO_PKG_VERSION")))
            .with_instructions("Airlock sidecar: integration API calls with injected credentials, run history and memories.")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (tools, dropped) = self.state.all_tools().await;
        let mut list = ListToolsResult::with_all_items(tools);
        if !dropped.is_empty() {
            let mut meta = rmcp::model::JsonObject::new();
            meta.insert(
                "airlock/dropped_tools".into(),
                serde_json::to_value(&dropped).unwrap_or(Value::Null),
            );
            list.meta = Some(rmcp::model::MetaObject(meta));
        }
        Ok(list)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        if let Some((server, _)) = self.state.remote_tool(name) {
            return server.cached().iter().find(|t| t.name == name).cloned();
        }
        self.state.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let parts = context.extensions.get::<http::request::Parts>();
        let prefetch = parts.and_then(|p| p.extensions.get::<CredentialPrefetch>());
        // Boxed: rmcp keeps the handler's future inside the per-request
        // task it spawns, and moves it (memcpy) on the way; the call's own
        // state machine (the guarded client, TLS, hyper) is large, the box
        // is one pointer.
        Box::pin(
            self.state
                .call(&request.name, request.arguments.as_ref(), prefetch),
        )
        .await
        .map(CallToolResponse::from)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        // Stored results are reachable through the links in tool results only.
        Ok(ListResourcesResult::with_all_items(Vec::new()))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        Box::pin(self.state.read(&request.uri))
            .await
            .map(ReadResourceResponse::from)
    }
}

type McpService = StreamableHttpService<AirlockMcp, LocalSessionManager>;

/// The `/mcp` endpoint (nested by `server::router`, and `POST /mcp` served
/// directly by `server::App`; behind the token check either way).
pub fn endpoint(sidecar: Arc<Sidecar>) -> Endpoint {
    endpoint_with(sidecar, true)
}

/// [`endpoint`], with or without the stateless call path for stateless `api_call`s
/// (without: rmcp serves every request, as the tests compare).
pub fn endpoint_with(sidecar: Arc<Sidecar>, stateless_calls: bool) -> Endpoint {
    // Shared, not cloned per request (rmcp's service clones its config).
    Endpoint(Arc::new(Mcp::new(sidecar, stateless_calls)))
}

/// `/mcp` as a service: every request, whatever its path below `/mcp` or
/// its method, goes to [`entry`]. A plain service rather than a router with
/// one fallback: there is nothing to route.
#[derive(Clone)]
pub struct Endpoint(Arc<Mcp>);

impl tower_service::Service<Request> for Endpoint {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Response, std::convert::Infallible>> + Send>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let mcp = self.0.clone();
        Box::pin(async move { Ok(entry(&mcp, req).await) })
    }
}

fn too_large(limit: usize) -> Response {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        axum::Json(json!({"error": "payload_too_large", "message": format!("request body exceeds the {limit}-byte limit")})),
    )
        .into_response()
}

/// The credential fetch of an `api_call`, started as soon as the request
/// names the tool: from its `Mcp-Name` header, before the body is read
/// (every request the stateless call path takes has one), or else from the envelope
/// rmcp is about to parse. The platform round trip then overlaps the
/// parsing, the dispatch, the guard and the journal instead of following
/// them. Still one fetch per call, at request time; a fetch nobody takes
/// (the body named another tool, rmcp refused the message, the arguments
/// were bad) is dropped with the request, its answer unread (the
/// connection closes).
///
/// The fetch is polled once where it starts — on a kept-alive connection
/// the request is on the wire when [`CredentialPrefetch::start`] returns
/// ([`airlock_egress::conn`] writes on the first poll; a new connection
/// sends once its connect is seen to complete, when the taker polls) — and
/// then by the call that takes it, in the call's own task: no task is
/// spawned and nothing yields for it.
#[derive(Clone)]
pub struct CredentialPrefetch {
    namespace: String,
    fetch: Arc<std::sync::Mutex<Option<PendingFetch>>>,
}

type FetchResult =
    Result<airlock_platform_api::wire::CredentialResponse, airlock_platform_api::PlatformError>;

/// A fetch, with its place among the run's fetches ahead of their calls
/// ([`Sidecar::fetches_ahead`]), given back when it is taken or dropped.
struct PendingFetch {
    state: FetchState,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

enum FetchState {
    /// On the wire (or connecting); polled again by whoever takes it.
    Sent(std::pin::Pin<Box<dyn Future<Output = FetchResult> + Send>>),
    /// Answered on its first poll (an unreachable platform, typically).
    Done(FetchResult),
}

impl CredentialPrefetch {
    /// Starts the fetch, unless the run already has as many fetches ahead
    /// of their calls as it may have calls.
    fn start(sidecar: &Arc<Sidecar>, namespace: &str) -> Option<Self> {
        let slot = sidecar.fetches_ahead.clone().try_acquire_owned().ok()?;
        let sc = sidecar.clone();
        let ns = namespace.to_owned();
        let mut fetch: std::pin::Pin<Box<dyn Future<Output = FetchResult> + Send>> =
            Box::pin(async move { sc.platform.credential(&ns).await });
        // The first poll sends the request; its waker is never used (the
        // taker polls again with its own, which replaces it everywhere).
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let state = match fetch.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(done) => FetchState::Done(done),
            std::task::Poll::Pending => FetchState::Sent(fetch),
        };
        let pending = PendingFetch { state, _slot: slot };
        Some(CredentialPrefetch {
            namespace: namespace.to_owned(),
            fetch: Arc::new(std::sync::Mutex::new(Some(pending))),
        })
    }

    /// The fetch of `sidecar`'s integration that `headers` name in
    /// `Mcp-Name` (`{namespace}__api_call` of an integration with a
    /// connection), started now if the run has room for it.
    fn named_by(headers: &http::HeaderMap, sidecar: &Arc<Sidecar>) -> Option<Self> {
        let tool = headers.get(&MCP_NAME)?.to_str().ok()?;
        Self::for_tool(tool, sidecar)
    }

    /// The fetch rmcp's call of `tool` takes: `started` (from the headers)
    /// when it is for the same integration, else one started now.
    fn for_call(started: Option<Self>, tool: &str, sidecar: &Arc<Sidecar>) -> Option<Self> {
        match started {
            Some(p) if args::api_call_namespace(tool) == Some(p.namespace.as_str()) => Some(p),
            _ => Self::for_tool(tool, sidecar),
        }
    }

    /// The fetch for a call of `tool`, started now if `tool` is the
    /// `api_call` of an integration with a connection whose rules hold
    /// nothing now, and the run has room for it.
    fn for_tool(tool: &str, sidecar: &Arc<Sidecar>) -> Option<Self> {
        let ns = args::api_call_namespace(tool)?;
        let integration = sidecar.integrations.get(ns)?;
        // A request an `ask` rule may hold fetches its credential only
        // once a person allowed it (api_call::held_then_fetched).
        if !integration.has_connection || integration.may_hold() {
            return None;
        }
        Self::start(sidecar, ns)
    }

    /// The fetched credential of `namespace`, if this prefetch is for it
    /// and was not taken yet.
    pub(crate) async fn take(&self, namespace: &str) -> Option<FetchResult> {
        if self.namespace != namespace {
            return None;
        }
        let pending = self.fetch.lock().ok()?.take()?;
        Some(match pending.state {
            FetchState::Sent(fetch) => fetch.await,
            FetchState::Done(done) => done,
        })
    }
}

/// What [`entry`] needs: rmcp's service, the run's state, the session map
/// (to cap it) and the body limit.
struct Mcp {
    service: McpService,
    state: Arc<McpState>,
    sessions: Arc<LocalSessionManager>,
    /// Session ids in the order they were opened.
    opened: Arc<std::sync::Mutex<VecDeque<SessionId>>>,
    limit: usize,
}

impl Mcp {
    fn new(sidecar: Arc<Sidecar>, stateless_calls: bool) -> Mcp {
        let limit = sidecar.limits.max_request_bytes;
        let mut state = McpState::new(sidecar);
        state.stateless_calls = stateless_calls;
        let state = Arc::new(state);
        let for_service = state.clone();
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(ALLOWED_HOSTS.iter().copied())
            .with_max_request_body_bytes(limit)
            .with_json_response(true);
        let sessions = Arc::new(LocalSessionManager::default());
        let service: McpService = StreamableHttpService::new(
            move || {
                Ok(AirlockMcp {
                    state: for_service.clone(),
                })
            },
            sessions.clone(),
            config,
        );
        Mcp {
            service,
            state,
            sessions,
            opened: Arc::default(),
            limit,
        }
    }
}

/// Closes the oldest sessions until fewer than `max` are open.
async fn make_room_for_a_session(
    sessions: &LocalSessionManager,
    opened: &std::sync::Mutex<VecDeque<SessionId>>,
    max: usize,
) {
    loop {
        let live: Vec<SessionId> = sessions.sessions.read().await.keys().cloned().collect();
        if live.len() < max.max(1) {
            return;
        }
        let oldest = opened.lock().ok().and_then(|mut o| {
            o.retain(|id| live.contains(id));
            o.pop_front()
        });
        // Every session is opened through here, so `opened` knows them all;
        // should it not, any session will do.
        let Some(victim) = oldest.or_else(|| live.first().cloned()) else {
            return;
        };
        tracing::info!(session = %victim, max, "MCP session cap reached: closing the oldest session");
        if sessions.close_session(&victim).await.is_err() {
            // Make sure the loop ends even if rmcp could not close it.
            sessions.sessions.write().await.remove(&victim);
        }
    }
}

/// Reads a POST body within `limit`, answers a malformed envelope with a
/// JSON-RPC error, keeps the run's sessions under their cap, starts an
/// `api_call`'s credential fetch, and hands the rest to rmcp.
async fn entry(mcp: &Mcp, req: Request) -> Response {
    let Mcp {
        service,
        state,
        sessions,
        opened,
        limit,
    } = mcp;
    let limit = *limit;
    if req.method() != Method::POST {
        return Box::pin(service.handle(req)).await.map(Body::new);
    }
    let (parts, body) = req.into_parts();
    // The credential fetch goes out before the body is even read.
    let prefetch = CredentialPrefetch::named_by(&parts.headers, &state.sidecar);
    let bytes = match http_body_util::Limited::new(body, limit).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            // The outer body limit (server.rs) surfaces as a boxed error too.
            if e.is::<http_body_util::LengthLimitError>()
                || e.to_string().contains("length limit exceeded")
            {
                return too_large(limit);
            }
            return (StatusCode::BAD_REQUEST, axum::Json(json!({"error": "bad_request", "message": "the request body could not be read"})))
                .into_response();
        }
    };
    // The hot request first: a stateless `api_call` the stateless call path takes is
    // parsed once, there (its strict parse implies every check below); its
    // credential fetch went out with the headers.
    if let Some(call) = stateless_call::take(&parts, &bytes, state) {
        return stateless_call::serve(call, state, prefetch.as_ref()).await;
    }
    let envelope_error = |e: args::EnvelopeError| {
        (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            e.to_json().to_string(),
        )
            .into_response()
    };
    let shape = match args::check_shape(&bytes) {
        Ok(shape) => shape,
        Err(e) => return envelope_error(e),
    };
    // Each 2025-11-25 session keeps a worker until the client deletes it, and
    // rmcp keeps even an idle-expired one in its map: without a cap an agent
    // could open sessions until the sidecar (outside the sandbox's memory
    // limit) runs out of memory. At the cap the oldest session is closed.
    let opens_session = shape.initialize && !parts.headers.contains_key(&MCP_SESSION_ID);
    if opens_session {
        Box::pin(make_room_for_a_session(
            sessions,
            opened,
            state.sidecar.limits.max_mcp_sessions,
        ))
        .await;
    }
    let mut parts = parts;
    if let Some(p) = shape
        .tool_call
        .as_deref()
        .and_then(|tool| CredentialPrefetch::for_call(prefetch, tool, &state.sidecar))
    {
        parts.extensions.insert(p);
    }
    let json_body = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    // Boxed, as the stateless call is (stateless_call::serve): rmcp's
    // future is large, and this one is moved by every request's layers.
    let response = Box::pin(service.handle(Request::from_parts(parts, Body::from(bytes.clone()))))
        .await
        .map(Body::new);
    if opens_session
        && let Some(id) = response
            .headers()
            .get(&MCP_SESSION_ID)
            .and_then(|v| v.to_str().ok())
        && let Ok(mut opened) = opened.lock()
    {
        opened.push_back(SessionId::from(id));
    }
    // rmcp answers a JSON body its typed parse refuses with a plain-text
    // 415; give the client the JSON-RPC error instead.
    if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE
        && json_body
        && let Err(e) = args::typed_check(&bytes)
    {
        return envelope_error(e);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Every layer above the /mcp entry (axum's handler box, the
    /// middleware) moves its future whole: the large parts (an api_call's,
    /// rmcp's) are boxed where they are awaited, so what is moved per
    /// request stays within 2 KiB.
    #[tokio::test]
    async fn the_entrys_future_is_small() {
        let dir = tempfile::tempdir().unwrap();
        let j = dir.path().join("egress.journal");
        std::fs::write(&j, b"").unwrap();
        let mcp = Mcp::new(stateless_call::tests::sidecar(1, &j), true);
        let request = || Request::post("/").body(Body::empty()).unwrap();
        let entry = entry(&mcp, request());
        assert!(
            std::mem::size_of_val(&entry) <= 2048,
            "the /mcp entry's future is {} bytes",
            std::mem::size_of_val(&entry)
        );
    }

    /// A platform on a unix socket that counts the credential requests it
    /// reads (each count reported on the receiver, whether or not the
    /// sidecar still waits for the answer) and answers each with `svc`'s
    /// credential.
    async fn counting_platform(
        dir: &std::path::Path,
    ) -> (std::path::PathBuf, tokio::sync::watch::Receiver<usize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let sock = dir.join("platform.sock");
        let l = tokio::net::UnixListener::bind(&sock).unwrap();
        let (tx, rx) = tokio::sync::watch::channel(0usize);
        let tx = Arc::new(tx);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 4096];
                    loop {
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            match s.read(&mut tmp).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&tmp[..n]),
                            }
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        assert!(
                            head.starts_with("GET /internal/v1/credentials/svc "),
                            "{head}"
                        );
                        tx.send_modify(|n| *n += 1);
                        let body = json!({"integration": "svc", "connection": "c1",
                            "auth_type": "bearer", "fields": {"api_key": "sekrit-value"}})
                        .to_string();
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (sock, rx)
    }

    /// An upstream that answers whether the request carried that credential.
    async fn credential_echo() -> u16 {
        super::stateless_call::tests::upstream_answering(|head| {
            let head = head.to_ascii_lowercase();
            let body = if head.contains("\r\nauthorization: bearer sekrit-value\r\n") {
                "injected"
            } else {
                "absent"
            };
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            )
        })
        .await
    }

    fn sidecar_with(
        port: u16,
        platform: &std::path::Path,
        journal: &std::path::Path,
        calls: usize,
    ) -> Arc<Sidecar> {
        use airlock_test_support::sidecar_config::{SidecarConfigBuilder, integration, open_to};
        let cfg = SidecarConfigBuilder::detached("run_fetch", platform)
            .integration(
                integration("svc")
                    .authorized([format!("http://api.internal.test:{port}/**")])
                    .bearer("api_key"),
            )
            .integration(open_to("api.internal.test", port))
            .loopback_host("api.internal.test")
            .limits(|l| l.max_concurrent_calls = calls)
            .build();
        let journal = crate::journal::Journal::open(journal, 1 << 20).unwrap();
        Sidecar::new(cfg, &[], journal).unwrap()
    }

    /// [`sidecar_with`] `calls` call slots, its journal in a new directory
    /// (kept while the first value lives), its platform [`counting_platform`]
    /// (the count of its fetches) and its upstream [`credential_echo`] (the port).
    async fn fetching_sidecar(
        calls: usize,
    ) -> (
        tempfile::TempDir,
        Arc<Sidecar>,
        tokio::sync::watch::Receiver<usize>,
        u16,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let j = dir.path().join("egress.journal");
        std::fs::write(&j, b"").unwrap();
        let (sock, fetched) = counting_platform(dir.path()).await;
        let port = credential_echo().await;
        let sidecar = sidecar_with(port, &sock, &j, calls);
        (dir, sidecar, fetched, port)
    }

    /// POSTs a stateless `tools/call` of `tool` with `mcp-name: named`
    /// (`accept` as given) and returns the answer's status and text.
    async fn call(router: &Endpoint, named: &str, tool: &str, accept: &str, port: u16) -> String {
        use tower::ServiceExt;
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": tool, "arguments": {"target": format!("http://api.internal.test:{port}/x")},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}}});
        let req = Request::post("/")
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .header("accept", accept)
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", named)
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        format!("{} {}", status.as_u16(), String::from_utf8_lossy(&bytes))
    }

    /// Only an agent's target as it wrote it is remembered by the guarded
    /// client (its parse, by its text); a target a credential was put into
    /// (a `{{field}}` template) is parsed for its call and not kept, so the
    /// credential does not outlive the call in the memo.
    #[tokio::test]
    async fn a_target_with_the_credential_in_it_is_not_remembered() {
        let (_dir, sidecar, _fetched, port) = fetching_sidecar(8).await;
        let state = McpState::new(sidecar.clone());
        let args = |target: String| {
            let mut m = serde_json::Map::new();
            m.insert("target".into(), Value::String(target));
            m
        };
        let templated = format!("http://api.internal.test:{port}/k/{{{{api_key}}}}");
        let plain = format!("http://api.internal.test:{port}/plain");
        for target in [&templated, &plain] {
            let r = state
                .call("svc__api_call", Some(&args(target.clone())), None)
                .await
                .unwrap();
            assert_eq!(r.is_error, Some(false), "{target}: {r:?}");
        }
        let kept = sidecar.client.target_memo().texts();
        assert!(
            kept.contains(&plain),
            "the plain target is remembered: {kept:?}"
        );
        assert!(
            kept.iter()
                .all(|t| !t.contains("sekrit") && !t.contains("{{")),
            "no prepared target is remembered: {kept:?}"
        );
    }

    /// The credential fetch starts from the `Mcp-Name` header, before the
    /// body is read: one fetch per call, on the stateless call path and on rmcp's; a
    /// header that names another tool than the body costs one unused fetch
    /// (on the wire, then dropped) and injects nothing into the call the
    /// body makes; the next call still gets its credential; an unreachable
    /// platform is the call's error.
    #[tokio::test]
    async fn the_credential_fetch_starts_with_the_headers_and_serves_one_call() {
        let (dir, sidecar, mut fetched, port) = fetching_sidecar(8).await;
        let router = endpoint_with(sidecar, true);
        let plain = "application/json, text/event-stream";
        let fetches = |rx: &tokio::sync::watch::Receiver<usize>| *rx.borrow();

        // The stateless call path: one fetch, injected.
        let a = call(&router, "svc__api_call", "svc__api_call", plain, port).await;
        assert!(
            a.contains("injected") && a.contains(r#""isError":false"#),
            "{a}"
        );
        assert_eq!(fetches(&fetched), 1);

        // rmcp's path (weighted Accept ranges are not the stateless call path's): the
        // fetch the header started is the one the call takes.
        let weighted = "application/json;q=1, text/event-stream;q=0.5";
        let b = call(&router, "svc__api_call", "svc__api_call", weighted, port).await;
        assert!(
            b.contains("injected") && b.contains(r#""isError":false"#),
            "{b}"
        );
        assert_eq!(fetches(&fetched), 2);

        // The header names svc, the body calls open: rmcp refuses the
        // contradiction; svc's fetch went out with the headers and is
        // dropped unread.
        let c = call(&router, "svc__api_call", "open__api_call", plain, port).await;
        assert!(c.starts_with("400 ") && !c.contains("sekrit"), "{c}");
        tokio::time::timeout(Duration::from_secs(10), fetched.wait_for(|n| *n == 3))
            .await
            .expect("the header's fetch reached the platform")
            .unwrap();

        // The pool recovers from the dropped fetch: the next call is served.
        let d = call(&router, "svc__api_call", "svc__api_call", plain, port).await;
        assert!(d.starts_with("200 ") && d.contains("injected"), "{d}");
        assert_eq!(fetches(&fetched), 4);

        // No platform: the fetch fails where it starts, and the call says so.
        let gone = dir.path().join("gone.sock");
        let j2 = dir.path().join("egress2.journal");
        std::fs::write(&j2, b"").unwrap();
        let orphan = endpoint_with(sidecar_with(port, &gone, &j2, 8), true);
        let e = call(&orphan, "svc__api_call", "svc__api_call", plain, port).await;
        assert!(
            e.contains("credential_unavailable") && e.contains(r#""isError":true"#),
            "{e}"
        );
    }

    /// Requests that name an `api_call` in their headers and never finish
    /// their bodies hold at most as many fetches as the run may have calls;
    /// a request beyond that still gets its credential, fetched when its
    /// call runs, and a slot comes back when its fetch is dropped.
    #[tokio::test]
    async fn fetches_ahead_of_their_calls_are_bounded() {
        let (_dir, sc, fetched, port) = fetching_sidecar(2).await;
        let mut headers = http::HeaderMap::new();
        headers.insert("mcp-name", "svc__api_call".parse().unwrap());
        let first = CredentialPrefetch::named_by(&headers, &sc).expect("room for a fetch");
        let second = CredentialPrefetch::named_by(&headers, &sc).expect("room for two");
        assert!(
            CredentialPrefetch::named_by(&headers, &sc).is_none(),
            "a third fetch ahead of its call was started with room for two calls"
        );

        // A call beyond the bound fetches for itself.
        let router = endpoint_with(sc.clone(), true);
        let plain = "application/json, text/event-stream";
        let a = call(&router, "svc__api_call", "svc__api_call", plain, port).await;
        assert!(a.starts_with("200 ") && a.contains("injected"), "{a}");

        // A dropped fetch gives its slot back; a taken one too.
        drop(first);
        let third = CredentialPrefetch::named_by(&headers, &sc).expect("a slot came back");
        let taken = third.take("svc").await.expect("not taken yet").unwrap();
        assert_eq!(
            secrecy::ExposeSecret::expose_secret(&taken.fields["api_key"]),
            "sekrit-value"
        );
        drop(third);
        assert!(CredentialPrefetch::named_by(&headers, &sc).is_some());
        drop(second);
        assert!(*fetched.borrow() >= 2);
    }

    /// A platform whose approvals are settled `outcome` at once, counting
    /// its credential fetches (`svc`'s) and noting, at each ask, how many
    /// fetches it had served by then.
    async fn approving_platform(
        dir: &std::path::Path,
        outcome: airlock_platform_api::approval::Outcome,
    ) -> (
        std::path::PathBuf,
        Arc<std::sync::Mutex<(usize, Vec<usize>)>>,
    ) {
        use airlock_platform_api::approval::{ASK_PATH, AskAnswer, AskRequest};
        type Seen = Arc<std::sync::Mutex<(usize, Vec<usize>)>>;
        async fn fetch(
            axum::extract::State((seen, _)): axum::extract::State<(Seen, Outcome)>,
        ) -> axum::Json<Value> {
            seen.lock().unwrap().0 += 1;
            axum::Json(json!({"integration": "svc", "connection": "c1",
                "auth_type": "bearer", "fields": {"api_key": "sekrit-value"}}))
        }
        async fn ask(
            axum::extract::State((seen, outcome)): axum::extract::State<(Seen, Outcome)>,
            axum::Json(_): axum::Json<AskRequest>,
        ) -> axum::Json<AskAnswer> {
            let mut s = seen.lock().unwrap();
            let fetched = s.0;
            s.1.push(fetched);
            axum::Json(AskAnswer {
                id: "apr_1".into(),
                outcome,
                answered_by: Some("key_1".into()),
            })
        }
        use airlock_platform_api::approval::Outcome;
        let sock = dir.join("platform.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let seen: Seen = Arc::default();
        let app = axum::Router::new()
            .route("/internal/v1/credentials/svc", axum::routing::get(fetch))
            .route(ASK_PATH, axum::routing::post(ask))
            .with_state((seen.clone(), outcome));
        tokio::spawn(async move { axum::serve(listener, app).await });
        (sock, seen)
    }

    /// An `api_call` an `ask` rule holds fetches its credential only once a
    /// person allowed it: at the ask no fetch was made (not even the one
    /// its `Mcp-Name` header would start), a denied or unanswered request
    /// never fetches it, an allowed one fetches it once and sends it.
    #[tokio::test]
    async fn a_held_call_fetches_its_credential_only_once_allowed() {
        use airlock_platform_api::approval::Outcome;
        use airlock_test_support::sidecar_config::{SidecarConfigBuilder, integration};
        let port = credential_echo().await;
        for (outcome, answer, fetches) in [
            (Outcome::Denied, "approval_denied", 0),
            (Outcome::Expired, "approval_timeout", 0),
            (Outcome::AllowedOnce, "injected", 1),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let j = dir.path().join("egress.journal");
            std::fs::write(&j, b"").unwrap();
            let (sock, seen) = approving_platform(dir.path(), outcome).await;
            let cfg = SidecarConfigBuilder::detached("run_hold", &sock)
                .integration(
                    integration("svc")
                        .authorized([format!("http://api.internal.test:{port}/**")])
                        .rules(
                            json!([{"id": "ask", "host": format!("http://api.internal.test:{port}"),
                            "access": "full", "action": "ask", "timeout": 60}]),
                        )
                        .bearer("api_key"),
                )
                .loopback_host("api.internal.test")
                .build();
            let journal = crate::journal::Journal::open(&j, 1 << 20).unwrap();
            let router = endpoint_with(Sidecar::new(cfg, &[], journal).unwrap(), true);
            let plain = "application/json, text/event-stream";
            let got = call(&router, "svc__api_call", "svc__api_call", plain, port).await;
            assert!(got.contains(answer), "{outcome:?}: {got}");
            let (fetched, at_ask) = seen.lock().unwrap().clone();
            assert_eq!(at_ask, [0], "{outcome:?}: asked once, before any fetch");
            assert_eq!(fetched, fetches, "{outcome:?}: fetches");
        }
    }

    #[test]
    fn result_uris() {
        assert_eq!(result_uri("r1", "abc"), "airlock://result/r1/abc");
        assert_eq!(
            parse_result_uri("airlock://result/r1/abc", "r1"),
            Some("abc")
        );
        for bad in [
            "airlock://result/r2/abc",
            "airlock://result/r1/",
            "airlock://result/r1/a/b",
            "airlock://result/r1/../x",
            "airlock://result/r1",
            "https://result/r1/abc",
        ] {
            assert_eq!(parse_result_uri(bad, "r1"), None, "{bad}");
        }
    }
}

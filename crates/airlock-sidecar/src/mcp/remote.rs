//! Remote MCP integrations (`source = { kind = "remote", url }`): the
//! sidecar is an MCP client (the official `rmcp` client over Streamable
//! HTTP) of the integration's server, and serves that server's tools on
//! `/mcp` as `{namespace}__{tool}` beside the integration's `api_call`.
//!
//! Every HTTP exchange with the server is one [`GuardedMcpHttp`] request:
//! - the connection's credential is fetched from the platform for that
//!   request and delivered as the integration's `delivery` says
//!   ([`args::delivery_header`], the same rule as `api_call`);
//! - the egress guard admits the URL under the integration's
//!   `authorized_uris` and the credential rules, resolves and pins, and
//!   judges every redirect hop;
//! - the request is in the run's egress log (source `mcp`) before it leaves;
//! - the answer is read whole within the response limit and the request's
//!   credential values are redacted from it before rmcp parses it, so no
//!   message of the server can carry the credential to the agent.
//!
//! A misbehaving server is bounded: its answers by size and time, its tool
//! list by [`MAX_TOOLS`], [`MAX_LIST_PAGES`] and [`MAX_TOOL_BYTES`], its
//! connection attempts by a backoff. It cannot ask the sidecar for anything
//! (the client handler offers no sampling, roots or elicitation).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_egress::{AuthorizedUris, CallRules, GuardedResponse, OutboundRequest};
use airlock_platform_api::launch::ToolAllowlist;
use airlock_platform_api::wire::EgressOutcome;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use http::header::{ACCEPT, ACCEPT_ENCODING, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use rmcp::ClientHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientConfig, ClientJsonRpcMessage, ClientRequest,
    ContentBlock, ErrorData, Implementation, PaginatedRequestParams, ProtocolVersion,
    ServerJsonRpcMessage, Tool,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, NotificationContext, RoleClient};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use serde_json::{Map, Value};
use sse_stream::Sse;

use super::api_call::{self, error_result};
use super::args;
use crate::config::Integration;
use crate::credential::Redactor;
use crate::credential::fetch::{self, Fetched};
use crate::egress::{Allowed, InFlight, Outcome, Plane, Refused, Source};
use crate::state::Sidecar;

/// Most tools taken from one server; the rest are left out (and logged).
pub const MAX_TOOLS: usize = 256;
/// Most `tools/list` pages read from one server.
pub const MAX_LIST_PAGES: usize = 16;
/// Largest tool definition (name, description, schemas) taken, serialised.
pub const MAX_TOOL_BYTES: usize = 64 * 1024;
/// Longest tool name taken from a server (before the namespace is added).
pub const MAX_TOOL_NAME: usize = 64;
/// After a failed connection, the next attempt waits this long.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Why an exchange with a remote MCP server did not happen or failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{0}")]
    Egress(airlock_egress::EgressError),
    #[error("the platform did not provide the {namespace} credential ({status})")]
    Credential { namespace: String, status: String },
    #[error("{0}")]
    Delivery(String),
    #[error("the egress log could not record the request: {0}")]
    Unrecorded(String),
    #[error(
        "the server answered with a body encoded as {0:?} although the sidecar asked for \
         identity; an encoded answer cannot be checked for the credential, so it is withheld"
    )]
    Unredactable(String),
}

/// The rmcp HTTP client of one remote integration: every exchange goes
/// through the sidecar's guarded client (see the module documentation).
#[derive(Clone)]
pub struct GuardedMcpHttp {
    sidecar: Arc<Sidecar>,
    namespace: Arc<str>,
    /// Parsed `authorized_uris` when they hold no `{$credential.…}` template.
    authorized: Option<Arc<AuthorizedUris>>,
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl GuardedMcpHttp {
    fn new(sidecar: Arc<Sidecar>, namespace: &str) -> Self {
        let authorized = sidecar
            .integrations
            .get(namespace)
            .filter(|i| !AuthorizedUris::has_templates(&i.authorized_uris))
            .map(|i| Arc::new(i.authorized()));
        GuardedMcpHttp {
            sidecar,
            namespace: namespace.into(),
            authorized,
        }
    }

    /// One HTTP exchange with the server: credential, guard, egress record,
    /// bounded read, redaction.
    async fn exchange(
        &self,
        method: Method,
        uri: &str,
        mut headers: HeaderMap,
        body: Bytes,
    ) -> Result<Answer, RemoteError> {
        let sidecar = &self.sidecar;
        let ns: &str = &self.namespace;
        let Some(integration) = sidecar.integrations.get(ns) else {
            return Err(RemoteError::Delivery(format!("no integration {ns}")));
        };
        let (Fetched { fields, redactor }, credential_headers) =
            credential(sidecar, integration, &mut headers).await?;
        let rendered;
        let authorized = match &self.authorized {
            Some(a) => a.as_ref(),
            None => {
                rendered = integration.authorized_with(&fields);
                &rendered
            }
        };
        let rules = CallRules {
            authorized,
            allow_all_uris: integration.allow_all_uris,
            credentialed: integration.has_connection,
        };
        let admission = match sidecar.client.admit(uri, &method, &rules).await {
            Ok(a) => a,
            Err(e) => {
                let what = Refused {
                    source: Source::Mcp,
                    plane: Plane::Api,
                    integration: Some(ns),
                    method: method.as_str(),
                    url: uri,
                };
                sidecar.egress.refused(&what, &e, &redactor);
                return Err(RemoteError::Egress(e));
            }
        };
        let bytes_out = body.len() as u64;
        let allowed = Allowed {
            source: Source::Mcp,
            plane: Plane::Api,
            integration: Some(ns),
            method: method.as_str(),
            target: admission.target(),
            bytes_out,
        };
        let mut flight = sidecar
            .egress
            .begin_as(&allowed, &redactor, Some(EgressOutcome::NotSent))
            .map_err(|e| RemoteError::Unrecorded(e.to_string()))?;
        flight.will_send();
        let req = OutboundRequest {
            method,
            url: uri.to_owned(),
            headers,
            body,
            credential_headers,
        };
        let resp = match sidecar.client.send_admitted(admission, req, &rules).await {
            Ok(r) => r,
            Err(e) => {
                flight.complete(Outcome::of_error(&e).bytes_out(bytes_out));
                let mut e = e;
                e.detail = redactor.str(&e.detail);
                return Err(RemoteError::Egress(e));
            }
        };
        answer(resp, flight, bytes_out, &redactor)
    }
}

/// The integration's credential for one exchange (none without a
/// connection), put into `headers` as its delivery says; the names of the
/// headers that carry it. Only an answer the sidecar can read is redacted:
/// `headers` ask for `identity`.
async fn credential(
    sidecar: &Sidecar,
    integration: &Integration,
    headers: &mut HeaderMap,
) -> Result<(Fetched, Vec<HeaderName>), RemoteError> {
    let ns = integration.namespace.as_str();
    let fetched = if integration.has_connection {
        fetch::fetch(&sidecar.platform, &sidecar.credentials, ns)
            .await
            .map_err(|e| RemoteError::Credential {
                namespace: e.namespace,
                status: e.status.map_or("unreachable".into(), |s| s.to_string()),
            })?
    } else {
        Fetched {
            fields: BTreeMap::new(),
            redactor: Redactor::none(),
        }
    };
    let mut credential_headers = Vec::new();
    if let Some(d) = integration
        .delivery
        .as_ref()
        .filter(|_| integration.has_connection)
    {
        let (name, value) = args::delivery_header(d, &fetched.fields)
            .map_err(|e| RemoteError::Delivery(fetched.redactor.str(&e.to_string())))?;
        headers.remove(&name);
        headers.insert(name.clone(), value);
        credential_headers.push(name);
    }
    headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    Ok((fetched, credential_headers))
}

/// The server's answer, its record completed: an answer that cannot be
/// searched for the credential is withheld; the rest is redacted.
fn answer(
    resp: GuardedResponse,
    flight: InFlight,
    bytes_out: u64,
    redactor: &Redactor,
) -> Result<Answer, RemoteError> {
    let answered = Outcome::completed(resp.status.as_u16())
        .bytes_out(bytes_out)
        .bytes_in(resp.body.len() as u64);
    if !redactor.is_empty()
        && let Some(coding) = crate::credential::unreadable_coding(&resp.headers)
    {
        flight.complete(Outcome {
            kind: Some(EgressOutcome::Withheld),
            ..answered
        });
        return Err(RemoteError::Unredactable(coding));
    }
    flight.complete(answered);
    let body = if redactor.is_empty() {
        resp.body
    } else {
        Bytes::from(redactor.bytes(&resp.body))
    };
    Ok(Answer {
        status: resp.status,
        headers: resp.headers,
        body,
    })
}

type HttpError = StreamableHttpError<RemoteError>;

fn unexpected(msg: String) -> HttpError {
    StreamableHttpError::UnexpectedServerResponse(Cow::Owned(msg))
}

fn media_type_is(ct: Option<&HeaderValue>, want: &str) -> bool {
    ct.and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(want))
}

/// The first bytes of a body, for a diagnostic.
fn preview(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(&body[..body.len().min(256)]).into_owned();
    s.chars().filter(|c| !c.is_control()).collect()
}

impl StreamableHttpClient for GuardedMcpHttp {
    type Error = RemoteError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let body = serde_json::to_vec(&message)?;
        let mut headers = HeaderMap::new();
        for (k, v) in custom_headers {
            headers.insert(k, v);
        }
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let session_was_attached = session_id.is_some();
        if let Some(id) = &session_id {
            let v = HeaderValue::from_str(id)
                .map_err(|_| unexpected("the server's session id is not a header value".into()))?;
            headers.insert(super::MCP_SESSION_ID.clone(), v);
        }
        let answer = self
            .exchange(Method::POST, &uri, headers, Bytes::from(body))
            .await
            .map_err(StreamableHttpError::Client)?;
        post_response(&message, session_was_attached, answer, limits)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        let mut headers = HeaderMap::new();
        for (k, v) in custom_headers {
            headers.insert(k, v);
        }
        if let Ok(v) = HeaderValue::from_str(&session_id) {
            headers.insert(super::MCP_SESSION_ID.clone(), v);
        }
        let answer = self
            .exchange(Method::DELETE, &uri, headers, Bytes::new())
            .await
            .map_err(StreamableHttpError::Client)?;
        if answer.status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportDeleteSession);
        }
        Ok(())
    }

    /// Server-initiated streams are not opened: the sidecar needs only the
    /// answers to its own requests (a changed tool list is noticed from
    /// the notifications in those answers).
    async fn get_stream(
        &self,
        _uri: Arc<str>,
        _session_id: Option<Arc<str>>,
        _last_event_id: Option<String>,
        _auth_header: Option<String>,
        _custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        Err(StreamableHttpError::ServerDoesNotSupportSse)
    }
}

/// What a POST's answer is to the client: accepted, a session gone, a JSON
/// message, or a stream of events (each within `limits`).
fn post_response(
    message: &ClientJsonRpcMessage,
    session_was_attached: bool,
    answer: Answer,
    limits: StreamableHttpResponseLimits,
) -> Result<StreamableHttpPostResponse, HttpError> {
    let status = answer.status;
    if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
        return Ok(StreamableHttpPostResponse::Accepted);
    }
    if status == StatusCode::NOT_FOUND && session_was_attached {
        return Err(StreamableHttpError::SessionExpired);
    }
    let session = answer
        .headers
        .get(&super::MCP_SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let awaits_no_response = matches!(
        message,
        ClientJsonRpcMessage::Notification(_)
            | ClientJsonRpcMessage::Response(_)
            | ClientJsonRpcMessage::Error(_)
    );
    let ct = answer.headers.get(CONTENT_TYPE);
    let is_json = media_type_is(ct, "application/json");
    if !status.is_success() {
        if let Some(r) =
            legacy_discover_response(message, session_was_attached, status, &answer.body)
        {
            return Ok(r);
        }
        if is_json
            && answer.body.len() <= limits.max_json_response_size
            && let Ok(err @ ServerJsonRpcMessage::Error(_)) =
                serde_json::from_slice::<ServerJsonRpcMessage>(&answer.body)
        {
            return Ok(StreamableHttpPostResponse::Json(err, session));
        }
        return Err(unexpected(format!(
            "HTTP {status}: {}",
            preview(&answer.body)
        )));
    }
    if awaits_no_response && answer.body.is_empty() {
        return Ok(StreamableHttpPostResponse::Accepted);
    }
    if media_type_is(ct, "text/event-stream") {
        let events = sse_events(answer.body, limits.max_sse_event_size);
        return Ok(StreamableHttpPostResponse::Sse(events, session));
    }
    if is_json {
        if answer.body.len() > limits.max_json_response_size {
            return Err(StreamableHttpError::ResponseBodyTooLarge {
                max_size: limits.max_json_response_size,
            });
        }
        return match serde_json::from_slice::<ServerJsonRpcMessage>(&answer.body) {
            Ok(m) => Ok(StreamableHttpPostResponse::Json(m, session)),
            Err(_) if awaits_no_response => Ok(StreamableHttpPostResponse::Accepted),
            Err(e) => Err(unexpected(format!(
                "the server's answer is not a JSON-RPC message ({e}): {}",
                preview(&answer.body)
            ))),
        };
    }
    if awaits_no_response {
        return Ok(StreamableHttpPostResponse::Accepted);
    }
    Err(StreamableHttpError::UnexpectedContentType(
        ct.and_then(|v| v.to_str().ok()).map(str::to_owned),
    ))
}

/// The events of an SSE answer read whole, none larger than `max` bytes.
fn sse_events(body: Bytes, max: usize) -> BoxStream<'static, Result<Sse, SseError>> {
    sse_stream::SseStream::from_bytes_stream(futures::stream::once(async move {
        Ok::<Bytes, std::io::Error>(body)
    }))
    .map(move |e| match e {
        Ok(sse) if sse.data.as_ref().is_some_and(|d| d.len() > max) => {
            Err(SseError::Body(Box::new(std::io::Error::other(format!(
                "an event is larger than {max} bytes"
            )))))
        }
        other => other,
    })
    .boxed()
}

/// rmcp's own rule (its built-in clients' `legacy_discover_response`): a
/// `server/discover` refused with a 4xx by a server of an older revision
/// becomes a JSON-RPC error correlated with the probe, so the lifecycle
/// falls back to `initialize`.
fn legacy_discover_response(
    message: &ClientJsonRpcMessage,
    session_was_attached: bool,
    status: StatusCode,
    body: &[u8],
) -> Option<StreamableHttpPostResponse> {
    if session_was_attached
        || !status.is_client_error()
        || matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
    {
        return None;
    }
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    if !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return None;
    }
    let error = match serde_json::from_slice::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Error(error)) => error.error,
        _ => ErrorData::invalid_request(
            format!(
                "server/discover rejected with HTTP {status}: {}",
                preview(body)
            ),
            None,
        ),
    };
    Some(StreamableHttpPostResponse::Json(
        ServerJsonRpcMessage::error(error, Some(request.id.clone())),
        None,
    ))
}

/// The sidecar's side of the client session: it offers the server nothing
/// (no sampling, roots or elicitation) and notes a changed tool list.
#[derive(Clone)]
struct Handler {
    stale: Arc<AtomicBool>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            Default::default(),
            Implementation::new("airlock-sidecar", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.stale.store(true, Ordering::Release);
    }
}

type Session = rmcp::service::RunningService<RoleClient, Handler>;

struct Link {
    session: Session,
    stale: Arc<AtomicBool>,
}

/// A remote tool left out for its name: logged, and noted in `tools/list`'s
/// `_meta` (`airlock/dropped_tools`) so the agent knows why it is missing.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Dropped {
    /// The full name it would have had.
    pub name: String,
    pub reason: &'static str,
}

/// Most [`Dropped`] notes kept per server (a hostile list may repeat one
/// name thousands of times).
const MAX_DROPPED_NOTES: usize = 16;

/// Where an integration's MCP server is.
enum Upstream {
    /// A remote server's Streamable HTTP endpoint, through [`GuardedMcpHttp`].
    Http(String),
    /// A local runner (`source.kind = "local"`): its bridge, `airlock
    /// runner`, connects to this listener and relays the server's stdio.
    Runner(tokio::sync::Mutex<tokio::net::UnixListener>),
}

/// One integration served by an MCP server: its client session (opened on
/// first use) and the tools it serves, renamed `{namespace}__{tool}`.
pub struct Remote {
    namespace: String,
    upstream: Upstream,
    link: tokio::sync::Mutex<Option<Link>>,
    /// The last tool list, for `get_tool` (synchronous).
    tools: Mutex<Arc<Vec<Tool>>>,
    /// The tools of the last list left out for their names.
    dropped: Mutex<Arc<Vec<Dropped>>>,
    failed: Mutex<Option<(Instant, Unavailable)>>,
    /// The integration's tools allowlist: a tool it hides is never listed.
    allow: Option<ToolAllowlist>,
}

impl Remote {
    pub fn new(namespace: &str, url: &str) -> Self {
        Self::with(namespace, Upstream::Http(url.to_owned()))
    }

    /// A local runner's server, reached on the connection its bridge makes
    /// to `listener`.
    pub fn runner(namespace: &str, listener: tokio::net::UnixListener) -> Self {
        Self::with(
            namespace,
            Upstream::Runner(tokio::sync::Mutex::new(listener)),
        )
    }

    fn with(namespace: &str, upstream: Upstream) -> Self {
        Remote {
            namespace: namespace.to_owned(),
            upstream,
            link: tokio::sync::Mutex::new(None),
            tools: Mutex::default(),
            dropped: Mutex::default(),
            failed: Mutex::default(),
            allow: None,
        }
    }

    /// The same server, its tools filtered by the integration's allowlist.
    #[must_use]
    pub fn with_tools(mut self, allow: Option<ToolAllowlist>) -> Self {
        self.allow = allow;
        self
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The tools of the last list left out for their names.
    pub fn dropped(&self) -> Arc<Vec<Dropped>> {
        self.dropped.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// The last tool list fetched (possibly empty).
    pub fn cached(&self) -> Arc<Vec<Tool>> {
        self.tools.lock().map(|t| t.clone()).unwrap_or_default()
    }

    fn timeout(sidecar: &Sidecar) -> Duration {
        Duration::from_secs(sidecar.limits.upstream_timeout_secs.max(1))
    }

    /// The server's tools, connecting (or re-listing after a change) first.
    pub async fn tools(&self, sidecar: &Arc<Sidecar>) -> Result<Arc<Vec<Tool>>, Unavailable> {
        let mut link = self.link.lock().await;
        if link.as_ref().is_some_and(|l| l.session.is_closed()) {
            *link = None;
        }
        let stale = link
            .as_ref()
            .is_none_or(|l| l.stale.load(Ordering::Acquire));
        if !stale {
            return Ok(self.cached());
        }
        // A server that failed lately is not asked again at once: a hanging
        // one would otherwise cost every tools/list its timeout.
        if let Ok(f) = self.failed.lock()
            && let Some((at, why)) = f.as_ref()
            && at.elapsed() < RETRY_AFTER
        {
            return Err(why.clone());
        }
        let timeout = Self::timeout(sidecar);
        if link.is_none() {
            match tokio::time::timeout(timeout, self.connect(sidecar)).await {
                Ok(Ok(l)) => *link = Some(l),
                Ok(Err(e)) => return Err(self.failure(ListFailure::Connect(e))),
                Err(_) => return Err(self.failure(ListFailure::ConnectTimeout(timeout))),
            }
        }
        let Some(l) = link.as_ref() else {
            return Err(Unavailable::NotConnected);
        };
        // Cleared before the list is read: a change notified meanwhile
        // marks it stale again.
        l.stale.store(false, Ordering::Release);
        let listed = match tokio::time::timeout(timeout, self.list(sidecar, &l.session)).await {
            Ok(r) => r,
            Err(_) => Err(ListFailure::ListTimeout(timeout)),
        };
        let tools = match listed {
            Ok(t) => Arc::new(t),
            Err(e) => {
                l.stale.store(true, Ordering::Release);
                return Err(self.failure(e));
            }
        };
        if let Ok(mut t) = self.tools.lock() {
            *t = tools.clone();
        }
        if let Ok(mut f) = self.failed.lock() {
            *f = None;
        }
        Ok(tools)
    }

    /// `failure` as the agent is told it; remembered for [`RETRY_AFTER`].
    fn failure(&self, failure: ListFailure) -> Unavailable {
        let why = Unavailable::Failed {
            namespace: self.namespace.clone(),
            failure: Arc::new(failure),
        };
        tracing::warn!(integration = %self.namespace, "{why}");
        if let Ok(mut f) = self.failed.lock() {
            *f = Some((Instant::now(), why.clone()));
        }
        why
    }

    async fn connect(&self, sidecar: &Arc<Sidecar>) -> Result<Link, ConnectError> {
        let stale = Arc::new(AtomicBool::new(true));
        let handler = Handler {
            stale: stale.clone(),
        };
        let lifecycle = ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::V_2025_11_25),
        };
        let session = match &self.upstream {
            Upstream::Http(url) => {
                let http = GuardedMcpHttp::new(sidecar.clone(), &self.namespace);
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                config.max_json_response_size = sidecar.limits.max_response_bytes;
                config.max_sse_event_size = sidecar.limits.max_response_bytes;
                config.reinit_on_expired_session = true;
                let transport = StreamableHttpClientTransport::with_client(http, config);
                handler.serve_with_lifecycle(transport, lifecycle).await
            }
            Upstream::Runner(listener) => {
                // The bridge connected when the runner started; a later
                // connection (the runner's server was restarted) replaces
                // a closed session.
                let (stream, _) = listener
                    .lock()
                    .await
                    .accept()
                    .await
                    .map_err(ConnectError::Accept)?;
                let (read, write) = stream.into_split();
                // Every message of the runner is one line, bounded like a
                // remote server's answer.
                let transport =
                    rmcp::transport::async_rw::AsyncRwTransport::<RoleClient, _, _>::new(
                        read, write,
                    )
                    .with_max_line_length(sidecar.limits.max_response_bytes);
                handler.serve_with_lifecycle(transport, lifecycle).await
            }
        }
        .map_err(|e| ConnectError::Start(Box::new(e)))?;
        if let Some(info) = session.peer_info() {
            tracing::info!(
                integration = %self.namespace,
                protocol = %info.protocol_version,
                server = %info.server_info.as_ref().map_or("?", |s| s.name.as_str()),
                "remote MCP server connected"
            );
        }
        Ok(Link { session, stale })
    }

    /// Reads the server's tool list within the caps and renames each tool.
    async fn list(&self, sidecar: &Sidecar, session: &Session) -> Result<Vec<Tool>, ListFailure> {
        let mut out: Vec<Tool> = Vec::new();
        let mut cursor: Option<String> = None;
        let mut left_out = 0usize;
        let mut dropped = Vec::new();
        for _ in 0..MAX_LIST_PAGES {
            let params = cursor
                .take()
                .map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
            let page = session
                .peer()
                .list_tools(params)
                .await
                .map_err(ListFailure::List)?;
            for tool in page.tools {
                match self.take_tool(sidecar, tool, &out) {
                    Ok(t) if out.len() < MAX_TOOLS => out.push(t),
                    Ok(_) | Err(None) => left_out += 1,
                    Err(Some(d)) => {
                        tracing::warn!(integration = %self.namespace, tool = %d.name,
                            "the remote MCP server lists a tool whose name another tool has: it is not served");
                        left_out += 1;
                        if dropped.len() < MAX_DROPPED_NOTES {
                            dropped.push(d);
                        }
                    }
                }
            }
            match page.next_cursor {
                Some(c) if !c.is_empty() && out.len() < MAX_TOOLS => cursor = Some(c),
                Some(_) if out.len() >= MAX_TOOLS => {
                    left_out += 1;
                    break;
                }
                _ => break,
            }
        }
        if left_out > 0 {
            tracing::warn!(
                integration = %self.namespace,
                kept = out.len(),
                left_out,
                "the remote MCP server lists tools past the sidecar's caps ({MAX_TOOLS} tools, \
                 {MAX_LIST_PAGES} pages, {MAX_TOOL_BYTES} bytes a tool) or with unusable names: \
                 those are not served"
            );
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        if let Ok(mut d) = self.dropped.lock() {
            *d = Arc::new(dropped);
        }
        Ok(out)
    }

    /// A server's tool as the agent sees it (renamed, without its output
    /// schema), or `Err` when it is unusable: a name that is not
    /// `[A-Za-z0-9_.-]{1,64}` or a definition over the size cap (`None`),
    /// `api_call` (the integration's own) or a duplicate (a [`Dropped`]
    /// note: the agent is told).
    fn take_tool(
        &self,
        sidecar: &Sidecar,
        mut tool: Tool,
        so_far: &[Tool],
    ) -> Result<Tool, Option<Dropped>> {
        let name = tool.name.as_ref();
        let ok = !name.is_empty()
            && name.len() <= MAX_TOOL_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !ok {
            return Err(None);
        }
        if self.allow.as_ref().is_some_and(|a| !a.allows(name)) {
            super::hidden(sidecar, &self.namespace, name, false);
            return Err(None);
        }
        let full = format!("{}__{}", self.namespace, name);
        if name == "api_call" {
            return Err(Some(Dropped {
                name: full,
                reason: "the integration's own api_call has this name",
            }));
        }
        if so_far.iter().any(|t| t.name == full) {
            return Err(Some(Dropped {
                name: full,
                reason: "the server lists this name twice",
            }));
        }
        if serde_json::to_vec(&tool).map_or(usize::MAX, |v| v.len()) > MAX_TOOL_BYTES {
            return Err(None);
        }
        tool.name = Cow::Owned(full);
        // A result over the inline cap is replaced by a link
        // ([`bound_result`]), which an output schema would forbid: clients
        // check a tool's structured content against it.
        tool.output_schema = None;
        Ok(tool)
    }

    /// Forwards one call to the server. Never fails at the protocol level
    /// for a failure of the server: that is an `isError` result.
    pub async fn call(
        &self,
        sidecar: &Arc<Sidecar>,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
    ) -> Result<CallToolResult, ErrorData> {
        let full = format!("{}__{tool}", self.namespace);
        let mut tools = self.cached();
        if !tools.iter().any(|t| t.name == full) {
            // Not listed yet, or the list changed: list again once.
            tools = match self.tools(sidecar).await {
                Ok(t) => t,
                Err(why) => {
                    return Ok(error_result(
                        "mcp_server_unavailable",
                        &why.to_string(),
                        502,
                    ));
                }
            };
        }
        if !tools.iter().any(|t| t.name == full) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {full:?}"),
                None,
            ));
        }
        let peer = {
            let link = self.link.lock().await;
            match link.as_ref() {
                Some(l) if !l.session.is_closed() => l.session.peer().clone(),
                _ => {
                    return Ok(error_result(
                        "mcp_server_unavailable",
                        &format!("the {} MCP server is not connected", self.namespace),
                        502,
                    ));
                }
            }
        };
        let params = CallToolRequestParams::new(tool.to_owned())
            .with_arguments(arguments.cloned().unwrap_or_default());
        let timeout = Self::timeout(sidecar);
        match tokio::time::timeout(timeout, peer.call_tool(params)).await {
            Ok(Ok(mut r)) => {
                // A server of an older revision leaves it out, which means
                // "complete"; the agent's revision may need it said (rmcp
                // clears it again for an older agent).
                r.result_type = Some(rmcp::model::ResultType::COMPLETE);
                Ok(r)
            }
            Ok(Err(rmcp::ServiceError::McpError(e))) => Err(e),
            Ok(Err(e)) => Ok(error_result(
                "mcp_server_failed",
                &format!("the {} MCP server failed the call: {e}", self.namespace),
                502,
            )),
            Err(_) => Ok(error_result(
                "mcp_server_failed",
                &format!(
                    "the {} MCP server did not answer within {timeout:?}",
                    self.namespace
                ),
                504,
            )),
        }
    }
}

/// A remote result whose serialised size is over the inline cap is stored
/// for the run and returned as a link, like a large `api_call` body.
pub async fn bound_result(state: &super::McpState, result: CallToolResult) -> CallToolResult {
    let inline = state.sidecar.limits.inline_result_bytes;
    let bytes = match serde_json::to_vec(&result) {
        Ok(b) => b,
        Err(_) => return result,
    };
    if bytes.len() <= inline {
        return result;
    }
    let len = bytes.len();
    match api_call::store(state, "application/json", Bytes::from(bytes)).await {
        Ok(link) => {
            let uri = link.uri.clone();
            let mut r = CallToolResult::success(vec![
                ContentBlock::text(format!(
                    "The tool's result ({len} bytes of JSON) is larger than the {inline}-byte inline \
                     limit; it was stored for this run. Read it with resources/read on {uri}."
                )),
                ContentBlock::resource_link(link),
            ]);
            r.is_error = result.is_error;
            r
        }
        Err(r) => r,
    }
}

/// A remote server's tools cannot be had: what the agent is told (the text
/// of an `mcp_server_unavailable` result) and what is logged.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unavailable {
    /// A step of connecting or listing failed (remembered for [`RETRY_AFTER`]).
    #[error("the {namespace} MCP server is unavailable: {failure}")]
    Failed {
        namespace: String,
        #[source]
        failure: Arc<ListFailure>,
    },
    /// No session after connecting (a connection just made is kept, so
    /// this does not happen).
    #[error("not connected")]
    NotConnected,
}

/// Which step of having a server's tool list failed.
#[derive(Debug, thiserror::Error)]
pub enum ListFailure {
    /// Connecting (the runner's connection, or the MCP handshake).
    #[error(transparent)]
    Connect(ConnectError),
    /// Connecting took longer than the upstream timeout.
    #[error("no answer within {0:?}")]
    ConnectTimeout(Duration),
    /// The server answered `tools/list` with an error.
    #[error("tools/list: {0}")]
    List(#[source] rmcp::ServiceError),
    /// `tools/list` took longer than the upstream timeout.
    #[error("tools/list: no answer within {0:?}")]
    ListTimeout(Duration),
}

/// Why a server's MCP start failed, in the operator's words: the
/// transport's own error, without rmcp's name of the transport's Rust type.
/// Why a remote MCP server (or a local runner) could not be connected.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The runner's bridge did not connect.
    #[error("the runner's connection: {0}")]
    Accept(#[source] std::io::Error),
    /// The MCP handshake failed.
    #[error("{}", start_failure(.0))]
    Start(#[source] Box<rmcp::service::ClientInitializeError>),
}

fn start_failure(e: &rmcp::service::ClientInitializeError) -> String {
    use rmcp::service::ClientInitializeError as E;
    match e {
        E::TransportError { error, context } => format!("{} (while {context})", error.error),
        E::ConnectionClosed(when) => format!("it closed the connection ({when})"),
        other => other.to_string(),
    }
}

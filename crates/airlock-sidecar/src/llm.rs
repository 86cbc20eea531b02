//! `/llm/…`: the model relay.
//!
//! The agent's SDK talks to the sidecar as if it were the provider; the
//! relay swaps the agent's placeholder key for the real one (from the
//! platform, held between calls for at most a minute: see [`HeldKey`]),
//! sends the call through the
//! egress guard, passes the answer back as it arrives (server-sent events are
//! never buffered), and meters the tokens it reports, here, where the agent
//! cannot forge them. Each call becomes an egress record (`source: "llm"`)
//! and, for a successful generation call, a cost event.
//!
//! # Paths
//!
//! The agent uses `base_url = http://…/llm/v1` (OpenAI SDKs) or
//! `http://…/llm` (Anthropic SDKs); either way the relay sees `/v1/…`, which
//! is mapped the way each provider's own SDK maps it onto `model.base_url`:
//!
//! | provider | agent path | upstream URL |
//! |---|---|---|
//! | openai | `/v1/chat/completions`, `/v1/responses`, `/v1/completions`, `/v1/embeddings`, `GET /v1/models[/{id}]` | `base_url` + the path without `/v1` (`https://api.openai.com/v1` + `/chat/completions`) |
//! | anthropic | `/v1/messages`, `/v1/messages/count_tokens`, `GET /v1/models[/{id}]` | `base_url` + the path (`https://api.anthropic.com` + `/v1/messages`; a `base_url` ending in `/v1` is taken as its root) |
//!
//! The query string is kept. Any other path or method is 404: the relay is
//! an inference relay, not a way to reach the rest of the provider's API
//! with the operator's key.
//!
//! # Headers
//!
//! Towards the provider only `content-type`, `accept`, `user-agent`,
//! `anthropic-version`, `anthropic-beta`, `openai-beta` and
//! `idempotency-key` are taken from the agent; `Authorization` and
//! `x-api-key` (which hold the sidecar token or a placeholder) never are.
//! The key goes out as `Authorization: Bearer` (openai) or `x-api-key`
//! (anthropic), with `accept-encoding: identity` so the stream can be
//! metered. Back towards the agent only a safe list is kept (content type,
//! request ids, rate-limit and retry headers); never `set-cookie` or
//! anything that authenticates.
//!
//! # Metering
//!
//! From `usage` in JSON answers (`prompt_tokens`/`completion_tokens`,
//! `input_tokens`/`output_tokens`; Anthropic's cache read/creation tokens
//! count as input), and from SSE streams: OpenAI chat streams are asked for
//! `stream_options.include_usage` and, when the client had not asked for it,
//! the extra usage-only chunk is dropped before it reaches the client; the
//! Responses API reports usage in `response.completed`; Anthropic in
//! `message_start` and the last `message_delta`. The stream is split into
//! events incrementally (across chunk edges) while its bytes are forwarded
//! unchanged. A client that disconnects early does not escape metering: the
//! rest of the upstream answer is read in the background and metered.
//!
//! # Errors
//!
//! JSON in a shape both SDKs parse: `{"type":"error","error":{"type","code","message"}}`.
//! No model configured or no model credential: 503. Guard refusal: 403
//! `type: "blocked"` with the egress code. Upstream failure or a redirect
//! from the provider (never followed): 502. Request body over
//! `limits.max_request_bytes`: 413.

use std::borrow::Cow;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use airlock_egress::{
    AuthorizedUris, CallRules, EgressCode, EgressError, OutboundRequest, StreamingBody,
};
use airlock_platform_api::connection_types::ConnectionType;
use airlock_platform_api::wire::{CostRecord, EgressOutcome, Metering, RunEvent};
use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use std::pin::Pin;

mod event;
mod provider_fetch;

use crate::config::{MODEL_CREDENTIAL, Model, Provider};
use crate::credential::Redactor;
use crate::egress::{Allowed, InFlight, Outcome, Refused, Source};
use crate::state::{Sidecar, now_ms};
use event::{Counts, EventView};

/// Request headers taken from the agent.
const FORWARDED_REQUEST_HEADERS: &[&str] = &[
    "content-type",
    "accept",
    "user-agent",
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
    "idempotency-key",
];

/// Response headers passed back to the agent (exact names).
const SAFE_RESPONSE_HEADERS: &[&str] = &[
    "content-type",
    "content-encoding",
    "cache-control",
    "x-request-id",
    "request-id",
    "openai-processing-ms",
    "openai-version",
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
];

/// Response header prefixes passed back (rate-limit information).
const SAFE_RESPONSE_PREFIXES: &[&str] = &["x-ratelimit-", "anthropic-ratelimit-"];

/// A client that went away mid-stream: the rest is read for metering for at
/// most this long (or until the sidecar stops: then what was seen is
/// recorded as unmetered).
const ABANDONED_STREAM_DEADLINE: Duration = Duration::from_secs(600);

struct Upstream {
    provider: Provider,
    /// `base_url` without a trailing `/` (and, for anthropic, without `/v1`).
    base: String,
    /// One literal pattern: `base/**`.
    authorized: AuthorizedUris,
    price_in: Option<f64>,
    price_out: Option<f64>,
    /// What the provider may be asked to reach ([`provider_fetch`]).
    fetch: provider_fetch::ProviderFetchPolicy,
}

impl Upstream {
    fn new(m: &Model) -> Upstream {
        let mut base = m.base_url.trim_end_matches('/').to_owned();
        if m.provider == Provider::Anthropic
            && let Some(root) = base.strip_suffix("/v1")
        {
            base = root.to_owned();
        }
        let authorized = AuthorizedUris::parse(&[format!("{base}/**")]);
        for d in authorized
            .diagnostics()
            .iter()
            .filter(|d| d.matches_nothing)
        {
            tracing::warn!(entry = %d.entry, "model.base_url cannot be authorized: {}", d.reason);
        }
        Upstream {
            provider: m.provider,
            base,
            authorized,
            price_in: m.price_in_per_mtok_usd,
            price_out: m.price_out_per_mtok_usd,
            fetch: provider_fetch::ProviderFetchPolicy::new(
                &m.provider_tools,
                &m.provider_fetch_uris,
            ),
        }
    }

    /// The upstream URL for an allowed agent path (see the module docs).
    fn url_for(&self, path: &str, query: Option<&str>) -> String {
        let rest = match self.provider {
            Provider::Openai => path.strip_prefix("/v1").unwrap_or(path),
            Provider::Anthropic => path,
        };
        match query {
            Some(q) => format!("{}{rest}?{q}", self.base),
            None => format!("{}{rest}", self.base),
        }
    }
}

fn provider_name(p: Provider) -> &'static str {
    match p {
        Provider::Openai => "openai",
        Provider::Anthropic => "anthropic",
    }
}

/// What an allowed path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    /// A generation call: metered, becomes a cost event.
    Metered { chat_stream_usage: bool },
    /// Listing models, counting tokens: relayed, not metered.
    Plain,
}

fn route(provider: Provider, method: &Method, path: &str) -> Option<Endpoint> {
    let model_path = path == "/v1/models"
        || path.strip_prefix("/v1/models/").is_some_and(|id| {
            !id.is_empty()
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._:@".contains(&b))
        });
    if *method == Method::GET {
        return model_path.then_some(Endpoint::Plain);
    }
    if *method != Method::POST {
        return None;
    }
    match (provider, path) {
        (Provider::Openai, "/v1/chat/completions" | "/v1/completions") => Some(Endpoint::Metered {
            chat_stream_usage: true,
        }),
        (Provider::Openai, "/v1/responses" | "/v1/embeddings") => Some(Endpoint::Metered {
            chat_stream_usage: false,
        }),
        (Provider::Anthropic, "/v1/messages") => Some(Endpoint::Metered {
            chat_stream_usage: false,
        }),
        (Provider::Anthropic, "/v1/messages/count_tokens") => Some(Endpoint::Plain),
        _ => None,
    }
}

/// The request body as sent upstream, and what the relay learnt from it.
#[derive(Debug, PartialEq)]
struct Prepared {
    body: Bytes,
    model: Option<String>,
    /// The relay added `stream_options.include_usage`: drop the usage-only chunk.
    drop_usage_chunk: bool,
}

/// The top-level members of a request body that [`prepare`] reads; every
/// other value (the conversation, the tools: nearly all of a body) is
/// skipped as it is parsed, never built. A repeated member of these three is
/// an error here: such a body goes the way of [`prepare_by_value`], whose
/// map keeps the last one.
#[derive(serde::Deserialize)]
struct RequestHead {
    model: Option<Value>,
    stream: Option<Value>,
    /// There, whatever its value (`null` included).
    #[serde(default)]
    stream_options: Present,
}

/// Whether a member is there; its value is skipped.
#[derive(Default)]
struct Present(bool);

impl<'de> serde::Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Present(true))
    }
}

/// Reads `model` and, for an OpenAI chat stream that did not ask for usage,
/// asks for it. A body that is not a JSON object is sent as it is.
///
/// Reads only the three members it needs ([`RequestHead`]) and, to ask for
/// usage, writes `"stream_options":{"include_usage":true}` into the body
/// as the agent sent it, right after its opening brace. A body it cannot
/// read that way (not a JSON object, a repeated member, `stream_options`
/// already there) goes to [`prepare_by_value`]: the same answer, by way
/// of the whole parsed tree.
fn prepare(endpoint: Endpoint, body: Bytes) -> Prepared {
    // The first byte that is not JSON whitespace opens the object. Checked
    // first: a derived struct also reads a JSON array, as its fields in order.
    let Some(open) = body
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .filter(|&i| body[i] == b'{')
    else {
        return prepare_by_value(endpoint, body);
    };
    let Ok(head) = serde_json::from_slice::<RequestHead>(&body) else {
        return prepare_by_value(endpoint, body);
    };
    let model = head
        .model
        .as_ref()
        .and_then(Value::as_str)
        .map(str::to_owned);
    if !needs_usage_asked(endpoint, head.stream.as_ref()) {
        return Prepared::as_sent(body, model);
    }
    if head.stream_options.0 {
        return prepare_by_value(endpoint, body);
    }
    // The object has a member (`stream`), so the new one is followed by a comma.
    const ASK: &[u8] = br#""stream_options":{"include_usage":true},"#;
    let mut asked = Vec::with_capacity(body.len() + ASK.len());
    asked.extend_from_slice(&body[..=open]);
    asked.extend_from_slice(ASK);
    asked.extend_from_slice(&body[open + 1..]);
    Prepared {
        body: Bytes::from(asked),
        model,
        drop_usage_chunk: true,
    }
}

/// Whether the relay asks the provider for the usage of this answer: an
/// OpenAI chat stream (`stream` is the request's member of that name) does
/// not report it unless asked.
fn needs_usage_asked(endpoint: Endpoint, stream: Option<&Value>) -> bool {
    stream.and_then(Value::as_bool) == Some(true)
        && endpoint
            == (Endpoint::Metered {
                chat_stream_usage: true,
            })
}

impl Prepared {
    /// The body as the agent sent it.
    fn as_sent(body: Bytes, model: Option<String>) -> Prepared {
        Prepared {
            body,
            model,
            drop_usage_chunk: false,
        }
    }
}

/// [`prepare`] by way of the whole body parsed as a tree: for the bodies
/// its lean reading leaves (and the oracle its tests compare it with).
fn prepare_by_value(endpoint: Endpoint, body: Bytes) -> Prepared {
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&body) else {
        return Prepared::as_sent(body, None);
    };
    let model = obj.get("model").and_then(Value::as_str).map(str::to_owned);
    if !needs_usage_asked(endpoint, obj.get("stream")) {
        return Prepared::as_sent(body, model);
    }
    let asked = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true);
    if asked {
        return Prepared::as_sent(body, model);
    }
    match obj.get_mut("stream_options") {
        Some(Value::Object(o)) => {
            o.insert("include_usage".into(), Value::Bool(true));
        }
        _ => {
            obj.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    match serde_json::to_vec(&Value::Object(obj)) {
        Ok(v) => Prepared {
            body: Bytes::from(v),
            model,
            drop_usage_chunk: true,
        },
        Err(_) => Prepared::as_sent(body, model),
    }
}

/// Refuses a model request that asks the provider to reach what the run
/// does not allow ([`provider_fetch`]): a tool the manifest does not name,
/// a URL its `provider_fetch_uris` do not cover or the guard refuses. Each
/// refusal is an egress record of source `llm`.
async fn judge_provider_fetches(
    sidecar: &Sidecar,
    up: &Upstream,
    method: &str,
    body: &[u8],
    headers: &HeaderMap,
) -> Result<(), Response> {
    let asks = provider_fetch::asks(up.provider, body, headers);
    if asks.is_empty() {
        return Ok(());
    }
    let refuse = |url: &str, e: &EgressError| {
        let refused = Refused {
            source: Source::Llm,
            integration: Some(MODEL_CREDENTIAL),
            method,
            url,
        };
        sidecar.egress.refused(&refused, e, &Redactor::none());
        egress_error(e)
    };
    if let Some((what, e)) = up.fetch.refused_tool(&asks) {
        return Err(refuse(&what, &e));
    }
    let rules = CallRules {
        authorized: &up.fetch.uris,
        allow_all_uris: false,
        credentialed: false,
    };
    for (url, what) in provider_fetch::urls(&asks) {
        if let Err(e) = sidecar.client.admit_secret_free(url, &rules).await {
            tracing::info!(%url, what, "a model request's provider fetch refused: {e}");
            return Err(refuse(url, &e));
        }
    }
    Ok(())
}

fn error(status: StatusCode, kind: &str, code: &str, message: impl Into<String>) -> Response {
    let message = message.into();
    (
        status,
        axum::Json(
            json!({"type": "error", "error": {"type": kind, "code": code, "message": message}}),
        ),
    )
        .into_response()
}

fn egress_error(e: &EgressError) -> Response {
    if e.http_status() == 403 {
        error(
            StatusCode::FORBIDDEN,
            "blocked",
            e.code.as_str(),
            format!("the model provider is not reachable: {e}"),
        )
    } else {
        error(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            e.code.as_str(),
            format!("the model provider failed: {e}"),
        )
    }
}

struct Llm {
    sidecar: Arc<Sidecar>,
    upstream: Option<Upstream>,
    key: HeldKey,
}

pub fn router(sidecar: Arc<Sidecar>) -> Router {
    let upstream = sidecar.model.as_ref().map(Upstream::new);
    Router::new().fallback(relay).with_state(Arc::new(Llm {
        sidecar,
        upstream,
        key: HeldKey::default(),
    }))
}

/// How long the relay holds the model key after fetching it.
pub const MODEL_KEY_HOLD: Duration = Duration::from_secs(60);

/// The model key between calls. The sidecar "holds, or fetches, the
/// provider credential" (spec, Sandbox and Sidecar): the relay fetches it
/// from the platform on a run's first model call and holds it, in a
/// [`SecretString`] in this process only (never on disk, in a log or in
/// the sandbox), for at most [`MODEL_KEY_HOLD`]; a call after that fetches
/// it again, so a key changed or removed on the platform is in use for at
/// most that long. A provider that refuses the key (401 or 403) makes the
/// relay forget it at once: the next call fetches. A fetch in the path of
/// every call was two process hand-offs and the platform's work before the
/// first byte could go upstream. `api_call` credentials are not held: they
/// are fetched for each call (spec: "at request time").
#[derive(Default)]
struct HeldKey(std::sync::Mutex<Option<(SecretString, Instant)>>);

impl HeldKey {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(SecretString, Instant)>> {
        // Nothing that holds this lock can panic; a poisoned lock still
        // holds a whole value.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The held key if it was fetched less than [`MODEL_KEY_HOLD`] before
    /// `now`; a stale one is dropped here.
    fn fresh(&self, now: Instant) -> Option<SecretString> {
        let mut slot = self.slot();
        match &*slot {
            Some((key, at)) if now.saturating_duration_since(*at) < MODEL_KEY_HOLD => {
                Some(key.clone())
            }
            Some(_) => {
                *slot = None;
                None
            }
            None => None,
        }
    }

    /// Holds `key`, fetched at `at`.
    fn keep(&self, key: &SecretString, at: Instant) {
        *self.slot() = Some((key.clone(), at));
    }

    /// Forgets `key` if it is the one held (a provider refused it).
    fn forget(&self, key: &SecretString) {
        let mut slot = self.slot();
        if slot
            .as_ref()
            .is_some_and(|(held, _)| held.expose_secret() == key.expose_secret())
        {
            *slot = None;
        }
    }
}

/// The model key as the platform serves it now (the relay holds it: see
/// [`HeldKey`]), from the
/// field its connection type keeps a key in (`api_key`: `key`, `bearer`:
/// `token`, `oauth2`: `access_token`; see
/// [`airlock_platform_api::connection_types`]).
async fn model_key(sidecar: &Sidecar) -> Result<SecretString, Box<Response>> {
    match sidecar.platform.credential(MODEL_CREDENTIAL).await {
        Ok(c) => {
            let Some(field) = ConnectionType::named(&c.auth_type).and_then(|t| t.key_field) else {
                return Err(Box::new(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not_configured",
                    "model_credential_missing",
                    format!(
                        "the model connection is of type {:?}, which holds no single key: store it \
                         as --type api_key with the field key",
                        c.auth_type
                    ),
                )));
            };
            match c
                .fields
                .get(field)
                .filter(|k| !k.expose_secret().is_empty())
            {
                Some(k) => Ok(k.clone()),
                None => Err(Box::new(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not_configured",
                    "model_credential_missing",
                    format!(
                        "the model connection ({}) has no {field} field",
                        c.auth_type
                    ),
                ))),
            }
        }
        Err(e) if matches!(e.status(), Some(403 | 404)) => Err(Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_configured",
            "model_credential_missing",
            "no model credential is available to this run",
        ))),
        Err(e) => {
            tracing::warn!("model relay: credential fetch failed: {e}");
            Err(Box::new(error(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                "platform_unavailable",
                "the platform did not provide the model credential",
            )))
        }
    }
}

/// The headers sent upstream: the safe list from the agent, then the key.
fn upstream_headers(
    agent: &HeaderMap,
    provider: Provider,
    key: &SecretString,
) -> Result<HeaderMap, Box<Response>> {
    let mut out = HeaderMap::new();
    for name in FORWARDED_REQUEST_HEADERS {
        for v in agent.get_all(*name) {
            out.append(HeaderName::from_static(name), v.clone());
        }
    }
    out.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    let bad_key = || {
        Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_configured",
            "model_credential_invalid",
            "the model credential is not a valid header value",
        ))
    };
    let (name, mut value) = match provider {
        Provider::Openai => (
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {}", key.expose_secret()))
                .map_err(|_| bad_key())?,
        ),
        Provider::Anthropic => (
            HeaderName::from_static("x-api-key"),
            HeaderValue::from_str(key.expose_secret()).map_err(|_| bad_key())?,
        ),
    };
    value.set_sensitive(true);
    out.insert(name, value);
    Ok(out)
}

fn safe_response_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in upstream {
        let n = name.as_str();
        if SAFE_RESPONSE_HEADERS.contains(&n)
            || SAFE_RESPONSE_PREFIXES.iter().any(|p| n.starts_with(p))
        {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

async fn relay(State(llm): State<Arc<Llm>>, req: Request) -> Response {
    let Some(up) = &llm.upstream else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_configured",
            "model_not_configured",
            "no model is configured for this run",
        );
    };
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let Some(endpoint) = route(up.provider, &parts.method, path) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            "unknown_endpoint",
            format!(
                "{} {path} is not relayed for the {} provider",
                parts.method,
                provider_name(up.provider)
            ),
        );
    };
    let sidecar = &llm.sidecar;
    let method = parts.method.as_str();
    let url = up.url_for(path, parts.uri.query());
    let rules = CallRules {
        authorized: &up.authorized,
        allow_all_uris: false,
        credentialed: true,
    };
    // The key fetch goes out first (the platform's client writes it when it
    // is first polled); the body, the guard's decision and the egress
    // record are done while the platform answers.
    let admit = async {
        let limit = sidecar.limits.max_request_bytes;
        let too_large = || {
            error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "payload_too_large",
                format!("request body exceeds the {limit}-byte limit"),
            )
        };
        let body = match body.collect().await {
            Ok(c) => c.to_bytes(),
            Err(_) => return Err(too_large()),
        };
        if body.len() > limit {
            return Err(too_large());
        }
        judge_provider_fetches(sidecar, up, method, &body, &parts.headers).await?;
        let prepared = match endpoint {
            Endpoint::Metered { .. } => prepare(endpoint, body),
            Endpoint::Plain => Prepared::as_sent(body, None),
        };
        // The URL is the configured base and the agent's own path and
        // query, made before the key exists (the key goes in a header): no
        // secret of the sidecar's is in its text, so its parse is remembered.
        let admission = match sidecar.client.admit_secret_free(&url, &rules).await {
            Ok(a) => a,
            Err(e) => {
                let refused = Refused {
                    source: Source::Llm,
                    integration: Some(MODEL_CREDENTIAL),
                    method,
                    url: &url,
                };
                sidecar.egress.refused(&refused, &e, &Redactor::none());
                return Err(egress_error(&e));
            }
        };
        let allowed = Allowed {
            source: Source::Llm,
            integration: Some(MODEL_CREDENTIAL),
            method,
            target: admission.target(),
            bytes_out: prepared.body.len() as u64,
        };
        // The key travels in a header only: nothing in the URL to redact.
        match sidecar.egress.begin(&allowed, &Redactor::none()).await {
            Ok(flight) => Ok((prepared, admission, flight)),
            Err(e) => Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "upstream_error",
                e.code(),
                e.to_string(),
            )),
        }
    };
    let started = Instant::now();
    let (key, admitted) = match llm.key.fresh(started) {
        Some(k) => (Ok(k), admit.await),
        None => {
            let (key, admitted) = tokio::join!(model_key(sidecar), admit);
            if let Ok(k) = &key {
                llm.key.keep(k, started);
            }
            (key, admitted)
        }
    };
    let (prepared, admission, flight) = match admitted {
        Ok(a) => a,
        Err(r) => return r,
    };
    let (key, headers) =
        match key.and_then(|k| upstream_headers(&parts.headers, up.provider, &k).map(|h| (k, h))) {
            Ok(kh) => kh,
            Err(r) => {
                flight.complete(Outcome::new(EgressOutcome::NotSent));
                return *r;
            }
        };
    let out = OutboundRequest {
        method: parts.method.clone(),
        url,
        headers,
        body: prepared.body,
        credential_headers: vec![header::AUTHORIZATION, HeaderName::from_static("x-api-key")],
    };
    let resp = match sidecar.client.send_streaming_admitted(admission, out).await {
        Ok(r) => r,
        Err(e) => {
            flight.complete(Outcome::of_error(&e));
            return egress_error(&e);
        }
    };
    if matches!(resp.status.as_u16(), 401 | 403) {
        llm.key.forget(&key);
    }
    drop(key);
    if resp.status.is_redirection() {
        // The provider answered; the relay does not follow (the answer is
        // the upstream's, the 502 the agent gets is the relay's).
        flight.complete(Outcome::completed(resp.status.as_u16()));
        return error(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            EgressCode::UpstreamFailed.as_str(),
            format!(
                "the model provider answered with a redirect ({}), which the relay does not follow",
                resp.status.as_u16()
            ),
        );
    }
    let content_type = resp
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let encoded = resp
        .headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.eq_ignore_ascii_case("identity"));
    let metered = matches!(endpoint, Endpoint::Metered { .. }) && resp.status.is_success();
    let mode = if !metered || encoded {
        if metered {
            tracing::warn!(
                "model relay: the provider sent an encoded answer; it is recorded as unmetered"
            );
        }
        Mode::Plain
    } else if content_type.starts_with("text/event-stream") {
        Mode::Sse {
            splitter: SseSplitter::default(),
            drop_usage_chunk: prepared.drop_usage_chunk,
        }
    } else {
        Mode::Json(Box::default())
    };
    let cost = metered.then_some(CostDraft {
        provider: up.provider,
        model: prepared.model,
        price_in: up.price_in,
        price_out: up.price_out,
        readable: !encoded,
    });
    let filtering = matches!(
        mode,
        Mode::Sse {
            drop_usage_chunk: true,
            ..
        }
    );
    let mut builder = Response::builder().status(resp.status);
    if let Some(h) = builder.headers_mut() {
        *h = safe_response_headers(&resp.headers);
        if filtering {
            h.remove(header::CONTENT_LENGTH);
        }
    }
    let streamed = matches!(mode, Mode::Sse { .. });
    let relay = Relay {
        inner: resp.body,
        mode,
        usage: Usage::default(),
        sidecar: llm.sidecar.clone(),
        flight: Some(flight),
        status: resp.status.as_u16(),
        cost,
    };
    let body = RelayBody {
        relay: Some(relay),
        ended: false,
        stop: Box::pin(sidecar.egress.stop_requested()),
    };
    let body = if streamed {
        axum::body::Body::new(FlushFirst::new(body))
    } else {
        axum::body::Body::new(body)
    };
    builder.body(body).unwrap_or_else(|_| {
        error(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "upstream_failed",
            "the answer could not be relayed",
        )
    })
}

/// What a cost event needs besides the usage.
struct CostDraft {
    provider: Provider,
    model: Option<String>,
    price_in: Option<f64>,
    price_out: Option<f64>,
    /// The answer is one the relay can read (not content-encoded).
    readable: bool,
}

/// Tokens and model as the provider reported them.
#[derive(Debug, Default, Clone, PartialEq)]
struct Usage {
    input: Option<u64>,
    output: Option<u64>,
    model: Option<String>,
}

impl Usage {
    /// Folds one `usage` object in; later reports replace earlier ones
    /// field by field (Anthropic's `message_delta` carries only the output).
    fn merge_usage(&mut self, u: &Counts) {
        if let Some(input) = u.prompt_tokens.or(u.input_tokens) {
            let cache = u
                .cache_creation_input_tokens
                .unwrap_or(0)
                .saturating_add(u.cache_read_input_tokens.unwrap_or(0));
            self.input = Some(input.saturating_add(cache));
        }
        if let Some(output) = u.completion_tokens.or(u.output_tokens) {
            self.output = Some(output);
        }
    }

    /// A reported model; an empty one is no report.
    fn note_model(&mut self, m: &str) {
        if !m.is_empty() && self.model.as_deref() != Some(m) {
            self.model = Some(m.to_owned());
        }
    }

    /// One SSE event or JSON answer: its `usage` and `model`, then those of
    /// its `response` and `message`.
    fn observe_event(&mut self, e: &EventView<'_>) {
        let all = [Some(&e.top), e.response.as_ref(), e.message.as_ref()];
        for r in all.iter().flatten() {
            if let Some(u) = &r.usage {
                self.merge_usage(u);
            }
        }
        for r in all.iter().flatten() {
            if let Some(m) = &r.model {
                self.note_model(m);
            }
        }
    }
}

/// What `input` and `output` tokens cost in µUSD at prices per million
/// tokens in USD (a price per token in µUSD), rounded. A cost past
/// `u64::MAX` (only from hostile counts or prices) is `u64::MAX`, which
/// [`CostRecord::bounded`] then records as unmetered.
fn cost_of(input: u64, output: u64, price_in: Option<f64>, price_out: Option<f64>) -> u64 {
    #[allow(clippy::cast_precision_loss)] // a cost, not an exact count
    let c = input as f64 * price_in.unwrap_or(0.0) + output as f64 * price_out.unwrap_or(0.0);
    let c = c.round();
    if c.is_nan() || c <= 0.0 {
        0
    } else if c >= 18_446_744_073_709_551_615.0 {
        u64::MAX
    } else {
        // In (0, 2^64): the conversion is exact up to f64's precision.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = c as u64;
        n
    }
}

/// Splits a server-sent-event stream into events at blank lines, whatever
/// the chunk edges (lines end in LF, CRLF or CR). Hand-written: the relay
/// needs each event's raw bytes to forward them unchanged, which SSE client
/// crates do not give.
#[derive(Default)]
struct SseSplitter {
    buf: BytesMut,
    /// Start of the first line of `buf` not yet scanned.
    line_start: usize,
}

impl SseSplitter {
    fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete event, with its terminating blank line.
    fn next_event(&mut self) -> Option<Bytes> {
        loop {
            let rest = self.buf.get(self.line_start..)?;
            let i = memchr::memchr2(b'\n', b'\r', rest)?;
            let term = match (rest.get(i), rest.get(i + 1)) {
                (Some(b'\r'), Some(b'\n')) => 2,
                (Some(b'\r'), None) => return None, // a CRLF may be cut here
                _ => 1,
            };
            self.line_start += i + term;
            if i == 0 {
                let event = self
                    .buf
                    .split_to(self.line_start.min(self.buf.len()))
                    .freeze();
                self.line_start = 0;
                return Some(event);
            }
        }
    }

    /// Whatever is left at the end of the stream (an unterminated event).
    fn finish(&mut self) -> Option<Bytes> {
        self.line_start = 0;
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }
}

/// The `data` of one raw event (lines joined with `\n`), if it has any.
fn event_data(raw: &[u8]) -> Option<Cow<'_, str>> {
    // Valid UTF-8 (every event of a well-behaved provider) is checked by
    // `from_utf8`'s word-at-a-time scan; `from_utf8_lossy` would walk it
    // chunk by chunk to give the same borrowed text.
    if let Ok(text) = std::str::from_utf8(raw) {
        return data_lines(text);
    }
    let text = String::from_utf8_lossy(raw);
    data_lines(&text).map(|d| Cow::Owned(d.into_owned()))
}

/// The `data` lines of one event, joined by LF (one line: not copied).
fn data_lines(text: &str) -> Option<Cow<'_, str>> {
    let mut data: Option<Cow<'_, str>> = None;
    // Lines end at LF or CR (memchr: a char pattern tests char by char).
    let mut rest = Some(text);
    while let Some(r) = rest {
        let line = match memchr::memchr2(b'\n', b'\r', r.as_bytes()) {
            Some(i) => {
                rest = r.get(i + 1..);
                r.get(..i).unwrap_or_default()
            }
            None => {
                rest = None;
                r
            }
        };
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            match &mut data {
                Some(d) => {
                    let d = d.to_mut();
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(Cow::Borrowed(value)),
            }
        }
    }
    data
}

/// Reads `usage` and `model` out of one JSON answer as it streams past,
/// keeping only those two top-level values (bounded), never the answer: an
/// answer of any size up to the response cap is metered in constant memory.
/// Hand-written: it needs only the two values of an object's top level, and
/// the streaming JSON crates would parse (and allocate for) all of it.
#[derive(Default)]
struct JsonUsage {
    /// Open objects and arrays.
    depth: u32,
    in_str: bool,
    esc: bool,
    state: Top,
    key: Vec<u8>,
    /// The top-level value being kept (its key is `usage` or `model`).
    capture: Option<Vec<u8>>,
    capture_is_usage: bool,
    usage: Option<Vec<u8>>,
    model: Option<Vec<u8>>,
    /// Not an object, or not JSON: nothing to meter.
    broken: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum Top {
    /// Before the opening `{`.
    #[default]
    Start,
    /// Expecting a key or `}`.
    Key,
    InKey,
    Colon,
    /// Expecting a value.
    Value,
    /// Inside a value (a scalar, a string, or a container at depth > 1).
    InValue,
    /// After a value: `,` or `}`.
    After,
    Done,
}

/// Longest top-level value kept (a `usage` object is a few hundred bytes).
const MAX_USAGE_VALUE: usize = 64 * 1024;
/// Longest key compared (longer keys are not `usage` or `model`).
const MAX_KEY: usize = 16;

impl JsonUsage {
    fn push(&mut self, data: &[u8]) {
        let mut i = 0;
        while let Some(&b) = data.get(i) {
            if self.broken || self.state == Top::Done {
                return;
            }
            i += 1;
            if self.in_str {
                // Fast path through a string nobody keeps.
                if self.capture.is_none() && self.state != Top::InKey && !self.esc {
                    let rest = data.get(i - 1..).unwrap_or_default();
                    match rest.iter().position(|&c| c == b'"' || c == b'\\') {
                        Some(p) => {
                            i = i - 1 + p;
                            let Some(&c) = data.get(i) else { return };
                            i += 1;
                            self.string_byte(c);
                        }
                        None => return,
                    }
                    continue;
                }
                self.keep(b);
                if self.state == Top::InKey && self.key.len() <= MAX_KEY && (b != b'"' || self.esc)
                {
                    self.key.push(b);
                }
                self.string_byte(b);
                continue;
            }
            if b.is_ascii_whitespace() {
                if self.state == Top::InValue && self.depth == 1 && self.capture.is_some() {
                    // A scalar ends at whitespace too; `,`/`}` confirms it.
                    self.end_value();
                    self.state = Top::After;
                } else if self.depth > 1 {
                    self.keep(b);
                }
                continue;
            }
            match (self.depth, self.state) {
                (0, Top::Start) => {
                    if b == b'{' {
                        self.depth = 1;
                        self.state = Top::Key;
                    } else {
                        self.broken = true;
                    }
                }
                (1, Top::Key) => match b {
                    b'"' => {
                        self.in_str = true;
                        self.key.clear();
                        self.state = Top::InKey;
                    }
                    b'}' => self.close_top(),
                    _ => self.broken = true,
                },
                (1, Top::Colon) => {
                    if b == b':' {
                        self.state = Top::Value;
                        let k = self.key.as_slice();
                        if k == b"usage" || k == b"model" {
                            self.capture = Some(Vec::new());
                            self.capture_is_usage = k == b"usage";
                        }
                    } else {
                        self.broken = true;
                    }
                }
                (1, Top::Value) => {
                    self.keep(b);
                    self.state = Top::InValue;
                    match b {
                        b'"' => self.in_str = true,
                        b'{' | b'[' => self.depth = 2,
                        _ => {}
                    }
                }
                (1, Top::InValue) => match b {
                    b',' => {
                        self.end_value();
                        self.state = Top::Key;
                    }
                    b'}' => {
                        self.end_value();
                        self.close_top();
                    }
                    _ => self.keep(b),
                },
                (1, Top::After) => match b {
                    b',' => self.state = Top::Key,
                    b'}' => self.close_top(),
                    _ => self.broken = true,
                },
                (d, Top::InValue) if d > 1 => {
                    self.keep(b);
                    match b {
                        b'"' => self.in_str = true,
                        b'{' | b'[' => self.depth = d.saturating_add(1),
                        b'}' | b']' => {
                            self.depth = d - 1;
                            if self.depth == 1 {
                                self.end_value();
                                self.state = Top::After;
                            }
                        }
                        _ => {}
                    }
                }
                _ => self.broken = true,
            }
        }
    }

    /// One byte inside a string (after it was kept).
    fn string_byte(&mut self, b: u8) {
        if self.esc {
            self.esc = false;
        } else if b == b'\\' {
            self.esc = true;
        } else if b == b'"' {
            self.in_str = false;
            match self.state {
                Top::InKey => self.state = Top::Colon,
                Top::InValue if self.depth == 1 => {
                    self.end_value();
                    self.state = Top::After;
                }
                _ => {}
            }
        }
    }

    fn keep(&mut self, b: u8) {
        if let Some(c) = &mut self.capture {
            if c.len() < MAX_USAGE_VALUE {
                c.push(b);
            } else {
                self.capture = None;
            }
        }
    }

    fn end_value(&mut self) {
        if let Some(c) = self.capture.take() {
            if self.capture_is_usage {
                self.usage = Some(c);
            } else {
                self.model = Some(c);
            }
        }
    }

    fn close_top(&mut self) {
        self.depth = 0;
        self.state = Top::Done;
    }

    /// The answer ended: what it said about usage and model.
    fn finish(&mut self, usage: &mut Usage) {
        if self.broken || self.state != Top::Done {
            return;
        }
        usage.observe_event(&EventView {
            top: event::read_top(self.usage.as_deref(), self.model.as_deref()),
            ..EventView::default()
        });
    }
}

enum Mode {
    /// Not metered: bytes pass through.
    Plain,
    /// A JSON answer: its usage is read as it passes.
    Json(Box<JsonUsage>),
    /// An SSE stream, split into events as it passes.
    Sse {
        splitter: SseSplitter,
        drop_usage_chunk: bool,
    },
}

/// The state of one relayed answer.
struct Relay {
    inner: StreamingBody,
    mode: Mode,
    usage: Usage,
    sidecar: Arc<Sidecar>,
    /// The egress record, completed once by [`Relay::finish`].
    flight: Option<InFlight>,
    status: u16,
    cost: Option<CostDraft>,
}

/// How a relayed answer ended.
enum End {
    /// Read to its end.
    Whole,
    /// The upstream failed mid-answer.
    Failed,
    /// The relay stopped reading (the client left and the rest did not come
    /// in time, or the sidecar stopped).
    Cut(&'static str),
}

impl Relay {
    /// Meters one event; returns whether it is forwarded.
    fn on_event(usage: &mut Usage, raw: &[u8], drop_usage_chunk: bool) -> bool {
        let Some(data) = event_data(raw) else {
            return true;
        };
        let Ok(e) = event::read(&data) else {
            return true;
        };
        usage.observe_event(&e);
        !(drop_usage_chunk && e.is_usage_only_chunk())
    }

    /// Takes one upstream data frame; returns what goes to the client.
    fn on_data(&mut self, data: Bytes) -> Bytes {
        match &mut self.mode {
            Mode::Plain => data,
            Mode::Json(scan) => {
                scan.push(&data);
                data
            }
            Mode::Sse {
                splitter,
                drop_usage_chunk: false,
            } => {
                splitter.push(&data);
                while let Some(ev) = splitter.next_event() {
                    Self::on_event(&mut self.usage, &ev, false);
                }
                data
            }
            Mode::Sse {
                splitter,
                drop_usage_chunk: true,
            } => {
                splitter.push(&data);
                let mut out = BytesMut::new();
                while let Some(ev) = splitter.next_event() {
                    if Self::on_event(&mut self.usage, &ev, true) {
                        out.extend_from_slice(&ev);
                    }
                }
                out.freeze()
            }
        }
    }

    /// The upstream body ended; returns what is still owed to the client.
    fn on_end(&mut self) -> Bytes {
        match &mut self.mode {
            Mode::Plain => Bytes::new(),
            Mode::Json(scan) => {
                scan.finish(&mut self.usage);
                Bytes::new()
            }
            Mode::Sse {
                splitter,
                drop_usage_chunk,
            } => {
                let filtering = *drop_usage_chunk;
                match splitter.finish() {
                    Some(rest) => {
                        let keep = Self::on_event(&mut self.usage, &rest, filtering);
                        if filtering && keep {
                            rest
                        } else {
                            Bytes::new()
                        }
                    }
                    None => Bytes::new(),
                }
            }
        }
    }

    /// Completes the egress record and writes the cost event (once). A
    /// metered call whose usage did not arrive whole (the answer was cut or
    /// failed, carried none, or could not be read) is recorded as unmetered,
    /// with the tokens that were seen.
    fn finish(&mut self, end: End) {
        let Some(flight) = self.flight.take() else {
            return;
        };
        let reported = self.usage.input.is_some() || self.usage.output.is_some();
        let metering = self.cost.as_ref().map(|c| {
            if matches!(end, End::Whole) && reported && c.readable {
                Metering::Metered
            } else {
                Metering::Unmetered
            }
        });
        let kind = match end {
            End::Whole => EgressOutcome::Completed,
            End::Failed => EgressOutcome::UpstreamFailed,
            End::Cut(_) => EgressOutcome::Aborted,
        };
        // Journalled once the last frame is written to the agent (an answer
        // read whole in one go otherwise waited for this write).
        flight.complete_after_answer(
            Outcome::new(kind)
                .status(Some(self.status))
                .bytes_in(self.inner.bytes_read() as u64)
                .metering(metering),
        );
        let Some(cost) = self.cost.take() else { return };
        let unmetered = metering == Some(Metering::Unmetered);
        let unmetered_reason = unmetered.then(|| {
            let why = match end {
                End::Whole if !cost.readable => "the answer was content-encoded",
                End::Whole => "the provider reported no usage",
                End::Failed => "the answer failed before its usage",
                End::Cut(why) => why,
            };
            tracing::warn!(
                input = self.usage.input.unwrap_or(0),
                output = self.usage.output.unwrap_or(0),
                "model relay: a call is recorded as unmetered ({why}), with the tokens seen"
            );
            why.to_owned()
        });
        let input = self.usage.input.unwrap_or(0);
        let output = self.usage.output.unwrap_or(0);
        let cost_microusd = (cost.price_in.is_some() || cost.price_out.is_some())
            .then(|| cost_of(input, output, cost.price_in, cost.price_out));
        let model = self
            .usage
            .model
            .take()
            .or(cost.model)
            .unwrap_or_else(|| "unknown".into());
        let record = CostRecord {
            at: now_ms(),
            provider: provider_name(cost.provider).into(),
            model,
            input_tokens: input,
            output_tokens: output,
            cost_microusd,
            unmetered,
            unmetered_reason,
        };
        // A provider's hostile numbers (2^64-1 tokens) are recorded as
        // unmetered, never as a count or a cost.
        if let Some(why) = record.implausible() {
            tracing::warn!("model relay: a call is recorded as unmetered ({why})");
        }
        // Kept, never shed: the run's bill.
        let _ = self.sidecar.keep.vital(RunEvent::Cost(record.bounded()));
    }

    /// Reads (and meters) the rest of the answer; `Some` if it failed.
    async fn read_rest(&mut self) -> Option<EgressError> {
        loop {
            match self.inner.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let _ = self.on_data(data);
                    }
                }
                Some(Err(e)) => return Some(e),
                None => {
                    let _ = self.on_end();
                    return None;
                }
            }
        }
    }

    /// The client went away before the end: read the rest for metering,
    /// until it ends, [`ABANDONED_STREAM_DEADLINE`] passes, or the sidecar
    /// stops (then what was seen is recorded as unmetered).
    async fn drain(mut self) {
        let stop = self.sidecar.egress.stop_requested();
        let read = tokio::time::timeout(ABANDONED_STREAM_DEADLINE, self.read_rest());
        let ended = tokio::select! {
            r = read => Some(r),
            _ = stop => None,
        };
        match ended {
            Some(Ok(None)) => self.finish(End::Whole),
            Some(Ok(Some(_))) => self.finish(End::Failed),
            Some(Err(_)) => self.finish(End::Cut(
                "the stream abandoned by the client did not end in time",
            )),
            None => self.finish(End::Cut("the sidecar stopped before the answer ended")),
        }
    }
}

/// The body handed to the agent: upstream frames, metered as they pass.
struct RelayBody {
    relay: Option<Relay>,
    ended: bool,
    /// Resolves when the sidecar stops: a body still being read then ends,
    /// recorded with what was seen (its client is gone with the sandbox).
    stop: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = EgressError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, EgressError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let Some(relay) = this.relay.as_mut() else {
            return Poll::Ready(None);
        };
        if this.stop.as_mut().poll(cx).is_ready() {
            relay.finish(End::Cut("the sidecar stopped before the answer ended"));
            this.ended = true;
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut relay.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let out = relay.on_data(data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(Some(Err(e))) => {
                    relay.finish(End::Failed);
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    let rest = relay.on_end();
                    relay.finish(End::Whole);
                    this.ended = true;
                    return Poll::Ready((!rest.is_empty()).then(|| Ok(Frame::data(rest))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        match &self.relay {
            Some(r)
                if !matches!(
                    r.mode,
                    Mode::Sse {
                        drop_usage_chunk: true,
                        ..
                    }
                ) =>
            {
                r.inner.size_hint()
            }
            _ => SizeHint::default(),
        }
    }
}

/// A streamed answer whose first data frame is written to the agent on its
/// own. hyper writes what a body gives only once the body has nothing more
/// ready, so when the provider's head and several events arrive in one read
/// the first event would otherwise wait for the metering of every event
/// behind it: the time to the first token is the provider's, not the
/// relay's. After the first data frame the body says once that it has
/// nothing ready (and wakes its task at once), which makes hyper write;
/// everything after that is written as it comes. One write more per
/// streamed answer.
struct FlushFirst<B> {
    inner: B,
    first: FirstFrame,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FirstFrame {
    /// No data frame has gone out yet.
    Awaiting,
    /// The first data frame went out; the next poll lets hyper write it.
    Given,
    /// Written: frames pass as they come.
    Written,
}

impl<B> FlushFirst<B> {
    fn new(inner: B) -> Self {
        FlushFirst {
            inner,
            first: FirstFrame::Awaiting,
        }
    }
}

impl<B: Body + Unpin> Body for FlushFirst<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        if this.first == FirstFrame::Given {
            this.first = FirstFrame::Written;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if this.first == FirstFrame::Awaiting
            && matches!(&polled, Poll::Ready(Some(Ok(frame))) if frame.is_data())
        {
            this.first = FirstFrame::Given;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RelayBody {
    fn drop(&mut self) {
        let Some(mut relay) = self.relay.take() else {
            return;
        };
        if relay.flight.is_none() {
            return; // already recorded
        }
        match tokio::runtime::Handle::try_current() {
            // A metered answer is read to its end in the background, so an
            // agent cannot skip its cost by hanging up. The drain's record
            // is in flight meanwhile: a stopping sidecar waits for it.
            Ok(h) if relay.cost.is_some() => {
                h.spawn(relay.drain());
            }
            _ => relay.finish(End::Cut("the client closed the stream early")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body whose frames are all ready at once (as when the provider's
    /// head and events arrive in one read).
    struct AllReady(std::collections::VecDeque<Frame<Bytes>>);

    impl Body for AllReady {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(Ok))
        }
    }

    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// What a body gives, poll by poll: `Some(data)` for a data frame,
    /// `None` for the end, and `Pending` with the wakes seen by then.
    fn polls<B: Body<Data = Bytes> + Unpin>(mut body: B, n: usize) -> Vec<String>
    where
        B::Error: std::fmt::Debug,
    {
        let wakes = Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        (0..n)
            .map(|_| match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Pending => format!(
                    "pending, woken {}",
                    wakes.0.load(std::sync::atomic::Ordering::SeqCst)
                ),
                Poll::Ready(None) => "end".to_owned(),
                Poll::Ready(Some(f)) => match f.unwrap().into_data() {
                    Ok(d) => String::from_utf8_lossy(&d).into_owned(),
                    Err(_) => "not data".to_owned(),
                },
            })
            .collect()
    }

    #[test]
    fn the_first_event_is_written_before_the_rest_are_read() {
        let frames = |texts: &[&str]| {
            AllReady(
                texts
                    .iter()
                    .map(|t| Frame::data(Bytes::copy_from_slice(t.as_bytes())))
                    .collect(),
            )
        };
        // Everything ready at once: after the first event the body has
        // nothing ready, once, and its task is woken to go on at once.
        assert_eq!(
            polls(FlushFirst::new(frames(&["a", "b", "c"])), 6),
            ["a", "pending, woken 1", "b", "c", "end", "end"]
        );
        // A lone event, then the end.
        assert_eq!(
            polls(FlushFirst::new(frames(&["a"])), 3),
            ["a", "pending, woken 1", "end"]
        );
        // Without the wrapper, hyper would get every ready frame in a row.
        assert_eq!(polls(frames(&["a", "b"]), 3), ["a", "b", "end"]);
        // A frame that is not data (trailers) does not count as the first event.
        let mut trailers = frames(&["a", "b"]);
        trailers
            .0
            .push_front(Frame::trailers(http::HeaderMap::new()));
        assert_eq!(
            polls(FlushFirst::new(trailers), 5),
            ["not data", "a", "pending, woken 1", "b", "end"]
        );
    }

    fn split_all(chunks: &[&[u8]]) -> (Vec<Bytes>, Option<Bytes>) {
        let mut s = SseSplitter::default();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c);
            while let Some(e) = s.next_event() {
                out.push(e);
            }
        }
        (out, s.finish())
    }

    const STREAM: &str = "event: message_start\ndata: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: comment\r\rdata: x\ndata: y\n\n";

    #[test]
    fn splitter_gives_the_same_events_at_every_chunk_edge() {
        let whole = split_all(&[STREAM.as_bytes()]);
        assert_eq!(whole.0.len(), 4, "{:?}", whole.0);
        assert_eq!(whole.1, None);
        let joined: Vec<u8> = whole.0.iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(joined, STREAM.as_bytes(), "raw bytes are kept unchanged");
        let b = STREAM.as_bytes();
        for i in 0..b.len() {
            for j in i..b.len() {
                let parts = split_all(&[&b[..i], &b[i..j], &b[j..]]);
                assert_eq!(parts.0, whole.0, "split at {i},{j}");
            }
        }
        // One byte at a time.
        let bytes: Vec<&[u8]> = b.chunks(1).collect();
        assert_eq!(split_all(&bytes).0, whole.0);
    }

    #[test]
    fn splitter_keeps_an_unterminated_tail() {
        let (events, rest) = split_all(&[b"data: 1\n\ndata: 2\n"]);
        assert_eq!(events.len(), 1);
        assert_eq!(rest.as_deref(), Some(&b"data: 2\n"[..]));
        assert_eq!(event_data(b"data: 2\n").as_deref(), Some("2"));
    }

    #[test]
    fn event_data_joins_lines_and_ignores_other_fields() {
        assert_eq!(
            event_data(b"event: x\ndata: a\ndata:b\nid: 3\n\n").as_deref(),
            Some("a\nb")
        );
        assert_eq!(event_data(b": only a comment\n\n"), None);
        assert_eq!(event_data(b"data\n\n").as_deref(), Some(""));
        assert_eq!(
            event_data(b"data: a\r\ndata: b\rdata: c\n\n").as_deref(),
            Some("a\nb\nc")
        );
        // One line is not copied; bytes that are not UTF-8 read as U+FFFD.
        assert!(matches!(
            event_data(b"data: x\n\n"),
            Some(Cow::Borrowed("x"))
        ));
        assert_eq!(
            event_data(b"data: a\xff\ndata: b\n\n").as_deref(),
            Some("a\u{fffd}\nb")
        );
    }

    /// What the meter takes of `v`, sent as one event's data.
    fn observe(u: &mut Usage, v: &Value) {
        u.observe_event(&event::read(&v.to_string()).unwrap());
    }

    /// The meter as it read a `serde_json::Value` before events were read
    /// in place: the reference the in-place reading must agree with.
    fn observe_value(u: &mut Usage, v: &Value) {
        for usage in [
            v.get("usage"),
            v.pointer("/response/usage"),
            v.pointer("/message/usage"),
        ]
        .into_iter()
        .flatten()
        {
            if usage.is_object() {
                let n = |k: &str| usage.get(k).and_then(Value::as_u64);
                u.merge_usage(&Counts {
                    prompt_tokens: n("prompt_tokens"),
                    input_tokens: n("input_tokens"),
                    completion_tokens: n("completion_tokens"),
                    output_tokens: n("output_tokens"),
                    cache_creation_input_tokens: n("cache_creation_input_tokens"),
                    cache_read_input_tokens: n("cache_read_input_tokens"),
                });
            }
        }
        for model in [
            v.get("model"),
            v.pointer("/response/model"),
            v.pointer("/message/model"),
        ]
        .into_iter()
        .flatten()
        {
            if let Some(m) = model.as_str().filter(|m| !m.is_empty()) {
                u.model = Some(m.to_owned());
            }
        }
    }

    #[test]
    fn usage_from_every_format() {
        let mut u = Usage::default();
        observe(
            &mut u,
            &json!({"model": "gpt-x", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}),
        );
        assert_eq!(
            (u.input, u.output, u.model.as_deref()),
            (Some(11), Some(7), Some("gpt-x"))
        );

        let mut u = Usage::default();
        observe(
            &mut u,
            &json!({"type": "response.created", "response": {"model": "gpt-r", "usage": null}}),
        );
        observe(
            &mut u,
            &json!({"type": "response.completed", "response": {"model": "gpt-r", "usage": {"input_tokens": 5, "output_tokens": 9}}}),
        );
        assert_eq!(
            (u.input, u.output, u.model.as_deref()),
            (Some(5), Some(9), Some("gpt-r"))
        );

        let mut u = Usage::default();
        observe(
            &mut u,
            &json!({"type": "message_start", "message": {"model": "claude-x", "usage": {"input_tokens": 25, "output_tokens": 1, "cache_read_input_tokens": 3}}}),
        );
        observe(
            &mut u,
            &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}),
        );
        observe(
            &mut u,
            &json!({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 15}}),
        );
        assert_eq!(
            (u.input, u.output, u.model.as_deref()),
            (Some(28), Some(15), Some("claude-x"))
        );

        // Chunks without usage change nothing.
        let before = u.clone();
        observe(
            &mut u,
            &json!({"type": "content_block_delta", "delta": {"text": "hi"}}),
        );
        observe(&mut u, &json!({"usage": "not an object", "model": 3}));
        assert_eq!(u, before);
    }

    fn scan(chunks: &[&[u8]]) -> Usage {
        let mut j = JsonUsage::default();
        for c in chunks {
            j.push(c);
        }
        let mut u = Usage::default();
        j.finish(&mut u);
        u
    }

    #[test]
    fn json_usage_is_read_as_it_streams_at_every_chunk_edge() {
        let doc = br#"{"object":"list","data":[{"embedding":"a\"b}{[","index":0},[1,2,{"usage":{"prompt_tokens":999}}]],"usage" : {"prompt_tokens": 12, "total_tokens": 12},"model":"emb-\"x","n":-1.5e3,"t":true}"#;
        let whole = scan(&[doc]);
        assert_eq!(
            (whole.input, whole.output, whole.model.as_deref()),
            (Some(12), None, Some("emb-\"x"))
        );
        for i in 0..doc.len() {
            for j in i..doc.len() {
                assert_eq!(scan(&[&doc[..i], &doc[i..j], &doc[j..]]), whole, "{i},{j}");
            }
        }
        // The same as parsing the whole answer, for the providers' formats.
        for v in [
            json!({"model": "gpt-x", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7}}),
            json!({"id": "msg", "model": "claude-x", "usage": {"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 2}}),
            json!({"object": "response", "model": "gpt-r", "output": [{"content": [{"text": "usage"}]}], "usage": {"input_tokens": 1, "output_tokens": 2}}),
        ] {
            let mut parsed = Usage::default();
            observe_value(&mut parsed, &v);
            let pretty = serde_json::to_vec_pretty(&v).unwrap();
            assert_eq!(scan(&[&pretty]), parsed, "{v}");
        }
    }

    #[test]
    fn json_usage_ignores_what_is_not_a_whole_object() {
        for bad in [
            &b"[{\"usage\":{\"prompt_tokens\":1}}]"[..],
            b"{\"usage\":{\"prompt_tokens\":1}",
            b"\"usage\"",
            b"{\"usage\" {\"prompt_tokens\":1}}",
            b"\xff\xfe{",
            b"",
        ] {
            assert_eq!(
                scan(&[bad]),
                Usage::default(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A huge usage value is dropped rather than kept.
        let mut big = b"{\"usage\":{\"pad\":\"".to_vec();
        big.extend(std::iter::repeat_n(b'x', MAX_USAGE_VALUE + 10));
        big.extend(b"\",\"prompt_tokens\":3}}");
        assert_eq!(scan(&[&big]).input, None);
    }

    #[test]
    fn only_the_usage_only_chunk_is_dropped() {
        let only = |data: &str| event::read(data).unwrap().is_usage_only_chunk();
        assert!(only(r#"{"choices": [], "usage": {"prompt_tokens": 1}}"#));
        assert!(!only(
            r#"{"choices": [{"delta": {}}], "usage": {"prompt_tokens": 1}}"#
        ));
        assert!(!only(r#"{"choices": [], "usage": null}"#));
        assert!(!only(r#"{"choices": []}"#));
    }

    /// An event's data read in place meters exactly what the same data
    /// parsed into a `Value` does, event after event (the model and counts
    /// carry over), for the providers' formats and for hostile ones:
    /// repeated keys, values of the wrong type, escapes, nesting.
    #[test]
    fn events_read_in_place_meter_as_a_value_would() {
        let streams: &[&[&str]] = &[
            &[
                r#"{"id":"c","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
                r#"{"id":"c","model":"gpt-x","choices":[{"index":0,"delta":{"content":"usage"}}],"usage":null}"#,
                r#"{"id":"c","model":"gpt-x","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}"#,
            ],
            &[
                r#"{"type":"message_start","message":{"id":"m","model":"claude-x","usage":{"input_tokens":25,"output_tokens":1,"cache_creation_input_tokens":4,"cache_read_input_tokens":3}}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"{\"usage\":1}"}}"#,
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}"#,
            ],
            &[
                r#"{"type":"response.created","response":{"model":"gpt-r","usage":null}}"#,
                r#"{"type":"response.completed","response":{"model":"gpt-r","usage":{"input_tokens":5,"output_tokens":9}},"model":""}"#,
            ],
            &[
                r#"{"usage":{"prompt_tokens":1},"usage":{"completion_tokens":2},"model":"a","model":"b"}"#,
                r#"{"usage":"no","model":3,"response":[{"usage":{"input_tokens":9}}],"message":"x"}"#,
                r#"{"usage":{"prompt_tokens":-4,"completion_tokens":2.0,"output_tokens":"7","input_tokens":18446744073709551615},"model":"mé"}"#,
                r#"{"message":{"usage":{"input_tokens":1},"usage":null,"model":"x","model":""},"response":{"model":"r"},"model":"t"}"#,
                r#"[{"usage":{"prompt_tokens":1}}]"#,
                r#"{"choices":{},"usage":{"prompt_tokens":6,"prompt_tokens":{"n":1}}}"#,
                "42",
            ],
        ];
        for stream in streams {
            let (mut as_value, mut in_place) = (Usage::default(), Usage::default());
            for data in *stream {
                observe_value(&mut as_value, &serde_json::from_str::<Value>(data).unwrap());
                in_place.observe_event(&event::read(data).unwrap());
                assert_eq!(in_place, as_value, "after {data}");
            }
        }
    }

    #[test]
    fn chat_streams_are_asked_for_usage_once() {
        let chat = Endpoint::Metered {
            chat_stream_usage: true,
        };
        let p = prepare(
            chat,
            Bytes::from_static(br#"{"model":"m","stream":true,"messages":[]}"#),
        );
        assert!(p.drop_usage_chunk);
        assert_eq!(p.model.as_deref(), Some("m"));
        let v: Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);

        let p = prepare(
            chat,
            Bytes::from_static(
                br#"{"model":"m","stream":true,"stream_options":{"include_obfuscation":false}}"#,
            ),
        );
        let v: Value = serde_json::from_slice(&p.body).unwrap();
        assert!(p.drop_usage_chunk);
        assert_eq!(
            v["stream_options"],
            json!({"include_obfuscation": false, "include_usage": true})
        );

        let asked = Bytes::from_static(
            br#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#,
        );
        let p = prepare(chat, asked.clone());
        assert!(!p.drop_usage_chunk);
        assert_eq!(p.body, asked, "the client's own request is sent unchanged");

        let not_stream = Bytes::from_static(br#"{"model":"m"}"#);
        assert_eq!(prepare(chat, not_stream.clone()).body, not_stream);
        let other = Endpoint::Metered {
            chat_stream_usage: false,
        };
        let msgs = Bytes::from_static(br#"{"model":"c","stream":true}"#);
        assert_eq!(
            prepare(other, msgs.clone()),
            Prepared {
                body: msgs,
                model: Some("c".into()),
                drop_usage_chunk: false
            }
        );
        let junk = Bytes::from_static(b"\xff not json");
        assert_eq!(prepare(chat, junk.clone()).body, junk);
    }

    /// The lean [`prepare`] answers as [`prepare_by_value`] does (the same
    /// model and decision, a body that parses to the same JSON), for every
    /// shape of body an agent can send.
    #[test]
    fn the_lean_prepare_answers_as_the_parsed_tree_does() {
        let bodies: &[&[u8]] = &[
            br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            br#"  {"stream":true}"#,
            br#"{"stream":true,"model":7}"#,
            br#"{ "stream" : true , "model" : "m" } "#,
            b"\n\t{\r\n\"stream\":true}\n",
            br#"{"model":"m","stream":false}"#,
            br#"{"model":"m","stream":"true"}"#,
            br#"{"model":"m"}"#,
            br#"{}"#,
            br#"{ }"#,
            br#"{"mod\u0065l":"esc","str\u0065am":true}"#,
            br#"{"model":"a","model":"b","stream":true}"#,
            br#"{"stream":false,"stream":true}"#,
            br#"{"stream":true,"stream_options":{"include_usage":false}}"#,
            br#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            br#"{"stream":true,"stream_options":{"include_obfuscation":false}}"#,
            br#"{"stream":true,"stream_options":null}"#,
            br#"{"stream":true,"stream_options":[1]}"#,
            br#"{"stream":true,"tools":[{"stream_options":{"x":1},"model":"inner"}]}"#,
            br#"{"stream":true,"model":"m"} trailing"#,
            br#"{"stream":true,"model":"m""#,
            br#"[{"stream":true}]"#,
            br#"["m",false]"#,
            br#"["m",true]"#,
            br#" ["m",true,null]"#,
            br#""stream""#,
            b"\xff not json",
            b"",
            br#"{"stream":true,"messages":"caf\u00e9 \ud83d\ude00"}"#,
            "{\"stream\":true,\"model\":\"\u{e9}\u{1F600}\"}".as_bytes(),
        ];
        for chat_stream_usage in [true, false] {
            let endpoint = Endpoint::Metered { chat_stream_usage };
            for raw in bodies {
                let body = Bytes::copy_from_slice(raw);
                let lean = prepare(endpoint, body.clone());
                let tree = prepare_by_value(endpoint, body.clone());
                let what = String::from_utf8_lossy(raw);
                assert_eq!(lean.model, tree.model, "{what}");
                assert_eq!(lean.drop_usage_chunk, tree.drop_usage_chunk, "{what}");
                match serde_json::from_slice::<Value>(&tree.body) {
                    Ok(want) => assert_eq!(
                        serde_json::from_slice::<Value>(&lean.body).ok(),
                        Some(want),
                        "{what}"
                    ),
                    Err(_) => assert_eq!(lean.body, tree.body, "{what}"),
                }
                if !lean.drop_usage_chunk {
                    assert_eq!(lean.body, body, "{what}: sent as the agent wrote it");
                }
            }
        }
    }

    #[test]
    fn routes_and_upstream_urls() {
        let m = |provider, base: &str| Model {
            provider,
            base_url: base.into(),
            price_in_per_mtok_usd: None,
            price_out_per_mtok_usd: None,
            provider_tools: vec![],
            provider_fetch_uris: vec![],
        };
        let o = Upstream::new(&m(Provider::Openai, "https://api.openai.com/v1/"));
        assert_eq!(
            o.url_for("/v1/chat/completions", None),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            o.url_for("/v1/models", Some("limit=2")),
            "https://api.openai.com/v1/models?limit=2"
        );
        let a = Upstream::new(&m(Provider::Anthropic, "https://api.anthropic.com"));
        assert_eq!(
            a.url_for("/v1/messages", Some("beta=true")),
            "https://api.anthropic.com/v1/messages?beta=true"
        );
        let a2 = Upstream::new(&m(Provider::Anthropic, "https://api.anthropic.com/v1"));
        assert_eq!(
            a2.url_for("/v1/messages", None),
            "https://api.anthropic.com/v1/messages"
        );

        let post = Method::POST;
        assert!(matches!(
            route(Provider::Openai, &post, "/v1/chat/completions"),
            Some(Endpoint::Metered {
                chat_stream_usage: true
            })
        ));
        assert!(matches!(
            route(Provider::Openai, &post, "/v1/responses"),
            Some(Endpoint::Metered {
                chat_stream_usage: false
            })
        ));
        assert_eq!(
            route(Provider::Openai, &Method::GET, "/v1/models"),
            Some(Endpoint::Plain)
        );
        assert_eq!(
            route(Provider::Openai, &Method::GET, "/v1/models/gpt-4o"),
            Some(Endpoint::Plain)
        );
        assert!(matches!(
            route(Provider::Anthropic, &post, "/v1/messages"),
            Some(Endpoint::Metered { .. })
        ));
        assert_eq!(
            route(Provider::Anthropic, &post, "/v1/messages/count_tokens"),
            Some(Endpoint::Plain)
        );
        for (p, method, path) in [
            (Provider::Openai, &post, "/v1/messages"),
            (Provider::Anthropic, &post, "/v1/chat/completions"),
            (Provider::Openai, &post, "/v1/files"),
            (Provider::Openai, &Method::DELETE, "/v1/models/x"),
            (Provider::Openai, &Method::GET, "/v1/models/../../admin"),
            (Provider::Openai, &Method::GET, "/v1/models/"),
            (Provider::Openai, &post, "/chat/completions"),
            (Provider::Openai, &post, "/v1/chat/completions/"),
        ] {
            assert_eq!(route(p, method, path), None, "{method} {path}");
        }
    }

    #[test]
    fn the_agents_keys_never_go_upstream() {
        let mut agent = HeaderMap::new();
        agent.insert(
            "authorization",
            HeaderValue::from_static("Bearer sidecar-token-or-placeholder"),
        );
        agent.insert("x-api-key", HeaderValue::from_static("placeholder"));
        agent.insert("cookie", HeaderValue::from_static("c=1"));
        agent.insert("x-airlock-sidecar-auth", HeaderValue::from_static("t"));
        agent.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        agent.insert("anthropic-beta", HeaderValue::from_static("tools-2024"));
        agent.insert("content-type", HeaderValue::from_static("application/json"));
        agent.insert("accept-encoding", HeaderValue::from_static("gzip"));
        let key = SecretString::from("sk-real".to_owned());
        let h = upstream_headers(&agent, Provider::Anthropic, &key).unwrap();
        assert_eq!(h["x-api-key"], "sk-real");
        assert!(h["x-api-key"].is_sensitive());
        assert!(
            !h.contains_key("authorization")
                && !h.contains_key("cookie")
                && !h.contains_key("x-airlock-sidecar-auth")
        );
        assert_eq!(h["anthropic-version"], "2023-06-01");
        assert_eq!(h["anthropic-beta"], "tools-2024");
        assert_eq!(h["accept-encoding"], "identity");
        let h = upstream_headers(&agent, Provider::Openai, &key).unwrap();
        assert_eq!(h["authorization"], "Bearer sk-real");
        assert!(!h.contains_key("x-api-key"));
        let bad = SecretString::from("sk\r\nx-evil: 1".to_owned());
        assert!(upstream_headers(&agent, Provider::Openai, &bad).is_err());
    }

    #[test]
    fn the_model_key_is_held_for_a_minute_and_forgotten_when_refused() {
        let held = HeldKey::default();
        let t0 = Instant::now();
        let secret = |k: Option<SecretString>| k.map(|k| k.expose_secret().to_owned());
        assert_eq!(
            secret(held.fresh(t0)),
            None,
            "nothing is held before a fetch"
        );
        let key = SecretString::from("sk-held".to_owned());
        held.keep(&key, t0);
        let almost = t0 + MODEL_KEY_HOLD - Duration::from_millis(1);
        assert_eq!(secret(held.fresh(almost)).as_deref(), Some("sk-held"));
        assert_eq!(
            secret(held.fresh(t0 + MODEL_KEY_HOLD)),
            None,
            "held too long"
        );
        assert_eq!(
            secret(held.fresh(t0)),
            None,
            "a stale key is dropped, not kept"
        );
        held.keep(&key, t0);
        // A refusal of another key (a call that began before a newer fetch)
        // leaves the held one; a refusal of the held one forgets it.
        held.forget(&SecretString::from("sk-older".to_owned()));
        assert_eq!(secret(held.fresh(t0)).as_deref(), Some("sk-held"));
        held.forget(&key);
        assert_eq!(secret(held.fresh(t0)), None);
    }

    #[test]
    fn response_headers_are_reduced_to_the_safe_list() {
        let mut up = HeaderMap::new();
        for (k, v) in [
            ("content-type", "text/event-stream"),
            ("x-request-id", "req_1"),
            ("request-id", "req_2"),
            ("x-ratelimit-remaining-tokens", "99"),
            ("anthropic-ratelimit-requests-limit", "5"),
            ("retry-after", "1"),
            ("set-cookie", "s=1"),
            ("www-authenticate", "Bearer"),
            ("authorization", "Bearer leak"),
            ("x-api-key", "leak"),
            ("openai-organization", "org"),
            ("server", "x"),
        ] {
            up.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let h = safe_response_headers(&up);
        let mut names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "anthropic-ratelimit-requests-limit",
                "content-type",
                "request-id",
                "retry-after",
                "x-ratelimit-remaining-tokens",
                "x-request-id"
            ]
        );
    }
}

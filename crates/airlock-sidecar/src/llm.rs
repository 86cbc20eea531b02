//! `/llm/…`: the model relay.
//!
//! The agent's SDK talks to the sidecar as if it were the provider; the
//! relay swaps the agent's placeholder key for the real one (fetched from the
//! platform for each call and forgotten after it), sends the call through the
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

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use airlock_egress::{
    AuthorizedUris, CallRules, EgressCode, EgressError, OutboundRequest, StreamingBody,
};
use airlock_platform_api::wire::{CostRecord, EgressRecord, RunEvent};
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

use crate::config::{MODEL_CREDENTIAL, Model, Provider};
use crate::state::{Sidecar, loggable_url, now_ms};

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

/// Most bytes of a JSON answer kept for metering (the answer itself is
/// forwarded whatever its size, up to the response cap).
const MAX_METERED_JSON: usize = 16 * 1024 * 1024;

/// A client that went away mid-stream: the rest is read for metering for at most this long.
const DRAIN_DEADLINE: Duration = Duration::from_secs(600);

struct Upstream {
    provider: Provider,
    /// `base_url` without a trailing `/` (and, for anthropic, without `/v1`).
    base: String,
    /// One literal pattern: `base/**`.
    authorized: AuthorizedUris,
    price_in: Option<f64>,
    price_out: Option<f64>,
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

/// Reads `model` and, for an OpenAI chat stream that did not ask for usage,
/// asks for it. A body that is not a JSON object is sent as it is.
fn prepare(endpoint: Endpoint, body: Bytes) -> Prepared {
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&body) else {
        return Prepared {
            body,
            model: None,
            drop_usage_chunk: false,
        };
    };
    let model = obj.get("model").and_then(Value::as_str).map(str::to_owned);
    let streaming = obj.get("stream").and_then(Value::as_bool) == Some(true);
    if !(streaming
        && endpoint
            == (Endpoint::Metered {
                chat_stream_usage: true,
            }))
    {
        return Prepared {
            body,
            model,
            drop_usage_chunk: false,
        };
    }
    let asked = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true);
    if asked {
        return Prepared {
            body,
            model,
            drop_usage_chunk: false,
        };
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
        Err(_) => Prepared {
            body,
            model,
            drop_usage_chunk: false,
        },
    }
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
}

pub fn router(sidecar: Arc<Sidecar>) -> Router {
    let upstream = sidecar.model.as_ref().map(Upstream::new);
    Router::new()
        .fallback(relay)
        .with_state(Arc::new(Llm { sidecar, upstream }))
}

/// The model key, fetched from the platform for this call only.
async fn model_key(sidecar: &Sidecar) -> Result<SecretString, Box<Response>> {
    match sidecar.platform.credential(MODEL_CREDENTIAL).await {
        Ok(c) => match c.fields.get("api_key").filter(|k| !k.is_empty()) {
            Some(k) => Ok(SecretString::from(k.clone())),
            None => Err(Box::new(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_configured",
                "model_credential_missing",
                "the model credential has no api_key field",
            ))),
        },
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
    let started = Instant::now();
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
    let limit = llm.sidecar.limits.max_request_bytes;
    let body = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "payload_too_large",
                format!("request body exceeds the {limit}-byte limit"),
            );
        }
    };
    if body.len() > limit {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "payload_too_large",
            format!("request body exceeds the {limit}-byte limit"),
        );
    }
    let prepared = match endpoint {
        Endpoint::Metered { .. } => prepare(endpoint, body),
        Endpoint::Plain => Prepared {
            body,
            model: None,
            drop_usage_chunk: false,
        },
    };
    let url = up.url_for(path, parts.uri.query());
    let key = match model_key(&llm.sidecar).await {
        Ok(k) => k,
        Err(r) => return *r,
    };
    let headers = match upstream_headers(&parts.headers, up.provider, &key) {
        Ok(h) => h,
        Err(r) => return *r,
    };
    drop(key);
    let bytes_out = prepared.body.len() as u64;
    let out = OutboundRequest {
        method: parts.method.clone(),
        url: url.clone(),
        headers,
        body: prepared.body,
        credential_headers: vec![header::AUTHORIZATION, HeaderName::from_static("x-api-key")],
    };
    let rules = CallRules {
        authorized: &up.authorized,
        allow_all_uris: false,
        credentialed: true,
    };
    let mut record = EgressRecord {
        at: now_ms(),
        source: "llm".into(),
        integration: Some(MODEL_CREDENTIAL.into()),
        method: parts.method.to_string(),
        url: loggable_url(&url),
        host: url::Url::parse(&url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_else(|| "-".into()),
        decision: "allowed".into(),
        code: None,
        status: None,
        bytes_out,
        bytes_in: 0,
        duration_ms: None,
    };
    let resp = match llm.sidecar.client.send_streaming(out, &rules).await {
        Ok(r) => r,
        Err(e) => {
            if e.code != EgressCode::UpstreamFailed {
                record.decision = "refused".into();
                let kind = if e.code.is_ssrf() { "SSRF" } else { "policy" };
                tracing::warn!(
                    host = e.host.as_deref().unwrap_or("-"),
                    code = e.code.as_str(),
                    "Target refused ({kind})"
                );
            }
            record.code = Some(e.code.as_str().into());
            record.duration_ms = Some(started.elapsed().as_millis() as u64);
            llm.sidecar.record_egress(record);
            return egress_error(&e);
        }
    };
    record.status = Some(resp.status.as_u16());
    if resp.status.is_redirection() {
        record.code = Some(EgressCode::UpstreamFailed.as_str().into());
        record.duration_ms = Some(started.elapsed().as_millis() as u64);
        llm.sidecar.record_egress(record);
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
                "model relay: the provider sent an encoded answer; it cannot be metered"
            );
        }
        Mode::Plain
    } else if content_type.starts_with("text/event-stream") {
        Mode::Sse {
            splitter: SseSplitter::default(),
            drop_usage_chunk: prepared.drop_usage_chunk,
        }
    } else {
        Mode::Json(BytesMut::new())
    };
    let cost = metered.then_some(CostDraft {
        provider: up.provider,
        model: prepared.model,
        price_in: up.price_in,
        price_out: up.price_out,
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
    let relay = Relay {
        inner: resp.body,
        mode,
        usage: Usage::default(),
        sidecar: llm.sidecar.clone(),
        record: Some(record),
        cost,
        started,
    };
    let body = RelayBody {
        relay: Some(relay),
        ended: false,
    };
    builder
        .body(axum::body::Body::new(body))
        .unwrap_or_else(|_| {
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
    fn merge_usage(&mut self, u: &Value) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64);
        if let Some(input) = n("prompt_tokens").or_else(|| n("input_tokens")) {
            let cache = n("cache_creation_input_tokens")
                .unwrap_or(0)
                .saturating_add(n("cache_read_input_tokens").unwrap_or(0));
            self.input = Some(input.saturating_add(cache));
        }
        if let Some(output) = n("completion_tokens").or_else(|| n("output_tokens")) {
            self.output = Some(output);
        }
    }

    /// One JSON answer or one SSE event's data.
    fn observe(&mut self, v: &Value) {
        for usage in [
            v.get("usage"),
            v.pointer("/response/usage"),
            v.pointer("/message/usage"),
        ]
        .into_iter()
        .flatten()
        {
            if usage.is_object() {
                self.merge_usage(usage);
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
                self.model = Some(m.to_owned());
            }
        }
    }
}

/// An OpenAI chunk that carries only the usage the relay asked for:
/// `choices` empty, `usage` an object.
fn is_usage_only_chunk(v: &Value) -> bool {
    v.get("choices")
        .and_then(Value::as_array)
        .is_some_and(|c| c.is_empty())
        && v.get("usage").is_some_and(Value::is_object)
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
            let i = rest.iter().position(|&c| c == b'\n' || c == b'\r')?;
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
fn event_data(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    let mut data: Option<String> = None;
    for line in text.split(['\n', '\r']) {
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_owned()),
            }
        }
    }
    data
}

enum Mode {
    /// Not metered: bytes pass through.
    Plain,
    /// A JSON answer: a copy is kept and parsed at the end.
    Json(BytesMut),
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
    record: Option<EgressRecord>,
    cost: Option<CostDraft>,
    started: Instant,
}

impl Relay {
    /// Meters one event; returns whether it is forwarded.
    fn on_event(usage: &mut Usage, raw: &[u8], drop_usage_chunk: bool) -> bool {
        let Some(data) = event_data(raw) else {
            return true;
        };
        let Ok(v) = serde_json::from_str::<Value>(&data) else {
            return true;
        };
        usage.observe(&v);
        !(drop_usage_chunk && is_usage_only_chunk(&v))
    }

    /// Takes one upstream data frame; returns what goes to the client.
    fn on_data(&mut self, data: Bytes) -> Bytes {
        match &mut self.mode {
            Mode::Plain => data,
            Mode::Json(buf) => {
                if buf.len() + data.len() <= MAX_METERED_JSON {
                    buf.extend_from_slice(&data);
                }
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
            Mode::Json(buf) => {
                if let Ok(v) = serde_json::from_slice::<Value>(buf) {
                    self.usage.observe(&v);
                }
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

    /// Writes the egress record and the cost event (once).
    fn finish(&mut self, failure: Option<&EgressError>) {
        let Some(mut record) = self.record.take() else {
            return;
        };
        record.bytes_in = self.inner.bytes_read() as u64;
        record.duration_ms = Some(self.started.elapsed().as_millis() as u64);
        if let Some(e) = failure {
            record.code = Some(e.code.as_str().into());
        }
        self.sidecar.record_egress(record);
        let Some(cost) = self.cost.take() else { return };
        if self.usage.input.is_none() && self.usage.output.is_none() {
            tracing::warn!(
                "model relay: the provider reported no usage for a call; metered as 0 tokens"
            );
        }
        let input = self.usage.input.unwrap_or(0);
        let output = self.usage.output.unwrap_or(0);
        let cost_microusd = (cost.price_in.is_some() || cost.price_out.is_some()).then(|| {
            // A price per million tokens in USD is a price per token in µUSD.
            let c = input as f64 * cost.price_in.unwrap_or(0.0)
                + output as f64 * cost.price_out.unwrap_or(0.0);
            c.round().max(0.0) as u64
        });
        let model = self
            .usage
            .model
            .take()
            .or(cost.model)
            .unwrap_or_else(|| "unknown".into());
        self.sidecar.events.send(RunEvent::Cost(CostRecord {
            at: now_ms(),
            provider: provider_name(cost.provider).into(),
            model,
            input_tokens: input,
            output_tokens: output,
            cost_microusd,
        }));
    }

    /// The client went away before the end: read the rest for metering.
    async fn drain(mut self) {
        let read_all = async {
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
        };
        let failure = match tokio::time::timeout(DRAIN_DEADLINE, read_all).await {
            Ok(f) => f,
            Err(_) => Some(EgressError::upstream(
                "-",
                "stream abandoned by the client did not end in time",
            )),
        };
        self.finish(failure.as_ref());
    }
}

/// The body handed to the agent: upstream frames, metered as they pass.
struct RelayBody {
    relay: Option<Relay>,
    ended: bool,
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
                    relay.finish(Some(&e));
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    let rest = relay.on_end();
                    relay.finish(None);
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

impl Drop for RelayBody {
    fn drop(&mut self) {
        let Some(relay) = self.relay.take() else {
            return;
        };
        if relay.record.is_none() {
            return; // already recorded
        }
        match tokio::runtime::Handle::try_current() {
            Ok(h) if relay.cost.is_some() => {
                h.spawn(relay.drain());
            }
            _ => {
                let mut relay = relay;
                let e = EgressError::upstream("-", "the client closed the stream early");
                relay.finish(Some(&e));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn usage_from_every_format() {
        let mut u = Usage::default();
        u.observe(&json!({"model": "gpt-x", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}));
        assert_eq!(
            (u.input, u.output, u.model.as_deref()),
            (Some(11), Some(7), Some("gpt-x"))
        );

        let mut u = Usage::default();
        u.observe(
            &json!({"type": "response.created", "response": {"model": "gpt-r", "usage": null}}),
        );
        u.observe(&json!({"type": "response.completed", "response": {"model": "gpt-r", "usage": {"input_tokens": 5, "output_tokens": 9}}}));
        assert_eq!(
            (u.input, u.output, u.model.as_deref()),
            (Some(5), Some(9), Some("gpt-r"))
        );

        let mut u = Usage::default();
        u.observe(&json!({"type": "message_start", "message": {"model": "claude-x", "usage": {"input_tokens": 25, "output_tokens": 1, "cache_read_input_tokens": 3}}}));
        u.observe(&json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}));
        u.observe(&json!({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 15}}));
        assert_eq!(
            (u.input, u.output, u.model.as_deref()),
            (Some(28), Some(15), Some("claude-x"))
        );

        // Chunks without usage change nothing.
        let before = u.clone();
        u.observe(&json!({"type": "content_block_delta", "delta": {"text": "hi"}}));
        u.observe(&json!({"usage": "not an object", "model": 3}));
        assert_eq!(u, before);
    }

    #[test]
    fn only_the_usage_only_chunk_is_dropped() {
        assert!(is_usage_only_chunk(
            &json!({"choices": [], "usage": {"prompt_tokens": 1}})
        ));
        assert!(!is_usage_only_chunk(
            &json!({"choices": [{"delta": {}}], "usage": {"prompt_tokens": 1}})
        ));
        assert!(!is_usage_only_chunk(&json!({"choices": [], "usage": null})));
        assert!(!is_usage_only_chunk(&json!({"choices": []})));
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

    #[test]
    fn routes_and_upstream_urls() {
        let m = |provider, base: &str| Model {
            provider,
            base_url: base.into(),
            price_in_per_mtok_usd: None,
            price_out_per_mtok_usd: None,
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

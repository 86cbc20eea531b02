//! What the agent sends to `/mcp`, parsed and validated without any I/O:
//! the JSON-RPC envelope pre-check, the tool arguments, placeholder
//! substitution, and the redaction of credential values from what goes back.
//!
//! Everything here is driven by the fuzz target `mcp_request`: no function
//! may panic on any input.

use base64::Engine;
use bytes::Bytes;
use http::Method;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value};

use airlock_platform_api::wire::CredentialFields;
use secrecy::ExposeSecret;
use secrecy::zeroize::Zeroizing;

use crate::config::Delivery;

/// Tool names that are not an integration's `api_call`.
pub const RUN_HISTORY: &str = "run_history";
pub const RECALL_MEMORY: &str = "recall_memory";
/// `{namespace}__api_call`.
pub const API_CALL_SUFFIX: &str = "__api_call";
/// Between a namespace and its tool's name.
pub const SEPARATOR: &str = "__";

/// The one reading of a tool name `{namespace}__{tool}`: split at its first
/// `__`. A namespace holds no `__` and ends with a letter or digit
/// (`airlock_platform_api::types::Namespace`), so this is the only split
/// whose left part can be a namespace: every tool name names at most one
/// integration and one of its tools (`rm___api_call` is `rm`'s `_api_call`,
/// never an `rm_`'s `api_call`). Routing looks the namespace up exactly.
pub fn split_tool_name(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
        .filter(|(ns, tool)| !ns.is_empty() && !tool.is_empty())
}

/// The namespace whose `api_call` `name` is, if it is one.
pub fn api_call_namespace(name: &str) -> Option<&str> {
    split_tool_name(name).and_then(|(ns, tool)| (tool == "api_call").then_some(ns))
}

/// Largest `limit` of `run_history` and `recall_memory`.
pub const MAX_LIMIT: u32 = 50;
const DEFAULT_LIMIT: u32 = 10;
/// Longest `recall_memory` query.
pub const MAX_QUERY_CHARS: usize = 1000;
/// Most caller headers on one `api_call`.
pub const MAX_HEADERS: usize = 100;
/// Longest target URL (after substitution).
pub const MAX_TARGET_BYTES: usize = 16 * 1024;
pub use crate::credential::deliver::{DeliveryError, delivery_header, percent_encode};
pub use crate::credential::redact::{MIN_REDACT_LEN, REDACTED, Redactor};

/// Caller headers refused on `api_call`: hop-by-hop and framing headers the
/// client owns, and the sidecar's own token header.
pub const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "proxy-connection",
    "expect",
    airlock_platform_api::sidecar_auth::SIDECAR_AUTH_HEADER,
];

/// A JSON-RPC error for an envelope rmcp must not see.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvelopeError {
    pub code: i32,
    pub message: String,
    /// The request id when one could be read, else `null`.
    pub id: Value,
}

impl EnvelopeError {
    fn new(code: i32, message: impl Into<String>, id: Value) -> Self {
        EnvelopeError {
            code,
            message: message.into(),
            id,
        }
    }

    /// The JSON-RPC error object (`{"jsonrpc":"2.0","id":…,"error":{…}}`).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": self.code, "message": self.message},
        })
    }
}

pub const PARSE_ERROR: i32 = -32700;
pub const INVALID_REQUEST: i32 = -32600;
pub const INVALID_PARAMS: i32 = -32602;

/// Checks a POST body before rmcp parses it, so malformed input gets a
/// proper JSON-RPC error (rmcp answers those with a plain-text 415): the
/// shape ([`check_shape`]) and then rmcp's own typed parse.
pub fn check_envelope(bytes: &[u8]) -> Result<(), EnvelopeError> {
    check_shape(bytes)?;
    typed_check(bytes)
}

/// What the shape check learnt of an accepted message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shape {
    /// `params.name` of a `tools/call` request.
    pub tool_call: Option<String>,
    /// An `initialize` request (it opens a session in 2025-11-25 mode).
    pub initialize: bool,
}

/// rmcp's typed parse of a message that passed [`check_shape`], as a
/// JSON-RPC error. The request path runs it only when rmcp refused the
/// message (so a good message is typed once, by rmcp).
pub fn typed_check(bytes: &[u8]) -> Result<(), EnvelopeError> {
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(bytes) else {
        return check_shape(bytes).map(drop);
    };
    let id = match obj.get("id") {
        Some(v @ (Value::String(_) | Value::Number(_))) => v.clone(),
        _ => Value::Null,
    };
    let is_request = obj.get("method").is_some() && obj.contains_key("id");
    if let Err(e) = serde_json::from_value::<rmcp::model::ClientJsonRpcMessage>(Value::Object(obj))
    {
        let (code, what) = if is_request {
            (INVALID_PARAMS, "Invalid params")
        } else {
            (INVALID_REQUEST, "Invalid Request")
        };
        return Err(EnvelopeError::new(code, format!("{what}: {e}"), id));
    }
    Ok(())
}

/// The JSON-RPC shape of a POST body: one object, `jsonrpc` "2.0", a string
/// or integer id, a method or a result/error, object params.
pub fn check_shape(bytes: &[u8]) -> Result<Shape, EnvelopeError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        EnvelopeError::new(
            PARSE_ERROR,
            format!("Parse error: body is not JSON ({e})"),
            Value::Null,
        )
    })?;
    let obj = match value {
        Value::Object(o) => o,
        Value::Array(_) => {
            return Err(EnvelopeError::new(
                INVALID_REQUEST,
                "Invalid Request: JSON-RPC batches are not supported",
                Value::Null,
            ));
        }
        _ => {
            return Err(EnvelopeError::new(
                INVALID_REQUEST,
                "Invalid Request: the body must be a JSON-RPC object",
                Value::Null,
            ));
        }
    };
    let id = match obj.get("id") {
        None => Value::Null,
        Some(v @ Value::String(_)) => v.clone(),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Value::Number(n.clone()),
        Some(_) => {
            return Err(EnvelopeError::new(
                INVALID_REQUEST,
                "Invalid Request: id must be a string or an integer",
                Value::Null,
            ));
        }
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(EnvelopeError::new(
            INVALID_REQUEST,
            "Invalid Request: jsonrpc must be \"2.0\"",
            id,
        ));
    }
    let has_method = match obj.get("method") {
        None => false,
        Some(Value::String(m)) if !m.is_empty() => true,
        Some(_) => {
            return Err(EnvelopeError::new(
                INVALID_REQUEST,
                "Invalid Request: method must be a non-empty string",
                id,
            ));
        }
    };
    if !has_method && !obj.contains_key("result") && !obj.contains_key("error") {
        return Err(EnvelopeError::new(
            INVALID_REQUEST,
            "Invalid Request: no method, result or error",
            id,
        ));
    }
    if obj.get("params").is_some_and(|p| !p.is_object()) {
        return Err(EnvelopeError::new(
            INVALID_PARAMS,
            "Invalid params: params must be an object",
            id,
        ));
    }
    let method = obj.get("method").and_then(Value::as_str);
    let tool_call = (method == Some("tools/call"))
        .then(|| obj.get("params")?.get("name")?.as_str().map(str::to_owned))
        .flatten();
    Ok(Shape {
        tool_call,
        initialize: method == Some("initialize"),
    })
}

/// A tool call, parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolCall {
    ApiCall {
        namespace: String,
        args: ApiCallArgs,
    },
    RunHistory {
        limit: u32,
        fields: Vec<&'static str>,
    },
    RecallMemory {
        q: String,
        limit: u32,
    },
}

/// Why a tool call cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    /// JSON-RPC `-32602`.
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    /// An `isError` result naming `code`.
    #[error("{0}")]
    Invalid(#[from] ArgError),
}

/// A refusal of the arguments (or of the prepared request), reported to the
/// agent as an `isError` result. Messages never carry a credential value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ArgError {
    /// Stable code: `invalid_arguments`, `forbidden_header`, `invalid_body`,
    /// `body_too_large`, `unknown_placeholder`, `credential_field_missing`.
    pub code: &'static str,
    pub message: String,
    pub status: u16,
}

impl ArgError {
    pub fn invalid(message: impl Into<String>) -> Self {
        ArgError {
            code: "invalid_arguments",
            message: message.into(),
            status: 400,
        }
    }
    pub(crate) fn with(code: &'static str, status: u16, message: impl Into<String>) -> Self {
        ArgError {
            code,
            message: message.into(),
            status,
        }
    }
}

impl From<DeliveryError> for ArgError {
    fn from(e: DeliveryError) -> Self {
        ArgError::with("credential_field_missing", e.status(), e.to_string())
    }
}

/// Parses `name` and `arguments`; `is_namespace` says which integrations exist.
pub fn parse_tool_call(
    name: &str,
    arguments: Option<&Map<String, Value>>,
    is_namespace: impl Fn(&str) -> bool,
    max_body_bytes: usize,
) -> Result<ToolCall, ToolError> {
    let empty = Map::new();
    let args = arguments.unwrap_or(&empty);
    match name {
        RUN_HISTORY => Ok(parse_history(args)?),
        RECALL_MEMORY => Ok(parse_memory(args)?),
        _ => match api_call_namespace(name) {
            Some(ns) if is_namespace(ns) => Ok(ToolCall::ApiCall {
                namespace: ns.to_owned(),
                args: ApiCallArgs::parse(args, max_body_bytes)?,
            }),
            _ => Err(ToolError::UnknownTool(name.chars().take(200).collect())),
        },
    }
}

fn only_keys(args: &Map<String, Value>, allowed: &[&str]) -> Result<(), ArgError> {
    match args.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(ArgError::invalid(format!(
            "unknown argument {:?} (expected: {})",
            k.chars().take(64).collect::<String>(),
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

fn parse_limit(args: &Map<String, Value>) -> Result<u32, ArgError> {
    match args.get("limit") {
        None | Some(Value::Null) => Ok(DEFAULT_LIMIT),
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(ArgError::invalid(format!(
                "limit must be an integer from 1 to {MAX_LIMIT}"
            ))),
        },
    }
}

fn parse_history(args: &Map<String, Value>) -> Result<ToolCall, ArgError> {
    only_keys(args, &["limit", "fields"])?;
    let limit = parse_limit(args)?;
    let mut fields = Vec::new();
    match args.get("fields") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for f in list {
                let f = match f.as_str() {
                    Some("checkpoint") => "checkpoint",
                    Some("result") => "result",
                    _ => {
                        return Err(ArgError::invalid(
                            "fields may hold only \"checkpoint\" and \"result\"",
                        ));
                    }
                };
                if !fields.contains(&f) {
                    fields.push(f);
                }
            }
        }
        Some(_) => return Err(ArgError::invalid("fields must be an array")),
    }
    Ok(ToolCall::RunHistory { limit, fields })
}

fn parse_memory(args: &Map<String, Value>) -> Result<ToolCall, ArgError> {
    only_keys(args, &["q", "limit"])?;
    let q = match args.get("q") {
        Some(Value::String(q)) => q,
        _ => return Err(ArgError::invalid("q (a string) is required")),
    };
    if q.chars().count() > MAX_QUERY_CHARS {
        return Err(ArgError::invalid(format!(
            "q is longer than {MAX_QUERY_CHARS} characters"
        )));
    }
    if q.chars().any(|c| c == '\0') {
        return Err(ArgError::invalid("q contains a NUL character"));
    }
    Ok(ToolCall::RecallMemory {
        q: q.clone(),
        limit: parse_limit(args)?,
    })
}

/// The body of an `api_call`.
#[derive(Debug, Clone, PartialEq)]
pub enum BodySpec {
    /// A string, sent as is.
    Text(String),
    /// A JSON object or array, serialised (content type `application/json`
    /// unless the caller set one).
    Json(String),
    /// `{"fromBytes": "<base64>", "encoding": "base64"}`, decoded.
    Bytes(Vec<u8>),
}

impl BodySpec {
    fn bytes(&self) -> &[u8] {
        match self {
            BodySpec::Text(s) | BodySpec::Json(s) => s.as_bytes(),
            BodySpec::Bytes(b) => b,
        }
    }
}

/// `api_call` arguments after validation (before substitution).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiCallArgs {
    pub target: String,
    pub method: Method,
    /// In the caller's order; names are lowercase.
    pub headers: Vec<(HeaderName, String)>,
    pub body: Option<BodySpec>,
    pub substitute_body: bool,
}

fn has_ctl(s: &str) -> bool {
    s.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)
}

impl ApiCallArgs {
    /// Bytes of the body as given (before any substitution).
    pub fn body_len(&self) -> usize {
        self.body.as_ref().map_or(0, |b| b.bytes().len())
    }

    /// Reads an `api_call`'s arguments, each checked in turn: no unknown
    /// key, the target, the method, the headers, the body (none for `GET`
    /// or `HEAD`, within `max_body_bytes`), `substituteBody`.
    pub fn parse(
        args: &Map<String, Value>,
        max_body_bytes: usize,
    ) -> Result<ApiCallArgs, ArgError> {
        only_keys(
            args,
            &["target", "method", "headers", "body", "substituteBody"],
        )?;
        let target = parse_target(args)?;
        let method = parse_method(args)?;
        let headers = parse_headers(args)?;
        let body = parse_body(args, &method, max_body_bytes)?;
        let substitute_body = match args.get("substituteBody") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ArgError::invalid("substituteBody must be a boolean")),
        };
        Ok(ApiCallArgs {
            target,
            method,
            headers,
            body,
            substitute_body,
        })
    }
}

/// `target`: a non-empty string within [`MAX_TARGET_BYTES`].
fn parse_target(args: &Map<String, Value>) -> Result<String, ArgError> {
    let target = match args.get("target") {
        Some(Value::String(t)) if !t.is_empty() => t.clone(),
        _ => {
            return Err(ArgError::invalid(
                "target (a non-empty URL string) is required",
            ));
        }
    };
    if target.len() > MAX_TARGET_BYTES {
        return Err(ArgError::invalid(format!(
            "target is longer than {MAX_TARGET_BYTES} bytes"
        )));
    }
    Ok(target)
}

/// `method`: one of six, in any case; `GET` when absent.
fn parse_method(args: &Map<String, Value>) -> Result<Method, ArgError> {
    match args.get("method") {
        None | Some(Value::Null) => Ok(Method::GET),
        Some(Value::String(m)) => match m.to_ascii_uppercase().as_str() {
            "GET" => Ok(Method::GET),
            "POST" => Ok(Method::POST),
            "PUT" => Ok(Method::PUT),
            "PATCH" => Ok(Method::PATCH),
            "DELETE" => Ok(Method::DELETE),
            "HEAD" => Ok(Method::HEAD),
            _ => Err(ArgError::invalid(
                "method must be one of GET, POST, PUT, PATCH, DELETE, HEAD",
            )),
        },
        Some(_) => Err(ArgError::invalid("method must be a string")),
    }
}

/// `headers`: an object of at most [`MAX_HEADERS`] strings, each name and
/// value checked.
fn parse_headers(args: &Map<String, Value>) -> Result<Vec<(HeaderName, String)>, ArgError> {
    let mut headers = Vec::new();
    match args.get("headers") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            if map.len() > MAX_HEADERS {
                return Err(ArgError::invalid(format!(
                    "more than {MAX_HEADERS} headers"
                )));
            }
            for (name, value) in map {
                let Value::String(value) = value else {
                    return Err(ArgError::invalid(format!(
                        "header {:?}: value must be a string",
                        short(name)
                    )));
                };
                headers.push((check_header_name(name)?, check_header_value(name, value)?));
            }
        }
        Some(_) => return Err(ArgError::invalid("headers must be an object of strings")),
    }
    Ok(headers)
}

/// `body`: text, JSON, or bytes in base64; none for a `GET` or `HEAD`, and
/// within `max_body_bytes`.
fn parse_body(
    args: &Map<String, Value>,
    method: &Method,
    max_body_bytes: usize,
) -> Result<Option<BodySpec>, ArgError> {
    let body = match args.get("body") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(BodySpec::Text(s.clone())),
        Some(Value::Object(o)) if o.contains_key("fromBytes") => Some(parse_from_bytes(o)?),
        Some(v @ (Value::Object(_) | Value::Array(_))) => Some(BodySpec::Json(v.to_string())),
        Some(_) => {
            return Err(ArgError::with(
                "invalid_body",
                400,
                "body must be a string, a JSON object or array, or {\"fromBytes\": \"<base64>\", \"encoding\": \"base64\"}",
            ));
        }
    };
    if let Some(b) = &body {
        if matches!(*method, Method::GET | Method::HEAD) {
            return Err(ArgError::with(
                "invalid_body",
                400,
                format!("a {method} request cannot have a body"),
            ));
        }
        if b.bytes().len() > max_body_bytes {
            return Err(ArgError::with(
                "body_too_large",
                413,
                format!("body exceeds the {max_body_bytes}-byte limit"),
            ));
        }
    }
    Ok(body)
}

fn short(s: &str) -> String {
    let s: String = s.chars().take(64).collect();
    s.replace(['\r', '\n', '\0'], "?")
}

fn check_header_name(name: &str) -> Result<HeaderName, ArgError> {
    if has_ctl(name) {
        return Err(ArgError::with(
            "forbidden_header",
            400,
            "a header name contains CR, LF or NUL",
        ));
    }
    let lower = name.to_ascii_lowercase();
    if FORBIDDEN_HEADERS.contains(&lower.as_str()) {
        return Err(ArgError::with(
            "forbidden_header",
            400,
            format!("header {lower:?} is managed by the sidecar and cannot be set"),
        ));
    }
    HeaderName::from_bytes(lower.as_bytes()).map_err(|_| {
        ArgError::with(
            "forbidden_header",
            400,
            format!("{:?} is not a valid header name", short(name)),
        )
    })
}

fn check_header_value(name: &str, value: &str) -> Result<String, ArgError> {
    if has_ctl(value) {
        return Err(ArgError::with(
            "forbidden_header",
            400,
            format!("header {:?}: the value contains CR, LF or NUL", short(name)),
        ));
    }
    if HeaderValue::from_str(value).is_err() {
        return Err(ArgError::with(
            "forbidden_header",
            400,
            format!(
                "header {:?}: the value is not a valid header value",
                short(name)
            ),
        ));
    }
    Ok(value.to_owned())
}

fn parse_from_bytes(o: &Map<String, Value>) -> Result<BodySpec, ArgError> {
    let bad = |m: &str| ArgError::with("invalid_body", 400, m.to_owned());
    if o.keys().any(|k| k != "fromBytes" && k != "encoding") {
        return Err(bad(
            "a fromBytes body has only the keys fromBytes and encoding",
        ));
    }
    match o.get("encoding") {
        Some(Value::String(e)) if e == "base64" => {}
        _ => return Err(bad("a fromBytes body needs \"encoding\": \"base64\"")),
    }
    let Some(Value::String(data)) = o.get("fromBytes") else {
        return Err(bad("fromBytes must be a base64 string"));
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| bad(&format!("fromBytes is not valid base64: {e}")))?;
    Ok(BodySpec::Bytes(bytes))
}

// ---------------------------------------------------------------------------
// Placeholders

/// Replaces every `{{field}}` in `input`. A `{{` that does not start a
/// well-formed placeholder (`{{ name }}`, name `[A-Za-z0-9_.-]+`) is kept
/// literally; a well-formed placeholder naming no field is an error.
/// `encode` transforms a value before insertion. Returns the output and
/// whether anything was substituted.
fn substitute(
    input: &[u8],
    fields: &CredentialFields,
    encode: impl Fn(&str) -> String,
    what: &str,
) -> Result<(Vec<u8>, bool), ArgError> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    let mut any = false;
    while i < input.len() {
        if input.get(i..i + 2) == Some(b"{{")
            && let Some((name, len)) = placeholder_at(input.get(i..).unwrap_or_default())
        {
            match fields.get(name) {
                Some(v) => {
                    // (The encoded copy is zeroed; `out` goes on the wire.)
                    out.extend_from_slice(Zeroizing::new(encode(v.expose_secret())).as_bytes());
                    any = true;
                    i += len;
                    continue;
                }
                None => {
                    return Err(ArgError::with(
                        "unknown_placeholder",
                        400,
                        format!(
                            "{what}: {{{{{name}}}}} names no field of the credential (fields: {})",
                            fields
                                .keys()
                                .map(String::as_str)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
            }
        }
        if let Some(b) = input.get(i) {
            out.push(*b);
        }
        i += 1;
    }
    Ok((out, any))
}

/// `{{ name }}` at the start of `s`: the name and the placeholder's length.
fn placeholder_at(s: &[u8]) -> Option<(&str, usize)> {
    let rest = s.strip_prefix(b"{{")?;
    let end = rest.windows(2).take(130).position(|w| w == b"}}")?;
    let inner = std::str::from_utf8(rest.get(..end)?).ok()?.trim();
    let ok = !inner.is_empty()
        && inner.len() <= 128
        && inner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    ok.then_some((inner, end + 4))
}

/// The outbound request, ready for the guarded client.
#[derive(Debug)]
pub struct Prepared {
    pub method: Method,
    pub url: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The delivery header and every caller header that had a placeholder.
    pub credential_headers: Vec<HeaderName>,
}

/// Fills placeholders, adds the delivery header and builds the request.
pub fn prepare(
    args: &ApiCallArgs,
    fields: &CredentialFields,
    delivery: Option<&Delivery>,
) -> Result<Prepared, ArgError> {
    let (url, _) = substitute(args.target.as_bytes(), fields, percent_encode, "target")?;
    let url = String::from_utf8(url)
        .map_err(|_| ArgError::invalid("target is not UTF-8 after substitution"))?;
    if url.len() > MAX_TARGET_BYTES {
        return Err(ArgError::invalid(format!(
            "target is longer than {MAX_TARGET_BYTES} bytes after substitution"
        )));
    }
    let mut headers = HeaderMap::new();
    let mut credential_headers = Vec::new();
    for (name, value) in &args.headers {
        let (v, substituted) = substitute(
            value.as_bytes(),
            fields,
            str::to_owned,
            &format!("header {name}"),
        )?;
        // The substituted bytes are zeroed once the header value holds them.
        let v = Zeroizing::new(v);
        let mut v = HeaderValue::from_bytes(&v)
            .ok()
            .filter(|_| !v.iter().any(|b| matches!(b, b'\r' | b'\n' | 0)))
            .ok_or_else(|| {
                ArgError::with(
                    "forbidden_header",
                    400,
                    format!(
                        "header {name}: a substituted credential field is not a valid header value"
                    ),
                )
            })?;
        if substituted {
            v.set_sensitive(true);
            if !credential_headers.contains(name) {
                credential_headers.push(name.clone());
            }
        }
        headers.append(name.clone(), v);
    }
    if let Some(d) = delivery {
        let (name, value) = delivery_header(d, fields)?;
        headers.remove(&name);
        headers.insert(name.clone(), value);
        if !credential_headers.contains(&name) {
            credential_headers.push(name);
        }
    }
    let body = match &args.body {
        None => Bytes::new(),
        Some(spec) => {
            let raw = spec.bytes();
            let out = if args.substitute_body {
                substitute(raw, fields, str::to_owned, "body")?.0
            } else {
                raw.to_vec()
            };
            if matches!(spec, BodySpec::Json(_)) && !headers.contains_key(CONTENT_TYPE) {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            Bytes::from(out)
        }
    };
    Ok(Prepared {
        method: args.method.clone(),
        url,
        headers,
        body,
        credential_headers,
    })
}

/// Response headers shown to the agent; everything else (cookies, auth
/// challenges, server internals) is dropped.
pub fn is_safe_response_header(name: &str) -> bool {
    const SAFE: &[&str] = &[
        "content-type",
        "content-length",
        "content-language",
        "content-encoding",
        "content-disposition",
        "etag",
        "last-modified",
        "cache-control",
        "expires",
        "vary",
        "link",
        "location",
        "retry-after",
        "x-request-id",
        "request-id",
        "x-total-count",
    ];
    // Compared without a lowercased copy (this runs for every header of
    // every answer).
    let starts = |prefix: &str| {
        name.get(..prefix.len())
            .is_some_and(|h| h.eq_ignore_ascii_case(prefix))
    };
    SAFE.iter().any(|s| s.eq_ignore_ascii_case(name))
        || starts("x-ratelimit-")
        || starts("ratelimit")
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_platform_api::types;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(o) => o,
            _ => Map::new(),
        }
    }

    use std::collections::BTreeMap;

    fn fields() -> CredentialFields {
        BTreeMap::from([
            ("api_key".to_owned(), "s3cr3t/v@lue".into()),
            ("org".to_owned(), "acme".into()),
        ])
    }

    fn parse(v: Value) -> Result<ApiCallArgs, ArgError> {
        ApiCallArgs::parse(&obj(v), 1024)
    }

    #[test]
    fn envelope_errors() {
        let e = check_envelope(b"{not json").unwrap_err();
        assert_eq!(e.code, PARSE_ERROR);
        assert_eq!(check_envelope(b"[]").unwrap_err().code, INVALID_REQUEST);
        assert_eq!(check_envelope(b"42").unwrap_err().code, INVALID_REQUEST);
        assert_eq!(
            check_envelope(br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#)
                .unwrap_err()
                .code,
            INVALID_REQUEST
        );
        assert_eq!(
            check_envelope(br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#)
                .unwrap_err()
                .code,
            INVALID_REQUEST
        );
        let e = check_envelope(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":[1]}"#)
            .unwrap_err();
        assert_eq!((e.code, e.id.clone()), (INVALID_PARAMS, json!(7)));
        assert_eq!(e.to_json()["error"]["code"], json!(INVALID_PARAMS));
        assert!(check_envelope(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).is_ok());
        assert!(
            check_envelope(
                br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x"}}"#
            )
            .is_ok()
        );
        assert!(
            check_envelope(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_ok()
        );
    }

    #[test]
    fn tool_names() {
        let ns = |n: &str| n == "github";
        let call = parse_tool_call(
            "github__api_call",
            Some(&obj(json!({"target": "https://x/"}))),
            ns,
            10,
        )
        .unwrap();
        assert!(matches!(call, ToolCall::ApiCall { ref namespace, .. } if namespace == "github"));
        assert_eq!(
            parse_tool_call("gitlab__api_call", None, ns, 10).unwrap_err(),
            ToolError::UnknownTool("gitlab__api_call".into())
        );
        assert!(matches!(
            parse_tool_call("nope", None, ns, 10),
            Err(ToolError::UnknownTool(_))
        ));
        assert_eq!(
            parse_tool_call("run_history", None, ns, 10).unwrap(),
            ToolCall::RunHistory {
                limit: 10,
                fields: vec![]
            }
        );
        assert_eq!(
            parse_tool_call(
                "run_history",
                Some(&obj(json!({"limit": 50, "fields": ["result", "result"]}))),
                ns,
                10
            )
            .unwrap(),
            ToolCall::RunHistory {
                limit: 50,
                fields: vec!["result"]
            }
        );
        for bad in [
            json!({"limit": 0}),
            json!({"limit": 51}),
            json!({"limit": "5"}),
            json!({"fields": ["x"]}),
            json!({"other": 1}),
        ] {
            assert!(matches!(
                parse_tool_call("run_history", Some(&obj(bad)), ns, 10),
                Err(ToolError::Invalid(_))
            ));
        }
        assert_eq!(
            parse_tool_call(
                "recall_memory",
                Some(&obj(json!({"q": "deploy", "limit": 3}))),
                ns,
                10
            )
            .unwrap(),
            ToolCall::RecallMemory {
                q: "deploy".into(),
                limit: 3
            }
        );
        assert!(parse_tool_call("recall_memory", None, ns, 10).is_err());
    }

    #[test]
    fn api_call_validation() {
        let ok = parse(json!({"target": "https://a/", "method": "post", "headers": {"X-A": "1"}, "body": {"k": 1}})).unwrap();
        assert_eq!(ok.method, Method::POST);
        assert_eq!(ok.body, Some(BodySpec::Json(r#"{"k":1}"#.into())));
        assert_eq!(ok.headers[0].0.as_str(), "x-a");
        for (v, code) in [
            (json!({}), "invalid_arguments"),
            (
                json!({"target": "https://a/", "method": "TRACE"}),
                "invalid_arguments",
            ),
            (json!({"target": "https://a/", "body": "x"}), "invalid_body"),
            (
                json!({"target": "https://a/", "method": "HEAD", "body": "x"}),
                "invalid_body",
            ),
            (
                json!({"target": "https://a/", "method": "POST", "body": 5}),
                "invalid_body",
            ),
            (
                json!({"target": "https://a/", "method": "POST", "body": {"fromBytes": "!!!", "encoding": "base64"}}),
                "invalid_body",
            ),
            (
                json!({"target": "https://a/", "method": "POST", "body": {"fromBytes": "AAAA"}}),
                "invalid_body",
            ),
            (
                json!({"target": "https://a/", "method": "POST", "body": "x".repeat(1025)}),
                "body_too_large",
            ),
            (
                json!({"target": "https://a/", "headers": {"X-A": "a\r\nEvil: 1"}}),
                "forbidden_header",
            ),
            (
                json!({"target": "https://a/", "headers": {"X-A\r\nB": "1"}}),
                "forbidden_header",
            ),
            (
                json!({"target": "https://a/", "headers": {"X-A": "a\u{0}"}}),
                "forbidden_header",
            ),
            (
                json!({"target": "https://a/", "headers": {"Host": "evil"}}),
                "forbidden_header",
            ),
            (
                json!({"target": "https://a/", "headers": {"Transfer-Encoding": "chunked"}}),
                "forbidden_header",
            ),
            (
                json!({"target": "https://a/", "headers": {"x-airlock-sidecar-auth": "t"}}),
                "forbidden_header",
            ),
            (
                json!({"target": "https://a/", "headers": {"bad name": "1"}}),
                "forbidden_header",
            ),
            (
                json!({"target": "https://a/", "headers": {"x": 1}}),
                "invalid_arguments",
            ),
            (
                json!({"target": "https://a/", "substituteBody": "yes"}),
                "invalid_arguments",
            ),
        ] {
            assert_eq!(parse(v.clone()).unwrap_err().code, code, "{v}");
        }
        let b = parse(json!({"target": "https://a/", "method": "PUT", "body": {"fromBytes": "AAEC", "encoding": "base64"}})).unwrap();
        assert_eq!(b.body, Some(BodySpec::Bytes(vec![0, 1, 2])));
    }

    #[test]
    fn substitution_and_delivery() {
        let args = parse(json!({
            "target": "https://api.test/{{org}}/x?key={{ api_key }}&lit={{not closed",
            "method": "POST",
            "headers": {"X-Key": "k {{api_key}}", "Authorization": "Bearer caller", "X-Plain": "{{}}"},
            "body": "org={{org}}",
            "substituteBody": true,
        }))
        .unwrap();
        let d = Delivery {
            header: types::HeaderName::parse("Authorization").unwrap(),
            prefix: types::HeaderText::parse("Bearer ").unwrap(),
            field: "api_key".into(),
            audience: None,
        };
        let p = prepare(&args, &fields(), Some(&d)).unwrap();
        assert_eq!(
            p.url,
            "https://api.test/acme/x?key=s3cr3t%2Fv%40lue&lit={{not closed"
        );
        assert_eq!(p.headers.get("x-key").unwrap(), "k s3cr3t/v@lue");
        assert_eq!(p.headers.get_all("authorization").iter().count(), 1);
        assert_eq!(
            p.headers.get("authorization").unwrap(),
            "Bearer s3cr3t/v@lue"
        );
        assert_eq!(p.headers.get("x-plain").unwrap(), "{{}}");
        // Every value that carries the credential is marked sensitive: a
        // `Debug` of the request's headers does not show it.
        assert!(p.headers.get("x-key").unwrap().is_sensitive());
        assert!(p.headers.get("authorization").unwrap().is_sensitive());
        assert!(!p.headers.get("x-plain").unwrap().is_sensitive());
        assert!(!format!("{:?}", p.headers).contains("s3cr3t"));
        assert_eq!(&p.body[..], b"org=acme");
        let names: Vec<&str> = p
            .credential_headers
            .iter()
            .map(HeaderName::as_str)
            .collect();
        assert_eq!(names, ["x-key", "authorization"]);

        // Without substituteBody the body stays literal.
        let args = parse(json!({"target": "https://a/", "method": "POST", "body": "{{api_key}}"}))
            .unwrap();
        assert_eq!(
            &prepare(&args, &fields(), None).unwrap().body[..],
            b"{{api_key}}"
        );

        let args = parse(json!({"target": "https://a/{{nope}}"})).unwrap();
        let e = prepare(&args, &fields(), None).unwrap_err();
        assert_eq!(e.code, "unknown_placeholder");
        assert!(!e.message.contains("s3cr3t"));
        let d = Delivery {
            header: types::HeaderName::parse("X-Key").unwrap(),
            prefix: types::HeaderText::default(),
            field: "missing".into(),
            audience: None,
        };
        let args = parse(json!({"target": "https://a/"})).unwrap();
        assert_eq!(
            prepare(&args, &fields(), Some(&d)).unwrap_err().code,
            "credential_field_missing"
        );
        // A credential with a line break cannot be smuggled into a header.
        let f: CredentialFields = BTreeMap::from([("k".to_owned(), "a\r\nX-Evil: 1".into())]);
        let args = parse(json!({"target": "https://a/", "headers": {"X-K": "{{k}}"}})).unwrap();
        let e = prepare(&args, &f, None).unwrap_err();
        assert_eq!(e.code, "forbidden_header");
        assert!(!e.message.contains("Evil"));
    }

    #[test]
    fn redaction() {
        let r = Redactor::new(["s3cr3t/v\"al", "abc"]);
        assert_eq!(r.str("x s3cr3t/v\"al y"), "x [REDACTED] y");
        assert_eq!(r.str("x s3cr3t%2Fv%22al"), "x [REDACTED]");
        assert_eq!(r.str(r#"{"k":"s3cr3t/v\"al"}"#), r#"{"k":"[REDACTED]"}"#);
        assert_eq!(r.str("abc"), "abc", "too short to redact");
        assert_eq!(r.bytes(b"\xffs3cr3t/v\"al\xfe"), b"\xff[REDACTED]\xfe");
        assert!(Redactor::new([]).is_empty());
    }

    #[test]
    fn safe_headers() {
        for h in [
            "Content-Type",
            "etag",
            "X-RateLimit-Remaining",
            "RateLimit-Policy",
            "retry-after",
            "location",
        ] {
            assert!(is_safe_response_header(h), "{h}");
        }
        for h in [
            "set-cookie",
            "authorization",
            "www-authenticate",
            "proxy-authenticate",
            "server",
            "x-internal",
            "x-ratelimit",
            "content-typo",
            "content-type-x",
            "rate",
            "",
        ] {
            assert!(!is_safe_response_header(h), "{h}");
        }
    }
}

//! `{namespace}__api_call`: fetch the credential at request time, inject it,
//! send through the egress guard, and return the answer without it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use airlock_egress::{Admission, CallRules, EgressError, OutboundRequest};
use airlock_platform_api::wire::{EgressOutcome, Step, Steps, timed};
use base64::Engine;
use bytes::Bytes;
use rmcp::model::{CallToolResult, ContentBlock, MetaObject, Resource};
use serde_json::{Map, Value, json};

use super::args::{self, ApiCallArgs, ArgError, Redactor};
use super::{CredentialPrefetch, McpState};
use crate::approval;
use crate::config::Integration;
use crate::credential::fetch::{self, CredentialError, Fetched};
use crate::egress::{Allowed, InFlight, Outcome, Plane, RecordError, Refused, Source};
use crate::state::Sidecar;

/// An `isError` result: `{"error": code, "message": …, "status": n}`.
pub fn error_result(code: &str, message: &str, status: u16) -> CallToolResult {
    let body = json!({"error": code, "message": message, "status": status});
    let mut r = CallToolResult::error(vec![ContentBlock::text(body.to_string())]);
    r.structured_content = Some(body);
    r
}

/// The guard's refusal (or failure) as an `isError` result, redacted; a
/// refusal by an L7 rule also carries `"rule": {"rule": id, "missing": …}`.
fn egress_result(e: &EgressError, redactor: &Redactor) -> CallToolResult {
    let mut r = error_result(
        e.code.as_str(),
        &redactor.str(&e.to_string()),
        e.http_status(),
    );
    if let (Some(rule), Some(Value::Object(body))) = (&e.rule, r.structured_content.as_mut())
        && let Ok(v) = serde_json::to_value(rule)
    {
        body.insert("rule".into(), redacted_value(v, redactor));
        r.content = vec![ContentBlock::text(Value::Object(body.clone()).to_string())];
    }
    r
}

/// Every string in `v`, redacted.
fn redacted_value(v: Value, redactor: &Redactor) -> Value {
    match v {
        Value::String(s) => Value::String(redactor.string(s)),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k, redacted_value(v, redactor)))
                .collect(),
        ),
        other => other,
    }
}

pub fn arg_error(e: &ArgError) -> CallToolResult {
    error_result(e.code, &e.message, e.status)
}

/// Why an `api_call` was not sent.
pub(crate) enum Stop {
    /// The guard refused it (to be recorded by the caller, with the
    /// call's redactor), after the guard's step (a traced run's).
    Refused(EgressError, Option<Step>),
    /// The egress log could not record it.
    Unrecorded(RecordError),
}

/// What an `api_call`'s URL text may hold.
#[derive(Clone, Copy)]
enum UrlText {
    /// The agent's target as it wrote it (no credential was put into it):
    /// its parse may be remembered ([`airlock_egress::TargetMemo`]).
    AsWritten,
    /// The request's URL once prepared: a credential may be in it (a
    /// `{{field}}` template filled in), so nothing of it outlives the call.
    Prepared,
}

/// The guard's decision on `url` and, when it allows it, the request's
/// record, stored before anything is sent.
async fn decide_and_record(
    sidecar: &Sidecar,
    rules: &CallRules<'_>,
    ns: &str,
    method: &http::Method,
    (url, text): (&str, UrlText),
    bytes_out: u64,
    redactor: &Redactor,
) -> Result<(Admission, InFlight), Stop> {
    let (admitted, guard) = timed(sidecar.traced, async {
        match text {
            UrlText::AsWritten => sidecar.client.admit_secret_free(url, method, rules).await,
            UrlText::Prepared => sidecar.client.admit(url, method, rules).await,
        }
    })
    .await;
    let admission = admitted.map_err(|e| Stop::Refused(e, guard))?;
    let allowed = Allowed {
        source: Source::ApiCall,
        plane: Plane::Api,
        integration: Some(ns),
        method: method.as_str(),
        target: admission.target(),
        bytes_out,
    };
    // Until the request is on its way, a drop means it was not sent.
    let mut flight = sidecar
        .egress
        .begin_as(&allowed, redactor, Some(EgressOutcome::NotSent))
        .map_err(Stop::Unrecorded)?;
    flight.step(guard, |s| &mut s.guard);
    Ok((admission, flight))
}

/// The call's credential, fetched for this call only (with the
/// integration's redactor); nothing to fetch without a connection.
async fn credential(
    sidecar: &Sidecar,
    integration: &Integration,
    prefetch: Option<&CredentialPrefetch>,
) -> Result<Fetched, CallToolResult> {
    if !integration.has_connection {
        return Ok(Fetched {
            fields: BTreeMap::new(),
            redactor: Redactor::none(),
        });
    }
    let ns = integration.namespace.as_str();
    let started = match prefetch {
        Some(p) => p.take(ns).await,
        None => None,
    };
    let fetched = match started {
        Some(outcome) => fetch::fetched(&sidecar.credentials, ns, outcome),
        None => fetch::fetch(&sidecar.platform, &sidecar.credentials, ns).await,
    };
    fetched.map_err(|e| {
        error_result(
            CredentialError::CODE,
            &e.to_string(),
            CredentialError::STATUS,
        )
    })
}

/// What an `api_call` answers: the common case (an upstream answer returned
/// inline as text) kept as its parts, so that the lean path can write it
/// without building rmcp's result first; anything else as the result.
pub(crate) enum Answer {
    Text(Box<TextAnswer>),
    Result(CallToolResult),
}

impl Answer {
    pub(crate) fn into_result(self) -> CallToolResult {
        match self {
            Answer::Text(t) => t.into_result(),
            Answer::Result(r) => r,
        }
    }
}

impl From<CallToolResult> for Answer {
    fn from(r: CallToolResult) -> Self {
        Answer::Result(r)
    }
}

/// What a successful answer's `_meta` says of the upstream's answer
/// (besides the body's size and encoding).
pub(crate) struct AnswerHead {
    pub(crate) status: u16,
    /// The safe response headers, redacted, a repeated one joined with
    /// `", "`, sorted by name (as the result's JSON object has them).
    pub(crate) headers: Vec<(http::HeaderName, String)>,
    /// The final URL, redacted.
    pub(crate) url: String,
    pub(crate) redirects: u32,
    pub(crate) credential_stripped: bool,
}

impl AnswerHead {
    fn meta(&self, bytes: usize, encoding: &str) -> Map<String, Value> {
        let mut headers = Map::new();
        for (name, value) in &self.headers {
            headers.insert(name.as_str().to_owned(), Value::String(value.clone()));
        }
        let mut meta = Map::new();
        meta.insert("status".into(), json!(self.status));
        meta.insert("headers".into(), Value::Object(headers));
        meta.insert("url".into(), json!(self.url));
        meta.insert("redirects".into(), json!(self.redirects));
        meta.insert("credentialStripped".into(), json!(self.credential_stripped));
        meta.insert("bytes".into(), json!(bytes));
        meta.insert("encoding".into(), json!(encoding));
        meta
    }
}

/// An upstream answer returned inline as text: one text block with the body
/// and `_meta` (status, headers, url, redirects, credentialStripped, bytes,
/// encoding). [`TextAnswer::into_result`] is the one definition of its
/// result; the lean path's writer is tested to write exactly its bytes.
pub(crate) struct TextAnswer {
    pub(crate) head: AnswerHead,
    /// The body, redacted.
    pub(crate) text: String,
}

impl TextAnswer {
    pub(crate) fn into_result(self) -> CallToolResult {
        let meta = self.head.meta(self.text.len(), "utf-8");
        let mut result = CallToolResult::success(vec![ContentBlock::text(self.text)]);
        result.meta = Some(MetaObject(meta));
        result
    }
}

/// Runs one `api_call` of `integration`. Never fails at the protocol level:
/// every refusal is an `isError` result; an upstream answer returned inline
/// as text is kept as its parts ([`Answer::into_result`] makes the result).
pub(crate) async fn run_answer(
    state: &McpState,
    integration: &Integration,
    args: ApiCallArgs,
    prefetch: Option<&CredentialPrefetch>,
) -> Answer {
    let sidecar = &state.sidecar;
    let Ok(_permit) = sidecar.api_calls.acquire().await else {
        return error_result("unavailable", "the sidecar is shutting down", 503).into();
    };
    let ns = integration.namespace.as_str();
    let method = args.method.as_str();
    let ((fetched, fetch_step), early) = if integration.has_connection && integration.may_hold() {
        match held_then_fetched(state, integration, &args).await {
            Ok(both) => both,
            Err(refused) => return refused.into(),
        }
    } else {
        tokio::join!(
            timed(
                sidecar.traced && integration.has_connection,
                credential(sidecar, integration, prefetch)
            ),
            decide_early(state, integration, &args)
        )
    };
    // The credential lives for this call only; `fields` is dropped on return.
    let Fetched { fields, redactor } = match fetched {
        Ok(f) => f,
        Err(result) => {
            not_sent(early);
            return result.into();
        }
    };
    let early = match early {
        Some(Err(stop)) => {
            return stopped(
                sidecar,
                ns,
                method,
                (stop, fetch_step),
                &args.target,
                &redactor,
            )
            .into();
        }
        other => other,
    };
    let delivery = integration
        .delivery
        .as_ref()
        .filter(|_| integration.has_connection);
    let prepared = match args::prepare(&args, &fields, delivery) {
        Ok(p) => p,
        Err(e) => {
            not_sent(early);
            return error_result(e.code, &redactor.str(&e.message), e.status).into();
        }
    };
    let rendered;
    let authorized = match state.static_uris.get(ns) {
        Some(parsed) => parsed,
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
    let decided = match early {
        Some(Ok(decided)) => Ok(decided),
        _ => {
            decide_and_record(
                sidecar,
                &rules,
                ns,
                &prepared.method,
                (&prepared.url, UrlText::Prepared),
                prepared.body.len() as u64,
                &redactor,
            )
            .await
        }
    };
    match decided {
        Ok((admission, mut flight)) => {
            flight.step(fetch_step, |s| &mut s.credential);
            let admission = match approved(sidecar, admission, &args, ns, &redactor).await {
                Ok(a) => a,
                Err(e) => {
                    flight.complete(Outcome::of_error(&e));
                    return egress_result(&e, &redactor).into();
                }
            };
            send(state, &rules, admission, flight, prepared, &redactor).await
        }
        Err(stop) => stopped(
            sidecar,
            ns,
            method,
            (stop, fetch_step),
            &prepared.url,
            &redactor,
        )
        .into(),
    }
}

/// The call's early decision and then its credential, for an integration
/// whose rules may hold a request: a held request waits for a person's
/// answer before the credential is fetched, so the credential is never in
/// the sidecar's memory during a hold, and a request denied (or not
/// answered) never fetches it. A refusal by the guard is left to the
/// caller (recorded with the call's redactor). A target or a list that
/// needs the credential to be judged (`{{field}}`, `{$credential.…}`) has
/// no early decision: it is fetched first, then judged and held.
async fn held_then_fetched(
    state: &McpState,
    integration: &Integration,
    args: &ApiCallArgs,
) -> Result<(Timed<Fetched>, Option<Decided>), CallToolResult> {
    let sidecar = &state.sidecar;
    let ns = integration.namespace.as_str();
    let early = match decide_early(state, integration, args).await {
        Some(Ok((admission, flight))) => {
            match approved(sidecar, admission, args, ns, &Redactor::none()).await {
                Ok(released) => Some(Ok((released, flight))),
                Err(e) => {
                    flight.complete(Outcome::of_error(&e));
                    return Err(egress_result(&e, &Redactor::none()));
                }
            }
        }
        other => other,
    };
    let fetched = timed(sidecar.traced, credential(sidecar, integration, None)).await;
    Ok((fetched, early))
}

/// A credential fetched (or the call's error), with its step in a traced run.
type Timed<T> = (Result<T, CallToolResult>, Option<Step>);

/// The guard's decision and the request's record, or why it was not sent.
type Decided = Result<(Admission, InFlight), Stop>;

/// The admission released from its hold once a person allowed it (at
/// once when no `ask` rule holds it), else the refusal. The person is told
/// what the agent asked for: its method, and the host and path of its
/// target as it wrote it (a target whose host or path a `{{field}}` fills
/// is described by the admitted target, redacted).
async fn approved(
    sidecar: &Sidecar,
    admission: Admission,
    args: &ApiCallArgs,
    ns: &str,
    redactor: &Redactor,
) -> Result<Admission, EgressError> {
    let Some(hold) = admission.hold() else {
        return Ok(admission);
    };
    let what = match airlock_egress::Target::parse(&args.target) {
        Ok(t) if !args.target.contains("{{") => approval::describe(&args.method, &t, Some(ns)),
        _ => {
            let d = approval::describe(&args.method, admission.target(), Some(ns));
            approval::Description {
                host: redactor.string(d.host),
                path: redactor.string(d.path),
                ..d
            }
        }
    };
    sidecar
        .approvals
        .pass(&sidecar.platform, hold, what)
        .await?;
    Ok(admission.release())
}

/// The guard's decision and the request's record, made while the
/// credential is fetched, when neither the target nor `authorized_uris`
/// depends on the credential (so nothing of it is in that target to
/// redact); `None` otherwise.
async fn decide_early(
    state: &McpState,
    integration: &Integration,
    args: &ApiCallArgs,
) -> Option<Result<(Admission, InFlight), Stop>> {
    let ns = integration.namespace.as_str();
    let authorized = state
        .static_uris
        .get(ns)
        .filter(|_| !args.target.contains("{{"))?;
    let rules = CallRules {
        authorized,
        allow_all_uris: integration.allow_all_uris,
        credentialed: integration.has_connection,
    };
    let decided = decide_and_record(
        &state.sidecar,
        &rules,
        ns,
        &args.method,
        (&args.target, UrlText::AsWritten),
        args.body_len() as u64,
        &Redactor::none(),
    )
    .await;
    Some(decided)
}

/// Completes an early decision's record as not sent: the call stopped
/// before it was.
fn not_sent(early: Option<Result<(Admission, InFlight), Stop>>) {
    if let Some(Ok((_, flight))) = early {
        flight.complete(Outcome::new(EgressOutcome::NotSent));
    }
}

/// The result of a call to `url` that was not sent: the guard's refusal
/// (recorded here, with the call's redactor and, in a traced run, the
/// guard's step and the credential's `fetch` step), or the egress log's
/// failure.
fn stopped(
    sidecar: &Sidecar,
    ns: &str,
    method: &str,
    (stop, fetch): (Stop, Option<Step>),
    url: &str,
    redactor: &Redactor,
) -> CallToolResult {
    match stop {
        Stop::Refused(e, guard) => {
            let steps = (guard.is_some() || fetch.is_some()).then_some(Steps {
                guard,
                credential: fetch,
                ..Steps::default()
            });
            let what = Refused {
                source: Source::ApiCall,
                plane: Plane::Api,
                integration: Some(ns),
                method,
                url,
            };
            sidecar.egress.refused_after(&what, &e, redactor, steps);
            egress_result(&e, redactor)
        }
        Stop::Unrecorded(e) => error_result(e.code(), &e.to_string(), 503),
    }
}

/// Sends the admitted call and answers with what came back, completing its
/// record with the upstream's outcome: an answer that cannot be searched
/// for the credential is withheld; the rest is answered redacted
/// ([`success`]).
async fn send(
    state: &McpState,
    rules: &CallRules<'_>,
    admission: Admission,
    mut flight: InFlight,
    prepared: args::Prepared,
    redactor: &Redactor,
) -> Answer {
    flight.will_send();
    let sent_bytes = prepared.body.len() as u64;
    let mut headers = prepared.headers;
    // Only an answer the sidecar can read is redacted: never ask for an
    // encoded one, whatever the agent asked for.
    headers.insert(
        http::header::ACCEPT_ENCODING,
        http::HeaderValue::from_static("identity"),
    );
    let req = OutboundRequest {
        method: prepared.method,
        url: prepared.url,
        headers,
        body: prepared.body,
        credential_headers: prepared.credential_headers,
    };
    let (sent, upstream) = timed(
        state.sidecar.traced,
        state.sidecar.client.send_admitted(admission, req, rules),
    )
    .await;
    flight.step(upstream, |s| &mut s.upstream);
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            flight.complete(Outcome::of_error(&e).bytes_out(sent_bytes));
            return egress_result(&e, redactor).into();
        }
    };
    let answered = Outcome::completed(resp.status.as_u16())
        .bytes_out(sent_bytes)
        .bytes_in(resp.body.len() as u64);
    if !redactor.is_empty()
        && let Some(coding) = crate::credential::unreadable_coding(&resp.headers)
    {
        // An encoded body cannot be searched for the credential: it might
        // carry it (an upstream that reflects the request), so it stays here.
        flight.complete(Outcome {
            kind: Some(EgressOutcome::Withheld),
            ..answered
        });
        return error_result(
            "unredactable_response",
            &format!(
                "the upstream answered {} with a body encoded as {coding:?} although the sidecar \
                 asked for identity; an encoded answer cannot be checked for the credential, so \
                 it is withheld",
                resp.status.as_u16()
            ),
            502,
        )
        .into();
    }
    let (answer, redaction) = timed(state.sidecar.traced, success(state, redactor, resp)).await;
    flight.step(redaction, |s| &mut s.redaction);
    flight.complete_after_answer(answered);
    answer
}

async fn success(
    state: &McpState,
    redactor: &Redactor,
    resp: airlock_egress::GuardedResponse,
) -> Answer {
    let content_type = resp
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: Bytes = if redactor.is_empty() {
        resp.body
    } else {
        Bytes::from(redactor.bytes(&resp.body))
    };
    let mut headers: Vec<(http::HeaderName, String)> = Vec::new();
    for (name, value) in &resp.headers {
        if !args::is_safe_response_header(name.as_str()) {
            continue;
        }
        if let Ok(v) = value.to_str() {
            let v = redactor.str(v);
            match headers.iter_mut().find(|(n, _)| n == name) {
                Some((_, prev)) => {
                    prev.push_str(", ");
                    prev.push_str(&v);
                }
                None => headers.push((name.clone(), v)),
            }
        }
    }
    headers.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    let head = AnswerHead {
        status: resp.status.as_u16(),
        headers,
        url: redactor.str(resp.final_url.url().as_str()),
        redirects: resp.redirects,
        credential_stripped: resp.credential_stripped,
    };
    // Valid UTF-8 is returned as text whatever the declared type; anything
    // else is base64 (a textual content type with bad bytes included). The
    // body is checked once, in its own buffer.
    let limit = state.sidecar.limits.inline_result_bytes;
    let (body, binary) = match String::from_utf8(Vec::from(body)) {
        Ok(text) if text.len() <= limit => {
            return Answer::Text(Box::new(TextAnswer { head, text }));
        }
        Ok(text) => (Bytes::from(text), false),
        Err(e) => (Bytes::from(e.into_bytes()), true),
    };
    let mut meta = head.meta(body.len(), if binary { "base64" } else { "utf-8" });
    let content = if body.len() > limit {
        match store(
            state,
            content_type
                .as_deref()
                .unwrap_or("application/octet-stream"),
            body.clone(),
        )
        .await
        {
            Ok(link) => {
                meta.insert("resourceUri".into(), json!(link.uri));
                vec![
                    ContentBlock::text(format!(
                        "The response body ({} bytes) is larger than the {}-byte inline limit; it was stored for this run. Read it with resources/read on {}.",
                        body.len(),
                        limit,
                        link.uri
                    )),
                    ContentBlock::resource_link(link),
                ]
            }
            Err(r) => return r.into(),
        }
    } else {
        vec![
            ContentBlock::text(format!(
                "[binary response body: {} bytes of {}; base64-encoded in the next block]",
                body.len(),
                content_type.as_deref().unwrap_or("unknown type")
            )),
            ContentBlock::text(base64::engine::general_purpose::STANDARD.encode(&body)),
        ]
    };
    let mut result = CallToolResult::success(content);
    result.meta = Some(MetaObject(meta));
    result.into()
}

/// Stores a large body for the run within `limits.run_result_bytes`.
pub(crate) async fn store(
    state: &McpState,
    content_type: &str,
    body: Bytes,
) -> Result<Resource, CallToolResult> {
    let len = body.len() as u64;
    let cap = state.sidecar.limits.run_result_bytes;
    let reserved = state
        .stored_bytes
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
            used.checked_add(len).filter(|n| *n <= cap)
        });
    if reserved.is_err() {
        return Err(error_result(
            "run_result_limit",
            &format!(
                "the response body ({len} bytes) is larger than the inline limit and storing it would exceed the run's {cap}-byte limit for stored results ({} bytes used)",
                state.stored_bytes.load(Ordering::SeqCst)
            ),
            413,
        ));
    }
    match state.sidecar.platform.put_result(content_type, body).await {
        Ok(r) => {
            let uri = super::result_uri(&state.sidecar.run_id, &r.id);
            Ok(Resource::new(uri, format!("api_call result {}", r.id))
                .with_mime_type(content_type)
                .with_size(len))
        }
        Err(e) => {
            state.stored_bytes.fetch_sub(len, Ordering::SeqCst);
            tracing::warn!(
                status = e.status().unwrap_or(0),
                "storing a large result failed"
            );
            Err(error_result(
                "result_store_failed",
                "the platform could not store the large response body",
                502,
            ))
        }
    }
}

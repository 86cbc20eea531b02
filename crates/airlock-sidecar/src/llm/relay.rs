//! One model call, step by step ([`relay`]): routed ([`super::route`]),
//! admitted ([`admit`]: its body read within the run's bound, the provider
//! fetches it asks for judged, the body prepared, the guard's decision and
//! the egress record begun) while the model key is fetched, sent
//! ([`send`]), and answered with the provider's head and a body metered as
//! it passes ([`answer`]).

use std::sync::Arc;

use airlock_egress::{
    Admission, CallRules, EgressCode, EgressError, OutboundRequest, StreamingResponse,
};
use airlock_platform_api::wire::EgressOutcome;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::request::Parts;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use secrecy::SecretString;

use super::Llm;
use super::answer::{End, Mode, Passage, Relay};
use super::body::{FlushFirst, RelayBody};
use super::budget::Hold;
use super::error::{egress_error, error};
use super::headers::{safe_response_headers, upstream_headers};
use super::meter::CostDraft;
use super::provider_fetch;
use super::request_body::{Prepared, prepare};
use super::route::{Endpoint, Upstream, provider_name, route};
use super::sse::SseSplitter;
use crate::config::{MODEL_CREDENTIAL, Provider};
use crate::credential::{Redactor, unreadable_coding};
use crate::egress::{Allowed, InFlight, Outcome, Plane, Refused, Source};
use crate::state::Sidecar;
use airlock_platform_api::wire::timed;

/// The `/llm` handler: one model call.
pub(super) async fn relay(State(llm): State<Arc<Llm>>, req: Request) -> Response {
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
        return unknown_endpoint(&parts.method, path, up.provider);
    };
    let url = up.url_for(path, parts.uri.query());
    // The key fetch goes out first (the platform's client writes it when it
    // is first polled); the body, the guard's decision and the egress
    // record are done while the platform answers.
    let admit = admit(&llm, up, endpoint, &parts, &url, body);
    let (key, admitted, fetch_step) = llm.key.with(&llm.sidecar, admit).await;
    let Admitted {
        mut prepared,
        admission,
        mut flight,
        hold,
    } = match admitted {
        Ok(a) => a,
        Err(r) => return r,
    };
    flight.step(fetch_step, |s| &mut s.credential);
    let (key, headers) = match key
        .and_then(|k| upstream_headers(&parts.headers, up.provider, &k.secret).map(|h| (k, h)))
    {
        Ok(kh) => kh,
        Err(r) => {
            flight.complete(Outcome::new(EgressOutcome::NotSent));
            if let Some(h) = hold {
                h.release();
            }
            return *r;
        }
    };
    let out = OutboundRequest {
        method: parts.method.clone(),
        url,
        headers,
        // What else was prepared (the model, the usage asked for) is the
        // answer's meter's.
        body: std::mem::take(&mut prepared.body),
        credential_headers: vec![header::AUTHORIZATION, HeaderName::from_static("x-api-key")],
    };
    let (sent, upstream) = timed(llm.sidecar.traced, send(&llm, admission, out, &key.secret)).await;
    flight.step(upstream, |s| &mut s.upstream);
    let resp = match sent {
        Ok(r) => r,
        Err(mut e) => {
            e.detail = key.redactor.str(&e.detail);
            flight.complete(Outcome::of_error(&e));
            return egress_error(&e);
        }
    };
    if resp.status.is_redirection() {
        // The provider answered; the relay does not follow (the answer is
        // the upstream's, the 502 the agent gets is the relay's).
        flight.complete(Outcome::completed(resp.status.as_u16()));
        if let Some(h) = hold {
            h.release();
        }
        return redirect_not_followed(resp.status);
    }
    let call = Call {
        up,
        endpoint,
        prepared,
        redactor: key.redactor,
    };
    answer(&llm.sidecar, call, resp, (flight, hold))
}

fn unknown_endpoint(method: &Method, path: &str, provider: Provider) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        "unknown_endpoint",
        format!(
            "{method} {path} is not relayed for the {} provider",
            provider_name(provider)
        ),
    )
}

fn redirect_not_followed(status: StatusCode) -> Response {
    error(
        StatusCode::BAD_GATEWAY,
        "upstream_error",
        EgressCode::UpstreamFailed.as_str(),
        format!(
            "the model provider answered with a redirect ({}), which the relay does not follow",
            status.as_u16()
        ),
    )
}

/// A call that may go: the body to send, the guard's admission of its
/// URL, its egress record, begun, and its budgets' reservation.
struct Admitted {
    prepared: Prepared,
    admission: Admission,
    flight: InFlight,
    hold: Option<Hold>,
}

/// Admits a call to `url`, or answers the agent why not: its body within
/// the run's bound, no provider fetch the run does not allow, its budgets'
/// reservation, the guard's decision, and its egress record kept before
/// anything is sent.
async fn admit(
    llm: &Llm,
    up: &Upstream,
    endpoint: Endpoint,
    parts: &Parts,
    url: &str,
    body: axum::body::Body,
) -> Result<Admitted, Response> {
    let sidecar = &*llm.sidecar;
    let method = parts.method.as_str();
    let body = read_body(body, sidecar.limits.max_request_bytes).await?;
    judge_provider_fetches(sidecar, up, method, &body, &parts.headers).await?;
    let sent_len = body.len();
    let prepared = match endpoint {
        Endpoint::Metered { .. } => prepare(endpoint, body),
        Endpoint::Plain => Prepared::as_sent(body, None),
    };
    let hold = match (&llm.budgets, endpoint) {
        (Some(b), Endpoint::Metered { .. }) => {
            let price = up.price_for(prepared.model.as_deref());
            match b
                .reserve(
                    b.reservation(sent_len, prepared.output_bound, price),
                    price.is_known(),
                )
                .await
            {
                Ok(h) => Some(h),
                Err(refusal) => return Err(b.refuse(&refusal, &sidecar.keep)),
            }
        }
        _ => None,
    };
    let rules = CallRules {
        authorized: &up.authorized,
        allow_all_uris: false,
        credentialed: true,
    };
    // The URL is the configured base and the agent's own path and query,
    // made before the key exists (the key goes in a header): no secret of
    // the sidecar's is in its text, so its parse is remembered.
    let (admitted, guard) = timed(
        sidecar.traced,
        sidecar.client.admit_secret_free(url, &parts.method, &rules),
    )
    .await;
    let admission = match admitted {
        Ok(a) => a,
        Err(e) => {
            if let Some(h) = hold {
                h.release();
            }
            return Err(refused(sidecar, method, url, &e));
        }
    };
    let allowed = Allowed {
        source: Source::Llm,
        plane: Plane::Api,
        integration: Some(MODEL_CREDENTIAL),
        method,
        target: admission.target(),
        bytes_out: prepared.body.len() as u64,
    };
    // The key travels in a header only: nothing in the URL to redact.
    match sidecar.egress.begin(&allowed, &Redactor::none()) {
        Ok(mut flight) => {
            flight.step(guard, |s| &mut s.guard);
            Ok(Admitted {
                prepared,
                admission,
                flight,
                hold,
            })
        }
        Err(e) => {
            if let Some(h) = hold {
                h.release();
            }
            Err(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "upstream_error",
                e.code(),
                e.to_string(),
            ))
        }
    }
}

/// The request body, whole, if it is within `limit` bytes (else 413).
async fn read_body(body: axum::body::Body, limit: usize) -> Result<Bytes, Response> {
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
    Ok(body)
}

/// Records the guard's refusal of `url` (an egress record of source `llm`)
/// and answers the agent with it.
fn refused(sidecar: &Sidecar, method: &str, url: &str, e: &EgressError) -> Response {
    let refused = Refused {
        source: Source::Llm,
        plane: Plane::Api,
        integration: Some(MODEL_CREDENTIAL),
        method,
        url,
    };
    sidecar.egress.refused(&refused, e, &Redactor::none());
    egress_error(e)
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
    if let Some((what, e)) = up.fetch.refused_tool(&asks) {
        return Err(refused(sidecar, method, &what, &e));
    }
    let rules = CallRules {
        authorized: &up.fetch.uris,
        allow_all_uris: false,
        credentialed: false,
    };
    for (url, what) in provider_fetch::urls(&asks) {
        // The provider fetches the URL: a GET, whatever the model call is.
        if let Err(e) = sidecar
            .client
            .admit_secret_free(url, &http::Method::GET, &rules)
            .await
        {
            tracing::info!(%url, what, "a model request's provider fetch refused: {}", e.operator_message());
            return Err(refused(sidecar, method, url, &e));
        }
    }
    Ok(())
}

/// Sends the admitted call with `key`; a provider that refuses the key
/// (401 or 403) makes the relay forget it.
async fn send(
    llm: &Llm,
    admission: Admission,
    out: OutboundRequest,
    key: &SecretString,
) -> Result<StreamingResponse, EgressError> {
    let resp = llm
        .sidecar
        .client
        .send_streaming_admitted(admission, out)
        .await?;
    if matches!(resp.status.as_u16(), 401 | 403) {
        llm.key.forget(key);
    }
    Ok(resp)
}

/// Whether the provider's answer is content-encoded (the relay asks for
/// `identity`; an encoded answer cannot be metered).
fn content_encoded(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.eq_ignore_ascii_case("identity"))
}

/// How an answer is metered: not at all (not a metered call's success, or
/// content-encoded: then it is recorded as unmetered), as a stream of
/// events, or as one JSON document.
fn mode_of(headers: &HeaderMap, metered: bool, encoded: bool, drop_usage_chunk: bool) -> Mode {
    if !metered || encoded {
        if metered {
            tracing::warn!(
                "model relay: the provider sent an encoded answer; it is recorded as unmetered"
            );
        }
        return Mode::Plain;
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if content_type.starts_with("text/event-stream") {
        Mode::Sse {
            splitter: SseSplitter::default(),
            drop_usage_chunk,
        }
    } else {
        Mode::Json(Box::default())
    }
}

/// What an answer is to: the call's upstream and endpoint, its prepared
/// body (the model and usage asked for) and the model key's redactor.
struct Call<'a> {
    up: &'a Upstream,
    endpoint: Endpoint,
    prepared: Prepared,
    redactor: Redactor,
}

/// The agent's answer: the provider's status and safe headers, and a body
/// metered and redacted as it passes, which completes the call's egress
/// record (and keeps its cost event) when it ends. An answer the redactor
/// cannot read (content-encoded) is withheld.
fn answer(
    sidecar: &Arc<Sidecar>,
    call: Call<'_>,
    resp: StreamingResponse,
    (flight, hold): (InFlight, Option<Hold>),
) -> Response {
    let Call {
        up,
        endpoint,
        prepared,
        redactor,
    } = call;
    let encoded = content_encoded(&resp.headers);
    let metered = matches!(endpoint, Endpoint::Metered { .. }) && resp.status.is_success();
    let mode = mode_of(&resp.headers, metered, encoded, prepared.drop_usage_chunk);
    let price = up.price_for(prepared.model.as_deref());
    let cost = metered.then_some(CostDraft {
        provider: up.provider,
        model: prepared.model,
        price_in: price.input,
        price_out: price.output,
        readable: !encoded,
    });
    let withheld = if redactor.is_empty() {
        None
    } else {
        unreadable_coding(&resp.headers)
    };
    let headers = safe_response_headers(&resp.headers);
    let streamed = matches!(mode, Mode::Sse { .. });
    let mut relay = Relay {
        inner: resp.body,
        passage: Passage::new(mode, redactor),
        sidecar: sidecar.clone(),
        flight: Some(flight),
        status: resp.status.as_u16(),
        cost,
        hold,
    };
    if let Some(coding) = withheld {
        relay.finish(End::Withheld);
        return error(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "unredactable_response",
            format!(
                "the model provider answered with a body encoded as {coding:?} although the relay \
                 asked for identity; an encoded answer cannot be checked for the model key, so it \
                 is withheld"
            ),
        );
    }
    let mut builder = Response::builder().status(resp.status);
    if let Some(h) = builder.headers_mut() {
        *h = if relay.passage.redacts() {
            relay.passage.redactor().headers(&headers)
        } else {
            headers
        };
        if relay.passage.reshapes() {
            h.remove(header::CONTENT_LENGTH);
        }
    }
    let body = RelayBody::new(relay, sidecar.egress.stop_requested());
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

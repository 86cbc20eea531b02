//! The intercepting proxy (`inject = "proxy"`): an agent's unmodified tools
//! (curl, git over HTTPS, an SDK) use a connection's credential by sending
//! its non-secret placeholder (`AIRLOCK_PLACEHOLDER_<NS>`), and the upstream
//! receives the credential.
//!
//! When the run has such an integration, a `CONNECT` whose client then
//! speaks TLS is terminated here with a certificate for the CONNECT host,
//! signed by the run's own CA (made by the platform for this run; the
//! sandbox trusts its certificate and never holds its key). Each request
//! inside is then one decision, as an `api_call` is:
//! - its URL is `https://<the CONNECT authority><path>` (the `Host` header
//!   is ignored: it cannot front another host);
//! - if an `inject = "proxy"` integration's `authorized_uris` cover it under
//!   the credential rules, that integration's placeholder in a header value
//!   (also inside `Authorization: Basic`) is replaced by the credential's
//!   delivery field, fetched for this request; the answer is read whole,
//!   redacted of the credential and never compressed;
//! - otherwise it goes out under the run's network policy exactly as the
//!   client sent it: a placeholder stays a placeholder;
//! - either way it is admitted by the guard (resolve-and-pin), recorded in
//!   the egress log (source `proxy`, with the integration whose credential
//!   it carried), and re-encrypted upstream with the real certificate
//!   checked. Redirects are the client's: each next hop is a new request.
//!
//! A client that does not speak TLS after its CONNECT gets the plain tunnel,
//! under the network policy, as without interception.
//!
//! A local MCP runner's own listener ([`Scope::Runner`]) is intercepted the
//! same way, with its integration as the only candidate and its
//! `authorized_uris` instead of the network policy for everything else: a
//! runner holds only its placeholder, never the credential.

use std::sync::{Arc, Mutex};

use airlock_egress::{
    Admission, CallRules, EgressError, OutboundRequest, StreamingBody, StreamingResponse, Target,
};
use airlock_platform_api::wire::EgressOutcome;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use secrecy::ExposeSecret;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{
    Caller, Counted, Meter, ProxyBody, ProxySettings, ProxyStream, json_response, relay,
    strip_hop_by_hop,
};
use crate::credential::REDACT_HOLD;
use crate::credential::deliver::{Substituted, substitute};
use crate::credential::fetch::{self, CredentialError, Fetched};
use crate::credential::{Redactor, StreamRedactor};
use crate::egress::{InFlight, Outcome};
use crate::interception::Injectable;
use crate::state::Sidecar;
use airlock_platform_api::wire::CredentialFields;

/// Serves a CONNECT of a listener that intercepts: answers 200, then
/// terminates TLS, or relays a tunnel that is not TLS under the listener's
/// rules.
pub(super) async fn serve<S: ProxyStream>(
    mut client: S,
    early: Bytes,
    authority: Target,
    method: String,
    sidecar: Arc<Sidecar>,
    settings: ProxySettings,
    caller: Caller,
) {
    let Some(icpt) = sidecar.interceptor.as_ref() else {
        return;
    };
    if client.write_all(super::CONNECTED).await.is_err() {
        return;
    }
    let mut first = early.to_vec();
    if first.is_empty() {
        let mut b = vec![0u8; 4096];
        match tokio::time::timeout(settings.head_timeout, client.read(&mut b)).await {
            Ok(Ok(n)) if n > 0 => first.extend_from_slice(&b[..n]),
            _ => return,
        }
    }
    let prefix = Bytes::from(first);
    if prefix.first() != Some(&0x16) {
        // Not a TLS handshake: the plain tunnel, as without interception.
        plain_tunnel(client, prefix, authority, method, sidecar, settings, caller).await;
        return;
    }
    let host = authority.host().bare();
    let config = match icpt.server_config(&host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(host = %host, "intercepting proxy: {e}");
            return;
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let tls = match tokio::time::timeout(
        settings.head_timeout,
        acceptor.accept(relay::Rewind::new(prefix, client)),
    )
    .await
    {
        Ok(Ok(t)) => t,
        // The client does not trust the run's CA, or went away.
        _ => return,
    };
    let authority = Arc::new(authority);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let sidecar = sidecar.clone();
        let authority = authority.clone();
        let settings = settings.clone();
        let caller = caller.clone();
        async move {
            Ok::<_, std::convert::Infallible>(
                handle(req, &authority, &sidecar, &settings, &caller).await,
            )
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

/// A CONNECT whose client did not speak TLS: judged under the listener's
/// rules after the 200 (a refusal closes the connection and is recorded).
async fn plain_tunnel<S: ProxyStream>(
    client: S,
    prefix: Bytes,
    authority: Target,
    method: String,
    sidecar: Arc<Sidecar>,
    settings: ProxySettings,
    caller: Caller,
) {
    // Already answered 200: a refusal (recorded) can only close it.
    let changes = sidecar.policy.changes();
    let Ok((_, flight, upstream)) =
        super::admit_uncredentialed(&sidecar, &caller, &authority, &method, &settings).await
    else {
        return;
    };
    let revoked = super::revoked(&sidecar, &caller.scope, &authority, changes);
    super::tunnel(client, upstream, prefix, flight, &settings, true, revoked).await;
}

fn refusal(e: &EgressError) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::FORBIDDEN);
    super::body_response(status, super::refusal_body(e))
}

/// One request inside an intercepted tunnel: its target and body, the
/// credential it may carry ([`inject`]), the guard's decision and its
/// egress record, then the upstream's answer ([`send`], [`answer`]).
async fn handle(
    req: Request<Incoming>,
    authority: &Target,
    sidecar: &Arc<Sidecar>,
    settings: &ProxySettings,
    caller: &Caller,
) -> Response<ProxyBody> {
    let Some(icpt) = sidecar.interceptor.as_ref() else {
        return json_response(StatusCode::BAD_GATEWAY, "bad_gateway", "not intercepting");
    };
    let target = match target_in_tunnel(&req, authority) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    let method = req.method().clone();
    let (parts, body) = req.into_parts();
    let body = match read_body(body, sidecar.limits.max_request_bytes).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let mut headers: HeaderMap = parts.headers;
    strip_hop_by_hop(&mut headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);

    // Whose credential it may carry, and whether it asks for it.
    let injectable = icpt.injectable_for(
        sidecar.client.guard().policy(),
        caller.scope.runner(),
        &target,
        &method,
    );
    let injected = match injectable.filter(|inj| inj.carries) {
        Some(inj) => match inject(sidecar, inj, &mut headers).await {
            Ok(i) => i,
            Err(r) => return *r,
        },
        None => Injected::default(),
    };
    // A request the integration covers is allowed by it, and carries the
    // credential only where its placeholder asked for it.
    let rules = match injectable {
        Some(inj) => CallRules {
            authorized: &inj.authorized,
            allow_all_uris: false,
            credentialed: injected.carried.is_some(),
        },
        None => caller.scope.rules(sidecar),
    };
    let redactor = &injected.redactor;
    let decided = match sidecar
        .client
        .admit(target.url().as_str(), &method, &rules)
        .await
    {
        Ok(a) => approved(sidecar, caller, a, &method, &target, injectable).await,
        Err(e) => Err(e),
    };
    let admission = match decided {
        Ok(a) => a,
        Err(e) => {
            let what = caller.refused(injected.carried, method.as_str(), target.url().as_str());
            sidecar.egress.refused(&what, &e, redactor);
            return refusal(&e);
        }
    };
    let bytes_out = body.len() as u64;
    let allowed = caller.allowed(
        injected.carried,
        method.as_str(),
        admission.target(),
        bytes_out,
    );
    let mut flight = match sidecar
        .egress
        .begin_as(&allowed, redactor, Some(EgressOutcome::NotSent))
    {
        Ok(f) => f,
        Err(e) => {
            return json_response(StatusCode::SERVICE_UNAVAILABLE, e.code(), &e.to_string());
        }
    };
    flight.will_send();
    let out = OutboundRequest {
        method,
        url: target.url().to_string(),
        headers,
        body,
        credential_headers: injected.credential_headers,
    };
    match send(sidecar, settings, admission, out, &target, redactor).await {
        Ok(resp) => answer(resp, flight, bytes_out, redactor),
        Err(e) => {
            flight.complete(Outcome::of_error(&e).bytes_out(bytes_out));
            refusal(&e)
        }
    }
}

/// The admission released once a person allowed it, when an `ask` rule
/// holds it. The person is told the method and the host and path of the
/// client's target (the credential goes into headers only, never into it).
async fn approved(
    sidecar: &Sidecar,
    caller: &Caller,
    admission: Admission,
    method: &http::Method,
    target: &Target,
    injectable: Option<&crate::interception::Injectable>,
) -> Result<Admission, EgressError> {
    let Some(hold) = admission.hold() else {
        return Ok(admission);
    };
    let integration = caller
        .scope
        .integration(injectable.map(|i| i.namespace.as_str()));
    let what = crate::approval::describe(method, target, integration);
    sidecar
        .approvals
        .pass(&sidecar.platform, hold, what)
        .await?;
    Ok(admission.release())
}

/// The URL of a request inside a tunnel: `https://<the CONNECT
/// authority><path>` (the `Host` header is ignored: it cannot front
/// another host). A request that names a URL instead of a path is a 400.
fn target_in_tunnel(
    req: &Request<Incoming>,
    authority: &Target,
) -> Result<Target, Box<Response<ProxyBody>>> {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "/".into());
    if !path.starts_with('/') {
        return Err(Box::new(json_response(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "inside a tunnel a request names a path, not a URL",
        )));
    }
    let url = format!("https://{}{path}", authority.authority());
    Target::parse(&url).map_err(|e| Box::new(refusal(&e)))
}

/// The request body, whole, if it is within `limit` bytes (else 413).
async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, Box<Response<ProxyBody>>> {
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(_) => Err(Box::new(json_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            &format!("request body exceeds the {limit}-byte limit"),
        ))),
    }
}

/// What [`inject`] did to a request.
#[derive(Default)]
struct Injected<'a> {
    /// The integration whose credential it carries (its placeholder asked
    /// for it).
    carried: Option<&'a str>,
    /// The headers the credential was put in.
    credential_headers: Vec<HeaderName>,
    /// What every answer from what the integration covers is redacted of.
    redactor: Redactor,
}

/// Fetches the credential of `inj`, which covers the request, and puts it
/// where the request's headers carry its placeholder. Every answer from
/// what an integration with a credential covers is redacted of it, whether
/// or not this request carried it: an upstream may hand back later what an
/// earlier request stored (a stored reflection). A request that does not
/// carry it fetches it only when the run's last fetch of it is older than
/// [`REDACT_HOLD`].
async fn inject<'a>(
    sidecar: &Sidecar,
    inj: &'a Injectable,
    headers: &mut HeaderMap,
) -> Result<Injected<'a>, Box<Response<ProxyBody>>> {
    let asks = headers.values().any(|v| {
        v.to_str().is_ok_and(|t| t.contains(&inj.placeholder))
            || substitute(v, &inj.placeholder, "x").is_some()
    });
    // A request that does not carry the credential is redacted with the
    // values of a fetch less than REDACT_HOLD old, if there is one.
    let held = if asks {
        None
    } else {
        sidecar.credentials.recent(&inj.namespace, REDACT_HOLD)
    };
    let (fields, redactor) = match held {
        Some(redactor) => (CredentialFields::default(), redactor),
        None => match fetch::fetch(&sidecar.platform, &sidecar.credentials, &inj.namespace).await {
            Ok(Fetched { fields, redactor }) => (fields, redactor),
            Err(e) => {
                return Err(Box::new(json_response(
                    StatusCode::BAD_GATEWAY,
                    CredentialError::CODE,
                    &e.to_string(),
                )));
            }
        },
    };
    let mut injected = Injected {
        redactor,
        ..Injected::default()
    };
    if asks {
        let field = sidecar
            .integrations
            .get(&inj.namespace)
            .and_then(|i| i.delivery.as_ref())
            .map(|d| d.credential_field().to_owned())
            .unwrap_or_default();
        let Some(secret) = fields.get(&field) else {
            return Err(Box::new(json_response(
                StatusCode::BAD_GATEWAY,
                "credential_field_missing",
                &format!("the connection's credential has no field {field:?}"),
            )));
        };
        injected.credential_headers =
            replace_placeholder(headers, &inj.placeholder, secret.expose_secret());
        injected.carried = Some(&inj.namespace);
    }
    // Only an answer the sidecar can read is redacted.
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    Ok(injected)
}

/// Replaces `placeholder` with `secret` in every header value that holds
/// it (also inside `Authorization: Basic`); the names of the headers
/// changed.
fn replace_placeholder(
    headers: &mut HeaderMap,
    placeholder: &str,
    secret: &str,
) -> Vec<HeaderName> {
    let mut changed_names = Vec::new();
    let names: Vec<HeaderName> = headers.keys().cloned().collect();
    for name in names {
        let values: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
        let mut changed = false;
        // (A `Basic` value made here is the credential in base64, which
        // the redactor finds.)
        let replaced: Vec<HeaderValue> = values
            .iter()
            .map(|v| match substitute(v, placeholder, secret) {
                Some(Substituted { value, .. }) => {
                    changed = true;
                    value
                }
                None => v.clone(),
            })
            .collect();
        if changed {
            headers.remove(&name);
            for v in replaced {
                headers.append(name.clone(), v);
            }
            changed_names.push(name);
        }
    }
    changed_names
}

/// Sends the admitted request: the upstream's answer head within the
/// response timeout, or why not (an upstream's detail redacted).
async fn send(
    sidecar: &Sidecar,
    settings: &ProxySettings,
    admission: Admission,
    out: OutboundRequest,
    target: &Target,
    redactor: &Redactor,
) -> Result<StreamingResponse, EgressError> {
    match tokio::time::timeout(
        settings.response_timeout,
        sidecar.client.send_streaming_admitted(admission, out),
    )
    .await
    {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(mut e)) => {
            e.detail = redactor.str(&e.detail);
            Err(e)
        }
        Err(_) => Err(EgressError::upstream(
            &target.host().bare(),
            format!("no response head within {:?}", settings.response_timeout),
        )),
    }
}

/// The agent's answer: the upstream's, its bytes counted into the egress
/// record. Covered by an integration with a credential, an answer that
/// cannot be searched is withheld, and the rest streams through the
/// redactor ([`redacted`]).
fn answer(
    resp: StreamingResponse,
    flight: InFlight,
    bytes_out: u64,
    redactor: &Redactor,
) -> Response<ProxyBody> {
    let status = resp.status;
    let mut resp_headers = resp.headers.clone();
    strip_hop_by_hop(&mut resp_headers);
    if !redactor.is_empty()
        && let Some(coding) = crate::credential::unreadable_coding(&resp.headers)
    {
        flight.complete(Outcome {
            kind: Some(EgressOutcome::Withheld),
            ..Outcome::completed(status.as_u16()).bytes_out(bytes_out)
        });
        return json_response(
            StatusCode::BAD_GATEWAY,
            "unredactable_response",
            &format!(
                "the upstream answered with a body encoded as {coding:?}; an encoded answer cannot \
                 be checked for the credential, so it is withheld"
            ),
        );
    }
    let meter = Arc::new(Meter {
        progress: flight.progress().clone(),
        flight: Mutex::new(Some(flight)),
        status: Mutex::new(Some(status.as_u16())),
    });
    meter
        .progress
        .bytes_out
        .store(bytes_out, std::sync::atomic::Ordering::Relaxed);
    let counted = Counted {
        inner: resp.body,
        meter,
        inbound: true,
    };
    if redactor.is_empty() {
        // Nothing of the sidecar's to redact: the answer streams through.
        let mut r = Response::new(counted.boxed());
        *r.status_mut() = status;
        *r.headers_mut() = resp_headers;
        return r;
    }
    redacted(counted, status, &resp_headers, redactor)
}

/// An answer let through the redactor: its headers redacted (a value that
/// is not text is dropped, and so is the length), its body as it streams.
fn redacted(
    counted: Counted<StreamingBody>,
    status: StatusCode,
    headers: &HeaderMap,
    redactor: &Redactor,
) -> Response<ProxyBody> {
    let clean = redactor.headers(headers);
    let body = Redacting {
        inner: counted,
        stream: redactor.stream(),
        unflushed: 0,
        done: false,
    };
    let mut r = Response::new(body.boxed());
    *r.status_mut() = status;
    *r.headers_mut() = clean;
    r
}

/// An answer's body let through a [`StreamRedactor`]: a credential split
/// across its chunks is found all the same.
///
/// The chunks the upstream has ready are fed to the redactor together (up
/// to [`BATCH`] bytes) and searched once, when the upstream has no more
/// ready or the batch is full: a fast download is searched in large
/// pieces, and nothing waits on data that has not come (what is fed goes
/// out, as far as the redactor lets it, before the body reports pending).
struct Redacting<B> {
    inner: B,
    stream: StreamRedactor,
    /// Bytes fed since the last flush.
    unflushed: usize,
    done: bool,
}

/// The most bytes of an answer fed to the redactor between two searches:
/// what one answer holds in memory beyond the redactor's kept-back bytes.
const BATCH: usize = 256 * 1024;

impl<B> Redacting<B> {
    /// What the redactor lets out of what was fed, as a frame, if anything.
    fn flushed(&mut self) -> Option<hyper::body::Frame<Bytes>> {
        self.unflushed = 0;
        let out = self.stream.flush();
        (!out.is_empty()).then(|| hyper::body::Frame::data(Bytes::from(out)))
    }
}

impl<B> hyper::body::Body for Redacting<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
                // The inner body will wake this task: what was fed goes out
                // now.
                Poll::Pending => {
                    if self.unflushed > 0
                        && let Some(frame) = self.flushed()
                    {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    return Poll::Pending;
                }
                // Trailers are not passed on (they could carry it too).
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.stream.feed(&data);
                        self.unflushed += data.len();
                        if self.unflushed >= BATCH
                            && let Some(frame) = self.flushed()
                        {
                            return Poll::Ready(Some(Ok(frame)));
                        }
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    self.done = true;
                    let out = self.stream.finish();
                    if out.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from(out)))));
                }
            }
        }
    }
}

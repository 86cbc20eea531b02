//! The forward proxy: `CONNECT host:port` tunnels and absolute-form
//! `GET http://host/path` requests, on the agent's proxy listener (`:8081`
//! or its unix socket) under the run's network policy, and on each local
//! MCP runner's own listener under its integration's `authorized_uris`
//! ([`Scope`]; docs/egress.md, docs/architecture.md).
//!
//! Every request:
//! 1. its head is read (bounded in size and time) and validated by the strict
//!    parser in [`head`] (smuggling shapes are a 400 before anything else);
//! 2. must carry the listener's token in `Proxy-Authorization` (else 407):
//!    the sidecar token, or the runner's own;
//! 3. its destination goes through the egress guard: a CONNECT authority via
//!    [`Target::from_authority`] (the raw authority never reaches a resolver),
//!    an absolute URL via [`Target::parse`], then [`Guard::admit`] with the
//!    listener's rules ([`Scope::rules`]), uncredentialed: the run's network
//!    policy (`public` is any destination that passes the guard, `none`
//!    nothing, a list its patterns), or a runner's `authorized_uris`;
//! 4. is recorded in the egress log (before it is dialled), then dialled
//!    only at an address the guard returned (resolve-and-pin), never at the
//!    sidecar's own listeners (a guard step shared by every egress site),
//!    directly or through `PROXY_URL`.
//!
//! No credential is injected here; the token headers never travel upstream.
//! Each connection serves one request (responses say `Connection: close`):
//! every request head on the wire is therefore one this module parsed.
//! Every decision lands in the run's egress log (source `proxy`), tunnels
//! with their byte counts and duration when they close.

pub mod head;
use airlock_tunnel as relay;
mod intercept;
pub mod transparent;
mod upstream;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_egress::{Admitted, CallRules, EgressCode, EgressError, GuardStep, Intent, Target};
use airlock_platform_api::wire::EgressOutcome;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use self::head::{HeadError, RequestHead, RequestTarget};
use crate::auth;
use crate::credential::Redactor;
use crate::egress::{Allowed, InFlight, Outcome, Plane, Progress, Refused, Source};
use crate::state::Sidecar;

pub use self::head::{MAX_HEAD_BYTES, parse_head};

/// Per-address TCP connect timeout (and the `PROXY_URL` handshake's).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send its whole request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Relay buffer per direction.
const RELAY_BUF: usize = 64 * 1024;

/// The proxy's timeouts. [`serve_connection`] takes them from the run's
/// limits; tests shorten them through [`serve_connection_with`].
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// A tunnel with no bytes either way for this long is closed.
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
    pub head_timeout: Duration,
    /// Wait for an upstream response head (absolute-form requests).
    pub response_timeout: Duration,
}

impl ProxySettings {
    pub fn from_sidecar(sidecar: &Sidecar) -> Self {
        ProxySettings {
            idle_timeout: Duration::from_secs(sidecar.limits.proxy_idle_timeout_secs.max(1)),
            connect_timeout: CONNECT_TIMEOUT,
            head_timeout: HEAD_TIMEOUT,
            response_timeout: Duration::from_secs(sidecar.limits.upstream_timeout_secs.max(1)),
        }
    }
}

/// A stream the proxy listeners accept.
pub trait ProxyStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The socket, when a tunnel can splice it.
    fn splice_socket(&self) -> Option<relay::SpliceSocket<'_>> {
        None
    }
}

impl ProxyStream for TcpStream {
    fn splice_socket(&self) -> Option<relay::SpliceSocket<'_>> {
        Some(relay::SpliceSocket::Tcp(self))
    }
}
impl ProxyStream for tokio::net::UnixStream {
    fn splice_socket(&self) -> Option<relay::SpliceSocket<'_>> {
        Some(relay::SpliceSocket::Unix(self))
    }
}
impl ProxyStream for tokio::io::DuplexStream {}

/// Whose proxy listener a connection came in on, which decides what it may
/// reach without a credential, the token it must present, and whose
/// credentials interception may put into its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The agent's proxy: the run's `[network] egress`, and interception
    /// for the integrations with `inject = "proxy"`.
    Agent,
    /// A local MCP runner's proxy (`source.kind = "local"`): only the
    /// destinations its integration's `authorized_uris` cover, and its own
    /// placeholder replaced by its connection's credential.
    Runner(Arc<str>),
}

/// Nothing: what an unknown runner may reach.
static NOWHERE: std::sync::LazyLock<airlock_egress::AuthorizedUris> =
    std::sync::LazyLock::new(airlock_egress::AuthorizedUris::default);

impl Scope {
    /// The local runner whose listener this is; `None`: the agent's.
    pub(crate) fn runner(&self) -> Option<&str> {
        match self {
            Scope::Agent => None,
            Scope::Runner(ns) => Some(ns),
        }
    }

    /// The rules of a request that carries no credential from this listener.
    pub(crate) fn rules<'s>(&self, sidecar: &'s Sidecar) -> CallRules<'s> {
        let (authorized, allow_all_uris) = match self {
            Scope::Agent => (&sidecar.network.0, sidecar.network.1),
            Scope::Runner(ns) => match sidecar.runner_network.get(ns.as_ref()) {
                Some((a, all)) => (a, *all),
                None => (&*NOWHERE, false),
            },
        };
        CallRules {
            authorized,
            allow_all_uris,
            credentialed: false,
        }
    }

    /// Whether a CONNECT to `target` may open at all: on a runner's
    /// listener only to an authority that some `authorized_uris` entry
    /// covers (each request inside is then judged whole). The agent's
    /// tunnels are judged by [`admit_uncredentialed`] or per request.
    fn may_tunnel_to(&self, sidecar: &Sidecar, target: &Target) -> Result<(), EgressError> {
        let Scope::Runner(_) = self else {
            return Ok(());
        };
        let rules = self.rules(sidecar);
        if rules.allow_all_uris || rules.authorized.covers_authority(target) {
            return Ok(());
        }
        Err(EgressError::new(
            EgressCode::NotAuthorized,
            GuardStep::AuthorizedUris,
            Some(&target.host().bare()),
            format!(
                "{} is not covered by the runner's authorized_uris",
                target.authority()
            ),
        ))
    }

    /// The token a client of this listener presents.
    fn token<'s>(&self, sidecar: &'s Sidecar) -> Option<&'s secrecy::SecretString> {
        match self {
            Scope::Agent => Some(&sidecar.token),
            Scope::Runner(ns) => sidecar
                .integrations
                .get(ns.as_ref())
                .and_then(|i| i.runner.as_ref())
                .map(|r| &r.token),
        }
    }

    /// How its requests are recorded: the source, and the integration
    /// (a runner's own; on the agent's, whose credential it carried).
    pub(crate) fn source(&self) -> Source {
        match self {
            Scope::Agent => Source::Proxy,
            Scope::Runner(_) => Source::Runner,
        }
    }

    pub(crate) fn integration<'a>(&'a self, carried: Option<&'a str>) -> Option<&'a str> {
        match self {
            Scope::Agent => carried,
            Scope::Runner(ns) => Some(ns),
        }
    }
}

/// Who a connection is from (its listener's [`Scope`]) and the plane that
/// carried it ([`Plane::Proxy`], or [`Plane::Transparent`] for the
/// transparent plane's CONNECT): what its egress records say of it.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) scope: Scope,
    pub(crate) plane: Plane,
}

impl Caller {
    /// A refusal of a request from this caller (`carried`: the integration
    /// whose credential interception put into it).
    pub(crate) fn refused<'a>(
        &'a self,
        carried: Option<&'a str>,
        method: &'a str,
        url: &'a str,
    ) -> Refused<'a> {
        Refused {
            source: self.scope.source(),
            plane: self.plane,
            integration: self.scope.integration(carried),
            method,
            url,
        }
    }

    /// An allowed request from this caller.
    pub(crate) fn allowed<'a>(
        &'a self,
        carried: Option<&'a str>,
        method: &'a str,
        target: &'a Target,
        bytes_out: u64,
    ) -> Allowed<'a> {
        Allowed {
            source: self.scope.source(),
            plane: self.plane,
            integration: self.scope.integration(carried),
            method,
            target,
            bytes_out,
        }
    }
}

/// Serves the proxy on an accepted stream (one request per connection).
pub async fn serve_connection<S: ProxyStream>(stream: S, sidecar: Arc<Sidecar>, scope: Scope) {
    let settings = ProxySettings::from_sidecar(&sidecar);
    serve_connection_with(stream, sidecar, settings, scope).await
}

/// The request's head, read within the head timeout and validated; or
/// `None`, once what went wrong is answered (nothing is answered to a
/// client that closed before a full head).
async fn head_or_answer<S: ProxyStream>(
    stream: &mut S,
    settings: &ProxySettings,
) -> Option<(RequestHead, BytesMut)> {
    match tokio::time::timeout(settings.head_timeout, read_head(stream)).await {
        Ok(Ok(Some(v))) => Some(v),
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
            let _ = respond(
                stream,
                status,
                &[],
                &error_body("bad_request", &e.to_string()),
            )
            .await;
            None
        }
        Err(_) => {
            let _ = respond(
                stream,
                StatusCode::REQUEST_TIMEOUT,
                &[],
                &error_body("request_timeout", "request head not received in time"),
            )
            .await;
            None
        }
    }
}

/// Whether the request carries the listener's token; if not, it is
/// answered 407 (no body beyond the fixed error: nothing of the request is
/// echoed).
async fn authorized_or_answer<S: ProxyStream>(
    stream: &mut S,
    sidecar: &Sidecar,
    scope: &Scope,
    head: &RequestHead,
) -> bool {
    if scope
        .token(sidecar)
        .is_some_and(|t| auth::is_proxy_authorized(&head.headers, t))
    {
        return true;
    }
    let _ = respond(
        stream,
        StatusCode::PROXY_AUTHENTICATION_REQUIRED,
        &[("Proxy-Authenticate", "Basic realm=\"airlock\"")],
        &error_body(
            "proxy_authentication_required",
            "the sidecar token is required in Proxy-Authorization",
        ),
    )
    .await;
    false
}

/// [`serve_connection`] with explicit timeouts.
pub async fn serve_connection_with<S: ProxyStream>(
    mut stream: S,
    sidecar: Arc<Sidecar>,
    settings: ProxySettings,
    scope: Scope,
) {
    let Some((head, buf)) = head_or_answer(&mut stream, &settings).await else {
        return;
    };
    if !authorized_or_answer(&mut stream, &sidecar, &scope, &head).await {
        return;
    }
    let plane = match head.target {
        RequestTarget::Authority(_) if transparent::asked(&head) => Plane::Transparent,
        _ => Plane::Proxy,
    };
    let caller = Caller { scope, plane };
    let Some(request) =
        request_to_serve(&mut stream, &sidecar, &settings, &caller, head, buf).await
    else {
        return;
    };
    serve_request(stream, sidecar, settings, caller, request).await;
}

/// A request the proxy serves: its validated head, the bytes read (the
/// head's, then what followed), and its target.
struct ToServe {
    head: RequestHead,
    buf: BytesMut,
    target: Target,
}

/// The request to serve on a connection: the one its head asks for, or,
/// on the transparent plane, the client's own once it presents the name
/// its address was issued for ([`transparent::confirm`]): a TLS client's
/// tunnel under the plane's CONNECT, or a plain-HTTP client's request,
/// served as the forward proxy serves an absolute-form one (the CONNECT is
/// answered first; the client's request is answered as a proxy client's).
/// `None` once refused (recorded and answered) or gone.
async fn request_to_serve<S: ProxyStream>(
    stream: &mut S,
    sidecar: &Sidecar,
    settings: &ProxySettings,
    caller: &Caller,
    head: RequestHead,
    mut buf: BytesMut,
) -> Option<ToServe> {
    let method = head.method.to_string();
    let target = match target_of(&head) {
        Ok(t) => t,
        Err((e, url)) => {
            refuse(stream, sidecar, caller, &method, &url, &e).await;
            return None;
        }
    };
    if caller.plane != Plane::Transparent {
        return Some(ToServe { head, buf, target });
    }
    let confirmed =
        transparent::confirm(stream, &mut buf, head.len, &target, settings.head_timeout).await;
    match confirmed {
        Ok(Some(transparent::Speaks::Tls)) => Some(ToServe { head, buf, target }),
        Ok(Some(transparent::Speaks::Http)) => {
            let first = buf.get(head.len..).unwrap_or_default();
            let (head, buf) = match transparent::as_proxy_request(first, &target) {
                Ok(v) => v,
                Err(e) => {
                    let status =
                        StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
                    let body = error_body("bad_request", &e.to_string());
                    let _ = respond(stream, status, &[], &body).await;
                    return None;
                }
            };
            stream.write_all(CONNECTED).await.ok()?;
            let method = head.method.to_string();
            match target_of(&head) {
                Ok(target) => Some(ToServe { head, buf, target }),
                Err((e, url)) => {
                    refuse(stream, sidecar, caller, &method, &url, &e).await;
                    None
                }
            }
        }
        Ok(None) => None,
        Err(e) => {
            let url = target.url().as_str().to_owned();
            refuse(stream, sidecar, caller, &method, &url, &e).await;
            None
        }
    }
}

/// The answer that opens a tunnel.
pub(super) const CONNECTED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// Serves one request: a CONNECT's tunnel (through interception when the
/// listener intercepts its authority) or an absolute-form request, under
/// the guard's decision, recorded before the upstream is dialled.
async fn serve_request<S: ProxyStream>(
    mut stream: S,
    sidecar: Arc<Sidecar>,
    settings: ProxySettings,
    caller: Caller,
    request: ToServe,
) {
    let ToServe { head, buf, target } = request;
    let method = head.method.to_string();
    if let RequestTarget::Authority(_) = head.target
        && let Err(e) = caller.scope.may_tunnel_to(&sidecar, &target)
    {
        refuse(
            &mut stream,
            &sidecar,
            &caller,
            &method,
            target.url().as_str(),
            &e,
        )
        .await;
        return;
    }
    if sidecar
        .interceptor
        .as_ref()
        .is_some_and(|i| i.serves(caller.scope.runner(), &target))
        && matches!(head.target, RequestTarget::Authority(_))
    {
        // Each request inside is judged on its own ([`intercept`]).
        let rest = buf.freeze().slice(head.len..);
        intercept::serve(stream, rest, target, method, sidecar, settings, caller).await;
        return;
    }
    // Taken before the decision: a live change applied after it is judged
    // against the tunnel it admitted.
    let changes = sidecar.policy.changes();
    let (admitted, flight, upstream) =
        match admit_uncredentialed(&sidecar, &caller, &target, &method, &settings).await {
            Ok(v) => v,
            Err(denied) => {
                let (status, body) = denied.answer();
                let _ = respond(&mut stream, status, &[], &body).await;
                return;
            }
        };
    let rest = buf.freeze().slice(head.len..);
    let stop = sidecar.egress.stop_requested();
    // A stopping sidecar asks for the end: the record then says `aborted`
    // (the flight completes itself when dropped) with the bytes counted so far.
    match head.target {
        RequestTarget::Authority(_) => {
            tokio::select! {
                _ = tunnel(stream, upstream, rest, flight, &settings, false,
                    revoked(&sidecar, &caller.scope, &target, changes)) => {}
                _ = stop => {}
            }
        }
        RequestTarget::Absolute(_) => {
            tokio::select! {
                _ = forward(stream, upstream, rest, head, admitted, flight, &settings) => {}
                _ = stop => {}
            }
        }
    }
}

/// Why a proxy destination was not connected. Each is already in the
/// egress log when returned (a refusal recorded, a failed dial completed).
enum Denied {
    /// The guard refused it under the run's network policy.
    Refused(EgressError),
    /// Its record could not be kept, so it was not dialled.
    Unrecorded(crate::egress::RecordError),
    /// The dial failed.
    Dial(EgressError),
}

impl Denied {
    /// The status and body a client that can still be answered gets.
    fn answer(&self) -> (StatusCode, String) {
        match self {
            Denied::Refused(e) => (
                StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::FORBIDDEN),
                refusal_body(e),
            ),
            Denied::Unrecorded(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                error_body(e.code(), &e.to_string()),
            ),
            Denied::Dial(e) => (
                StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_GATEWAY),
                refusal_body(e),
            ),
        }
    }
}

/// The proxy's one decision on a destination that carries no credential
/// (a CONNECT, an absolute-form request, a tunnel that does not speak TLS
/// under interception): the guard under the listener's rules
/// ([`Scope::rules`]: the run's network policy, or a runner's
/// `authorized_uris`), the record before the dial, the dial at a pinned
/// address.
async fn admit_uncredentialed(
    sidecar: &Sidecar,
    caller: &Caller,
    target: &Target,
    method: &str,
    settings: &ProxySettings,
) -> Result<(Admitted, InFlight, TcpStream), Denied> {
    let rules = caller.scope.rules(sidecar);
    // A CONNECT is a tunnel the guard does not see into; any other request
    // is judged with its method.
    let request_method = http::Method::from_bytes(method.as_bytes()).ok();
    let intent = match &request_method {
        Some(m) if *m != http::Method::CONNECT => Intent::Request(m),
        _ => Intent::Tunnel,
    };
    let decided = match sidecar.client.guard().admit(target, intent, &rules).await {
        Ok(a) => held(sidecar, caller, a, request_method.as_ref()).await,
        Err(e) => Err(e),
    };
    let admitted = match decided {
        Ok(a) => a,
        Err(e) => {
            let refused = caller.refused(None, method, target.url().as_str());
            sidecar.egress.refused(&refused, &e, &Redactor::none());
            return Err(Denied::Refused(e));
        }
    };
    let allowed = caller.allowed(None, method, &admitted.target, 0);
    // Recorded before the upstream is even dialled.
    let flight = sidecar
        .egress
        .begin(&allowed, &Redactor::none())
        .map_err(Denied::Unrecorded)?;
    match upstream::dial(sidecar, &admitted, settings).await {
        Ok(u) => Ok((admitted, flight, u)),
        Err(e) => {
            flight.complete(Outcome::of_error(&e));
            Err(Denied::Dial(e))
        }
    }
}

/// `admitted` once a person allowed it, when an `ask` rule holds it (a
/// request that carries no credential: its target is the client's own).
/// A tunnel is never held (an `ask` rule sees inside: its CONNECT is
/// intercepted or refused); its admission stays as it is.
async fn held(
    sidecar: &Sidecar,
    caller: &Caller,
    mut admitted: Admitted,
    method: Option<&http::Method>,
) -> Result<Admitted, EgressError> {
    let (Some(hold), Some(method)) = (&admitted.hold, method) else {
        return Ok(admitted);
    };
    let what = crate::approval::describe(method, &admitted.target, caller.scope.integration(None));
    sidecar
        .approvals
        .pass(&sidecar.platform, hold, what)
        .await?;
    admitted.hold = None;
    Ok(admitted)
}

/// The canonical target of the request, or the refusal and the target as
/// the client wrote it (for the egress log).
fn target_of(head: &RequestHead) -> Result<Target, (EgressError, String)> {
    match &head.target {
        RequestTarget::Authority(a) => {
            Target::from_authority(a).map_err(|e| (e, "<invalid authority>".to_owned()))
        }
        RequestTarget::Absolute(u) => {
            let t = Target::parse(u).map_err(|e| (e, u.clone()))?;
            if t.is_https() {
                return Err((
                    EgressError::invalid_url(
                        "https:// targets go through CONNECT, not absolute-form requests",
                    ),
                    u.clone(),
                ));
            }
            Ok(t)
        }
    }
}

/// Reads until a full head has arrived; `Ok(None)` if the peer closed first.
/// Scans only the newly arrived bytes for the terminator (no quadratic rescans).
async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
) -> Result<Option<(RequestHead, BytesMut)>, HeadError> {
    let mut buf = BytesMut::with_capacity(8 * 1024);
    loop {
        let old = buf.len();
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(8 * 1024);
        }
        let n = stream
            .read_buf(&mut buf)
            .await
            .map_err(|_| HeadError::Malformed("read error"))?;
        if n == 0 {
            return Ok(None);
        }
        let from = old.saturating_sub(3);
        let new = buf.get(from..).unwrap_or_default();
        let prev = if from == 0 {
            None
        } else {
            buf.get(from - 1).copied()
        };
        let bare_lf = std::iter::once(prev)
            .chain(new.iter().map(|&b| Some(b)))
            .zip(new.iter())
            .any(|(p, &b)| b == b'\n' && p != Some(b'\r'));
        let done = new.windows(4).any(|w| w == b"\r\n\r\n")
            || new.contains(&0)
            || bare_lf
            || buf.len() >= MAX_HEAD_BYTES;
        if done {
            return match parse_head(&buf)? {
                Some(h) => Ok(Some((h, buf))),
                None => Err(HeadError::Malformed("incomplete head")),
            };
        }
    }
}

fn error_body(code: &str, message: &str) -> String {
    serde_json::json!({"error": code, "message": message}).to_string()
}

/// The body of the guard's refusal `e`: its code and message and, for a
/// refusal by an L7 rule, `"rule": {"rule": id, "missing": …}`, as
/// `api_call` answers it (the message already says as much in words).
fn refusal_body(e: &EgressError) -> String {
    let mut body = serde_json::json!({"error": e.code.as_str(), "message": e.to_string()});
    if let Some(rule) = &e.rule
        && let Ok(rule) = serde_json::to_value(rule)
    {
        body["rule"] = rule;
    }
    body.to_string()
}

/// How much of what the client still sends after its answer is read, and
/// for how long, before the connection is dropped ([`respond`]).
const LINGER_BYTES: usize = 256 * 1024;
const LINGER_FOR: Duration = Duration::from_secs(2);

/// Writes a complete response and closes the write side, then reads what
/// the client still sends (a refused request's body), up to
/// [`LINGER_BYTES`] for at most [`LINGER_FOR`]: a socket closed with
/// unread bytes is reset, and a reset can reach the client before it has
/// read the answer, which it then never sees (a refusal seen as "closed
/// without response").
async fn respond<W: AsyncRead + AsyncWrite + Unpin>(
    w: &mut W,
    status: StatusCode,
    extra: &[(&str, &str)],
    body: &str,
) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error")
    );
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    w.write_all(out.as_bytes()).await?;
    w.flush().await?;
    w.shutdown().await?;
    let mut sink = [0u8; 8192];
    let mut read = 0;
    let _ = tokio::time::timeout(LINGER_FOR, async {
        while read < LINGER_BYTES {
            match w.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    })
    .await;
    Ok(())
}

async fn refuse<W: AsyncRead + AsyncWrite + Unpin>(
    w: &mut W,
    sidecar: &Sidecar,
    caller: &Caller,
    method: &str,
    url: &str,
    e: &EgressError,
) {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::FORBIDDEN);
    let refused = caller.refused(None, method, url);
    sidecar.egress.refused(&refused, e, &Redactor::none());
    let _ = respond(w, status, &[], &refusal_body(e)).await;
}

/// Resolves once a live policy change would refuse a plain tunnel to
/// `target` that the listener's rules admitted: a rule covering it must now
/// see inside, or its host was withdrawn. `changes` was taken before the
/// admission, so a change applied between the decision and this wait is
/// judged too. A change that leaves the tunnel admitted leaves it open.
pub(super) async fn revoked(
    sidecar: &Sidecar,
    scope: &Scope,
    target: &Target,
    mut changes: tokio::sync::watch::Receiver<u64>,
) -> airlock_egress::RuleRefusal {
    loop {
        if changes.changed().await.is_err() {
            return std::future::pending().await;
        }
        let rules = scope.rules(sidecar).authorized.rules();
        if let Err(refusal) = rules.judge(target, Intent::Tunnel) {
            return refusal;
        }
    }
}

/// A CONNECT: answer 200, then relay bytes until both sides close, the
/// tunnel is idle for `idle_timeout`, or `revoked` resolves (a live policy
/// change refuses it now: the tunnel is closed, its record says
/// `aborted`, refused by `rule_refused`).
async fn tunnel<S: ProxyStream>(
    mut client: S,
    mut upstream: TcpStream,
    early: Bytes,
    flight: InFlight,
    settings: &ProxySettings,
    answered: bool,
    revoked: impl std::future::Future<Output = airlock_egress::RuleRefusal>,
) {
    if !answered && client.write_all(CONNECTED).await.is_err() {
        flight.complete(Outcome::new(EgressOutcome::Aborted).status(Some(200)));
        return;
    }
    // Bytes the client sent right behind its CONNECT head (a TLS hello that
    // did not wait for our 200) belong to the tunnel.
    let mut early_out = 0;
    if !early.is_empty() {
        if upstream.write_all(&early).await.is_err() {
            flight.complete(Outcome::new(EgressOutcome::UpstreamFailed).status(Some(200)));
            return;
        }
        early_out = early.len() as u64;
        flight
            .progress()
            .bytes_out
            .store(early_out, Ordering::Relaxed);
    }
    let idle_timeout = settings.idle_timeout;
    let relayed = async move {
        let spliced = match client.splice_socket() {
            Some(c) => relay::relay_spliced(c, relay::SpliceSocket::Tcp(&upstream), idle_timeout)
                .await
                .ok(),
            None => None,
        };
        match spliced {
            Some(stats) => stats,
            None => relay::relay(client, upstream, idle_timeout, RELAY_BUF).await,
        }
    };
    // Revocation first: once a change is applied (before the sidecar
    // reports it), no later poll relays another byte of a refused tunnel.
    let stats = tokio::select! {
        biased;
        refusal = revoked => {
            tracing::info!(rule = %refusal.rule, "proxy tunnel closed: the live policy refuses it now ({refusal})");
            flight.complete(Outcome {
                refused: Some(EgressCode::RuleRefused),
                rule: Some(refusal),
                ..Outcome::new(EgressOutcome::Aborted).status(Some(200))
            });
            return;
        }
        stats = relayed => stats,
    };
    if stats.idle {
        tracing::info!(
            "proxy tunnel closed after {:?} without traffic",
            settings.idle_timeout
        );
    }
    flight.complete(
        Outcome::completed(200)
            .bytes_out(stats.client_to_upstream + early_out)
            .bytes_in(stats.upstream_to_client),
    );
}

type ProxyBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

fn json_response(status: StatusCode, code: &str, message: &str) -> Response<ProxyBody> {
    body_response(status, error_body(code, message))
}

/// A JSON answer of the proxy's own.
fn body_response(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), plus the
/// proxy's own and the framing headers hyper sets from the body.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    auth::SIDECAR_AUTH_HEADER,
];

/// Removes hop-by-hop headers and every header named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for h in HOP_BY_HOP {
        headers.remove(*h);
    }
    // Any other Proxy-* header is for this hop too.
    let proxy_named: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("proxy-"))
        .cloned()
        .collect();
    for n in proxy_named {
        headers.remove(n);
    }
}

/// Shared between the request and response bodies of one forwarded request;
/// completes the egress record once, when the response body is done or
/// dropped.
struct Meter {
    flight: Mutex<Option<InFlight>>,
    progress: Arc<Progress>,
    status: Mutex<Option<u16>>,
}

impl Meter {
    fn finish(&self, outcome: Option<Outcome>) {
        let Some(flight) = self.flight.lock().ok().and_then(|mut f| f.take()) else {
            return;
        };
        let status = self.status.lock().ok().and_then(|s| *s);
        flight.complete(outcome.unwrap_or_else(|| match status {
            Some(s) => Outcome::completed(s),
            None => Outcome::new(EgressOutcome::Aborted),
        }));
    }
}

/// Counts the data bytes of a body; the response side records on drop.
struct Counted<B> {
    inner: B,
    meter: Arc<Meter>,
    inbound: bool,
}

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(f))) = &r
            && let Some(d) = f.data_ref()
        {
            let c = if self.inbound {
                &self.meter.progress.bytes_in
            } else {
                &self.meter.progress.bytes_out
            };
            c.fetch_add(d.len() as u64, Ordering::Relaxed);
        }
        r.map(|o| o.map(|res| res.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        if self.inbound {
            self.meter.finish(None);
        }
    }
}

/// An absolute-form request: the validated head and body go to the pinned
/// upstream as an origin-form request; the response streams back; redirects
/// are the client's business.
#[allow(clippy::too_many_arguments)]
async fn forward<S: ProxyStream>(
    client: S,
    upstream: TcpStream,
    rest: Bytes,
    head: RequestHead,
    admitted: Admitted,
    flight: InFlight,
    settings: &ProxySettings,
) {
    let meter = Arc::new(Meter {
        progress: flight.progress().clone(),
        flight: Mutex::new(Some(flight)),
        status: Mutex::new(None),
    });
    let mut headers = head.headers.clone();
    strip_hop_by_hop(&mut headers);
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::EXPECT); // hyper answers `100-continue` on this side
    let host = admitted.target.authority();
    match HeaderValue::from_str(&host) {
        Ok(v) => {
            headers.insert(header::HOST, v);
        }
        Err(_) => {
            headers.remove(header::HOST);
        }
    }
    let onward = Onward {
        upstream,
        headers,
        path: admitted.target.path_and_query().to_owned(),
        method: head.method.clone(),
    };
    let state = Arc::new(Mutex::new(Some(onward)));
    let response_timeout = settings.response_timeout;
    let host_bare = admitted.target.host().bare();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let state = state.clone();
        let meter = meter.clone();
        let host_bare = host_bare.clone();
        async move {
            let taken = state.lock().ok().and_then(|mut s| s.take());
            let Some(onward) = taken else {
                return Ok::<_, std::convert::Infallible>(json_response(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "one request per proxy connection",
                ));
            };
            Ok(onward.send(req, &meter, &host_bare, response_timeout).await)
        }
    });
    let io = TokioIo::new(relay::Rewind::new(rest_with_head(&head, rest), client));
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .serve_connection(io, service)
        .await;
}

/// Where the one request of a forwarded connection goes, and as what.
struct Onward {
    /// The pinned upstream, dialled.
    upstream: TcpStream,
    headers: HeaderMap,
    /// Origin-form.
    path: String,
    method: http::Method,
}

impl Onward {
    /// Sends `req` upstream as an origin-form request; its answer streams
    /// back, both ways counted into `meter`. A failure is the upstream's,
    /// recorded and answered 502.
    async fn send(
        self,
        req: Request<Incoming>,
        meter: &Arc<Meter>,
        host: &str,
        response_timeout: Duration,
    ) -> Response<ProxyBody> {
        let fail = |detail: String| {
            let e = EgressError::new(
                EgressCode::UpstreamFailed,
                GuardStep::Upstream,
                Some(host),
                detail,
            );
            meter.finish(Some(Outcome::of_error(&e)));
            json_response(StatusCode::BAD_GATEWAY, e.code.as_str(), &e.to_string())
        };
        let body = Counted {
            inner: req.into_body(),
            meter: meter.clone(),
            inbound: false,
        };
        let mut out = Request::new(body);
        *out.method_mut() = self.method;
        *out.uri_mut() = match self.path.parse() {
            Ok(u) => u,
            Err(_) => return fail("target path is not a valid request-target".into()),
        };
        *out.headers_mut() = self.headers;
        let (mut sender, conn) =
            match hyper::client::conn::http1::handshake(TokioIo::new(self.upstream)).await {
                Ok(v) => v,
                Err(e) => return fail(format!("HTTP handshake failed: {e}")),
            };
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let resp = match tokio::time::timeout(response_timeout, sender.send_request(out)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return fail(format!("upstream request failed: {e}")),
            Err(_) => return fail(format!("no response head within {response_timeout:?}")),
        };
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            return fail("upstream switched protocols, which the proxy does not relay".into());
        }
        let (mut parts, incoming) = resp.into_parts();
        if let Ok(mut slot) = meter.status.lock() {
            *slot = Some(parts.status.as_u16());
        }
        strip_hop_by_hop(&mut parts.headers);
        let body = Counted {
            inner: incoming,
            meter: meter.clone(),
            inbound: true,
        }
        .boxed();
        Response::from_parts(parts, body)
    }
}

/// hyper re-reads the (validated) head for its body framing: hand it the
/// head bytes again, followed by whatever arrived behind them.
fn rest_with_head(head: &RequestHead, rest: Bytes) -> Bytes {
    let mut b = BytesMut::with_capacity(head.len + rest.len());
    b.extend_from_slice(&head.serialize());
    b.extend_from_slice(&rest);
    b.freeze()
}

//! The forward proxy: `CONNECT host:port` tunnels and absolute-form
//! `GET http://host/path` requests, on the proxy listener (`:8081` or its
//! unix socket), under the run's network policy (docs/egress.md, docs/architecture.md).
//!
//! Every request:
//! 1. its head is read (bounded in size and time) and validated by the strict
//!    parser in [`head`] (smuggling shapes are a 400 before anything else);
//! 2. must carry the sidecar token in `Proxy-Authorization` (else 407);
//! 3. its destination goes through the egress guard: a CONNECT authority via
//!    [`Target::from_authority`] (the raw authority never reaches a resolver),
//!    an absolute URL via [`Target::parse`], then [`Guard::admit`] with the
//!    run's network policy, uncredentialed: `public` is any destination that
//!    passes the guard, `none` nothing, a list its patterns;
//! 4. is dialled only at an address the guard returned (resolve-and-pin),
//!    never at the sidecar's own listeners, directly or through `PROXY_URL`.
//!
//! No credential is injected here; the token headers never travel upstream.
//! Each connection serves one request (responses say `Connection: close`):
//! every request head on the wire is therefore one this module parsed.
//! Every decision lands in the run's egress log (source `proxy`), tunnels
//! with their byte counts and duration when they close.

pub mod head;
use airlock_tunnel as relay;
mod upstream;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_egress::{Admitted, CallRules, EgressCode, EgressError, GuardStep, Target};
use airlock_platform_api::wire::EgressRecord;
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
use crate::state::{Sidecar, loggable_url, now_ms};

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

/// A stream the proxy listeners accept. TCP streams report the address they
/// were accepted on, so the proxy can refuse to dial its own listener.
pub trait ProxyStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The local address of an accepted TCP connection.
    fn listener_addr(&self) -> Option<SocketAddr> {
        None
    }
    /// The socket, when a tunnel can splice it.
    fn splice_socket(&self) -> Option<relay::SpliceSocket<'_>> {
        None
    }
}

impl ProxyStream for TcpStream {
    fn listener_addr(&self) -> Option<SocketAddr> {
        self.local_addr().ok()
    }
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

/// Addresses this process serves on (the proxy learns its own from accepted
/// connections; other listeners register theirs with [`register_own_listener`]).
static OWN_LISTENERS: Mutex<Vec<SocketAddr>> = Mutex::new(Vec::new());

/// Records an address this process listens on: the proxy refuses to dial it
/// (a loop back into the sidecar), even when the guard would allow it through
/// the operator's internal-host exemption.
pub fn register_own_listener(addr: SocketAddr) {
    if let Ok(mut l) = OWN_LISTENERS.lock()
        && !l.contains(&addr)
    {
        l.push(addr);
    }
}

fn own_ports() -> Vec<SocketAddr> {
    OWN_LISTENERS.lock().map(|l| l.clone()).unwrap_or_default()
}

/// True when dialling `addr` could reach one of this process's listeners:
/// a registered listener address, or a loopback address on a port this
/// process listens on (found in `/proc`, so listeners nobody registered,
/// like the API's, count too).
fn is_own_listener(addr: SocketAddr) -> bool {
    let registered = own_ports().iter().any(|own| {
        own.port() == addr.port()
            && (own.ip() == addr.ip() || addr.ip().is_loopback() || addr.ip().is_unspecified())
    });
    registered
        || ((addr.ip().is_loopback() || addr.ip().is_unspecified())
            && process_listens_on(addr.port()))
}

/// True when a TCP socket of this process listens on `port` (Linux `/proc`;
/// elsewhere only the registry is consulted).
fn process_listens_on(port: u16) -> bool {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return false;
    };
    let inodes: std::collections::HashSet<String> = fds
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .any(|table| {
            let Ok(text) = std::fs::read_to_string(table) else {
                return false;
            };
            text.lines().skip(1).any(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                    return false;
                };
                let p = local
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok());
                *state == "0A" && p == Some(port) && inodes.contains(*inode)
            })
        })
}

/// Serves the proxy on an accepted stream (one request per connection).
pub async fn serve_connection<S: ProxyStream>(stream: S, sidecar: Arc<Sidecar>) {
    let settings = ProxySettings::from_sidecar(&sidecar);
    serve_connection_with(stream, sidecar, settings).await
}

/// [`serve_connection`] with explicit timeouts.
pub async fn serve_connection_with<S: ProxyStream>(
    mut stream: S,
    sidecar: Arc<Sidecar>,
    settings: ProxySettings,
) {
    if let Some(addr) = stream.listener_addr() {
        register_own_listener(addr);
    }
    let (head, buf) = match tokio::time::timeout(settings.head_timeout, read_head(&mut stream))
        .await
    {
        Ok(Ok(Some(v))) => v,
        Ok(Ok(None)) => return, // closed before a full head: nothing to answer
        Ok(Err(e)) => {
            let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
            let _ = respond(
                &mut stream,
                status,
                &[],
                &error_body("bad_request", &e.to_string()),
            )
            .await;
            return;
        }
        Err(_) => {
            let _ = respond(
                &mut stream,
                StatusCode::REQUEST_TIMEOUT,
                &[],
                &error_body("request_timeout", "request head not received in time"),
            )
            .await;
            return;
        }
    };
    if !auth::is_proxy_authorized(&head.headers, &sidecar.token) {
        // No body beyond the fixed error: nothing of the request is echoed.
        let _ = respond(
            &mut stream,
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            &[("Proxy-Authenticate", "Basic realm=\"airlock\"")],
            &error_body(
                "proxy_authentication_required",
                "the sidecar token is required in Proxy-Authorization",
            ),
        )
        .await;
        return;
    }
    let started = Instant::now();
    let method = head.method.to_string();
    let (target, log_url) = match target_of(&head) {
        Ok(t) => t,
        Err((e, log_url)) => {
            refuse(&mut stream, &sidecar, &method, &log_url, &e).await;
            return;
        }
    };
    let rules = CallRules {
        authorized: &sidecar.network.0,
        allow_all_uris: sidecar.network.1,
        credentialed: false,
    };
    let admitted = match sidecar.client.guard().admit(&target, &rules).await {
        Ok(a) => a,
        Err(e) => {
            refuse(&mut stream, &sidecar, &method, &log_url, &e).await;
            return;
        }
    };
    let upstream = match upstream::dial(&sidecar, &admitted, &settings).await {
        Ok(u) => u,
        Err(e) => {
            refuse(&mut stream, &sidecar, &method, &log_url, &e).await;
            return;
        }
    };
    let rec = EgressRecord {
        at: now_ms(),
        source: "proxy".into(),
        integration: None,
        method,
        url: log_url,
        host: admitted.target.host().bare(),
        decision: "allowed".into(),
        code: None,
        status: None,
        bytes_out: 0,
        bytes_in: 0,
        duration_ms: None,
    };
    let rest = buf.freeze().slice(head.len..);
    match head.target {
        RequestTarget::Authority(_) => {
            tunnel(stream, upstream, rest, sidecar, rec, started, &settings).await
        }
        RequestTarget::Absolute(_) => {
            forward(
                stream, upstream, rest, head, admitted, sidecar, rec, started, &settings,
            )
            .await
        }
    }
}

/// The canonical target of the request and the URL the egress log keeps.
fn target_of(head: &RequestHead) -> Result<(Target, String), (EgressError, String)> {
    match &head.target {
        RequestTarget::Authority(a) => match Target::from_authority(a) {
            Ok(t) => {
                let log = loggable_url(t.url().as_str());
                Ok((t, log))
            }
            Err(e) => Err((e, "<invalid authority>".to_owned())),
        },
        RequestTarget::Absolute(u) => {
            let log = loggable_url(u);
            let t = Target::parse(u).map_err(|e| (e, log.clone()))?;
            if t.is_https() {
                return Err((
                    EgressError::invalid_url(
                        "https:// targets go through CONNECT, not absolute-form requests",
                    ),
                    log,
                ));
            }
            Ok((t, log))
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

/// Writes a complete response and closes the write side.
async fn respond<W: AsyncWrite + Unpin>(
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
    w.shutdown().await
}

async fn refuse<W: AsyncWrite + Unpin>(
    w: &mut W,
    sidecar: &Sidecar,
    method: &str,
    url: &str,
    e: &EgressError,
) {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::FORBIDDEN);
    sidecar.record_egress(EgressRecord {
        at: now_ms(),
        source: "proxy".into(),
        integration: None,
        method: method.to_owned(),
        url: url.to_owned(),
        host: e.host.clone().unwrap_or_else(|| "-".into()),
        decision: "refused".into(),
        code: Some(e.code.as_str().to_owned()),
        status: Some(status.as_u16()),
        bytes_out: 0,
        bytes_in: 0,
        duration_ms: None,
    });
    let _ = respond(w, status, &[], &error_body(e.code.as_str(), &e.to_string())).await;
}

/// A CONNECT: answer 200, then relay bytes until both sides close or the
/// tunnel is idle for `idle_timeout`.
async fn tunnel<S: ProxyStream>(
    mut client: S,
    mut upstream: TcpStream,
    early: Bytes,
    sidecar: Arc<Sidecar>,
    mut rec: EgressRecord,
    started: Instant,
    settings: &ProxySettings,
) {
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    // Bytes the client sent right behind its CONNECT head (a TLS hello that
    // did not wait for our 200) belong to the tunnel.
    let mut early_out = 0;
    if !early.is_empty() {
        if upstream.write_all(&early).await.is_err() {
            return;
        }
        early_out = early.len() as u64;
    }
    let spliced = match client.splice_socket() {
        Some(c) => relay::relay_spliced(
            c,
            relay::SpliceSocket::Tcp(&upstream),
            settings.idle_timeout,
        )
        .await
        .ok(),
        None => None,
    };
    let stats = match spliced {
        Some(stats) => stats,
        None => relay::relay(client, upstream, settings.idle_timeout, RELAY_BUF).await,
    };
    rec.status = Some(200);
    rec.bytes_out = stats.client_to_upstream + early_out;
    rec.bytes_in = stats.upstream_to_client;
    rec.duration_ms = Some(started.elapsed().as_millis() as u64);
    if stats.idle {
        tracing::info!(host = %rec.host, "proxy tunnel closed after {:?} without traffic", settings.idle_timeout);
    }
    sidecar.record_egress(rec);
}

type ProxyBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

fn json_response(status: StatusCode, code: &str, message: &str) -> Response<ProxyBody> {
    let mut r = Response::new(
        Full::new(Bytes::from(error_body(code, message)))
            .map_err(|e| match e {})
            .boxed(),
    );
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
/// records the egress entry once, when the response body is done or dropped.
struct Meter {
    sidecar: Arc<Sidecar>,
    rec: Mutex<Option<EgressRecord>>,
    out: AtomicU64,
    inb: AtomicU64,
    started: Instant,
}

impl Meter {
    fn finish(&self, status: Option<u16>, code: Option<&str>) {
        let Ok(mut slot) = self.rec.lock() else {
            return;
        };
        if let Some(mut rec) = slot.take() {
            if rec.status.is_none() {
                rec.status = status;
            }
            rec.code = code.map(str::to_owned).or(rec.code);
            rec.bytes_out = self.out.load(Ordering::Relaxed);
            rec.bytes_in = self.inb.load(Ordering::Relaxed);
            rec.duration_ms = Some(self.started.elapsed().as_millis() as u64);
            self.sidecar.record_egress(rec);
        }
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
                &self.meter.inb
            } else {
                &self.meter.out
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
            self.meter.finish(None, None);
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
    sidecar: Arc<Sidecar>,
    rec: EgressRecord,
    started: Instant,
    settings: &ProxySettings,
) {
    let meter = Arc::new(Meter {
        sidecar,
        rec: Mutex::new(Some(rec)),
        out: AtomicU64::new(0),
        inb: AtomicU64::new(0),
        started,
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
    let path = admitted.target.path_and_query().to_owned();
    let method = head.method.clone();
    let state = Arc::new(Mutex::new(Some((upstream, headers, path, method))));
    let response_timeout = settings.response_timeout;
    let host_bare = admitted.target.host().bare();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let state = state.clone();
        let meter = meter.clone();
        let host_bare = host_bare.clone();
        async move {
            let taken = state.lock().ok().and_then(|mut s| s.take());
            let Some((upstream, headers, path, method)) = taken else {
                return Ok::<_, std::convert::Infallible>(json_response(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "one request per proxy connection",
                ));
            };
            let fail = |detail: String| {
                let e = EgressError::new(
                    EgressCode::UpstreamFailed,
                    GuardStep::Upstream,
                    Some(&host_bare),
                    detail,
                );
                meter.finish(Some(502), Some(e.code.as_str()));
                json_response(StatusCode::BAD_GATEWAY, e.code.as_str(), &e.to_string())
            };
            let body = Counted {
                inner: req.into_body(),
                meter: meter.clone(),
                inbound: false,
            };
            let mut out = Request::new(body);
            *out.method_mut() = method;
            *out.uri_mut() = match path.parse() {
                Ok(u) => u,
                Err(_) => return Ok(fail("target path is not a valid request-target".into())),
            };
            *out.headers_mut() = headers;
            let (mut sender, conn) =
                match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
                    Ok(v) => v,
                    Err(e) => return Ok(fail(format!("HTTP handshake failed: {e}"))),
                };
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let resp = match tokio::time::timeout(response_timeout, sender.send_request(out)).await
            {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => return Ok(fail(format!("upstream request failed: {e}"))),
                Err(_) => {
                    return Ok(fail(format!(
                        "no response head within {response_timeout:?}"
                    )));
                }
            };
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                return Ok(fail(
                    "upstream switched protocols, which the proxy does not relay".into(),
                ));
            }
            let (mut parts, incoming) = resp.into_parts();
            if let Ok(mut slot) = meter.rec.lock()
                && let Some(r) = slot.as_mut()
            {
                r.status = Some(parts.status.as_u16());
            }
            strip_hop_by_hop(&mut parts.headers);
            let body = Counted {
                inner: incoming,
                meter: meter.clone(),
                inbound: true,
            }
            .boxed();
            Ok(Response::from_parts(parts, body))
        }
    });
    let io = TokioIo::new(relay::Rewind::new(rest_with_head(&head, rest), client));
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .serve_connection(io, service)
        .await;
}

/// hyper re-reads the (validated) head for its body framing: hand it the
/// head bytes again, followed by whatever arrived behind them.
fn rest_with_head(head: &RequestHead, rest: Bytes) -> Bytes {
    let mut b = BytesMut::with_capacity(head.len + rest.len());
    b.extend_from_slice(&head.serialize());
    b.extend_from_slice(&rest);
    b.freeze()
}

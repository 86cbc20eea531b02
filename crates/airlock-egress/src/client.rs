//! The guarded HTTP client: the only code in Airlock that opens a connection
//! on behalf of a sandbox.
//!
//! It never resolves a name itself: every hop goes through [`Guard::admit`],
//! and the TCP connection is opened to one of the addresses the guard
//! returned (resolve-and-pin), while the original name is kept for SNI and the
//! `Host` header. A DNS answer that changes between the check and the connect
//! (rebinding) therefore changes nothing. Proxy environment variables are not
//! read. Redirects are followed here, one hop at a time, each hop judged in
//! full as if it were a new request.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::conn::{Connection, driven};
use crate::error::{EgressCode, EgressError, GuardStep};
use crate::policy::{Admitted, CallRules, Guard};
use crate::rules::Hold;
use crate::rules::Intent;
use crate::target::{Target, TargetHost, TargetMemo};

/// Limits of the client. Defaults: connect 10 s, whole exchange 60 s,
/// responses up to 10 MiB, at most 10 redirects.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub connect_timeout: Duration,
    /// Covers every hop, from the first connect to the last body byte.
    pub total_timeout: Duration,
    pub max_response_bytes: usize,
    pub max_redirects: u32,
    /// Trust anchors added to (or, with `use_webpki_roots = false`, used instead of) the Mozilla roots.
    pub extra_root_certs: Vec<CertificateDer<'static>>,
    pub use_webpki_roots: bool,
    /// Idle keep-alive connections kept per origin.
    pub max_idle_per_origin: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(10),
            total_timeout: Duration::from_secs(60),
            max_response_bytes: 10 * 1024 * 1024,
            max_redirects: 10,
            extra_root_certs: Vec::new(),
            use_webpki_roots: true,
            max_idle_per_origin: 8,
        }
    }
}

/// Opens TCP connections. The real one is [`TcpDialer`]; tests substitute
/// one that records (and may redirect) what is dialled.
pub trait Dial: Send + Sync + 'static {
    fn dial(
        &self,
        addr: SocketAddr,
    ) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + '_>>;
}

#[derive(Debug, Default, Clone)]
pub struct TcpDialer;

impl Dial for TcpDialer {
    fn dial(
        &self,
        addr: SocketAddr,
    ) -> Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send + '_>> {
        Box::pin(async move {
            let s = TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            Ok(s)
        })
    }
}

/// One outbound request, before the guard has seen it.
#[derive(Debug, Clone)]
pub struct OutboundRequest {
    pub method: Method,
    pub url: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Headers that carry a credential: dropped on a cross-origin redirect
    /// (with `Authorization`, `Cookie` and `Proxy-Authorization`, always).
    pub credential_headers: Vec<HeaderName>,
}

impl OutboundRequest {
    pub fn get(url: impl Into<String>) -> Self {
        OutboundRequest {
            method: Method::GET,
            url: url.into(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            credential_headers: Vec::new(),
        }
    }
}

/// A first hop the guard has allowed. Only [`GuardedClient::admit`] makes
/// one, so a request sent with [`GuardedClient::send_admitted`] still goes
/// only where the guard said it may: callers use the gap between the two to
/// record the request before any byte of it leaves.
#[derive(Debug, Clone)]
pub struct Admission {
    admitted: Admitted,
}

impl Admission {
    /// The canonical target.
    pub fn target(&self) -> &Target {
        &self.admitted.target
    }

    /// The addresses it may be dialled at.
    pub fn addrs(&self) -> &[IpAddr] {
        &self.admitted.addrs
    }

    /// The `ask` rule that holds it, if one does: until it is released,
    /// sending it is refused (`approval_required`).
    pub fn hold(&self) -> Option<&Hold> {
        self.admitted.hold.as_ref()
    }

    /// The same admission, released from its hold: for the caller that
    /// asked a person and was allowed to send it.
    #[must_use]
    pub fn release(mut self) -> Admission {
        self.admitted.hold = None;
        self
    }
}

/// A complete response, after redirects.
#[derive(Debug, Clone)]
pub struct GuardedResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub final_url: Target,
    pub redirects: u32,
    pub remote_addr: SocketAddr,
    /// The credential and the body were dropped on a cross-origin redirect.
    pub credential_stripped: bool,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    https: bool,
    host: TargetHost,
    port: u16,
}

/// A connection to a validated address: its request handle and the
/// connection itself, driven by whoever sends on it ([`crate::conn`]).
struct Idle {
    addr: SocketAddr,
    sender: http1::SendRequest<Full<Bytes>>,
    conn: Connection,
}

/// The guarded client. Cheap to clone; clones share the connection pool.
#[derive(Clone)]
pub struct GuardedClient {
    guard: Guard,
    tls: TlsConnector,
    dialer: Arc<dyn Dial>,
    cfg: Arc<ClientConfig>,
    pool: Arc<Mutex<foldhash::HashMap<PoolKey, Vec<Idle>>>>,
    /// The first hops' targets parsed lately, of secret-free texts
    /// ([`GuardedClient::admit_secret_free`]).
    targets: TargetMemo,
}

/// Hop-by-hop headers and headers the client sets itself; never taken from the caller.
const CLIENT_OWNED: &[HeaderName] = &[
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
];

impl GuardedClient {
    pub fn new(guard: Guard, cfg: ClientConfig) -> Result<Self, EgressError> {
        Self::with_dialer(guard, cfg, Arc::new(TcpDialer))
    }

    pub fn with_dialer(
        guard: Guard,
        cfg: ClientConfig,
        dialer: Arc<dyn Dial>,
    ) -> Result<Self, EgressError> {
        let mut roots = rustls::RootCertStore::empty();
        if cfg.use_webpki_roots {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        for cert in &cfg.extra_root_certs {
            roots.add(cert.clone()).map_err(|e| {
                EgressError::upstream("-", format!("bad extra root certificate: {e}"))
            })?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| EgressError::upstream("-", format!("TLS setup: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(GuardedClient {
            guard,
            tls: TlsConnector::from(Arc::new(tls)),
            dialer,
            cfg: Arc::new(cfg),
            pool: Arc::default(),
            targets: TargetMemo::default(),
        })
    }

    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The targets [`GuardedClient::admit_secret_free`] remembers.
    pub fn target_memo(&self) -> &TargetMemo {
        &self.targets
    }

    /// Sends `req` under `rules`, following redirects. Every refusal and
    /// failure is a typed [`EgressError`].
    pub async fn send(
        &self,
        req: OutboundRequest,
        rules: &CallRules<'_>,
    ) -> Result<GuardedResponse, EgressError> {
        let first = self.admit(&req.url, &req.method, rules).await?;
        self.send_admitted(first, req, rules).await
    }

    /// The guard's decision on the first hop of a `method` request to
    /// `url`: parse, policy (the L7 rules judge the method), names,
    /// resolution and addresses (bounded by `total_timeout`).
    pub async fn admit(
        &self,
        url: &str,
        method: &Method,
        rules: &CallRules<'_>,
    ) -> Result<Admission, EgressError> {
        self.admit_target(Target::parse(url)?, method, rules).await
    }

    /// [`GuardedClient::admit`] of a URL whose text carries no secret (an
    /// agent's own target, before any credential is put into it): its parse
    /// is remembered by that text ([`TargetMemo`]) and not made again for
    /// the same text. Never for a text a credential was put into: the memo
    /// outlives the call, and a credential lives for its call only.
    pub async fn admit_secret_free(
        &self,
        url: &str,
        method: &Method,
        rules: &CallRules<'_>,
    ) -> Result<Admission, EgressError> {
        self.admit_target(self.targets.parse(url)?, method, rules)
            .await
    }

    async fn admit_target(
        &self,
        target: Target,
        method: &Method,
        rules: &CallRules<'_>,
    ) -> Result<Admission, EgressError> {
        let host = target.host().bare();
        let decision = self.guard.admit(&target, Intent::Request(method), rules);
        match tokio::time::timeout(self.cfg.total_timeout, decision).await {
            Ok(r) => r.map(|admitted| Admission { admitted }),
            Err(_) => Err(EgressError::new(
                EgressCode::Unresolvable,
                GuardStep::Resolver,
                Some(&host),
                format!("no decision within {:?}", self.cfg.total_timeout),
            )),
        }
    }

    /// [`GuardedClient::send`] of a request whose first hop `first` the guard
    /// already allowed (`req.url` is not read again: the request goes to
    /// `first`'s target). Redirect hops are judged as in `send`.
    pub async fn send_admitted(
        &self,
        first: Admission,
        req: OutboundRequest,
        rules: &CallRules<'_>,
    ) -> Result<GuardedResponse, EgressError> {
        let host_hint = first.target().host().bare().into_owned();
        match tokio::time::timeout(self.cfg.total_timeout, self.send_inner(first, req, rules)).await
        {
            Ok(r) => r,
            Err(_) => Err(EgressError::upstream(
                &host_hint,
                format!("no complete response within {:?}", self.cfg.total_timeout),
            )),
        }
    }

    /// Sends `req` under `rules` and returns as soon as the response head
    /// has arrived, with the body still streaming ([`StreamingBody`]): for
    /// relays that must pass a body through as it comes (server-sent events).
    ///
    /// The guard checks, resolve-and-pin, TLS and connection reuse are the
    /// same as [`GuardedClient::send`]. Differences, by design:
    /// - redirects are **not** followed: a 3xx comes back as it is, with its
    ///   `Location`, and the caller decides (the model relay refuses it);
    /// - `total_timeout` bounds the exchange up to the response head; the
    ///   body is then bounded by an *idle* timeout of the same length between
    ///   two body frames (a long stream that keeps talking is not cut), and
    ///   the caller adds an overall deadline if it wants one;
    /// - `max_response_bytes` is enforced while streaming: a declared
    ///   `Content-Length` above it fails before the body is read, and the body
    ///   ends with an `upstream_failed` error once it has yielded more.
    ///
    /// The connection goes back to the pool only when the body was read to
    /// its end; a body dropped early closes its connection.
    pub async fn send_streaming(
        &self,
        req: OutboundRequest,
        rules: &CallRules<'_>,
    ) -> Result<StreamingResponse, EgressError> {
        let first = self.admit(&req.url, &req.method, rules).await?;
        self.send_streaming_admitted(first, req).await
    }

    /// [`GuardedClient::send_streaming`] of a request whose only hop `first`
    /// the guard already allowed (`req.url` is not read again).
    pub async fn send_streaming_admitted(
        &self,
        first: Admission,
        req: OutboundRequest,
    ) -> Result<StreamingResponse, EgressError> {
        let host_hint = first.target().host().bare().into_owned();
        let head = async {
            let OutboundRequest {
                method,
                url: _,
                headers,
                body,
                credential_headers: _,
            } = req;
            let admitted = first.admitted;
            let target = &admitted.target;
            let headers = sanitize(headers);
            let host = target.host().bare().into_owned();
            let (resp, idle, key) = self
                .exchange_head(&admitted, &method, &headers, &body)
                .await?;
            let (parts, incoming) = resp.into_parts();
            let cap = self.cfg.max_response_bytes;
            let declared = parts
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if declared.is_some_and(|len| len > cap as u64) {
                return Err(EgressError::upstream(
                    &host,
                    format!("response body is larger than the {cap}-byte limit"),
                ));
            }
            let keep_alive = !parts
                .headers
                .get(header::CONNECTION)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.eq_ignore_ascii_case("close"));
            let remote_addr = idle.addr;
            let body = StreamingBody {
                incoming,
                host,
                cap,
                read: 0,
                idle_timeout: self.cfg.total_timeout,
                idle_sleep: None,
                done: false,
                conn: Some(idle),
                pool: keep_alive.then(|| (self.clone(), key)),
            };
            Ok(StreamingResponse {
                status: parts.status,
                headers: parts.headers,
                body,
                final_url: admitted.target,
                remote_addr,
            })
        };
        match tokio::time::timeout(self.cfg.total_timeout, head).await {
            Ok(r) => r,
            Err(_) => Err(EgressError::upstream(
                &host_hint,
                format!("no response head within {:?}", self.cfg.total_timeout),
            )),
        }
    }

    async fn send_inner(
        &self,
        first: Admission,
        req: OutboundRequest,
        rules: &CallRules<'_>,
    ) -> Result<GuardedResponse, EgressError> {
        let OutboundRequest {
            mut method,
            url: _,
            headers,
            mut body,
            credential_headers,
        } = req;
        let mut target = first.admitted.target.clone();
        let mut first = Some(first.admitted);
        let mut headers = sanitize(headers);
        let mut stripped = false;
        let mut redirects = 0u32;
        loop {
            let hop_rules = CallRules {
                authorized: rules.authorized,
                // Once the credential is gone the hop no longer carries one,
                // but it still has to be an authorized destination.
                allow_all_uris: rules.allow_all_uris && !rules.credentialed,
                credentialed: rules.credentialed && !stripped,
            };
            let admitted = match first.take() {
                Some(a) => a,
                None => match self
                    .guard
                    .admit(&target, Intent::Request(&method), &hop_rules)
                    .await
                {
                    Ok(a) => a,
                    Err(e) => return Err(redirect_refusal(e, redirects)),
                },
            };
            let (resp, remote_addr) = self.exchange(&admitted, &method, &headers, &body).await?;
            let (parts, resp_body) = resp;
            let location = parts.headers.get(header::LOCATION).cloned();
            let status = parts.status;
            let is_redirect = matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308);
            let Some(location) = location.filter(|_| is_redirect) else {
                return Ok(GuardedResponse {
                    status,
                    headers: parts.headers,
                    body: resp_body,
                    final_url: target,
                    redirects,
                    remote_addr,
                    credential_stripped: stripped,
                });
            };
            redirects += 1;
            let host = target.host().bare();
            if redirects > self.cfg.max_redirects {
                return Err(EgressError::new(
                    EgressCode::TooManyRedirects,
                    GuardStep::Redirects,
                    Some(&host),
                    format!("more than {} redirects", self.cfg.max_redirects),
                ));
            }
            let location = location.to_str().map_err(|_| {
                EgressError::new(
                    EgressCode::RedirectBlocked,
                    GuardStep::Redirects,
                    Some(&host),
                    "redirect Location is not visible ASCII",
                )
            })?;
            let next = target
                .join(location)
                .map_err(|e| redirect_refusal(e, redirects))?;
            if target.is_https() && !next.is_https() {
                return Err(EgressError::new(
                    EgressCode::RedirectBlocked,
                    GuardStep::Redirects,
                    Some(&next.host().bare()),
                    format!(
                        "redirect from {} downgrades to {}",
                        target.loggable(),
                        next.loggable()
                    ),
                ));
            }
            let cross_origin = !target.same_origin(&next);
            if cross_origin && !stripped {
                for h in [
                    header::AUTHORIZATION,
                    header::COOKIE,
                    header::PROXY_AUTHORIZATION,
                ]
                .iter()
                .chain(&credential_headers)
                {
                    headers.remove(h);
                }
                stripped = true;
            }
            let drop_body = match status.as_u16() {
                303 => {
                    if method != Method::HEAD {
                        method = Method::GET;
                    }
                    true
                }
                301 | 302 if method == Method::POST => {
                    method = Method::GET;
                    true
                }
                _ => cross_origin || stripped,
            };
            if drop_body {
                body = Bytes::new();
                headers.remove(header::CONTENT_TYPE);
                headers.remove(header::CONTENT_ENCODING);
            }
            // No URL or host here: either may hold a substituted credential,
            // which only the caller can redact.
            tracing::debug!(
                status = status.as_u16(),
                hop = redirects,
                cross_origin,
                "following a redirect"
            );
            target = next;
        }
    }

    /// One request/response on a pinned connection; returns the collected body.
    async fn exchange(
        &self,
        admitted: &Admitted,
        method: &Method,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> Result<((http::response::Parts, Bytes), SocketAddr), EgressError> {
        let host = admitted.target.host().bare();
        let (resp, mut idle, key) = self.exchange_head(admitted, method, headers, body).await?;
        let collected = driven(&mut idle.conn, self.collect(resp, &host))
            .await
            .map_err(|e| {
                EgressError::upstream(&host, format!("reading the response body failed: {e}"))
            })??;
        let addr = idle.addr;
        self.put_idle(key, idle, &collected.0);
        Ok((collected, addr))
    }

    /// Sends one request on a pinned connection (a kept-alive one to a
    /// validated address, or a new one) and returns the response head with
    /// its unread body, and the connection to return to the pool once that
    /// body has been read to the end.
    async fn exchange_head(
        &self,
        admitted: &Admitted,
        method: &Method,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> Result<(http::Response<hyper::body::Incoming>, Idle, PoolKey), EgressError> {
        admitted.unheld()?;
        let target = &admitted.target;
        let host = target.host().bare();
        let key = PoolKey {
            https: target.is_https(),
            host: target.host().clone(),
            port: target.port_or_default(),
        };
        let build = || -> Result<Request<Full<Bytes>>, EgressError> {
            let mut b = Request::builder()
                .method(method.clone())
                .uri(target.path_and_query());
            if let Some(h) = b.headers_mut() {
                h.extend(headers.iter().map(|(k, v)| (k.clone(), v.clone())));
                let authority = HeaderValue::from_str(&target.authority())
                    .map_err(|_| EgressError::invalid_url("host is not a valid header value"))?;
                h.insert(header::HOST, authority);
                if !body.is_empty() || matches!(*method, Method::POST | Method::PUT | Method::PATCH)
                {
                    h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
                }
            }
            b.body(Full::new(body.clone()))
                .map_err(|e| EgressError::invalid_url(format!("request cannot be built: {e}")))
        };

        // A kept-alive connection is reused only if it goes to an address this
        // hop's guard decision validated.
        let mut request = build()?;
        if let Some(mut idle) = self.take_idle(&key, &admitted.addrs).await {
            let mut sent = std::pin::pin!(idle.sender.try_send_request(request));
            let answer = match driven(&mut idle.conn, sent.as_mut()).await {
                Ok(answer) => answer,
                // The connection ended first (it then handed back what it
                // had not sent).
                Err(_) => sent.await,
            };
            match answer {
                Ok(resp) => return Ok((resp, idle, key)),
                Err(mut e) => match e.take_message() {
                    Some(r) => request = r, // never sent: use a new connection
                    None => {
                        return Err(EgressError::upstream(
                            &host,
                            format!("request failed: {}", e.error()),
                        ));
                    }
                },
            }
        }
        let mut idle = self.connect(admitted).await?;
        let addr = idle.addr;
        let sent = idle.sender.send_request(request);
        let resp = driven(&mut idle.conn, sent)
            .await
            .map_err(|e| EgressError::upstream(&host, format!("request failed: {e}")).at(addr))?
            .map_err(|e| EgressError::upstream(&host, format!("request failed: {e}")).at(addr))?;
        Ok((resp, idle, key))
    }

    /// A kept-alive connection to one of `allowed`, waited on until it can
    /// take a request; closed or foreign-address connections are dropped.
    async fn take_idle(&self, key: &PoolKey, allowed: &[IpAddr]) -> Option<Idle> {
        loop {
            let mut idle = {
                let mut pool = self.pool.lock().ok()?;
                pool.get_mut(key)?.pop()?
            };
            if idle.conn.is_ended() || !allowed.contains(&idle.addr.ip()) {
                continue;
            }
            // Ready already (the usual case: the drive that read the last
            // answer left it wanting a request): taken without polling the
            // connection. One the peer closed since is noticed when the
            // request is offered — hyper reads before it writes and hands an
            // unsent request back, which then goes out on a new connection.
            if idle.sender.is_ready() {
                return Some(idle);
            }
            let Idle { sender, conn, .. } = &mut idle;
            if let Ok(Ok(())) = driven(conn, std::future::poll_fn(|cx| sender.poll_ready(cx))).await
            {
                return Some(idle);
            }
        }
    }

    fn put_idle(&self, key: PoolKey, idle: Idle, parts: &http::response::Parts) {
        let close = parts
            .headers
            .get(header::CONNECTION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        if close || idle.conn.is_ended() {
            return;
        }
        if let Ok(mut pool) = self.pool.lock() {
            let list = pool.entry(key).or_default();
            if list.len() < self.cfg.max_idle_per_origin {
                list.push(idle);
            }
        }
    }

    async fn connect(&self, admitted: &Admitted) -> Result<Idle, EgressError> {
        let target = &admitted.target;
        let host = target.host().bare();
        let port = target.port_or_default();
        let mut errors = Vec::new();
        let mut stream = None;
        for ip in &admitted.addrs {
            let addr = SocketAddr::new(*ip, port);
            match tokio::time::timeout(self.cfg.connect_timeout, self.dialer.dial(addr)).await {
                Ok(Ok(s)) => {
                    stream = Some((s, addr));
                    break;
                }
                Ok(Err(e)) => errors.push((addr, e.to_string())),
                Err(_) => errors.push((
                    addr,
                    format!("connect timed out after {:?}", self.cfg.connect_timeout),
                )),
            }
        }
        let Some((tcp, addr)) = stream else {
            let why: Vec<&str> = errors.iter().map(|(_, e)| e.as_str()).collect();
            let addrs: Vec<String> = errors.iter().map(|(a, _)| a.to_string()).collect();
            return Err(EgressError::upstream(
                &host,
                format!("could not connect: {}", why.join("; ")),
            )
            .at(addrs.join(", ")));
        };
        // The guard refused the registered listeners by address; a host's own
        // address on a listener's port (one bound to every address) only
        // shows once connected.
        let policy = self.guard.policy();
        if policy.has_own_listeners()
            && let (Ok(local), Ok(peer)) = (tcp.local_addr(), tcp.peer_addr())
            && policy.is_loop(local, peer)
        {
            return Err(EgressError::new(
                EgressCode::BlockedAddress,
                GuardStep::AddressTable,
                Some(&host),
                "the address is the sidecar's own listener",
            )
            .at(peer));
        }
        let handshake_err = |e: hyper::Error| {
            EgressError::upstream(&host, format!("HTTP handshake failed: {e}")).at(addr)
        };
        if target.is_https() {
            let name = match target.host() {
                TargetHost::Domain(d) => ServerName::try_from(d.clone()).map_err(|e| {
                    EgressError::invalid_url(format!("{d} is not a TLS server name: {e}"))
                })?,
                TargetHost::Ip(ip) => ServerName::IpAddress((*ip).into()),
            };
            let tls = tokio::time::timeout(self.cfg.connect_timeout, self.tls.connect(name, tcp))
                .await
                .map_err(|_| EgressError::upstream(&host, "TLS handshake timed out").at(addr))?
                .map_err(|e| {
                    EgressError::upstream(&host, format!("TLS handshake failed: {e}")).at(addr)
                })?;
            let (sender, conn) = http1::handshake(TokioIo::new(tls))
                .await
                .map_err(handshake_err)?;
            Ok(Idle {
                addr,
                sender,
                conn: Connection::new(conn),
            })
        } else {
            let (sender, conn) = http1::handshake(TokioIo::new(tcp))
                .await
                .map_err(handshake_err)?;
            Ok(Idle {
                addr,
                sender,
                conn: Connection::new(conn),
            })
        }
    }

    /// Reads the whole body, refusing past `max_response_bytes`.
    async fn collect(
        &self,
        resp: http::Response<hyper::body::Incoming>,
        host: &str,
    ) -> Result<(http::response::Parts, Bytes), EgressError> {
        let cap = self.cfg.max_response_bytes;
        let (parts, mut incoming) = resp.into_parts();
        let too_big = || {
            EgressError::upstream(
                host,
                format!("response body is larger than the {cap}-byte limit"),
            )
        };
        if let Some(len) = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            && len > cap as u64
        {
            return Err(too_big());
        }
        let mut buf = BytesMut::new();
        while let Some(frame) = incoming.frame().await {
            let frame = frame.map_err(|e| {
                EgressError::upstream(host, format!("reading the response body failed: {e}"))
            })?;
            if let Ok(data) = frame.into_data() {
                if buf.len() + data.len() > cap {
                    return Err(too_big());
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok((parts, buf.freeze()))
    }
}

/// A response whose body is still arriving; see [`GuardedClient::send_streaming`].
pub struct StreamingResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: StreamingBody,
    /// The target that answered (no redirect is followed).
    pub final_url: Target,
    pub remote_addr: SocketAddr,
}

impl std::fmt::Debug for StreamingResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamingResponse")
            .field("status", &self.status)
            .field("final_url", &self.final_url.to_string())
            .field("remote_addr", &self.remote_addr)
            .finish_non_exhaustive()
    }
}

/// The body of a [`StreamingResponse`]: yields upstream frames as they
/// arrive, fails with `upstream_failed` past the response cap, on a read
/// error, or when no frame arrives within the idle timeout. Implements
/// [`hyper::body::Body`], so it can be handed to a server response as is.
pub struct StreamingBody {
    incoming: hyper::body::Incoming,
    host: String,
    cap: usize,
    read: usize,
    idle_timeout: Duration,
    idle_sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    done: bool,
    /// The connection the body arrives on, driven as the body is read.
    conn: Option<Idle>,
    /// Where the connection goes back once the body has been read to its
    /// end (none: the upstream said it closes it).
    pool: Option<(GuardedClient, PoolKey)>,
}

impl StreamingBody {
    /// Bytes of body yielded so far.
    pub fn bytes_read(&self) -> usize {
        self.read
    }

    /// The body was read to its end: its connection goes back to the pool
    /// (the one place a streamed connection is returned).
    fn end(&mut self) {
        self.done = true;
        self.idle_sleep = None;
        if let (Some((client, key)), Some(idle)) = (self.pool.take(), self.conn.take())
            && !idle.conn.is_ended()
            && let Ok(mut pool) = client.pool.lock()
        {
            let list = pool.entry(key).or_default();
            if list.len() < client.cfg.max_idle_per_origin {
                list.push(idle);
            }
        }
    }

    fn fail(&mut self, detail: String) -> EgressError {
        self.done = true;
        self.pool = None;
        self.conn = None;
        EgressError::upstream(&self.host, detail)
    }
}

impl hyper::body::Body for StreamingBody {
    type Data = Bytes;
    type Error = EgressError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, EgressError>>> {
        use std::task::Poll;
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        // The connection reads what arrived (an end or a failure of it
        // reaches the body as its end or error).
        if let Some(idle) = &mut this.conn {
            let _ = idle.conn.poll_drive(cx);
        }
        match Pin::new(&mut this.incoming).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.idle_sleep = None;
                if let Some(data) = frame.data_ref() {
                    this.read = this.read.saturating_add(data.len());
                    if this.read > this.cap {
                        let cap = this.cap;
                        return Poll::Ready(Some(Err(
                            this.fail(format!("response body is larger than the {cap}-byte limit"))
                        )));
                    }
                }
                // A relaying server stops polling once `is_end_stream` says
                // this was the last frame: the connection is free now.
                if this.incoming.is_end_stream() {
                    this.end();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(
                this.fail(format!("reading the response body failed: {e}"))
            ))),
            Poll::Ready(None) => {
                this.end();
                Poll::Ready(None)
            }
            Poll::Pending => {
                let timeout = this.idle_timeout;
                let sleep = this
                    .idle_sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(
                        this.fail(format!("no response data for {timeout:?}"))
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.incoming.size_hint()
    }
}

/// Drops headers the client owns (hop-by-hop, `Host`, framing) and any
/// header named in the caller's own `Connection` header.
fn sanitize(mut headers: HeaderMap) -> HeaderMap {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    // The names present are looked at once (an API call carries a few);
    // only those to drop are removed.
    let dropped: Vec<HeaderName> = headers
        .keys()
        .filter(|&k| {
            CLIENT_OWNED.contains(k)
                || named.contains(k)
                || *k == "keep-alive"
                || *k == "proxy-connection"
        })
        .cloned()
        .collect();
    for h in &dropped {
        headers.remove(h);
    }
    headers
}

/// A refusal of a redirect hop: leaving `authorized_uris` is `redirect_blocked`;
/// SSRF refusals keep their own code. The message names the hop.
fn redirect_refusal(e: EgressError, hop: u32) -> EgressError {
    let code = match e.code {
        EgressCode::NotAuthorized
        | EgressCode::CredentialExfiltrationRefused
        | EgressCode::InvalidUrl => EgressCode::RedirectBlocked,
        other => other,
    };
    EgressError {
        code,
        guard: GuardStep::Redirects,
        host: e.host,
        detail: format!("redirect hop {hop} refused: {}", e.detail),
        address: e.address,
        rule: e.rule,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_drops_what_the_client_owns_and_what_connection_names() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("host", "elsewhere.test"),
            ("content-length", "5"),
            ("transfer-encoding", "chunked"),
            ("connection", "close, X-Hop-Only"),
            ("te", "trailers"),
            ("trailer", "x-t"),
            ("upgrade", "websocket"),
            ("proxy-authenticate", "Basic"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("x-hop-only", "1"),
            ("authorization", "Bearer t"),
            ("accept", "*/*"),
            ("x-custom", "a"),
            ("x-custom", "b"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let out = sanitize(h);
        let mut names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["accept", "authorization", "x-custom"]);
        assert_eq!(
            out.get_all("x-custom").iter().count(),
            2,
            "both values kept"
        );
        // Nothing to drop: the map comes back as it was.
        let mut plain = HeaderMap::new();
        plain.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        assert_eq!(sanitize(plain.clone()), plain);
    }
}

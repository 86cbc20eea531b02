//! Wiring: the router, the listeners, readiness and shutdown.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use airlock_platform_api::launch::{ReadyListen, SidecarFlushed, SidecarReady};
use airlock_platform_api::listener_guard::{self, Guard};

use crate::config::{ConfigError, Integration, Listen, SidecarConfig};
use crate::journal::Journal;
use crate::state::Sidecar;
use crate::{auth, egress, events, llm, mcp, proxy, sys};

#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot make the sidecar non-dumpable: {0}")]
    Hardening(std::io::Error),
    #[error("egress guard setup failed: {0}")]
    Egress(#[from] airlock_egress::EgressError),
    #[error(
        "the configuration names no egress journal: every request is recorded in it before it \
         is sent"
    )]
    NoJournal,
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    #[error("cannot listen on {what}: {source}")]
    Listen {
        what: String,
        source: std::io::Error,
    },
}

/// The full router around `mcp`: `/health` open, everything else behind
/// the token.
fn router(sidecar: Arc<Sidecar>, mcp: mcp::Endpoint) -> Router {
    let limit = sidecar.limits.max_request_bytes;
    let protected: Router<Arc<Sidecar>> = Router::new()
        .route("/events", post(events::ingest))
        .route("/artifacts", post(crate::artifacts::put))
        .nest_service("/mcp", mcp)
        .nest_service("/llm", llm::router(sidecar.clone()))
        .layer(middleware::from_fn_with_state(
            (sidecar.clone(), limit),
            admit_request,
        ));
    Router::new()
        .route("/health", get(health))
        .merge(protected)
        .with_state(sidecar)
}

/// What the API listeners serve: [`router`], with `POST /mcp` (every tool
/// call, the hot request) handed to the MCP endpoint directly, through the
/// same [`admit`] the router's middleware runs, and with the path the
/// router's nesting would hand it (`/`). Anything else, `/mcp/…` and other
/// methods included, goes through the router.
#[derive(Clone)]
pub struct App {
    sidecar: Arc<Sidecar>,
    mcp: mcp::Endpoint,
    router: Router,
}

pub fn app(sidecar: Arc<Sidecar>) -> App {
    let mcp = mcp::endpoint(sidecar.clone());
    App {
        router: router(sidecar.clone(), mcp.clone()),
        sidecar,
        mcp,
    }
}

impl tower_service::Service<Request> for App {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response, std::convert::Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        if req.method() != axum::http::Method::POST || req.uri() != "/mcp" {
            return Box::pin(self.router.call(req));
        }
        *req.uri_mut() = axum::http::Uri::from_static("/");
        match admit(&self.sidecar, self.sidecar.limits.max_request_bytes, req) {
            Admission::Admitted(req) => self.mcp.call(req),
            Admission::Refused(answer) => Box::pin(std::future::ready(Ok(answer))),
        }
    }
}

async fn health(State(sidecar): State<Arc<Sidecar>>) -> Response {
    axum::Json(json!({"status": "ok", "run_id": sidecar.run_id})).into_response()
}

pub fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        axum::Json(json!({"error": "unauthorized"})),
    )
        .into_response()
}

/// Every request to a protected route, in one layer: a declared body over
/// the limit is refused with 413 naming the limit (before the token is
/// looked at, as before), then a request without the sidecar token with 401;
/// the token headers are stripped, and a chunked body is cut at the limit by
/// the handlers' own readers.
async fn admit_request(
    State((sidecar, limit)): State<(Arc<Sidecar>, usize)>,
    req: Request,
    next: Next,
) -> Response {
    match admit(&sidecar, limit, req) {
        Admission::Admitted(req) => next.run(req).await,
        Admission::Refused(answer) => answer,
    }
}

/// What [`admit`] decided.
enum Admission {
    /// The request as the route gets it.
    Admitted(Request),
    Refused(Response),
}

/// [`admit_request`]'s decision.
fn admit(sidecar: &Sidecar, limit: usize, req: Request) -> Admission {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Admission::Refused(
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                axum::Json(json!({"error": "payload_too_large", "message": format!("request body exceeds the {limit}-byte limit")})),
            )
                .into_response(),
        );
    }
    if !auth::is_authorized(req.headers(), &sidecar.token) {
        return Admission::Refused(unauthorized());
    }
    let (mut parts, body) = req.into_parts();
    auth::strip_token_headers(&mut parts.headers);
    let body = axum::body::Body::new(http_body_util::Limited::new(body, limit));
    Admission::Admitted(Request::from_parts(parts, body))
}

fn bind_unix(path: &Path) -> Result<UnixListener, SidecarError> {
    // A stale socket from a crashed sidecar of the same run is replaced; any
    // other kind of file is left alone and reported.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_socket() {
            let _ = std::fs::remove_file(path);
        }
    }
    UnixListener::bind(path).map_err(|source| SidecarError::Listen {
        what: path.display().to_string(),
        source,
    })
}

/// Runs the sidecar until SIGTERM or SIGINT. Prints one JSON readiness line
/// on stdout once every listener is bound. On the way out the egress log is
/// drained within [`egress::DRAIN_DEADLINE`]: requests in flight finish (or
/// are recorded as aborted) and every record reaches the platform.
pub async fn run(mut cfg: SidecarConfig) -> Result<(), SidecarError> {
    sys::make_non_dumpable().map_err(SidecarError::Hardening)?;
    sys::raise_open_files_limit();
    // Every egress record is written ahead to the run's journal: without
    // one, nothing could be sent.
    let journal_path = cfg.egress_journal.clone().ok_or(SidecarError::NoJournal)?;
    let listen = std::mem::take(&mut cfg.listen);
    // Bound first: the guard refuses the sidecar's own addresses to every
    // egress site, so it must know them.
    let mut bound = Listeners::bind(&listen, &cfg.integrations).await?;
    let journal = Journal::open(&journal_path, cfg.limits.egress_journal_bytes)?;
    let sidecar = Sidecar::new(cfg, &bound.own, journal)?;
    if let Ok(mut slot) = sidecar.runner_mcp.lock() {
        *slot = std::mem::take(&mut bound.runner_mcp);
    }
    let ready = std::mem::take(&mut bound.ready);
    let sockets = std::mem::take(&mut bound.sockets);
    let mut tasks = bound.serve(&sidecar);
    tasks.spawn(crate::policy::follow(sidecar.clone()));
    println!("{}", SidecarReady::new(&sidecar.run_id, ready).to_line());
    tracing::info!(run_id = %sidecar.run_id, "sidecar ready");
    shutdown_signal().await;
    stop(&sidecar, &mut tasks, sockets).await;
    Ok(())
}

/// Stops a sidecar: no new connections; those open keep being served
/// while the egress log drains (a request in flight completes, a model
/// stream the agent left is read to its end for metering), within the
/// deadline; then the counts of what was shed are kept and the unix
/// sockets removed.
async fn stop(sidecar: &Sidecar, tasks: &mut JoinSet<()>, sockets: Vec<PathBuf>) {
    tracing::info!("sidecar stopping");
    tracing::debug!(target: "airlock::phase", "sidecar: stopping");
    tasks.abort_all();
    // (The drain's last step flushes every queued event, not only egress.)
    sidecar.egress.drain(egress::DRAIN_DEADLINE).await;
    sidecar.keep.report_shed();
    tracing::debug!(target: "airlock::phase", "sidecar: events flushed");
    for s in sockets {
        let _ = std::fs::remove_file(s);
    }
}

/// The listeners a sidecar serves on, bound, and what its readiness line
/// says of them.
#[derive(Default)]
struct Listeners {
    api_unix: Option<UnixListener>,
    api_tcp: Option<TcpListener>,
    proxy_unix: Option<UnixListener>,
    proxy_tcp: Option<TcpListener>,
    /// Each local runner's MCP listener, by namespace (taken by the MCP
    /// service when it starts).
    runner_mcp: HashMap<String, UnixListener>,
    /// Each local runner's proxy listener, with its namespace.
    runner_proxies: Vec<(String, UnixListener)>,
    /// The unix sockets made here, removed when the sidecar stops.
    sockets: Vec<PathBuf>,
    /// The readiness line's `listen`.
    ready: ReadyListen,
    /// The TCP addresses bound.
    own: Vec<SocketAddr>,
}

impl Listeners {
    /// Binds the API and proxy listeners `listen` names, and each local
    /// runner's two (its MCP stream and its proxy).
    async fn bind(listen: &Listen, integrations: &[Integration]) -> Result<Self, SidecarError> {
        let mut l = Listeners::default();
        if let Some(path) = &listen.unix {
            l.api_unix = Some(l.unix(path)?);
            l.ready.unix = Some(path.clone());
        }
        if let Some(addr) = listen.tcp {
            let (bound, local) = bind_tcp(addr, &mut l.own).await?;
            l.api_tcp = Some(bound);
            l.ready.tcp = Some(local);
        }
        if let Some(path) = &listen.proxy_unix {
            l.proxy_unix = Some(l.unix(path)?);
            l.ready.proxy_unix = Some(path.clone());
        }
        if let Some(addr) = listen.proxy_tcp {
            let (bound, local) = bind_tcp(addr, &mut l.own).await?;
            l.proxy_tcp = Some(bound);
            l.ready.proxy_tcp = Some(local);
        }
        for i in integrations {
            l.runner(i)?;
        }
        Ok(l)
    }

    /// Binds the unix socket `path` (removed when the sidecar stops).
    fn unix(&mut self, path: &Path) -> Result<UnixListener, SidecarError> {
        let l = bind_unix(path)?;
        self.sockets.push(path.to_owned());
        Ok(l)
    }

    /// Binds a local runner's two listeners (none for an integration
    /// without a runner).
    fn runner(&mut self, i: &Integration) -> Result<(), SidecarError> {
        let Some(r) = &i.runner else { return Ok(()) };
        let unix = |e: &airlock_platform_api::launch::Endpoint, what: &str| {
            e.unix_path()
                .map(Path::to_path_buf)
                .ok_or_else(|| SidecarError::Listen {
                    what: format!("{e:?} (runner {} {what})", i.namespace),
                    source: std::io::Error::other("a runner's listeners are unix sockets"),
                })
        };
        let mcp_path = unix(&r.mcp, "mcp")?;
        let proxy_path = unix(&r.proxy, "proxy")?;
        self.runner_mcp
            .insert(i.namespace.to_string(), bind_unix(&mcp_path)?);
        self.runner_proxies
            .push((i.namespace.to_string(), bind_unix(&proxy_path)?));
        self.ready.runners.insert(
            format!("runner_{}", i.namespace),
            [mcp_path.clone(), proxy_path.clone()],
        );
        self.sockets.push(mcp_path);
        self.sockets.push(proxy_path);
        Ok(())
    }

    /// Serves each listener on a task of its own. Each API listener is
    /// under its own guard (timeouts, a connection cap shared fairly
    /// between client processes or addresses): an agent holding
    /// connections open cannot grow the sidecar's memory past the cap, nor
    /// keep the runtime's reports out.
    fn serve(self, sidecar: &Arc<Sidecar>) -> JoinSet<()> {
        let app = app(sidecar.clone());
        let rules = sidecar.limits.api_listener();
        let mut tasks = JoinSet::new();
        if let Some(l) = self.api_unix {
            let app = app.clone();
            tasks.spawn(async move {
                // Watched for readability only: the runtime reading an answer
                // (or each event of a stream) does not wake the sidecar.
                let l = airlock_platform_api::read_interest::ReadInterestListener(l);
                listener_guard::serve(l, Guard::new(rules), app, std::future::pending()).await;
            });
        }
        if let Some(l) = self.api_tcp {
            let app = app.clone();
            tasks.spawn(async move {
                // (TCP_NODELAY is set on each connection by the guard's accept.)
                listener_guard::serve(l, Guard::new(rules), app, std::future::pending()).await;
            });
        }
        if let Some(l) = self.proxy_unix {
            tasks.spawn(proxy_accept_loop(
                l,
                sidecar.clone(),
                proxy::Scope::Agent,
                |_| (),
            ));
        }
        if let Some(l) = self.proxy_tcp {
            tasks.spawn(proxy_accept_loop(
                l,
                sidecar.clone(),
                proxy::Scope::Agent,
                |s: &TcpStream| {
                    let _ = s.set_nodelay(true);
                },
            ));
        }
        for (ns, l) in self.runner_proxies {
            let scope = proxy::Scope::Runner(ns.into());
            tasks.spawn(proxy_accept_loop(l, sidecar.clone(), scope, |_| ()));
        }
        tasks
    }
}

/// Binds `addr`; the address bound (port 0 resolved) is also the
/// sidecar's own, which the guard refuses.
async fn bind_tcp(
    addr: SocketAddr,
    own: &mut Vec<SocketAddr>,
) -> Result<(TcpListener, SocketAddr), SidecarError> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|source| SidecarError::Listen {
            what: addr.to_string(),
            source,
        })?;
    let local = l.local_addr().map_err(|source| SidecarError::Listen {
        what: addr.to_string(),
        source,
    })?;
    own.push(local);
    Ok((l, local))
}

/// Serves forward-proxy connections, at most `limits.max_proxy_connections`
/// at once: further clients wait in the listen backlog (an agent cannot run
/// the sidecar out of descriptors). Accept errors (such as running out of
/// descriptors anyway) are retried after a pause by axum's `Listener`, never
/// ending the loop.
async fn proxy_accept_loop<L>(
    mut l: L,
    sidecar: Arc<Sidecar>,
    scope: proxy::Scope,
    prepare: impl Fn(&L::Io),
) where
    L: axum::serve::Listener,
    L::Io: proxy::ProxyStream,
{
    let slots = Arc::new(Semaphore::new(sidecar.limits.max_proxy_connections.max(1)));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (s, _) = l.accept().await;
        prepare(&s);
        let sc = sidecar.clone();
        let scope = scope.clone();
        tokio::spawn(async move {
            proxy::serve_connection(s, sc, scope).await;
            drop(slot);
        });
    }
}

/// Resolves when the process that started us is gone (we were re-parented):
/// a sidecar must not outlive its platform, even one killed with SIGKILL.
pub async fn parent_gone() {
    let parent = rustix::process::getppid();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        if rustix::process::getppid() != parent {
            return;
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers, run until the process is killed.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = parent_gone() => tracing::warn!("the platform that started this sidecar is gone"),
    }
}

/// The sidecar as a program (`airlock sidecar` and `airlock-sidecar` alike,
/// once each has set up its logging): reads the configuration from stdin
/// (within [`MAX_CONFIG_BYTES`](crate::config::MAX_CONFIG_BYTES)), zeroes the
/// raw document, and serves on one thread until stopped. Exit code 2: the
/// configuration is unreadable or invalid; 1: the sidecar failed.
pub fn main_from_stdin() -> std::process::ExitCode {
    use std::io::{Read, Write};
    use std::process::ExitCode;
    let mut buf = Vec::new();
    let read = std::io::stdin()
        .take(crate::config::MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut buf);
    if let Err(e) = read {
        eprintln!("airlock sidecar: cannot read the configuration from stdin: {e}");
        return ExitCode::from(2);
    }
    let cfg = match crate::SidecarConfig::from_json(&buf) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("airlock sidecar: {e}");
            return ExitCode::from(2);
        }
    };
    // Zero the raw document (it held the tokens) now that it is parsed.
    buf.iter_mut().for_each(|b| *b = 0);
    drop(buf);
    // One thread: a sidecar serves one run, its work is I/O (tunnels are
    // spliced in the kernel), and on one thread no call waits for a
    // wake-up from another.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("airlock sidecar: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(run(cfg));
    // Every task is dropped with the runtime (an open request's drop is
    // recorded then): nothing of the sidecar runs after this, so its
    // flushed line is the last thing it says.
    drop(runtime);
    match served {
        Ok(()) => {
            // Nobody may be reading any more (a platform that stopped
            // watching): that is not the sidecar's failure.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", SidecarFlushed::line()).and_then(|()| out.flush());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("airlock sidecar: {e}");
            ExitCode::FAILURE
        }
    }
}

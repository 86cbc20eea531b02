//! What every HTTP listener of Airlock's own (`airlock serve`'s API, a
//! sidecar's API sockets) admits and how long it lets a connection sit: the
//! one decision against slowloris and descriptor exhaustion, in one place.
//!
//! - **Header-read timeout** ([`Settings::header_read_timeout`]): a
//!   connection has this long to send a complete request head, counted from
//!   its opening or from the end of its previous answer (so it is also how
//!   long a kept-alive connection may wait idle between requests). Past it
//!   the connection is closed.
//! - **Idle timeout** ([`Settings::idle_timeout`]): a connection on which no
//!   byte moves either way for this long is closed, a request in progress
//!   included (a body sent or an answer read a byte a minute).
//! - **Connection cap with per-peer fairness** ([`Settings::max_connections`],
//!   [`Settings::max_connections_per_peer`]): a peer is a client address
//!   (TCP) or a client process (unix socket, by its pid). A new connection of
//!   a peer at its own cap takes the place of that peer's oldest *idle*
//!   connection (one with no request in progress); a new connection while the
//!   listener is at its cap takes the place of the oldest idle connection of
//!   the peer holding the most. When there is no idle connection to close,
//!   the newcomer is closed at once (accepted, so it holds no backlog slot).
//!   So a flood of idle connections, from one address or many, never keeps a
//!   client that makes a request from being answered, and the descriptors a
//!   listener holds are bounded by its cap.
//!
//! [`serve`] runs a listener with these rules (HTTP/1.1 through hyper).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, Sleep};

/// A listener's limits. See the module's documentation for what each
/// decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Settings {
    /// `airlock serve`'s API listener by default.
    pub const API: Settings = Settings {
        max_connections: 1024,
        max_connections_per_peer: 256,
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
    };
}

/// Who a connection is from, for the per-peer cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    Address(IpAddr),
    /// A unix-socket client's process id.
    Process(i32),
    /// A client that could not be told apart (its socket gave no answer):
    /// all such share one share.
    Unknown,
}

/// A listener [`serve`] accepts from.
pub trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// What handlers find as `ConnectInfo<Addr>`.
    type Addr: Clone + Send + Sync + 'static;
    fn accept(&mut self) -> impl Future<Output = io::Result<(Self::Io, Self::Addr, Peer)>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    type Addr = std::net::SocketAddr;
    async fn accept(&mut self) -> io::Result<(Self::Io, Self::Addr, Peer)> {
        let (s, addr) = tokio::net::TcpListener::accept(self).await?;
        // Without TCP_NODELAY, Nagle and delayed ACKs add ~40 ms to small
        // streamed writes (event and model streams).
        let _ = s.set_nodelay(true);
        Ok((s, addr, Peer::Address(addr.ip().to_canonical())))
    }
}

fn unix_peer(s: &tokio::net::UnixStream) -> Peer {
    s.peer_cred()
        .ok()
        .and_then(|c| c.pid())
        .map_or(Peer::Unknown, Peer::Process)
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    type Addr = ();
    async fn accept(&mut self) -> io::Result<(Self::Io, (), Peer)> {
        let (s, _) = tokio::net::UnixListener::accept(self).await?;
        let peer = unix_peer(&s);
        Ok((s, (), peer))
    }
}

impl Accept for crate::read_interest::ReadInterestListener {
    type Io = crate::read_interest::ReadInterest;
    type Addr = ();
    async fn accept(&mut self) -> io::Result<(Self::Io, (), Peer)> {
        let (s, _) = self.0.accept().await?;
        let peer = unix_peer(&s);
        Ok((crate::read_interest::ReadInterest::from_tokio(s)?, (), peer))
    }
}

/// One open connection as the registry sees it.
#[derive(Debug)]
struct Slot {
    id: u64,
    peer: Peer,
    /// Requests in progress (from the head read to the answer's last byte or
    /// its drop).
    busy: AtomicUsize,
    /// Told when the slot was given to a newcomer: the connection ends.
    evicted: Notify,
}

/// Every open connection of one listener, by peer, oldest first.
#[derive(Debug, Default)]
struct Registry {
    open: usize,
    peers: HashMap<Peer, VecDeque<Arc<Slot>>>,
}

impl Registry {
    /// Takes `slot` out; false when it was not in (evicted already).
    fn remove(&mut self, slot: &Slot) -> bool {
        let Some(q) = self.peers.get_mut(&slot.peer) else {
            return false;
        };
        let Some(i) = q.iter().position(|s| s.id == slot.id) else {
            return false;
        };
        q.remove(i);
        if q.is_empty() {
            self.peers.remove(&slot.peer);
        }
        self.open -= 1;
        true
    }

    /// The oldest idle connection of `peer`, taken out.
    fn take_idle(&mut self, peer: Peer) -> Option<Arc<Slot>> {
        let q = self.peers.get(&peer)?;
        let victim = q
            .iter()
            .find(|s| s.busy.load(Ordering::Acquire) == 0)?
            .clone();
        self.remove(&victim);
        Some(victim)
    }
}

/// Counters of one listener's refusals (for the logs and tests).
#[derive(Debug, Default)]
pub struct GuardStats {
    /// Newcomers closed at once: no idle connection to give way.
    pub refused: AtomicU64,
    /// Idle connections closed to make room for a newcomer.
    pub evicted: AtomicU64,
}

/// The admission side of one listener (see the module's documentation).
#[derive(Debug, Clone)]
pub struct Guard {
    settings: Settings,
    registry: Arc<Mutex<Registry>>,
    next_id: Arc<AtomicU64>,
    pub stats: Arc<GuardStats>,
}

/// An admitted connection's place; dropping it frees the place.
#[derive(Debug)]
pub struct Admitted {
    slot: Arc<Slot>,
    registry: Arc<Mutex<Registry>>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Ok(mut r) = self.registry.lock() {
            r.remove(&self.slot);
        }
    }
}

impl Admitted {
    /// Resolves when the connection was closed to make room for another.
    pub async fn evicted(&self) {
        self.slot.evicted.notified().await
    }

    /// Marks a request in progress until the returned value is dropped.
    fn busy(&self) -> Busy {
        self.slot.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.slot.clone())
    }
}

struct Busy(Arc<Slot>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Guard {
    pub fn new(settings: Settings) -> Guard {
        Guard {
            settings: Settings {
                max_connections: settings.max_connections.max(1),
                max_connections_per_peer: settings.max_connections_per_peer.max(1),
                ..settings
            },
            registry: Arc::default(),
            next_id: Arc::default(),
            stats: Arc::default(),
        }
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.registry.lock().map(|r| r.open).unwrap_or(0)
    }

    /// The decision: admits a connection of `peer`, closing (evicting) an
    /// idle one when a cap is reached, or refuses it (`None`).
    pub fn admit(&self, peer: Peer) -> Option<Admitted> {
        let mut r = self.registry.lock().ok()?;
        let mine = r.peers.get(&peer).map_or(0, VecDeque::len);
        let victim = if mine >= self.settings.max_connections_per_peer {
            match r.take_idle(peer) {
                Some(v) => Some(v),
                None => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        } else if r.open >= self.settings.max_connections {
            // The peers holding the most first: the one flooding gives way.
            let mut by_size: Vec<(usize, Peer)> =
                r.peers.iter().map(|(p, q)| (q.len(), *p)).collect();
            by_size.sort_unstable_by_key(|p| std::cmp::Reverse(p.0));
            let found = by_size.into_iter().find_map(|(_, p)| r.take_idle(p));
            match found {
                Some(v) => Some(v),
                None => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        } else {
            None
        };
        if let Some(v) = victim {
            self.stats.evicted.fetch_add(1, Ordering::Relaxed);
            v.evicted.notify_one();
        }
        let slot = Arc::new(Slot {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            peer,
            busy: AtomicUsize::new(0),
            evicted: Notify::new(),
        });
        r.peers.entry(peer).or_default().push_back(slot.clone());
        r.open += 1;
        Some(Admitted {
            slot,
            registry: self.registry.clone(),
        })
    }
}

/// A connection closed when no byte moves either way for its idle timeout.
/// The timer is looked at only when the socket has nothing to give or take
/// (a `Pending`), and moved then to the last progress: no timer work on the
/// busy path.
pub struct IdleIo<T> {
    io: T,
    idle: Duration,
    last: Instant,
    timer: Pin<Box<Sleep>>,
}

impl<T> IdleIo<T> {
    pub fn new(io: T, idle: Duration) -> IdleIo<T> {
        let now = Instant::now();
        IdleIo {
            io,
            idle,
            last: now,
            timer: Box::pin(tokio::time::sleep_until(now + idle)),
        }
    }

    /// On a `Pending`: an error once the connection has been idle too long,
    /// else the timer armed for the moment it will have been.
    fn check(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        loop {
            let due = self.last + self.idle;
            if self.timer.deadline() != due {
                self.timer.as_mut().reset(due);
            }
            match self.timer.as_mut().poll(cx) {
                Poll::Pending => return None,
                Poll::Ready(()) if Instant::now() >= self.last + self.idle => {
                    return Some(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the connection was idle too long",
                    ));
                }
                Poll::Ready(()) => continue,
            }
        }
    }

    fn progress<R>(&mut self, cx: &mut Context<'_>, p: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match p {
            Poll::Ready(r) => {
                self.last = Instant::now();
                Poll::Ready(r)
            }
            Poll::Pending => match self.check(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let p = Pin::new(&mut this.io).poll_read(cx, buf);
        this.progress(cx, p)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let p = Pin::new(&mut this.io).poll_write(cx, buf);
        this.progress(cx, p)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let p = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.progress(cx, p)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let p = Pin::new(&mut this.io).poll_flush(cx);
        this.progress(cx, p)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// An answer's body that keeps its connection marked busy until its last
/// frame is sent (or the body is dropped).
struct BusyBody {
    body: axum::body::Body,
    _busy: Busy,
}

impl hyper::body::Body for BusyBody {
    type Data = Bytes;
    type Error = axum::Error;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// How long a retried accept error (out of descriptors, say) pauses the
/// listener.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Serves `listener` with `service` under `guard`'s rules until `shutdown`
/// resolves; then stops accepting, asks every open connection to close once
/// its request in progress is answered, and returns when all are closed.
/// Handlers find `ConnectInfo<L::Addr>` in the request's extensions. Accept
/// errors are retried after a pause, never ending the loop.
pub async fn serve<L, S>(
    mut listener: L,
    guard: Guard,
    service: S,
    shutdown: impl Future<Output = ()> + Send,
) where
    L: Accept,
    S: tower_service::Service<Request, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let (close_tx, close_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        let (io, addr, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!("accept failed: {e}");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Some(admitted) = guard.admit(peer) else {
            tracing::debug!(?peer, "connection refused: the listener is at its cap");
            drop(io);
            continue;
        };
        let settings = guard.settings;
        let service = service.clone();
        let mut close = close_rx.clone();
        tokio::spawn(async move {
            let admitted = Arc::new(admitted);
            let svc = {
                let admitted = admitted.clone();
                hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                    let busy = admitted.busy();
                    let mut req = req.map(axum::body::Body::new);
                    req.extensions_mut()
                        .insert(axum::extract::ConnectInfo(addr.clone()));
                    let mut service = service.clone();
                    async move {
                        std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
                        let answer = service.call(req).await?;
                        Ok::<_, Infallible>(answer.map(|body| BusyBody { body, _busy: busy }))
                    }
                })
            };
            let io = TokioIo::new(IdleIo::new(io, settings.idle_timeout));
            let mut conn = std::pin::pin!(
                hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(settings.header_read_timeout)
                    .serve_connection(io, svc)
            );
            let mut closing = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    () = admitted.evicted() => break,
                    r = close.wait_for(|c| *c), if !closing => {
                        closing = true;
                        if r.is_err() {
                            // The server is gone without a graceful close.
                            break;
                        }
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(close);
        });
    }
    drop(close_rx);
    let _ = close_tx.send(true);
    close_tx.closed().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(max: usize, per_peer: usize) -> Settings {
        Settings {
            max_connections: max,
            max_connections_per_peer: per_peer,
            ..Settings::API
        }
    }

    const A: Peer = Peer::Process(1);
    const B: Peer = Peer::Process(2);
    const C: Peer = Peer::Process(3);

    #[test]
    fn a_peer_at_its_cap_gives_up_its_oldest_idle_connection() {
        let g = Guard::new(settings(100, 2));
        let a1 = g.admit(A).unwrap();
        let a2 = g.admit(A).unwrap();
        let _busy = a1.busy();
        let a3 = g.admit(A).expect("a2 is idle: it gives way");
        assert_eq!(g.open(), 2);
        // a2 was told; a1 (busy) was not.
        assert!(futures_now(a2.evicted()), "the idle connection was evicted");
        assert!(!futures_now(a1.evicted()));
        drop(a3);
        assert_eq!(g.open(), 1);
    }

    #[test]
    fn a_peer_whose_connections_are_all_busy_is_refused_and_others_are_not() {
        let g = Guard::new(settings(3, 2));
        let a1 = g.admit(A).unwrap();
        let a2 = g.admit(A).unwrap();
        let (_b1, _b2) = (a1.busy(), a2.busy());
        assert!(g.admit(A).is_none());
        assert_eq!(g.stats.refused.load(Ordering::Relaxed), 1);
        let _b = g.admit(B).unwrap();
        // At the listener's cap: the peer holding the most gives way, but
        // all of A's are busy, so B's own idle one does.
        let _c = g.admit(C).expect("B's idle connection gives way");
        assert_eq!(g.open(), 3);
    }

    #[test]
    fn at_the_listeners_cap_the_peer_holding_the_most_gives_way() {
        let g = Guard::new(settings(4, 10));
        let a: Vec<_> = (0..3).map(|_| g.admit(A).unwrap()).collect();
        let b = g.admit(B).unwrap();
        let _c = g.admit(C).unwrap();
        assert_eq!(g.open(), 4);
        assert!(futures_now(a[0].evicted()));
        assert!(!futures_now(b.evicted()));
    }

    /// Whether `f` is ready at its first poll.
    fn futures_now(f: impl Future<Output = ()>) -> bool {
        let mut f = std::pin::pin!(f);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        f.as_mut().poll(&mut cx).is_ready()
    }
}

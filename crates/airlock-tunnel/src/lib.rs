//! Byte tunnels between two streams, as the sidecar's forward proxy and the
//! runtime's in-sandbox proxy relay need them: both directions, half-close
//! passed on, an idle timeout and byte counts. Between two sockets the bytes
//! move with splice(2) and never enter user space ([`relay_spliced`]);
//! other streams are copied ([`relay`]). [`Rewind`] replays bytes already
//! read in front of a stream.

#![forbid(unsafe_code)]

mod sys;

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// Implements `AsyncWrite` for a wrapper by passing every call to its
/// `inner` stream (the wrappers here only change the read side).
macro_rules! forward_async_write {
    ($wrapper:ident) => {
        impl<S: AsyncWrite + Unpin> AsyncWrite for $wrapper<S> {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.inner).poll_write(cx, buf)
            }
            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_flush(cx)
            }
            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                Pin::new(&mut self.inner).poll_shutdown(cx)
            }
            fn poll_write_vectored(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
            }
            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }
        }
    };
}

/// Last activity and byte counts of one tunnel.
struct Activity {
    start: Instant,
    /// Milliseconds after `start` of the last byte read from either side.
    last_ms: AtomicU64,
    read: [AtomicU64; 2],
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            read: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    fn stats(&self, idle: bool) -> RelayStats {
        RelayStats {
            client_to_upstream: self.read[0].load(Ordering::Relaxed),
            upstream_to_client: self.read[1].load(Ordering::Relaxed),
            idle,
        }
    }

    fn touch(&self, side: usize, n: usize) {
        if let Some(c) = self.read.get(side) {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
        self.last_ms.store(
            u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// A stream that reports what is read from it to its tunnel's [`Activity`].
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    side: usize,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        if n > 0 {
            self.activity.touch(self.side, n);
        }
        r
    }
}

forward_async_write!(Tracked);

/// What a tunnel carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    pub client_to_upstream: u64,
    pub upstream_to_client: u64,
    /// Closed by the idle timeout.
    pub idle: bool,
}

/// Relays both directions until both have ended (half-close is passed on),
/// an error occurs, or nothing was read from either side for `idle`.
pub async fn relay<A, B>(client: A, upstream: B, idle: Duration, buf: usize) -> RelayStats
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Arc::new(Activity::new());
    let mut a = Tracked {
        inner: client,
        activity: activity.clone(),
        side: 0,
    };
    let mut b = Tracked {
        inner: upstream,
        activity: activity.clone(),
        side: 1,
    };
    let idle_hit = tokio::select! {
        _ = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, buf, buf) => false,
        _ = idle_watch(&activity, idle) => true,
    };
    activity.stats(idle_hit)
}

/// A socket end of a tunnel that can be spliced: readiness comes from tokio,
/// the bytes move with splice(2) through a pipe and never enter user space.
#[derive(Clone, Copy)]
pub enum SpliceSocket<'a> {
    Tcp(&'a tokio::net::TcpStream),
    Unix(&'a tokio::net::UnixStream),
}

impl SpliceSocket<'_> {
    async fn ready(self, interest: Interest) -> io::Result<()> {
        match self {
            SpliceSocket::Tcp(s) => s.ready(interest).await.map(drop),
            SpliceSocket::Unix(s) => s.ready(interest).await.map(drop),
        }
    }

    /// Runs `f` on the socket's fd; a `WouldBlock` from `f` clears tokio's
    /// readiness so the next `ready` waits for the kernel.
    fn try_io<R>(
        self,
        interest: Interest,
        f: impl FnOnce(BorrowedFd<'_>) -> io::Result<R>,
    ) -> io::Result<R> {
        match self {
            SpliceSocket::Tcp(s) => s.try_io(interest, || f(s.as_fd())),
            SpliceSocket::Unix(s) => s.try_io(interest, || f(s.as_fd())),
        }
    }

    fn shutdown_write(self) {
        let _ = match self {
            SpliceSocket::Tcp(s) => sys::shutdown_write(s),
            SpliceSocket::Unix(s) => sys::shutdown_write(s),
        };
    }
}

/// Capacity asked for each direction's pipe: what one tunnel direction can
/// hold in the kernel while its destination is slow (a TCP socket buffer
/// can hold several times more; 256 KiB measured about a quarter slower here).
const PIPE_BYTES: usize = 1024 * 1024;

/// [`relay`] for two sockets, with splice(2): each direction moves bytes
/// socket → pipe → socket inside the kernel, so the sidecar neither copies
/// nor buffers the tunnel's payload. Same half-close, idle and counting
/// behaviour as [`relay`]. Fails only if the pipes cannot be opened (the
/// caller then relays by copying).
pub async fn relay_spliced(
    client: SpliceSocket<'_>,
    upstream: SpliceSocket<'_>,
    idle: Duration,
) -> io::Result<RelayStats> {
    let (up, down) = (sys::pipe(PIPE_BYTES)?, sys::pipe(PIPE_BYTES)?);
    let activity = Activity::new();
    let idle_hit = tokio::select! {
        _ = async {
            tokio::try_join!(
                splice_direction(client, upstream, &up, &activity, 0),
                splice_direction(upstream, client, &down, &activity, 1),
            )
        } => false,
        _ = idle_watch(&activity, idle) => true,
    };
    Ok(activity.stats(idle_hit))
}

/// One direction until `from` ends (then `to` is half-closed) or fails.
async fn splice_direction(
    from: SpliceSocket<'_>,
    to: SpliceSocket<'_>,
    pipe: &sys::Pipe,
    activity: &Activity,
    side: usize,
) -> io::Result<()> {
    loop {
        // Fill the (empty) pipe from `from`.
        let mut in_pipe = loop {
            from.ready(Interest::READABLE).await?;
            match from.try_io(Interest::READABLE, |fd| {
                sys::splice(fd, &pipe.write, PIPE_BYTES)
            }) {
                Ok(0) => {
                    to.shutdown_write();
                    return Ok(());
                }
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        activity.touch(side, in_pipe);
        // Drain it into `to`.
        while in_pipe > 0 {
            to.ready(Interest::WRITABLE).await?;
            match to.try_io(Interest::WRITABLE, |fd| {
                sys::splice(&pipe.read, fd, in_pipe)
            }) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => in_pipe = in_pipe.saturating_sub(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

async fn idle_watch(activity: &Activity, idle: Duration) {
    loop {
        let last = Duration::from_millis(activity.last_ms.load(Ordering::Relaxed));
        let deadline = activity.start + last + idle;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// Replays `prefix` before reading from `inner`; writes go to `inner`.
pub struct Rewind<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    pub fn new(prefix: Bytes, inner: S) -> Self {
        Rewind { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let chunk = self.prefix.split_to(n);
            buf.put_slice(&chunk);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

forward_async_write!(Rewind);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn relays_both_ways_and_counts() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (upstream, mut upstream_peer) = tokio::io::duplex(1024);
        let task = tokio::spawn(relay(client, upstream, Duration::from_secs(5), 4096));
        client_peer.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        upstream_peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        upstream_peer.write_all(b"world!").await.unwrap();
        let mut got = [0u8; 6];
        client_peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"world!");
        drop(client_peer);
        drop(upstream_peer);
        let stats = task.await.unwrap();
        assert_eq!(
            stats,
            RelayStats {
                client_to_upstream: 5,
                upstream_to_client: 6,
                idle: false
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_tunnel_is_closed_and_traffic_keeps_it_open() {
        let (client, mut client_peer) = tokio::io::duplex(1024);
        let (upstream, mut upstream_peer) = tokio::io::duplex(1024);
        let task = tokio::spawn(relay(client, upstream, Duration::from_secs(120), 4096));
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(100)).await;
            client_peer.write_all(b"x").await.unwrap();
            let mut b = [0u8; 1];
            upstream_peer.read_exact(&mut b).await.unwrap();
        }
        assert!(
            !task.is_finished(),
            "traffic every 100 s keeps a 120 s tunnel open"
        );
        tokio::time::sleep(Duration::from_secs(121)).await;
        let stats = task.await.unwrap();
        assert!(stats.idle);
        assert_eq!(stats.client_to_upstream, 3);
        // Both ends see the close.
        let mut b = [0u8; 1];
        assert_eq!(client_peer.read(&mut b).await.unwrap(), 0);
        assert_eq!(upstream_peer.read(&mut b).await.unwrap(), 0);
    }

    /// A connected TCP pair on loopback.
    async fn tcp_pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (a, b) = tokio::join!(tokio::net::TcpStream::connect(addr), l.accept());
        (a.unwrap(), b.unwrap().0)
    }

    #[tokio::test]
    async fn spliced_tunnel_carries_both_ways_half_closes_and_counts() {
        // client (unix) <-> sidecar <-> upstream (tcp), as in a namespace run.
        let (client_peer, client) = tokio::net::UnixStream::pair().unwrap();
        let (upstream, upstream_peer) = tcp_pair().await;
        let task = tokio::spawn(async move {
            relay_spliced(
                SpliceSocket::Unix(&client),
                SpliceSocket::Tcp(&upstream),
                Duration::from_secs(5),
            )
            .await
            .unwrap()
        });
        let (mut cr, mut cw) = client_peer.into_split();
        let (mut ur, mut uw) = upstream_peer.into_split();
        // 3 MiB up (more than a pipe holds), with a pattern to check order.
        let up: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let expect = up.clone();
        let writer = tokio::spawn(async move {
            cw.write_all(&up).await.unwrap();
            cw.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        ur.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert!(
            got == expect,
            "the upstream got the client's bytes in order"
        );
        // After the client's half-close the other direction still works.
        uw.write_all(b"answer after half-close").await.unwrap();
        uw.shutdown().await.unwrap();
        let mut back = Vec::new();
        cr.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"answer after half-close");
        let stats = task.await.unwrap();
        assert_eq!(
            stats,
            RelayStats {
                client_to_upstream: 3 * 1024 * 1024,
                upstream_to_client: 23,
                idle: false
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn spliced_tunnel_closes_when_idle() {
        let (client, mut client_peer) = tcp_pair().await;
        let (upstream, mut upstream_peer) = tcp_pair().await;
        let task = tokio::spawn(async move {
            relay_spliced(
                SpliceSocket::Tcp(&client),
                SpliceSocket::Tcp(&upstream),
                Duration::from_secs(120),
            )
            .await
            .unwrap()
        });
        client_peer.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        upstream_peer.read_exact(&mut b).await.unwrap();
        tokio::time::sleep(Duration::from_secs(121)).await;
        let stats = task.await.unwrap();
        assert!(stats.idle);
        assert_eq!(stats.client_to_upstream, 1);
        assert_eq!(client_peer.read(&mut b).await.unwrap(), 0);
        assert_eq!(upstream_peer.read(&mut b).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn rewind_replays_then_reads() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut r = Rewind::new(Bytes::from_static(b"abc"), a);
        b.write_all(b"def").await.unwrap();
        drop(b);
        let mut s = Vec::new();
        r.read_to_end(&mut s).await.unwrap();
        assert_eq!(s, b"abcdef");
    }
}

//! Byte relays: the CONNECT tunnel (both directions, with an idle timeout and
//! byte counts) and [`Rewind`], which replays bytes already read in front of
//! a stream.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Last activity and byte counts of one tunnel.
struct Activity {
    start: Instant,
    /// Milliseconds after `start` of the last byte read from either side.
    last_ms: AtomicU64,
    read: [AtomicU64; 2],
}

impl Activity {
    fn touch(&self, side: usize, n: usize) {
        if let Some(c) = self.read.get(side) {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
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

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
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
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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
    let activity = Arc::new(Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
        read: [AtomicU64::new(0), AtomicU64::new(0)],
    });
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
    RelayStats {
        client_to_upstream: activity.read[0].load(Ordering::Relaxed),
        upstream_to_client: activity.read[1].load(Ordering::Relaxed),
        idle: idle_hit,
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

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
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
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

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

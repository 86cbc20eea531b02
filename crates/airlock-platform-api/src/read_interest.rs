//! A unix-socket connection watched for readability only.
//!
//! On a unix stream socket every message the peer reads frees buffer space
//! and wakes whoever polls the writing end for writability (the kernel's
//! `unix_write_space`). tokio registers every socket for both directions
//! (edge-triggered), so a server parked in `epoll_wait` is woken each time
//! its client reads an answer — for nothing: the answer was written whole.
//! On the platform that is one useless wake of a runtime worker per
//! credential fetch, on the path of the call that asked for it.
//!
//! [`ReadInterest`] registers the socket for readability only. Writes go
//! straight to the socket; only a write the socket cannot take now (its
//! buffer full: a large answer to a slow reader) registers a duplicate of
//! the descriptor for writability, waits on it, and drops it once the write
//! went through.

use std::io::{self, IoSlice, Read, Write};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

use crate::sys::register;

/// A connected unix stream socket, registered for readability only (see the
/// module's documentation).
#[derive(Debug)]
pub struct ReadInterest {
    io: AsyncFd<UnixStream>,
    /// While a write waits for buffer space: a duplicate of the descriptor,
    /// registered for writability.
    space: Option<AsyncFd<UnixStream>>,
}

impl ReadInterest {
    /// Takes over `stream` (it must be in non-blocking mode, as tokio's are);
    /// must be called within a tokio runtime.
    fn new(stream: UnixStream) -> io::Result<ReadInterest> {
        Ok(ReadInterest {
            io: register(stream, Interest::READABLE)?,
            space: None,
        })
    }

    /// Takes over a tokio socket (its registration for both directions is
    /// given up).
    pub fn from_tokio(stream: tokio::net::UnixStream) -> io::Result<ReadInterest> {
        ReadInterest::new(stream.into_std()?)
    }

    /// Tries `write` until the socket takes it, waiting for space on the
    /// duplicate registered for writability when it cannot.
    fn poll_writing(
        &mut self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(&UnixStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        let done = match write(self.io.get_ref()) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let space = match &mut self.space {
                    Some(space) => space,
                    None => self.space.insert(register(
                        self.io.get_ref().try_clone()?,
                        Interest::WRITABLE,
                    )?),
                };
                loop {
                    let mut ready = ready!(space.poll_write_ready(cx))?;
                    // Not writable after all: readiness cleared, wait again.
                    if let Ok(done) = ready.try_io(|s| write(s.get_ref())) {
                        break done;
                    }
                }
            }
            done => done,
        };
        self.space = None;
        Poll::Ready(done)
    }
}

impl AsyncRead for ReadInterest {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let mut ready = ready!(this.io.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match ready.try_io(|s| s.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for ReadInterest {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_writing(cx, |s| (&*s).write(data))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_writing(cx, |s| (&*s).write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(
            match self.io.get_ref().shutdown(std::net::Shutdown::Write) {
                Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
                done => done,
            },
        )
    }
}

/// A unix listener whose connections are [`ReadInterest`]s, for
/// `axum::serve`: the platform's internal API and the sidecar's own API
/// answer on one.
#[derive(Debug)]
pub struct ReadInterestListener(pub tokio::net::UnixListener);

impl axum::serve::Listener for ReadInterestListener {
    type Io = ReadInterest;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            // Accept errors are logged and retried by axum's own listener.
            let (stream, addr) = axum::serve::Listener::accept(&mut self.0).await;
            match ReadInterest::from_tokio(stream) {
                Ok(io) => return (io, addr),
                Err(e) => tracing::warn!("a unix connection could not be registered: {e}"),
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The kernel's own view of a registration: the event mask each epoll
    /// instance of this process holds for the socket with inode `ino`
    /// (`/proc/self/fdinfo` of every epoll descriptor).
    fn epoll_masks(ino: u64) -> Vec<u32> {
        let mut masks = Vec::new();
        for entry in std::fs::read_dir("/proc/self/fdinfo").expect("fdinfo") {
            let Ok(info) = std::fs::read_to_string(entry.expect("entry").path()) else {
                continue;
            };
            for line in info.lines().filter(|l| l.starts_with("tfd:")) {
                let field = |name: &str| {
                    let mut words = line.split_whitespace();
                    words.find(|w| *w == name)?;
                    words.next().map(str::to_owned)
                };
                // "… pos:0 ino:377f7 sdev:9": the target's inode, in hex.
                let ino_here = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("ino:"))
                    .and_then(|v| u64::from_str_radix(v, 16).ok());
                if ino_here == Some(ino)
                    && let Some(events) = field("events:")
                {
                    masks.push(u32::from_str_radix(&events, 16).expect("events mask"));
                }
            }
        }
        masks
    }

    fn inode(s: &impl std::os::fd::AsFd) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let file = std::fs::File::from(s.as_fd().try_clone_to_owned().expect("dup"));
        file.metadata().expect("fstat").ino()
    }

    const EPOLLIN: u32 = 0x1;
    const EPOLLOUT: u32 = 0x4;

    /// tokio's own socket is watched for writability, so its peer's every
    /// read wakes it; a `ReadInterest` is watched for readability alone.
    #[tokio::test]
    async fn only_readability_is_watched() {
        let (a, b) = tokio::net::UnixStream::pair().expect("pair");
        let ino = inode(&a);
        // (The runtime's epoll instance may be open under two descriptors,
        // each listing the registration.)
        let tokio_masks = epoll_masks(ino);
        assert!(!tokio_masks.is_empty(), "tokio registered the socket");
        assert!(
            tokio_masks.iter().all(|m| m & EPOLLOUT != 0),
            "tokio watches writability: {tokio_masks:x?}"
        );

        let a = ReadInterest::from_tokio(a).expect("read interest");
        let masks = epoll_masks(ino);
        assert!(!masks.is_empty(), "the socket is registered");
        assert!(
            masks.iter().all(|m| m & EPOLLIN != 0 && m & EPOLLOUT == 0),
            "readability is watched, writability is not: {masks:x?}"
        );
        drop((a, b));
    }

    /// Both directions work, a write larger than the socket's buffer waits
    /// for the reader and loses nothing, and the peer's close reads as EOF.
    #[tokio::test]
    async fn it_reads_writes_and_waits_for_space() {
        let (a, b) = tokio::net::UnixStream::pair().expect("pair");
        let mut a = ReadInterest::from_tokio(a).expect("read interest");
        let mut b = b;
        b.write_all(b"ping").await.expect("write");
        let mut got = [0u8; 4];
        a.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"ping");

        // 8 MiB: far more than a unix socket buffers, so the writer must
        // wait for space (on the duplicate registered for writability).
        let big: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        let sent = big.clone();
        let writer = tokio::spawn(async move {
            a.write_all(&sent).await.expect("large write");
            assert!(a.space.is_none(), "the wait for space is dropped once done");
            a.shutdown().await.expect("shutdown");
            a
        });
        let mut received = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(30),
            b.read_to_end(&mut received),
        )
        .await
        .expect("the writer waited for space and was woken")
        .expect("read all");
        assert_eq!(received.len(), big.len());
        assert!(received == big, "what arrived is what was written");
        let mut a = writer.await.expect("writer");

        drop(b);
        let mut rest = Vec::new();
        let n = a.read_to_end(&mut rest).await.expect("eof");
        assert_eq!(n, 0, "the peer's close reads as end of stream");
    }
}

//! A kept-alive HTTP/1 client connection that has no task of its own: whoever
//! sends on it drives it.
//!
//! hyper's client connection is a future that carries the bytes (writes the
//! queued request, reads and decodes the answer) only when it is polled. The
//! usual way spawns it as a task of its own; then every request and every
//! body frame crosses between two tasks, and on a runtime of one thread (the
//! sidecar's) a request is written only when the connection's task next
//! gets a turn — after whatever the sender does next. Driven by the sender
//! instead ([`driven`]), a request is on the wire the moment its future is
//! first polled, the answer is read in the sender's task, and a streamed
//! body yields every frame its last read brought without a hand-over
//! between them. A connection in the pool is not polled; a close by the
//! peer is noticed when it is next driven.
//!
//! The sidecar's client for the platform and the guarded client both keep
//! their connections so.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A client connection (`hyper::client::conn::http1::Connection`, over
/// whichever stream). Once it has ended it is dropped, which hands every
/// request it had not sent back to its sender.
pub struct Connection {
    inner: Option<Pin<Box<dyn Future<Output = hyper::Result<()>> + Send + Sync>>>,
}

impl Connection {
    pub fn new(conn: impl Future<Output = hyper::Result<()>> + Send + Sync + 'static) -> Self {
        Connection {
            inner: Some(Box::pin(conn)),
        }
    }

    /// Whether the connection has ended.
    pub fn is_ended(&self) -> bool {
        self.inner.is_none()
    }

    /// Carries what it can (writes what is queued, reads and hands over what
    /// arrived); ready once the connection has ended, with its error.
    pub fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<Option<hyper::Error>> {
        let Some(conn) = &mut self.inner else {
            return Poll::Ready(None);
        };
        match conn.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                self.inner = None;
                Poll::Ready(r.err())
            }
        }
    }
}

/// The connection ended (closed by the peer, or failed) before the work did.
#[derive(Debug)]
pub struct Ended(pub Option<hyper::Error>);

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(e) => write!(f, "{e}"),
            None => f.write_str("the connection was closed"),
        }
    }
}

/// Runs `work` (sending a request, reading its body, waiting until the
/// connection takes another) while driving `conn`: the connection first (it
/// writes what is queued and hands over what it read), then the work.
pub async fn driven<T>(conn: &mut Connection, work: impl Future<Output = T>) -> Result<T, Ended> {
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        let ended = match conn.poll_drive(cx) {
            Poll::Pending => None,
            Poll::Ready(e) => Some(e),
        };
        match (work.as_mut().poll(cx), ended) {
            (Poll::Ready(out), _) => Poll::Ready(Ok(out)),
            (Poll::Pending, None) => Poll::Pending,
            (Poll::Pending, Some(e)) => Poll::Ready(Err(Ended(e))),
        }
    })
    .await
}

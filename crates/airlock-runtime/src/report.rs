//! Heartbeats, log lines and the result, batched to the sidecar's `/events`.
//!
//! Two paths, by what may be lost: heartbeats and the agent's log lines go
//! through a bounded queue and are shed when it is full (the agent's output
//! never waits for the sidecar), each shed line counted; the agent's end
//! ([`Reporter::end`]) is sent on its own, with the count of what was shed,
//! and sent again until the sidecar answers that it kept it.

use std::time::Duration;

use airlock_platform_api::clock::now_ms;
use airlock_platform_api::sidecar_auth::SidecarAuth;
use airlock_platform_api::wire::{EventBatch, RunEvent};
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use secrecy::SecretString;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::relay::Dial;
use tokio::sync::{mpsc, oneshot};

/// How long the reporter waits for more events before sending a batch.
const LINGER: Duration = Duration::from_millis(20);
/// Most events in one request.
const MAX_BATCH: usize = 500;

enum Msg {
    Event(Box<RunEvent>),
    Flush(oneshot::Sender<()>),
}

/// How long the agent's end is sent again while the sidecar does not keep
/// it (the platform then judges the run by the runtime's exit).
const END_PATIENCE: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub struct Reporter {
    tx: mpsc::Sender<Msg>,
    socket: Dial,
    token: SecretString,
    /// Log lines (and their bytes) handed to [`Reporter::send`], and those
    /// the sidecar took: the difference is what was shed (the queue was
    /// full, a request failed, or the end came first).
    lines: Arc<LineCounts>,
}

#[derive(Default)]
struct LineCounts {
    read: AtomicU64,
    read_bytes: AtomicU64,
    delivered: AtomicU64,
    delivered_bytes: AtomicU64,
}

impl LineCounts {
    fn delivered(&self, events: &[RunEvent]) {
        for e in events {
            if let RunEvent::Log { line, .. } = e {
                self.delivered.fetch_add(1, Ordering::AcqRel);
                self.delivered_bytes
                    .fetch_add(line.len() as u64, Ordering::AcqRel);
            }
        }
    }
}

impl Reporter {
    pub fn start(socket: Dial, token: SecretString) -> Reporter {
        Reporter::with_linger(socket, token, LINGER)
    }

    fn with_linger(socket: Dial, token: SecretString, linger: Duration) -> Reporter {
        let (tx, mut rx) = mpsc::channel::<Msg>(4096);
        let (sock, tok) = (socket.clone(), token.clone());
        let lines: Arc<LineCounts> = Arc::default();
        let counts = lines.clone();
        tokio::spawn(async move {
            let (socket, token) = (sock, tok);
            while let Some(first) = rx.recv().await {
                let mut events = Vec::new();
                let mut waiters = Vec::new();
                let take =
                    |m: Msg, events: &mut Vec<RunEvent>, waiters: &mut Vec<oneshot::Sender<()>>| {
                        match m {
                            Msg::Event(e) => events.push(*e),
                            Msg::Flush(w) => waiters.push(w),
                        }
                    };
                take(first, &mut events, &mut waiters);
                // Gather what arrives in the next few milliseconds into one
                // request; a flush cuts it short (the agent's end is waiting).
                let deadline = tokio::time::Instant::now() + linger;
                while waiters.is_empty() && events.len() < MAX_BATCH {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(m)) => take(m, &mut events, &mut waiters),
                        Ok(None) | Err(_) => break,
                    }
                }
                if !events.is_empty() {
                    let counted = events.clone();
                    match post(&socket, &token, events).await {
                        Ok(()) => counts.delivered(&counted),
                        Err(e) => {
                            eprintln!("airlock runtime warning: events not delivered: {e}")
                        }
                    }
                }
                for w in waiters {
                    let _ = w.send(());
                }
            }
        });
        Reporter {
            tx,
            socket,
            token,
            lines,
        }
    }

    /// Queues a heartbeat or a log line; a log line the queue has no room
    /// for is shed and counted.
    pub fn send(&self, e: RunEvent) {
        if let RunEvent::Log { line, .. } = &e {
            self.lines.read.fetch_add(1, Ordering::AcqRel);
            self.lines
                .read_bytes
                .fetch_add(line.len() as u64, Ordering::AcqRel);
        }
        let _ = self.tx.try_send(Msg::Event(Box::new(e)));
    }

    /// Sends the agent's end (after what is queued, within the flush's
    /// bound), with the count of the lines shed, until the sidecar keeps it
    /// (within [`END_PATIENCE`]); `false` if it never did.
    pub async fn end(&self, result: RunEvent) -> bool {
        self.flush().await;
        let mut events = Vec::with_capacity(2);
        let c = &self.lines;
        let lines = c
            .read
            .load(Ordering::Acquire)
            .saturating_sub(c.delivered.load(Ordering::Acquire));
        let bytes = c
            .read_bytes
            .load(Ordering::Acquire)
            .saturating_sub(c.delivered_bytes.load(Ordering::Acquire));
        if lines > 0 {
            events.push(RunEvent::Shed {
                at: now_ms(),
                lines,
                bytes,
            });
        }
        events.push(result);
        let give_up = tokio::time::Instant::now() + END_PATIENCE;
        let mut wait = Duration::from_millis(50);
        loop {
            match post(&self.socket, &self.token, events.clone()).await {
                Ok(()) => return true,
                Err(e) if tokio::time::Instant::now() + wait < give_up => {
                    eprintln!("airlock runtime warning: the agent's end not kept yet: {e}");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    eprintln!("airlock runtime warning: the agent's end was not kept: {e}");
                    return false;
                }
            }
        }
    }

    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(10), rx).await;
        }
    }
}

/// Why a batch did not reach the sidecar: one variant per step of its post.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PostError {
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    #[error("{0}")]
    Connect(#[source] std::io::Error),
    #[error("{0}")]
    Http(#[source] hyper::Error),
    #[error("{0}")]
    Request(#[source] http::Error),
    #[error("sidecar answered {0}")]
    Refused(http::StatusCode),
}

async fn post(socket: &Dial, token: &SecretString, events: Vec<RunEvent>) -> Result<(), PostError> {
    let body = serde_json::to_vec(&EventBatch { events }).map_err(PostError::Encode)?;
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    send(socket, token, "/events", headers, Bytes::from(body)).await?;
    Ok(())
}

/// One `POST path` to the sidecar with its token and `headers`; a
/// non-success answer is [`PostError::Refused`].
pub(crate) async fn send(
    socket: &Dial,
    token: &SecretString,
    path: &str,
    headers: http::HeaderMap,
    body: Bytes,
) -> Result<http::Response<hyper::body::Incoming>, PostError> {
    let stream = socket.connect().await.map_err(PostError::Connect)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(PostError::Http)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::post(path)
        .header("host", "sidecar")
        .header(
            SidecarAuth::HEADER,
            SidecarAuth(token)
                .value()
                .map_err(http::Error::from)
                .map_err(PostError::Request)?,
        )
        .body(Full::new(body))
        .map_err(PostError::Request)?;
    req.headers_mut().extend(headers);
    let resp = sender.send_request(req).await.map_err(PostError::Http)?;
    if !resp.status().is_success() {
        return Err(PostError::Refused(resp.status()));
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::UnixListener;

    use super::*;

    /// One request's body, answered 202.
    async fn accept_one(l: UnixListener) -> String {
        let (s, _) = l.accept().await.unwrap();
        let mut s = BufReader::new(s);
        let mut len = 0;
        loop {
            let mut line = String::new();
            s.read_line(&mut line).await.unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; len];
        s.read_exact(&mut body).await.unwrap();
        s.get_mut()
            .write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        String::from_utf8(body).unwrap()
    }

    #[tokio::test]
    async fn a_flush_sends_what_is_queued_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("sidecar.sock");
        let server = tokio::spawn(accept_one(UnixListener::bind(&sock).unwrap()));
        // A linger no run waits out: only the flush can send the batch.
        let r = Reporter::with_linger(
            Dial::Unix(sock),
            SecretString::from("t"),
            Duration::from_secs(3600),
        );
        r.send(RunEvent::Heartbeat { at: 7 });
        tokio::time::timeout(Duration::from_secs(30), r.flush())
            .await
            .expect("the flush waited for the linger");
        let body = tokio::time::timeout(Duration::from_secs(30), server)
            .await
            .unwrap()
            .unwrap();
        assert!(body.contains("heartbeat"), "{body}");
    }
}

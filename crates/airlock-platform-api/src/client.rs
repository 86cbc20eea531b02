//! The sidecar's client for the internal API: HTTP/1.1 over the platform's
//! unix socket, authenticated with the run token.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use airlock_egress::conn::{Connection, Ended, driven};
use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use tokio::net::UnixStream;

use crate::wire::{
    Accepted, CredentialResponse, ErrorBody, EventBatch, HistoryResponse, MemoriesResponse, PREFIX,
    RunEvent, StoredResultRef,
};

/// Largest answer the client reads from the platform.
const MAX_ANSWER: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    #[error("cannot reach the platform at {path}: {source}")]
    Unreachable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("platform request failed: {0}")]
    Transport(String),
    #[error("platform refused the request ({status}): {code}: {message}")]
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    #[error("platform answered with something unexpected: {0}")]
    BadAnswer(String),
}

impl PlatformError {
    pub fn status(&self) -> Option<u16> {
        match self {
            PlatformError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Idle keep-alive connections kept for reuse.
const MAX_IDLE: usize = 8;

type Sender = SendRequest<Full<Bytes>>;

/// One keep-alive connection to the platform: its request handle and the
/// connection itself, driven by whoever sends on it
/// ([`airlock_egress::conn`]): a request is on the wire the moment its
/// future is first polled, and the answer is read in the caller's task.
struct Conn {
    sender: Sender,
    conn: Connection,
}

fn ended(e: Ended) -> PlatformError {
    PlatformError::Transport(e.to_string())
}

/// The request an idle connection could not take, to send on a fresh one;
/// an error if it may have been sent.
fn unsent(
    mut e: hyper::client::conn::TrySendError<Request<Full<Bytes>>>,
) -> Result<Request<Full<Bytes>>, PlatformError> {
    match e.take_message() {
        Some(req) => Ok(req),
        None => Err(PlatformError::Transport(e.into_error().to_string())),
    }
}

/// Cheap to clone (clones share the pool). Keeps up to [`MAX_IDLE`] idle
/// keep-alive connections to the platform's socket: a credential fetch on
/// the request path then costs one round trip, not a connect, a handshake
/// and a new server task.
#[derive(Clone)]
pub struct PlatformClient {
    socket: PathBuf,
    run_token: SecretString,
    idle: Arc<Mutex<Vec<Conn>>>,
}

impl std::fmt::Debug for PlatformClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlatformClient")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl PlatformClient {
    pub fn new(socket: impl AsRef<Path>, run_token: SecretString) -> Self {
        PlatformClient {
            socket: socket.as_ref().to_owned(),
            run_token,
            idle: Arc::default(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn request(
        &self,
        method: Method,
        path_and_query: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<(StatusCode, http::HeaderMap, Bytes), PlatformError> {
        let mut req = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(header::HOST, "platform")
            .header(
                header::AUTHORIZATION,
                format!("Bearer {}", self.run_token.expose_secret()),
            );
        if let Some(ct) = content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| PlatformError::Transport(e.to_string()))?;
        let (mut c, resp) = self.send(req).await?;
        let (parts, body) = resp.into_parts();
        let limited = http_body_util::Limited::new(body, MAX_ANSWER);
        // The answer read whole, then the connection's readiness for the
        // next request, in one drive: once it says it takes one, it is kept
        // for it.
        let Conn { sender, conn } = &mut c;
        let (collected, ready) = driven(conn, async {
            let collected = limited.collect().await;
            let ready = collected.is_ok()
                && std::future::poll_fn(|cx| sender.poll_ready(cx))
                    .await
                    .is_ok();
            (collected, ready)
        })
        .await
        .map_err(ended)?;
        let bytes = collected
            .map_err(|e| PlatformError::Transport(e.to_string()))?
            .to_bytes();
        if ready {
            self.put_idle(c);
        }
        if !parts.status.is_success() {
            let err: ErrorBody = serde_json::from_slice(&bytes).unwrap_or(ErrorBody {
                error: "unknown".into(),
                message: String::from_utf8_lossy(&bytes).chars().take(200).collect(),
            });
            return Err(PlatformError::Refused {
                status: parts.status.as_u16(),
                code: err.error,
                message: err.message,
            });
        }
        Ok((parts.status, parts.headers, bytes))
    }

    async fn connect(&self) -> Result<Conn, PlatformError> {
        let stream = UnixStream::connect(&self.socket).await.map_err(|source| {
            PlatformError::Unreachable {
                path: self.socket.clone(),
                source,
            }
        })?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| PlatformError::Transport(e.to_string()))?;
        Ok(Conn {
            sender,
            conn: Connection::new(conn),
        })
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().ok()?;
        while let Some(c) = idle.pop() {
            if c.sender.is_ready() {
                return Some(c);
            }
        }
        None
    }

    fn put_idle(&self, c: Conn) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(c);
        }
    }

    /// Sends on an idle connection, or a new one. A request an idle
    /// connection could not take (the platform closed it meanwhile) comes
    /// back unsent and goes out once more on a fresh connection, so no
    /// request is ever sent twice.
    async fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<(Conn, http::Response<hyper::body::Incoming>), PlatformError> {
        let req = match self.take_idle() {
            Some(mut c) => {
                let mut sent = std::pin::pin!(c.sender.try_send_request(req));
                match driven(&mut c.conn, sent.as_mut()).await {
                    Ok(Ok(resp)) => return Ok((c, resp)),
                    Ok(Err(e)) => unsent(e)?,
                    Err(e) => {
                        // The connection ended first: dropping it hands back
                        // what it had not taken.
                        drop(c);
                        match sent.await {
                            Ok(_) => return Err(ended(e)),
                            Err(e) => unsent(e)?,
                        }
                    }
                }
            }
            None => req,
        };
        let mut c = self.connect().await?;
        let sent = c.sender.send_request(req);
        let resp = driven(&mut c.conn, sent)
            .await
            .map_err(ended)?
            .map_err(|e| PlatformError::Transport(e.to_string()))?;
        Ok((c, resp))
    }

    async fn get_json<T: DeserializeOwned>(
        &self,
        path_and_query: &str,
    ) -> Result<T, PlatformError> {
        let (_, _, body) = self
            .request(Method::GET, path_and_query, None, Bytes::new())
            .await?;
        serde_json::from_slice(&body).map_err(|e| PlatformError::BadAnswer(e.to_string()))
    }

    /// The credential of `integration`'s connection, decrypted for this request.
    pub async fn credential(&self, integration: &str) -> Result<CredentialResponse, PlatformError> {
        self.get_json(&format!("{PREFIX}/credentials/{}", encode(integration)))
            .await
    }

    /// Earlier runs of this run's agent, newest first.
    pub async fn history(
        &self,
        limit: u32,
        fields: &[&str],
    ) -> Result<HistoryResponse, PlatformError> {
        let fields: Vec<String> = fields.iter().map(|f| encode(f)).collect();
        self.get_json(&format!(
            "{PREFIX}/history?limit={limit}&fields={}",
            fields.join(",")
        ))
        .await
    }

    /// Memories of this run's agent matching `q`.
    pub async fn memories(&self, q: &str, limit: u32) -> Result<MemoriesResponse, PlatformError> {
        self.get_json(&format!("{PREFIX}/memories?q={}&limit={limit}", encode(q)))
            .await
    }

    /// Appends events (heartbeats, logs, result, cost, egress) to the run.
    pub async fn events(&self, events: Vec<RunEvent>) -> Result<Accepted, PlatformError> {
        let body = serde_json::to_vec(&EventBatch { events })
            .map_err(|e| PlatformError::Transport(e.to_string()))?;
        let (_, _, answer) = self
            .request(
                Method::POST,
                &format!("{PREFIX}/events"),
                Some("application/json"),
                body.into(),
            )
            .await?;
        serde_json::from_slice(&answer).map_err(|e| PlatformError::BadAnswer(e.to_string()))
    }

    /// Stores a large result for the run.
    pub async fn put_result(
        &self,
        content_type: &str,
        body: Bytes,
    ) -> Result<StoredResultRef, PlatformError> {
        let (_, _, answer) = self
            .request(
                Method::POST,
                &format!("{PREFIX}/results"),
                Some(content_type),
                body,
            )
            .await?;
        serde_json::from_slice(&answer).map_err(|e| PlatformError::BadAnswer(e.to_string()))
    }

    /// Reads a stored result of this run: `(content type, body)`.
    pub async fn get_result(&self, id: &str) -> Result<(String, Bytes), PlatformError> {
        let (_, headers, body) = self
            .request(
                Method::GET,
                &format!("{PREFIX}/results/{}", encode(id)),
                None,
                Bytes::new(),
            )
            .await?;
        let ct = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/octet-stream")
            .to_owned();
        Ok((ct, body))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::{Notify, mpsc};

    const ANSWER: &str =
        r#"{"integration":"svc","connection":"c","auth_type":"bearer","fields":{"token":"t"}}"#;

    /// A platform that answers every request it reads (and counts them); on
    /// `close_idle`, it closes its idle connections and says so on `closed`.
    struct Platform {
        _dir: tempfile::TempDir,
        path: PathBuf,
        seen: Arc<AtomicUsize>,
        close_idle: Arc<Notify>,
        closed: mpsc::UnboundedReceiver<()>,
    }

    async fn platform() -> Platform {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let close_idle = Arc::new(Notify::new());
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let (counter, close) = (seen.clone(), close_idle.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (counter, close, closed_tx) =
                    (counter.clone(), close.clone(), closed_tx.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut b = [0u8; 1024];
                    loop {
                        let n = tokio::select! {
                            r = s.read(&mut b) => match r {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            },
                            () = close.notified(), if head.is_empty() => {
                                drop(s);
                                let _ = closed_tx.send(());
                                return;
                            }
                        };
                        head.extend_from_slice(&b[..n]);
                        if !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            continue;
                        }
                        head.clear();
                        counter.fetch_add(1, Ordering::SeqCst);
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ANSWER}",
                            ANSWER.len()
                        );
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Platform {
            _dir: dir,
            path,
            seen,
            close_idle,
            closed,
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn kept_alive_requests_share_one_connection() {
        let p = platform().await;
        let client = PlatformClient::new(&p.path, SecretString::from("r.t"));
        for _ in 0..3 {
            assert_eq!(client.credential("svc").await.unwrap().fields["token"], "t");
        }
        assert_eq!(p.seen.load(Ordering::SeqCst), 3);
        assert_eq!(client.idle.lock().unwrap().len(), 1);
    }

    /// The platform closed the kept connection meanwhile: the next request
    /// goes out on a fresh one, once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_the_closed_connection_did_not_take_is_sent_once_on_a_new_one() {
        let mut p = platform().await;
        let client = PlatformClient::new(&p.path, SecretString::from("r.t"));
        for i in 1..=3 {
            assert_eq!(client.credential("svc").await.unwrap().fields["token"], "t");
            assert_eq!(client.idle.lock().unwrap().len(), 1, "kept for reuse");
            p.close_idle.notify_one();
            p.closed.recv().await.unwrap();
            assert_eq!(p.seen.load(Ordering::SeqCst), i);
        }
    }
}

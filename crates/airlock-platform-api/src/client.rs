//! The sidecar's client for the internal API: HTTP/1.1 over the platform's
//! unix socket, authenticated with the run token. A `GET` with a JSON answer
//! (the credential fetch of every credentialed call among them) goes over
//! the `get` module; the `POST`s and the stored-result read over hyper.

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

use crate::get::{self, Exchange, Kept};
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

/// Cheap to clone (clones share the pools). Keeps up to [`MAX_IDLE`] idle
/// keep-alive connections to the platform's socket for each way of asking
/// (hyper's, the `get` module's): a credential fetch on the request path then
/// costs one round trip, not a connect, a handshake and a new server task.
#[derive(Clone)]
pub struct PlatformClient {
    socket: PathBuf,
    run_token: SecretString,
    idle: Arc<Mutex<Vec<Conn>>>,
    /// Idle connections of the `GET`s with a JSON answer (the `get` module).
    kept: Arc<Mutex<Vec<Kept>>>,
    /// The `GET`s go over hyper too (the `get` bench's plain path).
    hyper_get: bool,
}

impl std::fmt::Debug for PlatformClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlatformClient")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

/// The error a non-2xx answer carries (its JSON error body, or the start
/// of whatever it is).
fn refused(status: u16, body: &[u8]) -> PlatformError {
    let err: ErrorBody = serde_json::from_slice(body).unwrap_or(ErrorBody {
        error: "unknown".into(),
        message: String::from_utf8_lossy(body).chars().take(200).collect(),
    });
    PlatformError::Refused {
        status,
        code: err.error,
        message: err.message,
    }
}

impl From<Exchange> for PlatformError {
    fn from(e: Exchange) -> Self {
        match e {
            Exchange::Closed(e) | Exchange::Io(e) => PlatformError::Transport(e.to_string()),
            Exchange::Bad(why) => PlatformError::BadAnswer(why),
        }
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
            kept: Arc::default(),
            hyper_get: false,
        }
    }

    /// This client with its `GET`s sent over hyper, as its `POST`s are: the
    /// plain path the `get` bench alternates with the `get` module.
    #[doc(hidden)]
    #[must_use]
    pub fn with_hyper_get(mut self) -> Self {
        self.hyper_get = true;
        self
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
        let mut headers = http::HeaderMap::new();
        if let Some(ct) = content_type {
            let ct = http::HeaderValue::from_str(ct)
                .map_err(|e| PlatformError::Transport(e.to_string()))?;
            headers.insert(header::CONTENT_TYPE, ct);
        }
        self.request_with(method, path_and_query, headers, body)
            .await
    }

    /// [`Self::request`] with these `headers` beside the host and the token.
    async fn request_with(
        &self,
        method: Method,
        path_and_query: &str,
        headers: http::HeaderMap,
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
        if let Some(h) = req.headers_mut() {
            h.extend(headers);
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
            return Err(refused(parts.status.as_u16(), &bytes));
        }
        Ok((parts.status, parts.headers, bytes))
    }

    /// A new connection to the platform's socket.
    async fn dial(&self) -> Result<UnixStream, PlatformError> {
        UnixStream::connect(&self.socket)
            .await
            .map_err(|source| PlatformError::Unreachable {
                path: self.socket.clone(),
                source,
            })
    }

    async fn connect(&self) -> Result<Conn, PlatformError> {
        let stream = self.dial().await?;
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

    /// `GET path_and_query` and its JSON answer, over the `get` module on a kept
    /// connection (or a new one). A kept connection found closed before it
    /// answered (the platform closed it while idle) is replaced by a new
    /// one, which is sent the request once more: a `GET` changes nothing.
    async fn get_json<T: DeserializeOwned>(
        &self,
        path_and_query: &str,
    ) -> Result<T, PlatformError> {
        if self.hyper_get {
            let (_, _, body) = self
                .request(Method::GET, path_and_query, None, Bytes::new())
                .await?;
            return serde_json::from_slice(&body)
                .map_err(|e| PlatformError::BadAnswer(e.to_string()));
        }
        let head =
            get::request_head(path_and_query, self.run_token.expose_secret()).ok_or_else(|| {
                PlatformError::Transport(format!(
                    "{path_and_query:?} or the run token cannot be sent in an HTTP/1.1 request"
                ))
            })?;
        if let Some(mut conn) = self.take_kept() {
            match get::exchange(&mut conn, &head, MAX_ANSWER).await {
                Ok(answer) => return self.read_json(conn, &answer),
                // Closed while idle: the request goes out on a new one.
                Err(Exchange::Closed(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut conn = self.connect_kept().await?;
        let answer = get::exchange(&mut conn, &head, MAX_ANSWER).await?;
        self.read_json(conn, &answer)
    }

    /// The JSON of `answer` (or the platform's refusal); `conn` is kept for
    /// the next request if the answer allows.
    fn read_json<T: DeserializeOwned>(
        &self,
        mut conn: Kept,
        answer: &get::Answer,
    ) -> Result<T, PlatformError> {
        let body = conn.body(answer);
        let parsed = if (200..300).contains(&answer.status) {
            serde_json::from_slice(body).map_err(|e| PlatformError::BadAnswer(e.to_string()))
        } else {
            Err(refused(answer.status, body))
        };
        // The answer may be a credential: zeroed now, not when reused.
        conn.forget();
        if answer.keep
            && let Ok(mut kept) = self.kept.lock()
            && kept.len() < MAX_IDLE
        {
            kept.push(conn);
        }
        parsed
    }

    fn take_kept(&self) -> Option<Kept> {
        self.kept.lock().ok()?.pop()
    }

    async fn connect_kept(&self) -> Result<Kept, PlatformError> {
        Ok(Kept::new(self.dial().await?))
    }

    /// The credential of `integration`'s connection, decrypted for this request.
    pub async fn credential(&self, integration: &str) -> Result<CredentialResponse, PlatformError> {
        self.get_json(&format!("{PREFIX}/credentials/{}", encode(integration)))
            .await
    }

    /// The run's live policy once it is newer than `after` (the version the
    /// sidecar applied, which the platform records), or `rules: None` after
    /// [`crate::policy::POLICY_WAIT`].
    pub async fn policy(&self, after: u64) -> Result<crate::policy::PolicyUpdate, PlatformError> {
        self.get_json(&format!("{}?after={after}", crate::policy::POLICY_PATH))
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

    /// Tells the platform the agent's end is kept in the run's journal
    /// ([`crate::wire::ENDED_PATH`]).
    pub async fn ended(&self) -> Result<Accepted, PlatformError> {
        self.post_json(crate::wire::ENDED_PATH, &serde_json::json!({}))
            .await
    }

    /// `POST path` with `body` as JSON, and its JSON answer.
    async fn post_json<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T, PlatformError> {
        let body = serde_json::to_vec(body).map_err(|e| PlatformError::Transport(e.to_string()))?;
        let (_, _, answer) = self
            .request(Method::POST, path, Some("application/json"), body.into())
            .await?;
        serde_json::from_slice(&answer).map_err(|e| PlatformError::BadAnswer(e.to_string()))
    }

    /// Charges a model call's reservation to the run's organization's
    /// budgets, or learns which one it would pass.
    pub async fn reserve_budget(
        &self,
        amount: crate::budget::Amount,
        priced: bool,
    ) -> Result<crate::budget::ReserveAnswer, PlatformError> {
        self.post_json(
            crate::budget::RESERVE_PATH,
            &crate::budget::ReserveRequest { amount, priced },
        )
        .await
    }

    /// Holds a request for a person's answer: creates the pending approval
    /// and waits for its outcome (long-poll, at most the request's
    /// `wait_ms`, then the platform answers `expired`).
    pub async fn ask_approval(
        &self,
        ask: &crate::approval::AskRequest,
    ) -> Result<crate::approval::AskAnswer, PlatformError> {
        self.post_json(crate::approval::ASK_PATH, ask).await
    }

    /// Replaces reservation `id` with what its call used.
    pub async fn settle_budget(
        &self,
        id: String,
        used: crate::budget::Amount,
    ) -> Result<(), PlatformError> {
        self.post_json::<serde::de::IgnoredAny>(
            crate::budget::SETTLE_PATH,
            &crate::budget::SettleRequest { id, used },
        )
        .await
        .map(|_| ())
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

    /// Hands one artifact of this run to the platform: `Ok(body)` its
    /// bytes, `Err(why)` the runtime's reason for not reading it (`bytes` as
    /// it saw them). The answer says whether it was stored.
    pub async fn put_artifact(
        &self,
        path: &str,
        body: Result<Bytes, (crate::files::ArtifactRefusal, u64)>,
    ) -> Result<crate::wire::ArtifactAnswer, PlatformError> {
        let (_, _, answer) = self
            .request_with(
                Method::POST,
                &format!("{PREFIX}/artifacts"),
                artifact_headers(path, body.as_ref().err().copied())?,
                body.unwrap_or_default(),
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

/// The headers naming an artifact: its path, and the runtime's reason
/// when it did not read it.
fn artifact_headers(
    path: &str,
    refused: Option<(crate::files::ArtifactRefusal, u64)>,
) -> Result<http::HeaderMap, PlatformError> {
    use crate::files::{ARTIFACT_PATH_HEADER, ARTIFACT_REFUSED_HEADER};
    let bad = |e: http::header::InvalidHeaderValue| PlatformError::Transport(e.to_string());
    let mut h = http::HeaderMap::new();
    h.insert(
        ARTIFACT_PATH_HEADER,
        http::HeaderValue::from_str(&encode(path)).map_err(bad)?,
    );
    if let Some((why, bytes)) = refused {
        h.insert(
            ARTIFACT_REFUSED_HEADER,
            http::HeaderValue::from_str(&format!("{} {bytes}", why.as_str())).map_err(bad)?,
        );
    }
    Ok(h)
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
            assert_eq!(
                client.credential("svc").await.unwrap().fields["token"].expose_secret(),
                "t"
            );
        }
        assert_eq!(p.seen.load(Ordering::SeqCst), 3);
        assert_eq!(client.kept.lock().unwrap().len(), 1);
    }

    /// The platform closed the kept connection meanwhile: the next request
    /// goes out on a fresh one, once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_the_closed_connection_did_not_take_is_sent_once_on_a_new_one() {
        let mut p = platform().await;
        let client = PlatformClient::new(&p.path, SecretString::from("r.t"));
        for i in 1..=3 {
            assert_eq!(
                client.credential("svc").await.unwrap().fields["token"].expose_secret(),
                "t"
            );
            assert_eq!(client.kept.lock().unwrap().len(), 1, "kept for reuse");
            p.close_idle.notify_one();
            p.closed.recv().await.unwrap();
            assert_eq!(p.seen.load(Ordering::SeqCst), i);
        }
    }

    /// A platform that answers the requests it reads, on any connection,
    /// with `answers` in turn (each written `chunk` bytes at a time, then
    /// the connection closed if its flag says so); it records each request
    /// head.
    struct Scripted {
        _dir: tempfile::TempDir,
        path: PathBuf,
        heads: Arc<Mutex<Vec<String>>>,
    }

    async fn scripted(answers: Vec<(Vec<u8>, bool)>, chunk: usize) -> Scripted {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let answers = Arc::new(Mutex::new(std::collections::VecDeque::from(answers)));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (seen, answers) = (seen.clone(), answers.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut b = [0u8; 1024];
                    loop {
                        let n = match s.read(&mut b).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        head.extend_from_slice(&b[..n]);
                        if !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            continue;
                        }
                        seen.lock()
                            .unwrap()
                            .push(String::from_utf8_lossy(&head).into_owned());
                        head.clear();
                        let Some((answer, close)) = answers.lock().unwrap().pop_front() else {
                            return;
                        };
                        for part in answer.chunks(chunk) {
                            if s.write_all(part).await.is_err() {
                                return;
                            }
                            s.flush().await.unwrap();
                            tokio::task::yield_now().await;
                        }
                        if close {
                            return;
                        }
                    }
                });
            }
        });
        Scripted {
            _dir: dir,
            path,
            heads,
        }
    }

    fn ok() -> Vec<u8> {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ANSWER}",
            ANSWER.len()
        )
        .into_bytes()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_answer_written_a_byte_at_a_time_is_read_whole() {
        let p = scripted(vec![(ok(), false), (ok(), false)], 1).await;
        let client = PlatformClient::new(&p.path, SecretString::from("r.t"));
        for _ in 0..2 {
            assert_eq!(
                client.credential("svc").await.unwrap().fields["token"].expose_secret(),
                "t"
            );
        }
        let heads = p.heads.lock().unwrap().clone();
        assert_eq!(
            heads,
            vec![
                "GET /internal/v1/credentials/svc HTTP/1.1\r\nhost: platform\r\nauthorization: Bearer r.t\r\n\r\n";
                2
            ]
        );
        assert_eq!(client.kept.lock().unwrap().len(), 1, "one connection, kept");
    }

    /// A hostile integration name (the agent picks the tool it calls) is
    /// percent-encoded into the path: it cannot add a header or a request.
    #[tokio::test(flavor = "current_thread")]
    async fn a_name_cannot_split_the_request() {
        let p = scripted(vec![(ok(), false)], 4096).await;
        let client = PlatformClient::new(&p.path, SecretString::from("r.t"));
        client
            .credential("svc HTTP/1.1\r\nx-run: other\r\n\r\nGET /x")
            .await
            .unwrap();
        let heads = p.heads.lock().unwrap().clone();
        assert_eq!(heads.len(), 1);
        assert!(
            heads[0].starts_with(
                "GET /internal/v1/credentials/svc%20HTTP%2F1.1%0D%0Ax-run%3A%20other%0D%0A%0D%0AGET%20%2Fx HTTP/1.1\r\n"
            ),
            "{:?}",
            heads[0]
        );
        // A run token that would split the head is refused before a byte is sent.
        let hostile = PlatformClient::new(&p.path, SecretString::from("r.t\r\nx-run: other"));
        assert!(matches!(
            hostile.credential("svc").await,
            Err(PlatformError::Transport(_))
        ));
        assert_eq!(p.heads.lock().unwrap().len(), 1);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_refusal_carries_the_platforms_error_and_keeps_the_connection() {
        let body = r#"{"error":"integration_not_granted","message":"no connection"}"#;
        let refusal = format!(
            "HTTP/1.1 403 Forbidden\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let p = scripted(vec![(refusal.into_bytes(), false), (ok(), false)], 7).await;
        let client = PlatformClient::new(&p.path, SecretString::from("r.t"));
        match client.credential("svc").await {
            Err(PlatformError::Refused {
                status: 403,
                code,
                message,
            }) => {
                assert_eq!(
                    (code.as_str(), message.as_str()),
                    ("integration_not_granted", "no connection")
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(client.kept.lock().unwrap().len(), 1);
        client.credential("svc").await.unwrap();
        assert_eq!(p.heads.lock().unwrap().len(), 2);
        assert_eq!(
            client.kept.lock().unwrap().len(),
            1,
            "still the one connection"
        );
    }

    /// What this path does not read is a bad answer, never a guess; the
    /// connection it came on is not kept.
    #[tokio::test(flavor = "current_thread")]
    async fn an_answer_not_framed_by_its_length_is_refused_and_its_connection_dropped() {
        let chunked = format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{ANSWER}\r\n0\r\n\r\n",
            ANSWER.len()
        );
        let huge = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
            MAX_ANSWER + 1
        );
        let mut trailing = ok();
        trailing.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        let p = scripted(
            vec![
                (chunked.into_bytes(), false),
                (huge.into_bytes(), false),
                (b"HTTP/1.1 200 OK\r\n\r\n{}".to_vec(), false),
                (b"not http\r\n\r\n".to_vec(), false),
                (trailing, false),
            ],
            4096,
        )
        .await;
        let client = PlatformClient::new(&p.path, SecretString::from("r.t"));
        for _ in 0..4 {
            let e = client.credential("svc").await.unwrap_err();
            assert!(matches!(e, PlatformError::BadAnswer(_)), "{e:?}");
            assert!(client.kept.lock().unwrap().is_empty());
        }
        // Whole, but followed by bytes nobody asked for: read, not kept.
        client.credential("svc").await.unwrap();
        assert!(client.kept.lock().unwrap().is_empty());
        assert_eq!(p.heads.lock().unwrap().len(), 5, "each sent once");
    }

    /// The platform ends the connection mid-answer: an error, and the
    /// request is not sent again. An answer that says `Connection: close`
    /// is read and its connection not kept.
    #[tokio::test(flavor = "current_thread")]
    async fn an_answer_cut_short_is_an_error_and_not_retried() {
        let cut = ok()[..ok().len() - 5].to_vec();
        let closing = format!(
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{ANSWER}",
            ANSWER.len()
        );
        let p = scripted(
            vec![(ok(), false), (cut, true), (closing.into_bytes(), false)],
            4096,
        )
        .await;
        let client = PlatformClient::new(&p.path, SecretString::from("r.t"));
        client.credential("svc").await.unwrap();
        let e = client.credential("svc").await.unwrap_err();
        assert!(matches!(e, PlatformError::Transport(_)), "{e:?}");
        assert_eq!(p.heads.lock().unwrap().len(), 2, "not sent again");
        assert!(client.kept.lock().unwrap().is_empty());
        client.credential("svc").await.unwrap();
        assert!(
            client.kept.lock().unwrap().is_empty(),
            "the platform said close"
        );
        assert_eq!(p.heads.lock().unwrap().len(), 3);
    }

    /// A large answer is read whole; the buffer it grew is not kept with
    /// the idle connection.
    #[tokio::test(flavor = "current_thread")]
    async fn a_large_answer_is_read_whole_and_its_buffer_not_kept() {
        let big = "x".repeat(1 << 20);
        let body = format!(
            r#"{{"integration":"svc","connection":"c","auth_type":"bearer","fields":{{"token":"{big}"}}}}"#
        );
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let p = scripted(vec![(answer.into_bytes(), false), (ok(), false)], 64 * 1024).await;
        let client = PlatformClient::new(&p.path, SecretString::from("r.t"));
        assert_eq!(
            client.credential("svc").await.unwrap().fields["token"].expose_secret(),
            big
        );
        let kept = client
            .kept
            .lock()
            .unwrap()
            .iter()
            .map(Kept::capacity)
            .collect::<Vec<_>>();
        assert_eq!(kept.len(), 1);
        assert!(kept[0] <= 4096, "{kept:?}");
        assert_eq!(
            client.credential("svc").await.unwrap().fields["token"].expose_secret(),
            "t"
        );
    }

    /// No platform listening: the typed error names the socket.
    #[tokio::test(flavor = "current_thread")]
    async fn no_platform_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let client = PlatformClient::new(dir.path().join("none.sock"), SecretString::from("r.t"));
        assert!(matches!(
            client.credential("svc").await,
            Err(PlatformError::Unreachable { .. })
        ));
    }
}

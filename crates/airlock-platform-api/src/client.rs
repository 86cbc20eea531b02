//! The sidecar's client for the internal API: HTTP/1.1 over the platform's
//! unix socket, authenticated with the run token.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

/// Cheap to clone (clones share the pool). Keeps up to [`MAX_IDLE`] idle
/// keep-alive connections to the platform's socket: a credential fetch on
/// the request path then costs one round trip, not a connect, a handshake
/// and a new server task.
#[derive(Clone)]
pub struct PlatformClient {
    socket: PathBuf,
    run_token: SecretString,
    idle: Arc<Mutex<Vec<Sender>>>,
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
        let (mut sender, resp) = self.send(req).await?;
        let (parts, body) = resp.into_parts();
        let limited = http_body_util::Limited::new(body, MAX_ANSWER);
        let bytes = limited
            .collect()
            .await
            .map_err(|e| PlatformError::Transport(e.to_string()))?
            .to_bytes();
        // The answer is read whole, so the connection is free again.
        if sender.ready().await.is_ok() {
            self.put_idle(sender);
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

    async fn connect(&self) -> Result<Sender, PlatformError> {
        let stream = UnixStream::connect(&self.socket).await.map_err(|source| {
            PlatformError::Unreachable {
                path: self.socket.clone(),
                source,
            }
        })?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| PlatformError::Transport(e.to_string()))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn take_idle(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().ok()?;
        while let Some(s) = idle.pop() {
            if s.is_ready() {
                return Some(s);
            }
        }
        None
    }

    fn put_idle(&self, sender: Sender) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(sender);
        }
    }

    /// Sends on an idle connection, or a new one. A request an idle
    /// connection could not take (the platform closed it meanwhile) comes
    /// back unsent and goes out once more on a fresh connection, so no
    /// request is ever sent twice.
    async fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<(Sender, http::Response<hyper::body::Incoming>), PlatformError> {
        let req = match self.take_idle() {
            Some(mut s) => match s.try_send_request(req).await {
                Ok(resp) => return Ok((s, resp)),
                Err(mut e) => match e.take_message() {
                    Some(req) => req,
                    None => return Err(PlatformError::Transport(e.into_error().to_string())),
                },
            },
            None => req,
        };
        let mut s = self.connect().await?;
        let resp = s
            .send_request(req)
            .await
            .map_err(|e| PlatformError::Transport(e.to_string()))?;
        Ok((s, resp))
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

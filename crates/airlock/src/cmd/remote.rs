//! The CLI as a client of an `airlock serve`: `--server URL` (or
//! `AIRLOCK_SERVER`) with the organization's key in `AIRLOCK_API_KEY` (never
//! an argument). Plain HTTP/1.1 over one connection per call (`http://`
//! only: a server beyond the machine belongs behind a TLS-terminating proxy
//! on the client's side, or an SSH tunnel). Bodies are the types of
//! [`airlock_api::v1`], sent and read as the server writes them.

use std::collections::BTreeMap;

use airlock_api::v1;
use airlock_platform_api::wire::RunEvent;
use anyhow::{Context as _, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use serde::de::DeserializeOwned;
use serde::{Deserialize as _, Serialize};
use serde_json::Value;
use zeroize::Zeroizing;

/// A server to talk to.
pub struct Remote {
    authority: String,
    key: Zeroizing<String>,
}

/// `--server`, else `AIRLOCK_SERVER`.
pub fn server(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_owned).or_else(|| {
        std::env::var("AIRLOCK_SERVER")
            .ok()
            .filter(|v| !v.trim().is_empty())
    })
}

impl Remote {
    pub fn new(url: &str) -> Result<Remote> {
        let rest = url.trim().strip_prefix("http://").ok_or_else(|| {
            if url.starts_with("https://") {
                anyhow!("{url}: this client speaks http:// only (reach a remote server through a TLS-terminating proxy or an SSH tunnel on loopback)")
            } else {
                anyhow!("{url}: the server's URL is http://HOST:PORT")
            }
        })?;
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') || authority.contains('@') {
            bail!("{url}: the server's URL is http://HOST:PORT, with no path or user");
        }
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        let key = Zeroizing::new(
            std::env::var("AIRLOCK_API_KEY")
                .ok()
                .filter(|k| !k.trim().is_empty())
                .ok_or_else(|| {
                    anyhow!("talking to a server needs its API key in AIRLOCK_API_KEY")
                })?,
        );
        Ok(Remote { authority, key })
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> Result<http::Response<hyper::body::Incoming>> {
        let tcp = tokio::net::TcpStream::connect(&self.authority)
            .await
            .with_context(|| format!("connecting to the server at {}", self.authority))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let body = body.unwrap_or_default();
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, &self.authority)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.key.as_str()),
            )
            .header(
                http::header::ACCEPT,
                if path.ends_with("/logs") || path.ends_with("/events") {
                    "text/event-stream"
                } else {
                    "application/json"
                },
            );
        if !body.is_empty() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        Ok(sender
            .send_request(req.body(Full::new(Bytes::from(body)))?)
            .await?)
    }

    /// One call: the answer's bytes; a non-2xx answer is an error with the
    /// server's code and message.
    async fn exchange(&self, method: &str, path: &str, body: Option<String>) -> Result<Bytes> {
        let resp = refused(self.send(method, path, body).await?).await?;
        Ok(resp.into_body().collect().await?.to_bytes())
    }

    /// `GET path`, its answer read as `T`.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        answer(path, &self.exchange("GET", path, None).await?)
    }

    /// `method path` with `body` as JSON, its answer read as `T`.
    pub async fn send_json<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: &B,
    ) -> Result<T> {
        let body = serde_json::to_string(body)?;
        answer(path, &self.exchange(method, path, Some(body)).await?)
    }

    /// `DELETE path` (its answer has no body).
    pub async fn delete(&self, path: &str) -> Result<()> {
        self.exchange("DELETE", path, None).await.map(|_| ())
    }

    /// `GET path`, its answer's bytes handed to `on` as they arrive; a
    /// non-2xx answer is an error with the server's code and message.
    pub async fn stream(&self, path: &str, mut on: impl FnMut(&[u8])) -> Result<()> {
        let mut body = refused(self.send("GET", path, None).await?)
            .await?
            .into_body();
        while let Some(frame) = body.frame().await {
            if let Ok(chunk) = frame?.into_data() {
                on(&chunk);
            }
        }
        Ok(())
    }

    /// Follows a Server-Sent Events route to its end: `on(event, data)` for
    /// each event. A stream the server cuts short with an `error` event (the
    /// key was revoked, the replica shuts down) is an error with its message.
    pub async fn follow(&self, path: &str, mut on: impl FnMut(&str, &str)) -> Result<()> {
        let resp = self.send("GET", path, None).await?;
        if !resp.status().is_success() {
            let st = resp.status();
            let b = resp.into_body().collect().await?.to_bytes();
            let e = serde_json::from_slice::<v1::Error>(&b).ok();
            bail!(
                "the server answered {}: {}",
                st.as_u16(),
                e.as_ref().map_or("-", |e| e.error.message.as_str())
            );
        }
        let mut body = resp.into_body();
        let mut buf = String::new();
        let (mut event, mut data) = (String::new(), String::new());
        while let Some(frame) = body.frame().await {
            let Ok(chunk) = frame?.into_data() else {
                continue;
            };
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(i) = buf.find('\n') {
                let line = buf[..i].trim_end_matches('\r').to_owned();
                buf.drain(..=i);
                if line.is_empty() {
                    if event == "error" {
                        let e = serde_json::from_str::<v1::Error>(&data).ok();
                        bail!(
                            "the server ended the stream ({}): {}",
                            e.as_ref().map_or("-", |e| e.error.code.as_str()),
                            e.as_ref().map_or("-", |e| e.error.message.as_str())
                        );
                    }
                    if !data.is_empty() {
                        on(if event.is_empty() { "message" } else { &event }, &data);
                    }
                    event.clear();
                    data.clear();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(v.trim_start());
                }
            }
        }
        Ok(())
    }
}

/// A 2xx answer as it is; any other, read whole, as the [`Refused`] error
/// with the server's code and message.
async fn refused(
    resp: http::Response<hyper::body::Incoming>,
) -> Result<http::Response<hyper::body::Incoming>> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let bytes = resp.into_body().collect().await?.to_bytes();
    let e = serde_json::from_slice::<v1::Error>(&bytes).ok();
    Err(Refused {
        status: status.as_u16(),
        message: e
            .as_ref()
            .map_or("no message", |e| e.error.message.as_str())
            .to_owned(),
        code: e.map_or_else(|| "-".to_owned(), |e| e.error.code),
    }
    .into())
}

/// A non-2xx answer of the server.
#[derive(Debug)]
pub struct Refused {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server answered {}: {} ({})",
            self.status, self.message, self.code
        )
    }
}

impl std::error::Error for Refused {}

/// Whether `e` is the server's 404.
pub fn is_not_found(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Refused>().is_some_and(|r| r.status == 404)
}

/// Reads an answer as `T`.
fn answer<T: DeserializeOwned>(path: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).with_context(|| format!("reading the server's answer to {path}"))
}

/// Prints one log event (an SSE event's data) as `airlock runs logs` does.
pub fn print_log(data: &str, json: bool) {
    if let Ok(e) = serde_json::from_str::<v1::Event>(data) {
        print_event(&e, json);
    }
}

/// Prints one log event of a page as `airlock runs logs` does.
pub fn print_event(e: &v1::Event, json: bool) {
    if let Ok(ev) = RunEvent::deserialize(&e.payload) {
        print_run_event(&ev, json);
    }
}

/// Prints a run's log line, or its count of lines shed; other events
/// print nothing.
pub fn print_run_event(ev: &RunEvent, json: bool) {
    match ev {
        RunEvent::Log { at, stream, line } => print_log_line(&(*at).into(), stream, line, json),
        RunEvent::Shed { at, lines, bytes } => {
            print_log_line(&(*at).into(), SHED_STREAM, &shed_text(*lines, *bytes), json);
        }
        _ => {}
    }
}

/// The stream `airlock runs logs` shows the count of shed lines under.
pub const SHED_STREAM: &str = "airlock";

/// What `airlock runs logs` says of log lines that were shed.
pub fn shed_text(lines: u64, bytes: u64) -> String {
    format!("[airlock: {lines} log lines ({bytes} bytes) were shed: counted, not kept]")
}

/// One stored log line as `airlock runs logs` prints it: the agent's
/// stdout on stdout; its stderr, and a local runner's lines (stream
/// `runner:<namespace>`, shown after `[runner <namespace>]`), on stderr;
/// with `--json`, one object a line. Never a raw control character.
pub fn print_log_line(at: &Value, stream: &str, line: &str, json: bool) {
    use airlock_sandbox::terminal::safe;
    if json {
        super::out::outln!(
            "{}",
            serde_json::json!({"at": at, "stream": stream, "line": line})
        );
    } else if stream == "stderr" || stream == SHED_STREAM {
        eprintln!("{}", safe(line));
    } else if let Some(ns) = stream.strip_prefix(airlock_platform::orchestrator::RUNNER_STREAM) {
        eprintln!("[runner {}] {}", safe(ns), safe(line));
    } else {
        super::out::outln!("{}", safe(line));
    }
}

/// `airlock run --server`: the manifest's directory registered as the
/// agent, a run queued, its logs followed to the end (on stderr, unless
/// `json`); its report is the answer.
pub async fn run(
    server: &str,
    manifest: &std::path::Path,
    prompt: Option<&str>,
    json: bool,
) -> Result<airlock_api::report::RunReport> {
    let r = Remote::new(server)?;
    let agent = register(&r, manifest).await?;
    let new = v1::NewRun {
        agent,
        files: Default::default(),
        limits: None,
        prompt: prompt.map(str::to_owned),
    };
    let run: v1::Run = r.send_json("POST", "/v1/runs", &new).await?;
    let id = run.id;
    if !json {
        eprintln!("▸ run {id} queued on {server}");
    }
    r.follow(&format!("/v1/runs/{id}/logs"), |event, data| {
        if event != "end" && !json {
            print_log(data, false);
        }
    })
    .await?;
    super::report::remote(&r, &id).await
}

/// Registers the manifest's directory as its agent (its regular files,
/// UTF-8, within the server's limits); the agent's name.
async fn register(r: &Remote, manifest: &std::path::Path) -> Result<String> {
    super::run::require_manifest(manifest)?;
    let manifest = manifest
        .canonicalize()
        .with_context(|| format!("reading {}", manifest.display()))?;
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("reading {}", manifest.display()))?;
    let m = airlock_platform::manifest::Manifest::parse(&text)?;
    let dir = manifest
        .parent()
        .ok_or_else(|| anyhow!("the manifest has no directory"))?;
    let mut files = BTreeMap::new();
    collect(dir, dir, &mut files, &manifest)?;
    let _: v1::Agent = r
        .send_json(
            "POST",
            "/v1/agents",
            &v1::RegisterAgent {
                files,
                manifest: text,
            },
        )
        .await?;
    Ok(m.agent.name.as_str().to_owned())
}

fn collect(
    root: &std::path::Path,
    dir: &std::path::Path,
    out: &mut BTreeMap<String, String>,
    manifest: &std::path::Path,
) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let name = e.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let ft = e.file_type()?;
        let path = e.path();
        if ft.is_dir() {
            collect(root, &path, out, manifest)?;
        } else if ft.is_file() && path != manifest {
            let rel = path.strip_prefix(root)?.to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!("{}: the server takes UTF-8 text files only", path.display())
            })?;
            out.insert(rel, text);
        }
    }
    Ok(())
}

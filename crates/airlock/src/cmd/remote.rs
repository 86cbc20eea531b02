//! The CLI as a client of an `airlock serve`: `--server URL` (or
//! `AIRLOCK_SERVER`) with the organization's key in `AIRLOCK_API_KEY` (never
//! an argument). Plain HTTP/1.1 over one connection per call (`http://`
//! only: a server beyond the machine belongs behind a TLS-terminating proxy
//! on the client's side, or an SSH tunnel).

use anyhow::{Context as _, Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
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
        body: Option<&Value>,
    ) -> Result<http::Response<hyper::body::Incoming>> {
        let tcp = tokio::net::TcpStream::connect(&self.authority)
            .await
            .with_context(|| format!("connecting to the server at {}", self.authority))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let body = body.map(|b| b.to_string()).unwrap_or_default();
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

    /// One call; a non-2xx answer is an error with the server's code and message.
    pub async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let resp = self.send(method, path, body).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let v: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        if !status.is_success() {
            bail!(
                "the server answered {}: {} ({})",
                status.as_u16(),
                v["error"]["message"].as_str().unwrap_or("no message"),
                v["error"]["code"].as_str().unwrap_or("-")
            );
        }
        Ok(v)
    }

    /// Follows a Server-Sent Events route to its end: `on(event, data)` for
    /// each event. A stream the server cuts short with an `error` event (the
    /// key was revoked, the replica shuts down) is an error with its message.
    pub async fn follow(&self, path: &str, mut on: impl FnMut(&str, &str)) -> Result<()> {
        let resp = self.send("GET", path, None).await?;
        if !resp.status().is_success() {
            let st = resp.status();
            let b = resp.into_body().collect().await?.to_bytes();
            let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
            bail!(
                "the server answered {}: {}",
                st.as_u16(),
                v["error"]["message"].as_str().unwrap_or("-")
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
                        let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                        bail!(
                            "the server ended the stream ({}): {}",
                            v["error"]["code"].as_str().unwrap_or("-"),
                            v["error"]["message"].as_str().unwrap_or("-")
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

/// Prints one log event's line as `airlock runs logs` does.
pub fn print_log(data: &str, json: bool) {
    let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
    let p = &v["payload"];
    if p["type"] == "shed" {
        let text = shed_text(
            p["lines"].as_u64().unwrap_or(0),
            p["bytes"].as_u64().unwrap_or(0),
        );
        print_log_line(&p["at"], SHED_STREAM, &text, json);
        return;
    }
    print_log_line(
        &p["at"],
        p["stream"].as_str().unwrap_or(""),
        p["line"].as_str().unwrap_or(""),
        json,
    );
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
        println!(
            "{}",
            serde_json::json!({"at": at, "stream": stream, "line": line})
        );
    } else if stream == "stderr" || stream == SHED_STREAM {
        eprintln!("{}", safe(line));
    } else if let Some(ns) = stream.strip_prefix(airlock_platform::orchestrator::RUNNER_STREAM) {
        eprintln!("[runner {}] {}", safe(ns), safe(line));
    } else {
        println!("{}", safe(line));
    }
}

/// `airlock run --server`: the manifest's directory registered as the
/// agent (its regular files, UTF-8, within the server's limits), a run
/// queued, its logs followed to the end; the run's status decides the exit.
pub async fn run(
    server: &str,
    manifest: &std::path::Path,
    prompt: Option<&str>,
    json: bool,
) -> Result<bool> {
    let r = Remote::new(server)?;
    let manifest = manifest
        .canonicalize()
        .with_context(|| format!("reading {}", manifest.display()))?;
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("reading {}", manifest.display()))?;
    let m = airlock_platform::manifest::Manifest::parse(&text)?;
    let dir = manifest
        .parent()
        .ok_or_else(|| anyhow!("the manifest has no directory"))?;
    let mut files = serde_json::Map::new();
    collect(dir, dir, &mut files, &manifest)?;
    r.call(
        "POST",
        "/v1/agents",
        Some(&serde_json::json!({"manifest": text, "files": files})),
    )
    .await?;
    let mut body = serde_json::json!({"agent": m.agent.name.as_str()});
    if let Some(p) = prompt {
        body["prompt"] = p.into();
    }
    let run = r.call("POST", "/v1/runs", Some(&body)).await?;
    let id = run["id"]
        .as_str()
        .ok_or_else(|| anyhow!("the server gave no run id"))?
        .to_owned();
    if !json {
        eprintln!("▸ run {id} queued on {server}");
    }
    let mut end = Value::Null;
    r.follow(&format!("/v1/runs/{id}/logs"), |event, data| {
        if event == "end" {
            end = serde_json::from_str(data).unwrap_or(Value::Null);
        } else if !json {
            print_log(data, false);
        }
    })
    .await?;
    if end.is_null() {
        end = r.call("GET", &format!("/v1/runs/{id}"), None).await?;
    }
    if json {
        println!("{end}");
    } else {
        eprintln!(
            "▸ {} {}",
            end["status"].as_str().unwrap_or("?"),
            end["error"]
                .as_str()
                .map(|e| format!("({})", airlock_sandbox::terminal::safe(e)))
                .unwrap_or_default()
        );
    }
    Ok(end["status"] == "succeeded")
}

fn collect(
    root: &std::path::Path,
    dir: &std::path::Path,
    out: &mut serde_json::Map<String, Value>,
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
            out.insert(rel, Value::String(text));
        }
    }
    Ok(())
}

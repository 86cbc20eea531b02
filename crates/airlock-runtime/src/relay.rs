//! Local endpoints for the agent, relayed to the sidecar's unix sockets with
//! the sidecar token added. They listen on 127.0.0.1 inside the sandbox's
//! own network namespace (in the process backend: the host's loopback, which
//! is why that backend isolates nothing).

use std::net::SocketAddr;
use std::path::PathBuf;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use secrecy::{ExposeSecret, SecretString};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

const SIDECAR_AUTH_HEADER: &str = "x-airlock-sidecar-auth";

type RelayBody = BoxBody<Bytes, hyper::Error>;

fn bad_gateway(msg: &str) -> Response<RelayBody> {
    let body = Full::new(Bytes::from(format!(
        "{{\"error\":\"sidecar_unavailable\",\"message\":{msg:?}}}"
    )))
    .map_err(|never| match never {})
    .boxed();
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::BAD_GATEWAY;
    r
}

async fn forward(
    socket: PathBuf,
    token: SecretString,
    mut req: Request<Incoming>,
) -> Response<RelayBody> {
    let Ok(value) = HeaderValue::from_str(token.expose_secret()) else {
        return bad_gateway("token is not a header value");
    };
    req.headers_mut().insert(SIDECAR_AUTH_HEADER, value);
    let stream = match UnixStream::connect(&socket).await {
        Ok(s) => s,
        Err(e) => return bad_gateway(&format!("cannot reach the sidecar: {e}")),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(x) => x,
        Err(e) => return bad_gateway(&e.to_string()),
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    match sender.send_request(req).await {
        Ok(resp) => resp.map(|b| b.boxed()),
        Err(e) => bad_gateway(&e.to_string()),
    }
}

/// `/mcp`, `/llm/…` and anything else, streamed both ways (model streams
/// stay incremental).
pub async fn sidecar_relay(socket: PathBuf, token: SecretString) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let (socket, token) = (socket.clone(), token.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let (socket, token) = (socket.clone(), token.clone());
                    async move { Ok::<_, std::convert::Infallible>(forward(socket, token, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// Largest proxy request head the relay reads.
const MAX_HEAD: usize = 64 * 1024;

/// The forward proxy: adds `Proxy-Authorization` to the request head, then
/// splices the two connections. One request per connection for absolute-form
/// HTTP (`Connection: close`), so every request carries the token.
pub async fn proxy_relay(socket: PathBuf, token: SecretString) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let (socket, token) = (socket.clone(), token.clone());
            tokio::spawn(async move {
                let mut head = Vec::with_capacity(1024);
                let mut buf = [0u8; 4096];
                let end = loop {
                    let Ok(n) = tcp.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&buf[..n]);
                    if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i;
                    }
                    if head.len() > MAX_HEAD {
                        let _ = tcp.write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n").await;
                        return;
                    }
                };
                let (lines, rest) = head.split_at(end);
                let text = String::from_utf8_lossy(lines);
                let mut out = String::with_capacity(text.len() + 128);
                let mut first = true;
                let is_connect = text.starts_with("CONNECT ");
                for line in text.split("\r\n") {
                    let lower = line.to_ascii_lowercase();
                    if !first
                        && (lower.starts_with("proxy-authorization:")
                            || (!is_connect
                                && (lower.starts_with("connection:")
                                    || lower.starts_with("proxy-connection:"))))
                    {
                        continue;
                    }
                    out.push_str(line);
                    out.push_str("\r\n");
                    if first {
                        out.push_str(&format!(
                            "Proxy-Authorization: Bearer {}\r\n",
                            token.expose_secret()
                        ));
                        if !is_connect {
                            out.push_str("Connection: close\r\n");
                        }
                        first = false;
                    }
                }
                let Ok(mut upstream) = UnixStream::connect(&socket).await else {
                    let _ = tcp.write_all(b"HTTP/1.1 502 Bad Gateway\r\nconnection: close\r\ncontent-length: 0\r\n\r\n").await;
                    return;
                };
                if upstream.write_all(out.as_bytes()).await.is_err()
                    || upstream.write_all(rest).await.is_err()
                {
                    return;
                }
                let _ = tokio::io::copy_bidirectional(&mut tcp, &mut upstream).await;
            });
        }
    });
    Ok(addr)
}

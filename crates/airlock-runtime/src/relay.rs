//! Local endpoints for the agent, relayed to the sidecar (its unix sockets,
//! or — docker — its TCP listeners on the run's network) with the sidecar
//! token added. They listen on 127.0.0.1 inside the sandbox's own network
//! namespace (in the process backend: the host's loopback, which is why
//! that backend isolates nothing).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use airlock_platform_api::launch::Endpoint;
use airlock_platform_api::sidecar_auth::SidecarAuth;

use airlock_tunnel::SpliceSocket;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use secrecy::{ExposeSecret, SecretString};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixStream};

/// Where the runtime dials the sidecar: a unix socket, or a TCP address
/// resolved once (the sidecar's address is fixed for the run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dial {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl Dial {
    /// Resolves `ep` (a `sidecar:8080` name through the sandbox's resolver).
    pub async fn resolve(ep: &Endpoint) -> std::io::Result<Dial> {
        match ep {
            Endpoint::Unix(p) => Ok(Dial::Unix(p.clone())),
            Endpoint::Tcp(h) => tokio::net::lookup_host((h.host(), h.port()))
                .await?
                .next()
                .map(Dial::Tcp)
                .ok_or_else(|| std::io::Error::other(format!("{h} has no address"))),
        }
    }

    pub async fn connect(&self) -> std::io::Result<Conn> {
        match self {
            Dial::Unix(p) => UnixStream::connect(p).await.map(Conn::Unix),
            Dial::Tcp(a) => {
                let s = TcpStream::connect(a).await?;
                let _ = s.set_nodelay(true);
                Ok(Conn::Tcp(s))
            }
        }
    }
}

impl std::fmt::Display for Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dial::Unix(p) => write!(f, "{}", p.display()),
            Dial::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// A connection to the sidecar.
pub enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    fn splice(&self) -> SpliceSocket<'_> {
        match self {
            Conn::Unix(s) => SpliceSocket::Unix(s),
            Conn::Tcp(s) => SpliceSocket::Tcp(s),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

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

fn not_found() -> Response<RelayBody> {
    let body = Full::new(Bytes::from_static(b"{\"error\":\"not_found\"}"))
        .map_err(|never| match never {})
        .boxed();
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::NOT_FOUND;
    r
}

async fn forward(
    socket: Dial,
    token: SecretString,
    mut req: Request<Incoming>,
) -> Response<RelayBody> {
    // `/events` is the runtime's own channel (heartbeats, logs, the result):
    // the agent must not be able to speak on it with the runtime's token.
    if req.uri().path().starts_with("/events") {
        return not_found();
    }
    if SidecarAuth(&token).set(req.headers_mut()).is_err() {
        return bad_gateway("token is not a header value");
    }
    let stream = match socket.connect().await {
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
pub async fn sidecar_relay(socket: Dial, token: SecretString) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Some(tcp) = accept(&listener).await else {
                continue;
            };
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

/// The next connection; after an accept error (out of descriptors, say) a
/// short pause, so a relay never stops listening.
async fn accept(listener: &TcpListener) -> Option<TcpStream> {
    match listener.accept().await {
        Ok((tcp, _)) => Some(tcp),
        Err(_) => {
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

/// Largest proxy request head the relay reads.
const MAX_HEAD: usize = 64 * 1024;

/// The forward proxy: adds `Proxy-Authorization` to the request head, then
/// splices the two connections. One request per connection for absolute-form
/// HTTP (`Connection: close`), so every request carries the token.
pub async fn proxy_relay(socket: Dial, token: SecretString) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Some(mut tcp) = accept(&listener).await else {
                continue;
            };
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
                // `lines` without the blank line; `rest` is what came after
                // the head (tunnel bytes or a body), sent on untouched.
                let lines = &head[..end];
                let rest = head.get(end + 4..).unwrap_or_default();
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
                let Ok(mut upstream) = socket.connect().await else {
                    let _ = tcp.write_all(b"HTTP/1.1 502 Bad Gateway\r\nconnection: close\r\ncontent-length: 0\r\n\r\n").await;
                    return;
                };
                out.push_str("\r\n");
                if upstream.write_all(out.as_bytes()).await.is_err()
                    || upstream.write_all(rest).await.is_err()
                {
                    return;
                }
                // The bytes move inside the kernel; copied only if no pipe
                // can be opened. The sidecar enforces the idle timeout.
                let spliced = airlock_tunnel::relay_spliced(
                    SpliceSocket::Tcp(&tcp),
                    upstream.splice(),
                    Duration::from_secs(24 * 3600),
                )
                .await;
                if spliced.is_err() {
                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut upstream).await;
                }
            });
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::UnixListener;

    /// Reads a request head byte by byte (nothing past it).
    async fn read_head(s: &mut tokio::net::UnixStream) -> Vec<u8> {
        let mut got = Vec::new();
        let mut b = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            assert_eq!(s.read(&mut b).await.unwrap(), 1, "the head ended early");
            got.push(b[0]);
        }
        got
    }

    /// A stand-in for the sidecar's proxy socket: records the request head,
    /// answers 200, then echoes the tunnel until the client half-closes.
    async fn fake_proxy(path: &std::path::Path) -> tokio::sync::oneshot::Receiver<String> {
        let l = UnixListener::bind(path).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let got = read_head(&mut s).await;
            let _ = tx.send(String::from_utf8_lossy(&got).into_owned());
            s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .unwrap();
            let (mut r, mut w) = s.split();
            tokio::io::copy(&mut r, &mut w).await.unwrap();
            w.shutdown().await.unwrap();
        });
        rx
    }

    #[tokio::test]
    async fn connect_gets_the_token_and_a_spliced_tunnel_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("proxy.sock");
        let seen = fake_proxy(&sock).await;
        let token = SecretString::from("0123abcd".repeat(8));
        let addr = proxy_relay(Dial::Unix(sock), token).await.unwrap();
        let mut c = TcpStream::connect(addr).await.unwrap();
        // A forged Proxy-Authorization, and tunnel bytes right behind the head.
        c.write_all(
            b"CONNECT api.example:443 HTTP/1.1\r\nHost: api.example:443\r\nProxy-Authorization: Basic Zm9yZ2Vk\r\n\r\nearly",
        )
        .await
        .unwrap();
        let head = seen.await.unwrap();
        assert!(
            head.starts_with("CONNECT api.example:443 HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(head.contains(&format!(
            "Proxy-Authorization: Bearer {}\r\n",
            "0123abcd".repeat(8)
        )));
        assert!(
            !head.contains("Zm9yZ2Vk"),
            "the agent's own credential header went through"
        );
        let mut answer = vec![0u8; 39];
        c.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HTTP/1.1 200 Connection established\r\n\r\n");
        // 2 MiB more each way, in order, then the half-close reaches the end.
        let (mut r, mut w) = c.into_split();
        let data: Vec<u8> = (0..2 * 1024 * 1024u32).map(|i| (i % 253) as u8).collect();
        let mut expect = b"early".to_vec();
        expect.extend_from_slice(&data);
        let writer = tokio::spawn(async move {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut back = Vec::new();
        r.read_to_end(&mut back).await.unwrap();
        writer.await.unwrap();
        assert!(
            back == expect,
            "the echo came back different ({} bytes)",
            back.len()
        );
    }

    #[tokio::test]
    async fn absolute_form_post_keeps_its_body_exact_and_closes() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("proxy.sock");
        let l = UnixListener::bind(&sock).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<(String, Vec<u8>)>();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let got = read_head(&mut s).await;
            let head = String::from_utf8_lossy(&got).into_owned();
            let mut body = vec![0u8; 11];
            s.read_exact(&mut body).await.unwrap();
            s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                .await
                .unwrap();
            // Nothing may follow the body the head announced.
            let mut extra = Vec::new();
            let _ = tokio::time::timeout(
                std::time::Duration::from_millis(200),
                s.read_to_end(&mut extra),
            )
            .await;
            body.extend_from_slice(&extra);
            let _ = tx.send((head, body));
        });
        let addr = proxy_relay(Dial::Unix(sock), SecretString::from("t0k3n".repeat(4)))
            .await
            .unwrap();
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"POST http://api.example/x HTTP/1.1\r\nHost: api.example\r\nProxy-Connection: keep-alive\r\nContent-Length: 11\r\n\r\nhello world")
            .await
            .unwrap();
        let mut answer = vec![0u8; 27];
        c.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HTTP/1.1 204 No Content\r\n\r\n");
        drop(c);
        let (head, body) = rx.await.unwrap();
        assert!(
            head.starts_with("POST http://api.example/x HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(head.contains("Connection: close\r\n"), "{head}");
        assert!(
            !head.to_ascii_lowercase().contains("proxy-connection"),
            "{head}"
        );
        assert!(head.contains(&format!(
            "Proxy-Authorization: Bearer {}\r\n",
            "t0k3n".repeat(4)
        )));
        assert_eq!(body, b"hello world");
    }
}

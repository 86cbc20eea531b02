//! The sidecar's forward proxy, driven with real `curl` (and raw sockets where
//! curl would not send the attack) against the real `airlock sidecar`.
//!
//! Every upstream is a server this test runs on 127.0.0.1; the ones the guard
//! should let through are named `api.internal.test` / `other.internal.test`
//! and reached through the operator's internal-host opt-in (`egress.resolve`,
//! `egress.allow_internal_hosts` and a literal pattern). Each refusal also
//! checks that the target server saw no connection at all.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use airlock_platform::testing::TestPlatform;
use airlock_store::EgressDecision;
use airlock_vault::ExposeSecret;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HOST: &str = "api.internal.test";
const OTHER: &str = "other.internal.test";

/// A server on 127.0.0.1 that counts the connections it accepted and keeps
/// the request heads it read.
#[derive(Clone, Default)]
struct Seen {
    conns: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Seen {
    fn conns(&self) -> usize {
        self.conns.load(Ordering::SeqCst)
    }
    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf[end + 4..].to_vec();
            return Some((String::from_utf8_lossy(&buf[..end]).into_owned(), rest));
        }
        let n = s.read(&mut b).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&b[..n]);
    }
}

/// Reads a request body framed by Content-Length or chunked encoding.
async fn read_body<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    head: &str,
    mut have: Vec<u8>,
) -> Vec<u8> {
    let lower = head.to_ascii_lowercase();
    if let Some(cl) = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
    {
        let n: usize = cl.trim().parse().unwrap_or(0);
        while have.len() < n {
            let mut b = [0u8; 4096];
            match s.read(&mut b).await {
                Ok(0) | Err(_) => break,
                Ok(k) => have.extend_from_slice(&b[..k]),
            }
        }
        have.truncate(n);
        return have;
    }
    if lower.contains("transfer-encoding: chunked") {
        while !have.windows(5).any(|w| w == b"0\r\n\r\n") {
            let mut b = [0u8; 4096];
            match s.read(&mut b).await {
                Ok(0) | Err(_) => break,
                Ok(k) => have.extend_from_slice(&b[..k]),
            }
        }
        let mut out = Vec::new();
        let mut rest = &have[..];
        while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap_or("0").trim(), 16)
                    .unwrap_or(0);
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
            rest = &rest[eol + 2 + size + 2..];
        }
        return out;
    }
    Vec::new()
}

/// Plain HTTP: `/redirect` answers 302, everything else 200 `plain:<path>`.
async fn http_server() -> (u16, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Seen::default();
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            s2.conns.fetch_add(1, Ordering::SeqCst);
            let seen = s2.clone();
            tokio::spawn(async move {
                let Some((head, rest)) = read_head(&mut s).await else {
                    return;
                };
                let body = read_body(&mut s, &head, rest).await;
                seen.heads.lock().unwrap().push(head.clone());
                seen.bodies.lock().unwrap().push(body);
                let path = head.split(' ').nth(1).unwrap_or("").to_owned();
                let resp = if path == "/redirect" {
                    "HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/meta-data/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned()
                } else {
                    let body = format!("plain:{path}");
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Upstream: yes\r\nConnection: close, X-Hop\r\nX-Hop: drop-me\r\nKeep-Alive: timeout=5\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (port, seen)
}

/// TLS (certificate for `api.internal.test`, `other.internal.test`): answers
/// 200 `tls:<path>`. Returns the port, the CA file for curl and the counter.
async fn tls_server(dir: &std::path::Path) -> (u16, std::path::PathBuf, Seen) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ck = rcgen::generate_simple_self_signed(vec![HOST.to_owned(), OTHER.to_owned()]).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, ck.cert.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Seen::default();
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            s2.conns.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            let seen = s2.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                let Some((head, _)) = read_head(&mut tls).await else {
                    return;
                };
                seen.heads.lock().unwrap().push(head.clone());
                let path = head.split(' ').nth(1).unwrap_or("").to_owned();
                let body = format!("tls:{path}");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(resp.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, ca, seen)
}

/// Echoes whatever it reads.
async fn echo_server() -> (u16, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Seen::default();
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            s2.conns.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (port, seen)
}

/// A minimal upstream HTTP proxy (the operator's `PROXY_URL`): records each
/// CONNECT line and its Proxy-Authorization, then tunnels.
async fn upstream_proxy() -> (u16, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Seen::default();
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            s2.conns.fetch_add(1, Ordering::SeqCst);
            let seen = s2.clone();
            tokio::spawn(async move {
                let Some((head, rest)) = read_head(&mut s).await else {
                    return;
                };
                seen.heads.lock().unwrap().push(head.clone());
                let target = head.split(' ').nth(1).unwrap_or("").to_owned();
                let Ok(addr) = target.parse::<SocketAddr>() else {
                    let _ = s
                        .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    return;
                };
                // The test's own upstream proxy only tunnels to loopback (network rule).
                if !addr.ip().is_loopback() {
                    let _ = s
                        .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let Ok(mut up) = TcpStream::connect(addr).await else {
                    let _ = s
                        .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    return;
                };
                let _ = s
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await;
                let _ = up.write_all(&rest).await;
                let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
            });
        }
    });
    (port, seen)
}

struct Curl {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Curl {
    /// `-w` prints `\n<http_code> <http_connect>` at the end of stdout.
    fn codes(&self) -> (u16, u16) {
        let last = self.stdout.lines().last().unwrap_or("");
        let mut it = last.split(' ').map(|s| s.parse::<u16>().unwrap_or(0));
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    }
    fn body(&self) -> String {
        let mut lines: Vec<&str> = self.stdout.lines().collect();
        lines.pop();
        lines.join("\n")
    }
}

async fn curl(args: Vec<String>) -> Curl {
    tokio::task::spawn_blocking(move || {
        let out = curl_without_proxy_env()
            .args([
                "-sS",
                "--max-time",
                "20",
                "-w",
                "\n%{http_code} %{http_connect}",
            ])
            .args(&args)
            .output()
            .expect("curl must be installed (.ci/run installs it)");
        Curl {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .unwrap()
}

struct Env {
    p: TestPlatform,
    sc: SidecarProcess,
}

impl Env {
    fn proxy(&self) -> String {
        format!("http://{}", self.sc.proxy_tcp())
    }
    fn user(&self) -> String {
        format!("run:{}", self.p.sidecar_token.expose_secret())
    }
    /// curl through the proxy with the token.
    async fn curl(&self, extra: &[&str]) -> Curl {
        let mut args = vec![
            "-x".to_owned(),
            self.proxy(),
            "--proxy-user".to_owned(),
            self.user(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        curl(args).await
    }
    /// Stops the sidecar (flushing its events) and returns the egress log.
    async fn egress(&mut self) -> Vec<airlock_store::EgressEntry> {
        self.sc.stop();
        self.p.egress_log().await
    }
}

async fn env(
    agent: &str,
    network: NetworkEgress,
    extra: impl FnOnce(SidecarConfigBuilder) -> SidecarConfigBuilder,
) -> Env {
    let p = TestPlatform::start(agent).await;
    let cfg = p
        .sidecar_config()
        .tcp()
        .proxy_tcp()
        .network(network)
        .loopback_host(HOST)
        .loopback_host(OTHER);
    let sc = spawn_sidecar(&extra(cfg).build());
    Env { p, sc }
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_to_an_opted_in_internal_host_works_and_loopback_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let (tls_port, ca, tls_seen) = tls_server(dir.path()).await;
    let ca = ca.to_string_lossy().into_owned();
    let mut e = env(
        "proxy-a",
        NetworkEgress::Allow(vec![format!("https://{HOST}:{tls_port}/**")]),
        |c| c,
    )
    .await;

    // The legitimate path: a CONNECT tunnel to the internal host, TLS end to end.
    let url = format!("https://{HOST}:{tls_port}/hello");
    let ok = e.curl(&["--cacert", &ca, &url]).await;
    assert_eq!(ok.code, 0, "curl failed: {}", ok.stderr);
    assert_eq!(ok.codes(), (200, 200));
    assert_eq!(ok.body(), "tls:/hello");
    assert_eq!(tls_seen.conns(), 1);

    // The same server by loopback address or name: refused before any connection.
    for target in [
        format!("https://127.0.0.1:{tls_port}/"),
        format!("https://localhost:{tls_port}/"),
        format!("https://[::1]:{tls_port}/"),
        format!("https://{OTHER}:{tls_port}/"), // opted in by the operator, but not in network.egress
        format!("https://{HOST}:{}/", tls_port.wrapping_add(1)), // another port of the allowed host
    ] {
        let r = e.curl(&["--cacert", &ca, &target]).await;
        assert_eq!(r.codes().1, 403, "{target}: {} {}", r.stdout, r.stderr);
        assert_ne!(r.code, 0, "{target}");
    }
    assert_eq!(tls_seen.conns(), 1, "a refused CONNECT reached the server");

    let log = e.egress().await;
    let allowed: Vec<_> = log
        .iter()
        .filter(|l| l.decision == EgressDecision::Allowed)
        .collect();
    assert_eq!(allowed.len(), 1, "{log:?}");
    assert_eq!(allowed[0].source.as_str(), "proxy");
    assert_eq!(allowed[0].method, "CONNECT");
    assert_eq!(allowed[0].host, HOST);
    assert!(allowed[0].duration_ms.is_some());
    let refused: Vec<_> = log
        .iter()
        .filter(|l| l.decision == EgressDecision::Refused)
        .collect();
    assert_eq!(refused.len(), 5, "{log:?}");
    let reasons: Vec<_> = refused
        .iter()
        .map(|l| l.reason.map(|r| r.as_str().to_owned()).unwrap_or_default())
        .collect();
    assert!(
        reasons
            .iter()
            .all(|r| r == "not_authorized" || r == "blocked_address" || r == "blocked_host"),
        "{reasons:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn public_policy_refuses_every_internal_spelling() {
    let (port, seen) = http_server().await;
    let e = env("proxy-b", NetworkEgress::Public, |c| c).await;
    // Under `public`, the internal-host opt-in needs a literal pattern, which
    // `public` does not have: everything local is refused.
    for url in [
        format!("http://127.0.0.1:{port}/"),
        format!("http://0x7f.1:{port}/"),
        format!("http://2130706433:{port}/"),
        format!("http://0177.0.0.1:{port}/"),
        format!("http://127.1:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://localhost:{port}/"),
        format!("http://foo.localhost:{port}/"),
        format!("http://{HOST}:{port}/"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        format!("http://sidecar:{port}/"),
    ] {
        let r = e.curl(&[&url]).await;
        assert_eq!(r.codes().0, 403, "{url}: {}", r.stdout);
        assert!(r.body().contains("blocked_"), "{url}: {}", r.body());
    }
    for target in [
        format!("127.0.0.1:{port}"),
        format!("0x7f.1:{port}"),
        format!("localhost:{port}"),
    ] {
        let r = e.curl(&["-p", &format!("http://{target}/")]).await;
        assert_eq!(r.codes().1, 403, "CONNECT {target}: {}", r.stderr);
    }
    assert_eq!(seen.conns(), 0, "a refused request reached the server");
}

#[tokio::test(flavor = "multi_thread")]
async fn absolute_form_get_is_forwarded_without_hop_headers_or_the_token() {
    let (port, seen) = http_server().await;
    let mut e = env(
        "proxy-c",
        NetworkEgress::Allow(vec![format!("http://{HOST}:{port}/**")]),
        |c| c,
    )
    .await;
    let url = format!("http://{HOST}:{port}/path?q=1");
    let token = e.p.sidecar_token.expose_secret().to_owned();
    let r = e
        .curl(&[
            "-i",
            "-H",
            "Connection: close, X-Secret-Hop",
            "-H",
            "X-Secret-Hop: nope",
            "-H",
            "X-Keep: yes",
            "-H",
            "Proxy-Foo: bar",
            &url,
        ])
        .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.codes().0, 200);
    assert!(r.stdout.contains("plain:/path?q=1"), "{}", r.stdout);
    assert!(r.stdout.to_ascii_lowercase().contains("x-upstream: yes"));
    assert!(
        !r.stdout.to_ascii_lowercase().contains("x-hop"),
        "hop header of the response was forwarded: {}",
        r.stdout
    );
    let heads = seen.heads();
    assert_eq!(heads.len(), 1);
    let h = heads[0].to_ascii_lowercase();
    assert!(
        h.starts_with("get /path?q=1 http/1.1\r\n"),
        "not origin-form: {h}"
    );
    assert!(h.contains(&format!("host: {HOST}:{port}")), "{h}");
    assert!(h.contains("x-keep: yes"), "{h}");
    for gone in [
        "proxy-authorization",
        "proxy-foo",
        "x-secret-hop",
        "proxy-connection",
        &token.to_ascii_lowercase(),
    ] {
        assert!(!h.contains(gone), "{gone:?} travelled upstream: {h}");
    }

    // Redirects are the client's business: the 302 comes back as is, and
    // its Location (the metadata address) is not contacted.
    let r = e
        .curl(&["-i", &format!("http://{HOST}:{port}/redirect")])
        .await;
    assert_eq!(r.codes().0, 302, "{}", r.stdout);
    assert!(r.stdout.contains("169.254.169.254"));
    // curl following it goes back through the proxy, which refuses it.
    let r = e
        .curl(&["-L", &format!("http://{HOST}:{port}/redirect")])
        .await;
    assert_eq!(r.codes().0, 403, "{}", r.stdout);

    // A body (chunked, then sized) reaches the upstream intact.
    let r = e
        .curl(&[
            "-H",
            "Transfer-Encoding: chunked",
            "--data-binary",
            "chunked-body",
            &url,
        ])
        .await;
    assert_eq!(r.codes().0, 200, "{}", r.stderr);
    let r = e.curl(&["--data-binary", "sized-body", &url]).await;
    assert_eq!(r.codes().0, 200, "{}", r.stderr);
    let bodies = seen.bodies.lock().unwrap().clone();
    assert!(bodies.contains(&b"chunked-body".to_vec()), "{bodies:?}");
    assert!(bodies.contains(&b"sized-body".to_vec()), "{bodies:?}");

    let log = e.egress().await;
    let get = log
        .iter()
        .find(|l| l.method == "GET" && l.status == Some(200))
        .expect("the GET is logged");
    assert_eq!(get.decision, EgressDecision::Allowed);
    assert!(
        !get.url.contains("q=1"),
        "the query is not logged: {}",
        get.url
    );
    assert!(
        log.iter()
            .any(|l| l.decision == EgressDecision::Refused && l.host == "169.254.169.254"),
        "{log:?}"
    );
}

/// Sends raw bytes to the proxy and returns the response.
fn raw(addr: SocketAddr, bytes: &[u8]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test(flavor = "multi_thread")]
async fn smuggling_shapes_and_missing_tokens_are_refused() {
    let (port, seen) = http_server().await;
    let e = env(
        "proxy-d",
        NetworkEgress::Allow(vec![format!("http://{HOST}:{port}/**")]),
        |c| c,
    )
    .await;
    let addr = e.sc.proxy_tcp();
    let tok = e.p.sidecar_token.expose_secret().to_owned();
    let auth = format!("Proxy-Authorization: Bearer {tok}\r\n");
    let target = format!("http://{HOST}:{port}/x");
    let cases: Vec<(String, u16)> = vec![
        // CRLF smuggled into a header value (bare LF, bare CR).
        (
            format!("GET {target} HTTP/1.1\r\n{auth}X-A: a\nGET /admin HTTP/1.1\r\n\r\n"),
            400,
        ),
        (
            format!("GET {target} HTTP/1.1\r\n{auth}X-A: a\rInjected: 1\r\n\r\n"),
            400,
        ),
        (
            format!("GET {target} HTTP/1.1\r\n{auth}X-A: a\0b\r\n\r\n"),
            400,
        ),
        // Framing ambiguities.
        (
            format!(
                "POST {target} HTTP/1.1\r\n{auth}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            ),
            400,
        ),
        (
            format!(
                "POST {target} HTTP/1.1\r\n{auth}Content-Length: 4\r\nContent-Length: 5\r\n\r\nabcde"
            ),
            400,
        ),
        (
            format!(
                "POST {target} HTTP/1.1\r\n{auth}Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n"
            ),
            400,
        ),
        (
            format!("GET {target} HTTP/1.1\r\n{auth}X-A: a\r\n folded\r\n\r\n"),
            400,
        ),
        // Not a proxy request.
        (
            format!("GET /x HTTP/1.1\r\n{auth}Host: {HOST}:{port}\r\n\r\n"),
            400,
        ),
        // No token, a wrong token, the token in the wrong header.
        (format!("GET {target} HTTP/1.1\r\n\r\n"), 407),
        (
            format!(
                "GET {target} HTTP/1.1\r\nProxy-Authorization: Bearer {}\r\n\r\n",
                "0".repeat(tok.len())
            ),
            407,
        ),
        (
            format!("GET {target} HTTP/1.1\r\nAuthorization: Bearer {tok}\r\n\r\n"),
            407,
        ),
        (format!("CONNECT {HOST}:{port} HTTP/1.1\r\n\r\n"), 407),
    ];
    for (req, want) in &cases {
        let (status, text) = raw(addr, req.as_bytes());
        assert_eq!(status, *want, "{req:?} -> {text}");
        if *want == 407 {
            assert!(
                text.contains("Proxy-Authenticate: Basic realm=\"airlock\""),
                "{text}"
            );
            assert!(!text.contains(&tok));
        }
    }
    // curl without credentials gets 407 too.
    let r = curl(vec!["-x".into(), e.proxy(), target.clone()]).await;
    assert_eq!(r.codes().0, 407);
    assert_eq!(seen.conns(), 0, "a refused request reached the upstream");
    // The legitimate request on the same proxy works (the refusals were not vacuous).
    let (status, text) = raw(
        addr,
        format!("GET {target} HTTP/1.1\r\n{auth}\r\n").as_bytes(),
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(seen.conns(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn none_refuses_everything_and_a_list_only_its_hosts() {
    let (port, seen) = http_server().await;
    let e = env("proxy-e", NetworkEgress::None, |c| c).await;
    for url in [
        format!("http://{HOST}:{port}/"),
        format!("http://{OTHER}:{port}/"),
    ] {
        let r = e.curl(&[&url]).await;
        assert_eq!(r.codes().0, 403, "{url}");
        assert!(r.body().contains("not_authorized"), "{}", r.body());
        let r = e.curl(&["-p", &url]).await;
        assert_eq!(r.codes().1, 403, "CONNECT {url}");
    }
    assert_eq!(seen.conns(), 0);
    drop(e);

    let e = env(
        "proxy-f",
        NetworkEgress::Allow(vec![format!("http://{HOST}:{port}/allowed/**")]),
        |c| c,
    )
    .await;
    let r = e.curl(&[&format!("http://{HOST}:{port}/allowed/x")]).await;
    assert_eq!(r.codes().0, 200, "{}", r.stderr);
    for url in [
        format!("http://{HOST}:{port}/other"),
        format!("http://{OTHER}:{port}/allowed/x"),
        format!("https://{HOST}:{port}/allowed/x"),
    ] {
        let r = e.curl(&[&url]).await;
        assert!(
            r.codes().0 == 403 || r.codes().1 == 403,
            "{url}: {} {}",
            r.stdout,
            r.stderr
        );
    }
    assert_eq!(
        seen.conns(),
        1,
        "only the matching request reached the server"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_back_into_the_sidecar_is_refused() {
    let (echo_port, echo_seen) = echo_server().await;
    // The operator opted the host in on every port: the sidecar's own
    // listeners are still out of reach.
    let e = env(
        "proxy-g",
        NetworkEgress::Allow(vec![format!("https://{HOST}:*/**")]),
        |c| c,
    )
    .await;
    let proxy_port = e.sc.proxy_tcp().port();
    let api_port = e.sc.tcp().port();
    let tok = e.p.sidecar_token.expose_secret().to_owned();
    for port in [proxy_port, api_port] {
        let (status, text) = raw(
            e.sc.proxy_tcp(),
            format!("CONNECT {HOST}:{port} HTTP/1.1\r\nProxy-Authorization: Bearer {tok}\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(status, 403, "CONNECT to the sidecar's port {port}: {text}");
        let (status, _) = raw(
            e.sc.proxy_tcp(),
            format!("CONNECT sidecar:{port} HTTP/1.1\r\nProxy-Authorization: Bearer {tok}\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(status, 403);
    }
    // Another port of the same host is reachable (the refusal is about the sidecar).
    let mut s = TcpStream::connect(e.sc.proxy_tcp()).await.unwrap();
    s.write_all(
        format!("CONNECT {HOST}:{echo_port} HTTP/1.1\r\nProxy-Authorization: Bearer {tok}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let (head, _) = read_head(&mut s).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s.write_all(b"ping").await.unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"ping");
    assert_eq!(echo_seen.conns(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_tunnel_is_closed() {
    let (echo_port, _) = echo_server().await;
    let mut e = env(
        "proxy-h",
        NetworkEgress::Allow(vec![format!("https://{HOST}:{echo_port}/**")]),
        |c| c.limits(|l| l.proxy_idle_timeout_secs = 1),
    )
    .await;
    let tok = e.p.sidecar_token.expose_secret().to_owned();
    let mut s = TcpStream::connect(e.sc.proxy_tcp()).await.unwrap();
    // The first bytes of the tunnel ride right behind the CONNECT head.
    s.write_all(
        format!(
            "CONNECT {HOST}:{echo_port} HTTP/1.1\r\nProxy-Authorization: Basic {}\r\n\r\nearly",
            b64(&format!("run:{tok}"))
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (head, mut rest) = read_head(&mut s).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    while rest.len() < 5 {
        let mut b = [0u8; 16];
        let n = s.read(&mut b).await.unwrap();
        assert!(n > 0);
        rest.extend_from_slice(&b[..n]);
    }
    assert_eq!(rest, b"early");
    // Traffic inside the timeout keeps the tunnel open...
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        s.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
    }
    // ...silence past it closes it.
    let started = std::time::Instant::now();
    let mut b = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
        .await
        .expect("idle tunnel not closed")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed too early: {:?}",
        started.elapsed()
    );
    let log = e.egress().await;
    assert!(
        log.iter().any(|l| l.method == "CONNECT"
            && l.decision == EgressDecision::Allowed
            && l.duration_ms.unwrap_or(0) >= 2000
            // "early" and three "x" out, their echo back.
            && l.bytes_out == 8
            && l.bytes_in == 8),
        "{log:?}"
    );
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[tokio::test(flavor = "multi_thread")]
async fn chaining_through_proxy_url_keeps_the_guard_and_the_pin() {
    let dir = tempfile::tempdir().unwrap();
    let (tls_port, ca, tls_seen) = tls_server(dir.path()).await;
    let (http_port, http_seen) = http_server().await;
    let (up_port, up_seen) = upstream_proxy().await;
    let ca = ca.to_string_lossy().into_owned();
    let mut e = env(
        "proxy-i",
        NetworkEgress::Allow(vec![
            format!("https://{HOST}:{tls_port}/**"),
            format!("http://{HOST}:{http_port}/**"),
        ]),
        |c| c.proxy_url(&format!("http://op%40corp:s3cret@127.0.0.1:{up_port}")),
    )
    .await;
    let r = e
        .curl(&["--cacert", &ca, &format!("https://{HOST}:{tls_port}/via")])
        .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.body(), "tls:/via");
    let r = e.curl(&[&format!("http://{HOST}:{http_port}/plain")]).await;
    assert_eq!(r.codes().0, 200, "{} {}", r.stdout, r.stderr);
    assert_eq!(r.body(), "plain:/plain");
    // Refusals never reach the upstream proxy.
    let r = e
        .curl(&["-p", &format!("http://127.0.0.1:{tls_port}/")])
        .await;
    assert_eq!(r.codes().1, 403);
    let heads = up_seen.heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    let expected_auth =
        format!("proxy-authorization: basic {}", b64("op@corp:s3cret")).to_ascii_lowercase();
    for (h, port) in heads.iter().zip([tls_port, http_port]) {
        // The upstream proxy is asked for the validated address, never the name.
        assert!(
            h.starts_with(&format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n")),
            "{h}"
        );
        assert!(h.to_ascii_lowercase().contains(&expected_auth), "{h}");
        assert!(!h.contains(e.p.sidecar_token.expose_secret()));
    }
    assert_eq!(tls_seen.conns(), 1);
    assert_eq!(http_seen.conns(), 1);
    e.sc.stop();
    assert!(
        !e.sc.stderr().contains("s3cret"),
        "the PROXY_URL password was logged"
    );
}

/// Past `limits.max_proxy_connections` open connections the proxy accepts no
/// more (they wait in the backlog) and serves them as soon as one closes; the
/// sidecar's other routes keep answering meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn proxy_connections_past_the_cap_wait_for_a_free_slot() {
    let (echo_port, _) = echo_server().await;
    let e = env(
        "proxy-cap",
        NetworkEgress::Allow(vec![format!("https://{HOST}:{echo_port}/**")]),
        |c| c.limits(|l| l.max_proxy_connections = 2),
    )
    .await;
    let tok = e.p.sidecar_token.expose_secret().to_owned();
    let connect = format!(
        "CONNECT {HOST}:{echo_port} HTTP/1.1\r\nProxy-Authorization: Basic {}\r\n\r\n",
        b64(&format!("run:{tok}"))
    );
    let mut tunnels = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(e.sc.proxy_tcp()).await.unwrap();
        s.write_all(connect.as_bytes()).await.unwrap();
        let (head, _) = read_head(&mut s).await.unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        tunnels.push(s);
    }
    let mut third = TcpStream::connect(e.sc.proxy_tcp()).await.unwrap();
    third.write_all(connect.as_bytes()).await.unwrap();
    let mut b = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(500), third.read(&mut b))
            .await
            .is_err(),
        "a third connection was served while two were open"
    );
    let (status, _, _) = http(e.sc.tcp(), "GET", "/health", &[], b"");
    assert_eq!(status, 200);
    // A tunnel closes: the waiting connection is served.
    drop(tunnels.remove(0));
    let (head, _) = tokio::time::timeout(Duration::from_secs(5), read_head(&mut third))
        .await
        .expect("the waiting connection was never served")
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    third.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    third.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
}

//! One egress log with one meaning: the same requests, allowed and refused,
//! sent by a client through the forward proxy and by a client that ignores
//! proxy variables through the transparent plane (the runtime's carrier,
//! in this process, on synthetic addresses, to the real `airlock sidecar`)
//! give records that differ only in their `plane` (and in what differs per
//! connection: when, their number, how long). Plain HTTP through the plane
//! is judged as the proxy judges plain HTTP (method and URL), not as the
//! CONNECT's `https`.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use airlock_runtime::Dial;
use airlock_runtime::transparent::carry;
use airlock_store::{EgressEntry, EgressPlane};
use airlock_vault::ExposeSecret;
use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::support::tls::{acceptor_for, serve_https, test_ca};
use crate::support::*;

const HOST: &str = "api.internal.test";
/// Opted in as internal by the operator, but not in the run's egress.
const OTHER: &str = "other.internal.test";

/// Plain HTTP on 127.0.0.1: every request is answered `plain:<path>`.
async fn http_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: hyper::Request<_>| {
                    let body = format!("plain:{}", req.uri().path());
                    async move {
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                            body,
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    port
}

/// The synthetic addresses this test's carriers listen on (its own /24 of
/// the plane's range, by process, so parallel runs do not meet).
fn synthetic(host: u8) -> Ipv4Addr {
    let net = 100 + u8::try_from(std::process::id() % 100).unwrap();
    Ipv4Addr::new(127, 18, net, host)
}

/// curl with no proxy at all, `name:port` resolved to `at`, or through
/// the proxy `via` (`-x`, with its user): `(exit code, HTTP code, body)`.
fn curl(url: &str, ca: &str, route: &[String]) -> (i32, String, String) {
    let out = curl_without_proxy_env()
        .args(["-sS", "--max-time", "20", "--cacert", ca])
        .args(["-w", "\n%{http_code}"])
        .args(route)
        .arg(url)
        .output()
        .expect("curl must be installed (.ci/run installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    (
        out.status.code().unwrap_or(-1),
        code.to_owned(),
        body.to_owned(),
    )
}

/// A record without what differs per connection (when, its number and id,
/// how long) and without its plane.
fn meaning(e: &EgressEntry, bytes: bool) -> EgressEntry {
    EgressEntry {
        id: 0,
        at: 0,
        seq: None,
        duration_ms: None,
        plane: EgressPlane::Api,
        bytes_in: if bytes { e.bytes_in } else { 0 },
        bytes_out: if bytes { e.bytes_out } else { 0 },
        ..e.clone()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_and_the_plane_give_records_that_differ_only_in_their_plane() {
    let ca = test_ca();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.issuer.pem()).unwrap();
    let ca_file = ca_file.to_string_lossy().into_owned();
    let tls = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls_port = tls.local_addr().unwrap().port();
    serve_https(tls, acceptor_for(&[HOST, OTHER], &ca), |req| {
        Response::new(Full::new(Bytes::from(format!("tls:{}", req.uri().path()))))
    });
    let http_port = http_server().await;

    let p = airlock_platform::testing::TestPlatform::start("plane-records").await;
    let cfg = p
        .sidecar_config()
        .tcp()
        .proxy_tcp()
        .network(NetworkEgress::Allow(vec![
            format!("https://{HOST}:{tls_port}/**"),
            format!("http://{HOST}:{http_port}/plain/**"),
        ]))
        .loopback_host(HOST)
        .loopback_host(OTHER)
        .build();
    let mut sc = spawn_sidecar(&cfg);
    let proxy = sc.proxy_tcp();
    let token = p.sidecar_token.expose_secret().to_owned();
    // The runtime's carrier, as in a sandbox: an address per name, a
    // listener per carried port.
    let mut at = std::collections::HashMap::new();
    for (i, name) in [HOST, OTHER].into_iter().enumerate() {
        let ip = synthetic(1 + u8::try_from(i).unwrap());
        for port in [tls_port, http_port] {
            let l = TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), port))
                .await
                .unwrap();
            carry::serve_on(l, name.into(), Dial::Tcp(proxy), token.clone().into());
        }
        at.insert(name, ip);
    }
    let via_proxy = vec![
        "-x".to_owned(),
        format!("http://{proxy}"),
        "--proxy-user".to_owned(),
        format!("run:{token}"),
    ];
    let via_plane = |name: &str, port: u16| {
        vec![
            "--resolve".to_owned(),
            format!("{name}:{port}:{}", at[name]),
        ]
    };

    let cases = [
        // (scheme, name, port, path, allowed, what the client sees when allowed)
        ("https", HOST, tls_port, "/a", true, "tls:/a"),
        ("http", HOST, http_port, "/plain/b", true, "plain:/plain/b"),
        ("https", OTHER, tls_port, "/c", false, ""),
        // The same host, a path its rule does not cover: plain HTTP is
        // judged with its URL through the plane as through the proxy.
        ("http", HOST, http_port, "/other", false, ""),
        ("http", OTHER, http_port, "/plain/d", false, ""),
    ];
    for (scheme, name, port, path, allowed, body) in cases {
        let url = format!("{scheme}://{name}:{port}{path}");
        for route in [via_proxy.clone(), via_plane(name, port)] {
            let (url, sent, ca_file) = (url.clone(), route.clone(), ca_file.clone());
            let (code, status, got) =
                tokio::task::spawn_blocking(move || curl(&url, &ca_file, &sent))
                    .await
                    .unwrap();
            if allowed {
                assert_eq!(
                    (code, status.as_str(), got.as_str()),
                    (0, "200", body),
                    "{route:?}"
                );
            } else if scheme == "http" {
                // Plain HTTP is answered as the proxy answers it.
                assert_eq!(status, "403", "{route:?}: {got}");
            } else {
                assert_ne!(code, 0, "{route:?}: {got}");
            }
        }
    }

    sc.stop();
    let log = p.egress_log().await;
    assert_eq!(log.len(), 2 * cases.len(), "{log:#?}");
    let proxy_side: Vec<&EgressEntry> = log
        .iter()
        .filter(|e| e.plane == EgressPlane::Proxy)
        .collect();
    let plane_side: Vec<&EgressEntry> = log
        .iter()
        .filter(|e| e.plane == EgressPlane::Transparent)
        .collect();
    assert_eq!(proxy_side.len(), cases.len(), "{log:#?}");
    assert_eq!(plane_side.len(), cases.len(), "{log:#?}");
    for (a, b) in proxy_side.iter().zip(&plane_side) {
        // A TLS tunnel's bytes are its handshake's too (not the same twice);
        // a plain request's are its body's.
        let bytes = a.method != "CONNECT";
        assert_eq!(meaning(a, bytes), meaning(b, bytes), "{a:#?}\n{b:#?}");
        assert_eq!(a.source.as_str(), "proxy");
    }
    let methods: Vec<(&str, &str)> = proxy_side
        .iter()
        .map(|e| (e.method.as_str(), e.decision.as_str()))
        .collect();
    assert_eq!(
        methods,
        [
            ("CONNECT", "allowed"),
            ("GET", "allowed"),
            ("CONNECT", "refused"),
            ("GET", "refused"),
            ("GET", "refused"),
        ]
    );
}

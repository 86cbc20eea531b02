//! `GuardedClient::send_streaming`: the same guard as `send`, the body handed
//! over frame by frame as it arrives, the response cap enforced while
//! streaming, no redirect followed. Every server here listens on 127.0.0.1.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use airlock_egress::{
    AuthorizedUris, CallRules, ClientConfig, EgressCode, EgressPolicy, Guard, GuardedClient,
    OutboundRequest, StaticResolver,
};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

const HOST: &str = "api.internal.test";

fn client(cfg: ClientConfig) -> GuardedClient {
    let mut r = StaticResolver::new();
    r.insert(HOST, ["127.0.0.1".parse().unwrap()]);
    let mut p = EgressPolicy::new();
    p.allow_internal_hosts([HOST]);
    GuardedClient::with_dialer(
        Guard::new(p, Arc::new(r)),
        cfg,
        Arc::new(TestNet::default()),
    )
    .unwrap()
}

fn rules(list: &AuthorizedUris) -> CallRules<'_> {
    CallRules {
        authorized: list,
        allow_all_uris: false,
        credentialed: true,
    }
}

async fn read_head(s: &mut tokio::net::TcpStream) {
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
}

#[tokio::test]
async fn first_chunk_arrives_before_the_second_is_sent() {
    install_crypto();
    // The server sends one chunk, then waits until the test has seen it
    // before sending the second: a client that buffered would hang here.
    let seen = Arc::new(Notify::new());
    let s2 = seen.clone();
    let addr = raw(move |mut s| {
        let seen = s2.clone();
        async move {
            read_head(&mut s).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                .await;
            let _ = s.write_all(b"8\r\ndata: 1\n\r\n").await;
            seen.notified().await;
            let _ = s.write_all(b"8\r\ndata: 2\n\r\n0\r\n\r\n").await;
        }
    })
    .await;
    let c = client(ClientConfig::default());
    let list = AuthorizedUris::parse(&[format!("http://{HOST}:{}/**", addr.port())]);
    let mut resp = tokio::time::timeout(
        Duration::from_secs(10),
        c.send_streaming(
            OutboundRequest::get(format!("http://{HOST}:{}/v1/stream", addr.port())),
            &rules(&list),
        ),
    )
    .await
    .expect("head did not arrive")
    .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.headers["content-type"], "text/event-stream");
    let first = tokio::time::timeout(Duration::from_secs(10), resp.body.frame())
        .await
        .expect("the first chunk was held back")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "data: 1\n");
    seen.notify_one();
    let rest = resp.body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "data: 2\n");
}

/// What a server relaying the body does (hyper's, for the model relay and
/// the intercepting proxy): it stops polling once `is_end_stream` says the
/// last frame came, never asking for the `None` after it. The connection
/// must go back to the pool all the same, or every relayed request pays a
/// new connection (a TLS handshake, on a real provider).
#[tokio::test]
async fn the_connection_is_reused_when_the_reader_stops_at_the_end_of_stream() {
    install_crypto();
    let srv = server(
        handler(|_| {
            respond(
                200,
                &[("content-type", "application/json")],
                "{\"ok\":true}",
            )
        }),
        None,
    )
    .await;
    let c = client(ClientConfig::default());
    let list = AuthorizedUris::parse(&[format!("http://{HOST}:{}/**", srv.port())]);
    for _ in 0..3 {
        let mut resp = c
            .send_streaming(
                OutboundRequest::get(format!("http://{HOST}:{}/x", srv.port())),
                &rules(&list),
            )
            .await
            .unwrap();
        let mut body = Vec::new();
        while !hyper::body::Body::is_end_stream(&resp.body) {
            let Some(frame) = resp.body.frame().await else {
                break;
            };
            if let Ok(d) = frame.unwrap().into_data() {
                body.extend_from_slice(&d);
            }
        }
        assert_eq!(body, b"{\"ok\":true}");
        drop(resp);
    }
    assert_eq!(srv.request_count(), 3);
    assert_eq!(
        srv.connection_count(),
        1,
        "one kept-alive connection for the three"
    );
}

#[tokio::test]
async fn the_connection_is_reused_after_a_full_read() {
    install_crypto();
    let srv = server(
        handler(|_| {
            respond(
                200,
                &[("content-type", "application/json")],
                "{\"ok\":true}",
            )
        }),
        None,
    )
    .await;
    let c = client(ClientConfig::default());
    let list = AuthorizedUris::parse(&[format!("http://{HOST}:{}/**", srv.port())]);
    for _ in 0..3 {
        let resp = c
            .send_streaming(
                OutboundRequest::get(format!("http://{HOST}:{}/x", srv.port())),
                &rules(&list),
            )
            .await
            .unwrap();
        let body = resp.body.collect().await.unwrap().to_bytes();
        assert_eq!(body, "{\"ok\":true}");
    }
    assert_eq!(srv.request_count(), 3);
    assert_eq!(
        srv.connection_count(),
        1,
        "a fully read streaming body returns its connection to the pool"
    );
    // A body dropped before its end closes its connection instead.
    let resp = c
        .send_streaming(
            OutboundRequest::get(format!("http://{HOST}:{}/x", srv.port())),
            &rules(&list),
        )
        .await
        .unwrap();
    drop(resp);
    let resp = c
        .send_streaming(
            OutboundRequest::get(format!("http://{HOST}:{}/x", srv.port())),
            &rules(&list),
        )
        .await
        .unwrap();
    assert_eq!(
        resp.body.collect().await.unwrap().to_bytes(),
        "{\"ok\":true}"
    );
}

#[tokio::test]
async fn redirects_are_returned_not_followed() {
    install_crypto();
    let other = server(handler(|_| respond(200, &[], "other")), None).await;
    let loc = format!("http://{HOST}:{}/elsewhere", other.port());
    let srv = server(
        handler(move |_| respond(307, &[("location", loc.as_str())], "")),
        None,
    )
    .await;
    let c = client(ClientConfig::default());
    let list = AuthorizedUris::parse(&[
        format!("http://{HOST}:{}/**", srv.port()),
        format!("http://{HOST}:{}/**", other.port()),
    ]);
    let resp = c
        .send_streaming(
            OutboundRequest::get(format!("http://{HOST}:{}/v1", srv.port())),
            &rules(&list),
        )
        .await
        .unwrap();
    assert_eq!(resp.status, 307);
    assert!(resp.headers.contains_key("location"));
    assert_eq!(other.request_count(), 0, "the redirect was followed");
}

#[tokio::test]
async fn the_response_cap_is_enforced_while_streaming() {
    install_crypto();
    let endless = raw(endless_body).await;
    let cfg = ClientConfig {
        max_response_bytes: 64 * 1024,
        ..ClientConfig::default()
    };
    let c = client(cfg);
    let list = AuthorizedUris::parse(&[format!("http://{HOST}:{}/**", endless.port())]);
    let resp = c
        .send_streaming(
            OutboundRequest::get(format!("http://{HOST}:{}/", endless.port())),
            &rules(&list),
        )
        .await
        .unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), resp.body.collect())
        .await
        .expect("cap not enforced")
        .unwrap_err();
    assert_eq!(e.code, EgressCode::UpstreamFailed);
    assert!(e.detail.contains("limit"), "{e}");

    // A declared length above the cap fails before any body is read.
    let big = server(
        handler(|_| respond(200, &[], &"y".repeat(100 * 1024))),
        None,
    )
    .await;
    let list = AuthorizedUris::parse(&[format!("http://{HOST}:{}/**", big.port())]);
    let e = c
        .send_streaming(
            OutboundRequest::get(format!("http://{HOST}:{}/", big.port())),
            &rules(&list),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, EgressCode::UpstreamFailed);
}

#[tokio::test]
async fn a_silent_stream_hits_the_idle_timeout() {
    install_crypto();
    let addr = raw(|mut s| async move {
        read_head(&mut s).await;
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
            .await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let cfg = ClientConfig {
        total_timeout: Duration::from_millis(300),
        ..ClientConfig::default()
    };
    let c = client(cfg);
    let list = AuthorizedUris::parse(&[format!("http://{HOST}:{}/**", addr.port())]);
    let mut resp = c
        .send_streaming(
            OutboundRequest::get(format!("http://{HOST}:{}/", addr.port())),
            &rules(&list),
        )
        .await
        .unwrap();
    let first = resp.body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "hello");
    let e = tokio::time::timeout(Duration::from_secs(10), resp.body.frame())
        .await
        .expect("no idle timeout")
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, EgressCode::UpstreamFailed);
}

#[tokio::test]
async fn guard_refusals_happen_before_any_connection() {
    install_crypto();
    let victim = silent().await;
    let port = victim.addr.port();
    // Loopback under a name the operator did not opt in: blocked_address.
    let mut r = StaticResolver::new();
    r.insert("sneaky.internal.test", ["127.0.0.1".parse().unwrap()]);
    let net = Arc::new(TestNet::default());
    let c = GuardedClient::with_dialer(
        Guard::new(EgressPolicy::new(), Arc::new(r)),
        ClientConfig::default(),
        net.clone(),
    )
    .unwrap();
    let list = AuthorizedUris::parse(&[
        format!("http://sneaky.internal.test:{port}/**"),
        format!("http://127.0.0.1:{port}/**"),
        "http://169.254.169.254/**".to_owned(),
        format!("http://localhost:{port}/**"),
    ]);
    for (url, code) in [
        (
            format!("http://sneaky.internal.test:{port}/v1"),
            EgressCode::BlockedAddress,
        ),
        (
            format!("http://127.0.0.1:{port}/v1"),
            EgressCode::BlockedAddress,
        ),
        (
            "http://169.254.169.254/latest/meta-data".to_owned(),
            EgressCode::BlockedAddress,
        ),
        (
            format!("http://localhost:{port}/v1"),
            EgressCode::BlockedHost,
        ),
        (
            format!("http://unlisted.internal.test:{port}/v1"),
            EgressCode::NotAuthorized,
        ),
    ] {
        let e = c
            .send_streaming(OutboundRequest::get(&url), &rules(&list))
            .await
            .unwrap_err();
        assert_eq!(e.code, code, "{url}: {e}");
    }
    assert!(
        net.dialled().is_empty(),
        "refused targets were dialled: {:?}",
        net.dialled()
    );
    assert_eq!(
        victim.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

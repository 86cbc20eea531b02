//! End-to-end tests of the guarded client against servers this test runs on
//! 127.0.0.1, with DNS answers from a resolver it runs on loopback. Each
//! attack asserts the attempt failed *and* that the server it aimed at saw
//! nothing; each family also proves the legitimate path works.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use airlock_egress::{
    AuthorizedUris, CallRules, ClientConfig, DnsServerResolver, EgressCode, EgressPolicy, Guard,
    GuardedClient, OutboundRequest, StaticResolver,
};
use http::{HeaderName, HeaderValue, Method};

const PUBLIC_IP: &str = "93.184.216.34";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A client whose guard resolves `hosts` to 127.0.0.1 and trusts them as
/// internal hosts (the operator opt-in), dialling through `net`.
fn internal_client(hosts: &[&str], net: Arc<TestNet>, cfg: ClientConfig) -> GuardedClient {
    let mut r = StaticResolver::new();
    let mut p = EgressPolicy::new();
    for h in hosts {
        r.insert(h, [ip("127.0.0.1")]);
    }
    p.allow_internal_hosts(hosts.iter().copied());
    GuardedClient::with_dialer(Guard::new(p, Arc::new(r)), cfg, net).unwrap()
}

fn rules(list: &AuthorizedUris, credentialed: bool) -> CallRules<'_> {
    CallRules {
        authorized: list,
        allow_all_uris: false,
        credentialed,
    }
}

fn credentialed_post(url: String) -> OutboundRequest {
    let mut req = OutboundRequest::get(url);
    req.method = Method::POST;
    req.body = bytes::Bytes::from_static(b"{\"secret\":\"body\"}");
    req.headers.insert(
        "authorization",
        HeaderValue::from_static("Bearer sk-canary-1234"),
    );
    req.headers
        .insert("cookie", HeaderValue::from_static("session=canary"));
    req.headers
        .insert("x-api-key", HeaderValue::from_static("canary-key"));
    req.headers
        .insert("content-type", HeaderValue::from_static("application/json"));
    req.credential_headers = vec![HeaderName::from_static("x-api-key")];
    req
}

#[tokio::test]
async fn dns_rebinding_never_reaches_loopback() {
    install_crypto();
    // The victim listens on loopback; the "public" server is a loopback
    // server that the test network routes PUBLIC_IP to.
    let victim = silent().await;
    let public = server(handler(|_| respond(200, &[], "public")), None).await;
    let port = victim.addr.port();
    let dns = dns(Arc::new(|name: &str, v6: bool, nth: usize| {
        match (name, v6, nth) {
            ("rebind.test", false, 0) => vec![ip(PUBLIC_IP)],
            ("rebind.test", false, _) => vec![ip("127.0.0.1")],
            _ => vec![],
        }
    }))
    .await;
    let net = Arc::new(TestNet::default());
    net.route(SocketAddr::new(ip(PUBLIC_IP), port), public.addr);
    let resolver = DnsServerResolver::new(dns.addr).unwrap();
    let client = GuardedClient::with_dialer(
        Guard::new(EgressPolicy::new(), Arc::new(resolver)),
        ClientConfig::default(),
        net.clone(),
    )
    .unwrap();
    let list = AuthorizedUris::parse(&[format!("http://rebind.test:{port}/**")]);
    let url = format!("http://rebind.test:{port}/x");
    let first = client
        .send(OutboundRequest::get(&url), &rules(&list, false))
        .await
        .unwrap();
    assert_eq!(&first.body[..], b"public");
    assert_eq!(first.remote_addr, SocketAddr::new(ip(PUBLIC_IP), port));
    // The same name now answers loopback: refused, even with a kept-alive
    // connection to the validated address in the pool.
    let second = client
        .send(OutboundRequest::get(&url), &rules(&list, false))
        .await
        .unwrap_err();
    assert_eq!(second.code, EgressCode::BlockedAddress, "{second}");
    assert_eq!(
        victim.connections.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the loopback victim was reached"
    );
    assert!(
        net.dialled().iter().all(|a| a.ip() == ip(PUBLIC_IP)),
        "dialled {:?}",
        net.dialled()
    );
    assert!(
        dns.queries
            .lock()
            .unwrap()
            .iter()
            .any(|q| q == "rebind.test A")
    );
}

#[tokio::test]
async fn mixed_answers_are_refused_before_any_connection() {
    install_crypto();
    let victim = silent().await;
    let port = victim.addr.port();
    let dns = dns(Arc::new(|name: &str, v6: bool, _| match (name, v6) {
        ("mixed.test", false) => vec![ip(PUBLIC_IP), ip("127.0.0.1")],
        ("v6mixed.test", false) => vec![ip(PUBLIC_IP)],
        ("v6mixed.test", true) => vec![ip("::ffff:127.0.0.1")],
        ("ok.test", false) => vec![ip(PUBLIC_IP)],
        _ => vec![],
    }))
    .await;
    let net = Arc::new(TestNet::default());
    let public = server(handler(|_| respond(204, &[], "")), None).await;
    net.route(SocketAddr::new(ip(PUBLIC_IP), port), public.addr);
    let client = GuardedClient::with_dialer(
        Guard::new(
            EgressPolicy::new(),
            Arc::new(DnsServerResolver::new(dns.addr).unwrap()),
        ),
        ClientConfig::default(),
        net.clone(),
    )
    .unwrap();
    let list = AuthorizedUris::parse(&[format!("http://*.test:{port}/**")]);
    for host in ["mixed.test", "v6mixed.test"] {
        let e = client
            .send(
                OutboundRequest::get(format!("http://{host}:{port}/")),
                &rules(&list, false),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code, EgressCode::BlockedAddress, "{host}: {e}");
    }
    let e = client
        .send(
            OutboundRequest::get(format!("http://nxdomain.test:{port}/")),
            &rules(&list, false),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, EgressCode::Unresolvable);
    assert_eq!(e.http_status(), 502);
    assert!(
        net.dialled().is_empty(),
        "refused targets were dialled: {:?}",
        net.dialled()
    );
    assert_eq!(
        victim.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    // Legitimate path through the same resolver.
    let ok = client
        .send(
            OutboundRequest::get(format!("http://ok.test:{port}/")),
            &rules(&list, false),
        )
        .await
        .unwrap();
    assert_eq!(ok.status, 204);
}

#[tokio::test]
async fn same_origin_redirect_keeps_headers_and_body() {
    install_crypto();
    let a = server(
        handler(|r| match r.path.as_str() {
            "/start" => respond(307, &[("location", "/final")], ""),
            _ => respond(200, &[], "done"),
        }),
        None,
    )
    .await;
    let client = internal_client(
        &["api.internal.test"],
        Arc::new(TestNet::default()),
        ClientConfig::default(),
    );
    let list = AuthorizedUris::parse(&[format!("http://api.internal.test:{}/**", a.port())]);
    let resp = client
        .send(
            credentialed_post(format!("http://api.internal.test:{}/start", a.port())),
            &rules(&list, true),
        )
        .await
        .unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.redirects, 1);
    assert!(!resp.credential_stripped);
    let last = a.last();
    assert_eq!(last.path, "/final");
    assert_eq!(last.method, "POST");
    assert_eq!(last.headers["authorization"], "Bearer sk-canary-1234");
    assert_eq!(last.headers["x-api-key"], "canary-key");
    assert_eq!(last.headers["cookie"], "session=canary");
    assert_eq!(
        last.headers["host"],
        format!("api.internal.test:{}", a.port()).as_str()
    );
    assert_eq!(&last.body[..], b"{\"secret\":\"body\"}");
}

#[tokio::test]
async fn cross_origin_redirect_strips_credential_cookie_and_body() {
    install_crypto();
    let b = server(handler(|_| respond(200, &[], "other")), None).await;
    let b_port = b.port();
    let a = server(
        handler(move |_| {
            respond(
                307,
                &[(
                    "location",
                    &format!("http://other.internal.test:{b_port}/landing"),
                )],
                "",
            )
        }),
        None,
    )
    .await;
    let client = internal_client(
        &["api.internal.test", "other.internal.test"],
        Arc::new(TestNet::default()),
        ClientConfig::default(),
    );
    let list = AuthorizedUris::parse(&[
        format!("http://api.internal.test:{}/**", a.port()),
        format!("http://other.internal.test:{b_port}/**"),
    ]);
    let resp = client
        .send(
            credentialed_post(format!("http://api.internal.test:{}/", a.port())),
            &rules(&list, true),
        )
        .await
        .unwrap();
    assert_eq!(&resp.body[..], b"other");
    assert!(resp.credential_stripped);
    assert_eq!(
        a.last().headers["authorization"],
        "Bearer sk-canary-1234",
        "the first hop carried it"
    );
    let landed = b.last();
    for h in ["authorization", "cookie", "x-api-key", "content-type"] {
        assert!(
            !landed.headers.contains_key(h),
            "{h} crossed origins: {:?}",
            landed.headers
        );
    }
    assert!(landed.body.is_empty(), "body crossed origins");
    assert_eq!(landed.method, "POST", "307 keeps the method");
    // A port change is another origin too.
    assert_eq!(b.request_count(), 1);
}

#[tokio::test]
async fn see_other_and_post_301_become_get() {
    install_crypto();
    let a = server(
        handler(|r| match r.path.as_str() {
            "/303" => respond(303, &[("location", "/got")], ""),
            "/301" => respond(301, &[("location", "/got")], ""),
            _ => respond(200, &[], ""),
        }),
        None,
    )
    .await;
    let client = internal_client(
        &["api.internal.test"],
        Arc::new(TestNet::default()),
        ClientConfig::default(),
    );
    let list = AuthorizedUris::parse(&[format!("http://api.internal.test:{}/**", a.port())]);
    for p in ["/303", "/301"] {
        client
            .send(
                credentialed_post(format!("http://api.internal.test:{}{p}", a.port())),
                &rules(&list, true),
            )
            .await
            .unwrap();
        let last = a.last();
        assert_eq!(last.method, "GET", "{p}");
        assert!(last.body.is_empty(), "{p}");
        assert!(!last.headers.contains_key("content-type"), "{p}");
        assert_eq!(
            last.headers["authorization"], "Bearer sk-canary-1234",
            "same origin keeps the credential"
        );
    }
}

#[tokio::test]
async fn redirects_to_blocked_or_unlisted_hosts_are_refused_before_sending() {
    install_crypto();
    let victim = server(handler(|_| respond(200, &[], "victim")), None).await;
    let unlisted = server(handler(|_| respond(200, &[], "unlisted")), None).await;
    let vp = victim.port();
    let up = unlisted.port();
    let a = server(
        handler(move |r| {
            let loc = match r.path.as_str() {
                "/to-localhost" => format!("http://localhost:{vp}/"),
                "/to-loopback-ip" => format!("http://127.0.0.1:{vp}/"),
                "/to-metadata" => "http://169.254.169.254/latest/meta-data/".to_owned(),
                "/to-hex-loopback" => format!("http://0x7f.1:{vp}/"),
                "/to-unlisted" => format!("http://unlisted.internal.test:{up}/"),
                "/to-ftp" => "ftp://api.internal.test/".to_owned(),
                _ => return respond(200, &[], ""),
            };
            respond(302, &[("location", &loc)], "")
        }),
        None,
    )
    .await;
    let net = Arc::new(TestNet::default());
    // unlisted.internal.test resolves to loopback and is even operator-trusted,
    // but the integration does not name it.
    let client = internal_client(
        &["api.internal.test", "unlisted.internal.test"],
        net.clone(),
        ClientConfig::default(),
    );
    let list = AuthorizedUris::parse(&[format!("http://api.internal.test:{}/**", a.port())]);
    // Policy is judged before names: an unlisted host is redirect_blocked.
    let cases = [
        ("/to-localhost", EgressCode::RedirectBlocked),
        ("/to-loopback-ip", EgressCode::RedirectBlocked),
        ("/to-metadata", EgressCode::RedirectBlocked),
        ("/to-hex-loopback", EgressCode::RedirectBlocked),
        ("/to-unlisted", EgressCode::RedirectBlocked),
        ("/to-ftp", EgressCode::RedirectBlocked),
    ];
    for (path, want) in cases {
        let e = client
            .send(
                credentialed_post(format!("http://api.internal.test:{}{path}", a.port())),
                &rules(&list, true),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code, want, "{path}: {e}");
    }
    // Uncredentialed and allow-all: the SSRF guards still refuse every hop.
    let open = CallRules {
        authorized: &list,
        allow_all_uris: true,
        credentialed: false,
    };
    for (path, want) in [
        ("/to-localhost", EgressCode::BlockedHost),
        ("/to-loopback-ip", EgressCode::BlockedAddress),
        ("/to-metadata", EgressCode::BlockedAddress),
        ("/to-hex-loopback", EgressCode::BlockedAddress),
    ] {
        let e = client
            .send(
                OutboundRequest::get(format!("http://api.internal.test:{}{path}", a.port())),
                &open,
            )
            .await
            .unwrap_err();
        assert_eq!(e.code, want, "allow-all {path}: {e}");
    }
    assert_eq!(
        victim.connection_count(),
        0,
        "a blocked redirect target was contacted"
    );
    assert_eq!(
        unlisted.connection_count(),
        0,
        "an unlisted redirect target was contacted"
    );
    assert!(
        net.dialled().iter().all(|d| d.port() == a.port()),
        "dialled {:?}",
        net.dialled()
    );
}

#[tokio::test]
async fn https_to_http_downgrade_is_refused() {
    install_crypto();
    let plain = server(handler(|_| respond(200, &[], "plain")), None).await;
    let pp = plain.port();
    let pki = pki(&["api.internal.test"]);
    let secure = server(
        handler(move |_| {
            respond(
                301,
                &[("location", &format!("http://api.internal.test:{pp}/"))],
                "",
            )
        }),
        Some(pki.server_config.clone()),
    )
    .await;
    let cfg = ClientConfig {
        extra_root_certs: vec![pki.ca_der.clone()],
        use_webpki_roots: false,
        ..Default::default()
    };
    let client = internal_client(&["api.internal.test"], Arc::new(TestNet::default()), cfg);
    let list = AuthorizedUris::parse(&[
        format!("https://api.internal.test:{}/**", secure.port()),
        format!("http://api.internal.test:{pp}/**"),
    ]);
    let e = client
        .send(
            OutboundRequest::get(format!("https://api.internal.test:{}/", secure.port())),
            &rules(&list, true),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, EgressCode::RedirectBlocked, "{e}");
    assert_eq!(secure.request_count(), 1, "the HTTPS hop itself worked");
    assert_eq!(plain.connection_count(), 0);
}

#[tokio::test]
async fn the_eleventh_redirect_is_refused() {
    install_crypto();
    let a = server(
        handler(|r| {
            let n: u32 = r.path.trim_start_matches("/r/").parse().unwrap_or(0);
            if n < 100 && r.path.starts_with("/r/") {
                respond(302, &[("location", &format!("/r/{}", n + 1))], "")
            } else {
                respond(200, &[], "end")
            }
        }),
        None,
    )
    .await;
    let client = internal_client(
        &["api.internal.test"],
        Arc::new(TestNet::default()),
        ClientConfig::default(),
    );
    let list = AuthorizedUris::parse(&[format!("http://api.internal.test:{}/**", a.port())]);
    // /r/90 .. /r/100 is ten redirects, then /r/100 answers 200: allowed.
    let ok = client
        .send(
            OutboundRequest::get(format!("http://api.internal.test:{}/r/90", a.port())),
            &rules(&list, true),
        )
        .await
        .unwrap();
    assert_eq!(ok.redirects, 10);
    assert_eq!(&ok.body[..], b"end");
    let before = a.request_count();
    let e = client
        .send(
            OutboundRequest::get(format!("http://api.internal.test:{}/r/0", a.port())),
            &rules(&list, true),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, EgressCode::TooManyRedirects);
    assert_eq!(e.http_status(), 502);
    assert_eq!(
        a.request_count() - before,
        11,
        "the original request and ten followed hops, then refusal"
    );
}

#[tokio::test]
async fn https_with_pinned_address_keeps_sni_and_host() {
    install_crypto();
    let pki = pki(&["secure.internal.test"]);
    let s = server(
        handler(|r| respond(200, &[], r.headers["host"].to_str().unwrap())),
        Some(pki.server_config.clone()),
    )
    .await;
    let cfg = ClientConfig {
        extra_root_certs: vec![pki.ca_der.clone()],
        use_webpki_roots: false,
        ..Default::default()
    };
    let net = Arc::new(TestNet::default());
    let client = internal_client(&["secure.internal.test"], net.clone(), cfg);
    let list = AuthorizedUris::parse(&[format!("https://secure.internal.test:{}/**", s.port())]);
    for _ in 0..3 {
        let r = client
            .send(
                OutboundRequest::get(format!("https://secure.internal.test:{}/", s.port())),
                &rules(&list, true),
            )
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&r.body),
            format!("secure.internal.test:{}", s.port())
        );
        assert_eq!(r.remote_addr.ip(), ip("127.0.0.1"));
    }
    assert_eq!(s.connection_count(), 1, "keep-alive connection reused");
    assert_eq!(net.dialled().len(), 1);
}

/// An upstream that answers as if it kept the connection (no `Connection:
/// close`) and then closes it: the pooled connection is dead when the next
/// request comes. That request must go out once, on a new connection, and
/// succeed — never fail, never be sent twice.
#[tokio::test]
async fn a_pooled_connection_the_upstream_closed_is_replaced_not_reused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    install_crypto();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let close_now = Arc::new(tokio::sync::Notify::new());
    let (seen, close) = (requests.clone(), close_now.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (seen, closed_tx, close) = (seen.clone(), closed_tx.clone(), close.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                if s.read(&mut buf).await.unwrap_or(0) > 0 {
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                }
                // Closed only once the client holds the connection idle.
                close.notified().await;
                drop(s);
                let _ = closed_tx.send(());
            });
        }
    });
    let client = internal_client(
        &["api.internal.test"],
        Arc::new(TestNet::default()),
        ClientConfig::default(),
    );
    let list = AuthorizedUris::parse(&["http://api.internal.test:*/**"]);
    let url = format!("http://api.internal.test:{port}/");
    for round in 1..=3 {
        let r = client
            .send(OutboundRequest::get(&url), &rules(&list, false))
            .await
            .unwrap_or_else(|e| panic!("request {round}: {e}"));
        assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"ok"[..]));
        // The answer was read whole and the connection pooled; now the
        // upstream closes it, and the runtime sees the end (its driver runs)
        // before the next request takes it from the pool.
        close_now.notify_one();
        closed.recv().await.unwrap();
        tokio::task::yield_now().await;
    }
    assert_eq!(
        requests.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "each request reached the upstream exactly once"
    );
}

#[tokio::test]
async fn hostile_upstreams_fail_cleanly() {
    install_crypto();
    let endless = raw(endless_body).await;
    let drip = raw(slow_drip).await;
    let garbage = raw(garbage_tls).await;
    let stall = silent().await;
    let wrong_ca = pki(&["api.internal.test"]);
    let untrusted = server(
        handler(|_| respond(200, &[], "")),
        Some(wrong_ca.server_config.clone()),
    )
    .await;
    let closed_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = ClientConfig {
        total_timeout: Duration::from_millis(1500),
        connect_timeout: Duration::from_millis(500),
        max_response_bytes: 256 * 1024,
        ..Default::default()
    };
    let client = internal_client(&["api.internal.test"], Arc::new(TestNet::default()), cfg);
    let list = AuthorizedUris::parse(&[
        "http://api.internal.test:*/**",
        "https://api.internal.test:*/**",
    ]);
    let cases = [
        (
            format!("http://api.internal.test:{}/", endless.port()),
            "larger than",
        ),
        (
            format!("http://api.internal.test:{}/", drip.port()),
            "no complete response",
        ),
        (
            format!("http://api.internal.test:{}/", stall.addr.port()),
            "no complete response",
        ),
        (
            format!("https://api.internal.test:{}/", garbage.port()),
            "TLS handshake",
        ),
        (
            format!("https://api.internal.test:{}/", untrusted.port()),
            "TLS handshake",
        ),
        (
            format!("http://api.internal.test:{closed_port}/"),
            "could not connect",
        ),
    ];
    for (url, why) in cases {
        let started = std::time::Instant::now();
        let e = client
            .send(OutboundRequest::get(&url), &rules(&list, false))
            .await
            .unwrap_err();
        assert_eq!(e.code, EgressCode::UpstreamFailed, "{url}: {e}");
        assert!(e.detail.contains(why), "{url}: {e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{url} took {:?}",
            started.elapsed()
        );
    }
    assert_eq!(untrusted.request_count(), 0);
}

#[tokio::test]
async fn invalid_input_is_typed_never_a_panic() {
    install_crypto();
    let client = internal_client(&[], Arc::new(TestNet::default()), ClientConfig::default());
    let list = AuthorizedUris::parse(&["https://api.example.com/**"]);
    for url in [
        "",
        "::",
        "http://",
        "https://[::1",
        "https://a.com:99999/",
        "javascript:alert(1)",
        "https://exa\u{0}mple.com/",
        "http://a.com/\r\nX: y",
    ] {
        let e = client
            .send(OutboundRequest::get(url), &rules(&list, true))
            .await
            .unwrap_err();
        assert_eq!(e.code, EgressCode::InvalidUrl, "{url:?}: {e}");
        assert_eq!(e.http_status(), 400);
    }
}

/// Issue 10, item 17: host names with `_` in a label are asked of the
/// nameserver (not refused by the resolver library first) and their answers
/// judged like any other: a public answer is dialled, a loopback one refused.
#[tokio::test]
async fn nameserver_names_with_underscores_resolve_and_are_judged() {
    install_crypto();
    let public = server(handler(|_| respond(200, &[], "public")), None).await;
    let victim = silent().await;
    let port = public.port();
    let dns = dns(Arc::new(|name: &str, v6: bool, _| match (name, v6) {
        ("llm_svc" | "foo_bar.example.com", false) => vec![ip(PUBLIC_IP)],
        ("evil_rebind.example.com", false) => vec![ip("127.0.0.1")],
        _ => vec![],
    }))
    .await;
    let net = Arc::new(TestNet::default());
    net.route(SocketAddr::new(ip(PUBLIC_IP), port), public.addr);
    let client = GuardedClient::with_dialer(
        Guard::new(
            EgressPolicy::new(),
            Arc::new(DnsServerResolver::new(dns.addr).unwrap()),
        ),
        ClientConfig::default(),
        net.clone(),
    )
    .unwrap();
    for host in ["llm_svc", "foo_bar.example.com"] {
        let list = AuthorizedUris::parse(&[format!("http://{host}:{port}/**")]);
        let resp = client
            .send(
                OutboundRequest::get(format!("http://{host}:{port}/v1")),
                &rules(&list, true),
            )
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        assert_eq!(&resp.body[..], b"public", "{host}");
        assert_eq!(resp.remote_addr, SocketAddr::new(ip(PUBLIC_IP), port));
        assert!(
            dns.queries.lock().unwrap().contains(&format!("{host} A")),
            "{host} was not asked of the nameserver"
        );
    }
    let vport = victim.addr.port();
    let list = AuthorizedUris::parse(&[format!("http://evil_rebind.example.com:{vport}/**")]);
    let e = client
        .send(
            OutboundRequest::get(format!("http://evil_rebind.example.com:{vport}/")),
            &rules(&list, false),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, EgressCode::BlockedAddress, "{e}");
    assert_eq!(
        victim.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert!(net.dialled().iter().all(|a| a.ip() == ip(PUBLIC_IP)));
}

/// A stand-in for the system resolver (getaddrinfo): fixed answers, and a
/// record of every name it was asked.
struct FakeSystemResolver {
    answers: Vec<(&'static str, IpAddr)>,
    asked: std::sync::Mutex<Vec<String>>,
}

impl airlock_egress::Resolve for FakeSystemResolver {
    fn lookup<'a>(&'a self, host: &'a str) -> airlock_egress::LookupFuture<'a> {
        self.asked.lock().unwrap().push(host.to_owned());
        let ips: Vec<IpAddr> = self
            .answers
            .iter()
            .filter(|(h, _)| *h == host)
            .map(|(_, ip)| *ip)
            .collect();
        Box::pin(async move {
            if ips.is_empty() {
                Err(airlock_egress::ResolveError(format!("{host}: not found")))
            } else {
                Ok(ips)
            }
        })
    }
}

/// Issue 10, item 18: with a nameserver configured, an operator-trusted
/// internal host is still resolved by the system resolver, its (loopback)
/// address is not judged, and the connection is pinned to that answer, not
/// to what the nameserver says. A host without both the opt-in and a
/// literal entry never reaches the system resolver.
#[tokio::test]
async fn trusted_internal_hosts_are_resolved_by_the_system_resolver() {
    install_crypto();
    let internal = server(handler(|_| respond(200, &[], "internal")), None).await;
    let decoy = server(handler(|_| respond(200, &[], "decoy")), None).await;
    let port = internal.port();
    // The nameserver's view: db.corp is a public address (routed to the
    // decoy), the other names do not exist.
    let dns = dns(Arc::new(|name: &str, v6: bool, _| match (name, v6) {
        ("db.corp", false) => vec![ip(PUBLIC_IP)],
        _ => vec![],
    }))
    .await;
    let system = Arc::new(FakeSystemResolver {
        answers: vec![
            ("db.corp", ip("127.0.0.1")),
            ("other.corp", ip("127.0.0.1")),
        ],
        asked: Default::default(),
    });
    let net = Arc::new(TestNet::default());
    net.route(SocketAddr::new(ip(PUBLIC_IP), port), decoy.addr);
    let resolver = DnsServerResolver::new(dns.addr)
        .unwrap()
        .with_system_resolver(system.clone());
    let mut policy = EgressPolicy::new();
    policy.allow_internal_hosts(["db.corp", "other.corp"]);
    let client = GuardedClient::with_dialer(
        Guard::new(policy, Arc::new(resolver)),
        ClientConfig::default(),
        net.clone(),
    )
    .unwrap();

    let literal = AuthorizedUris::parse(&[format!("http://db.corp:{port}/**")]);
    let resp = client
        .send(
            OutboundRequest::get(format!("http://db.corp:{port}/x")),
            &rules(&literal, true),
        )
        .await
        .unwrap();
    assert_eq!(&resp.body[..], b"internal");
    assert_eq!(resp.remote_addr, SocketAddr::new(ip("127.0.0.1"), port));
    assert_eq!(*system.asked.lock().unwrap(), vec!["db.corp".to_owned()]);
    assert!(
        dns.queries.lock().unwrap().is_empty(),
        "the nameserver was asked: {:?}",
        dns.queries.lock().unwrap()
    );

    // The opt-in without a literal entry: the guard's own resolver answers
    // (the decoy's public address), the system resolver is not asked.
    let wildcard = AuthorizedUris::parse(&[format!("http://*.corp:{port}/**")]);
    let resp = client
        .send(
            OutboundRequest::get(format!("http://db.corp:{port}/x")),
            &rules(&wildcard, false),
        )
        .await
        .unwrap();
    assert_eq!(&resp.body[..], b"decoy");
    // other.corp, known only to the system resolver: through the wildcard
    // it is the nameserver's to answer, and it does not know it.
    let e = client
        .send(
            OutboundRequest::get(format!("http://other.corp:{port}/x")),
            &rules(&wildcard, false),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, EgressCode::Unresolvable, "{e}");
    assert_eq!(*system.asked.lock().unwrap(), vec!["db.corp".to_owned()]);
    assert_eq!(internal.request_count(), 1);
}

//! The guarded client through the operator's upstream proxy (`PROXY_URL`,
//! [`Via`]): a loopback CONNECT proxy that records every CONNECT it is
//! asked for. The guard judges and pins the target first; the proxy is
//! asked for that pinned `IP:port` only, never a name; a target the guard
//! refuses never reaches it; a proxy that refuses the CONNECT is a typed
//! `upstream_failed`; the proxy's credentials go as `Proxy-Authorization`
//! and appear in no error.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use airlock_egress::upstream::Via;
use airlock_egress::{
    AuthorizedUris, CallRules, ClientConfig, EgressCode, EgressPolicy, Guard, GuardedClient,
    OutboundRequest, StaticResolver,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::*;

/// What one CONNECT asked the proxy.
#[derive(Debug, Clone)]
struct Asked {
    line: String,
    authorization: Option<String>,
}

/// A CONNECT proxy on 127.0.0.1 that records each request head and, unless
/// `refuse`, tunnels to the address asked for (always on loopback here).
async fn connect_proxy(refuse: bool) -> (SocketAddr, Arc<Mutex<Vec<Asked>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let log: Arc<Mutex<Vec<Asked>>> = Arc::default();
    let seen = log.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let line = head.lines().next().unwrap_or("").to_owned();
                let authorization = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Proxy-Authorization: "))
                    .map(str::to_owned);
                seen.lock().unwrap().push(Asked {
                    line: line.clone(),
                    authorization,
                });
                if refuse {
                    let _ = s.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n").await;
                    return;
                }
                let to: SocketAddr = line.split(' ').nth(1).unwrap().parse().unwrap();
                assert!(
                    to.ip().is_loopback(),
                    "the test proxy tunnels to loopback only"
                );
                let Ok(mut up) = TcpStream::connect(to).await else {
                    return;
                };
                let _ = s
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await;
                let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
            });
        }
    });
    (addr, log)
}

fn client(proxy_url: &str) -> GuardedClient {
    install_crypto();
    let mut r = StaticResolver::new();
    r.insert("api.internal.test", ["127.0.0.1".parse().unwrap()]);
    r.insert("meta.internal.test", ["169.254.169.254".parse().unwrap()]);
    let mut p = EgressPolicy::new();
    p.allow_internal_hosts(["api.internal.test"]);
    GuardedClient::with_dialer(
        Guard::new(p, Arc::new(r)),
        ClientConfig::default(),
        Arc::new(Via::from_url(Some(proxy_url))),
    )
    .unwrap()
}

fn all() -> AuthorizedUris {
    // The host named literally: what lets the internal-host exemption apply.
    AuthorizedUris::parse(&[
        "http://api.internal.test:*/**".to_owned(),
        "http://meta.internal.test/**".to_owned(),
        "http://169.254.169.254/**".to_owned(),
    ])
}

fn rules(list: &AuthorizedUris) -> CallRules<'_> {
    CallRules {
        authorized: list,
        allow_all_uris: false,
        credentialed: false,
    }
}

/// Sends a GET of `path` on the origin at `port` through `c`.
async fn get(
    c: &GuardedClient,
    port: u16,
    path: &str,
) -> Result<airlock_egress::GuardedResponse, airlock_egress::EgressError> {
    let list = all();
    let url = format!("http://api.internal.test:{port}{path}");
    c.send(OutboundRequest::get(url), &rules(&list)).await
}

#[tokio::test]
async fn requests_go_through_the_proxy_to_the_pinned_address_with_its_credentials() {
    let origin = server(handler(|_| respond(200, &[], "from the origin")), None).await;
    let (proxy, asked) = connect_proxy(false).await;
    let c = client(&format!("http://us%40er:s3cret-pw@{proxy}"));
    let resp = get(&c, origin.port(), "/x").await.unwrap();
    assert_eq!(&resp.body[..], b"from the origin");
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    // The pinned address, never the name: the proxy resolves nothing.
    assert_eq!(
        asked[0].line,
        format!("CONNECT 127.0.0.1:{} HTTP/1.1", origin.port())
    );
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode("us@er:s3cret-pw");
    assert_eq!(asked[0].authorization, Some(format!("Basic {basic}")));
    // Inside the tunnel the request names its host; no proxy header reaches it.
    let got = origin.last();
    assert_eq!(got.path, "/x");
    assert!(got.headers.get("proxy-authorization").is_none());
}

#[tokio::test]
async fn a_target_the_guard_refuses_never_reaches_the_proxy() {
    let (proxy, asked) = connect_proxy(false).await;
    let c = client(&format!("http://{proxy}"));
    let list = all();
    for url in [
        "http://meta.internal.test/",
        "http://169.254.169.254/latest",
    ] {
        let e = c
            .send(OutboundRequest::get(url), &rules(&list))
            .await
            .unwrap_err();
        assert_ne!(e.code, EgressCode::UpstreamFailed, "{url}: {e}");
    }
    assert!(asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_proxy_refusing_connect_is_a_typed_failure_without_its_credentials() {
    let origin = server(handler(|_| respond(200, &[], "never")), None).await;
    let (proxy, asked) = connect_proxy(true).await;
    let c = client(&format!("http://user:hunter2-pw@{proxy}"));
    let e = get(&c, origin.port(), "/").await.unwrap_err();
    assert_eq!(e.code, EgressCode::UpstreamFailed, "{e}");
    let shown = format!("{e} {e:?}");
    assert!(shown.contains("403"), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert_eq!(asked.lock().unwrap().len(), 1);
    assert_eq!(origin.request_count(), 0);
    // A PROXY_URL that cannot be used fails every request: never direct.
    let c = client("ftp://user:hunter2-pw@127.0.0.1:1");
    let e = get(&c, origin.port(), "/").await.unwrap_err();
    assert_eq!(e.code, EgressCode::UpstreamFailed, "{e}");
    assert!(!format!("{e} {e:?}").contains("hunter2"));
    assert_eq!(origin.request_count(), 0);
}

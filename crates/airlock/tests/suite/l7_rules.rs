//! L7 rules from the attacker's side, end to end through the real
//! `airlock sidecar`: on `api_call` (the official MCP Python SDK) and on the
//! forward proxy's plain HTTP (curl, and raw request lines), a method or a
//! path slipped past a rule — case, `..` and `%2e%2e`, encoded slashes,
//! `//`, query smuggling, absolute-form against origin-form, HEAD against
//! GET — is refused as `rule_refused` naming the rule, recorded, and never
//! reaches the upstream; the legitimate request beside each goes through.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};

use crate::support::*;
use airlock_platform::testing::TestPlatform;
use airlock_store::{AuthType, EgressDecision};
use airlock_vault::ExposeSecret;
use bytes::Bytes;
use http_body_util::Full;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HOST: &str = "rules.internal.test";

/// What the upstream received: `METHOD path?query` of each request.
type Seen = Arc<Mutex<Vec<String>>>;

/// A plain-HTTP upstream (hyper) on loopback that answers 200 to anything.
async fn recording_upstream() -> (SocketAddr, Seen) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let log = log.clone();
            let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                let line = format!("{} {}", req.method(), req.uri());
                log.lock().unwrap().push(line);
                async {
                    Ok::<_, Infallible>(hyper::Response::new(
                        http_body_util::Empty::<bytes::Bytes>::new(),
                    ))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc),
            );
        }
    });
    (addr, seen)
}

/// `svc` (a credential) and the network may reach the upstream's host on
/// any path; both are narrowed to reading `/repos/…/issues` and to
/// commenting, by the same rules.
fn rules(port: u16) -> Value {
    let host = format!("http://{HOST}:{port}");
    json!([
        {"id": "issues-read", "host": host, "access": "read-only",
         "paths": ["/repos/*/issues", "/repos/*/issues/**"], "query": ["state", "page"]},
        {"id": "comment", "host": host, "methods": ["POST"],
         "paths": ["/repos/*/issues/*/comments"], "query": "none"},
    ])
}

struct Env {
    p: TestPlatform,
    sc: SidecarProcess,
    up: SocketAddr,
    seen: Seen,
}

impl Env {
    async fn start() -> Env {
        let p = TestPlatform::start("l7-rules-agent").await;
        p.add_connection("svc", AuthType::Bearer, &[("token", "canary-L7rules-4hQ")])
            .await;
        let (up, seen) = recording_upstream().await;
        let cfg = p
            .sidecar_config()
            .tcp()
            .proxy_tcp()
            .integration(
                integration("svc")
                    .authorized([format!("http://{HOST}:*/**")])
                    .rules(rules(up.port()))
                    .bearer("token"),
            )
            .network_allow([format!("http://{HOST}:*/**")])
            .network_rules(rules(up.port()))
            .loopback_host(HOST)
            .build();
        let sc = spawn_sidecar(&cfg);
        Env { p, sc, up, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{HOST}:{}{path}", self.up.port())
    }

    fn token(&self) -> String {
        self.p.sidecar_token.expose_secret().to_owned()
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// The body of an `isError` result.
fn error_body(result: &Value) -> Value {
    assert_eq!(result["isError"], json!(true), "not an error: {result}");
    serde_json::from_str(&text_of(result)).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn api_call_cannot_slip_a_method_or_path_past_a_rule() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let env = Env::start().await;
    let call = |method: &str, path: &str| {
        json!({"op": "call", "name": "svc__api_call",
               "args": {"target": env.url(path), "method": method}})
    };
    let attacks = [
        (
            call("DELETE", "/repos/a/issues/1"),
            "issues-read",
            json!({"kind": "method", "method": "DELETE"}),
        ),
        (
            call("PUT", "/repos/a/issues/1/comments"),
            "issues-read",
            json!({"kind": "method", "method": "PUT"}),
        ),
        (
            call("GET", "/repos/a/secrets"),
            "issues-read",
            json!({"kind": "path", "path": "/repos/a/secrets"}),
        ),
        (
            call("GET", "/REPOS/a/issues"),
            "issues-read",
            json!({"kind": "path", "path": "/REPOS/a/issues"}),
        ),
        (
            call("GET", "/repos/a/issues/../secrets"),
            "issues-read",
            json!({"kind": "path", "path": "/repos/a/secrets"}),
        ),
        (
            call("GET", "/repos/a/issues/%2e%2e/secrets"),
            "issues-read",
            json!({"kind": "path", "path": "/repos/a/secrets"}),
        ),
        (
            call("GET", "/repos/a/issues/..%2fsecrets"),
            "issues-read",
            json!({"kind": "path", "path": "/repos/a/secrets"}),
        ),
        (
            call("GET", "/repos/a%2f..%2f..%2fadmin/issues"),
            "issues-read",
            json!({"kind": "path", "path": "/admin/issues"}),
        ),
        (
            call("GET", "/repos//issues"),
            "issues-read",
            json!({"kind": "path", "path": "/repos/issues"}),
        ),
        (
            call("GET", "/repos/a/issues?state=open&token=x"),
            "issues-read",
            json!({"kind": "query", "parameter": "token"}),
        ),
        (
            call("GET", "/repos/a/issues?state=open;token=x"),
            "issues-read",
            json!({"kind": "query", "parameter": "token"}),
        ),
        (
            call("GET", "/repos/a/issues?%74oken=x"),
            "issues-read",
            json!({"kind": "query", "parameter": "token"}),
        ),
        (
            call("POST", "/repos/a/issues/1/comments?draft=1"),
            "comment",
            json!({"kind": "query", "parameter": "draft"}),
        ),
    ];
    let legit = [
        call("GET", "/repos/a/issues?state=open&page=2"),
        call("HEAD", "/repos/a/issues/1"),
        call("POST", "/repos/a/issues/1/comments"),
    ];
    let ops: Vec<Value> = attacks
        .iter()
        .map(|(op, _, _)| op.clone())
        .chain(legit.iter().cloned())
        .collect();
    let out = mcp_client_output(spawn_mcp_client(&json!({
        "url": format!("http://{}/mcp", env.sc.tcp()), "token": env.token(),
        "mode": "2026-07-28", "uds": null, "ops": ops,
    })));
    let results = out["results"].as_array().unwrap_or_else(|| panic!("{out}"));
    for (i, (op, rule, missing)) in attacks.iter().enumerate() {
        let body = error_body(&results[i]);
        assert_eq!(body["error"], "rule_refused", "{op}: {body}");
        assert_eq!(body["status"], 403, "{op}");
        assert_eq!(body["rule"]["rule"], *rule, "{op}: {body}");
        assert_eq!(body["rule"]["missing"], *missing, "{op}: {body}");
        assert!(body["message"].as_str().unwrap().contains(rule), "{body}");
    }
    for (i, op) in legit.iter().enumerate() {
        let r = &results[attacks.len() + i];
        assert_ne!(r["isError"], json!(true), "{op}: {r}");
    }
    assert_eq!(
        env.seen(),
        [
            "GET /repos/a/issues?state=open&page=2",
            "HEAD /repos/a/issues/1",
            "POST /repos/a/issues/1/comments",
        ]
    );
    // Each refusal is in the egress log, typed, and the journal keeps the rule.
    let log = env.p.egress_log().await;
    let refused: Vec<_> = log
        .iter()
        .filter(|e| e.decision == EgressDecision::Refused)
        .collect();
    assert_eq!(refused.len(), attacks.len(), "{log:?}");
    assert!(
        refused
            .iter()
            .all(|e| e.reason.map(|c| c.as_str()) == Some("rule_refused"))
    );
    // The store keeps the refusing rule's id, and the audit names it and
    // the L7 rule as the decider.
    let mut by_rule: Vec<&str> = refused.iter().filter_map(|e| e.rule.as_deref()).collect();
    by_rule.sort_unstable();
    let mut expected: Vec<&str> = attacks.iter().map(|(_, rule, _)| *rule).collect();
    expected.sort_unstable();
    assert_eq!(by_rule, expected, "{refused:?}");
    let page = env
        .p
        .store()
        .audit_page(&env.p.run_id, Default::default(), 1000)
        .await
        .unwrap();
    let audit: Vec<_> = page
        .entries
        .iter()
        .filter_map(airlock_api::v1::AuditRecord::of)
        .collect();
    let refusals: Vec<_> = audit
        .iter()
        .filter(|r| r.decision == airlock_api::v1::AuditDecision::Refused)
        .collect();
    assert_eq!(refusals.len(), attacks.len(), "{audit:?}");
    assert!(
        refusals
            .iter()
            .all(|r| r.decider == airlock_api::v1::AuditDecider::L7Rule
                && r.rule.is_some()
                && r.code.as_deref() == Some("rule_refused"))
    );
    let journal = String::from_utf8_lossy(&std::fs::read(&env.p.journal).unwrap()).into_owned();
    assert!(
        journal.contains(
            r#""rule":{"rule":"issues-read","missing":{"kind":"method","method":"DELETE"}}"#
        ),
        "{journal}"
    );
    assert!(
        !journal.contains("canary-L7rules"),
        "a credential in the journal"
    );
}

/// curl through the proxy: the HTTP status it got.
fn curl(proxy: &str, token: &str, args: &[&str]) -> u16 {
    let user = format!("run:{token}");
    let fixed = ["-sS", "--path-as-is", "--max-time", "20", "--noproxy", ""];
    let out = Command::new("curl")
        .args(fixed)
        .args([
            "-x",
            proxy,
            "--proxy-user",
            &user,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args(args)
        .output()
        .expect("curl must be installed (.ci/run installs it)");
    eprintln!("curl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// One raw request on a fresh proxy connection: the status line's code and
/// the body.
async fn raw(proxy: SocketAddr, request: String) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_forward_proxy_cannot_slip_a_method_or_path_past_a_rule() {
    let env = Env::start().await;
    let proxy = format!("http://{}", env.sc.proxy_tcp());
    let token = env.token();
    let u = |p: &str| env.url(p);
    for (args, why) in [
        (
            vec!["-X", "DELETE", &u("/repos/a/issues/1")],
            "a method the rule lacks",
        ),
        (
            vec!["-X", "delete", &u("/repos/a/issues/1")],
            "a method in lower case",
        ),
        (
            vec!["-X", "get", &u("/repos/a/issues")],
            "GET in lower case",
        ),
        (vec![&u("/repos/a/secrets")], "a path the rule lacks"),
        (vec![&u("/repos/a/issues/../secrets")], "a dot segment"),
        (
            vec![&u("/repos/a/issues/%2e%2e/secrets")],
            "an encoded dot segment",
        ),
        (vec![&u("/repos/a/issues/..%2Fsecrets")], "an encoded slash"),
        (
            vec![&u("/repos/a/issues/..%5Csecrets")],
            "an encoded backslash",
        ),
        (vec![&u("/repos//issues")], "an empty segment"),
        (
            vec![&u("/repos/a/issues?token=x")],
            "a query parameter the rule lacks",
        ),
        (vec![&u("/secrets?/repos/a/issues")], "a path in the query"),
    ] {
        assert_eq!(curl(&proxy, &token, &args), 403, "{why}: {args:?}");
    }
    assert_eq!(
        curl(&proxy, &token, &[&u("/repos/a/issues?state=open")]),
        200
    );
    assert_eq!(curl(&proxy, &token, &["-I", &u("/repos/a/issues/1")]), 200);
    assert_eq!(
        curl(
            &proxy,
            &token,
            &["-X", "POST", "-d", "hi", &u("/repos/a/issues/1/comments")]
        ),
        200
    );

    // Absolute-form is judged, whatever Host says; origin-form never reaches
    // an upstream.
    let auth = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("run:{token}"),
    );
    let (code, body) = raw(
        env.sc.proxy_tcp(),
        format!(
            "DELETE {} HTTP/1.1\r\nHost: {HOST}:{}\r\nProxy-Authorization: Basic {auth}\r\n\r\n",
            u("/repos/a/issues/1"),
            env.up.port()
        ),
    )
    .await;
    assert_eq!(code, 403, "{body}");
    // The refusal names the rule and what it lacks, structured as
    // `api_call`'s is.
    let json: Value = serde_json::from_str(body.split("\r\n\r\n").nth(1).unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(json["error"], "rule_refused", "{json}");
    assert_eq!(
        json["rule"],
        json!({"rule": "issues-read", "missing": {"kind": "method", "method": "DELETE"}}),
        "{json}"
    );
    let (code, body) = raw(
        env.sc.proxy_tcp(),
        format!(
            "GET /repos/a/secrets HTTP/1.1\r\nHost: {HOST}:{}\r\nProxy-Authorization: Basic {auth}\r\n\r\n",
            env.up.port()
        ),
    )
    .await;
    assert_ne!(code, 200, "{body}");
    let (code, body) = raw(
        env.sc.proxy_tcp(),
        format!(
            "GET {} HTTP/1.1\r\nHost: elsewhere.test\r\nProxy-Authorization: Basic {auth}\r\n\r\n",
            u("/repos/a/secrets")
        ),
    )
    .await;
    assert_eq!(code, 403, "{body}");

    assert_eq!(
        env.seen(),
        [
            "GET /repos/a/issues?state=open",
            "HEAD /repos/a/issues/1",
            "POST /repos/a/issues/1/comments",
        ]
    );
    let log = env.p.egress_log().await;
    let refused = log
        .iter()
        .filter(|e| e.reason.map(|c| c.as_str()) == Some("rule_refused"))
        .count();
    assert_eq!(refused, 13, "{log:?}");
}

/// curl through the proxy to an HTTPS URL, trusting only `cacert`: the
/// status, or 0 when the handshake failed.
fn curl_tls(proxy: &str, token: &str, cacert: &std::path::Path, args: &[&str]) -> u16 {
    let cacert = cacert.to_str().unwrap();
    curl(proxy, token, &[&["--cacert", cacert], args].concat())
}

/// The sidecar of `p` whose agent's proxy (on TCP) reaches the two
/// HTTPS `hosts` (base URLs on 127.0.0.1, under `upstream_ca`) under the
/// network `rules`, with a CA of the run's own: the sidecar and that CA.
fn two_hosts_sidecar(
    p: &TestPlatform,
    hosts: [&str; 2],
    rules: Value,
    upstream_ca: &crate::support::tls::TestCa,
) -> (SidecarProcess, airlock_platform_api::launch::ProxyCa) {
    let run_ca = airlock_platform::proxy_ca::generate(&p.run_id).unwrap();
    let cfg = p
        .sidecar_config()
        .tcp()
        .proxy_tcp()
        .network_allow(hosts.map(|h| format!("{h}/**")))
        .network_rules(rules)
        .allow_internal_hosts(["127.0.0.1"])
        .egress_with(|e| e.extra_ca_pem = Some(upstream_ca.issuer.pem()))
        .proxy_ca(&run_ca.cert_pem, &run_ca.key_pem)
        .build();
    (spawn_sidecar(&cfg), run_ca)
}

/// HTTPS through the forward proxy: a CONNECT to a host a `[network]` rule
/// must see inside is intercepted under the run's CA and each request in it
/// judged (the same attacks as on plain HTTP); a CONNECT to a host no rule
/// covers stays a plain tunnel (the agent sees the upstream's own
/// certificate); a client that does not speak TLS to the ruled host is
/// refused (`missing: tunnel`) and nothing reaches it.
#[tokio::test(flavor = "multi_thread")]
async fn https_is_intercepted_only_where_a_rule_must_see_inside() {
    use crate::support::tls::{TwoHosts, test_ca, two_hosts_on};
    let upstream_ca = test_ca();
    let TwoHosts {
        main,
        main_port,
        main_log,
        other,
        other_log,
        ..
    } = two_hosts_on("127.0.0.1", "127.0.0.1", &upstream_ca).await;
    let p = TestPlatform::start("l7-rules-tls").await;
    let (sc, run_ca) = two_hosts_sidecar(
        &p,
        [&main, &other],
        json!([{"id": "api-read", "host": main, "access": "read-only", "paths": ["/api/**"]}]),
        &upstream_ca,
    );
    let token = p.sidecar_token.expose_secret().to_owned();
    let proxy = format!("http://{}", sc.proxy_tcp());
    let dir = tempfile::tempdir().unwrap();
    let run_pem = dir.path().join("run.pem");
    std::fs::write(&run_pem, &run_ca.cert_pem).unwrap();

    let m = |path: &str| format!("{main}{path}");
    assert_eq!(curl_tls(&proxy, &token, &run_pem, &[&m("/api/ok")]), 200);
    for args in [
        vec!["-X", "DELETE", &m("/api/x")],
        vec!["-X", "get", &m("/api/x")],
        vec![&m("/private")],
        vec![&m("/api/../private")],
        vec![&m("/api/%2e%2e/private")],
        vec![&m("/api/..%2fprivate")],
        vec![&m("/private?/api/x")],
    ] {
        assert_eq!(curl_tls(&proxy, &token, &run_pem, &args), 403, "{args:?}");
    }
    // A host no rule covers keeps its plain tunnel: the agent sees the
    // upstream's own certificate (the test CA's leaf, which names no DN of
    // its own, so curl takes it on `-k`), never one of the run's CA.
    let o = format!("{other}/free");
    assert_eq!(curl(&proxy, &token, &["-k", "-X", "DELETE", &o]), 200);
    assert_eq!(curl_tls(&proxy, &token, &run_pem, &[&o]), 0);

    // Not TLS to the ruled host: refused, nothing relayed.
    let (_, got) = raw(
        sc.proxy_tcp(),
        format!(
            "CONNECT 127.0.0.1:{main_port} HTTP/1.1\r\nHost: 127.0.0.1:{main_port}\r\n\
             Proxy-Authorization: Bearer {token}\r\n\r\nDELETE /api/x HTTP/1.1\r\n\r\n"
        ),
    )
    .await;
    assert!(!got.contains("\"path\""), "{got}");

    let main_seen: Vec<String> = crate::support::tls::paths(&main_log);
    assert_eq!(main_seen, ["/api/ok"]);
    let other_seen: Vec<String> = crate::support::tls::paths(&other_log);
    assert_eq!(other_seen, ["/free"]);
    let log = p.egress_log().await;
    let refused = log
        .iter()
        .filter(|e| e.reason.map(|c| c.as_str()) == Some("rule_refused"))
        .count();
    assert_eq!(refused, 8, "{log:?}");
}

/// A TLS connector trusting only the certificates of `ca_pem`.
fn trusting(ca_pem: &str) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// `CONNECT 127.0.0.1:port` on `s` with the listener's `token`, then TLS
/// to `127.0.0.1` trusting only `ca_pem`: `None` if the TLS handshake
/// fails (the proxy's 200 is asserted).
async fn tls_through<S>(
    mut s: S,
    token: &str,
    port: u16,
    ca_pem: &str,
) -> Option<tokio_rustls::client::TlsStream<S>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    s.write_all(
        format!(
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Proxy-Authorization: Bearer {token}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        if s.read(&mut b).await.unwrap() == 0 {
            return None;
        }
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    trusting(ca_pem).connect(name, s).await.ok()
}

/// [`tls_through`] a proxy listener on a unix socket; `None` when the
/// proxy closed before answering or the handshake failed.
pub(crate) async fn unix_proxy_tls(
    socket: &std::path::Path,
    token: &str,
    port: u16,
    ca_pem: &str,
) -> Option<tokio_rustls::client::TlsStream<tokio::net::UnixStream>> {
    let s = tokio::net::UnixStream::connect(socket).await.unwrap();
    tls_through(s, token, port, ca_pem).await
}

/// One HTTPS request through a proxy listener on a unix socket
/// ([`unix_proxy_tls`], then the request): the response's status (0: no
/// TLS, or no answer) and its text.
pub(crate) async fn through_unix_proxy(
    socket: &std::path::Path,
    token: &str,
    port: u16,
    ca_pem: &str,
    request_line: &str,
) -> (u16, String) {
    let Some(mut tls) = unix_proxy_tls(socket, token, port, ca_pem).await else {
        return (0, String::new());
    };
    tls.write_all(
        format!("{request_line} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let _ = tls.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

/// A keep-alive HTTPS session through the agent's TCP proxy: one CONNECT,
/// then any number of requests on it (`None`: the tunnel is gone).
struct Session(hyper::client::conn::http1::SendRequest<Full<Bytes>>);

impl Session {
    async fn open(proxy: SocketAddr, token: &str, port: u16, ca_pem: &str) -> Session {
        let s = tokio::net::TcpStream::connect(proxy).await.unwrap();
        let tls = tls_through(s, token, port, ca_pem)
            .await
            .expect("TLS through the tunnel");
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        Session(send)
    }

    async fn request(&mut self, method: &str, path: &str) -> Option<u16> {
        self.0.ready().await.ok()?;
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = self.0.send_request(req).await.ok()?;
        let status = resp.status().as_u16();
        http_body_util::BodyExt::collect(resp.into_body())
            .await
            .ok()?;
        Some(status)
    }
}

/// A plain tunnel does not outlive the rules that admitted it. The
/// attacker opens HTTPS tunnels while `full` rules need not see inside
/// (plain: it sees the upstreams' own certificates) and writes through
/// them; a person narrows one host to reading, live. That host's open
/// tunnel is closed: the attacker's next write on it never reaches the
/// upstream, and its record says `rule_refused` by the new rule. The other
/// host's tunnel, still admitted, stays open. The legitimate path: a new
/// CONNECT to the narrowed host is intercepted with the run's CA (which the
/// run has from the start, though no rule needed it then), a read passes
/// and a write is refused naming the rule.
#[tokio::test(flavor = "multi_thread")]
async fn an_open_tunnel_is_closed_once_a_live_change_must_see_inside_it() {
    use crate::support::tls::{TwoHosts, test_ca, two_hosts_on};
    let upstream_ca = test_ca();
    let TwoHosts {
        main,
        main_port,
        main_log,
        other,
        other_port,
        other_log,
    } = two_hosts_on("127.0.0.1", "127.0.0.1", &upstream_ca).await;
    let p = TestPlatform::start("l7-live-tunnel").await;
    let full = |id: &str, host: &str| json!({"id": id, "host": host, "access": "full"});
    let (sc, run_ca) = two_hosts_sidecar(
        &p,
        [&main, &other],
        json!([full("main-full", &main), full("other-full", &other)]),
        &upstream_ca,
    );
    let token = p.sidecar_token.expose_secret().to_owned();
    let upstream_pem = upstream_ca.issuer.pem();
    let mut to_main = Session::open(sc.proxy_tcp(), &token, main_port, &upstream_pem).await;
    let mut to_other = Session::open(sc.proxy_tcp(), &token, other_port, &upstream_pem).await;
    assert_eq!(to_main.request("POST", "/api/before").await, Some(200));
    assert_eq!(to_other.request("POST", "/before").await, Some(200));

    p.change_policy(json!({"network": [
        {"id": "main-read", "host": main, "access": "read-only", "paths": ["/api/**"]},
        full("other-full", &other),
    ]}))
    .await;
    assert_eq!(
        to_main.request("POST", "/api/after").await,
        None,
        "a tunnel the new rules must see inside is closed"
    );
    assert_eq!(
        to_other.request("POST", "/after").await,
        Some(200),
        "a tunnel the new rules still admit stays open"
    );

    let proxy = format!("http://{}", sc.proxy_tcp());
    let dir = tempfile::tempdir().unwrap();
    let run_pem = dir.path().join("run.pem");
    std::fs::write(&run_pem, &run_ca.cert_pem).unwrap();
    let m = |path: &str| format!("{main}{path}");
    assert_eq!(curl_tls(&proxy, &token, &run_pem, &[&m("/api/read")]), 200);
    assert_eq!(
        curl_tls(&proxy, &token, &run_pem, &["-X", "POST", &m("/api/write")]),
        403
    );

    use crate::support::tls::paths;
    assert_eq!(paths(&main_log), ["/api/before", "/api/read"]);
    assert_eq!(paths(&other_log), ["/before", "/after"]);
    let log = p.egress_log().await;
    let closed: Vec<_> = log
        .iter()
        .filter(|e| e.method == "CONNECT" && e.url.contains(&format!(":{main_port}")))
        .filter(|e| e.reason.map(|c| c.as_str()) == Some("rule_refused"))
        .collect();
    assert_eq!(closed.len(), 1, "{log:#?}");
    assert_eq!(
        closed[0].rule.as_deref(),
        Some("main-read"),
        "{:#?}",
        closed[0]
    );
    assert_eq!(
        closed[0].outcome.map(|o| o.as_str()),
        Some("aborted"),
        "{:#?}",
        closed[0]
    );
}

/// A sidecar configuration of `p` whose one integration, `tool`, is a
/// local runner without a connection: `rules` its L7 rules,
/// `https://127.0.0.1:{port}/**` its `authorized_uris` (the sidecar
/// trusting `upstream_ca` there), its proxy on a unix socket taking `token`.
pub(crate) struct RunnerSidecar {
    pub cfg: airlock_platform_api::launch::SidecarConfig,
    pub run_ca: airlock_platform_api::launch::ProxyCa,
    pub proxy_socket: std::path::PathBuf,
    /// Holds the runner's sockets.
    pub _dir: tempfile::TempDir,
}

pub(crate) fn runner_sidecar(
    p: &TestPlatform,
    port: u16,
    rules: Value,
    token: &str,
    upstream_ca: &crate::support::tls::TestCa,
) -> RunnerSidecar {
    use airlock_platform_api::launch::{Endpoint, Integration, Runner};
    let run_ca = airlock_platform::proxy_ca::generate(&p.run_id).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let proxy_socket = dir.path().join("runner-proxy.sock");
    let mut runner: Integration = integration("tool")
        .authorized([format!("https://127.0.0.1:{port}/**")])
        .rules(rules)
        .without_connection()
        .into();
    runner.runner = Some(Runner {
        mcp: Endpoint::Unix(dir.path().join("runner-mcp.sock")),
        proxy: Endpoint::Unix(proxy_socket.clone()),
        token: token.to_owned().into(),
    });
    let cfg = p
        .sidecar_config()
        .tcp()
        .integration(runner)
        .allow_internal_hosts(["127.0.0.1"])
        .egress_with(|e| e.extra_ca_pem = Some(upstream_ca.issuer.pem()))
        .proxy_ca(&run_ca.cert_pem, &run_ca.key_pem)
        .build();
    RunnerSidecar {
        cfg,
        run_ca,
        proxy_socket,
        _dir: dir,
    }
}

/// A local runner's proxy judges its requests by its integration's rules:
/// the legitimate read goes through; a method, a path or an encoded
/// separator the rule lacks is refused and never reaches the upstream.
#[tokio::test(flavor = "multi_thread")]
async fn a_local_runners_proxy_cannot_slip_a_method_or_path_past_a_rule() {
    use crate::support::tls::{test_ca, upstream};
    let upstream_ca = test_ca();
    let (port, seen) = upstream("127.0.0.1", &upstream_ca).await;
    let p = TestPlatform::start("l7-rules-runner").await;
    let base = format!("https://127.0.0.1:{port}");
    let RunnerSidecar {
        cfg,
        run_ca,
        proxy_socket,
        _dir,
    } = runner_sidecar(
        &p,
        port,
        json!([{"id": "tool-read", "host": base, "access": "read-only", "paths": ["/api/**"]}]),
        "runner-token-L7",
        &upstream_ca,
    );
    let _sc = spawn_sidecar(&cfg);
    let ask = |line: &'static str| {
        let (socket, pem) = (proxy_socket.clone(), run_ca.cert_pem.clone());
        async move {
            through_unix_proxy(&socket, "runner-token-L7", port, &pem, line)
                .await
                .0
        }
    };
    assert_eq!(ask("GET /api/ok").await, 200);
    for line in [
        "DELETE /api/x",
        "POST /api/x",
        "get /api/x",
        "GET /private",
        "GET /api/..%2fprivate",
        "GET /api/%2e%2e/private",
        "GET //api/../private",
    ] {
        assert_eq!(ask(line).await, 403, "{line}");
    }
    let paths: Vec<String> = crate::support::tls::paths(&seen);
    assert_eq!(paths, ["/api/ok"]);
    let log = p.egress_log().await;
    let refused: Vec<_> = log
        .iter()
        .filter(|e| e.source.as_str() == "runner")
        .filter(|e| e.reason.map(|c| c.as_str()) == Some("rule_refused"))
        .collect();
    assert_eq!(refused.len(), 7, "{log:?}");
}

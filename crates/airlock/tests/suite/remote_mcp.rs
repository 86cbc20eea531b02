//! Remote MCP integrations end to end: the real `airlock sidecar` as the MCP
//! client (rmcp) of a server the test runs on loopback (the official MCP
//! Python SDK's, and hand-written hostile ones), reached through the egress
//! guard with the connection's credential, and the official MCP Python
//! client as the agent. Checked from the attacker's side: the credential
//! reaches the server and never the agent, a server outside the
//! integration's authorized URIs is never contacted, and a hostile server
//! cannot hurt the sidecar or another integration.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use airlock_platform::testing::TestPlatform;
use airlock_store::AuthType;
use airlock_vault::ExposeSecret;
use serde_json::{Value, json};

const CANARY: &str = "canary-remote-7Hq2Lw9Xp4Zt";
const HOST: &str = "mcp.internal.test";

/// A test MCP server (`tests/python/mcp_server.py`), killed on drop.
pub(crate) struct McpServer {
    child: Child,
    pub(crate) port: u16,
}

impl McpServer {
    pub(crate) fn start(mode: &str, token: &str) -> McpServer {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/mcp_server.py");
        let mut child = Command::new("python3")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(json!({"mode": mode, "token": token}).to_string().as_bytes())
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("mcp_server.py {mode} printed no port: {line:?}"));
        McpServer { child, port }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Every request the server received (method, path, Authorization…).
    pub(crate) fn seen(&self) -> Vec<Value> {
        let (status, _, body) = http(self.addr(), "GET", "/seen", &[], b"");
        assert_eq!(status, 200);
        serde_json::from_slice(&body).unwrap()
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `mcp_client.py` (the official MCP Python client) against the sidecar.
fn agent(url: &str, token: &str, mode: &str, ops: Value) -> Value {
    let input = json!({"url": url, "token": token, "mode": mode, "ops": ops});
    mcp_client_output(spawn_mcp_client(&input))
}

fn tool_names(list: &Value) -> Vec<String> {
    list["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("not a tool list: {list}"))
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

fn remote_integration(ns: &str, port: u16) -> IntegrationBuilder {
    integration(ns)
        .authorized([format!("http://{HOST}:{port}/**")])
        .bearer("token")
        .mcp_url(&format!("http://{HOST}:{port}/mcp"))
}

async fn platform_with(namespaces: &[&str]) -> TestPlatform {
    let p = TestPlatform::start("remote-mcp").await;
    for ns in namespaces {
        p.add_connection(ns, AuthType::Bearer, &[("token", CANARY)])
            .await;
    }
    p
}

/// A sidecar of `integrations`, `api.internal.test` on loopback.
fn config_for(
    p: &TestPlatform,
    integrations: impl IntoIterator<Item = IntegrationBuilder>,
) -> SidecarConfigBuilder {
    integrations
        .into_iter()
        .fold(p.sidecar_config().tcp(), SidecarConfigBuilder::integration)
        .loopback_host(HOST)
}

fn sidecar_for(
    p: &TestPlatform,
    integrations: impl IntoIterator<Item = IntegrationBuilder>,
    limits: impl FnOnce(&mut Limits),
) -> SidecarProcess {
    spawn_sidecar(&config_for(p, integrations).limits(limits).build())
}

/// The agent lists the tools and calls `good__echo`, which answers: the
/// names listed, for what the test checks of the others.
fn good_echo_beside_the_others(p: &TestPlatform, sc: &SidecarProcess) -> Vec<String> {
    let token = p.sidecar_token.expose_secret().to_owned();
    let url = format!("http://{}/mcp", sc.tcp());
    let out = agent(
        &url,
        &token,
        "legacy",
        json!([{"op": "list_tools"}, {"op": "call", "name": "good__echo", "args": {"text": "ok"}}]),
    );
    let names = tool_names(&out["results"][0]);
    assert!(names.iter().any(|n| n == "good__echo"), "{names:?}");
    assert_eq!(text_of(&out["results"][1]), "ok");
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_tools_are_served_with_the_credential_injected_and_never_returned() {
    if !python_has(&["mcp", "httpx2", "uvicorn"]) {
        return;
    }
    let server = McpServer::start("good", CANARY);
    let p = platform_with(&["remote"]).await;
    let sc = sidecar_for(&p, [remote_integration("remote", server.port)], |l| {
        l.inline_result_bytes = 4096
    });
    let token = p.sidecar_token.expose_secret().to_owned();
    let url = format!("http://{}/mcp", sc.tcp());
    for mode in ["legacy", "2026-07-28"] {
        let out = agent(
            &url,
            &token,
            mode,
            json!([
                {"op": "list_tools"},
                {"op": "call", "name": "remote__echo", "args": {"text": "hello through the guard"}},
                {"op": "call", "name": "remote__add", "args": {"a": 2, "b": 40}},
                {"op": "call", "name": "remote__whoami", "args": {}},
                {"op": "call", "name": "remote__big", "args": {"n": 20000}},
                {"op": "call", "name": "remote__nonexistent", "args": {}},
            ]),
        );
        assert!(out.get("fatal").is_none(), "{mode}: {out}");
        let r = &out["results"];
        let names = tool_names(&r[0]);
        for want in [
            "remote__add",
            "remote__big",
            "remote__echo",
            "remote__whoami",
            "remote__api_call",
            "run_history",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{mode}: no {want} in {names:?}"
            );
        }
        // The server's schemas come through.
        let echo = r[0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "remote__echo")
            .unwrap();
        assert_eq!(echo["inputSchema"]["properties"]["text"]["type"], "string");
        assert_eq!(echo["inputSchema"]["required"], json!(["text"]));

        assert_eq!(r[1].get("isError"), Some(&json!(false)), "{mode}: {}", r[1]);
        assert_eq!(text_of(&r[1]), "hello through the guard");
        assert_eq!(text_of(&r[2]), "42", "{mode}: {}", r[2]);
        // A server that reflects the credential: the agent sees it redacted.
        let who = text_of(&r[3]);
        assert_eq!(who, "you sent: Bearer [REDACTED]", "{mode}");
        // A large result becomes a link readable by this run.
        let big = &r[4];
        let link = big["content"]
            .as_array()
            .unwrap_or_else(|| panic!("{mode}: not a result: {big}"))
            .iter()
            .find(|b| b["type"] == "resource_link")
            .unwrap_or_else(|| panic!("{mode}: no resource link: {big}"));
        assert!(
            link["uri"]
                .as_str()
                .unwrap()
                .starts_with(&format!("airlock://result/{}/", p.run_id))
        );
        // An unknown tool is a protocol error, not a call to the server.
        assert!(r[5].get("exception").is_some(), "{mode}: {}", r[5]);
        assert!(
            !out.to_string().contains(CANARY),
            "{mode}: the credential reached the agent: {out}"
        );
    }
    // Every request the server saw carried the injected credential, and
    // every exchange is in the run's egress log as an `mcp` request.
    let seen = server.seen();
    assert!(seen.len() >= 6, "{seen:?}");
    for s in &seen {
        assert_eq!(s["authorization"], json!(format!("Bearer {CANARY}")), "{s}");
        assert_eq!(s["host"], json!(format!("{HOST}:{}", server.port)), "{s}");
    }
    let log = eventually(10, || async {
        let log: Vec<_> = p
            .stored_egress_log()
            .await
            .into_iter()
            .filter(|e| e.source.as_str() == "mcp")
            .collect();
        (log.len() >= seen.iter().filter(|s| s["method"] == "POST").count()).then_some(log)
    })
    .await
    .expect("every exchange with the server in the egress log");
    for e in &log {
        assert_eq!(e.integration.as_deref(), Some("remote"));
        assert_eq!(e.host, HOST);
        assert!(!e.url.contains(CANARY));
    }
    assert!(log.iter().any(|e| e.status == Some(200)), "{log:?}");
    drop(sc);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_outside_authorized_uris_or_blocked_is_never_contacted() {
    if !python_has(&["mcp", "httpx2", "uvicorn"]) {
        return;
    }
    let server = McpServer::start("good", CANARY);
    let p = platform_with(&["outside", "blocked", "good"]).await;
    let port = server.port;
    let sc = sidecar_for(
        &p,
        [
            // Its URL is not covered by its own authorized URIs.
            integration("outside")
                .authorized([format!("http://{HOST}:{port}/other/**")])
                .bearer("token")
                .mcp_url(&format!("http://{HOST}:{port}/mcp")),
            // Loopback by address, not opted in as an internal host.
            integration("blocked")
                .authorized([format!("http://127.0.0.1:{port}/**")])
                .bearer("token")
                .mcp_url(&format!("http://127.0.0.1:{port}/mcp")),
            remote_integration("good", port),
        ],
        |_| {},
    );
    let names = good_echo_beside_the_others(&p, &sc);
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("outside__") && n != "outside__api_call"
                || n.starts_with("blocked__") && n != "blocked__api_call"),
        "{names:?}"
    );
    // Only the good integration's requests reached the server.
    let seen = server.seen();
    assert!(!seen.is_empty());
    let log = p.egress_log().await;
    let refused = |ns: &str, code: &str| {
        log.iter().any(|e| {
            e.source.as_str() == "mcp"
                && e.integration.as_deref() == Some(ns)
                && e.reason.map(|r| r.as_str()) == Some(code)
        })
    };
    let codes: Vec<_> = log
        .iter()
        .map(|e| (e.integration.clone(), e.reason))
        .collect();
    assert!(refused("outside", "not_authorized"), "{codes:?}");
    assert!(
        refused("blocked", "blocked_address") || refused("blocked", "blocked_host"),
        "{codes:?}"
    );
    assert_eq!(
        log.iter()
            .filter(|e| e.source.as_str() == "mcp" && e.integration.as_deref() != Some("good"))
            .filter(|e| e.reason.is_none())
            .count(),
        0,
        "a refused integration's request was sent: {log:?}"
    );
    drop(sc);
}

/// L7 rules on a remote MCP server's integration: its exchanges (POST,
/// GET and DELETE to the server's URL) are judged like any request, so a
/// rule that does not allow them (a `read-only` preset, another path)
/// keeps the server uncontacted and says which rule refused; a rule that
/// names them lets the tools through.
#[tokio::test(flavor = "multi_thread")]
async fn l7_rules_judge_a_remote_servers_exchanges() {
    if !python_has(&["mcp", "httpx2", "uvicorn"]) {
        return;
    }
    let refused_server = McpServer::start("good", CANARY);
    let server = McpServer::start("good", CANARY);
    let p = platform_with(&["ro", "elsewhere", "good"]).await;
    let (rport, port) = (refused_server.port, server.port);
    let host = |port: u16| format!("http://{HOST}:{port}");
    let sc = sidecar_for(
        &p,
        [
            remote_integration("ro", rport)
                .rules(json!([{"id": "ro-read", "host": host(rport), "access": "read-only"}])),
            remote_integration("elsewhere", rport).rules(
                json!([{"id": "other-path", "host": host(rport), "access": "full", "paths": ["/other/**"]}]),
            ),
            remote_integration("good", port).rules(json!([{
                "id": "mcp-only", "host": host(port),
                "methods": ["POST", "GET", "DELETE"], "paths": ["/mcp"],
            }])),
        ],
        |_| {},
    );
    let names = good_echo_beside_the_others(&p, &sc);
    assert!(
        !names
            .iter()
            .any(|n| (n.starts_with("ro__") || n.starts_with("elsewhere__"))
                && !n.ends_with("__api_call")),
        "{names:?}"
    );
    assert!(
        refused_server.seen().is_empty(),
        "{:?}",
        refused_server.seen()
    );
    let log = p.egress_log().await;
    for ns in ["ro", "elsewhere"] {
        let mine: Vec<_> = log
            .iter()
            .filter(|e| e.source.as_str() == "mcp" && e.integration.as_deref() == Some(ns))
            .collect();
        assert!(!mine.is_empty(), "{ns}: {log:?}");
        assert!(
            mine.iter()
                .all(|e| e.reason.map(|r| r.as_str()) == Some("rule_refused")),
            "{ns}: {mine:?}"
        );
    }
    let journal = String::from_utf8_lossy(&std::fs::read(&p.journal).unwrap()).into_owned();
    assert!(
        journal
            .contains(r#""rule":{"rule":"ro-read","missing":{"kind":"method","method":"POST"}}"#),
        "{journal}"
    );
    assert!(
        journal.contains(r#""rule":{"rule":"other-path","missing":{"kind":"path","path":"/mcp"}}"#),
        "{journal}"
    );
    drop(sc);
}

/// An integration's `tools` allowlist: a tool it hides is neither listed
/// nor callable — by its name, in another case, as the integration's own
/// `api_call`, or after a server renamed its tools between list and call —
/// and the server never receives a call for it.
#[tokio::test(flavor = "multi_thread")]
async fn a_tool_allowlist_hides_tools_from_the_list_and_from_calls() {
    if !python_has(&["mcp", "httpx2", "uvicorn"]) {
        return;
    }
    let good = McpServer::start("good", CANARY);
    let changing = McpServer::start("changing", CANARY);
    let p = platform_with(&["good", "ch"]).await;
    let sc = sidecar_for(
        &p,
        [
            remote_integration("good", good.port).tools(&["echo", "ad*"]),
            remote_integration("ch", changing.port).tools(&["v1"]),
        ],
        |_| {},
    );
    let token = p.sidecar_token.expose_secret().to_owned();
    let url = format!("http://{}/mcp", sc.tcp());
    let call = |name: &str, args: Value| json!({"op": "call", "name": name, "args": args});
    let out = agent(
        &url,
        &token,
        "legacy",
        json!([
            {"op": "list_tools"},
            call("good__echo", json!({"text": "ok"})),
            call("good__add", json!({"a": 1, "b": 2})),
            call("good__whoami", json!({})),
            call("good__Echo", json!({"text": "x"})),
            call("good__WHOAMI", json!({})),
            call("good__api_call", json!({"target": "http://x/"})),
            call("ch__v1", json!({})),
            {"op": "list_tools"},
            call("ch__v2", json!({})),
        ]),
    );
    let r = out["results"].as_array().unwrap_or_else(|| panic!("{out}"));
    let mut names = tool_names(&r[0]);
    names.retain(|n| n.starts_with("good__") || n.starts_with("ch__"));
    names.sort();
    assert_eq!(names, ["ch__v1", "good__add", "good__echo"]);
    assert_eq!(text_of(&r[1]), "ok");
    assert_eq!(text_of(&r[2]), "3");
    for refused in &r[3..=6] {
        assert_eq!(refused["isError"], json!(true), "{refused}");
        let body: Value = serde_json::from_str(&text_of(refused)).unwrap();
        assert_eq!(body["error"], "tool_not_allowed", "{refused}");
        assert_eq!(body["status"], 403);
    }
    assert_eq!(text_of(&r[7]), "called v1");
    let after: Vec<String> = tool_names(&r[8])
        .into_iter()
        .filter(|n| n.starts_with("ch__"))
        .collect();
    assert!(after.is_empty(), "the renamed tool is hidden: {after:?}");
    let body: Value = serde_json::from_str(&text_of(&r[9])).unwrap();
    assert_eq!(body["error"], "tool_not_allowed", "{}", r[9]);
    let called = |server: &McpServer| -> Vec<String> {
        server
            .seen()
            .iter()
            .filter(|s| s["rpc"] == "tools/call")
            .filter_map(|s| s["tool"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(called(&changing), ["v1"]);
    let good_called = called(&good);
    assert!(
        good_called.iter().all(|t| t == "echo" || t == "add"),
        "{good_called:?}"
    );
    drop(sc);
    // Each exclusion is in the run's audit once, however often it happened
    // (the second list hid `whoami` again).
    let journal = String::from_utf8_lossy(&std::fs::read(&p.journal).unwrap()).into_owned();
    let kept = |integration: &str, tool: &str, called: bool| {
        let tail = format!(r#","integration":"{integration}","tool":"{tool}","called":{called}}}"#);
        journal
            .lines()
            .filter(|l| l.contains(r#""type":"tool_excluded""#) && l.contains(&tail))
            .count()
    };
    for (integration, tool, called) in [
        ("good", "whoami", false),
        ("good", "whoami", true),
        ("good", "Echo", true),
        ("good", "WHOAMI", true),
        ("good", "api_call", false),
        ("good", "api_call", true),
        ("ch", "v2", false),
        ("ch", "v2", true),
    ] {
        assert_eq!(
            kept(integration, tool, called),
            1,
            "{integration} {tool} called={called}: {journal}"
        );
    }
    assert_eq!(
        kept("good", "echo", false),
        0,
        "an allowed tool is no exclusion"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_servers_get_bounded_typed_errors_and_hurt_nothing_else() {
    if !python_has(&["mcp", "httpx2", "uvicorn"]) {
        return;
    }
    let good = McpServer::start("good", CANARY);
    let modes = [
        "hang",
        "flood",
        "malformed",
        "oversized",
        "cursor_loop",
        "changing",
        "redirect",
    ];
    let servers: Vec<McpServer> = modes.iter().map(|m| McpServer::start(m, CANARY)).collect();
    let mut names = vec!["good"];
    names.extend(modes.iter().map(|m| {
        if *m == "cursor_loop" {
            "cursorloop"
        } else {
            *m
        }
    }));
    let p = platform_with(&names).await;
    let mut integrations = vec![remote_integration("good", good.port)];
    for (ns, s) in names[1..].iter().zip(&servers) {
        integrations.push(remote_integration(ns, s.port));
    }
    let sc = sidecar_for(&p, integrations, |l| {
        l.upstream_timeout_secs = 3;
        l.max_response_bytes = 4_194_304;
        l.inline_result_bytes = 65536;
    });
    let token = p.sidecar_token.expose_secret().to_owned();
    let url = format!("http://{}/mcp", sc.tcp());

    let started = Instant::now();
    let out = agent(
        &url,
        &token,
        "2026-07-28",
        json!([
            {"op": "list_tools"},
            {"op": "call", "name": "good__echo", "args": {"text": "still here"}},
            {"op": "call", "name": "malformed__ping", "args": {}},
            {"op": "call", "name": "oversized__ping", "args": {}},
            {"op": "call", "name": "hang__ping", "args": {}},
            {"op": "call", "name": "changing__v1", "args": {}},
            {"op": "list_tools"},
            {"op": "call", "name": "good__add", "args": {"a": 1, "b": 1}},
        ]),
    );
    let took = started.elapsed();
    assert!(out.get("fatal").is_none(), "{out}");
    let r = &out["results"];
    let listed = tool_names(&r[0]);
    let count = |prefix: &str| {
        listed
            .iter()
            .filter(|n| n.starts_with(prefix) && !n.ends_with("__api_call"))
            .count()
    };
    // 10,000 tools (and a traversal name, an `api_call`, a 100 KB one) → the cap.
    assert_eq!(count("flood__"), 256, "{}", listed.len());
    assert!(!listed.iter().any(|n| n.contains("..") || n == "flood__fat"));
    assert_eq!(listed.iter().filter(|n| *n == "flood__api_call").count(), 1);
    // A tool list that pages forever stops at the page cap.
    assert_eq!(count("cursorloop__"), 16, "{listed:?}");
    // A server that hangs contributes no tools, and the list still came.
    assert_eq!(count("hang__"), 0);
    assert!(listed.iter().any(|n| n == "good__echo"));
    assert_eq!(count("changing__"), 1);
    // A server that redirects elsewhere serves nothing, and the redirect
    // target was never asked.
    assert_eq!(count("redirect__"), 0);
    let redirect = servers
        .iter()
        .zip(modes)
        .find(|(_, m)| *m == "redirect")
        .unwrap()
        .0;
    let asked: Vec<Value> = redirect.seen();
    assert!(!asked.is_empty());
    assert!(asked.iter().all(|s| s["path"] == "/mcp"), "{asked:?}");

    assert_eq!(text_of(&r[1]), "still here");
    for (i, what) in [(2, "malformed"), (3, "oversized"), (4, "hang")] {
        let res = &r[i];
        let typed = res.get("isError") == Some(&json!(true)) || res.get("exception").is_some();
        assert!(typed, "{what}: {res}");
    }
    assert!(
        text_of(&r[3]).contains("limit") || r[3].to_string().contains("limit"),
        "{}",
        r[3]
    );
    // The changing server said its list changed: the next list shows v2.
    assert_eq!(text_of(&r[5]), "called v1", "{}", r[5]);
    let relisted = tool_names(&r[6]);
    assert!(relisted.iter().any(|n| n == "changing__v2"), "{relisted:?}");
    assert!(
        !relisted.iter().any(|n| n == "changing__v1"),
        "{relisted:?}"
    );
    assert_eq!(text_of(&r[7]), "2");
    // Bounded: the hanging server cost its timeouts (3 s each for the
    // connection and the call), not the run.
    assert!(took < Duration::from_secs(40), "took {took:?}");
    // The sidecar is still healthy.
    let (status, _, _) = http(sc.tcp(), "GET", "/health", &[], b"");
    assert_eq!(status, 200);
    drop(sc);
}

/// The agent of the real run: the official MCP Python client (vendored into
/// the agent's directory: the sandbox has only the host's /usr) lists and
/// calls the remote server's tools through the sidecar, then tries to reach
/// the server directly.
const SANDBOXED_AGENT: &str = r#"
import asyncio, json, os, socket, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

# The server's port comes as the prompt (the agent's environment is Airlock's).
PORT = int(open(os.path.join(os.environ["AIRLOCK_WORKSPACE"], ".airlock", "prompt.txt")).read())

async def main():
    r = {}
    async with Client(streamable_http_client(os.environ["AIRLOCK_MCP_URL"]), mode="2026-07-28") as c:
        r["tools"] = sorted(t.name for t in (await c.list_tools()).tools)
        r["echo"] = (await c.call_tool("remote__echo", {"text": "from the sandbox"})).content[0].text
        r["who"] = (await c.call_tool("remote__whoami", {})).content[0].text
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=3).close()
        r["direct"] = "connected"
    except OSError as e:
        r["direct"] = type(e).__name__
    r["env_has_canary"] = any("canary-remote" in v for v in os.environ.values())
    json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))

asyncio.run(main())
"#;

#[test]
fn a_real_run_calls_a_remote_server_through_its_sidecar_and_only_through_it() {
    if !python_has(&["mcp", "httpx2", "uvicorn"]) || !namespace_available() {
        return;
    }
    let server = McpServer::start("good", CANARY);
    let port = server.port;
    let key = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [0x5au8; 32]);
    let run = RealRun::with_manifest(
        SANDBOXED_AGENT,
        &format!(
            "[agent]\nname = \"remote-mcp\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 120\n\n\
             [network]\negress = \"none\"\n\n\
             [[integrations]]\nnamespace = \"remote\"\nconnection = \"remote\"\n\
             authorized_uris = [\"http://127.0.0.1:{port}/**\"]\n\
             delivery = {{ header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }}\n\
             source = {{ kind = \"remote\", url = \"http://127.0.0.1:{port}/mcp\" }}\n"
        ),
    )
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", "127.0.0.1")
    .env("CONNECTION_ENCRYPTION_KEY", &key);
    run.vendor("mcp");
    run.add_bearer_connection("remote", &json!({"token": CANARY}), &key);

    let out = run
        .command("namespace", &["--prompt", &port.to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(report["status"], "succeeded", "{report}\n{stderr}");
    let r = &report["result"];
    let tools = strings(&r["tools"]);
    for want in ["remote__echo", "remote__whoami", "remote__api_call"] {
        assert!(tools.contains(&want), "{tools:?}");
    }
    assert_eq!(r["echo"], "from the sandbox");
    assert_eq!(r["who"], "you sent: Bearer [REDACTED]");
    // The server itself is out of the sandbox's reach.
    assert_ne!(r["direct"], "connected", "{r}");
    assert_eq!(r["env_has_canary"], false);
    // The server got the credential; nothing the operator or agent sees has it.
    let seen = server.seen();
    assert!(!seen.is_empty());
    assert!(
        seen.iter()
            .all(|s| s["authorization"] == json!(format!("Bearer {CANARY}"))),
        "{seen:?}"
    );
    assert!(!stdout.contains(CANARY) && !stderr.contains(CANARY));
    let entries = report["egress"]["entries"].as_array().unwrap();
    let mcp: Vec<&Value> = entries.iter().filter(|e| e["source"] == "mcp").collect();
    assert!(
        mcp.len() >= seen.iter().filter(|s| s["method"] == "POST").count(),
        "{entries:?}"
    );
    assert!(
        mcp.iter()
            .all(|e| e["integration"] == "remote" && e["decision"] == "allowed")
    );
}

/// Issue 44.4: every tool name names one integration. A hostile remote
/// server `rm` lists `_api_call`, whose full name `rm___api_call` is also
/// what an integration `rm_`'s `api_call` would be called: the namespace
/// `rm_` is refused before the sidecar starts (no name can be read two
/// ways), the hostile tool is routed to `rm` alone, and a name the server
/// lists twice is served once, with a log line and a note in `tools/list`.
/// Another integration's tools still work.
#[tokio::test(flavor = "multi_thread")]
async fn a_remote_tool_name_cannot_shadow_another_integrations_tool() {
    // The MCP Python SDK is needed: a failure under CI, a counted skip elsewhere.
    if !python_has(&["mcp", "httpx2", "uvicorn"]) {
        return;
    }
    let hostile = McpServer::start("shadow", CANARY);
    let good = McpServer::start("good", CANARY);
    let p = platform_with(&["rm", "rm_", "rm-x"]).await;

    // A namespace that makes a name ambiguous is refused at load.
    let cfg = config_for(
        &p,
        [
            remote_integration("rm", hostile.port),
            remote_integration("rm-x", good.port),
        ],
    )
    .build();
    let out = sidecar_refusal(&refused_document(&cfg, |v| {
        v["integrations"][1]["namespace"] = "rm_".into();
    }));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a sidecar with namespace rm_ started: {stderr}"
    );
    assert!(stderr.contains("rm_"), "{stderr}");
    assert!(hostile.seen().is_empty(), "{:?}", hostile.seen());

    // The legitimate shape: `rm` (hostile) beside `rm-x`.
    let sc = sidecar_for(
        &p,
        [
            remote_integration("rm", hostile.port),
            remote_integration("rm-x", good.port),
        ],
        |_| {},
    );
    let token = p.sidecar_token.expose_secret().to_owned();
    let url = format!("http://{}/mcp", sc.tcp());
    let out = agent(
        &url,
        &token,
        "2026-07-28",
        json!([
            {"op": "list_tools"},
            {"op": "call", "name": "rm___api_call", "args": {}},
            {"op": "call", "name": "rm-x__echo", "args": {"text": "the other integration"}},
        ]),
    );
    assert!(out.get("fatal").is_none(), "{out}");
    let r = &out["results"];
    let names = tool_names(&r[0]);
    for once in ["rm___api_call", "rm__ping", "rm__api_call", "rm-x__echo"] {
        assert_eq!(
            names.iter().filter(|n| *n == once).count(),
            1,
            "{once}: {names:?}"
        );
    }
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "a name listed twice: {names:?}");
    let notes = r[0]["meta"]["airlock/dropped_tools"].to_string();
    assert!(notes.contains("rm__ping"), "{}", r[0]["meta"]);
    assert!(sc.stderr().contains("rm__ping"), "{}", sc.stderr());
    // `rm___api_call` reached `rm` as its `_api_call`, and only it.
    assert_eq!(text_of(&r[1]), "pong", "{}", r[1]);
    let calls: Vec<Value> = hostile
        .seen()
        .into_iter()
        .filter(|s| s["rpc"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["tool"], "_api_call");
    assert_eq!(text_of(&r[2]), "the other integration", "{}", r[2]);
    assert!(
        good.seen()
            .iter()
            .all(|s| s["authorization"] == json!(format!("Bearer {CANARY}")))
    );
    drop(sc);
}

//! A live policy change through a real `airlock serve` observed on the
//! remote MCP path (docs/egress.md, "Live policy"): a tool call made before
//! the narrowing completes; once `PATCH /v1/runs/{id}/policy` narrowed the
//! remote server's rule to reading, the agent's next call is refused with
//! the rule named, and the server never sees it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::remote_mcp::McpServer;
use crate::support::serve::{
    Recorder, Server, answer_when_released, base_env, create_org, mcp_agent, wait_for,
};

const TOKEN: &str = "canary-live-remote-4Rt8";

/// Opened by the test once the narrowing is applied: the agent waits at it
/// between its two tool calls.
static GATE_OPEN: AtomicBool = AtomicBool::new(false);

fn gate(c: std::net::TcpStream, first: &str, _: &str) {
    answer_when_released(c, first, &[("", &GATE_OPEN)]);
}

const AGENT: &str = r#"
def echo(text):
    return mcp("tools/call", {"name": "remote__echo", "arguments": {"text": text}})
print("BEFORE " + json.dumps(echo("before the change")), flush=True)
gate = open(os.environ["AIRLOCK_PROMPT_FILE"]).read().strip()
mcp("tools/call", {"name": "gate__api_call", "arguments": {"target": gate + "/gate"}})
print("AFTER " + json.dumps(echo("after the change")), flush=True)
"#;

fn posts(server: &McpServer) -> usize {
    server
        .seen()
        .iter()
        .filter(|s| s["method"] == "POST")
        .count()
}

#[test]
fn a_narrowing_is_enforced_on_the_remote_mcp_path_from_the_next_call() {
    if !crate::support::python_has(&["mcp", "uvicorn"]) || !crate::support::namespace_available() {
        return;
    }
    let server = McpServer::start("good", TOKEN);
    let remote = format!("http://127.0.0.1:{}", server.port);
    let gate_up = Recorder::start("content-length", gate);
    let home = tempfile::Builder::new()
        .prefix("airlock-live-remote-")
        .tempdir()
        .unwrap();
    let env = base_env(home.path(), None);
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, a_key) = create_org(&env, "A", &[]);
    let a = Some(a_key.as_str());
    let conn = json!({"name": "remote", "integration": "remote", "type": "bearer",
        "fields": {"token": TOKEN}});
    let (st, v) = s.call("POST", "/v1/connections", a, Some(&conn));
    assert_eq!(st, 201, "{v}");
    let manifest = format!(
        "[agent]\nname = \"live-remote\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 150\n\n\
         [network]\negress = \"none\"\n\n\
         [[integrations]]\nnamespace = \"remote\"\nconnection = \"remote\"\n\
         authorized_uris = [\"{remote}/**\"]\n\
         delivery = {{ header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }}\n\
         source = {{ kind = \"remote\", url = \"{remote}/mcp\" }}\n\n\
         [[integrations.rules]]\nid = \"mcp\"\nhost = \"{remote}\"\naccess = \"full\"\npaths = [\"/mcp\", \"/mcp/**\"]\n\n\
         [[integrations]]\nnamespace = \"gate\"\nauthorized_uris = [\"http://{g}/**\"]\n",
        g = gate_up.addr
    );
    let body = json!({"manifest": manifest, "files": {"agent.py": mcp_agent(AGENT)}});
    let (st, v) = s.call("POST", "/v1/agents", a, Some(&body));
    assert_eq!(st, 201, "{v}");
    let (st, run) = s.call(
        "POST",
        "/v1/runs",
        a,
        Some(&json!({"agent": "live-remote", "prompt": format!("http://{}", gate_up.addr)})),
    );
    assert_eq!(st, 202, "{run}");
    let id = run["id"].as_str().unwrap().to_owned();
    let logs = |pred: &dyn Fn(&str) -> bool| {
        wait_for(
            &s,
            &format!("/v1/runs/{id}/logs?after=0"),
            &a_key,
            90,
            |v| pred(&v.to_string()),
        )
        .to_string()
    };

    // The legitimate call, before the change, completes.
    let before = logs(&|t| t.contains("BEFORE"));
    assert!(
        before.contains("before the change") && before.contains(r#"\"isError\": false"#),
        "{before}"
    );
    // The agent waits at the gate: the narrowing is applied before the answer.
    let deadline = Instant::now() + Duration::from_secs(60);
    while gate_up.seen().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the agent never reached the gate"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let narrowed = json!({"rules": {"integrations": {"remote": [
        {"id": "mcp-read", "host": remote, "access": "read-only", "paths": ["/mcp"]},
    ]}}});
    let (st, p) = s.call(
        "PATCH",
        &format!("/v1/runs/{id}/policy?wait=true"),
        a,
        Some(&narrowed),
    );
    assert_eq!(st, 200, "{p}");
    assert_eq!(p["applied_version"], 1, "{p}");
    let posted = posts(&server);
    GATE_OPEN.store(true, Ordering::Release);

    // The attacker's call after it: refused, the rule named; never sent.
    let after = logs(&|t| t.contains("AFTER"));
    let line: String = after
        .split("AFTER ")
        .nth(1)
        .unwrap_or_default()
        .chars()
        .take(2000)
        .collect();
    assert!(
        line.contains("rule_refused") && line.contains("mcp-read"),
        "{line}"
    );
    let done = wait_for(&s, &format!("/v1/runs/{id}"), &a_key, 90, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    assert_eq!(done["status"], "succeeded", "{done}\n{}", s.log_text());
    assert_eq!(
        posts(&server),
        posted,
        "the server saw a POST after the narrowing: {:?}",
        server.seen()
    );
    assert!(!after.contains(TOKEN), "the credential reached the agent");
}

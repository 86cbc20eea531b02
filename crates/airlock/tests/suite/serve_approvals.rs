//! Human approval through a real `airlock serve` (docs/egress.md, "Human
//! approval"): a run's `api_call` under an `ask` rule is held until a key
//! of its organization answers; another organization cannot see or answer
//! it (404, still pending); allow for the run lets the next matching
//! request through unheld; deny refuses with `approval_denied`; the agent
//! cannot reach `/v1` or the internal API to answer for itself; nothing of
//! the request's query or body is in the pending event or the audit.

use std::io::Write as _;
use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::support::serve::{
    Recorder, Server, base_env, create_org, mcp_agent, start_agent, wait_for,
};

const CANARY: &str = "canary-approval-7Qx2";

/// Three calls: two POSTs the `write` rule holds, one DELETE the `del`
/// rule holds; then the agent tries to answer for itself, through the
/// server's API and through the internal API's path on its MCP endpoint.
const AGENT_REST: &str = r#"
def call(method, path):
    args = {"target": UPSTREAM + path + "?secret=" + CANARY, "method": method, "body": "body-" + CANARY}
    return mcp("tools/call", {"name": "svc__api_call", "arguments": args})
"#;

fn agent(server: &str) -> String {
    let own = format!(
        r#"
CANARY = "{CANARY}"
SERVER = "{server}"
forged = []
for url in [SERVER + "/v1/runs", MCP.rsplit("/", 1)[0] + "/internal/v1/approvals"]:
    try:
        req = urllib.request.Request(url, data=b"{{}}", headers={{"content-type": "application/json"}}, method="POST")
        urllib.request.build_opener(urllib.request.ProxyHandler({{}})).open(req, timeout=5)
        forged.append(url)
    except Exception as e:
        pass
print("FORGED " + json.dumps(forged), flush=True)
print("FIRST " + json.dumps(call("POST", "/items/1")), flush=True)
print("SECOND " + json.dumps(call("POST", "/items/2")), flush=True)
print("THIRD " + json.dumps(call("DELETE", "/items/3")), flush=True)
"#
    );
    mcp_agent(&format!("{AGENT_REST}{own}"))
}

fn manifest(upstream: SocketAddr) -> String {
    format!(
        "[agent]\nname = \"asker\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 120\n\n\
         [network]\negress = \"none\"\n\n[[integrations]]\nnamespace = \"svc\"\n\
         authorized_uris = [\"http://{upstream}/**\"]\n\n\
         [[integrations.rules]]\nid = \"read\"\nhost = \"http://{upstream}\"\naccess = \"read-only\"\n\n\
         [[integrations.rules]]\nid = \"write\"\nhost = \"http://{upstream}\"\nmethods = [\"POST\"]\naction = \"ask\"\ntimeout = 90\n\n\
         [[integrations.rules]]\nid = \"del\"\nhost = \"http://{upstream}\"\nmethods = [\"DELETE\"]\naction = \"ask\"\ntimeout = 90\n"
    )
}

fn pending(s: &Server, key: &str, run: &str, n: usize) -> Value {
    let v = wait_for(s, &format!("/v1/runs/{run}/approvals"), key, 60, |v| {
        v["approvals"].as_array().is_some_and(|a| {
            a.iter().filter(|x| x["state"] == "pending").count() == 1 && a.len() == n
        })
    });
    v["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["state"] == "pending")
        .unwrap()
        .clone()
}

fn answer(s: &Server, key: &str, run: &str, id: &str, decision: &str) -> (u16, Value) {
    s.call(
        "POST",
        &format!("/v1/runs/{run}/approvals/{id}"),
        Some(key),
        Some(&json!({"decision": decision})),
    )
}

/// A server on the namespace backend, organization A's key, a loopback
/// upstream that answers `ok`, and a run of agent `name` (its manifest
/// made for the upstream's address, its script for the server) started
/// with the upstream's URL as its prompt.
struct Started {
    _home: tempfile::TempDir,
    env: Vec<(String, String)>,
    s: Server,
    a: String,
    up: Recorder,
    run: String,
}

fn start(
    name: &str,
    manifest: impl Fn(SocketAddr) -> String,
    script: impl Fn(&Server) -> String,
) -> Option<Started> {
    if !crate::support::namespace_available() {
        return None;
    }
    let home = tempfile::Builder::new()
        .prefix("airlock-approvals-")
        .tempdir()
        .unwrap();
    let env = base_env(home.path(), None);
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, a) = create_org(&env, "A", &[]);
    let up = Recorder::start("content-length", |mut c, _, _| {
        let _ = write!(
            c,
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
        );
    });
    let prompt = format!("http://{}", up.addr);
    let run = start_agent(&s, &a, (name, &manifest(up.addr)), &script(&s), &prompt);
    Some(Started {
        _home: home,
        env,
        s,
        a,
        up,
        run,
    })
}

#[test]
fn a_held_request_waits_for_its_organization_and_no_one_else() {
    let Some(Started {
        _home,
        env,
        s,
        a,
        up,
        run,
    }) = start("asker", manifest, |s| agent(&s.url("")))
    else {
        return;
    };
    let (_, b) = create_org(&env, "B", &[]);

    // The first POST is held: described, without its query or body.
    let first = pending(&s, &a, &run, 1);
    assert_eq!(
        (
            first["method"].as_str(),
            first["path"].as_str(),
            first["rule"].as_str()
        ),
        (Some("POST"), Some("/items/1"), Some("write")),
        "{first}"
    );
    assert_eq!(first["integration"], "svc");
    let id = first["id"].as_str().unwrap().to_owned();
    assert!(up.seen().is_empty(), "nothing left before the answer");

    // Another organization: the run and the approval are unknown to it.
    assert_eq!(answer(&s, &b, &run, &id, "allow_once").0, 404);
    assert_eq!(
        s.call("GET", &format!("/v1/runs/{run}/approvals"), Some(&b), None)
            .0,
        404
    );
    let still = pending(&s, &a, &run, 1);
    assert_eq!(still["id"], first["id"]);
    // The run says one request waits, in its answer and in its
    // organization's list; another organization's list shows neither.
    let (_, one) = s.call("GET", &format!("/v1/runs/{run}"), Some(&a), None);
    assert_eq!(one["pending_approvals"], 1, "{one}");
    let (_, list) = s.call("GET", "/v1/runs", Some(&a), None);
    let listed = list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == run.as_str());
    assert_eq!(
        listed.map(|r| r["pending_approvals"].clone()),
        Some(json!(1)),
        "{list}"
    );
    let (_, theirs) = s.call("GET", "/v1/runs", Some(&b), None);
    assert_eq!(theirs["runs"], json!([]), "{theirs}");

    // The pending event on the run's stream.
    let (_, events) = s.call(
        "GET",
        &format!("/v1/runs/{run}/events?after=0"),
        Some(&a),
        None,
    );
    let text = events.to_string();
    assert!(text.contains("approval.pending"), "{text}");

    // Allowed for the run: answered once, the second POST is not held.
    let (st, v) = answer(&s, &a, &run, &id, "allow_run");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "allowed_run");
    assert!(v["answered_by"].is_string(), "{v}");
    assert_eq!(answer(&s, &a, &run, &id, "deny").0, 409, "answered twice");

    // The DELETE is held by its own rule: denied.
    let del = pending(&s, &a, &run, 2);
    assert_eq!(
        (del["method"].as_str(), del["rule"].as_str()),
        (Some("DELETE"), Some("del"))
    );
    let (st, v) = answer(&s, &a, &run, del["id"].as_str().unwrap(), "deny");
    assert_eq!(st, 200, "{v}");

    let done = wait_for(&s, &format!("/v1/runs/{run}"), &a, 60, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    assert!(
        done.get("pending_approvals").is_none(),
        "an ended run holds nothing: {done}"
    );
    assert_eq!(done["status"], "succeeded", "{done}\n{}", s.log_text());
    let logs = s
        .call(
            "GET",
            &format!("/v1/runs/{run}/logs?after=0"),
            Some(&a),
            None,
        )
        .1
        .to_string();
    assert!(
        logs.contains("FORGED []"),
        "the agent reached an API: {logs}"
    );
    assert!(logs.contains("approval_denied"), "{logs}");
    let lines: Vec<String> = up.seen().into_iter().map(|(l, _)| l).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with("POST /items/1?secret="), "{lines:?}");
    assert!(lines[1].starts_with("POST /items/2?secret="), "{lines:?}");

    // Two approvals only: the second POST went through unheld.
    let (_, list) = s.call("GET", &format!("/v1/runs/{run}/approvals"), Some(&a), None);
    let states: Vec<&str> = list["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["allowed_run", "denied"], "{list}");

    // The audit: the holds and their answers, who gave them; no canary.
    let (st, _, audit) = s.raw(
        "GET",
        &format!("/v1/runs/{run}/audit.jsonl"),
        Some(&a),
        None,
        "",
    );
    assert_eq!(st, 200);
    let audit = String::from_utf8(audit).unwrap();
    let approvals: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["kind"] == "approval")
        .collect();
    assert_eq!(approvals.len(), 4, "{audit}");
    assert!(approvals.iter().any(|r| r["decision"] == "held"));
    assert!(
        approvals
            .iter()
            .any(|r| r["outcome"] == "allowed_run" && r["decider"] == "person")
    );
    assert!(
        approvals
            .iter()
            .any(|r| r["outcome"] == "denied" && r["answered_by"].is_string())
    );
    for text in [&audit, &text, &list.to_string()] {
        assert!(!text.contains(CANARY), "the query or body leaked: {text}");
    }
}

/// No answer within the rule's timeout refuses the request
/// (`approval_timeout`); a request still held when its run ends is
/// dropped, and answering it then is a 409.
#[test]
fn no_answer_times_out_and_a_runs_end_drops_what_it_holds() {
    let manifest = |u: SocketAddr| {
        format!(
            "[agent]\nname = \"waiter\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 120\n\n\
         [network]\negress = \"none\"\n\n[[integrations]]\nnamespace = \"svc\"\n\
         authorized_uris = [\"http://{u}/**\"]\n\n\
         [[integrations.rules]]\nid = \"quick\"\nhost = \"http://{u}\"\nmethods = [\"POST\"]\naction = \"ask\"\ntimeout = 1\n\n\
         [[integrations.rules]]\nid = \"slow\"\nhost = \"http://{u}\"\nmethods = [\"DELETE\"]\naction = \"ask\"\ntimeout = 600\n",
            u = u
        )
    };
    let script = mcp_agent(
        r#"
def call(method, path):
    return mcp("tools/call", {"name": "svc__api_call", "arguments": {"target": UPSTREAM + path, "method": method}})
print("QUICK " + json.dumps(call("POST", "/q")), flush=True)
print("SLOW " + json.dumps(call("DELETE", "/s")), flush=True)
"#,
    );
    let Some(Started {
        _home,
        s,
        a,
        up,
        run,
        ..
    }) = start("waiter", manifest, |_| script.clone())
    else {
        return;
    };

    // The POST expires unanswered; the DELETE is then held.
    let slow = pending(&s, &a, &run, 2);
    assert_eq!(slow["rule"], "slow");
    let (_, list) = s.call("GET", &format!("/v1/runs/{run}/approvals"), Some(&a), None);
    assert_eq!(list["approvals"][0]["state"], "expired", "{list}");
    assert_eq!(list["approvals"][0]["answered_by"], Value::Null);

    // The run ends while the DELETE is held: dropped, unanswerable.
    let (st, v) = s.call("POST", &format!("/v1/runs/{run}/cancel"), Some(&a), None);
    assert_eq!(st, 202, "{v}");
    wait_for(&s, &format!("/v1/runs/{run}"), &a, 60, |v| {
        v["status"] == "cancelled"
    });
    let list = wait_for(&s, &format!("/v1/runs/{run}/approvals"), &a, 30, |v| {
        v["approvals"][1]["state"] == "dropped"
    });
    assert_eq!(list["approvals"][0]["state"], "expired");
    let (st, v) = answer(&s, &a, &run, slow["id"].as_str().unwrap(), "allow_once");
    assert_eq!(st, 409, "{v}");
    assert!(
        up.seen().is_empty(),
        "nothing held was sent: {:?}",
        up.seen()
    );
    let logs = s
        .call(
            "GET",
            &format!("/v1/runs/{run}/logs?after=0"),
            Some(&a),
            None,
        )
        .1
        .to_string();
    assert!(logs.contains("approval_timeout"), "{logs}");
}

/// The forward proxy holds a plain-HTTP request an `ask` rule of
/// `[network]` matches: allowed once it goes on (and the next one is held
/// again), denied it is refused with `approval_denied`.
#[test]
fn the_forward_proxy_holds_a_request_for_its_answer() {
    let manifest = |u: SocketAddr| {
        format!(
            "[agent]\nname = \"proxied\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 120\n\n\
         [network]\negress = [\"http://{u}/**\"]\n\n\
         [[network.rules]]\nid = \"net-ask\"\nhost = \"http://{u}\"\naccess = \"full\"\naction = \"ask\"\ntimeout = 90\n",
            u = u
        )
    };
    let script = r#"
import os, urllib.request, urllib.error
# The upstream is on the host's loopback: through the proxy, whatever
# NO_PROXY says of 127.0.0.1.
os.environ.pop("NO_PROXY", None)
os.environ.pop("no_proxy", None)
up = open(os.environ["AIRLOCK_PROMPT_FILE"]).read().strip()
for path in ["/one", "/two"]:
    try:
        with urllib.request.urlopen(up + path, timeout=100) as r:
            print("GOT", path, r.status, r.read().decode(), flush=True)
    except urllib.error.HTTPError as e:
        print("REFUSED", path, e.code, e.read().decode(), flush=True)
"#;
    let Some(Started {
        _home,
        s,
        a,
        up,
        run,
        ..
    }) = start("proxied", manifest, |_| script.to_owned())
    else {
        return;
    };

    let one = pending(&s, &a, &run, 1);
    assert_eq!(
        (one["path"].as_str(), one["integration"].clone()),
        (Some("/one"), Value::Null)
    );
    assert!(up.seen().is_empty());
    assert_eq!(
        answer(&s, &a, &run, one["id"].as_str().unwrap(), "allow_once").0,
        200
    );
    let two = pending(&s, &a, &run, 2);
    assert_eq!(
        two["path"], "/two",
        "allowed once: the next one is held again"
    );
    assert_eq!(
        answer(&s, &a, &run, two["id"].as_str().unwrap(), "deny").0,
        200
    );
    let done = wait_for(&s, &format!("/v1/runs/{run}"), &a, 60, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    assert_eq!(done["status"], "succeeded", "{done}");
    let logs = s
        .call(
            "GET",
            &format!("/v1/runs/{run}/logs?after=0"),
            Some(&a),
            None,
        )
        .1
        .to_string();
    assert!(logs.contains("GOT /one 200 ok"), "{logs}");
    assert!(logs.contains("REFUSED /two 403"), "{logs}");
    assert!(logs.contains("approval_denied"), "{logs}");
    let lines: Vec<String> = up.seen().into_iter().map(|(l, _)| l).collect();
    assert_eq!(lines, ["GET /one HTTP/1.1"], "{lines:?}");
}

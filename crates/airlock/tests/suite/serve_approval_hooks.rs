//! The approval webhooks through a real `airlock serve` (docs/egress.md,
//! "Human approval"): a request held by an `ask` rule is announced to the
//! organization's webhook as `approval.pending` (method, host, path,
//! integration, rule, approval id, run id, expiry) exactly once, even when
//! the receiver fails first (the outbox retries it under the same delivery
//! id), and its answer as `approval.settled` (who answered). From the
//! attacker's side: a canary the agent put in the held request's query,
//! headers and body is in no delivery, and every delivery is signed.

use std::io::Write as _;

use serde_json::{Value, json};

use crate::support::serve::{
    Receiver, Recorder, Server, base_env, create_org, mcp_agent, signature_ok, wait_for,
};

pub(crate) const CANARY: &str = "canary-hook-Zr81";

const AGENT: &str = r#"
CANARY = "canary-hook-Zr81"
args = {"target": UPSTREAM + "/items/7?secret=" + CANARY, "method": "POST",
        "headers": {"X-Secret": "hdr-" + CANARY}, "body": "body-" + CANARY}
print("HELD " + json.dumps(mcp("tools/call", {"name": "svc__api_call", "arguments": args})), flush=True)
"#;

fn manifest(name: &str, upstream: std::net::SocketAddr) -> String {
    format!(
        "[agent]\nname = \"{name}\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 120\n\n\
         [network]\negress = \"none\"\n\n[[integrations]]\nnamespace = \"svc\"\n\
         authorized_uris = [\"http://{upstream}/**\"]\n\n\
         [[integrations.rules]]\nid = \"write\"\nhost = \"http://{upstream}\"\nmethods = [\"POST\"]\naction = \"ask\"\ntimeout = 90\n"
    )
}

/// Registers agent `name` in `key`'s organization: one POST to a loopback
/// upstream that answers `ok` (returned), with [`CANARY`] in its query, a
/// header and its body, held by the `ask` rule `write`. Its runs' prompt
/// is the upstream's URL.
pub(crate) fn held_agent(s: &Server, key: &str, name: &str) -> Recorder {
    let up = Recorder::start("content-length", |mut c, _, _| {
        let _ = write!(
            c,
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
        );
    });
    let body =
        json!({"manifest": manifest(name, up.addr), "files": {"agent.py": mcp_agent(AGENT)}});
    let (st, v) = s.call("POST", "/v1/agents", Some(key), Some(&body));
    assert!(st == 201 || st == 200, "{st} {v}");
    up
}

/// A run of [`held_agent`] `name`: its upstream and the run's id.
pub(crate) fn held_run(s: &Server, key: &str, name: &str) -> (Recorder, String) {
    let up = held_agent(s, key, name);
    let (st, run) = s.call(
        "POST",
        "/v1/runs",
        Some(key),
        Some(&json!({"agent": name, "prompt": format!("http://{}", up.addr)})),
    );
    assert_eq!(st, 202, "{run}");
    (up, run["id"].as_str().unwrap().to_owned())
}

/// The first approval of `run` once it is pending.
pub(crate) fn first_pending(s: &Server, key: &str, run: &str) -> Value {
    let list = wait_for(s, &format!("/v1/runs/{run}/approvals"), key, 60, |v| {
        v["approvals"][0]["state"] == "pending"
    });
    list["approvals"][0].clone()
}

/// The deliveries received so far, each `(its index, its body)`, of `event`.
fn of(rx: &Receiver, event: &str) -> Vec<(usize, Value)> {
    rx.received()
        .iter()
        .enumerate()
        .map(|(n, r)| (n, serde_json::from_slice::<Value>(&r.body).unwrap()))
        .filter(|(_, v)| v["type"] == event)
        .collect()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "waited for {what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_held_request_is_announced_once_by_webhook_without_its_secrets() {
    if !crate::support::namespace_available() {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("airlock-approval-hooks-")
        .tempdir()
        .unwrap();
    let mut env = base_env(home.path(), None);
    env.push(("WEBHOOK_RETRY_BASE_MS".into(), "100".into()));
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, a) = create_org(&env, "A", &[]);
    let (_, b) = create_org(&env, "B", &[]);

    // A's receiver fails its first delivery; B subscribes too and must hear nothing.
    let rx = Receiver::start(|n| if n == 0 { 500 } else { 204 });
    let rx_b = Receiver::start(|_| 204);
    let mut secret = String::new();
    for (key, r, keep) in [(&a, &rx, true), (&b, &rx_b, false)] {
        let (st, hook) = s.call(
            "POST",
            "/v1/webhooks",
            Some(key),
            Some(&json!({"url": format!("http://{}/hook", r.addr),
                         "events": ["approval.pending", "approval.settled"]})),
        );
        assert_eq!(st, 201, "{hook}");
        if keep {
            secret = hook["secret"].as_str().unwrap().to_owned();
        }
    }
    let (up, run) = held_run(&s, &a, "hooked");

    // Held: the pending delivery fails once, then arrives, one id both times.
    let held = first_pending(&s, &a, &run);
    wait_until("the retried approval.pending", || {
        of(&rx, "approval.pending").len() >= 2
    });
    let pending = of(&rx, "approval.pending");
    assert_eq!(pending[0].0, 0, "the first delivery is the one refused");
    assert!(pending.iter().all(|(_, v)| v["id"] == pending[0].1["id"]));
    let (_, p) = &pending[1];
    let d = &p["data"]["approval"];
    assert_eq!(d["id"], held["id"], "{p}");
    assert_eq!(d["run_id"], run.as_str());
    assert_eq!(p["data"]["run"]["id"], run.as_str());
    assert_eq!(
        (
            d["method"].as_str(),
            d["host"].as_str(),
            d["path"].as_str(),
            d["integration"].as_str(),
            d["rule"].as_str(),
            d["state"].as_str(),
        ),
        (
            Some("POST"),
            Some(up.addr.to_string().as_str()),
            Some("/items/7"),
            Some("svc"),
            Some("write"),
            Some("pending"),
        ),
        "{p}"
    );
    assert_eq!(d["expires_at"], held["expires_at"]);
    assert!(up.seen().is_empty(), "nothing left before the answer");

    // Answered: the request goes on, the settlement names who answered.
    let (st, v) = s.call(
        "POST",
        &format!("/v1/runs/{run}/approvals/{}", held["id"].as_str().unwrap()),
        Some(&a),
        Some(&json!({"decision": "allow_once"})),
    );
    assert_eq!(st, 200, "{v}");
    let done = wait_for(&s, &format!("/v1/runs/{run}"), &a, 60, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    assert_eq!(done["status"], "succeeded", "{done}\n{}", s.log_text());
    assert_eq!(up.seen().len(), 1, "{:?}", up.seen());
    wait_until("approval.settled", || {
        !of(&rx, "approval.settled").is_empty()
    });
    let settled = of(&rx, "approval.settled");
    assert_eq!(settled.len(), 1, "{settled:?}");
    let d = &settled[0].1["data"]["approval"];
    assert_eq!(
        (d["id"].clone(), d["state"].as_str()),
        (held["id"].clone(), Some("allowed_once"))
    );
    assert_eq!(d["answered_by"], v["answered_by"]);
    assert!(d["answered_by"].is_string(), "{d}");

    // Every delivery: signed, of its event, and without the canary.
    let got = rx.received();
    assert_eq!(got.len(), 3, "one retry, each event once");
    for r in &got {
        assert!(signature_ok(r, &secret), "bad signature: {:?}", r.headers);
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(r.header("airlock-event"), v["type"].as_str());
        let text = format!("{:?} {}", r.headers, String::from_utf8_lossy(&r.body));
        assert!(!text.contains(CANARY), "the held request leaked: {text}");
    }
    assert!(
        rx_b.received().is_empty(),
        "another organization heard of it"
    );
    let (_, hooks) = s.call("GET", "/v1/webhooks", Some(&a), None);
    let hook = hooks["webhooks"][0]["id"].as_str().unwrap().to_owned();
    let (_, list) = s.call(
        "GET",
        &format!("/v1/webhooks/{hook}/deliveries?limit=100"),
        Some(&a),
        None,
    );
    let list = list["deliveries"].as_array().unwrap().clone();
    assert_eq!(list.len(), 2, "{list:?}");
    assert!(list.iter().all(|d| d["state"] == "delivered"), "{list:?}");
}

//! A running run's live policy through a real `airlock serve` (docs/egress.md,
//! "Live policy"): from the attacker's side, another organization's PATCH
//! is a 404, a PATCH wider than the manifest a 422 naming the rule, one
//! without a key a 401, and each changes nothing; after a narrowing, a
//! method the rules no longer allow slips past neither `api_call` nor the
//! forward proxy, and never reaches the upstream. The legitimate path: a
//! request admitted before the narrowing completes under the old rules,
//! the narrowing refuses with the rule named, a reset allows again, every
//! change is on the run's stream and in its audit with its key, and an
//! ended run refuses a change.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::serve::{
    Recorder, Server, answer_when_released, base_env, create_org, line_starting, mcp_agent,
    succeeded_lines,
};

/// Released by the test: the request held across the narrowing, and the
/// gate the agent waits at until the rules are reset.
static SLOW_RELEASED: AtomicBool = AtomicBool::new(false);
static GATE_OPEN: AtomicBool = AtomicBool::new(false);

/// Answers 200 to anything; holds `/data/slow` and `/gate` until released.
fn answer(c: std::net::TcpStream, first: &str, _: &str) {
    answer_when_released(
        c,
        first,
        &[(" /data/slow ", &SLOW_RELEASED), (" /gate", &GATE_OPEN)],
    );
}

/// The agent: each step's outcome printed as one line.
const AGENT_REST: &str = r#"
import urllib.error, urllib.request
def call(m, p):
    out = mcp("tools/call", {"name": "up__api_call", "arguments": {"target": UPSTREAM + p, "method": m}})
    print("API " + m + " " + p + " " + json.dumps(out), flush=True)
def proxy(m, p):
    req = urllib.request.Request(UPSTREAM + p, method=m, data=b"x" if m == "POST" else None)
    # Through the run's forward proxy, though NO_PROXY names loopback (the
    # upstream's address; the sidecar's own listeners are there too).
    os.environ.pop("NO_PROXY", None)
    os.environ.pop("no_proxy", None)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": os.environ["HTTP_PROXY"]}))
    try:
        with opener.open(req, timeout=30) as r:
            code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    print("PROXY " + m + " " + p + " " + str(code), flush=True)
call("POST", "/data/slow")
call("POST", "/data/after")
proxy("POST", "/data/after-proxy")
call("GET", "/data/read")
call("GET", "/gate")
call("POST", "/data/again")
proxy("POST", "/data/again-proxy")
"#;

fn manifest(host: &str) -> String {
    format!(
        "[agent]\nname = \"steer\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 120\n\n\
         [network]\negress = [\"{host}/**\"]\n\n\
         [[network.rules]]\nid = \"net-data\"\nhost = \"{host}\"\naccess = \"read-write\"\npaths = [\"/data/**\"]\n\n\
         [[integrations]]\nnamespace = \"up\"\nauthorized_uris = [\"{host}/**\"]\n\n\
         [[integrations.rules]]\nid = \"data\"\nhost = \"{host}\"\naccess = \"read-write\"\npaths = [\"/data/**\"]\n\n\
         [[integrations.rules]]\nid = \"gate\"\nhost = \"{host}\"\naccess = \"read-only\"\npaths = [\"/gate\"]\n"
    )
}

/// Every list narrowed to reading.
fn read_only(host: &str) -> Value {
    json!({"rules": {
        "network": [{"id": "net-read", "host": host, "access": "read-only", "paths": ["/data/**"]}],
        "integrations": {"up": [
            {"id": "data-read", "host": host, "access": "read-only", "paths": ["/data/**"]},
            {"id": "gate", "host": host, "access": "read-only", "paths": ["/gate"]},
        ]},
    }})
}

/// Waits until the upstream saw a request whose first line holds `what`;
/// on failure says where the run `id` (of the organization of `key`) is
/// and what its agent printed.
fn wait_seen(up: &Recorder, what: &str, s: &Server, id: &str, key: Option<&str>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !up.seen().iter().any(|(l, _)| l.contains(what)) {
        assert!(
            Instant::now() < deadline,
            "the upstream never saw {what}; saw {:?}\nthe run: {}\nits logs: {}\n{}",
            up.seen(),
            s.call("GET", &format!("/v1/runs/{id}"), key, None).1,
            s.call("GET", &format!("/v1/runs/{id}/logs"), key, None).1,
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_running_runs_policy_narrows_and_widens_within_its_manifest_for_its_organization_only() {
    let home = tempfile::Builder::new()
        .prefix("airlock-policy-")
        .tempdir()
        .unwrap();
    let up = Recorder::start("content-length", answer);
    let host = format!("http://{}", up.addr);
    let env = base_env(home.path(), None);
    let s = Server::start(&env, "process", home.path().join("serve.log"));
    let (_, a_key) = create_org(&env, "A", &[]);
    let (_, b_key) = create_org(&env, "B", &[]);
    let a = Some(a_key.as_str());
    let body = json!({"manifest": manifest(&host), "files": {"agent.py": mcp_agent(AGENT_REST)}});
    let (st, v) = s.call("POST", "/v1/agents", a, Some(&body));
    assert_eq!(st, 201, "{v}");
    let (st, run) = s.call(
        "POST",
        "/v1/runs",
        a,
        Some(&json!({"agent": "steer", "prompt": host})),
    );
    assert_eq!(st, 202, "{run}");
    let id = run["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/runs/{id}/policy");
    // The agent's first request is held by the upstream: the run is live.
    wait_seen(&up, "POST /data/slow", &s, &id, a);

    let (st, p) = s.call("GET", &path, a, None);
    assert_eq!(st, 200, "{p}");
    assert_eq!(
        (p["version"].clone(), p["actor"].clone()),
        (json!(0), json!("manifest"))
    );
    assert_eq!(p["rules"], p["manifest"]);
    assert_eq!(p["rules"]["integrations"]["up"][0]["id"], "data");

    // Another organization: the same answer as an unknown run, nothing changed.
    let b = Some(b_key.as_str());
    let (st, v) = s.call("PATCH", &path, b, Some(&read_only(&host)));
    assert_eq!(st, 404, "{v}");
    assert_eq!(s.call("GET", &path, b, None).0, 404);
    assert_eq!(
        s.call(
            "PATCH",
            "/v1/runs/run_nosuchrun/policy",
            a,
            Some(&read_only(&host))
        )
        .0,
        404
    );
    // No key: refused.
    assert_eq!(s.call("PATCH", &path, None, Some(&read_only(&host))).0, 401);
    // Wider than the manifest: a DELETE, and a path outside its rules.
    for (rule, widened) in [
        (
            "all",
            json!({"id": "all", "host": host, "access": "full", "paths": ["/data/**"]}),
        ),
        (
            "root",
            json!({"id": "root", "host": host, "access": "read-only", "paths": ["/**"]}),
        ),
    ] {
        let (st, v) = s.call(
            "PATCH",
            &path,
            a,
            Some(&json!({"rules": {"integrations": {"up": [widened]}}})),
        );
        assert_eq!(st, 422, "{v}");
        assert_eq!(v["error"]["code"], "beyond_manifest", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(rule),
            "{v}"
        );
    }
    let (_, p) = s.call("GET", &path, a, None);
    assert_eq!(p["version"], 0, "nothing changed: {p}");

    // The narrowing, applied by the sidecar before the answer.
    let (st, p) = s.call(
        "PATCH",
        &format!("{path}?wait=true"),
        a,
        Some(&read_only(&host)),
    );
    assert_eq!(st, 200, "{p}");
    assert_eq!(
        (p["version"].clone(), p["applied_version"].clone()),
        (json!(1), json!(1))
    );
    assert!(p["actor"].as_str().unwrap().starts_with("key "), "{p}");
    // The request admitted before it completes under the old rules.
    SLOW_RELEASED.store(true, Ordering::Release);
    // The agent reaches the gate once its refused requests were tried.
    wait_seen(&up, "GET /gate", &s, &id, a);
    // Widened back by the CLI, which returns once the sidecar applied it.
    let cli = |key: &str, extra: &[&str]| {
        let mut args = vec!["runs", "policy", id.as_str()];
        args.extend_from_slice(extra);
        std::process::Command::new(crate::support::AIRLOCK)
            .args(&args)
            .env_remove("DATABASE_URL")
            .env("AIRLOCK_HOME", "/nonexistent/never-used")
            .env("AIRLOCK_SERVER", format!("http://{}", s.addr))
            .env("AIRLOCK_API_KEY", key)
            .output()
            .unwrap()
    };
    let out = cli(&b_key, &["--reset"]);
    assert_eq!(out.status.code(), Some(1), "another organization's run");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no run"));
    let out = cli(&a_key, &["--reset"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (p["version"].clone(), p["applied_version"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(p["rules"], p["manifest"]);
    GATE_OPEN.store(true, Ordering::Release);
    let lines = succeeded_lines(&s, &a_key, &id, 90);
    let line = |prefix: &str| line_starting(&lines, prefix).to_owned();
    let ok = |l: &str| !l.contains("\"isError\": true");
    assert!(
        ok(&line("API POST /data/slow ")),
        "admitted before the change: {lines:#?}"
    );
    let after = line("API POST /data/after ");
    assert!(
        !ok(&after) && after.contains("rule_refused") && after.contains("data-read"),
        "{after}"
    );
    let (_, egress) = s.call("GET", &format!("/v1/runs/{id}/egress"), a, None);
    assert_eq!(
        line("PROXY POST /data/after-proxy "),
        "PROXY POST /data/after-proxy 403",
        "{egress:#}\nupstream saw {:?}\n{lines:#?}",
        up.seen()
    );
    assert!(ok(&line("API GET /data/read ")), "{lines:#?}");
    assert!(
        ok(&line("API POST /data/again ")),
        "allowed again after the reset: {lines:#?}"
    );
    assert_eq!(
        line("PROXY POST /data/again-proxy "),
        "PROXY POST /data/again-proxy 200"
    );
    let seen: Vec<String> = up.seen().into_iter().map(|(l, _)| l).collect();
    assert!(
        !seen.iter().any(|l| l.contains("/data/after")),
        "a refused request reached the upstream: {seen:?}"
    );

    // An ended run refuses a change; its policy still shows.
    let (st, v) = s.call("PATCH", &path, a, Some(&json!({"reset": true})));
    assert_eq!(st, 409, "{v}");
    assert_eq!(s.call("GET", &path, a, None).1["version"], 2);
    let out = cli(&a_key, &[]);
    assert!(out.status.success());
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["version"], 2);
    let out = cli(&a_key, &["--preset", "read-only", "--host", &host]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("409"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Each change is on the run's stream and in its audit, with its key.
    let (_, events) = s.call(
        "GET",
        &format!("/v1/runs/{id}/events?after=0&limit=100"),
        a,
        None,
    );
    let changes = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "policy_change")
        .count();
    assert_eq!(changes, 2, "{events}");
    let (st, _, audit) = s.raw("GET", &format!("/v1/runs/{id}/audit.jsonl"), a, None, "");
    assert_eq!(st, 200);
    let records: Vec<Value> = String::from_utf8(audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &Value| r["kind"] == "policy_change")
        .collect();
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records[0]["version"], 1);
    assert_eq!(records[0]["decider"], "api_key");
    assert!(records[0]["actor"].as_str().unwrap().starts_with("key "));
    assert!(
        records[0]["old_rules"]
            .as_array()
            .unwrap()
            .contains(&json!("integration:up:data"))
    );
    assert!(
        records[0]["new_rules"]
            .as_array()
            .unwrap()
            .contains(&json!("integration:up:data-read"))
    );
}

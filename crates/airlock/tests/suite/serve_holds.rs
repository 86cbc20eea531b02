//! Held requests through a real `airlock serve` and namespace runs, from
//! the agent's side (docs/egress.md, "Human approval"): the cap on what a
//! run holds at once, and a hold inside an intercepted HTTPS connection.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};

use crate::support::serve::{
    Recorder, Server, base_env, create_org, mcp_agent, start_agent, wait_for,
};

/// A server on the namespace backend with its environment's extra
/// variables, organization A's key, and a run of `manifest`'s agent
/// (`script`) started with `prompt`.
struct Started {
    _home: tempfile::TempDir,
    s: Server,
    a: String,
    run: String,
}

fn start(
    extra_env: &[(&str, String)],
    (name, manifest): (&str, String),
    script: &str,
    prompt: &str,
) -> Option<Started> {
    if !crate::support::namespace_available() {
        return None;
    }
    let home = tempfile::Builder::new()
        .prefix("airlock-holds-")
        .tempdir()
        .unwrap();
    let mut env = base_env(home.path(), None);
    env.extend(extra_env.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, a) = create_org(&env, "A", &[]);
    let run = start_agent(&s, &a, (name, &manifest), script, prompt);
    Some(Started {
        _home: home,
        s,
        a,
        run,
    })
}

fn approvals(s: &Server, key: &str, run: &str) -> Vec<Value> {
    let (st, v) = s.call("GET", &format!("/v1/runs/{run}/approvals"), Some(key), None);
    assert_eq!(st, 200, "{v}");
    v["approvals"].as_array().cloned().unwrap_or_default()
}

fn approvals_when(s: &Server, key: &str, run: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let v = wait_for(s, &format!("/v1/runs/{run}/approvals"), key, 90, |v| {
        v["approvals"].as_array().is_some_and(|a| pred(a))
    });
    v["approvals"].as_array().cloned().unwrap_or_default()
}

fn pending(list: &[Value]) -> usize {
    list.iter().filter(|x| x["state"] == "pending").count()
}

fn answer(s: &Server, key: &str, run: &str, id: &str, decision: &str) -> (u16, Value) {
    s.call(
        "POST",
        &format!("/v1/runs/{run}/approvals/{id}"),
        Some(key),
        Some(&json!({"decision": decision})),
    )
}

fn logs_when(s: &Server, key: &str, run: &str, pred: impl Fn(&str) -> bool) -> String {
    wait_for(s, &format!("/v1/runs/{run}/logs?after=0"), key, 90, |v| {
        pred(&v.to_string())
    })
    .to_string()
}

/// Set once the test saw the run hold as many requests as it may: the
/// cap test's upstream then answers `GET /go` with `go`.
static GO: AtomicBool = AtomicBool::new(false);

/// The cap test's agent: eight POSTs at once (each held), then, once the
/// upstream says go, a ninth (refused at once), then, once one of the eight
/// came back, a tenth (held: a place was freed). Its own call (the
/// prelude's times out at 30 s; a hold may wait longer).
const CAP_AGENT: &str = r#"
import threading, time, concurrent.futures as cf
LOCK = threading.Lock()

def call(method, path):
    with LOCK:
        state["n"] += 1
        i = state["n"]
    msg = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
           "params": {"name": "svc__api_call", "arguments": {"target": UPSTREAM + path, "method": method}}}
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream",
         "mcp-protocol-version": "2025-11-25", "mcp-session-id": state["sid"]}
    req = urllib.request.Request(MCP, data=json.dumps(msg).encode(), headers=h, method="POST")
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=600) as r:
        body = r.read().decode()
    if body.lstrip().startswith("{"):
        return json.loads(body)
    for line in body.splitlines():
        if line.startswith("data:") and line[5:].strip():
            return json.loads(line[5:])

pool = cf.ThreadPoolExecutor(max_workers=10)
held = [pool.submit(call, "POST", "/held/%d" % i) for i in range(8)]
def said(r):
    try:
        return r["result"]["content"][0]["text"]
    except (KeyError, IndexError, TypeError):
        return None
while said(call("GET", "/go")) != "go":
    time.sleep(0.1)
t0 = time.monotonic()
ninth = call("POST", "/ninth")
print("NINTH %.3f %s" % (time.monotonic() - t0, json.dumps(ninth)), flush=True)
done, _ = cf.wait(held, return_when=cf.FIRST_COMPLETED)
print("FREED " + json.dumps([f.result() for f in done]), flush=True)
tenth = pool.submit(call, "POST", "/tenth")
print("TENTH " + json.dumps(tenth.result()), flush=True)
"#;

/// Eight requests held at once are the run's cap: a ninth is refused at
/// once, `approval_cap` (429), while the eight stay pending and nothing of
/// the ninth is stored or sent; answering one lets it through and frees
/// its place (the next request is held again, not refused); what was never
/// allowed never reaches the upstream, and the run's end drops it.
#[test]
fn the_ninth_held_request_is_refused_at_once_and_an_answer_frees_a_place() {
    let up = Recorder::start("content-length", |mut c, first, _| {
        let body = if first.starts_with("GET /go") && GO.load(Ordering::SeqCst) {
            "go"
        } else {
            "ok"
        };
        let _ = write!(
            c,
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
    });
    let u: SocketAddr = up.addr;
    let manifest = format!(
        "[agent]\nname = \"capped\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 300\n\n\
         [network]\negress = \"none\"\n\n[[integrations]]\nnamespace = \"svc\"\n\
         authorized_uris = [\"http://{u}/**\"]\n\n\
         [[integrations.rules]]\nid = \"read\"\nhost = \"http://{u}\"\naccess = \"read-only\"\n\n\
         [[integrations.rules]]\nid = \"write\"\nhost = \"http://{u}\"\nmethods = [\"POST\"]\naction = \"ask\"\ntimeout = 600\n"
    );
    let Some(Started { _home, s, a, run }) = start(
        &[],
        ("capped", manifest),
        &mcp_agent(CAP_AGENT),
        &format!("http://{u}"),
    ) else {
        return;
    };
    let posts = || {
        up.seen()
            .into_iter()
            .map(|(l, _)| l)
            .filter(|l| l.starts_with("POST "))
            .collect::<Vec<_>>()
    };

    // Eight held at once; nothing of them sent.
    let eight = approvals_when(&s, &a, &run, |l| l.len() == 8 && pending(l) == 8);
    assert!(posts().is_empty(), "{:?}", posts());
    GO.store(true, Ordering::SeqCst);

    // The ninth: refused at once, by name, while the eight wait.
    let logs = logs_when(&s, &a, &run, |t| t.contains("NINTH"));
    let line: String = logs
        .split("NINTH ")
        .nth(1)
        .unwrap_or_default()
        .chars()
        .take(1500)
        .collect();
    assert!(
        line.contains("approval_cap") && line.contains(r#"\"status\": 429"#),
        "{line}"
    );
    let secs: f64 = line.split(' ').next().and_then(|t| t.parse().ok()).unwrap();
    assert!(secs < 20.0, "refused at once, not after a hold: {secs} s");
    let now = approvals(&s, &a, &run);
    assert_eq!((now.len(), pending(&now)), (8, 8), "{now:?}");

    // One allowed: it goes on, and a place is free for the tenth, held.
    let first = eight[0]["id"].as_str().unwrap();
    assert_eq!(answer(&s, &a, &run, first, "allow_once").0, 200);
    let nine = approvals_when(&s, &a, &run, |l| l.len() == 9 && pending(l) == 8);
    assert!(
        nine.iter()
            .any(|x| x["path"] == "/tenth" && x["state"] == "pending"),
        "{nine:?}"
    );
    let logs = logs_when(&s, &a, &run, |t| t.contains("FREED"));
    assert!(logs.contains(r#"\"isError\": false"#), "{logs}");
    let sent = posts();
    assert_eq!(sent.len(), 1, "only the allowed one was sent: {sent:?}");
    assert!(
        sent[0].starts_with(&format!("POST {} ", eight[0]["path"].as_str().unwrap())),
        "{sent:?}"
    );

    // The run's end drops the rest; none of them was ever sent.
    let (st, v) = s.call("POST", &format!("/v1/runs/{run}/cancel"), Some(&a), None);
    assert_eq!(st, 202, "{v}");
    let end = approvals_when(&s, &a, &run, |l| pending(l) == 0);
    assert_eq!(
        end.iter().filter(|x| x["state"] == "dropped").count(),
        8,
        "{end:?}"
    );
    assert_eq!(posts().len(), 1, "{:?}", posts());
}

/// An `ask` rule of `[network]` on an HTTPS host: the forward proxy opens
/// the CONNECT under the run's CA to judge each request in it. Allowed once,
/// the request goes on and the agent reads the upstream's answer; denied,
/// the agent gets `approval_denied` (403); the upstream (TLS on loopback)
/// saw only the allowed one.
#[test]
fn an_intercepted_https_request_is_held_for_its_answer() {
    use airlock_test_support::tls::{test_ca, upstream};
    let ca = test_ca();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (port, log) = rt.block_on(upstream("127.0.0.1", &ca));
    let u = format!("https://127.0.0.1:{port}");
    let manifest = format!(
        "[agent]\nname = \"tls-held\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 200\n\n\
         [network]\negress = [\"{u}/**\"]\n\n\
         [[network.rules]]\nid = \"tls-ask\"\nhost = \"{u}\"\nmethods = [\"GET\"]\naction = \"ask\"\ntimeout = 180\n"
    );
    let script = r#"
import os, urllib.request, urllib.error
# The upstream is on the host's loopback: through the proxy, whatever
# NO_PROXY says of 127.0.0.1; the run's CA is the trusted one.
os.environ.pop("NO_PROXY", None)
os.environ.pop("no_proxy", None)
up = open(os.environ["AIRLOCK_PROMPT_FILE"]).read().strip()
for path in ["/one", "/two"]:
    try:
        with urllib.request.urlopen(up + path, timeout=190) as r:
            print("GOT", path, r.status, r.read().decode(), flush=True)
    except urllib.error.HTTPError as e:
        print("REFUSED", path, e.code, e.read().decode(), flush=True)
    except Exception as e:
        print("FAILED", path, repr(e), flush=True)
"#;
    let home_ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(home_ca.path(), ca.issuer.pem()).unwrap();
    let Some(Started { _home, s, a, run }) = start(
        &[("EGRESS_EXTRA_CA_FILE", home_ca.path().display().to_string())],
        ("tls-held", manifest),
        script,
        &u,
    ) else {
        return;
    };
    let seen = || {
        log.lock()
            .unwrap()
            .iter()
            .map(|(p, _)| p.clone())
            .collect::<Vec<_>>()
    };

    let one = wait_for(&s, &format!("/v1/runs/{run}/approvals"), &a, 90, |v| {
        let l = v["approvals"].as_array().cloned().unwrap_or_default();
        let ended = s.call("GET", &format!("/v1/runs/{run}"), Some(&a), None).1["status"]
            .as_str()
            .is_some_and(|st| st != "running" && st != "queued");
        assert!(
            !ended,
            "the run ended unheld: {}\n{}",
            s.call(
                "GET",
                &format!("/v1/runs/{run}/logs?after=0"),
                Some(&a),
                None
            )
            .1,
            s.log_text()
        );
        l.len() == 1 && pending(&l) == 1
    })["approvals"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (one[0]["method"].as_str(), one[0]["path"].as_str()),
        (Some("GET"), Some("/one")),
        "{one:?}"
    );
    assert_eq!(one[0]["rule"], "tls-ask");
    assert!(seen().is_empty(), "nothing sent before the answer");
    let (st, v) = answer(&s, &a, &run, one[0]["id"].as_str().unwrap(), "allow_once");
    assert_eq!(st, 200, "{v}");

    let two = approvals_when(&s, &a, &run, |l| l.len() == 2 && pending(l) == 1);
    assert_eq!(two[1]["path"], "/two", "{two:?}");
    let (st, v) = answer(&s, &a, &run, two[1]["id"].as_str().unwrap(), "deny");
    assert_eq!(st, 200, "{v}");

    let done = wait_for(&s, &format!("/v1/runs/{run}"), &a, 90, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    assert_eq!(done["status"], "succeeded", "{done}\n{}", s.log_text());
    let logs = logs_when(&s, &a, &run, |t| t.contains("/two"));
    assert!(
        logs.contains("GOT /one 200") && logs.contains(r#"\"path\":\"/one\""#),
        "allowed: the upstream's answer: {logs}"
    );
    assert!(
        logs.contains("REFUSED /two 403") && logs.contains("approval_denied"),
        "denied: the typed refusal: {logs}"
    );
    assert_eq!(seen(), ["/one"], "the upstream saw only the allowed one");
    drop(rt);
}

/// A request held by a run on replica A is answered through replica B's
/// `/v1` (two `airlock serve` replicas on one PostgreSQL database): the
/// answer reaches A through the shared store, and the held request goes on
/// within the store poll's bound; B cannot answer it twice, and another
/// organization cannot answer it at all.
#[test]
fn an_answer_through_another_replica_releases_the_held_request() {
    if !crate::support::namespace_available() {
        return;
    }
    let Some(db) = crate::serve_runs::Schema::new() else {
        return;
    };
    let up = Recorder::start("content-length", |mut c, _, _| {
        let _ = write!(
            c,
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
        );
    });
    let u = up.addr;
    let manifest = format!(
        "[agent]\nname = \"asker\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 200\n\n\
         [network]\negress = \"none\"\n\n[[integrations]]\nnamespace = \"svc\"\n\
         authorized_uris = [\"http://{u}/**\"]\n\n\
         [[integrations.rules]]\nid = \"write\"\nhost = \"http://{u}\"\nmethods = [\"POST\"]\naction = \"ask\"\ntimeout = 180\n"
    );
    let script = mcp_agent(
        r#"
r = mcp("tools/call", {"name": "svc__api_call", "arguments": {"target": UPSTREAM + "/held", "method": "POST"}})
print("HELD " + json.dumps(r), flush=True)
"#,
    );
    let (home_a, home_b) = (
        tempfile::Builder::new()
            .prefix("airlock-holds-a-")
            .tempdir()
            .unwrap(),
        tempfile::Builder::new()
            .prefix("airlock-holds-b-")
            .tempdir()
            .unwrap(),
    );
    let env_a = base_env(home_a.path(), Some(&db.url));
    let env_b = base_env(home_b.path(), Some(&db.url));
    let s_a = Server::start(&env_a, "namespace", home_a.path().join("serve.log"));
    let (_, key) = create_org(&env_a, "A", &[]);
    let (_, other) = create_org(&env_a, "B", &[]);
    let body = json!({"manifest": manifest, "files": {"agent.py": script}});
    let (st, v) = s_a.call("POST", "/v1/agents", Some(&key), Some(&body));
    assert!(st == 201 || st == 200, "{st} {v}");
    let (st, run) = s_a.call(
        "POST",
        "/v1/runs",
        Some(&key),
        Some(&json!({"agent": "asker", "prompt": format!("http://{u}")})),
    );
    assert_eq!(st, 202, "{run}");
    let run = run["id"].as_str().unwrap().to_owned();

    // Held on A (the only replica when the run was claimed).
    let held = approvals_when(&s_a, &key, &run, |l| l.len() == 1 && pending(l) == 1);
    let id = held[0]["id"].as_str().unwrap().to_owned();
    // B starts only now: the run cannot be its own.
    let s_b = Server::start(&env_b, "namespace", home_b.path().join("serve.log"));
    assert_eq!(answer(&s_b, &other, &run, &id, "allow_once").0, 404);
    assert!(up.seen().is_empty(), "nothing sent before the answer");

    let answered = std::time::Instant::now();
    let (st, v) = answer(&s_b, &key, &run, &id, "allow_once");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "allowed_once");
    let bound = airlock_platform::approvals::POLL + std::time::Duration::from_secs(5);
    while up.seen().is_empty() {
        assert!(
            answered.elapsed() < bound,
            "the held request did not go on within {bound:?} of B's answer\n{}",
            s_a.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        answer(&s_b, &key, &run, &id, "deny").0,
        409,
        "answered once"
    );
    let done = wait_for(&s_a, &format!("/v1/runs/{run}"), &key, 90, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    assert_eq!(done["status"], "succeeded", "{done}\n{}", s_a.log_text());
    let logs = logs_when(&s_b, &key, &run, |t| t.contains("HELD"));
    assert!(logs.contains(r#"\"isError\": false"#), "{logs}");
    let lines: Vec<String> = up.seen().into_iter().map(|(l, _)| l).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("POST /held "), "{lines:?}");
    drop((s_a, s_b));
}

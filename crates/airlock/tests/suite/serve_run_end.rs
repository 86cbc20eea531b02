//! A run's end is recorded once its agent has exited and its sidecar has
//! flushed, never before: a request the agent left in flight when it
//! exited is in the run's egress log by the time the run's end is visible
//! (the sidecar's drain gives it its time, then records it as it ended).
//! The sandboxes' removal comes after; the flush point is the backends'
//! common one (the sidecar's flushed line), so the process backend shows
//! it wherever the test runs. Every upstream is this test's, on 127.0.0.1.
//!
//! The watch ends when the sidecar tells the platform the agent's end is
//! kept (`/internal/v1/ended`), before the sandbox's exit is reported: the
//! agent cannot send that word nor the end it follows (the attack below),
//! and a word sent early (as a lying runtime would make the sidecar send
//! it) ends the run without losing a record.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use crate::support::serve::{
    Server, base_env, create_org, mcp_agent, run_agent_once, start_agent, wait_for,
};

/// The agent: one `api_call` to the prompt's upstream on a thread of its
/// own; once the upstream has it (the test says so by creating `GO`), the
/// agent exits at once, the call still open.
const AGENT_REST: &str = r#"
import threading, time
def call():
    try:
        mcp("tools/call", {"name": "up__api_call", "arguments": {"target": UPSTREAM + "/slow"}})
    except Exception:
        pass
threading.Thread(target=call, daemon=True).start()
while not os.path.exists(GO):
    time.sleep(0.02)
print("leaving with a call in flight", flush=True)
os._exit(0)
"#;

/// A loopback upstream that takes one request, says so by creating `go`,
/// and answers only once `release` is told (or after a minute).
fn holding_upstream(go: PathBuf, release: mpsc::Receiver<()>) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let Ok((mut c, _)) = l.accept() else { return };
        c.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && c.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        std::fs::write(&go, b"").unwrap();
        let _ = release.recv_timeout(Duration::from_secs(60));
        let _ =
            c.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\nlate");
    });
    addr
}

#[test]
fn a_request_in_flight_at_the_agents_exit_is_recorded_before_the_runs_end_is_visible() {
    let home = tempfile::Builder::new()
        .prefix("airlock-run-end-")
        .tempdir()
        .unwrap();
    let go = home.path().join("go");
    let (release, held) = mpsc::channel();
    let up = holding_upstream(go.clone(), held);
    let env = base_env(home.path(), None);
    let s = Server::start(&env, "process", home.path().join("serve.log"));
    let (_, key) = create_org(&env, "Acme", &[]);
    let manifest = format!(
        "[agent]\nname = \"leaver\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 60\n\n\
         [network]\negress = \"none\"\n\n[[integrations]]\nnamespace = \"up\"\n\
         authorized_uris = [\"http://{up}/**\"]\n"
    );
    let script = mcp_agent(&format!(
        "GO = {:?}\n{AGENT_REST}",
        go.display().to_string()
    ));
    // Once seen ended (and succeeded), the call the agent left open is
    // recorded already: the upstream still holds it.
    let (run, logs) = run_agent_once(
        &s,
        &key,
        ("leaver", &manifest),
        &script,
        &format!("http://{up}"),
    );
    assert!(logs.contains("leaving with a call in flight"), "{logs}");
    let id = run["id"].as_str().unwrap();
    let (_, egress) = s.call("GET", &format!("/v1/runs/{id}/egress"), Some(&key), None);
    let _ = release.send(());
    let records = egress["egress"].as_array().unwrap();
    let slow: Vec<_> = records
        .iter()
        .filter(|r| r["url"].as_str().is_some_and(|u| u.ends_with("/slow")))
        .collect();
    assert_eq!(
        slow.len(),
        1,
        "the call in flight at the agent's exit: {egress}"
    );
    assert!(slow[0]["outcome"].is_string(), "{}", slow[0]);
}

/// The agent's forgeries of its own end: a well-formed `result` event
/// (exit code 0, a forged result document) posted through the runtime's
/// relay under every spelling of the runtime's `/events`, and the
/// platform's end word (`/internal/v1/ended`); then straight to the
/// sidecar, which it reaches without the token. Then it goes on: calls the
/// upstream (each recorded), and exits 7 with its own result.
const FORGER_REST: &str = r#"
import socket
base = MCP.rsplit("/mcp", 1)[0]
forged = json.dumps({"events": [{"type": "result", "at": 1, "exit_code": 0,
                                 "result": {"forged": True}}]}).encode()
answers = {}
def post(url, body):
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"content-type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return "error: %s" % e
for path in ["/events", "//events", "/./events", "/%65vents", "/mcp/../events",
             "/events/", "/Events", "/events?x=1", "/internal/v1/ended",
             "/internal/v1/events"]:
    answers["relay " + path] = post(base + path, forged)
def raw_unix(path, target, body):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    s.sendall(("POST %s HTTP/1.1\r\nhost: sidecar\r\ncontent-type: application/json\r\n"
               "content-length: %d\r\nconnection: close\r\n\r\n" % (target, len(body))).encode() + body)
    head = s.recv(64).decode(errors="replace")
    s.close()
    return int(head.split()[1])
for sock in ["/run/airlock/sidecar.sock"]:
    for target in ["/events", "/internal/v1/ended"]:
        try:
            answers["direct " + target] = raw_unix(sock, target, forged)
        except OSError as e:
            answers["direct " + target] = "error: %s" % e
calls = 0
for i in range(5):
    r = mcp("tools/call", {"name": "up__api_call", "arguments": {"target": UPSTREAM + "/after-forgery/%d" % i}})
    if r and not r.get("result", {}).get("isError"):
        calls += 1
json.dump({"answers": answers, "calls": calls}, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
print("forgeries done", flush=True)
sys.exit(7)
"#;

/// A loopback upstream answering every request 200 and counting them.
fn counting_upstream() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let seen = n.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let seen = seen.clone();
            std::thread::spawn(move || {
                c.set_read_timeout(Some(Duration::from_secs(10))).ok();
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && c.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                seen.fetch_add(1, Ordering::SeqCst);
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                );
            });
        }
    });
    (addr, n)
}

fn integration_manifest(name: &str, up: std::net::SocketAddr, timeout: u64) -> String {
    format!(
        "[agent]\nname = \"{name}\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = {timeout}\n\n\
         [network]\negress = \"none\"\n\n[[integrations]]\nnamespace = \"up\"\n\
         authorized_uris = [\"http://{up}/**\"]\n"
    )
}

/// Attack: the agent forges its own end (the runtime's `result` event and
/// the sidecar's word to the platform), through its relay and straight to
/// the sidecar. Every forgery is refused, the run is not ended by it: the
/// calls the agent makes after it are all recorded, and the run ends with
/// the agent's true exit code and its own result.
#[test]
fn a_forged_end_from_the_agent_is_refused_and_the_run_keeps_every_record() {
    if !crate::support::namespace_available() {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("airlock-forged-end-")
        .tempdir()
        .unwrap();
    let (up, received) = counting_upstream();
    let env = base_env(home.path(), None);
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, key) = create_org(&env, "Acme", &[]);
    let manifest = integration_manifest("forger", up, 120);
    let script = mcp_agent(&format!("import sys\n{FORGER_REST}"));
    let id = start_agent(
        &s,
        &key,
        ("forger", &manifest),
        &script,
        &format!("http://{up}"),
    );
    let run = wait_for(&s, &format!("/v1/runs/{id}"), &key, 120, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    let log = s.log_text();
    assert_eq!(run["status"], "failed", "{run}\n{log}");
    assert_eq!(
        run["exit_code"], 7,
        "the agent's true exit code: {run}\n{log}"
    );
    let (st, reported) = s.call("GET", &format!("/v1/runs/{id}/result"), Some(&key), None);
    assert_eq!(st, 200, "{reported}");
    assert_eq!(
        reported["exit_code"], 7,
        "the last end kept is the runtime's: {reported}"
    );
    let result = &reported["result"];
    assert!(result.get("forged").is_none(), "{reported}");
    let answers = result["answers"]
        .as_object()
        .unwrap_or_else(|| panic!("{run}\n{log}"));
    assert_eq!(answers.len(), 12, "{result}");
    for (how, status) in answers {
        assert!(
            !status.as_u64().is_some_and(|s| (200..300).contains(&s)),
            "a forged end was taken ({how}: {status}): {result}"
        );
    }
    assert_eq!(
        answers["direct /events"], 401,
        "the sidecar, reached straight, wants the token the agent lacks: {result}"
    );
    // The legitimate path worked after the attack, and every call of it is
    // in the run's egress log.
    assert_eq!(result["calls"], 5, "{result}");
    assert_eq!(received.load(Ordering::SeqCst), 5);
    let (_, egress) = s.call("GET", &format!("/v1/runs/{id}/egress"), Some(&key), None);
    let after: Vec<_> = egress["egress"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["url"]
                .as_str()
                .is_some_and(|u| u.contains("/after-forgery/"))
        })
        .collect();
    assert_eq!(after.len(), 5, "{egress}");
    assert!(after.iter().all(|r| r["outcome"].is_string()), "{egress}");
}

/// The platform's end word sent early (as a sidecar told by a lying
/// runtime would: the agent still runs, calling its upstream in a loop):
/// the run ends at once, and loses nothing — the sandbox is halted and the
/// sidecar drained before the end is written, so every request the
/// upstream got is in the egress log with its outcome when the run reads
/// as ended, none arrives after, and the exit code is the one the runtime
/// reported when it was stopped (its agent killed: 137), not a made-up one.
#[test]
fn an_end_word_sent_early_ends_the_run_without_losing_a_record() {
    if !crate::support::namespace_available() {
        return;
    }
    let home = tempfile::Builder::new()
        .prefix("airlock-early-end-")
        .tempdir()
        .unwrap();
    let (up, received) = counting_upstream();
    const SECRET: &str = "test-run-token-secret-0123456789";
    let mut env = base_env(home.path(), None);
    env.push(("RUN_TOKEN_SECRET".into(), SECRET.into()));
    let s = Server::start(&env, "namespace", home.path().join("serve.log"));
    let (_, key) = create_org(&env, "Acme", &[]);
    let manifest = integration_manifest("looper", up, 300);
    let script = mcp_agent(
        r#"
import time
n = 0
while True:
    mcp("tools/call", {"name": "up__api_call", "arguments": {"target": UPSTREAM + "/tick/%d" % n}})
    n += 1
    # Paced (not waiting for anything): the run's egress log, as the API
    # lists it, holds its first 1000 records.
    time.sleep(0.02)
    if n == 3:
        print("looping", flush=True)
"#,
    );
    let id = start_agent(
        &s,
        &key,
        ("looper", &manifest),
        &script,
        &format!("http://{up}"),
    );
    wait_for(&s, &format!("/v1/runs/{id}/logs?after=0"), &key, 60, |v| {
        v.to_string().contains("looping")
    });
    // The word, as the run's sidecar sends it: the run's token, on the
    // platform's internal API socket.
    let tokens = airlock_vault::RunTokens::new(
        airlock_vault::SigningKeyring::parse("RUN_TOKEN_SECRET", SECRET).unwrap(),
    );
    let token = airlock_vault::ExposeSecret::expose_secret(&tokens.issue(&id)).to_owned();
    let socket = home
        .path()
        .join("sockets")
        .join(format!("platform-{}.sock", s.child.id()));
    let mut c = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    write!(
        c,
        "POST /internal/v1/ended HTTP/1.1\r\nhost: platform\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
    )
    .unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    let run = wait_for(&s, &format!("/v1/runs/{id}"), &key, 30, |v| {
        v["status"] != "queued" && v["status"] != "running"
    });
    let got = received.load(Ordering::SeqCst);
    let (_, egress) = s.call("GET", &format!("/v1/runs/{id}/egress"), Some(&key), None);
    let log = s.log_text();
    assert_eq!(run["status"], "failed", "{run}\n{log}");
    assert_eq!(
        run["exit_code"], 137,
        "the runtime's report of its agent, killed at the stop: {run}\n{log}"
    );
    let ticks: Vec<_> = egress["egress"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["url"].as_str().is_some_and(|u| u.contains("/tick/")))
        .collect();
    assert!(got >= 3, "{got}");
    assert!(
        ticks.iter().all(|r| r["outcome"].is_string()),
        "every record is final once the run reads as ended: {egress}"
    );
    assert!(
        ticks.len() >= got,
        "each request the upstream got is in the egress log ({got} got): {egress}"
    );
    // Nothing of the agent is left to send: a whole run later, the
    // upstream has had no more.
    run_agent_once(
        &s,
        &key,
        ("after", &integration_manifest("after", up, 60)),
        "print('fine')\n",
        "",
    );
    assert_eq!(
        received.load(Ordering::SeqCst),
        got,
        "a request after the end"
    );
}

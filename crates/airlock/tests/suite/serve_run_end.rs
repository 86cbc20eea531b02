//! A run's end is recorded once its agent has exited and its sidecar has
//! flushed, never before: a request the agent left in flight when it
//! exited is in the run's egress log by the time the run's end is visible
//! (the sidecar's drain gives it its time, then records it as it ended).
//! The sandboxes' removal comes after; the flush point is the backends'
//! common one (the sidecar's flushed line), so the process backend shows
//! it wherever the test runs. Every upstream is this test's, on 127.0.0.1.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use crate::support::serve::{Server, base_env, create_org, mcp_agent, run_agent_once};

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

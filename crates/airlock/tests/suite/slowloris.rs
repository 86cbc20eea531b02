//! A run's sidecar against an agent that holds connections open (issue 45,
//! items 4 and 11): the sidecar's API listeners cap their connections (idle
//! ones give way), close what sends no request, and the namespace backend's
//! host sidecar runs under a memory limit of its own. The legitimate path
//! (the runtime's reports, the agent's own MCP calls) still works.

use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;

use serde_json::Value;

use crate::support::{RealRun, namespace_available, sidecars_of};

/// The agent: thousands of keep-alive connections straight to the sidecar's
/// API socket, each after one open request (`/health`) and then silent; then
/// an MCP call through its own endpoint while they are held.
const FLOOD_AGENT: &str = r#"
import json, os, resource, socket, time, urllib.request
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
n = hard - 64
print("READY", flush=True)
time.sleep(2)
# Three processes, each as many connections as its descriptors allow.
pipes = []
for k in range(3):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        held, failed = [], 0
        for i in range(n):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2)
            try:
                s.connect("/run/airlock/sidecar.sock")
                s.sendall(b"GET /health HTTP/1.1\r\nhost: sidecar\r\n\r\n")
                held.append(s)
            except OSError:
                failed += 1
                s.close()
        os.write(w, f"{len(held)} {failed}\n".encode())
        time.sleep(8)
        os._exit(0)
    os.close(w)
    pipes.append(r)
opened = failed = 0
for r in pipes:
    a, b = os.read(r, 100).split()
    opened, failed = opened + int(a), failed + int(b)
print("HELD", opened, flush=True)
time.sleep(3)
h = {"content-type": "application/json", "accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}
body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "f", "version": "1"}}}
req = urllib.request.Request(os.environ["AIRLOCK_MCP_URL"], data=json.dumps(body).encode(), headers=h)
try:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=20) as resp:
        mcp = resp.status
except Exception as e:
    mcp = str(e)
json.dump({"opened": opened, "failed": failed, "hard": hard, "mcp": mcp}, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;

/// `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The memory limit of the memory cgroup `pid` is in (v1 or v2), with the
/// cgroup's path.
fn memory_limit(pid: u32) -> (String, Option<u64>) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    for l in text.lines() {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let (file, mount) = if ctrls.split(',').any(|c| c == "memory") {
            ("memory.limit_in_bytes", "/sys/fs/cgroup/memory")
        } else if ctrls.is_empty() {
            ("memory.max", "/sys/fs/cgroup")
        } else {
            continue;
        };
        let limit = std::fs::read_to_string(format!("{mount}{path}/{file}"))
            .ok()
            .and_then(|v| v.trim().parse().ok());
        if limit.is_some() || ctrls.contains("memory") {
            return (path.to_owned(), limit);
        }
    }
    (String::new(), None)
}

/// Issue 45, items 4 and 11: an agent opening thousands of keep-alive
/// connections (three processes, each to its descriptor limit) to its
/// namespace sidecar's API socket. The sidecar holds at most its cap
/// (256) of them, its memory grows by little, it sits in a memory cgroup of
/// its own limited as the docker sidecar container is (1 GiB), and the run
/// still works: the agent's MCP call answers, the runtime's reports arrive
/// (the run succeeds with its result).
#[test]
fn an_agent_holding_thousands_of_connections_cannot_grow_its_sidecar() {
    // This attack needs the namespace backend: a failure under CI, a
    // counted skip elsewhere.
    if !namespace_available() {
        return;
    }
    let run = RealRun::python(FLOOD_AGENT, 180);
    let mut child = run
        .command("namespace", &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let mut wait_for = |marker: &str| loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("the run ended before {marker:?}: {seen}");
        }
        seen.push_str(&line);
        if line.contains(marker) {
            return line;
        }
    };
    wait_for("READY");
    let sidecar = *sidecars_of(child.id())
        .first()
        .expect("the run's sidecar process");
    let (cgroup, limit) = memory_limit(sidecar);
    let before = rss_kib(sidecar);
    let held = wait_for("HELD");
    let (rss, fds) = (rss_kib(sidecar), descriptors(sidecar));
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
    });
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let _ = child.wait();
    let report: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    let r = &report["result"];
    eprintln!(
        "sidecar: {fds} descriptors, RSS {before} -> {rss} KiB, with {}",
        held.trim()
    );
    assert_eq!(report["status"], "succeeded", "{report}");
    assert!(
        r["opened"].as_u64().unwrap_or(0) >= 2000,
        "the agent opened enough connections to matter: {r} ({held})"
    );
    // The cap (256) and the sidecar's own descriptors, plus evicted
    // connections whose task has not run yet to close them (seen up to
    // ~130 under this flood).
    assert!(
        fds <= 256 + 256,
        "the sidecar held {fds} descriptors with {held}"
    );
    assert!(
        rss.saturating_sub(before) <= 24 * 1024,
        "the sidecar grew from {before} to {rss} KiB with {held}"
    );
    assert_eq!(r["mcp"], 200, "the agent's own MCP call: {r}");
    assert!(
        cgroup.ends_with("-sidecar"),
        "the host sidecar is in a cgroup of its own, not {cgroup:?}"
    );
    assert_eq!(limit, Some(1 << 30), "its memory limit ({cgroup})");
}

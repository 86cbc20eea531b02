//! Real `airlock run --backend docker` runs, attacked from inside: the
//! hostile agents of `tests/agents/*.py` (run directory, identity, kernel;
//! the terminal attack is `boundary.rs`'s, run on both backends), the sidecar
//! as the only way out (and not a way back to itself),
//! the run's end with its real reason, bad settings refused before anything
//! starts, and boot reclaim across two platforms sharing one daemon.
//!
//! Network rule: the only servers reached are this test's own, on this
//! host's address on the egress network (a Docker bridge of this host); the
//! cloud metadata address is refused by the sidecar's guard before any
//! connection is made (the egress log says so).
//!
//! Needs a Docker daemon: under `CI` a missing one fails loudly, elsewhere
//! the tests print SKIPPED.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use crate::support;
use std::io::{BufRead, Read};
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{RealRun, docker, docker_available, docker_inspect, docker_leftovers};
use serde_json::{Value, json};

const EPERM: i64 = 1;
const EACCES: i64 = 13;
const EADDRNOTAVAIL: i64 = 99;

/// The report of a run that must have succeeded (its output otherwise).
fn succeeded(out: &std::process::Output) -> Value {
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        report["status"],
        "succeeded",
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

fn result_of(report: &Value) -> &Value {
    &report["result"]
}

fn assert_clean(run: &RealRun, report: &Value) {
    let id = report["id"].as_str().unwrap_or_default();
    assert!(!id.is_empty(), "{report}");
    let left = docker_leftovers(id);
    assert!(left.is_empty(), "left on the daemon: {left:?}");
    let runs: Vec<_> = std::fs::read_dir(run.home.path().join("runs"))
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(runs.is_empty(), "run directories left: {runs:?}");
}

/// Starts a docker run; waits until the agent printed `marker` (live
/// view); returns the process, the run id and what was seen.
fn start_docker_until(run: &RealRun, marker: &str) -> (std::process::Child, String, String) {
    let (child, seen) = support::start_until(run, "docker", marker);
    // (`--json` keeps the live view quiet: the store names the run.)
    let listed = run.airlock(&["runs", "list"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    let id = text
        .split_whitespace()
        .find(|w| w.starts_with("run_"))
        .unwrap_or_else(|| panic!("no run listed: {text}"))
        .to_owned();
    (child, id, seen)
}

#[test]
fn the_run_directory_is_out_of_reach_and_every_write_lands_on_a_capped_tmpfs() {
    if !docker_available() {
        return;
    }
    let run = RealRun::python(include_str!("../agents/run_dir.py"), 120)
        .env("WORKSPACE_TMPFS_SIZE_MB", "16");
    let home = run.home.path().display().to_string();
    let out = run
        .command("docker", &["--prompt", &home])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(report["status"], "succeeded", "{report}\n{stderr}");
    let r = result_of(&report);
    // The sidecar's two sockets are the agent's one way out: there, in a
    // directory it may cross but not list, and neither they nor it changed.
    assert_eq!(r["sockets_present"], json!([true, true]), "{r}");
    assert_eq!(r["sockets_listing"], json!(EACCES), "{r}");
    assert_eq!(r["sock_dirs"], json!(["/run/airlock"]), "{r}");
    for d in r["sock_dirs"].as_array().unwrap() {
        let d = d.as_str().unwrap();
        for k in ["create", "chmod"] {
            assert_ne!(r[format!("{k}:{d}")], json!("ok"), "{k}:{d} worked: {r}");
        }
        for k in ["rename", "unlink", "bind"] {
            let key = format!("{k}:{d}/sidecar.sock");
            assert!(r[&key].is_number(), "{key} worked: {r}");
        }
    }
    assert_eq!(r["runs_visible"], json!(false), "{r}");
    assert_eq!(r["home_listing"], json!(["agent"]), "{r}");
    assert_eq!(r["owner_files"], json!([]), "{r}");
    // Writes land on the workspace and /tmp, two tmpfs of 16 MiB each (and
    // in the run's memory limit); nowhere else, not on the host disk.
    let written = r["written"].as_object().unwrap();
    for (t, n) in written {
        assert!(
            n.as_u64().unwrap() <= 16 << 20,
            "{t}: {} MiB past the 16 MiB cap",
            n.as_u64().unwrap() >> 20
        );
        if !["/workspace", "/tmp"].contains(&t.as_str()) {
            assert_eq!(n, 0, "{t} took writes: {written:?}");
        }
    }
    assert!(
        written["/workspace"].as_u64().unwrap() >= 8 << 20,
        "{written:?}"
    );
    assert_eq!(r["mcp_tools"], json!(true), "{r}");
    assert_eq!(r["events_via_relay"], json!(404), "{r}");
    assert_clean(&run, &report);
}

#[test]
fn the_agent_is_a_dedicated_unprivileged_host_uid_with_its_own_kernel_quotas() {
    if !docker_available() {
        return;
    }
    let run = RealRun::python(include_str!("../agents/identity.py"), 120);
    let secret = run.agent_dir.join("root-only.txt");
    std::fs::write(&secret, "operator secret").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(run.agent_dir.join("public.txt"), "shared").unwrap();
    std::fs::set_permissions(
        run.agent_dir.join("public.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let mut child = run
        .command("docker", &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("the run ended before the agent held its instances: {seen}");
        }
        seen.push_str(&line);
        if line.contains("HOLDING") {
            break;
        }
    }
    let mine = rustix::fs::inotify::init(rustix::fs::inotify::CreateFlags::CLOEXEC);
    let host_uids: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.starts_with(b"/usr/bin/python3\0agent.py"))
        })
        .filter_map(|e| {
            std::fs::read_to_string(e.path().join("status"))
                .ok()?
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .map(str::to_owned)
        })
        .collect();
    std::fs::write(run.agent_dir.join("release"), "").unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let _ = err.read_to_string(&mut seen);
    assert!(child.wait().unwrap().success(), "{seen}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let r = result_of(&report);
    let uid = r["uid"].as_u64().unwrap();
    assert!(
        uid >= 0x5A00_0000,
        "a dedicated uid, not a real user's: {r}"
    );
    assert_eq!(r["gid"], uid, "{r}");
    assert_eq!(
        uid,
        u64::from(airlock_sandbox::docker::agent_ids(report["id"].as_str().unwrap()).uid)
    );
    assert!(
        host_uids
            .iter()
            .any(|l| l.split_whitespace().skip(1).all(|u| u == uid.to_string())),
        "the agent runs as host uid {uid}: {host_uids:?}"
    );
    assert_eq!(r["root-only.txt"], json!(EACCES), "{r}");
    assert_eq!(r["public.txt"], "shared", "{r}");
    assert!(r["inotify_instances"].as_u64().unwrap() > 0, "{r}");
    if rustix::process::geteuid().is_root() {
        assert!(
            mine.is_ok(),
            "host root could not create an inotify instance while the agent held its quota"
        );
    }
    assert_clean(&run, &report);
}

#[test]
fn foreign_socket_families_kernel_information_and_the_runtime_are_closed() {
    if !docker_available() {
        return;
    }
    let run = RealRun::python(include_str!("../agents/kernel.py"), 60);
    let (out, report) = run.run("docker");
    assert_eq!(
        report["status"],
        "succeeded",
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = result_of(&report);
    for k in [
        "af_vsock",
        "af_netlink",
        "af_packet",
        "af_alg",
        "af_key",
        "socketpair_vsock",
    ] {
        assert_eq!(r[k], json!(EPERM), "{k} must be refused: {r}");
    }
    assert_eq!(r["af_unix"], "ping", "{r}");
    assert_eq!(r["af_inet"], "pong", "{r}");
    // No IPv6 in a docker run (no address, loopback included).
    assert_eq!(r["af_inet6"], json!(EADDRNOTAVAIL), "{r}");
    let mut checked = 0;
    for (k, v) in r.as_object().unwrap() {
        if k.starts_with("proc_") && k != "proc_self_status" && k != "proc_meminfo" {
            assert!(
                v.is_i64() || v == &json!({"bytes": 0}),
                "{k} must read as nothing: {v}"
            );
            checked += 1;
        }
        if k.starts_with("procdir_") {
            assert!(
                v.is_i64() || v == &json!({"entries": 0}),
                "{k} must be empty: {v}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 8, "the masked entries exist on this kernel: {r}");
    assert_eq!(r["runtime_pids"], 1, "{r}");
    for k in [
        "runtime_mem",
        "runtime_environ",
        "runtime_fd",
        "runtime_maps",
    ] {
        assert_eq!(
            r[k],
            json!(EACCES),
            "{k}: the runtime must not be readable: {r}"
        );
    }
    assert_clean(&run, &report);
}

/// A server of the test's own on this host's egress-network address: counts
/// the requests that reach it.
fn egress_server() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let l = std::net::TcpListener::bind((support::docker_egress_gateway(), 0)).unwrap();
    let addr = l.local_addr().unwrap();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut s = s;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = std::io::Write::write_all(
                &mut s,
                b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\nconnection: close\r\n\r\nhello agent",
            );
        }
    });
    (addr, hits)
}

const OUTBOUND: &str = r#"
import json, os, socket, urllib.request, urllib.error
target = open(os.environ["AIRLOCK_PROMPT_FILE"]).read().strip()
host, port = target.split(":")
r = {}
def via_proxy(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as resp:
            return [resp.status, resp.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, json.loads(e.read() or b"{}").get("error")]
    except Exception as e:
        return ["error", repr(e)]
r["allowed"] = via_proxy("http://%s/hello" % target)
r["metadata"] = via_proxy("http://169.254.169.254/latest/meta-data/")
r["sidecar_by_name"] = via_proxy("http://sidecar:8080/health")
r["own_container"] = via_proxy("http://airlock-%s-sidecar:8080/health" % os.environ["AIRLOCK_RUN_ID"])
r["agent_by_name"] = via_proxy("http://agent:1/")
try:
    socket.create_connection((host, int(port)), timeout=8).close()
    r["direct"] = "CONNECTED"
except OSError as e:
    r["direct"] = e.errno
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;

#[test]
fn the_sidecar_is_the_only_way_out_and_no_way_back_to_itself() {
    if !docker_available() {
        return;
    }
    let (addr, hits) = egress_server();
    let run = RealRun::with_manifest(
        OUTBOUND,
        &format!(
            "[agent]\nname = \"out\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 120\n\n[network]\negress = [\"http://{addr}/**\", \"http://169.254.169.254/**\", \"http://sidecar:8080/**\", \"http://agent:1/**\", \"http://*:8080/**\"]\n"
        ),
    )
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", &addr.ip().to_string());
    let out = run
        .command("docker", &["--prompt", &addr.to_string()])
        .output()
        .unwrap();
    let report = succeeded(&out);
    let r = result_of(&report);
    assert_eq!(
        r["allowed"],
        json!([200, "hello agent"]),
        "through the proxy: {r}"
    );
    assert_eq!(r["metadata"], json!([403, "blocked_address"]), "{r}");
    assert_eq!(r["sidecar_by_name"], json!([403, "blocked_host"]), "{r}");
    assert_eq!(r["own_container"], json!([403, "blocked_host"]), "{r}");
    assert_eq!(r["agent_by_name"], json!([403, "blocked_host"]), "{r}");
    assert_ne!(r["direct"], "CONNECTED", "straight to the host: {r}");
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the proxied request reached the server"
    );
    // The metadata refusal was the guard's, before any connection: recorded.
    let entries = report["egress"]["entries"].as_array().unwrap();
    assert!(
        entries.iter().any(|e| e["host"] == "169.254.169.254"
            && e["decision"] == "refused"
            && e["reason"] == "blocked_address"),
        "{entries:?}"
    );
    assert_clean(&run, &report);
}

/// The hostile agent of the no-network test: what its container has of a
/// network, every address of the egress network (its sidecar's among them)
/// and the host's there, its sockets' directory attacked; then its
/// legitimate way out, an MCP tool call and a proxied request to the
/// test's server. Says `probed`, then waits for the test's `release`.
const NO_NETWORK: &str = r#"
import ipaddress, json, os, socket, stat, time, urllib.request
target, subnet = open("target.txt").read().split()
host, port = target.split(":")
r = {}
r["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
r["routes"] = open("/proc/net/route").read().splitlines()[1:]
r["routes6"] = [l.split()[-1] for l in open("/proc/net/ipv6_route").read().splitlines()]
def dial(h, p):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect((h, p))
        return "CONNECTED"
    except OSError as e:
        return e.errno if e.errno is not None else "timeout"
    finally:
        s.close()
seen = {}
for a in [ipaddress.ip_address(host)] + list(ipaddress.ip_network(subnet).hosts()):
    for p in (int(port), 8080, 8081):
        o = str(dial(str(a), p))
        seen[o] = seen.get(o, 0) + 1
r["egress_network"] = seen
d = "/run/airlock"
r["sockets"] = {n: stat.S_ISSOCK(os.stat(os.path.join(d, n)).st_mode) for n in ("sidecar.sock", "proxy.sock")}
def attempt(f):
    try:
        f()
        return "DONE"
    except OSError as e:
        return e.errno
r["list"] = attempt(lambda: os.listdir(d))
r["create"] = attempt(lambda: open(d + "/planted", "w"))
r["unlink"] = attempt(lambda: os.unlink(d + "/sidecar.sock"))
r["bind"] = attempt(lambda: socket.socket(socket.AF_UNIX).bind(d + "/evil.sock"))
r["chmod"] = attempt(lambda: os.chmod(d + "/proxy.sock", 0o777))
r["mount"] = [l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4] == d]
meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
    "name": "open__api_call", "arguments": {"target": "http://%s/tool" % target}, "_meta": meta}}
req = urllib.request.Request(os.environ["AIRLOCK_MCP_URL"], data=json.dumps(call).encode(), headers={
    "content-type": "application/json", "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "open__api_call"})
with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30) as resp:
    r["tool"] = [resp.status, resp.read().decode()]
with urllib.request.urlopen("http://%s/proxied" % target, timeout=30) as resp:
    r["proxied"] = [resp.status, resp.read().decode()]
print("probed", flush=True)
while not os.path.exists("release"):
    time.sleep(0.05)
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;

/// The agent's container has no network at all: `lo` alone, no route, so
/// every address (the egress network's, its sidecar's there, the host's)
/// is refused by its own kernel before any packet leaves; no network is
/// made for the run. Its one way out is its sidecar's two unix sockets, in
/// a directory it sees read-only and can neither list nor change, which
/// holds those two and nothing else; through them an MCP tool call and a
/// proxied request reach the test's server.
#[test]
fn the_agent_has_no_network_and_its_sidecar_is_behind_two_read_only_sockets() {
    if !docker_available() {
        return;
    }
    const ENETUNREACH: &str = "101";
    const EROFS: i64 = 30;
    let (addr, hits) = egress_server();
    let subnet = support::docker_backend().unwrap().cfg.egress_subnet;
    let run = RealRun::with_manifest(
        NO_NETWORK,
        &format!(
            "[agent]\nname = \"nonet\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 300\n\n\
             [network]\negress = [\"http://{addr}/**\"]\n\n\
             [[integrations]]\nnamespace = \"open\"\nauthorized_uris = [\"http://{addr}/**\"]\n"
        ),
    )
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", &addr.ip().to_string());
    std::fs::write(run.agent_dir.join("target.txt"), format!("{addr} {subnet}")).unwrap();
    let (child, id, seen) = start_docker_until(&run, "probed");

    // While it runs: its sockets' directory holds the sidecar's two
    // sockets and nothing else (the resolver file is beside it).
    let sock_dir = run.home.path().join("runs").join(&id).join("sock");
    let mut names: Vec<String> = std::fs::read_dir(&sock_dir)
        .unwrap_or_else(|e| panic!("{}: {e}; {seen}", sock_dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["proxy.sock", "sidecar.sock"],
        "{}",
        sock_dir.display()
    );
    let mode = std::fs::metadata(&sock_dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o711, "the sandbox may cross it, not list it");
    // No network of the run's; the agent on none, the sidecar on the
    // egress network alone.
    let nets = docker(&[
        "network",
        "ls",
        "-q",
        "--filter",
        &format!("label=airlock.run={id}"),
    ]);
    assert_eq!(
        String::from_utf8_lossy(&nets.stdout).trim(),
        "",
        "a run network"
    );
    let agent = docker_inspect(
        "container",
        &airlock_sandbox::docker::container_name(&id, "agent"),
    )
    .unwrap();
    assert_eq!(agent["HostConfig"]["NetworkMode"], "none", "{agent}");
    let agent_nets: Vec<&String> = agent["NetworkSettings"]["Networks"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(agent_nets, ["none"]);
    let mounts = agent["Mounts"].as_array().unwrap();
    let sockets_mount = mounts
        .iter()
        .find(|m| m["Destination"] == "/run/airlock")
        .unwrap_or_else(|| panic!("{mounts:?}"));
    assert_eq!(sockets_mount["RW"], false, "{sockets_mount}");
    let sidecar = docker_inspect(
        "container",
        &airlock_sandbox::docker::container_name(&id, "sidecar"),
    )
    .unwrap();
    let sidecar_nets: Vec<&String> = sidecar["NetworkSettings"]["Networks"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(sidecar_nets, [airlock_sandbox::docker::EGRESS_NETWORK]);

    std::fs::write(run.agent_dir.join("release"), "").unwrap();
    let report = support::finish_run(child);
    assert_eq!(report["status"], "succeeded", "{report}");
    let r = result_of(&report);
    assert_eq!(r["interfaces"], json!(["lo"]), "{r}");
    assert_eq!(r["routes"], json!([]), "no IPv4 route at all: {r}");
    for dev in r["routes6"].as_array().unwrap() {
        assert_eq!(dev, "lo", "an IPv6 route off loopback: {r}");
    }
    // Every address of the egress network and the server's: no route, so
    // the kernel refused each at once.
    let seen = r["egress_network"].as_object().unwrap();
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        [ENETUNREACH],
        "only ENETUNREACH: {seen:?}"
    );
    let hosts = u64::try_from(subnet.hosts().count()).unwrap();
    assert_eq!(seen[ENETUNREACH], json!((hosts + 1) * 3));
    // The sockets' directory: two sockets, not listed, not changed.
    assert_eq!(
        r["sockets"],
        json!({"sidecar.sock": true, "proxy.sock": true}),
        "{r}"
    );
    assert_eq!(r["list"], json!(EACCES), "{r}");
    for what in ["create", "unlink", "bind", "chmod"] {
        assert_eq!(r[what], json!(EROFS), "{what}: {r}");
    }
    assert!(
        r["mount"].as_array().unwrap().iter().all(|o| o
            .as_str()
            .unwrap()
            .split(',')
            .any(|f| f == "ro")),
        "{r}"
    );
    // The legitimate way: both reached the server, through the sidecar.
    assert_eq!(r["proxied"], json!([200, "hello agent"]), "{r}");
    assert_eq!(r["tool"][0], 200, "{r}");
    assert!(
        r["tool"][1].as_str().unwrap().contains("hello agent"),
        "{r}"
    );
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 2, "{r}");
    assert_clean(&run, &report);
}

#[test]
fn runs_end_with_their_real_reason_and_leave_nothing() {
    if !docker_available() {
        return;
    }
    // The sidecar's container dies: the run fails, the agent is stopped.
    let run = RealRun::python(
        "import time\nprint('ready', flush=True)\ntime.sleep(60)\n",
        120,
    );
    let (child, id, _) = start_docker_until(&run, "ready");
    let t = Instant::now();
    let k = docker(&[
        "kill",
        &airlock_sandbox::docker::container_name(&id, "sidecar"),
    ]);
    assert!(k.status.success(), "{}", String::from_utf8_lossy(&k.stderr));
    let report = support::finish_run(child);
    assert!(t.elapsed() < Duration::from_secs(20), "the run went on");
    assert_eq!(report["status"], "failed", "{report}");
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("the sidecar stopped unexpectedly"),
        "{report}"
    );
    assert_clean(&run, &report);

    // The agent kills the runtime: named as such, not as the agent's exit.
    let run = RealRun::python(
        "import os, time\nos.kill(os.getppid(), 9)\ntime.sleep(30)\n",
        60,
    );
    let (_, report) = run.run("docker");
    assert_eq!(report["status"], "failed", "{report}");
    let err = report["error"].as_str().unwrap();
    assert!(
        err.contains("the runtime in the sandbox ended without reporting the agent's end"),
        "{err}"
    );
    assert_clean(&run, &report);

    // A program that does not exist in the image: the runtime's own words.
    let run = RealRun::with_manifest("", "[agent]\nname = \"t\"\ncommand = [\"/nope/agent\"]\n");
    let (_, report) = run.run("docker");
    let err = report["error"].as_str().unwrap();
    assert!(
        err.contains("cannot start the agent") && err.contains("/nope/agent"),
        "{err}"
    );
    assert_clean(&run, &report);

    // The agent's own exit code; then the timeout.
    let run = RealRun::python("import sys\nsys.exit(3)\n", 30);
    let (_, report) = run.run("docker");
    assert_eq!(report["exit_code"], 3, "{report}");
    assert_eq!(report["error"], "the agent exited with code 3");
    assert_clean(&run, &report);
    let run = RealRun::python("import time\ntime.sleep(60)\n", 2);
    let (_, report) = run.run("docker");
    assert_eq!(report["status"], "timed_out", "{report}");
    assert_clean(&run, &report);
}

/// Every build of Airlock tags its images with its build id: `airlock images
/// prune` removes the tags of other builds, keeps this build's two and any a
/// container still uses.
#[test]
fn images_of_other_builds_are_pruned_and_those_in_use_kept() {
    if !docker_available() {
        return;
    }
    let check = std::process::Command::new(support::AIRLOCK)
        .args(["images", "check"])
        .output()
        .unwrap();
    assert!(check.status.success());
    let current: Vec<String> = String::from_utf8_lossy(&check.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("✓ "))
        .map(str::to_owned)
        .collect();
    assert_eq!(current.len(), 2, "{current:?}");
    let pid = std::process::id();
    let old_agent = format!("airlock-agent:0.0.0-prune{pid}");
    let old_sidecar = format!("airlock-sidecar:0.0.0-prune{pid}");
    let used = format!("airlock-agent:0.0.0-used{pid}");
    // Images of their own (as another build's are), built on this build's.
    for (from, to) in [
        (&current[0], &old_agent),
        (&current[1], &old_sidecar),
        (&current[0], &used),
    ] {
        let mut b = std::process::Command::new("docker")
            .args(["build", "-q", "-t", to, "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::io::Write::write_all(
            b.stdin.as_mut().unwrap(),
            format!("FROM {from}\nLABEL airlock.test-prune={to}\n").as_bytes(),
        )
        .unwrap();
        drop(b.stdin.take());
        assert!(b.wait().unwrap().success(), "docker build {to}");
    }
    let holder = format!("airlock-prune-test-{pid}");
    assert!(
        docker(&["create", "--name", &holder, &used, "true"])
            .status
            .success()
    );
    let out = std::process::Command::new(support::AIRLOCK)
        .args(["images", "prune"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = docker(&["rm", "-f", &holder]);
    let still_used = docker_inspect("image", &used).is_some();
    let _ = docker(&["rmi", &used]);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("removed {old_agent}")), "{text}");
    assert!(text.contains(&format!("removed {old_sidecar}")), "{text}");
    assert!(
        text.contains(&format!("kept {used} (a container uses it)")),
        "{text}"
    );
    assert!(still_used, "the image a container uses is still there");
    for gone in [&old_agent, &old_sidecar] {
        assert!(
            docker_inspect("image", gone).is_none(),
            "{gone} is still there"
        );
    }
    for here in &current {
        assert!(
            docker_inspect("image", here).is_some(),
            "this build's {here} was removed"
        );
    }
}

#[test]
fn bad_docker_settings_are_refused_before_anything_starts() {
    if !docker_available() {
        return;
    }
    for (env, must) in [
        (vec![("DOCKER_HOST", "ftp://nowhere")], "DOCKER_HOST"),
        (vec![("DOCKER_RUNTIME", "run c")], "DOCKER_RUNTIME"),
        (
            vec![("DOCKER_EGRESS_SUBNET", "10.213.0.0/28")],
            "DOCKER_EGRESS_SUBNET",
        ),
        (
            vec![
                ("AGENT_IMAGE", "x/agent:1.0.0"),
                ("SIDECAR_IMAGE", "x/sidecar:1.0.1"),
            ],
            "different tags",
        ),
        (vec![("AGENT_IMAGE", "Not An Image")], "AGENT_IMAGE"),
        (
            vec![
                ("AGENT_IMAGE", "airlock-test-missing/a:7"),
                ("PI_IMAGE", "airlock-test-missing/s:7"),
            ],
            "not on the docker daemon",
        ),
    ] {
        let mut run = RealRun::python("print('never')\n", 30);
        for (k, v) in &env {
            run = run.env(k, v);
        }
        let (out, _) = run.run("docker");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{env:?}: {stderr}");
        assert!(stderr.contains(must), "{env:?}: {stderr}");
        assert!(!stderr.contains("never"), "{stderr}");
        let listed = run.airlock(&["runs", "list", "--json"]);
        let text = String::from_utf8_lossy(&listed.stdout);
        assert!(!text.contains("run_"), "a run was recorded: {text}");
    }
}

#[test]
fn boot_reclaim_spares_a_live_platforms_run_and_takes_a_dead_ones() {
    if !docker_available() {
        return;
    }
    // Platform A: a run that waits for the test.
    let a = RealRun::python(
        "import os, time\nprint('ready', flush=True)\nwhile not os.path.exists('release'):\n    time.sleep(0.05)\n",
        300,
    );
    let (mut a_proc, a_run, _) = start_docker_until(&a, "ready");
    let a_objects = docker_leftovers(&a_run);
    assert_eq!(
        a_objects.len(),
        2,
        "two containers and no network: {a_objects:?}"
    );

    // Platform B boots (and reclaims) while A lives: A's run is untouched.
    let b = RealRun::python("print('b ran')\n", 60);
    let (out, report) = b.run("docker");
    assert_eq!(
        report["status"],
        "succeeded",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        docker_leftovers(&a_run),
        a_objects,
        "B's boot touched A's live run"
    );
    let running = docker(&[
        "inspect",
        "-f",
        "{{.State.Running}}",
        &airlock_sandbox::docker::container_name(&a_run, "agent"),
    ]);
    assert_eq!(String::from_utf8_lossy(&running.stdout).trim(), "true");

    // A dies without cleaning up (SIGKILL): its containers outlive it,
    // until a platform boots. (Any platform's boot reclaims a dead one's
    // objects: in a suite whose tests run at once, another test's may come
    // first, as it did under CI's load; so C's boot is the latest.)
    a_proc.kill().unwrap();
    a_proc.wait().unwrap();
    let outlived = docker_leftovers(&a_run);
    assert!(
        outlived.iter().all(|o| a_objects.contains(o)),
        "{outlived:?}"
    );

    // The next platform to boot (another home) reclaims them.
    let c = RealRun::python("print('c ran')\n", 60);
    let (out, report) = c.run("docker");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(report["status"], "succeeded", "{stderr}");
    assert_eq!(docker_leftovers(&a_run), Vec::<String>::new(), "{stderr}");

    // And A's own store learns the run's end at its next boot.
    std::fs::write(a.agent_dir.join("release"), "").unwrap();
    let (_, report) = a.run("docker");
    assert_eq!(report["status"], "succeeded");
    let shown: Value =
        serde_json::from_slice(&a.airlock(&["runs", "show", &a_run, "--json"]).stdout).unwrap();
    assert_eq!(shown["status"], "failed", "{shown}");
    assert!(
        shown["error"]
            .as_str()
            .unwrap()
            .contains("the platform stopped while this run was running"),
        "{shown}"
    );
}

const GVISOR_AGENT: &str = r#"
import json, os, socket, urllib.request
r = {"release": os.uname().release, "version": open("/proc/version").read()[:80]}
r["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
targets = open(os.environ["AIRLOCK_PROMPT_FILE"]).read().split()
for l in open("/proc/net/route").read().splitlines()[1:]:
    f = l.split()
    if f[1] == "00000000":
        targets.append(socket.inet_ntoa(int(f[2], 16).to_bytes(4, "little")) + ":" + targets[0].rsplit(":", 1)[1])
r["connect"] = {}
for t in targets:
    h, p = t.rsplit(":", 1)
    try:
        socket.create_connection((h, int(p)), timeout=5).close()
        r["connect"][t] = "CONNECTED"
    except OSError as e:
        r["connect"][t] = str(e)
h = {"content-type": "application/json", "accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}
body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "g", "version": "1"}}}
req = urllib.request.Request(os.environ["AIRLOCK_MCP_URL"], data=json.dumps(body).encode(), headers=h)
with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=20) as resp:
    r["mcp"] = resp.status
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;

/// The gVisor runtime the operator registered (`.ci/run` registers
/// `runsc-host`: gVisor with the container's own network namespace, the
/// only networking of Debian's runsc that works on this kernel).
fn gvisor_runtime() -> Option<String> {
    let name = std::env::var("AIRLOCK_TEST_GVISOR_RUNTIME").unwrap_or_else(|_| "runsc-host".into());
    let out = docker(&["info", "--format", "{{json .Runtimes}}"]);
    let known: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    if known.get(&name).is_some() {
        return Some(name);
    }
    airlock_test_support::require_peer(
        "a gVisor runtime",
        Err(format!("no runtime {name} registered with dockerd")),
    )
}

#[test]
fn under_gvisor_the_agent_sees_gvisors_kernel_and_still_reaches_only_its_sidecar() {
    if !docker_available() {
        return;
    }
    let Some(runtime) = gvisor_runtime() else {
        return;
    };
    let listener = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .unwrap();
    let targets: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|a| !a.contains(':'))
        .map(|a| format!("{a}:{port}"))
        .collect();
    assert!(!targets.is_empty());
    let run = RealRun::python(GVISOR_AGENT, 120).env("DOCKER_RUNTIME", &runtime);
    let out = run
        .command("docker", &["--prompt", &targets.join(" ")])
        .output()
        .unwrap();
    let report = succeeded(&out);
    let r = result_of(&report);
    let host_release = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    assert_ne!(
        r["release"],
        host_release.as_str(),
        "the host's kernel answered: {r}"
    );
    assert_eq!(r["mcp"], 200, "the sidecar is reached: {r}");
    assert_eq!(
        r["interfaces"],
        json!(["lo"]),
        "no network under gVisor either: {r}"
    );
    for (t, v) in r["connect"].as_object().unwrap() {
        assert_ne!(v, "CONNECTED", "{t} was reached under gVisor: {r}");
    }
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the host listener saw a connection: {other:?}"),
    }
    assert_clean(&run, &report);
}

/// A TCP front for the daemon's unix socket, as a remote `DOCKER_HOST`
/// would be: counts the connections it carries.
fn tcp_front_for_the_daemon() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let s = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            s.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let Ok(u) = std::os::unix::net::UnixStream::connect("/var/run/docker.sock") else {
                continue;
            };
            let (mut c2, mut u2) = (c.try_clone().unwrap(), u.try_clone().unwrap());
            let (mut c, mut u) = (c, u);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut u2);
                let _ = u2.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut u, &mut c);
                let _ = c.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (port, seen)
}

#[test]
fn a_tcp_docker_host_works_and_doctor_reports_the_daemon() {
    if !docker_available() {
        return;
    }
    let (port, seen) = tcp_front_for_the_daemon();
    let host = format!("tcp://127.0.0.1:{port}");
    let run = RealRun::python("print('over tcp')\n", 60).env("DOCKER_HOST", &host);
    let (out, report) = run.run("docker");
    assert_eq!(
        report["status"],
        "succeeded",
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        seen.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "the run went through DOCKER_HOST"
    );
    assert_clean(&run, &report);
    let doctor = std::process::Command::new(support::AIRLOCK)
        .arg("doctor")
        .env("DOCKER_HOST", &host)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&doctor.stdout);
    for (feature, must) in [
        ("docker daemon", format!("at {host}, API 1.")),
        (
            "runtime runc",
            "starts containers, with and without a network".into(),
        ),
        ("agent image", "present".into()),
        ("sidecar image", "present".into()),
        ("image tag contract", "agree".into()),
        ("egress network", "inter-container traffic off".into()),
    ] {
        let line = text
            .lines()
            .find(|l| l.contains(feature))
            .unwrap_or_else(|| panic!("doctor says nothing of {feature}: {text}"));
        assert!(line.contains('✓') && line.contains(&must), "{line}");
    }
    assert!(text.contains("✓ docker "), "{text}");
}

/// A client that never reads the proxy variables (`http.client`): by name,
/// through the sandbox's resolver and the transparent plane only, over TLS
/// checked against the test's CA.
const NO_PROXY_CLIENT: &str = r#"
import http.client, json, os, socket, ssl
port = int(open(os.environ["AIRLOCK_PROMPT_FILE"]).read().strip())
tls = ssl.create_default_context(cafile="test-ca.pem")
r = {"resolv": open("/etc/resolv.conf").read()}
def get(host):
    try:
        c = http.client.HTTPSConnection(host, port, timeout=20, context=tls)
        c.request("GET", "/plane")
        resp = c.getresponse()
        return [resp.status, resp.read().decode()]
    except Exception as e:
        return ["error", repr(e)]
r["allowed"] = get("api.test")
r["other"] = get("other.test")
r["api_addr"] = socket.gethostbyname("api.test")
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_ignores_the_proxy_gets_out_through_the_transparent_plane_and_only_where_allowed()
 {
    if !docker_available() {
        return;
    }
    // The test's own HTTPS server on this host's egress-network address.
    let gateway = tokio::task::spawn_blocking(support::docker_egress_gateway)
        .await
        .unwrap();
    let ca = crate::support::tls::test_ca();
    let l = tokio::net::TcpListener::bind((gateway, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = hits.clone();
    crate::support::tls::serve_https(
        l,
        crate::support::tls::acceptor_for(&["api.test", "other.test"], &ca),
        move |_req| {
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from_static(
                b"hello agent",
            )))
        },
    );
    let run = RealRun::with_manifest(
        NO_PROXY_CLIENT,
        &format!(
            "[agent]\nname = \"plane\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 120\n\n[network]\negress = [\"https://api.test:{port}/**\"]\n"
        ),
    )
    .env("EGRESS_RESOLVE", &format!("api.test={gateway}"))
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", "api.test");
    std::fs::write(run.agent_dir.join("test-ca.pem"), ca.issuer.pem()).unwrap();
    let (out, run) = tokio::task::spawn_blocking(move || {
        let out = run
            .command("docker", &["--prompt", &port.to_string()])
            .output()
            .unwrap();
        (out, run)
    })
    .await
    .unwrap();
    let report = succeeded(&out);
    let r = result_of(&report);
    // The runtime's responder alone: the container has nothing else to ask.
    let servers: Vec<&str> = r["resolv"]
        .as_str()
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("nameserver "))
        .collect();
    assert_eq!(servers, ["127.0.0.53"], "{r}");
    assert!(
        r["api_addr"].as_str().unwrap().starts_with("127.18."),
        "a synthetic answer: {r}"
    );
    assert_eq!(
        r["allowed"],
        json!([200, "hello agent"]),
        "{r}\n{}",
        report["egress"]
    );
    assert_eq!(r["other"][0], "error", "{r}");
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the allowed request reached the server"
    );
    let entries = report["egress"]["entries"].as_array().unwrap();
    let decided = |host: &str| -> Vec<(String, String)> {
        support::egress_to(&report, host, port)
            .into_iter()
            .map(|e| {
                (
                    e["decision"].as_str().unwrap_or_default().to_owned(),
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    assert_eq!(
        decided("api.test"),
        [("allowed".to_owned(), String::new())],
        "{entries:#?}"
    );
    assert_eq!(
        decided("other.test"),
        [("refused".to_owned(), "not_authorized".to_owned())],
        "{entries:#?}"
    );
    assert_clean(&run, &report);
}

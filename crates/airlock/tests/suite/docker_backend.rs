//! Escape tests for the `docker` backend, driven from the attacker's side at
//! the backend level: the real backend starts an agent container (the
//! isolation probe, bound read-only, or the image's python3) that tries to
//! get out; each test asserts the attempt FAILED and that the legitimate
//! path still works (the sidecar's unix socket, where the test listens in
//! its place, is reached, so a test that reaches nothing cannot pass by
//! accident).
//!
//! Network rule: packets go only to loopback, to containers these tests
//! start, and to this host's own addresses (its Docker bridges among them),
//! where the tests' own listeners wait. The agent has no route at all: its
//! kernel refuses every address off its loopback before a packet leaves.
//!
//! Needs a Docker daemon: under `CI` a missing one fails loudly, elsewhere
//! the tests print SKIPPED.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use crate::support;
use std::net::{IpAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use airlock_sandbox::docker::DockerBackend;
use airlock_sandbox::{Backend, SandboxSpec};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::support::{
    Outcome, docker, docker_available, docker_inspect, docker_leftovers, finish_sandbox, probe_exe,
};

fn backend() -> Option<DockerBackend> {
    docker_available().then(|| support::docker_backend().unwrap())
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn run_id() -> String {
    format!(
        "d{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

struct Run {
    spec: SandboxSpec,
    dir: tempfile::TempDir,
}

/// A spec like the orchestrator's: a read-only directory of the test's
/// (the agent's), the probe bound read-only, a small workspace.
fn spec(command: Vec<String>) -> Run {
    let dir = tempfile::Builder::new()
        .prefix("airlock-dock-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The sidecar's sockets' directory, as the platform makes it.
    let sock = dir.path().join("sock");
    std::fs::create_dir(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o711)).unwrap();
    Run {
        spec: SandboxSpec {
            run_id: run_id(),
            command,
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("HOME".into(), "/workspace".into()),
            ],
            stdin: vec![],
            hold_stdin: false,
            sockets_dir: sock,
            ro_paths: vec![probe_exe(), dir.path().to_owned()],
            workspace: PathBuf::from("/workspace"),
            workspace_size_mb: 16,
            memory_mb: 256,
            cpus: 1.0,
            pids_max: 64,
            kind: airlock_sandbox::SandboxKind::Agent,
        },
        dir,
    }
}

fn probe_cmd(args: &[&str]) -> Vec<String> {
    let mut v = vec![probe_exe().display().to_string()];
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

fn python(script: &str) -> Vec<String> {
    vec!["/usr/bin/python3".into(), "-c".into(), script.into()]
}

async fn run(b: &DockerBackend, spec: &SandboxSpec) -> Outcome {
    let sb = b.spawn(spec).expect("spawn");
    finish_sandbox(sb, Duration::from_secs(60)).await
}

fn failed(v: &Value) -> bool {
    v.get("ok") == Some(&Value::Bool(false))
}

fn assert_gone(run_id: &str) {
    let left = docker_leftovers(run_id);
    assert!(left.is_empty(), "left on the daemon: {left:?}");
}

#[tokio::test]
async fn stdin_workspace_and_nothing_else_is_writable() {
    let Some(b) = backend() else { return };
    let mut r = spec(vec![]);
    let id = r.spec.run_id.clone();
    let agent_dir = r.dir.path().display().to_string();
    let targets: Vec<String> = vec![
        format!("/usr/airlock-escape-{id}"),
        format!("/usr/bin/airlock-escape-{id}"),
        format!("/etc/airlock-escape-{id}"),
        format!("/airlock-escape-{id}"),
        format!("/root/airlock-escape-{id}"),
        format!("/var/tmp/airlock-escape-{id}"),
        format!("/dev/airlock-escape-{id}"),
        format!("/dev/shm/airlock-escape-{id}"),
        "/etc/hosts".into(),
        "/etc/resolv.conf".into(),
        "/proc/sys/kernel/hostname".into(),
        "/proc/sysrq-trigger".into(),
        format!("{agent_dir}/planted"),
        probe_exe().display().to_string(),
        "/usr/local/bin/airlock".into(),
    ];
    let mut args = vec!["--stdin".to_string()];
    for t in targets
        .iter()
        .chain([&"/workspace/ok".to_string(), &"/tmp/ok".to_string()])
    {
        args.push("--write".into());
        args.push(t.clone());
    }
    r.spec.stdin = b"the-run-secrets".to_vec();
    r.spec.command = probe_cmd(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let o = run(&b, &r.spec).await;
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    let j = o.json();
    assert_eq!(j["stdin"]["value"], "the-run-secrets", "{j}");
    for t in &targets {
        assert!(
            failed(&j["write"][t]),
            "{t} must not be writable: {}",
            j["write"]
        );
    }
    assert_eq!(j["write"]["/workspace/ok"]["ok"], true, "{}", j["write"]);
    assert_eq!(j["write"]["/tmp/ok"]["ok"], true, "{}", j["write"]);
    assert!(!r.dir.path().join("planted").exists());
    assert_eq!(j["cwd"], "/workspace");
    let env = j["env"].as_object().unwrap();
    let names: Vec<&String> = env.keys().collect();
    assert!(
        names
            .iter()
            .all(|k| ["PATH", "HOME", "HOSTNAME"].contains(&k.as_str())),
        "only the given environment (and Docker's HOSTNAME): {names:?}"
    );
    assert_eq!(j["hostname"], "airlock");
    // A dedicated unprivileged host uid (no user namespace: it is the host's).
    let ids = airlock_sandbox::docker::agent_ids(&r.spec.run_id);
    assert_eq!(j["uid"], ids.uid, "{j}");
    assert!(ids.uid >= 0x5A00_0000);
    for k in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(j["status"][k], "0000000000000000", "{k}: {}", j["status"]);
    }
    assert_eq!(j["status"]["NoNewPrivs"], "1", "{}", j["status"]);
    assert_eq!(j["status"]["Seccomp"], "2", "{}", j["status"]);
    assert_gone(&r.spec.run_id);
}

#[tokio::test]
async fn no_raw_sockets_no_namespaces_no_mounts_and_setuid_grants_nothing() {
    let Some(b) = backend() else { return };
    let mut r = spec(vec![]);
    let suid = r.dir.path().join("probe-suid");
    std::fs::copy(probe_exe(), &suid).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    r.spec.command = probe_cmd(&["--setuid", suid.to_str().unwrap()]);
    let o = run(&b, &r.spec).await;
    let j = o.json();
    for k in ["inet_raw_icmp", "inet6_raw", "packet_raw", "packet_dgram"] {
        assert!(failed(&j["raw_sockets"][k]), "{k}: {}", j["raw_sockets"]);
    }
    assert!(failed(&j["unshare_user"]), "{j}");
    assert!(failed(&j["mount_tmpfs"]), "{j}");
    let nested = &j["setuid"];
    assert_eq!(
        nested["euid"], j["uid"],
        "the setuid bit changed nothing: {nested}"
    );
    assert_eq!(nested["status"]["CapEff"], "0000000000000000", "{nested}");
}

/// Every address of this host: loopback, its interfaces, its Docker bridges.
fn host_addresses() -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
    if let Ok(o) = std::process::Command::new("hostname").arg("-I").output() {
        v.extend(
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|s| s.parse::<IpAddr>().ok()),
        );
    }
    v.sort();
    v.dedup();
    v
}

/// A listener (in a container this test starts) that prints one line per
/// connection it accepts.
const LISTENER: &str = "import socket,sys\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('0.0.0.0',7777))\ns.listen(16)\nprint('listening',flush=True)\nwhile True:\n    c,a=s.accept()\n    print('ACCEPTED',a,flush=True)\n    c.close()\n";

/// The hostile agent of the network test: waits for its targets, tries each,
/// and reports, with its interfaces, routing tables and IPv6 state; then
/// its one legitimate peer, the sidecar's socket.
const ATTACKER: &str = r#"
import json, os, socket, sys, time
go = sys.argv[1]
deadline = time.time() + 60
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.02)
targets = json.load(open(go))
r = {"connect": {}}
def attempt(t):
    host, port = t.rsplit(":", 1)
    host = host.strip("[]")
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(8)
    try:
        s.connect((host, int(port)))
        r["connect"][t] = "CONNECTED"
    except OSError as e:
        r["connect"][t] = e.errno if e.errno is not None else "timeout"
    finally:
        s.close()
import threading
threads = [threading.Thread(target=attempt, args=(t,)) for t in targets]
for t in threads: t.start()
for t in threads: t.join()
r["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
r["routes"] = open("/proc/net/route").read().splitlines()[1:]
r["routes6"] = [l.split()[-1] for l in open("/proc/net/ipv6_route").read().splitlines()]
r["if_inet6"] = [l.split()[-1] for l in open("/proc/net/if_inet6").read().splitlines()]
r["docker_sock"] = [p for p in ("/var/run/docker.sock", "/run/docker.sock", "/var/run/docker", "/run/containerd/containerd.sock") if os.path.exists(p)]
r["mounts_docker"] = [l.split()[4] for l in open("/proc/self/mountinfo") if "docker.sock" in l or "containerd.sock" in l]
u = socket.socket(socket.AF_UNIX)
u.settimeout(10)
u.connect("/run/airlock/sidecar.sock")
r["sidecar"] = u.recv(64).decode()
print(json.dumps(r), flush=True)
"#;

fn ip_of(container: &str, network: &str) -> IpAddr {
    let c = docker_inspect("container", container).unwrap();
    c["NetworkSettings"]["Networks"][network]["IPAddress"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn gateway_of(network: &str) -> IpAddr {
    let n = docker_inspect("network", network).unwrap();
    n["IPAM"]["Config"][0]["Gateway"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Starts a listener container of the test's own on `network`; waits until it listens.
fn listener_container(name: &str, network: &str) {
    let b = support::docker_backend().unwrap();
    let image = b.cfg.images.agent.to_string();
    let out = docker(&[
        "run",
        "-d",
        "--rm",
        "--name",
        name,
        "--network",
        network,
        "--label",
        "airlock.test=1",
        &image,
        "/usr/bin/python3",
        "-c",
        LISTENER,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = Instant::now();
    while !String::from_utf8_lossy(&docker(&["logs", name]).stdout).contains("listening") {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{name} never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn accepted(name: &str) -> bool {
    String::from_utf8_lossy(&docker(&["logs", name]).stdout).contains("ACCEPTED")
}

struct Removed(Vec<String>);
impl Drop for Removed {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = docker(&["rm", "-f", n]);
        }
    }
}

/// The egress network has the configured range, not one of the daemon's
/// pools (which `.ci/docker.sh` makes /28s: 13 sidecars at most).
#[tokio::test]
async fn the_egress_network_has_the_configured_range() {
    let Some(b) = backend() else { return };
    b.ensure_egress_network().await.unwrap();
    let n = docker_inspect("network", airlock_sandbox::docker::EGRESS_NETWORK).unwrap();
    let subnets: Vec<&str> = n["IPAM"]["Config"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["Subnet"].as_str())
        .collect();
    assert_eq!(subnets, [b.cfg.egress_subnet.to_string()]);
    let gateway = gateway_of(airlock_sandbox::docker::EGRESS_NETWORK);
    assert!(matches!(gateway, IpAddr::V4(g) if b.cfg.egress_subnet.contains(&g)));
}

/// The agent's container has `lo` alone and no route: every address off
/// its loopback (another run's sidecar on the egress network, the egress
/// network's gateway, every address of the host) is refused by its own
/// kernel before a packet leaves (ENETUNREACH), and nothing reaches any
/// listener; its loopback is its own (the host's listeners are not there).
/// Its sidecar's unix socket, bound read-only at `/run/airlock`, is
/// reached. No network is made for the run.
#[tokio::test]
async fn the_agent_has_loopback_alone_and_reaches_only_its_sidecars_socket() {
    const EADDRNOTAVAIL: i64 = 99;
    const ENETUNREACH: i64 = 101;
    const ECONNREFUSED: i64 = 111;
    let Some(b) = backend() else { return };
    b.ensure_egress_network().await.unwrap();
    // The host: a listener on every address, and one on the wildcard.
    let mut listeners = vec![];
    for ip in host_addresses() {
        if let Ok(l) = TcpListener::bind((ip, 0)) {
            l.set_nonblocking(true).unwrap();
            listeners.push(l);
        }
    }
    let wildcard = TcpListener::bind(("0.0.0.0", 0)).unwrap();
    wildcard.set_nonblocking(true).unwrap();
    let wport = wildcard.local_addr().unwrap().port();

    // The attacker's run; the test stands in for its sidecar.
    let attacker = spec(vec![]);
    let go = attacker.dir.path().join("go");
    let mut a = attacker;
    a.spec.command = python(ATTACKER);
    a.spec.command.push(go.display().to_string());
    let sidecar_sock = a.spec.sockets_dir.join(airlock_sandbox::SIDECAR_SOCKET);
    let sidecar = std::os::unix::net::UnixListener::bind(&sidecar_sock).unwrap();
    std::fs::set_permissions(&sidecar_sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let answered = std::thread::spawn(move || {
        let (mut c, _) = sidecar.accept().unwrap();
        std::io::Write::write_all(&mut c, b"sidecar here").unwrap();
    });
    let sb = b.spawn(&a.spec).unwrap();
    // Another run's sidecar, on the shared egress network.
    let tag = std::process::id();
    let egress_victim = format!("airlock-test-egress-{tag}");
    let _removed = Removed(vec![egress_victim.clone()]);
    listener_container(&egress_victim, airlock_sandbox::docker::EGRESS_NETWORK);
    let egress_ip = ip_of(&egress_victim, airlock_sandbox::docker::EGRESS_NETWORK);
    let egress_gw = gateway_of(airlock_sandbox::docker::EGRESS_NETWORK);

    let fmt = |ip: IpAddr, port: u16| match ip {
        IpAddr::V4(_) => format!("{ip}:{port}"),
        IpAddr::V6(_) => format!("[{ip}]:{port}"),
    };
    let mut targets = vec![
        fmt(egress_ip, 7777),
        fmt(egress_gw, wport),
        format!("0.0.0.0:{wport}"),
        format!("127.0.0.1:{wport}"),
    ];
    for l in &listeners {
        let addr = l.local_addr().unwrap();
        targets.push(fmt(addr.ip(), addr.port()));
        targets.push(fmt(addr.ip(), wport));
    }
    std::fs::write(&go, serde_json::to_vec(&targets).unwrap()).unwrap();
    let mut sb = sb;
    let (out, _) = sb.take_output();
    let mut text = String::new();
    tokio::time::timeout(
        Duration::from_secs(120),
        out.unwrap().read_to_string(&mut text),
    )
    .await
    .unwrap()
    .unwrap();
    // While the run lives: no network of its own.
    let nets = docker(&[
        "network",
        "ls",
        "-q",
        "--filter",
        &format!("label=airlock.run={}", a.spec.run_id),
    ]);
    assert_eq!(String::from_utf8_lossy(&nets.stdout).trim(), "");
    let egress_reached = accepted(&egress_victim);
    let o = finish_sandbox(sb, Duration::from_secs(30)).await;
    let o = Outcome { stdout: text, ..o };
    let j = o.json();
    let c = &j["connect"];
    // The control: its sidecar's socket.
    answered.join().unwrap();
    assert_eq!(j["sidecar"], "sidecar here", "{j}");
    assert_eq!(j["interfaces"], json!(["lo"]), "{j}");
    assert_eq!(j["routes"], json!([]), "no IPv4 route: {j}");
    // No IPv6 at all: not even loopback's address.
    assert_eq!(j["if_inet6"], json!([]), "{j}");
    for dev in j["routes6"].as_array().unwrap() {
        assert_eq!(dev, "lo", "an IPv6 route off loopback: {j}");
    }
    for t in &targets {
        // Its own loopback refuses (nothing listens there); IPv6 has no
        // address to send from; every other address has no route.
        let want = if t.starts_with('[') {
            EADDRNOTAVAIL
        } else if t.starts_with("127.") || t.starts_with("0.0.0.0") {
            ECONNREFUSED
        } else {
            ENETUNREACH
        };
        assert_eq!(c[t], json!(want), "{t} from the agent: {c}");
    }
    // Nothing of it arrived anywhere.
    assert!(!egress_reached, "the egress network was reached");
    for l in listeners.iter().chain([&wildcard]) {
        match l.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("a host listener saw a connection: {other:?}"),
        }
    }
    // The Docker socket is nowhere in the agent's view.
    assert_eq!(j["docker_sock"], json!([]), "{j}");
    assert_eq!(j["mounts_docker"], json!([]), "{j}");
    assert_gone(&a.spec.run_id);
}

#[tokio::test]
async fn fork_bomb_and_memory_hog_are_contained() {
    let Some(b) = backend() else { return };
    let script = "import os,time,sys\nn=0\ntry:\n    while n < 1000:\n        p=os.fork()\n        if p==0:\n            time.sleep(60); os._exit(0)\n        n+=1\nexcept OSError as e:\n    print(n, e.errno); sys.exit(3)\nprint(n, 0)";
    let mut r = spec(python(script));
    r.spec.pids_max = 64;
    let o = run(&b, &r.spec).await;
    assert_eq!(o.status.code(), Some(3), "{} {}", o.stdout, o.stderr);
    let mut f = o.stdout.split_whitespace();
    let n: u32 = f.next().unwrap().parse().unwrap();
    assert!(n < 64, "forked {n} times");
    assert_eq!(f.next(), Some("11"), "EAGAIN");

    let mut r = spec(python(
        "b=[]\nfor i in range(64):\n    b.append(bytearray(16<<20))\nprint('allocated 1 GiB')",
    ));
    r.spec.memory_mb = 64;
    let o = finish_sandbox(b.spawn(&r.spec).unwrap(), Duration::from_secs(60)).await;
    assert!(
        !o.status.success(),
        "the hog must not get 1 GiB: {}",
        o.stdout
    );
    assert!(!o.stdout.contains("allocated"));
    assert_gone(&r.spec.run_id);
}

/// Host processes whose argv[0] is `marker`.
fn host_cmdlines_containing(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|b| b.split(|c| *c == 0).next() == Some(marker.as_bytes()))
        })
        .count()
}

#[tokio::test]
async fn a_daemon_does_not_outlive_the_container() {
    let Some(b) = backend() else { return };
    let marker = format!("airlock-daemon-{}", run_id());
    let script = format!(
        "import os,time,sys\nif os.fork()==0:\n    os.setsid()\n    if os.fork()==0:\n        os.execv('/bin/sleep', ['{marker}', '300'])\n    os._exit(0)\ntime.sleep(0.3)\nprint('ready', flush=True)\ntime.sleep(1.5)"
    );
    let r = spec(python(&script));
    let mut sb = b.spawn(&r.spec).unwrap();
    let (out, _) = sb.take_output();
    let mut out = out.unwrap();
    let mut buf = [0u8; 6];
    tokio::time::timeout(Duration::from_secs(30), out.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"ready\n");
    assert_eq!(
        host_cmdlines_containing(&marker),
        1,
        "the daemon runs while the container does"
    );
    let st = tokio::time::timeout(Duration::from_secs(30), sb.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(st.success());
    sb.cleanup().await;
    assert_eq!(
        host_cmdlines_containing(&marker),
        0,
        "the daemon outlived the container"
    );
    assert_gone(&r.spec.run_id);
}

#[tokio::test]
async fn writing_past_the_workspace_cap_fails_with_enospc() {
    let Some(b) = backend() else { return };
    let mut r = spec(probe_cmd(&["--fill", "/workspace/big"]));
    r.spec.workspace_size_mb = 4;
    let o = run(&b, &r.spec).await;
    let j = o.json();
    assert_eq!(j["fill"]["errno"], 28, "ENOSPC: {}", j["fill"]);
    assert!(j["fill"]["written"].as_u64().unwrap() <= 4 << 20);
}

#[tokio::test]
async fn the_containers_are_hardened_as_configured() {
    let Some(b) = backend() else { return };
    let r = spec(python("import time; time.sleep(60)"));
    let sb = b.spawn(&r.spec).unwrap();
    let name = airlock_sandbox::docker::container_name(&r.spec.run_id, "agent");
    let t = Instant::now();
    let c = loop {
        if let Some(c) = docker_inspect("container", &name)
            && c["State"]["Status"] != "created"
        {
            break c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{name} never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let h = &c["HostConfig"];
    assert_eq!(h["CapDrop"], json!(["ALL"]), "{h}");
    assert_eq!(h["Privileged"], false);
    assert_eq!(h["ReadonlyRootfs"], true);
    assert_eq!(h["PidsLimit"], 64);
    assert_eq!(h["Memory"], 256 << 20);
    assert_eq!(h["MemorySwap"], 256 << 20, "no swap beyond the limit");
    assert_eq!(h["NanoCpus"], 1_000_000_000i64);
    assert_eq!(h["IpcMode"], "none");
    assert_eq!(
        h["LogConfig"]["Type"], "none",
        "the agent's output fills no log file on the host"
    );
    let sec: Vec<&str> = h["SecurityOpt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(sec.contains(&"no-new-privileges:true"), "{sec:?}");
    assert!(sec.iter().any(|s| s.starts_with("seccomp=")), "{sec:?}");
    let mounts = c["Mounts"].as_array().unwrap();
    for m in mounts {
        assert_eq!(m["RW"], false, "a writable bind mount: {m}");
        assert!(
            !m["Source"].as_str().unwrap().contains("docker.sock"),
            "{m}"
        );
    }
    assert!(
        mounts.iter().any(|m| m["Destination"] == "/run/airlock"),
        "the sidecar's sockets' directory: {mounts:?}"
    );
    let labels = &c["Config"]["Labels"];
    assert_eq!(labels["airlock.managed"], "true");
    assert_eq!(labels["airlock.run"], r.spec.run_id.as_str());
    assert_eq!(labels["airlock.role"], "agent");
    assert_eq!(h["NetworkMode"], "none", "no network: {h}");
    assert!(
        docker_inspect(
            "network",
            &airlock_sandbox::docker::network_name(&r.spec.run_id)
        )
        .is_none(),
        "no run network"
    );
    sb.kill();
    let o = finish_sandbox(sb, Duration::from_secs(30)).await;
    assert!(!o.status.success());
    assert_gone(&r.spec.run_id);
}

#[tokio::test]
async fn a_container_that_cannot_start_says_why() {
    if !docker_available() {
        return;
    }
    let exe = std::path::Path::new(support::AIRLOCK);
    let vars = [
        ("AGENT_IMAGE", "airlock-test-missing/agent:none"),
        ("SIDECAR_IMAGE", "airlock-test-missing/sidecar:none"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let cfg = airlock_sandbox::docker::DockerConfig::from_vars(&vars, exe).unwrap();
    let b = DockerBackend::new(cfg);
    let r = spec(vec!["/bin/true".into()]);
    let o = run(&b, &r.spec).await;
    assert_eq!(o.status.code(), Some(125), "{}", o.stderr);
    assert!(
        o.stderr
            .starts_with("airlock sandbox-init: docker: creating")
            && o.stderr.contains("airlock-test-missing/agent:none"),
        "{}",
        o.stderr
    );
    assert_gone(&r.spec.run_id);
}

#[tokio::test]
async fn twenty_concurrent_containers_all_succeed_and_leave_nothing() {
    let Some(b) = backend() else { return };
    let b = std::sync::Arc::new(b);
    let runs: Vec<Run> = (0..20)
        .map(|i| spec(vec!["/bin/sh".into(), "-c".into(), format!("echo run-{i}")]))
        .collect();
    let mut handles = vec![];
    for (i, r) in runs.iter().enumerate() {
        let sb = b.spawn(&r.spec).unwrap();
        handles.push(tokio::spawn(async move {
            (i, finish_sandbox(sb, Duration::from_secs(120)).await)
        }));
    }
    for h in handles {
        let (i, o) = h.await.unwrap();
        assert!(o.status.success(), "run {i}: {}", o.stderr);
        assert_eq!(o.stdout.trim(), format!("run-{i}"));
    }
    for r in &runs {
        assert_gone(&r.spec.run_id);
    }
}

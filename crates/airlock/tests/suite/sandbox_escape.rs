//! Escape tests for the `namespace` backend, driven from the attacker's side:
//! the real `airlock` binary runs `airlock probe` (or python3) inside a
//! sandbox and tries to get out; each test asserts the attempt FAILED and
//! that the legitimate path still works.
//!
//! Network rule: nothing here sends a packet anywhere but loopback or the
//! sandbox's own namespace; "the host" is represented by listeners this test
//! binds on this machine's own addresses.
//!
//! Needs root or unprivileged user namespaces: under `CI` a missing
//! capability fails loudly, elsewhere the tests print SKIPPED.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use airlock_sandbox::namespace::NamespaceBackend;
use airlock_sandbox::{Backend, SandboxSpec};
use serde_json::Value;
use tokio::io::AsyncReadExt;

use crate::support::{AIRLOCK, Outcome, finish_sandbox, probe_exe};

fn backend() -> Option<NamespaceBackend> {
    let b = NamespaceBackend::with_exe(PathBuf::from(AIRLOCK));
    airlock_test_support::require_peer("the namespace backend", b.check().map_err(|why| why.0))?;
    Some(b)
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn run_id() -> String {
    format!(
        "t{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

struct Run {
    spec: SandboxSpec,
    _dir: tempfile::TempDir,
}

fn spec(command: Vec<String>) -> Run {
    let dir = tempfile::Builder::new()
        .prefix("airlock-sbx-")
        .tempdir()
        .unwrap();
    let sockets_dir = dir.path().join("sock");
    std::fs::create_dir(&sockets_dir).unwrap();
    std::fs::set_permissions(&sockets_dir, std::fs::Permissions::from_mode(0o711)).unwrap();
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
            sockets_dir,
            ro_paths: vec![probe_exe()],
            workspace: PathBuf::from("/workspace"),
            workspace_size_mb: 16,
            memory_mb: 256,
            cpus: 1.0,
            pids_max: 64,
            kind: airlock_sandbox::SandboxKind::Agent,
        },
        _dir: dir,
    }
}

fn probe_cmd(args: &[&str]) -> Vec<String> {
    let mut v = vec![probe_exe().display().to_string()];
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

async fn run(b: &NamespaceBackend, spec: &SandboxSpec) -> Outcome {
    let sb = b.spawn(spec).expect("spawn");
    finish_sandbox(sb, Duration::from_secs(60)).await
}

use crate::support::run_cgroup_dirs as cgroup_dirs;

/// Host processes whose argv[0] is `marker`.
fn host_cmdlines_containing(marker: &str) -> Vec<i32> {
    let mut hits = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(b) = std::fs::read(e.path().join("cmdline"))
            && b.split(|c| *c == 0).next() == Some(marker.as_bytes())
        {
            hits.push(pid);
        }
    }
    hits
}

fn failed(v: &Value) -> bool {
    v.get("ok") == Some(&Value::Bool(false))
}

#[tokio::test]
async fn legit_path_stdin_workspace_unix_socket_and_python() {
    let Some(b) = backend() else { return };
    let mut r = spec(vec![]);
    let sock = r.spec.sockets_dir.join("sidecar.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    // The sandbox's uid is not ours: the socket is for anyone who reaches it.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut line = String::new();
        s.read_to_string(&mut line).unwrap();
        s.write_all(format!("pong:{}", line.trim()).as_bytes())
            .unwrap();
    });
    r.spec.stdin = b"the-run-secrets".to_vec();
    r.spec.command = probe_cmd(&[
        "--stdin",
        "--unix",
        "/run/airlock/sidecar.sock",
        "--write",
        "/workspace/notes.txt",
        "--write",
        "/run/airlock/planted",
    ]);
    let o = run(&b, &r.spec).await;
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    let j = o.json();
    assert_eq!(j["stdin"]["value"], "the-run-secrets", "{j}");
    assert_eq!(
        j["unix"]["value"], "pong:ping",
        "the sidecar's socket is reachable, read-only: {j}"
    );
    assert_eq!(j["write"]["/workspace/notes.txt"]["ok"], true, "{j}");
    assert!(
        failed(&j["write"]["/run/airlock/planted"]),
        "the sockets' directory is read-only: {j}"
    );
    assert!(!r.spec.sockets_dir.join("planted").exists());
    assert_eq!(j["cwd"], "/workspace");
    assert_eq!(
        j["env"].as_object().unwrap().len(),
        2,
        "only the given environment: {}",
        j["env"]
    );
    assert_eq!(j["hostname"], "airlock");
    server.join().unwrap();

    // /usr/bin/python3 works inside, and stdin reaches it.
    let mut r = spec(vec![
        "/usr/bin/python3".into(),
        "-c".into(),
        "import sys,os; print(sys.stdin.read().upper(), os.getcwd())".into(),
    ]);
    r.spec.stdin = b"secret".to_vec();
    let o = run(&b, &r.spec).await;
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    assert_eq!(o.stdout.trim(), "SECRET /workspace");
    assert!(cgroup_dirs(&r.spec.run_id).is_empty(), "cgroups removed");
}

#[tokio::test]
async fn sees_no_host_process_and_cannot_touch_one() {
    let Some(b) = backend() else { return };
    let canary = format!("airlock-canary-{}", run_id());
    let mut victim = std::process::Command::new("/bin/sleep")
        .arg("60")
        .env("AIRLOCK_CANARY", &canary)
        .spawn()
        .unwrap();
    let vpid = i32::try_from(victim.id()).unwrap();
    let r = spec(probe_cmd(&[
        "--pid",
        &vpid.to_string(),
        "--canary",
        &canary,
    ]));
    let o = run(&b, &r.spec).await;
    victim.kill().unwrap();
    let _ = victim.wait();
    let j = o.json();
    let pids: Vec<i64> = j["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert!(
        pids.len() <= 3 && pids.contains(&1),
        "only the sandbox's own processes: {pids:?}"
    );
    assert!(!pids.contains(&(vpid as i64)) || vpid <= 3, "{pids:?}");
    assert!(failed(&j["environ_pid"]), "{j}");
    assert!(failed(&j["ptrace_pid"]), "{j}");
    assert!(failed(&j["process_vm_readv_pid"]), "{j}");
    assert!(failed(&j["kill_pid"]), "{j}");
    assert!(
        failed(&j["ptrace_init"]),
        "ptrace of its own init is denied too: {j}"
    );
    assert_eq!(j["canary_hits"], serde_json::json!([]), "{j}");
    assert!(!o.stdout.contains(&format!("AIRLOCK_CANARY={canary}")));
}

#[tokio::test]
async fn writes_nothing_outside_its_tmpfs() {
    let Some(b) = backend() else { return };
    let mut r = spec(vec![]);
    let id = r.spec.run_id.clone();
    let sibling = r
        .spec
        .sockets_dir
        .parent()
        .unwrap()
        .join(format!("sibling-{id}"));
    let host_tmp = PathBuf::from(format!("/tmp/airlock-escape-{id}"));
    let targets: Vec<PathBuf> = vec![
        format!("/usr/airlock-escape-{id}").into(),
        format!("/usr/bin/airlock-escape-{id}").into(),
        format!("/etc/airlock-escape-{id}").into(),
        format!("/airlock-escape-{id}").into(),
        format!("/root/airlock-escape-{id}").into(),
        format!("/var/tmp/airlock-escape-{id}").into(),
        format!("/dev/airlock-escape-{id}").into(),
        "/proc/sys/kernel/hostname".into(),
        "/proc/sysrq-trigger".into(),
        format!("/run/airlock/airlock-escape-{id}").into(),
        probe_exe(),
    ];
    // Inside the sandbox these land in its private /tmp; they must not reach the host.
    let private = [host_tmp.clone(), sibling.clone()];
    let mut args: Vec<String> = vec![];
    for t in targets
        .iter()
        .chain(&private)
        .chain([&PathBuf::from("/workspace/ok")])
    {
        args.push("--write".into());
        args.push(t.display().to_string());
    }
    r.spec.command = probe_cmd(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let o = run(&b, &r.spec).await;
    let j = o.json();
    for t in &targets {
        assert!(
            failed(&j["write"][t.display().to_string()]),
            "{} must not be writable: {}",
            t.display(),
            j["write"]
        );
    }
    assert_eq!(j["write"]["/workspace/ok"]["ok"], true, "{}", j["write"]);
    assert_eq!(
        j["write"][host_tmp.display().to_string()]["ok"],
        true,
        "the private /tmp is writable"
    );
    for t in targets.iter().chain(&private) {
        if t.starts_with("/proc") || *t == probe_exe() {
            continue;
        }
        assert!(!t.exists(), "{} appeared on the host", t.display());
    }
    assert_ne!(
        std::fs::read(probe_exe()).unwrap().get(..8),
        Some(&b"escaped\n"[..])
    );
}

fn host_addresses() -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
    // The host's own non-loopback addresses, from its interfaces.
    if let Ok(o) = std::process::Command::new("hostname").arg("-I").output() {
        v.extend(
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|s| s.parse::<IpAddr>().ok()),
        );
    }
    if let Ok(t) = std::fs::read_to_string("/proc/net/if_inet6") {
        for l in t.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 6
                && f[3] == "00"
                && f[5] != "lo"
                && let Ok(x) = u128::from_str_radix(f[0], 16)
            {
                v.push(IpAddr::V6(x.into()));
            }
        }
    }
    v.sort();
    v.dedup();
    v
}

#[tokio::test]
async fn reaches_no_server_on_the_host() {
    let Some(b) = backend() else { return };
    let mut listeners = vec![];
    let mut args: Vec<String> = vec![];
    for ip in host_addresses() {
        let Ok(l) = TcpListener::bind((ip, 0)) else {
            continue;
        };
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        args.push("--connect".into());
        args.push(addr.to_string());
        listeners.push((addr, l));
    }
    assert!(listeners.len() >= 2, "at least the loopback listeners");
    let r = spec(probe_cmd(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    let o = run(&b, &r.spec).await;
    let j = o.json();
    for (addr, l) in &listeners {
        let c = &j["connect"][addr.to_string()];
        assert!(failed(c), "{addr} was reached from the sandbox: {c}");
        match l.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("the listener on {addr} saw a connection: {other:?}"),
        }
    }
    assert_eq!(
        j["interfaces"],
        serde_json::json!(["lo"]),
        "only loopback in the sandbox"
    );
}

#[tokio::test]
async fn no_raw_sockets_no_namespaces_no_mounts() {
    let Some(b) = backend() else { return };
    let r = spec(probe_cmd(&[]));
    let o = run(&b, &r.spec).await;
    let j = o.json();
    for k in ["inet_raw_icmp", "inet6_raw", "packet_raw", "packet_dgram"] {
        assert!(failed(&j["raw_sockets"][k]), "{k}: {}", j["raw_sockets"]);
    }
    assert!(failed(&j["unshare_user"]), "{j}");
    assert!(failed(&j["mount_tmpfs"]), "{j}");
}

fn assert_no_privileges(status: &Value) {
    for k in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status[k], "0000000000000000", "{k} must be empty: {status}");
    }
    assert_eq!(status["NoNewPrivs"], "1", "{status}");
    assert_eq!(status["Seccomp"], "2", "{status}");
}

#[tokio::test]
async fn no_capabilities_no_new_privs_and_setuid_grants_nothing() {
    let Some(b) = backend() else { return };
    let mut r = spec(vec![]);
    // A setuid copy of the probe, owned by whoever runs the test (root in CI).
    let suid_dir = tempfile::Builder::new()
        .prefix("airlock-suid-")
        .tempdir()
        .unwrap();
    // Shared with the sandbox, whose host uid is not ours.
    std::fs::set_permissions(suid_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let suid = suid_dir.path().join("probe-suid");
    std::fs::copy(probe_exe(), &suid).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    r.spec.ro_paths.push(suid_dir.path().to_path_buf());
    r.spec.command = probe_cmd(&["--setuid", suid.to_str().unwrap()]);
    let o = run(&b, &r.spec).await;
    let j = o.json();
    assert_no_privileges(&j["status"]);
    let nested = &j["setuid"];
    assert_no_privileges(&nested["status"]);
    assert_eq!(
        nested["euid"], j["uid"],
        "the setuid bit changed nothing: {nested}"
    );
}

#[tokio::test]
async fn fork_bomb_is_contained() {
    let Some(b) = backend() else { return };
    // Bounded: forks until the pids limit refuses, reports, exits.
    let script = "import os,time,sys\nn=0\ntry:\n    while n < 1000:\n        p=os.fork()\n        if p==0:\n            time.sleep(60); os._exit(0)\n        n+=1\nexcept OSError as e:\n    print(n, e.errno); sys.exit(3)\nprint(n, 0)";
    let mut r = spec(vec!["/usr/bin/python3".into(), "-c".into(), script.into()]);
    r.spec.pids_max = 64;
    let t0 = Instant::now();
    let o = run(&b, &r.spec).await;
    assert_eq!(o.status.code(), Some(3), "{} {}", o.stdout, o.stderr);
    let mut f = o.stdout.split_whitespace();
    let n: u32 = f.next().unwrap().parse().unwrap();
    assert!(n < 64, "forked {n} times");
    assert_eq!(f.next(), Some("11"), "EAGAIN");
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert!(cgroup_dirs(&r.spec.run_id).is_empty());

    // An unbounded shell fork bomb: killed at the deadline, nothing survives.
    let mut r = spec(vec![
        "/bin/sh".into(),
        "-c".into(),
        "f() { f | f & }; f; sleep 30".into(),
    ]);
    r.spec.pids_max = 64;
    let sb = b.spawn(&r.spec).unwrap();
    let o = finish_sandbox(sb, Duration::from_secs(3)).await;
    assert!(!o.status.success());
    let t = Instant::now();
    let ok = std::process::Command::new("/bin/true").status().unwrap();
    assert!(
        ok.success() && t.elapsed() < Duration::from_secs(2),
        "the host stays responsive"
    );
    assert!(
        cgroup_dirs(&r.spec.run_id).is_empty(),
        "cgroups removed, so no process of the run is left"
    );
}

#[tokio::test]
async fn every_process_and_thread_of_the_run_is_in_its_cgroups() {
    let Some(b) = backend() else { return };
    let Some(layout) =
        airlock_test_support::require_peer("cgroups", airlock_sandbox::namespace::cgroup::probe())
    else {
        return;
    };
    // A shell, two children, and a python with a second thread.
    let r = spec(vec![
        "/bin/sh".into(),
        "-c".into(),
        "sleep 30 & /usr/bin/python3 -c 'import threading,time,sys; threading.Thread(target=time.sleep,args=(30,)).start(); print(\"ready\", flush=True); time.sleep(30)' & wait".into(),
    ]);
    let mut sb = b.spawn(&r.spec).unwrap();
    let (out, _) = sb.take_output();
    let mut out = out.unwrap();
    let mut buf = [0u8; 6];
    tokio::time::timeout(Duration::from_secs(20), out.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"ready\n");
    let want = format!("/airlock/airlock-{}", r.spec.run_id);
    // Host view, one line per hierarchy: `id:controllers:path`.
    let controllers: Vec<String> = match &layout {
        airlock_sandbox::namespace::cgroup::Layout::V2(_) => vec![String::new()],
        airlock_sandbox::namespace::cgroup::Layout::V1(v) => {
            v.iter().map(|(c, _)| c.clone()).collect()
        }
    };
    let pids = crate::support::process_tree(i32::try_from(sb.pid).unwrap());
    // init's two stages, sh, sleep, python.
    assert!(pids.len() >= 5, "the run's processes: {pids:?}");
    let mut threads = 0;
    for pid in &pids {
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
        {
            threads += 1;
            let cg = std::fs::read_to_string(t.path().join("cgroup")).unwrap();
            for c in &controllers {
                let line = cg
                    .lines()
                    .find(|l| {
                        l.split(':')
                            .nth(1)
                            .is_some_and(|cs| cs == c || cs.split(',').any(|x| x == c))
                    })
                    .unwrap_or_else(|| panic!("no {c:?} hierarchy in {cg}"));
                assert!(
                    line.ends_with(&format!(":{want}")),
                    "thread {} of pid {pid} is outside the run's {c:?} cgroup: {line}",
                    t.file_name().to_string_lossy()
                );
            }
        }
    }
    assert!(threads > pids.len(), "python's second thread was checked");
    sb.kill();
    let st = tokio::time::timeout(Duration::from_secs(10), sb.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!st.success());
    sb.cleanup().await;
    assert!(cgroup_dirs(&r.spec.run_id).is_empty());
}

#[tokio::test]
async fn memory_hog_is_contained() {
    let Some(b) = backend() else { return };
    let mut r = spec(vec![
        "/usr/bin/python3".into(),
        "-c".into(),
        "b=[]\nfor i in range(64):\n    b.append(bytearray(16<<20))\nprint('allocated 1 GiB')"
            .into(),
    ]);
    r.spec.memory_mb = 64;
    let o = finish_sandbox(b.spawn(&r.spec).unwrap(), Duration::from_secs(30)).await;
    assert!(
        !o.status.success(),
        "the hog must not get 1 GiB: {} {}",
        o.stdout,
        o.stderr
    );
    assert!(!o.stdout.contains("allocated"));
    assert!(cgroup_dirs(&r.spec.run_id).is_empty());
}

#[tokio::test]
async fn a_daemon_does_not_outlive_the_sandbox() {
    let Some(b) = backend() else { return };
    let marker = format!("airlock-daemon-{}", run_id());
    let script = format!(
        "import os,time,sys\nif os.fork()==0:\n    os.setsid()\n    if os.fork()==0:\n        os.execv('/bin/sleep', ['{marker}', '300'])\n    os._exit(0)\ntime.sleep(0.3)\nprint('ready', flush=True)\ntime.sleep(1.5)"
    );
    let r = spec(vec!["/usr/bin/python3".into(), "-c".into(), script]);
    let mut sb = b.spawn(&r.spec).unwrap();
    let (out, _) = sb.take_output();
    let mut out = out.unwrap();
    let mut buf = [0u8; 6];
    tokio::time::timeout(Duration::from_secs(20), out.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"ready\n");
    assert_eq!(
        host_cmdlines_containing(&marker).len(),
        1,
        "the daemon runs while the sandbox does"
    );
    let st = tokio::time::timeout(Duration::from_secs(20), sb.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(st.success());
    sb.cleanup().await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while !host_cmdlines_containing(&marker).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        host_cmdlines_containing(&marker).is_empty(),
        "the daemon outlived the sandbox"
    );
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
async fn fifty_concurrent_sandboxes_all_succeed_and_leave_nothing() {
    let Some(b) = backend() else { return };
    let b = std::sync::Arc::new(b);
    let runs: Vec<Run> = (0..50)
        .map(|i| spec(vec!["/bin/sh".into(), "-c".into(), format!("echo run-{i}")]))
        .collect();
    let mut handles = vec![];
    for (i, r) in runs.iter().enumerate() {
        let sb = b.spawn(&r.spec).unwrap();
        handles.push(tokio::spawn(async move {
            (i, finish_sandbox(sb, Duration::from_secs(60)).await)
        }));
    }
    for h in handles {
        let (i, o) = h.await.unwrap();
        assert!(o.status.success(), "run {i}: {}", o.stderr);
        assert_eq!(o.stdout.trim(), format!("run-{i}"));
    }
    for r in &runs {
        assert!(
            cgroup_dirs(&r.spec.run_id).is_empty(),
            "cgroups of {} left",
            r.spec.run_id
        );
        let entries: Vec<_> = std::fs::read_dir(&r.spec.sockets_dir).unwrap().collect();
        assert!(entries.is_empty(), "the backend leaves nothing on the host");
    }
}

#[tokio::test]
async fn an_init_started_ahead_holds_nothing_serves_one_run_and_dies_with_its_backend() {
    let Some(b) = backend() else { return };
    assert_eq!(b.standby_pid(), None, "nothing is started ahead unasked");
    b.prepare();
    let first = b.standby_pid().expect("an init waits for the next spawn");
    b.prepare();
    assert_eq!(b.standby_pid(), Some(first), "at most one waits");
    // It holds nothing of any run: no environment, no run's cgroup, the
    // platform's own uid (a run's uid comes with the run's header).
    let environ = std::fs::read(format!("/proc/{first}/environ")).unwrap();
    assert!(environ.is_empty(), "{}", String::from_utf8_lossy(&environ));
    // Its only cgroups of Airlock's are standby ones (cgroup v1: made ahead
    // for whichever run takes it; it may not have joined them yet).
    let cgroups = std::fs::read_to_string(format!("/proc/{first}/cgroup")).unwrap();
    assert!(
        cgroups
            .lines()
            .filter(|l| l.contains("airlock-"))
            .all(|l| l.contains("/airlock/airlock-standby-")),
        "{cgroups}"
    );
    let status = std::fs::read_to_string(format!("/proc/{first}/status")).unwrap();
    let uid = rustix::process::getuid().as_raw();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid.to_string())),
        "{status}"
    );
    // Each serves one run: the next spawn takes it, the one after starts cold.
    let one = spec(vec!["/bin/sh".into(), "-c".into(), "echo one".into()]);
    let two = spec(vec!["/bin/sh".into(), "-c".into(), "echo two".into()]);
    let sb1 = b.spawn(&one.spec).unwrap();
    assert_eq!(sb1.pid, first, "the spawn took the init started ahead");
    assert_eq!(b.standby_pid(), None);
    let sb2 = b.spawn(&two.spec).unwrap();
    let cold = sb2.pid;
    assert_ne!(cold, first);
    let (o1, o2) = tokio::join!(
        finish_sandbox(sb1, Duration::from_secs(60)),
        finish_sandbox(sb2, Duration::from_secs(60))
    );
    for (o, want) in [(&o1, "one"), (&o2, "two")] {
        assert!(o.status.success(), "{}", o.stderr);
        assert_eq!(o.stdout.trim(), want);
    }
    for r in [&one, &two] {
        assert!(cgroup_dirs(&r.spec.run_id).is_empty());
    }
    // The next run's init is a new process, never a used one.
    b.prepare();
    let next = b.standby_pid().unwrap();
    assert!(next != first && next != cold);
    // It dies with its backend (and, like every init, with the platform),
    // and its standby cgroups go with it.
    let fd = crate::support::pidfd(next).expect("the init started ahead is alive");
    let standby_dirs = b.standby_cgroups();
    drop(b);
    assert!(
        crate::support::exits_within(&fd, Duration::from_secs(10)),
        "the init started ahead outlived its backend"
    );
    for d in &standby_dirs {
        assert!(!d.exists(), "{} outlived its backend", d.display());
    }
}

/// Waits until the init started ahead is in its standby cgroups (cgroup v1);
/// returns them (empty where there are none).
fn standby_joined(b: &NamespaceBackend) -> Vec<PathBuf> {
    let dirs = b.standby_cgroups();
    let pid = b.standby_pid().expect("an init waits").to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    for d in &dirs {
        while !std::fs::read_to_string(d.join("tasks"))
            .unwrap_or_default()
            .lines()
            .any(|l| l.trim() == pid)
        {
            assert!(
                Instant::now() < deadline,
                "the init started ahead never joined {}",
                d.display()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    dirs
}

fn limit(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
        .trim()
        .to_string()
}

/// Forks up to `n` sleeping children (after touching `mb` MiB) and exits
/// with how many it got.
fn forker(n: u32, mb: u32) -> Vec<String> {
    let script = format!(
        "import os,sys,time\nb=b'x'*({mb}<<20)\nn=0\ntry:\n    while n<{n}:\n        p=os.fork()\n        if p==0:\n            time.sleep(30); os._exit(0)\n        n+=1\nexcept OSError:\n    pass\nsys.exit(n)"
    );
    vec!["/usr/bin/python3".into(), "-c".into(), script]
}

/// The run that takes an init started ahead takes its standby cgroups too,
/// made with the last run's limits: it must get its own, whichever way
/// they differ (tighter, looser, none).
#[tokio::test]
async fn a_run_from_an_init_started_ahead_has_its_own_limits_not_the_last_runs() {
    let Some(b) = backend() else { return };
    if airlock_test_support::require_peer("cgroups", airlock_sandbox::namespace::cgroup::probe())
        .is_none()
    {
        return;
    }
    // A generous run first: the next standby cgroups are made with its limits.
    let mut generous = spec(vec!["/bin/true".into()]);
    generous.spec.memory_mb = 512;
    generous.spec.pids_max = 256;
    generous.spec.cpus = 2.0;
    assert!(run(&b, &generous.spec).await.status.success());

    b.prepare();
    let standby = standby_joined(&b);
    let v1 = !standby.is_empty();
    if v1 {
        let mem = standby
            .iter()
            .find(|d| d.starts_with("/sys/fs/cgroup/memory"))
            .unwrap();
        assert_eq!(
            limit(mem, "memory.limit_in_bytes"),
            (512u64 << 20).to_string()
        );
    }
    // A tight run takes it: the attacker forks as much as it can.
    let mut tight = spec(forker(100, 0));
    tight.spec.memory_mb = 64;
    tight.spec.pids_max = 16;
    tight.spec.cpus = 0.5;
    let ahead = b.standby_pid().unwrap();
    let mut sb = b.spawn(&tight.spec).unwrap();
    assert_eq!(sb.pid, ahead, "the run took the init started ahead");
    let dirs = cgroup_dirs(&tight.spec.run_id);
    assert!(!dirs.is_empty(), "the run's cgroups bear its name");
    let st = sb.wait().await.unwrap();
    let forked = st.code().unwrap();
    assert!(
        (1..16).contains(&forked),
        "forked {forked} times under pids.max 16"
    );
    for d in &dirs {
        let path = d.display().to_string();
        if path.contains("/memory/") {
            assert_eq!(limit(d, "memory.limit_in_bytes"), (64u64 << 20).to_string());
        } else if path.contains("/pids/") {
            assert_eq!(limit(d, "pids.max"), "16");
        } else if path.contains("/cpu/") {
            assert_eq!(limit(d, "cpu.cfs_quota_us"), "50000");
        }
    }
    sb.cleanup().await;
    assert!(cgroup_dirs(&tight.spec.run_id).is_empty());
    for d in &standby {
        assert!(!d.exists(), "{} was renamed to the run's", d.display());
    }

    // A run without limits takes cgroups made with the tight ones: it may
    // touch 200 MiB and fork past 16.
    b.prepare();
    standby_joined(&b);
    let mut free = spec(forker(40, 200));
    free.spec.memory_mb = 0;
    free.spec.pids_max = 0;
    free.spec.cpus = 0.0;
    let mut sb = b.spawn(&free.spec).unwrap();
    let dirs = cgroup_dirs(&free.spec.run_id);
    let st = sb.wait().await.unwrap();
    assert_eq!(st.code(), Some(40), "{st}");
    for d in &dirs {
        let path = d.display().to_string();
        if path.contains("/pids/") {
            assert_eq!(limit(d, "pids.max"), "max");
        } else if path.contains("/cpu/") {
            assert_eq!(limit(d, "cpu.cfs_quota_us"), "-1");
        }
    }
    sb.cleanup().await;

    // And a tight one again after it: bounded again.
    b.prepare();
    standby_joined(&b);
    let mut again = spec(forker(100, 0));
    again.spec.pids_max = 8;
    let o = run(&b, &again.spec).await;
    let forked = o.status.code().unwrap();
    assert!(
        (1..8).contains(&forked),
        "forked {forked} times under pids.max 8"
    );
    assert!(cgroup_dirs(&again.spec.run_id).is_empty());
}

/// A spawn may come before the init started ahead has joined its standby
/// cgroups (prepare and spawn back to back), or after it died: either way
/// the run is in its own cgroups and nothing is left.
#[tokio::test]
async fn an_init_started_ahead_is_usable_however_early_or_dead_and_leaves_nothing() {
    let Some(b) = backend() else { return };
    let mut all_standby = vec![];
    for i in 0..10 {
        b.prepare();
        all_standby.extend(b.standby_cgroups());
        let r = spec(vec!["/bin/sh".into(), "-c".into(), format!("echo {i}")]);
        let o = run(&b, &r.spec).await;
        assert!(o.status.success(), "{}", o.stderr);
        assert_eq!(o.stdout.trim(), i.to_string());
        assert!(cgroup_dirs(&r.spec.run_id).is_empty());
    }
    // The init started ahead is killed before its run comes.
    b.prepare();
    let dead = standby_joined(&b);
    all_standby.extend(dead.iter().cloned());
    let pid = b.standby_pid().unwrap();
    let fd = crate::support::pidfd(pid).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    assert!(crate::support::exits_within(&fd, Duration::from_secs(10)));
    let r = spec(vec!["/bin/sh".into(), "-c".into(), "echo cold".into()]);
    let sb = b.spawn(&r.spec).unwrap();
    assert_ne!(sb.pid, pid, "a dead init is not used");
    let o = finish_sandbox(sb, Duration::from_secs(60)).await;
    assert_eq!(o.stdout.trim(), "cold", "{}", o.stderr);
    assert!(cgroup_dirs(&r.spec.run_id).is_empty());
    for d in &all_standby {
        assert!(!d.exists(), "{} was left behind", d.display());
    }
}

/// Standby cgroups of a platform that died (its init died with it) are
/// removed at the next boot; a live platform's are not.
#[tokio::test]
async fn standby_cgroups_of_a_gone_platform_are_reclaimed_and_a_live_ones_kept() {
    let Some(_b) = backend() else { return };
    let Some(layout) =
        airlock_test_support::require_peer("cgroups", airlock_sandbox::namespace::cgroup::probe())
    else {
        return;
    };
    // A pid that was a process and is gone (reaped).
    let mut gone = std::process::Command::new("/bin/true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let seq = SEQ.fetch_add(1, Ordering::SeqCst);
    let make = |pid: u32| {
        airlock_sandbox::namespace::cgroup::RunCgroups::create_standby(
            &layout,
            &format!("{pid}-{seq}"),
            None,
        )
        .unwrap()
    };
    let (Some(dead), Some(live)) = (make(dead_pid), make(std::process::id())) else {
        eprintln!("cgroup v2: no standby cgroups to reclaim");
        return;
    };
    let removed = airlock_sandbox::namespace::cgroup::reclaim_standby();
    for d in &dead.dirs {
        assert!(
            !d.exists(),
            "{} outlived its platform: {removed:?}",
            d.display()
        );
    }
    for d in &live.dirs {
        assert!(d.exists(), "{} of a live platform was removed", d.display());
    }
    live.remove(Duration::from_secs(1));
}

#[tokio::test]
async fn leftover_cgroups_are_reclaimed_only_when_dead() {
    let Some(_b) = backend() else { return };
    let Some(layout) = airlock_test_support::require_peer(
        "cgroups",
        airlock_sandbox::namespace::cgroup::layout().ok_or("no cgroup hierarchy"),
    ) else {
        return;
    };
    let id = run_id();
    let limits = airlock_sandbox::namespace::cgroup::Limits {
        memory_mb: 64,
        cpus: 1.0,
        pids_max: 16,
    };
    let Some(cg) = airlock_test_support::require_peer(
        "writable cgroups",
        airlock_sandbox::namespace::cgroup::RunCgroups::create(&layout, &id, limits),
    ) else {
        return;
    };
    // A live leftover (a process in it) stays; a dead one goes.
    let mut live = std::process::Command::new("/bin/sleep")
        .arg("30")
        .spawn()
        .unwrap();
    std::fs::write(&cg.procs_files()[0], live.id().to_string()).unwrap();
    airlock_sandbox::namespace::cgroup::reclaim_matching(|n| n.ends_with(&id));
    assert!(cg.dirs.iter().all(|d| d.exists()), "a live cgroup is kept");
    live.kill().unwrap();
    live.wait().unwrap();
    // Reaped; the kernel may still list it for a moment: wait until no
    // cgroup of the run holds a process.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while cg
        .procs_files()
        .iter()
        .any(|f| std::fs::read_to_string(f).is_ok_and(|s| !s.trim().is_empty()))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed process stayed in its cgroup"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let removed = airlock_sandbox::namespace::cgroup::reclaim_matching(|n| n.ends_with(&id));
    assert!(
        cg.dirs.iter().all(|d| !d.exists()),
        "a dead cgroup is reclaimed: {removed:?}"
    );
}

//! The sandbox boundary, attacked from inside real runs: `airlock run` on
//! the namespace backend, with an operator's terminal, starts a hostile
//! agent (`tests/agents/*.py`) that tries to escape; each test asserts the
//! attack FAILED and that the legitimate path still works.
//!
//! Network rule: nothing here sends a packet anywhere but loopback or the
//! sandbox's own namespace.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use crate::support;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{RealRun, namespace_available};
use serde_json::{Value, json};

const EPERM: i64 = 1;
const ENXIO: i64 = 6;
const EACCES: i64 = 13;
const EROFS: i64 = 30;
const ENOTTY: i64 = 25;

/// A pseudo-terminal: the operator's terminal in these tests.
struct Pty {
    master: OwnedFd,
    slave: OwnedFd,
}

fn pty() -> Pty {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let slave: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc_o_noctty())
        .open(name.to_str().unwrap())
        .unwrap()
        .into();
    // Raw: any byte pushed into the terminal's input is readable at once.
    let mut t = rustix::termios::tcgetattr(&slave).unwrap();
    t.make_raw();
    rustix::termios::tcsetattr(&slave, rustix::termios::OptionalActions::Now, &t).unwrap();
    Pty { master, slave }
}

fn libc_o_noctty() -> i32 {
    rustix::fs::OFlags::NOCTTY.bits().cast_signed() // the same flag bits
}

fn result_of(report: &Value) -> &Value {
    &report["result"]
}

#[test]
fn the_agent_cannot_reach_or_type_into_the_operators_terminal() {
    if namespace_available() {
        attack_the_operators_terminal("namespace");
    }
}

/// The same attack on the docker backend: the sandbox differs, the
/// operator's terminal and what Airlock prints of an agent do not.
#[test]
fn on_docker_the_agent_cannot_reach_or_type_into_the_operators_terminal() {
    if support::docker_available() {
        attack_the_operators_terminal("docker");
    }
}

fn attack_the_operators_terminal(backend: &str) {
    let run = RealRun::python(include_str!("../agents/terminal.py"), 60);
    let t = pty();
    // `setsid --ctty`: `airlock run` leads a session whose controlling
    // terminal is the pty, as when the operator types the command.
    let dup = |fd: &OwnedFd| -> Stdio { fd.try_clone().unwrap().into() };
    let cmd = run.command(backend, &[]);
    let argv: Vec<_> = std::iter::once(cmd.get_program().to_owned())
        .chain(cmd.get_args().map(|a| a.to_owned()))
        .collect();
    let mut setsid = std::process::Command::new("setsid");
    setsid.arg("--ctty").args(&argv);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => setsid.env(k, v),
            None => setsid.env_remove(k),
        };
    }
    let mut child = setsid
        .stdin(dup(&t.slave))
        .stderr(dup(&t.slave))
        .stdout(Stdio::piped())
        .spawn()
        .expect("setsid (util-linux) runs airlock run");
    // The commands hold copies of the terminal's descriptors until dropped.
    drop(setsid);
    drop(cmd);
    let mut master = std::fs::File::from(t.master.try_clone().unwrap());
    let screen = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        // EIO once no slave end is open any more.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        seen
    });
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    let status = child.wait().unwrap();
    // Nothing was pushed into the terminal's input.
    rustix::fs::fcntl_setfl(
        &t.slave,
        rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::RDWR,
    )
    .unwrap();
    let mut injected = [0u8; 64];
    let pending = rustix::io::read(t.slave.as_fd(), &mut injected);
    assert_eq!(
        pending.err(),
        Some(rustix::io::Errno::AGAIN),
        "the agent typed into the operator's terminal: {:?}",
        pending.map(|n| String::from_utf8_lossy(&injected[..n]).into_owned())
    );
    drop(t);
    let screen = String::from_utf8_lossy(&screen.join().unwrap()).into_owned();
    let report: Value = serde_json::from_slice(&stdout).unwrap_or(Value::Null);
    assert!(status.success(), "{screen}\n{report}");
    assert_eq!(report["status"], "succeeded", "{report}");
    let r = result_of(&report);
    assert_eq!(
        r["open_dev_tty"],
        json!(ENXIO),
        "/dev/tty reaches no terminal (new session): {r}"
    );
    for k in [
        "tiocsti_fd0",
        "tiocsti_fd1",
        "tiocsti_fd2",
        "tiocsti_devnull",
        "tiocsti_high_bits",
        "tioclinux_devnull",
    ] {
        assert_eq!(r[k], json!(EPERM), "{k} must be refused by seccomp: {r}");
    }
    assert_eq!(
        r["tcgets_devnull"],
        json!(ENOTTY),
        "other ioctls are not refused: {r}"
    );
    // What the operator saw: the agent's line, its escape sequences written out.
    assert!(screen.contains("agent says hello"), "{screen}");
    assert!(
        screen.contains("\\x1b]0;pwned-title\\x07\\x1b[2K\\r"),
        "the forged sequence is shown as text: {screen}"
    );
    for raw in [
        "\x1b]0;pwned",
        "\x1b[2K",
        "\x1b[31m",
        "\u{202e}",
        "\r\u{25b8} succeeded",
    ] {
        assert!(
            !screen.contains(raw),
            "{raw:?} reached the terminal: {screen:?}"
        );
    }
    // `airlock runs logs` writes them out too; `--json` keeps the exact line.
    let id = report["id"].as_str().unwrap();
    let logs = run.airlock(&["runs", "logs", id]);
    let text =
        String::from_utf8_lossy(&logs.stdout).into_owned() + &String::from_utf8_lossy(&logs.stderr);
    assert!(text.contains("\\x1b]0;pwned-title"), "{text}");
    assert!(
        !text.contains('\x1b') && !text.contains('\u{202e}'),
        "{text:?}"
    );
    let exact = run.airlock(&["runs", "logs", id, "--json"]);
    let lines: Vec<Value> = String::from_utf8_lossy(&exact.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines.iter().any(|l| l["line"]
            .as_str()
            .is_some_and(|s| s.starts_with("\x1b]0;pwned-title\x07"))),
        "{lines:?}"
    );
}

#[test]
fn the_run_directory_is_out_of_reach_and_every_write_lands_on_the_capped_tmpfs() {
    if !namespace_available() {
        return;
    }
    let run = RealRun::python(include_str!("../agents/run_dir.py"), 120)
        .env("WORKSPACE_TMPFS_SIZE_MB", "16");
    let home = run.home.path().display().to_string();
    let out = run
        .command("namespace", &["--prompt", &home])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(report["status"], "succeeded", "{report}\n{stderr}");
    let r = result_of(&report);
    assert_eq!(
        r["sockets_present"],
        json!([true, true]),
        "the sandbox reaches the sockets: {r}"
    );
    assert_eq!(
        r["sockets_listing"],
        json!(EACCES),
        "and may not even list their directory: {r}"
    );
    for d in r["sock_dirs"].as_array().unwrap() {
        let d = d.as_str().unwrap();
        let s = format!("{d}/sidecar.sock");
        for k in [
            format!("rename:{s}"),
            format!("unlink:{s}"),
            format!("bind:{s}"),
            format!("create:{d}"),
            format!("chmod:{d}"),
        ] {
            assert_ne!(r[&k], json!("ok"), "{k} worked: {r}");
        }
        assert_eq!(r[format!("create:{d}")], json!(EROFS), "{r}");
    }
    assert_eq!(
        r["runs_visible"],
        json!(false),
        "the platform's run directories are not in the sandbox's view: {r}"
    );
    assert_eq!(
        r["home_listing"],
        json!(["agent"]),
        "of the platform's home, only the agent's own (read-only) directory: {r}"
    );
    assert_eq!(r["owner_files"], json!([]), "{r}");
    // Every write landed on the one 16 MiB tmpfs: the sum is capped (and the
    // legitimate writes worked).
    let total = r["total_written"].as_u64().unwrap();
    assert!(
        total <= 16 << 20,
        "the agent wrote {} MiB with a 16 MiB cap: {}",
        total >> 20,
        r["written"]
    );
    assert!(
        total >= 8 << 20,
        "the workspace is writable: {}",
        r["written"]
    );
    // The channels the platform relies on were intact after the attack: the
    // relay reached the real sidecar (MCP answered), the result arrived.
    assert_eq!(r["mcp_tools"], json!(true), "{r}");
    assert_eq!(
        r["events_via_relay"],
        json!(404),
        "the runtime's own /events channel is not the agent's: {r}"
    );
    let runs: Vec<_> = std::fs::read_dir(run.home.path().join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(runs.is_empty(), "run directories left: {runs:?}");
}

#[test]
fn boot_reclaim_never_follows_blocks_on_or_reads_whole_what_it_finds() {
    if !namespace_available() {
        return;
    }
    let run = RealRun::python("print('fine')\n", 30);
    let runs = run.home.path().join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    // Leftovers as a hostile sandbox (or a hostile local user) could leave them.
    let fifo = runs.join("run_fifo000000");
    std::fs::create_dir(&fifo).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        fifo.join("owner.pid"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let zero = runs.join("run_zero000000");
    std::fs::create_dir(&zero).unwrap();
    std::os::unix::fs::symlink("/dev/zero", zero.join("owner.pid")).unwrap();
    let big = runs.join("run_big0000000");
    std::fs::create_dir(&big).unwrap();
    std::fs::write(big.join("owner.pid"), "1".repeat(64 << 20)).unwrap();
    // And one that is merely old (a crash an hour ago, no owner file).
    let orphan = runs.join("run_orphan0000");
    std::fs::create_dir(&orphan).unwrap();
    let hour_ago = rustix::fs::Timespec {
        tv_sec: i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                - 3600,
        )
        .unwrap(),
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        &orphan,
        &rustix::fs::Timestamps {
            last_access: hour_ago,
            last_modification: hour_ago,
        },
        rustix::fs::AtFlags::empty(),
    )
    .unwrap();
    let mut child = run
        .command("namespace", &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = Instant::now();
    let mut peak_kb = 0u64;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status"))
            && let Some(kb) = s
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
        {
            peak_kb = peak_kb.max(kb);
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("airlock run hung at boot reclaim");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let report: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    assert!(status.success(), "{report}");
    assert_eq!(report["status"], "succeeded");
    assert!(
        peak_kb < 200 * 1024,
        "boot reclaim read what it should not: peak RSS {peak_kb} kB"
    );
    for d in [&fifo, &zero, &big, &orphan] {
        assert!(!d.exists(), "{} was not reclaimed", d.display());
    }
}

#[test]
fn the_agent_is_an_unprivileged_host_uid_with_its_own_kernel_quotas() {
    if !namespace_available() {
        return;
    }
    let root = rustix::process::geteuid().is_root();
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
        .command("namespace", &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the agent to hold every inotify instance it could get.
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let holding = loop {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut err, &mut line).unwrap() == 0 {
            panic!("the run ended before the agent held its instances: {seen}");
        }
        seen.push_str(&line);
        if line.contains("HOLDING") {
            break line;
        }
    };
    // Meanwhile, the host's root (this test, in CI) still gets its own.
    let mine = rustix::fs::inotify::init(rustix::fs::inotify::CreateFlags::CLOEXEC);
    // This run's (another run of agent.py on a shared host is not).
    let agent_pids: Vec<u32> = support::process_tree(i32::try_from(child.id()).unwrap())
        .into_iter()
        .filter_map(|p| u32::try_from(p).ok())
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.starts_with(b"/usr/bin/python3\0agent.py"))
        })
        .collect();
    let host_uids: Vec<String> = agent_pids
        .iter()
        .filter_map(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status"))
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
    let _ = std::io::Read::read_to_string(&mut err, &mut seen);
    assert!(child.wait().unwrap().success(), "{seen}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let r = result_of(&report);
    assert_eq!(r["uid"], 1000, "{r}");
    assert_eq!(r["gid"], 1000, "{r}");
    let host_uid: u32 = r["uid_map"][1].as_str().unwrap().parse().unwrap();
    assert_eq!(r["uid_map"][2], "1", "exactly one uid is mapped: {r}");
    assert_eq!(
        r["root-only.txt"],
        json!(EACCES),
        "a root-only file is closed to the agent: {r}"
    );
    assert_eq!(r["public.txt"], "shared", "{r}");
    assert!(r["inotify_instances"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(agent_pids.len(), 1, "the agent process on the host: {seen}");
    if root {
        assert!(
            host_uid >= 100_000,
            "host uid {host_uid} is not a dedicated one"
        );
        assert!(
            host_uids[0]
                .split_whitespace()
                .skip(1)
                .all(|u| u == host_uid.to_string()),
            "the agent runs as host uid {host_uid}: {host_uids:?}"
        );
        assert!(
            mine.is_ok(),
            "host root could not create an inotify instance while the agent held {}: {:?}",
            holding.trim(),
            mine.err()
        );
    } else {
        eprintln!(
            "note: the platform is not root here, so the sandbox is the platform's own uid ({host_uid}); the quota part is checked only as root"
        );
        assert_eq!(host_uid, rustix::process::getuid().as_raw());
    }
}

#[test]
fn foreign_socket_families_kernel_information_and_pid1_are_closed() {
    if !namespace_available() {
        return;
    }
    let run = RealRun::python(include_str!("../agents/kernel.py"), 60);
    let (out, report) = run.run("namespace");
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
        assert_eq!(r[k], json!(EPERM), "{k} must be refused by seccomp: {r}");
    }
    assert_eq!(r["af_unix"], "ping", "{r}");
    assert_eq!(r["af_inet"], "pong", "{r}");
    assert_eq!(r["af_inet6"], "pong", "{r}");
    // Masked: unreadable (an errno) or empty. The world-readable ones prove
    // the masks (the agent's uid could read their real content otherwise).
    let mut checked = 0;
    for (k, v) in r.as_object().unwrap() {
        if k.starts_with("proc_") && k != "proc_self_status" && k != "proc_meminfo" {
            assert!(
                v.is_i64() || v == &json!({"bytes": 0}),
                "{k} must read as nothing: {v} ({r})"
            );
            checked += 1;
        }
        if k.starts_with("procdir_") {
            assert!(
                v.is_i64() || v == &json!({"entries": 0}),
                "{k} must be empty: {r}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 8, "the masked entries exist on this kernel: {r}");
    for world_readable in ["proc_keys", "proc_key-users", "proc_kallsyms", "proc_iomem"] {
        assert!(
            r.get(world_readable).is_some(),
            "{world_readable} exists on this kernel: {r}"
        );
    }
    assert!(r["proc_self_status"]["bytes"].as_u64().unwrap() > 0, "{r}");
    assert!(r["proc_meminfo"]["bytes"].as_u64().unwrap() > 0, "{r}");
    // System calls by number: clone3 and the x32 range fail as absent (so
    // libc falls back to clone, whose flags seccomp checks), the deny list
    // with EPERM, before the kernel looks at their arguments.
    if cfg!(target_arch = "x86_64") {
        const ENOSYS: i64 = 38;
        assert_eq!(r["sys_clone3"], json!(ENOSYS), "{r}");
        assert_eq!(r["sys_x32_getpid"], json!(ENOSYS), "{r}");
        assert_eq!(r["sys_io_uring_setup"], json!(EPERM), "{r}");
        assert_eq!(r["sys_keyctl"], json!(EPERM), "{r}");
        assert!(r["sys_getpid"]["returned"].as_i64().unwrap() > 0, "{r}");
    }
    // The host's secrets in /etc: masked, each by a read-only mount of its own.
    for (host, key, chr) in [
        ("/etc/shadow", "etc_shadow", true),
        ("/etc/gshadow", "etc_gshadow", true),
        ("/etc/ssl/private", "etc_ssl_private", false),
    ] {
        if std::path::Path::new(host).exists() {
            let m = &r[key];
            assert_eq!(m["own_mount"], true, "{host} must be masked: {r}");
            assert_eq!(m["chr"], chr, "{host}: {r}");
            assert!(m["write"].is_i64(), "{host} must refuse writes: {r}");
        }
    }
    for k in ["pid1_mem", "pid1_environ", "pid1_fd", "pid1_maps"] {
        assert!(r[k].is_i64(), "{k}: PID 1 must not be readable: {r}");
    }
}

#[test]
fn the_report_says_what_the_backend_isolated() {
    let run = RealRun::python("print('hi')\n", 30);
    let (out, report) = run.run("process");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(report["isolation"]["isolates"], false, "{report}");
    assert!(
        report["isolation"]["warning"]
            .as_str()
            .is_some_and(|w| w.contains("isolates NOTHING")),
        "{report}"
    );
    // `runs show --json` prints the same object.
    let id = report["id"].as_str().unwrap();
    let shown: Value =
        serde_json::from_slice(&run.airlock(&["runs", "show", id, "--json"]).stdout).unwrap();
    assert_eq!(shown, report);
    if namespace_available() {
        let (_, report) = run.run("namespace");
        assert_eq!(
            report["isolation"],
            json!({"isolates": true, "warning": null}),
            "{report}"
        );
    }
}

#[test]
fn doctor_reports_the_uid_mapping_the_session_and_the_socket_family_rule() {
    if !namespace_available() {
        return;
    }
    let out = std::process::Command::new(support::AIRLOCK)
        .arg("doctor")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for (feature, must) in [
        ("uid mapping", "uid 1000 inside is host uid"),
        ("session", "without a controlling terminal"),
        ("seccomp socket families", "only AF_UNIX, AF_INET, AF_INET6"),
        ("seccomp terminal ioctls", "TIOCSTI, TIOCLINUX refused"),
        ("seccomp filter", "allow list: "),
        ("native AIO", "refused (io_setup inside: errno 1)"),
        ("pseudo-terminals", "none: /dev/ptmx inside: errno"),
    ] {
        let line = text
            .lines()
            .find(|l| l.contains(feature) && l.contains(['✓', '✗']))
            .unwrap_or_else(|| panic!("doctor says nothing of {feature}: {text}"));
        assert!(line.contains('✓') && line.contains(must), "{line}");
    }
    // The allow list's size, as the code has it; and every pool's decision.
    let size = airlock_sandbox::syscalls::allowed_numbers().len();
    assert!(text.contains(&format!("allow list: {size} of ")), "{text}");
    for d in airlock_sandbox::pools::decisions() {
        assert!(
            text.contains(d.pool),
            "doctor says nothing of {}: {text}",
            d.pool
        );
    }
}

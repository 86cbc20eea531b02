//! The attempts: each one what an escaping agent would try, each reported
//! as `{"ok": …}` so a test can assert that it failed.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::sys;

#[derive(Debug, Default, Clone)]
pub struct ProbeArgs {
    /// `host:port` to try a TCP connect to.
    pub connect: Vec<String>,
    /// Files to try to create (and write).
    pub write: Vec<PathBuf>,
    /// A host PID to attack (ptrace, process_vm_readv, /proc/PID/environ).
    pub pid: Option<i32>,
    /// A string to look for in every visible /proc/*/environ and cmdline.
    pub canary: Option<String>,
    /// A unix socket to send `ping` to; the reply is reported.
    pub unix: Option<PathBuf>,
    /// A file to fill until the write fails.
    pub fill: Option<PathBuf>,
    /// A setuid copy of this probe, run as `<path> --quick`; its report is embedded.
    pub setuid: Option<PathBuf>,
    /// Read stdin to the end and report its length and content.
    pub stdin: bool,
    /// Only the identity/capability part (used by --setuid).
    pub quick: bool,
    /// System call numbers to make, each in a child of its own, with every
    /// argument `-1` (a bad descriptor, pointer, size and flags: what a
    /// call reached would refuse, had the filter let it through).
    pub syscalls: Vec<u32>,
    /// The calls whose arguments the filter checks, with refused and with
    /// admitted arguments.
    pub checked: bool,
}

fn outcome(o: std::io::Result<sys::Outcome>) -> Value {
    match o {
        Ok(sys::Outcome::Returned(v)) => json!({"returned": v}),
        Ok(sys::Outcome::Errno(e)) => json!({"errno": e}),
        Ok(sys::Outcome::Signal(s)) => json!({"signal": s}),
        Ok(sys::Outcome::Exited(c)) => json!({"exited": c}),
        Err(e) => json!({"probe_error": e.to_string()}),
    }
}

/// The argument checks, attacked and used: `(name, nr, args)`.
fn checked_calls() -> Vec<(&'static str, i64, [u64; 6])> {
    const SIGCHLD: u64 = 17;
    let m = u64::MAX;
    vec![
        (
            "clone_newuser",
            libc::SYS_clone,
            [0x1000_0000 | SIGCHLD, 0, 0, 0, 0, 0],
        ),
        (
            "clone_newns",
            libc::SYS_clone,
            [0x0002_0000 | SIGCHLD, 0, 0, 0, 0, 0],
        ),
        (
            "clone_newnet",
            libc::SYS_clone,
            [0x4000_0000 | SIGCHLD, 0, 0, 0, 0, 0],
        ),
        ("clone3", libc::SYS_clone3, [0, 0, 0, 0, 0, 0]),
        (
            "personality_addr_no_randomize",
            libc::SYS_personality,
            [0x0004_0000, 0, 0, 0, 0, 0],
        ),
        (
            "personality_query",
            libc::SYS_personality,
            [0xffff_ffff, 0, 0, 0, 0, 0],
        ),
        ("ioctl_tiocsti", libc::SYS_ioctl, [0, 0x5412, m, 0, 0, 0]),
        (
            "ioctl_tiocsti_high_bits",
            libc::SYS_ioctl,
            [0, 0x1_0000_5412, m, 0, 0, 0],
        ),
        ("ioctl_tioclinux", libc::SYS_ioctl, [0, 0x541C, m, 0, 0, 0]),
        (
            "ioctl_fionread_bad_fd",
            libc::SYS_ioctl,
            [m, 0x541B, m, 0, 0, 0],
        ),
        ("socket_vsock", libc::SYS_socket, [40, 1, 0, 0, 0, 0]),
        ("socket_netlink", libc::SYS_socket, [16, 3, 0, 0, 0, 0]),
        ("socket_packet", libc::SYS_socket, [17, 2, 0, 0, 0, 0]),
        ("socket_inet_raw", libc::SYS_socket, [2, 3, 1, 0, 0, 0]),
        ("socket_inet_stream", libc::SYS_socket, [2, 1, 0, 0, 0, 0]),
        (
            "socket_inet6_dgram_cloexec",
            libc::SYS_socket,
            [10, 2 | 0o2000000, 0, 0, 0, 0],
        ),
        (
            "socket_unix_seqpacket",
            libc::SYS_socket,
            [1, 5, 0, 0, 0, 0],
        ),
        (
            "socketpair_vsock",
            libc::SYS_socketpair,
            [40, 1, 0, m, 0, 0],
        ),
    ]
}

fn res<T: Into<Value>>(r: std::io::Result<T>) -> Value {
    match r {
        Ok(v) => json!({"ok": true, "value": v.into()}),
        Err(e) => json!({"ok": false, "error": e.to_string(), "errno": e.raw_os_error()}),
    }
}

fn status_fields() -> Value {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut m = BTreeMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(':')
            && (k.starts_with("Cap")
                || ["NoNewPrivs", "Seccomp", "Seccomp_filters", "Uid", "Gid"].contains(&k))
        {
            m.insert(k.to_string(), v.trim().to_string());
        }
    }
    json!(m)
}

fn visible_pids() -> Vec<i32> {
    let mut v: Vec<i32> = std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

fn connect(target: &str) -> Value {
    let addrs: Vec<SocketAddr> = match target.to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => return json!({"ok": false, "error": e.to_string()}),
    };
    let mut last = json!({"ok": false, "error": "no address"});
    for a in addrs {
        match TcpStream::connect_timeout(&a, Duration::from_millis(500)) {
            Ok(mut s) => {
                let _ = s.write_all(b"escaped\n");
                return json!({"ok": true, "addr": a.to_string()});
            }
            Err(e) => {
                last = json!({"ok": false, "error": e.to_string(), "errno": e.raw_os_error()})
            }
        }
    }
    last
}

fn raw_sockets() -> Value {
    use rustix::net::{AddressFamily, SocketType, ipproto};
    let t = |f, ty, p| {
        res(rustix::net::socket(f, ty, p)
            .map(|_| true)
            .map_err(std::io::Error::from))
    };
    json!({
        "inet_raw_icmp": t(AddressFamily::INET, SocketType::RAW, Some(ipproto::ICMP)),
        "inet6_raw": t(AddressFamily::INET6, SocketType::RAW, Some(ipproto::ICMPV6)),
        "packet_raw": t(AddressFamily::PACKET, SocketType::RAW, None),
        "packet_dgram": t(AddressFamily::PACKET, SocketType::DGRAM, None),
    })
}

fn unix_ping(path: &PathBuf) -> std::io::Result<String> {
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"ping\n")?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn fill(path: &PathBuf) -> Value {
    let mut f = match std::fs::File::create(path) {
        Ok(f) => f,
        Err(e) => {
            return json!({"ok": false, "written": 0, "error": e.to_string(), "errno": e.raw_os_error()});
        }
    };
    let chunk = vec![0x5au8; 1 << 20];
    let mut written: u64 = 0;
    loop {
        match f.write(&chunk) {
            Ok(0) => return json!({"ok": true, "written": written}),
            Ok(n) => written += n as u64,
            Err(e) => {
                return json!({"ok": false, "written": written, "error": e.to_string(), "errno": e.raw_os_error()});
            }
        }
        if written > 64 << 30 {
            return json!({"ok": true, "written": written});
        }
    }
}

fn canary_hits(canary: &str) -> Vec<String> {
    let mut hits = vec![];
    let me = i32::try_from(std::process::id()).unwrap_or(-1);
    for pid in visible_pids().into_iter().filter(|p| *p != me) {
        for f in ["environ", "cmdline"] {
            if let Ok(b) = std::fs::read(format!("/proc/{pid}/{f}"))
                && String::from_utf8_lossy(&b).contains(canary)
            {
                hits.push(format!("/proc/{pid}/{f}"));
            }
        }
    }
    hits
}

/// Runs every requested attempt; never panics, always returns a report.
pub fn run(a: &ProbeArgs) -> Value {
    let mut r = serde_json::Map::new();
    r.insert("status".into(), status_fields());
    r.insert("uid".into(), json!(rustix::process::getuid().as_raw()));
    r.insert("euid".into(), json!(rustix::process::geteuid().as_raw()));
    if a.quick {
        return Value::Object(r);
    }
    r.insert("pids".into(), json!(visible_pids()));
    r.insert(
        "hostname".into(),
        json!(rustix::system::uname().nodename().to_string_lossy()),
    );
    r.insert(
        "interfaces".into(),
        json!(
            std::fs::read_to_string("/proc/net/dev")
                .unwrap_or_default()
                .lines()
                .skip(2)
                .filter_map(|l| l.split(':').next())
                .map(|s| s.trim().to_string())
                .collect::<Vec<_>>()
        ),
    );
    r.insert(
        "cwd".into(),
        json!(
            std::env::current_dir()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        ),
    );
    r.insert(
        "env".into(),
        json!(std::env::vars().collect::<BTreeMap<_, _>>()),
    );
    let writes: BTreeMap<String, Value> = a
        .write
        .iter()
        .map(|p| {
            let r = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(p)
                .and_then(|mut f| f.write_all(b"escaped\n"));
            (p.display().to_string(), res(r.map(|()| true)))
        })
        .collect();
    r.insert("write".into(), json!(writes));
    let conns: BTreeMap<String, Value> =
        a.connect.iter().map(|t| (t.clone(), connect(t))).collect();
    r.insert("connect".into(), json!(conns));
    r.insert("raw_sockets".into(), raw_sockets());
    r.insert(
        "unshare_user".into(),
        res(sys::try_unshare_user().map(|()| true)),
    );
    r.insert(
        "mount_tmpfs".into(),
        res(rustix::mount::mount(
            "tmpfs",
            "/tmp",
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .map(|()| true)
        .map_err(std::io::Error::from)),
    );
    r.insert(
        "ptrace_init".into(),
        res(sys::try_ptrace_attach(1).map(|()| true)),
    );
    if let Some(pid) = a.pid {
        r.insert(
            "ptrace_pid".into(),
            res(sys::try_ptrace_attach(pid).map(|()| true)),
        );
        r.insert(
            "process_vm_readv_pid".into(),
            res(sys::try_process_vm_readv(pid, 0x400000)),
        );
        r.insert(
            "environ_pid".into(),
            res(std::fs::read(format!("/proc/{pid}/environ"))
                .map(|b| String::from_utf8_lossy(&b).into_owned())),
        );
        r.insert(
            "kill_pid".into(),
            res(rustix::process::Pid::from_raw(pid)
                .ok_or_else(|| std::io::Error::other("pid 0"))
                .and_then(|p| Ok(rustix::process::test_kill_process(p)?))
                .map(|()| true)),
        );
    }
    if let Some(c) = &a.canary {
        r.insert("canary_hits".into(), json!(canary_hits(c)));
    }
    if let Some(p) = &a.unix {
        r.insert("unix".into(), res(unix_ping(p)));
    }
    if let Some(p) = &a.fill {
        r.insert("fill".into(), fill(p));
    }
    if let Some(p) = &a.setuid {
        let out = std::process::Command::new(p).arg("--quick").output();
        r.insert(
            "setuid".into(),
            match out {
                Ok(o) => serde_json::from_slice::<Value>(&o.stdout).unwrap_or_else(
                    |_| json!({"ok": false, "error": String::from_utf8_lossy(&o.stderr)}),
                ),
                Err(e) => json!({"ok": false, "error": e.to_string()}),
            },
        );
    }
    if !a.syscalls.is_empty() {
        let m = u64::MAX;
        let calls: BTreeMap<String, Value> = a
            .syscalls
            .iter()
            .map(|nr| {
                (
                    nr.to_string(),
                    outcome(sys::syscall_in_child(i64::from(*nr), [m; 6])),
                )
            })
            .collect();
        r.insert("syscalls".into(), json!(calls));
    }
    if a.checked {
        let calls: BTreeMap<String, Value> = checked_calls()
            .into_iter()
            .map(|(name, nr, args)| (name.to_owned(), outcome(sys::syscall_in_child(nr, args))))
            .collect();
        r.insert("checked".into(), json!(calls));
    }
    if a.stdin {
        let mut buf = Vec::new();
        let r2 = std::io::stdin()
            .read_to_end(&mut buf)
            .map(|_| String::from_utf8_lossy(&buf).into_owned());
        r.insert("stdin".into(), res(r2));
    }
    Value::Object(r)
}

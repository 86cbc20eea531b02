//! `airlock doctor`: which backends and isolation features work on this
//! host, and why not; what each sandbox may take of the host's kernel-wide
//! pools; and what a real namespace sandbox looks like from inside (its uid
//! mapping, its session, its seccomp allow list and what it refuses: native
//! AIO, socket families, terminal ioctls; no pseudo-terminal), checked by
//! starting one.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use airlock_sandbox::namespace::{NamespaceBackend, config};
use airlock_sandbox::{Backend, SandboxSpec};
use airlock_sandbox::{seccomp, syscalls};
use serde_json::{Value, json};

pub fn run(inside: bool) -> ExitCode {
    if inside {
        super::out::outln!("{}", inside_report());
        return ExitCode::SUCCESS;
    }
    super::out::outln!("Backends");
    for name in ["namespace", "docker", "process"] {
        match airlock_sandbox::select(name) {
            Ok(b) => match b.check() {
                Ok(()) => super::out::outln!(
                    "  ✓ {name:<10} works{}",
                    if b.isolates() {
                        ""
                    } else {
                        " (isolates NOTHING)"
                    }
                ),
                Err(why) => super::out::outln!("  ✗ {name:<10} {}", why.0),
            },
            Err(e) => super::out::outln!("  ✗ {name:<10} {e}"),
        }
    }
    match airlock_sandbox::select("auto") {
        Ok(b) => super::out::outln!(
            "  → RUN_ADAPTER=auto picks {} (never docker: the Docker socket is root on the host, so it is chosen by name)",
            b.name()
        ),
        Err(e) => super::out::outln!("  → RUN_ADAPTER=auto: {e}"),
    }
    super::out::outln!("Docker");
    match airlock_sandbox::docker::DockerConfig::from_env() {
        Ok(cfg) => match super::current_thread_runtime() {
            Ok(rt) => {
                for d in rt.block_on(airlock_sandbox::docker::diagnose::diagnose(&cfg)) {
                    line(d.works, &d.feature, &d.detail);
                }
            }
            Err(e) => line(false, "docker", &e.to_string()),
        },
        Err(e) => line(false, "settings", &e.to_string()),
    }
    super::out::outln!("Isolation features");
    for d in airlock_sandbox::diagnose() {
        line(d.works, &d.feature, &d.detail);
    }
    super::out::outln!("The host's kernel-wide pools (what each sandbox may take)");
    for d in airlock_sandbox::pools::decisions() {
        super::out::outln!("  · {:<28} {}", d.pool, d.decision);
    }
    super::out::outln!("A namespace sandbox, seen from inside");
    match seen_from_inside() {
        Ok(v) => describe_inside(&v),
        Err(e) => line(false, "sandbox started", &e),
    }
    ExitCode::SUCCESS
}

fn line(works: bool, feature: &str, detail: &str) {
    super::out::outln!(
        "  {} {:<28} {}",
        if works { "✓" } else { "✗" },
        feature,
        detail
    );
}

fn errno_of(r: std::io::Result<()>) -> Value {
    match r {
        Ok(()) => json!("ok"),
        Err(e) => json!(e.raw_os_error().unwrap_or(-1)),
    }
}

/// What the process sees of itself, as JSON (run by [`seen_from_inside`]).
fn inside_report() -> Value {
    use rustix::net::{AddressFamily, SocketType};
    let sock = |f: AddressFamily, t: SocketType| {
        errno_of(
            rustix::net::socket(f, t, None)
                .map(drop)
                .map_err(std::io::Error::from),
        )
    };
    let tty = errno_of(std::fs::File::open("/dev/tty").map(drop));
    let ptmx = errno_of(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/ptmx")
            .map(drop),
    );
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(str::trim)
            .unwrap_or("?")
            .to_string()
    };
    json!({
        "io_setup": errno_of(airlock_sandbox::namespace::sys::try_native_aio()),
        "ptmx": ptmx,
        "seccomp_filters": field("Seccomp_filters:"),
        "uid_map": std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default().trim(),
        "gid_map": std::fs::read_to_string("/proc/self/gid_map").unwrap_or_default().trim(),
        "uid": rustix::process::getuid().as_raw(),
        "dev_tty": tty,
        "seccomp": field("Seccomp:"),
        "af_unix": sock(AddressFamily::UNIX, SocketType::STREAM),
        "af_inet": sock(AddressFamily::INET, SocketType::STREAM),
        "af_inet6": sock(AddressFamily::INET6, SocketType::STREAM),
        "af_vsock": sock(AddressFamily::VSOCK, SocketType::STREAM),
        "af_netlink": sock(AddressFamily::NETLINK, SocketType::DGRAM),
    })
}

/// Starts one namespace sandbox running `airlock doctor --inside`.
fn seen_from_inside() -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let backend = NamespaceBackend::with_exe(exe.clone());
    backend.check().map_err(|u| u.0)?;
    let dir = std::env::temp_dir().join(format!(
        "airlock-doctor-{}",
        airlock_vault::random_hex::<6>().map_err(|e| e.to_string())?
    ));
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let spec = SandboxSpec {
        run_id: format!("doctor-{}", std::process::id()),
        command: vec![
            backend.runtime_exe(&exe).display().to_string(),
            "doctor".into(),
            "--inside".into(),
        ],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        stdin: vec![],
        hold_stdin: false,
        sockets_dir: dir.clone(),
        ro_paths: vec![],
        workspace: config::WORKSPACE_INSIDE.into(),
        workspace_size_mb: 16,
        memory_mb: 256,
        cpus: 1.0,
        pids_max: 32,
        kind: airlock_sandbox::SandboxKind::Agent,
    };
    let rt = super::current_thread_runtime().map_err(|e| e.to_string())?;
    let out = rt.block_on(async {
        let mut sb = backend.spawn(&spec).map_err(|e| e.to_string())?;
        let (out, err) = sb.take_output();
        let read = async {
            use tokio::io::AsyncReadExt;
            let (mut o, mut e) = (Vec::new(), Vec::new());
            if let Some(mut out) = out {
                let _ = out.read_to_end(&mut o).await;
            }
            if let Some(mut err) = err {
                let _ = err.read_to_end(&mut e).await;
            }
            (o, e)
        };
        let r = tokio::time::timeout(Duration::from_secs(20), read).await;
        sb.cleanup().await;
        let (o, e) = r.map_err(|_| "the sandbox did not answer within 20 s".to_string())?;
        serde_json::from_slice::<Value>(&o).map_err(|_| {
            format!(
                "the sandbox did not report: {}",
                airlock_sandbox::terminal::safe(String::from_utf8_lossy(&e).trim())
            )
        })
    });
    let _ = std::fs::remove_dir_all(&dir);
    out
}

fn describe_inside(v: &Value) {
    let root = rustix::process::geteuid().is_root();
    let map = v["uid_map"].as_str().unwrap_or_default();
    let host_uid = map
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u32>().ok());
    line(
        host_uid.is_some_and(|u| u != 0),
        "uid mapping",
        &format!(
            "uid {} inside is host uid {} ({})",
            v["uid"],
            host_uid.map_or("?".into(), |u| u.to_string()),
            if root {
                format!(
                    "the platform is root: each run gets its own unprivileged uid in {}..{}",
                    config::HOST_ID_BASE,
                    config::HOST_ID_BASE + config::HOST_ID_SPAN
                )
            } else {
                "rootless: the platform's own uid".into()
            }
        ),
    );
    let no_tty = v["dev_tty"] != json!("ok");
    line(
        no_tty,
        "session",
        &format!(
            "a new session without a controlling terminal (/dev/tty: errno {})",
            v["dev_tty"]
        ),
    );
    let allowed: Vec<&str> = syscalls::SOCKET_FAMILIES.iter().map(|(n, _)| *n).collect();
    let foreign_refused =
        v["af_vsock"] == json!(libc_eperm()) && v["af_netlink"] == json!(libc_eperm());
    let own_ok = ["af_unix", "af_inet", "af_inet6"]
        .iter()
        .all(|k| v[*k] == json!("ok"));
    line(
        foreign_refused && own_ok,
        "seccomp socket families",
        &format!(
            "only {} (AF_VSOCK: errno {}, AF_NETLINK: errno {})",
            allowed.join(", "),
            v["af_vsock"],
            v["af_netlink"]
        ),
    );
    line(
        v["seccomp"] == json!("2") && v["seccomp_filters"] == json!("2"),
        "seccomp filter",
        &format!(
            "{}; the same in docker and runner sandboxes",
            seccomp::summary()
        ),
    );
    let aio_refused = v["io_setup"] == json!(libc_eperm());
    line(
        aio_refused,
        "native AIO",
        &format!(
            "refused (io_setup inside: errno {}): the host's pool (fs.aio-max-nr = {}, {} in use) is not a sandbox's",
            v["io_setup"],
            sysctl("fs/aio-max-nr"),
            sysctl("fs/aio-nr")
        ),
    );
    line(
        v["ptmx"] != json!("ok"),
        "pseudo-terminals",
        &format!(
            "none: /dev/ptmx inside: errno {}; docker sandboxes get an empty /dev/pts (kernel.pty.max = {}, {} in use)",
            v["ptmx"],
            sysctl("kernel/pty/max"),
            sysctl("kernel/pty/nr")
        ),
    );
    let ioctls: Vec<&str> = syscalls::DENIED_IOCTLS.iter().map(|(n, _)| *n).collect();
    line(
        v["seccomp"] == json!("2"),
        "seccomp terminal ioctls",
        &format!(
            "{} refused whatever the kernel's legacy_tiocsti says (filter mode {})",
            ioctls.join(", "),
            v["seccomp"]
        ),
    );
}

/// A sysctl's value (`/proc/sys/<path>`), or `?`.
fn sysctl(path: &str) -> String {
    std::fs::read_to_string(Path::new("/proc/sys").join(path))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into())
}

fn libc_eperm() -> i64 {
    i64::from(rustix::io::Errno::PERM.raw_os_error())
}

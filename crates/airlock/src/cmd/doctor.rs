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
use serde::Serialize;
use serde_json::{Value, json};

use super::out::outln;

mod verdict;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  airlock doctor\n  airlock doctor --backend docker\n  airlock doctor --json | jq '.backends[] | select(.works | not)'\n\nExit status: 0 when the chosen backend can run agents here, 1 when it cannot."
)]
pub struct DoctorArgs {
    /// The backend to judge: process | namespace | docker | auto (default:
    /// RUN_ADAPTER, else auto).
    #[arg(long)]
    pub backend: Option<String>,
    /// Print everything as one JSON object (schema `airlock.doctor/v1`).
    #[arg(long)]
    pub json: bool,
    /// (Internal) run inside a sandbox by the doctor: report what it sees.
    #[arg(long, hide = true)]
    pub inside: bool,
}

/// One line of the doctor: a feature, whether it works here, and what was
/// found (or why not).
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    pub feature: String,
    pub works: bool,
    pub detail: String,
}

impl Line {
    fn new(works: bool, feature: &str, detail: &str) -> Line {
        Line {
            feature: feature.to_owned(),
            works,
            detail: detail.to_owned(),
        }
    }
}

impl From<airlock_sandbox::Diagnosis> for Line {
    fn from(d: airlock_sandbox::Diagnosis) -> Self {
        Line {
            feature: d.feature,
            works: d.works,
            detail: d.detail,
        }
    }
}

/// What each sandbox may take of one of the host's kernel-wide pools.
#[derive(Debug, Serialize)]
struct Pool {
    pool: &'static str,
    decision: String,
}

/// Everything the doctor found (`--json`).
#[derive(Debug, Serialize)]
struct Findings {
    schema: &'static str,
    /// The backend judged, as asked (`auto` included).
    chosen: String,
    /// Whether it can run agents here: the exit status says the same.
    chosen_works: bool,
    backends: Vec<verdict::Verdict>,
    docker: Vec<Line>,
    /// The microVM backend's warm pool on this home.
    microvm: Vec<Line>,
    isolation: Vec<Line>,
    pools: Vec<Pool>,
    inside: Vec<Line>,
}

pub fn run(args: DoctorArgs) -> ExitCode {
    if args.inside {
        outln!("{}", inside_report());
        return ExitCode::SUCCESS;
    }
    let chosen = args
        .backend
        .or_else(|| std::env::var("RUN_ADAPTER").ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "auto".into());
    let docker_cfg = airlock_sandbox::docker::DockerConfig::from_env();
    let docker: Vec<Line> = match &docker_cfg {
        Ok(cfg) => match super::current_thread_runtime() {
            Ok(rt) => rt
                .block_on(airlock_sandbox::docker::diagnose::diagnose(cfg))
                .into_iter()
                .map(Line::from)
                .collect(),
            Err(e) => vec![Line::new(false, "docker", &e.to_string())],
        },
        Err(e) => vec![Line::new(false, "settings", &e.to_string())],
    };
    let backends = verdict::all(docker_cfg.as_ref().ok(), &docker);
    let chosen_works = verdict::chosen_works(&chosen, &backends);
    let findings = Findings {
        schema: "airlock.doctor/v1",
        chosen_works,
        chosen,
        backends,
        docker,
        microvm: vec![microvm_pool()],
        isolation: airlock_sandbox::diagnose()
            .into_iter()
            .map(Line::from)
            .collect(),
        pools: airlock_sandbox::pools::decisions()
            .into_iter()
            .map(|d| Pool {
                pool: d.pool,
                decision: d.decision,
            })
            .collect(),
        inside: match seen_from_inside() {
            Ok(v) => describe_inside(&v),
            Err(e) => vec![Line::new(false, "sandbox started", &e)],
        },
    };
    if args.json {
        match serde_json::to_string(&findings) {
            Ok(j) => outln!("{j}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(super::exit::FAILED);
            }
        }
    } else {
        print_text(&findings);
    }
    if chosen_works {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(super::exit::FAILED)
    }
}

fn print_text(f: &Findings) {
    outln!("Backends");
    for v in &f.backends {
        outln!(
            "  {} {:<10} {}",
            if v.works { "✓" } else { "✗" },
            v.backend,
            v.detail
        );
        if let Some(next) = &v.next_step {
            outln!("    → {next}");
        }
    }
    outln!(
        "  {} chosen: {} ({})",
        if f.chosen_works { "✓" } else { "✗" },
        f.chosen,
        if f.chosen_works {
            "it can run agents here"
        } else {
            "it cannot run agents here: see its next step above"
        }
    );
    outln!(
        "  · RUN_ADAPTER=auto picks namespace where it works, else process (never docker: the Docker socket is root on the host, so it is chosen by name)"
    );
    outln!("Docker");
    lines(&f.docker);
    outln!("microVM");
    lines(&f.microvm);
    outln!("Isolation features");
    lines(&f.isolation);
    outln!("The host's kernel-wide pools (what each sandbox may take)");
    for d in &f.pools {
        outln!("  · {:<28} {}", d.pool, d.decision);
    }
    outln!("A namespace sandbox, seen from inside");
    lines(&f.inside);
}

/// The microVM warm pool's line: `MICROVM_WARM_POOL` here, and the idle
/// guests per key of the platforms running on this home.
fn microvm_pool() -> Line {
    use airlock_sandbox::microvm::pool;
    let size = match pool::size_from(std::env::var(pool::ENV_MICROVM_WARM_POOL).ok().as_deref()) {
        Ok(n) => n,
        Err(e) => return Line::new(false, "microVM warm pool", &e.to_string()),
    };
    match airlock_store::airlock_home() {
        Ok(home) => Line::from(pool::diagnose(&home, size)),
        Err(e) => Line::new(false, "microVM warm pool", &e.to_string()),
    }
}

fn lines(ls: &[Line]) {
    for l in ls {
        outln!(
            "  {} {:<28} {}",
            if l.works { "✓" } else { "✗" },
            l.feature,
            l.detail
        );
    }
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

fn describe_inside(v: &Value) -> Vec<Line> {
    let mut out = Vec::new();
    let root = rustix::process::geteuid().is_root();
    let map = v["uid_map"].as_str().unwrap_or_default();
    let host_uid = map
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u32>().ok());
    out.push(Line::new(
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
    ));
    let no_tty = v["dev_tty"] != json!("ok");
    out.push(Line::new(
        no_tty,
        "session",
        &format!(
            "a new session without a controlling terminal (/dev/tty: errno {})",
            v["dev_tty"]
        ),
    ));
    let allowed: Vec<&str> = syscalls::SOCKET_FAMILIES.iter().map(|(n, _)| *n).collect();
    let foreign_refused =
        v["af_vsock"] == json!(libc_eperm()) && v["af_netlink"] == json!(libc_eperm());
    let own_ok = ["af_unix", "af_inet", "af_inet6"]
        .iter()
        .all(|k| v[*k] == json!("ok"));
    out.push(Line::new(
        foreign_refused && own_ok,
        "seccomp socket families",
        &format!(
            "only {} (AF_VSOCK: errno {}, AF_NETLINK: errno {})",
            allowed.join(", "),
            v["af_vsock"],
            v["af_netlink"]
        ),
    ));
    out.push(Line::new(
        v["seccomp"] == json!("2") && v["seccomp_filters"] == json!("2"),
        "seccomp filter",
        &format!(
            "{}; the same in docker and runner sandboxes",
            seccomp::summary()
        ),
    ));
    let aio_refused = v["io_setup"] == json!(libc_eperm());
    out.push(Line::new(
        aio_refused,
        "native AIO",
        &format!(
            "refused (io_setup inside: errno {}): the host's pool (fs.aio-max-nr = {}, {} in use) is not a sandbox's",
            v["io_setup"],
            sysctl("fs/aio-max-nr"),
            sysctl("fs/aio-nr")
        ),
    ));
    out.push(Line::new(
        v["ptmx"] != json!("ok"),
        "pseudo-terminals",
        &format!(
            "none: /dev/ptmx inside: errno {}; docker sandboxes get an empty /dev/pts (kernel.pty.max = {}, {} in use)",
            v["ptmx"],
            sysctl("kernel/pty/max"),
            sysctl("kernel/pty/nr")
        ),
    ));
    let ioctls: Vec<&str> = syscalls::DENIED_IOCTLS.iter().map(|(n, _)| *n).collect();
    out.push(Line::new(
        v["seccomp"] == json!("2"),
        "seccomp terminal ioctls",
        &format!(
            "{} refused whatever the kernel's legacy_tiocsti says (filter mode {})",
            ioctls.join(", "),
            v["seccomp"]
        ),
    ));
    out
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

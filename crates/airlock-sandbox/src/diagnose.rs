//! What `airlock doctor` prints about sandboxing: one line per feature.

use std::path::Path;

use crate::namespace::{cgroup, sys};

/// One feature: does it work here, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Diagnosis {
    pub feature: String,
    pub works: bool,
    /// Why not (or what was found, when it works).
    pub detail: String,
}

fn d(feature: impl Into<String>, r: Result<String, String>) -> Diagnosis {
    match r {
        Ok(detail) => Diagnosis {
            feature: feature.into(),
            works: true,
            detail,
        },
        Err(detail) => Diagnosis {
            feature: feature.into(),
            works: false,
            detail,
        },
    }
}

/// Probes this host. Forks a few short-lived processes; takes milliseconds.
pub fn diagnose() -> Vec<Diagnosis> {
    use rustix::thread::UnshareFlags as F;
    let mut out = vec![d(
        "process backend",
        Ok("always available; isolates nothing".into()),
    )];
    let userns = crate::namespace::userns_diagnosis();
    out.push(d(
        "user namespaces (all sandbox namespaces, uid map, mount)",
        userns.clone().map(|()| "work".into()),
    ));
    let kinds = [
        ("user", F::NEWUSER),
        ("mount", F::NEWUSER | F::NEWNS),
        ("pid", F::NEWUSER | F::NEWPID),
        ("net", F::NEWUSER | F::NEWNET),
        ("ipc", F::NEWUSER | F::NEWIPC),
        ("uts", F::NEWUSER | F::NEWUTS),
        ("cgroup", F::NEWUSER | F::NEWCGROUP),
    ];
    for (name, flags) in kinds {
        let r = match sys::probe_userns(flags) {
            None => Ok("can be created".into()),
            Some(f) => Err(format!(
                "{:?} failed: {}",
                f.step,
                std::io::Error::from_raw_os_error(f.errno)
            )),
        };
        out.push(d(format!("{name} namespace"), r));
    }
    out.push(d(
        "mount_setattr (Linux 5.12+, recursive read-only binds)",
        if kernel_at_least(5, 12) {
            Ok("available".into())
        } else {
            Err("kernel older than 5.12: the namespace backend needs mount_setattr".into())
        },
    ));
    out.push(d(
        "cgroup limits (memory, CPU, pids)",
        match cgroup::probe() {
            Ok(cgroup::Layout::V2(m)) => Ok(format!("cgroup v2 at {}", m.display())),
            Ok(cgroup::Layout::V1(v)) => Ok(format!(
                "cgroup v1: {}",
                v.iter()
                    .map(|(c, m)| format!("{c} at {}", m.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Err(e) => Err(format!("{e}; runs get no limits")),
        },
    ));
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    out.push(d(
        "seccomp",
        if status.contains("Seccomp:") {
            Ok("filters supported".into())
        } else {
            Err("kernel without CONFIG_SECCOMP_FILTER".into())
        },
    ));
    out.push(d(
        "landlock",
        match sys::landlock_abi() {
            Ok(v) => Ok(format!("ABI {v}")),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Err("built into the kernel but not enabled (add landlock to the lsm= boot parameter); runs rely on mounts alone".into()),
            Err(e) => Err(format!("not available ({e}); runs rely on mounts alone")),
        },
    ));
    out.push(d(
        "no_new_privs",
        rustix::thread::no_new_privs()
            .map(|_| "supported".into())
            .map_err(|e| e.to_string()),
    ));
    out.push(d(
        "bubblewrap (benchmark baseline only)",
        if Path::new("/usr/bin/bwrap").exists() {
            Ok("/usr/bin/bwrap".into())
        } else {
            Err("not installed (apt-get install bubblewrap)".into())
        },
    ));
    out
}

fn kernel_at_least(major: u32, minor: u32) -> bool {
    let uname = rustix::system::uname();
    let rel = uname.release().to_string_lossy();
    let mut it = rel
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse::<u32>().ok());
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

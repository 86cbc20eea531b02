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

impl Diagnosis {
    /// `feature` works here; `detail` says what was found.
    pub fn works(feature: impl Into<String>, detail: impl Into<String>) -> Diagnosis {
        Diagnosis {
            feature: feature.into(),
            works: true,
            detail: detail.into(),
        }
    }

    /// `feature` does not work here; `why` says why not.
    pub fn fails(feature: impl Into<String>, why: impl std::fmt::Display) -> Diagnosis {
        Diagnosis {
            feature: feature.into(),
            works: false,
            detail: why.to_string(),
        }
    }
}

/// Probes this host. Forks a few short-lived processes; takes milliseconds.
pub fn diagnose() -> Vec<Diagnosis> {
    use rustix::thread::UnshareFlags as F;
    let mut out = vec![Diagnosis::works(
        "process backend",
        "always available; isolates nothing",
    )];
    let userns = "user namespaces (all sandbox namespaces, uid map, mount)";
    out.push(match crate::namespace::userns_diagnosis() {
        Ok(()) => Diagnosis::works(userns, "work"),
        Err(why) => Diagnosis::fails(userns, why),
    });
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
        let feature = format!("{name} namespace");
        out.push(match sys::probe_userns(flags) {
            None => Diagnosis::works(feature, "can be created"),
            Some(f) => Diagnosis::fails(
                feature,
                format_args!(
                    "{:?} failed: {}",
                    f.step,
                    std::io::Error::from_raw_os_error(f.errno)
                ),
            ),
        });
    }
    let setattr = "mount_setattr (Linux 5.12+, recursive read-only binds)";
    out.push(if kernel_at_least(5, 12) {
        Diagnosis::works(setattr, "available")
    } else {
        Diagnosis::fails(
            setattr,
            "kernel older than 5.12: the namespace backend needs mount_setattr",
        )
    });
    let limits = "cgroup limits (memory, CPU, pids)";
    out.push(match cgroup::probe() {
        Ok(cgroup::Layout::V2(m)) => {
            Diagnosis::works(limits, format!("cgroup v2 at {}", m.display()))
        }
        Ok(cgroup::Layout::V1(v)) => Diagnosis::works(
            limits,
            format!(
                "cgroup v1: {}",
                v.iter()
                    .map(|(c, m)| format!("{c} at {}", m.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Err(e) => Diagnosis::fails(limits, format_args!("{e}; runs get no limits")),
    });
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    out.push(if status.contains("Seccomp:") {
        Diagnosis::works("seccomp", "filters supported")
    } else {
        Diagnosis::fails("seccomp", "kernel without CONFIG_SECCOMP_FILTER")
    });
    out.push(match sys::landlock_abi() {
        Ok(v) => Diagnosis::works("landlock", format!("ABI {v}")),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Diagnosis::fails("landlock", "built into the kernel but not enabled (add landlock to the lsm= boot parameter); runs rely on mounts alone"),
        Err(e) => Diagnosis::fails("landlock", format_args!("not available ({e}); runs rely on mounts alone")),
    });
    out.push(match rustix::thread::no_new_privs() {
        Ok(_) => Diagnosis::works("no_new_privs", "supported"),
        Err(e) => Diagnosis::fails("no_new_privs", e),
    });
    let bwrap = "bubblewrap (benchmark baseline only)";
    out.push(if Path::new("/usr/bin/bwrap").exists() {
        Diagnosis::works(bwrap, "/usr/bin/bwrap")
    } else {
        Diagnosis::fails(bwrap, "not installed (apt-get install bubblewrap)")
    });
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

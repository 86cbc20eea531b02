//! `airlock sandbox-init`: the sandbox's setup, run by the `airlock` binary
//! itself (single-threaded: no runtime, no threads).
//!
//! Stage A (host PID namespace): leaves the operator's session (a new
//! session has no controlling terminal, so `/dev/tty` reaches nothing),
//! does what concerns no run (dies with its parent, marks every inherited
//! descriptor close-on-exec, compiles the seccomp filters: an init started
//! ahead of its run waits after this, holding nothing of any run, in the
//! standby cgroups it may be given to join ([`Header::Standby`]), which
//! become its run's), reads the [`InitConfig`] header from stdin, checks its
//! parent is the platform, joins the run's cgroups unless they are the ones
//! it joined already ([`cgroup::join_self`]: on cgroup v1 by moving its one
//! thread, which takes no global lock and waits for no RCU grace period),
//! becomes the run's unprivileged host uid/gid when the
//! platform is root ([`super::config::HostIds`]), unshares the user, mount,
//! PID, network, IPC, UTS and cgroup namespaces (so the user namespace is
//! owned by that uid and its kernel quotas are the run's, not root's), maps
//! [`SANDBOX_UID`]/[`SANDBOX_GID`] to it, and forks stage B; it then only
//! waits and passes B's exit code on.
//!
//! Stage B (PID 1 of the new namespace, not dumpable): builds the
//! filesystem ([`super::plan`]), brings up loopback, names the host, caps
//! its open files ([`crate::pools::OPEN_FILES`]), then drops every
//! capability, sets `no_new_privs`, applies Landlock and seccomp, and starts the command with the rest of stdin (the secrets),
//! the given environment only, in the workspace. It reaps orphans and exits
//! with the command's code (128+signal when killed); its death kills the
//! namespace.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::Command;

use rustix::process::{Pid, Signal, WaitOptions};

use super::config::{HOSTNAME, Header, InitConfig, SANDBOX_GID, SANDBOX_UID};
use super::{cgroup, fs_rules, plan, sys};
use crate::seccomp;

/// Exit code of a setup failure (before the command ran).
pub const SETUP_FAILED: i32 = 125;

#[derive(Debug, thiserror::Error)]
#[error("{step}: {detail}")]
pub struct InitError {
    step: &'static str,
    detail: String,
}

fn at<E: std::fmt::Display>(step: &'static str) -> impl FnOnce(E) -> InitError {
    move |e| InitError {
        step,
        detail: e.to_string(),
    }
}

/// Reads fd 0 without buffering, so the bytes after the header stay there.
struct RawStdin;

impl std::io::Read for RawStdin {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let stdin = std::io::stdin();
        Ok(rustix::io::read(stdin.as_fd(), buf)?)
    }
}

/// Entry point of `airlock sandbox-init`; returns the process exit code.
pub fn main() -> i32 {
    match stage_a() {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "airlock sandbox-init: {e}");
            SETUP_FAILED
        }
    }
}

fn stage_a() -> Result<i32, InitError> {
    // First of all: out of the operator's session and away from its terminal.
    rustix::process::setsid().map_err(at("setsid"))?;
    // Nothing of any run yet (a standby init waits below for its run): only
    // what concerns none. It dies with whoever started it, from now on.
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(at("PR_SET_PDEATHSIG"))?;
    sys::cloexec_from_3().map_err(at("close_range"))?;
    let filters = seccomp::Filters::compile().map_err(at("seccomp"))?;
    let cfg = read_run_header()?;
    // The one who started it is the platform (and still there).
    die_with_parent(cfg.parent_pid)?;
    // Still single-threaded and in the host's namespaces: into the run's
    // cgroups before anything else of the run exists.
    cgroup::join_self(&cfg.cgroups).map_err(at("join cgroup"))?;
    // What the sandbox shares of the host, taken while still root (see
    // `plan::Trees`); a rootless init reaches the same paths as itself.
    let trees = if cfg.ids.switch {
        let mut paths = vec![cfg.sockets_dir.as_path(), cfg.exe.as_path()];
        paths.extend(cfg.ro_paths.iter().map(PathBuf::as_path));
        plan::Trees::detach(&sys::Real, &paths).map_err(at("share"))?
    } else {
        plan::Trees::default()
    };
    if cfg.ids.switch {
        become_host_ids(cfg.ids.uid, cfg.ids.gid)?;
        // A credential change clears the parent-death signal.
        die_with_parent(cfg.parent_pid)?;
    }
    sys::unshare_namespaces(sys::sandbox_namespaces()).map_err(at("unshare"))?;
    std::fs::write("/proc/self/setgroups", "deny").map_err(at("setgroups"))?;
    std::fs::write(
        "/proc/self/uid_map",
        format!("{SANDBOX_UID} {} 1", cfg.ids.uid),
    )
    .map_err(at("uid_map"))?;
    std::fs::write(
        "/proc/self/gid_map",
        format!("{SANDBOX_GID} {} 1", cfg.ids.gid),
    )
    .map_err(at("gid_map"))?;
    // Nothing of A or B (PID 1 inside) may be read through /proc.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(at("non-dumpable"))?;
    // B learns that A died (and must stop) from EOF on this pipe.
    let (alive_r, alive_w) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(at("pipe"))?;
    match sys::fork_single_threaded().map_err(at("fork"))? {
        sys::Forked::Child => {
            drop(alive_w);
            let code = match stage_b(&cfg, alive_r, &trees, &filters) {
                Ok(code) => code,
                Err(e) => {
                    let _ = writeln!(std::io::stderr(), "airlock sandbox-init: {e}");
                    SETUP_FAILED
                }
            };
            std::process::exit(code);
        }
        sys::Forked::Parent(child) => {
            drop(alive_r);
            let status = loop {
                match rustix::process::waitpid(Some(child), WaitOptions::empty()) {
                    Ok(Some((_, st))) => break st,
                    Ok(None) => continue,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(at("wait")(e)),
                }
            };
            drop(alive_w);
            Ok(exit_code(status))
        }
    }
}

/// Reads the run's header; an init started ahead may first be given its
/// standby cgroups, which it joins at once, still waiting for its run.
fn read_run_header() -> Result<InitConfig, InitError> {
    let mut standby = false;
    loop {
        match Header::decode(RawStdin).map_err(at("config"))? {
            Header::Run(cfg) => return Ok(*cfg),
            Header::Standby { cgroups } if !standby => {
                cgroup::join_self(&cgroups).map_err(at("join standby cgroup"))?;
                standby = true;
            }
            Header::Standby { .. } => {
                return Err(InitError {
                    step: "config",
                    detail: "a second standby header".into(),
                });
            }
        }
    }
}

/// Dies with the spawning process, and checks it has not died already.
fn die_with_parent(parent_pid: i32) -> Result<(), InitError> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(at("PR_SET_PDEATHSIG"))?;
    if rustix::process::getppid()
        .map(Pid::as_raw_nonzero)
        .map(|p| p.get())
        != Some(parent_pid)
    {
        return Err(InitError {
            step: "parent",
            detail: "the spawning process is gone".into(),
        });
    }
    Ok(())
}

/// The platform is root: become the run's own unprivileged host uid/gid,
/// with no supplementary group, before any namespace exists.
fn become_host_ids(uid: u32, gid: u32) -> Result<(), InitError> {
    use rustix::process::{Gid, Uid};
    // rustix changes the calling thread only: sandbox-init is single-threaded.
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    rustix::thread::set_thread_groups(&[]).map_err(at("setgroups"))?;
    rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(at("setresgid"))?;
    rustix::thread::set_thread_res_uid(uid, uid, uid).map_err(at("setresuid"))?;
    if rustix::process::geteuid() != uid || rustix::process::getegid() != gid {
        return Err(InitError {
            step: "setresuid",
            detail: "the credentials did not change".into(),
        });
    }
    // The change made the process non-dumpable, which gives /proc/self to
    // root: it must own it again to write its own uid_map.
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable)
        .map_err(at("dumpable"))?;
    Ok(())
}

fn exit_code(st: rustix::process::WaitStatus) -> i32 {
    if let Some(c) = st.exit_status() {
        c
    } else if let Some(sig) = st.terminating_signal() {
        128 + sig
    } else {
        SETUP_FAILED
    }
}

fn stage_b(
    cfg: &InitConfig,
    alive: OwnedFd,
    trees: &plan::Trees,
    filters: &seccomp::Filters,
) -> Result<i32, InitError> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(at("PR_SET_PDEATHSIG"))?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(at("non-dumpable"))?;
    rustix::io::ioctl_fionbio(&alive, true).map_err(at("alive pipe"))?;
    let mut b = [0u8; 1];
    if matches!(rustix::io::read(&alive, &mut b), Ok(0)) {
        return Err(InitError {
            step: "parent",
            detail: "stage A is gone".into(),
        });
    }
    drop(alive);

    plan::build_root(&mut sys::Real, cfg, trees).map_err(at("filesystem"))?;
    rustix::system::sethostname(HOSTNAME.as_bytes()).map_err(at("sethostname"))?;
    sys::loopback_up().map_err(at("loopback"))?;

    // The sandbox's share of the host's open files (every process of it;
    // none can raise it).
    let nofile = rustix::process::Rlimit {
        current: Some(crate::pools::OPEN_FILES),
        maximum: Some(crate::pools::OPEN_FILES),
    };
    rustix::process::setrlimit(rustix::process::Resource::Nofile, nofile)
        .map_err(at("RLIMIT_NOFILE"))?;
    // Capabilities: the bounding set first (needs CAP_SETPCAP), then the rest.
    caps::clear(None, caps::CapSet::Bounding).map_err(at("drop bounding capabilities"))?;
    caps::clear(None, caps::CapSet::Ambient).map_err(at("drop ambient capabilities"))?;
    rustix::thread::set_no_new_privs(true).map_err(at("no_new_privs"))?;
    fs_rules::apply(cfg.workspace.clone()).map_err(at("landlock"))?;
    for set in [
        caps::CapSet::Inheritable,
        caps::CapSet::Effective,
        caps::CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(at("drop capabilities"))?;
    }
    filters.install().map_err(at("seccomp"))?;

    let (prog, args) = cfg.command.split_first().ok_or_else(|| InitError {
        step: "command",
        detail: "empty".into(),
    })?;
    let child = Command::new(prog)
        .args(args)
        .env_clear()
        .envs(cfg.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&cfg.workspace)
        .spawn()
        .map_err(|e| InitError {
            step: "exec",
            detail: format!("{prog}: {e}"),
        })?;
    // A pid fits an i32 (pid_max is at most 2^22).
    let main = i32::try_from(child.id()).map_err(|e| InitError {
        step: "exec",
        detail: format!("{prog}: pid: {e}"),
    })?;
    drop(child);
    // PID 1: reap everything until the command itself exits.
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, st))) if pid.as_raw_nonzero().get() == main => return Ok(exit_code(st)),
            Ok(_) | Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(at("wait")(e)),
        }
    }
}

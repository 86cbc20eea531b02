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
//! waits, passing a stop (`SIGTERM`, [`sys::FORWARDED`]) on to B, and
//! passes B's exit code on.
//!
//! Stage B (PID 1 of the new namespace, not dumpable): builds the
//! filesystem ([`super::plan`]), brings up loopback, names the host, caps
//! its open files ([`crate::pools::OPEN_FILES`]), then drops every
//! capability, sets `no_new_privs`, applies Landlock and seccomp, and starts the command with the rest of stdin (the secrets),
//! the given environment only, in the workspace. It passes a stop on to the
//! command (the runtime, which ends its agent and reports what it holds),
//! reaps orphans and exits with the command's code (128+signal when
//! killed); its death kills the namespace.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::config::{HOSTNAME, Header, HostIds, InitConfig, SANDBOX_GID, SANDBOX_UID};
use super::plan;
use super::sys::{self, CapSet, Forked, Sys};
use crate::seccomp;

/// Exit code of a setup failure (before the command ran).
pub const SETUP_FAILED: i32 = 125;

/// The step of the init that failed ([`InitError`]), named as the init
/// reports it on stderr (`airlock sandbox-init: <step>: <why>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    NewSession,
    DeathSignal,
    CloseRange,
    CompileSeccomp,
    Config,
    JoinStandbyCgroup,
    Parent,
    JoinCgroup,
    Share,
    DropGroups,
    SetGid,
    SetUid,
    Dumpable,
    Unshare,
    DenySetgroups,
    UidMap,
    GidMap,
    NonDumpable,
    Pipe,
    Fork,
    Wait,
    AlivePipe,
    Filesystem,
    Hostname,
    Loopback,
    OpenFiles,
    DropBounding,
    DropAmbient,
    NoNewPrivs,
    Landlock,
    DropCapabilities,
    InstallSeccomp,
    Command,
    Exec,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::NewSession => "setsid",
            Step::DeathSignal => "PR_SET_PDEATHSIG",
            Step::CloseRange => "close_range",
            Step::CompileSeccomp | Step::InstallSeccomp => "seccomp",
            Step::Config => "config",
            Step::JoinStandbyCgroup => "join standby cgroup",
            Step::Parent => "parent",
            Step::JoinCgroup => "join cgroup",
            Step::Share => "share",
            Step::DropGroups | Step::DenySetgroups => "setgroups",
            Step::SetGid => "setresgid",
            Step::SetUid => "setresuid",
            Step::Dumpable => "dumpable",
            Step::Unshare => "unshare",
            Step::UidMap => "uid_map",
            Step::GidMap => "gid_map",
            Step::NonDumpable => "non-dumpable",
            Step::Pipe => "pipe",
            Step::Fork => "fork",
            Step::Wait => "wait",
            Step::AlivePipe => "alive pipe",
            Step::Filesystem => "filesystem",
            Step::Hostname => "sethostname",
            Step::Loopback => "loopback",
            Step::OpenFiles => "RLIMIT_NOFILE",
            Step::DropBounding => "drop bounding capabilities",
            Step::DropAmbient => "drop ambient capabilities",
            Step::NoNewPrivs => "no_new_privs",
            Step::Landlock => "landlock",
            Step::DropCapabilities => "drop capabilities",
            Step::Command => "command",
            Step::Exec => "exec",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A setup step that failed, and why.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct InitError {
    pub step: Step,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl InitError {
    fn new(step: Step, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> InitError {
        InitError {
            step,
            source: source.into(),
        }
    }
}

fn at<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    step: Step,
) -> impl FnOnce(E) -> InitError {
    move |e| InitError::new(step, e)
}

/// The command could not be started.
#[derive(Debug, thiserror::Error)]
#[error("{program}: {source}")]
struct ExecError {
    program: String,
    source: std::io::Error,
}

/// Entry point of `airlock sandbox-init`; returns the process exit code.
pub fn main() -> i32 {
    match stage_a(&mut sys::Real) {
        Ok(code) => code,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "airlock sandbox-init: {e}");
            SETUP_FAILED
        }
    }
}

/// Stage A: what concerns no run, the run's header, the run's cgroups,
/// ids and namespaces, then stage B forked; passes B's exit code on.
fn stage_a(sys: &mut impl Sys) -> Result<i32, InitError> {
    let filters = before_any_run(sys)?;
    let cfg = read_run_header(sys)?;
    let trees = enter_run(sys, &cfg)?;
    // B learns that A died (and must stop) from EOF on this pipe.
    let (alive_r, alive_w) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(at(Step::Pipe))?;
    match sys.fork().map_err(at(Step::Fork))? {
        Forked::Child => {
            drop(alive_w);
            let code = match stage_b(sys, &cfg, alive_r, &trees, &filters) {
                Ok(code) => code,
                Err(e) => {
                    let _ = writeln!(std::io::stderr(), "airlock sandbox-init: {e}");
                    SETUP_FAILED
                }
            };
            std::process::exit(code);
        }
        Forked::Parent(child) => {
            drop(alive_r);
            let code = sys.wait_child(child).map_err(at(Step::Wait))?;
            drop(alive_w);
            Ok(code)
        }
    }
}

/// First of all: out of the operator's session and away from its
/// terminal. Then only what concerns no run (a standby init waits after
/// this for its run): it dies with whoever started it, nothing inherited
/// reaches the command, the seccomp filters are compiled.
fn before_any_run(sys: &mut impl Sys) -> Result<seccomp::Filters, InitError> {
    sys.new_session().map_err(at(Step::NewSession))?;
    sys.die_with_parent().map_err(at(Step::DeathSignal))?;
    sys.cloexec_from_3().map_err(at(Step::CloseRange))?;
    seccomp::Filters::compile().map_err(at(Step::CompileSeccomp))
}

/// Reads the run's header; an init started ahead may first be given its
/// standby cgroups, which it joins at once, still waiting for its run.
fn read_run_header(sys: &mut impl Sys) -> Result<InitConfig, InitError> {
    let mut standby = false;
    loop {
        match sys.read_header().map_err(at(Step::Config))? {
            Header::Run(cfg) => return Ok(*cfg),
            Header::Standby { cgroups } if !standby => {
                sys.join_cgroups(&cgroups)
                    .map_err(at(Step::JoinStandbyCgroup))?;
                standby = true;
            }
            Header::Standby { .. } => {
                return Err(InitError::new(Step::Config, "a second standby header"));
            }
        }
    }
}

/// The run's side of stage A, still single-threaded and in the host's
/// namespaces: its cgroups before anything else of the run exists, the
/// host trees it shares (taken while still root), its host ids, its
/// namespaces and their id maps. Returns the shared trees.
fn enter_run(sys: &mut impl Sys, cfg: &InitConfig) -> Result<plan::Trees, InitError> {
    // The one who started it is the platform (and still there).
    die_with_parent(sys, cfg.parent_pid)?;
    sys.join_cgroups(&cfg.cgroups)
        .map_err(at(Step::JoinCgroup))?;
    // What the sandbox shares of the host, taken while still root (see
    // `plan::Trees`); a rootless init reaches the same paths as itself.
    let trees = if cfg.ids.switch {
        let mut paths = vec![cfg.sockets_dir.as_path(), cfg.exe.as_path()];
        paths.extend(cfg.ro_paths.iter().map(PathBuf::as_path));
        plan::Trees::detach(&*sys, &paths).map_err(at(Step::Share))?
    } else {
        plan::Trees::default()
    };
    if cfg.ids.switch {
        become_host_ids(sys, cfg.ids.uid, cfg.ids.gid)?;
        // A credential change clears the parent-death signal.
        die_with_parent(sys, cfg.parent_pid)?;
    }
    sys.unshare(sys::sandbox_namespaces())
        .map_err(at(Step::Unshare))?;
    map_ids(sys, cfg.ids)?;
    // Nothing of A or B (PID 1 inside) may be read through /proc.
    sys.set_dumpable(false).map_err(at(Step::NonDumpable))?;
    Ok(trees)
}

/// Dies with the spawning process, and checks it has not died already.
fn die_with_parent(sys: &mut impl Sys, parent_pid: i32) -> Result<(), InitError> {
    sys.die_with_parent().map_err(at(Step::DeathSignal))?;
    if sys.parent() != Some(parent_pid) {
        return Err(InitError::new(Step::Parent, "the spawning process is gone"));
    }
    Ok(())
}

/// The platform is root: become the run's own unprivileged host uid/gid,
/// with no supplementary group, before any namespace exists.
fn become_host_ids(sys: &mut impl Sys, uid: u32, gid: u32) -> Result<(), InitError> {
    sys.drop_groups().map_err(at(Step::DropGroups))?;
    sys.set_gid(gid).map_err(at(Step::SetGid))?;
    sys.set_uid(uid).map_err(at(Step::SetUid))?;
    if sys.effective_ids() != (uid, gid) {
        return Err(InitError::new(
            Step::SetUid,
            "the credentials did not change",
        ));
    }
    // The change made the process non-dumpable, which gives /proc/self to
    // root: it must own it again to write its own uid_map.
    sys.set_dumpable(true).map_err(at(Step::Dumpable))
}

/// Maps [`SANDBOX_UID`]/[`SANDBOX_GID`] of the new user namespace to the
/// run's host ids, with `setgroups` denied.
fn map_ids(sys: &mut impl Sys, ids: HostIds) -> Result<(), InitError> {
    sys.write(Path::new("/proc/self/setgroups"), "deny")
        .map_err(at(Step::DenySetgroups))?;
    sys.write(
        Path::new("/proc/self/uid_map"),
        &format!("{SANDBOX_UID} {} 1", ids.uid),
    )
    .map_err(at(Step::UidMap))?;
    sys.write(
        Path::new("/proc/self/gid_map"),
        &format!("{SANDBOX_GID} {} 1", ids.gid),
    )
    .map_err(at(Step::GidMap))
}

/// Stage B, PID 1 of the new namespaces: the filesystem, the network and
/// the host name, then the confinement, then the command, reaped with
/// every orphan until it exits.
fn stage_b(
    sys: &mut impl Sys,
    cfg: &InitConfig,
    alive: OwnedFd,
    trees: &plan::Trees,
    filters: &seccomp::Filters,
) -> Result<i32, InitError> {
    sys.die_with_parent().map_err(at(Step::DeathSignal))?;
    sys.set_dumpable(false).map_err(at(Step::NonDumpable))?;
    stage_a_alive(alive)?;
    plan::build_root(sys, cfg, trees).map_err(at(Step::Filesystem))?;
    sys.set_hostname(HOSTNAME).map_err(at(Step::Hostname))?;
    sys.loopback_up().map_err(at(Step::Loopback))?;
    confine(sys, &cfg.workspace, filters)?;
    let main = start_command(sys, cfg)?;
    // PID 1: reap everything until the command itself exits.
    sys.reap_until(main).map_err(at(Step::Wait))
}

/// Whether stage A still holds the other end of `alive` (it is gone once
/// the pipe reads end-of-file).
fn stage_a_alive(alive: OwnedFd) -> Result<(), InitError> {
    rustix::io::ioctl_fionbio(&alive, true).map_err(at(Step::AlivePipe))?;
    let mut b = [0u8; 1];
    if matches!(rustix::io::read(&alive, &mut b), Ok(0)) {
        return Err(InitError::new(Step::Parent, "stage A is gone"));
    }
    Ok(())
}

/// The sandbox's share of the host's open files (every process of it;
/// none can raise it), then every capability dropped (the bounding set
/// first: that needs CAP_SETPCAP), `no_new_privs`, Landlock and, last,
/// seccomp.
fn confine(
    sys: &mut impl Sys,
    workspace: &Path,
    filters: &seccomp::Filters,
) -> Result<(), InitError> {
    sys.limit_open_files(crate::pools::OPEN_FILES)
        .map_err(at(Step::OpenFiles))?;
    sys.clear_caps(CapSet::Bounding)
        .map_err(at(Step::DropBounding))?;
    sys.clear_caps(CapSet::Ambient)
        .map_err(at(Step::DropAmbient))?;
    sys.no_new_privs().map_err(at(Step::NoNewPrivs))?;
    sys.restrict_fs(workspace).map_err(at(Step::Landlock))?;
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        sys.clear_caps(set).map_err(at(Step::DropCapabilities))?;
    }
    sys.install_seccomp(filters)
        .map_err(at(Step::InstallSeccomp))
}

/// Starts the command with the given environment only, in the workspace,
/// with the rest of stdin (the secrets); its PID.
fn start_command(sys: &mut impl Sys, cfg: &InitConfig) -> Result<i32, InitError> {
    let (program, args) = cfg
        .command
        .split_first()
        .ok_or_else(|| InitError::new(Step::Command, "empty"))?;
    let command = sys::Command {
        program,
        args,
        env: &cfg.env,
        cwd: &cfg.workspace,
    };
    sys.spawn(&command).map_err(|source| {
        InitError::new(
            Step::Exec,
            ExecError {
                program: program.clone(),
                source,
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::super::cgroup::Join;
    use super::super::plan::tests::{cfg, host, pos};
    use super::super::sys::Kind;
    use super::super::sys::record::{COMMAND_PID, Recorder, STAGE_B_PID};
    use super::*;

    const PLATFORM: i32 = 42;
    const HOST_ID: u32 = 0x5A00_0001;

    /// A root platform's run: it switches to the run's host ids.
    fn root_run() -> InitConfig {
        let mut c = cfg();
        c.parent_pid = PLATFORM;
        c.cgroups = vec![Join::Thread(
            "/sys/fs/cgroup/memory/airlock/airlock-r1".into(),
        )];
        c.ids = HostIds {
            uid: HOST_ID,
            gid: HOST_ID,
            switch: true,
        };
        c
    }

    /// A host where the platform is there and the run's header on stdin.
    fn started(c: &InitConfig) -> Recorder {
        let mut r = host();
        r.parent = Some(PLATFORM);
        r.headers.push_back(Header::Run(Box::new(c.clone())));
        // Shared while root, from the host's own paths.
        r.host.insert(c.sockets_dir.clone(), Kind::Dir);
        r.host.insert(c.exe.clone(), Kind::File);
        r.host.insert(c.ro_paths[0].clone(), Kind::Dir);
        r
    }

    fn stage_b_of(r: &mut Recorder, c: &InitConfig) -> Result<i32, InitError> {
        let filters = seccomp::Filters::compile().unwrap();
        // Stage A's end stays open: it is alive.
        let (alive, _a) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        stage_b(r, c, alive, &plan::Trees::default(), &filters)
    }

    /// The order of stage A's privileged steps: out of the session before
    /// anything; the run's cgroups before anything else of the run; the
    /// host trees taken while root; the host ids before the namespaces
    /// (which then belong to them), the death signal set again after the
    /// change; the id maps; non-dumpable before B exists.
    #[test]
    fn stage_a_takes_its_privileged_steps_in_order() {
        let c = root_run();
        let mut r = started(&c);
        assert_eq!(stage_a(&mut r).unwrap(), 0);
        let unshare = format!("unshare {:#x}", sys::sandbox_namespaces().bits());
        let join = format!("join cgroups {:?}", c.cgroups);
        assert_eq!(
            r.ops,
            [
                "setsid",
                "pdeathsig",
                "close_range",
                "read header",
                "pdeathsig",
                join.as_str(),
                "setgroups none",
                format!("setresgid {HOST_ID}").as_str(),
                format!("setresuid {HOST_ID}").as_str(),
                "dumpable",
                "pdeathsig",
                unshare.as_str(),
                "write /proc/self/setgroups deny",
                format!("write /proc/self/uid_map {SANDBOX_UID} {HOST_ID} 1").as_str(),
                format!("write /proc/self/gid_map {SANDBOX_GID} {HOST_ID} 1").as_str(),
                "non-dumpable",
                "fork",
                format!("wait {STAGE_B_PID}").as_str(),
            ]
        );
    }

    /// A rootless platform's init changes no credential and takes no
    /// copy of a host tree; the rest is the same.
    #[test]
    fn a_rootless_stage_a_changes_no_credential() {
        let c = cfg();
        let mut r = host();
        r.parent = Some(c.parent_pid);
        r.headers.push_back(Header::Run(Box::new(c.clone())));
        assert_eq!(stage_a(&mut r).unwrap(), 0);
        assert!(
            !r.ops
                .iter()
                .any(|o| o.starts_with("setres") || o.starts_with("setgroups") || o == "dumpable"),
            "{:#?}",
            r.ops
        );
        assert!(pos(&r.ops, "read header") < pos(&r.ops, "fork"));
    }

    /// A standby init joins its standby cgroups while it waits, then its
    /// run's; a second standby header stops it before anything of a run.
    #[test]
    fn a_standby_init_joins_its_cgroups_before_the_run_header() {
        let c = root_run();
        let mut r = started(&c);
        let standby = vec![Join::Thread(
            "/sys/fs/cgroup/memory/airlock/standby-1".into(),
        )];
        r.headers.push_front(Header::Standby {
            cgroups: standby.clone(),
        });
        stage_a(&mut r).unwrap();
        let joined = pos(&r.ops, &format!("join cgroups {standby:?}"));
        assert_eq!(
            &r.ops[..joined],
            ["setsid", "pdeathsig", "close_range", "read header"]
        );
        assert_eq!(r.ops[joined + 1], "read header");

        let mut r = started(&c);
        for _ in 0..2 {
            r.headers.push_front(Header::Standby {
                cgroups: standby.clone(),
            });
        }
        let e = stage_a(&mut r).unwrap_err();
        assert_eq!(e.step, Step::Config);
        assert!(
            !r.ops
                .iter()
                .any(|o| o.starts_with("unshare") || o == "fork")
        );
    }

    /// An init whose platform is gone stops before it joins anything.
    #[test]
    fn an_orphaned_init_stops_before_the_run() {
        let c = root_run();
        let mut r = started(&c);
        r.parent = Some(1);
        let e = stage_a(&mut r).unwrap_err();
        assert_eq!(e.step, Step::Parent);
        assert_eq!(r.ops.last().map(String::as_str), Some("pdeathsig"));
    }

    /// The order of stage B's: the filesystem (its own order is the plan's
    /// test), the host name and loopback, the open-files limit, the
    /// bounding and ambient capabilities, `no_new_privs` (which Landlock
    /// and seccomp need), Landlock, the remaining capabilities, seccomp
    /// last, and only then the command.
    #[test]
    fn stage_b_confines_itself_in_order_before_the_command() {
        let c = root_run();
        let mut r = started(&c);
        assert_eq!(stage_b_of(&mut r, &c).unwrap(), 0);
        let ops = &r.ops;
        assert_eq!(ops[..3], ["pdeathsig", "non-dumpable", "private /"]);
        let root_done = pos(ops, "chdir /workspace");
        assert_eq!(
            ops[root_done + 1..],
            [
                "sethostname airlock",
                "loopback up",
                format!("RLIMIT_NOFILE {}", crate::pools::OPEN_FILES).as_str(),
                "clear caps Bounding",
                "clear caps Ambient",
                "no_new_privs",
                "landlock /workspace",
                "clear caps Inheritable",
                "clear caps Effective",
                "clear caps Permitted",
                "seccomp",
                "spawn /usr/bin/true in /workspace",
                format!("reap until {COMMAND_PID}").as_str(),
            ]
        );
    }

    /// Stage B stops, before any mount, once stage A is gone.
    #[test]
    fn stage_b_stops_when_stage_a_is_gone() {
        let c = cfg();
        let mut r = host();
        let (alive, a) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        drop(a);
        let filters = seccomp::Filters::compile().unwrap();
        let e = stage_b(&mut r, &c, alive, &plan::Trees::default(), &filters).unwrap_err();
        assert_eq!(e.step, Step::Parent);
        assert_eq!(r.ops, ["pdeathsig", "non-dumpable"]);
    }
}

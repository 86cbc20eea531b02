//! The `namespace` backend: Airlock's own sandbox from Linux namespaces,
//! rootless where the kernel allows user namespaces.
//!
//! The host side ([`NamespaceBackend::spawn`]) creates the run's cgroups and
//! starts `airlock sandbox-init` ([`init`]) — or takes the one
//! [`Backend::prepare`] started ahead, which waits holding nothing — with
//! the non-secret spec as a header on its stdin, followed by the command's
//! stdin bytes. Everything the sandbox boundary consists of is in this
//! directory: [`plan`] (the filesystem), [`init`] (the sequence),
//! [`fs_rules`] (Landlock), [`cgroup`], and [`sys`] (every privileged call
//! of the init behind one trait, so the sequence is unit-tested, and all
//! `unsafe`), but the seccomp filters, which every backend shares
//! ([`crate::seccomp`]).

pub mod cgroup;
pub mod config;
pub mod fs_rules;
pub mod init;
pub mod plan;
#[allow(unsafe_code)]
pub mod sys;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::{Backend, RunPaths, Sandbox, SandboxError, SandboxSpec, Unavailable};
use config::InitConfig;

/// The hidden subcommand of the `airlock` binary that runs [`init::main`].
pub const INIT_SUBCOMMAND: &str = "sandbox-init";

pub struct NamespaceBackend {
    /// The `airlock` binary (it runs `sandbox-init`).
    pub init_exe: PathBuf,
    /// Fail a spawn when cgroups cannot be created (default: when root).
    pub require_limits: bool,
    /// An init started ahead of the next spawn ([`Backend::prepare`]): it
    /// has done what concerns no run and waits on its stdin for a run's
    /// header, holding nothing of any run. At most one; each serves one
    /// run; killed with the backend (and, as every init, with the platform).
    standby: std::sync::Mutex<Option<Standby>>,
    /// The last spawn's limits: standby cgroups are made with them.
    last_limits: std::sync::Mutex<Option<cgroup::Limits>>,
    /// Where cgroups go, read once (`/proc/self/mountinfo`).
    layout: std::sync::OnceLock<Option<cgroup::Layout>>,
}

/// An init started ahead and, on cgroup v1, the standby cgroups it was
/// given to join while it waits.
struct Standby {
    init: tokio::process::Child,
    cgroups: Option<cgroup::RunCgroups>,
}

impl Standby {
    /// Kills the init and removes its cgroups (waiting a little for the
    /// kernel to let it go).
    fn discard(mut self) {
        let _ = self.init.start_kill();
        if let Some(c) = self.cgroups.take() {
            c.remove(Duration::from_millis(500));
        }
    }
}

/// Gives up the standby taken for a spawn, and `cgroups`, taken out of it.
fn give_up(standby: &mut Option<Standby>, cgroups: cgroup::RunCgroups) {
    match standby.take() {
        Some(mut s) => {
            s.cgroups = Some(cgroups);
            s.discard();
        }
        None => cgroups.remove(Duration::from_millis(500)),
    }
}

impl Drop for NamespaceBackend {
    fn drop(&mut self) {
        if let Some(s) = self.standby.get_mut().ok().and_then(Option::take) {
            s.discard();
        }
    }
}

impl NamespaceBackend {
    /// Uses the running executable as the init (the platform runs inside `airlock`).
    pub fn current() -> Result<NamespaceBackend, SandboxError> {
        let exe = std::env::current_exe().map_err(SandboxError::InitBinary)?;
        Ok(NamespaceBackend::with_exe(exe))
    }

    pub fn with_exe(init_exe: PathBuf) -> NamespaceBackend {
        NamespaceBackend {
            init_exe,
            require_limits: rustix::process::geteuid().is_root(),
            standby: std::sync::Mutex::new(None),
            last_limits: std::sync::Mutex::new(None),
            layout: std::sync::OnceLock::new(),
        }
    }

    /// Starts `airlock sandbox-init`, which then waits for its header.
    fn start_init(&self) -> std::io::Result<tokio::process::Child> {
        tokio::process::Command::new(&self.init_exe)
            .arg(INIT_SUBCOMMAND)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
    }

    /// The PID of the init started ahead ([`Backend::prepare`]), if one waits.
    pub fn standby_pid(&self) -> Option<u32> {
        self.standby.lock().ok()?.as_ref()?.init.id()
    }

    /// The directories of the standby cgroups of the init started ahead, if any.
    pub fn standby_cgroups(&self) -> Vec<PathBuf> {
        let Ok(slot) = self.standby.lock() else {
            return vec![];
        };
        slot.as_ref()
            .and_then(|s| s.cgroups.as_ref())
            .map(|c| c.dirs.clone())
            .unwrap_or_default()
    }

    fn layout(&self) -> Option<&cgroup::Layout> {
        self.layout.get_or_init(cgroup::layout).as_ref()
    }

    /// The init started ahead, if there is one and it is still alive.
    fn take_standby(&self) -> Option<Standby> {
        let mut s = self.standby.lock().ok()?.take()?;
        if matches!(s.init.try_wait(), Ok(None)) {
            return Some(s);
        }
        // One that died meanwhile is replaced by a cold start.
        s.discard();
        None
    }

    /// Cgroups for the next run, made before it is known (cgroup v1), with
    /// the last run's limits; `None` where they cannot be.
    fn standby_cgroups_now(&self) -> Option<cgroup::RunCgroups> {
        let layout = self.layout()?;
        let limits = self.last_limits.lock().ok().and_then(|l| *l);
        // Unique on this host: this process's PID, and a count shared by
        // every backend it has.
        static STANDBYS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = STANDBYS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("{}-{n}", std::process::id());
        match cgroup::RunCgroups::create_standby(layout, &tag, limits) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("no standby cgroups: {e}");
                None
            }
        }
    }

    /// The run's cgroups: the standby ones its init has joined, renamed and
    /// given the run's limits, or new ones (then standby ones the init may
    /// still be joining end with them). The bool: whether init is in them already.
    fn run_cgroups(
        &self,
        spec: &SandboxSpec,
        standby: &mut Option<Standby>,
    ) -> Result<Option<(cgroup::RunCgroups, bool)>, SandboxError> {
        let limits = cgroup::Limits {
            memory_mb: spec.memory_mb,
            cpus: spec.cpus,
            pids_max: spec.pids_max,
        };
        if let Ok(mut l) = self.last_limits.lock() {
            *l = Some(limits);
        }
        let mut spare = None;
        if let Some(s) = standby.as_mut()
            && let Some(mut c) = s.cgroups.take()
        {
            let pid = s.init.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
            if c.holds(pid) {
                match c.adopt(&spec.run_id, limits) {
                    Ok(()) => return Ok(Some((c, true))),
                    Err(e) => {
                        // Its init is in them under whatever names they reached.
                        tracing::debug!("standby cgroups not adopted: {e}");
                        give_up(standby, c);
                    }
                }
            } else {
                spare = Some(c);
            }
        }
        let made = match self.layout() {
            Some(layout) => match cgroup::RunCgroups::create(layout, &spec.run_id, limits) {
                Ok(c) => Some(c),
                Err(e) if self.require_limits => {
                    if let Some(c) = spare {
                        give_up(standby, c);
                    }
                    return Err(SandboxError::Limits(e));
                }
                Err(e) => {
                    tracing::warn!(
                        "the namespace sandbox runs WITHOUT memory/CPU/pids limits: {e}"
                    );
                    None
                }
            },
            None if self.require_limits => {
                return Err(SandboxError::NoLimits(cgroup::CgroupError::NoHierarchy));
            }
            None => {
                tracing::warn!(
                    "the namespace sandbox runs WITHOUT memory/CPU/pids limits: {}",
                    cgroup::CgroupError::NoHierarchy
                );
                None
            }
        };
        Ok(match (made, spare) {
            (Some(mut c), Some(s)) => {
                c.absorb(s);
                Some((c, false))
            }
            (Some(c), None) => Some((c, false)),
            // Limits are not required and none could be made: neither is
            // the init that was to join the standby ones.
            (None, Some(c)) => {
                give_up(standby, c);
                None
            }
            (None, None) => None,
        })
    }
}

/// A read-only path of the spec the sandbox could not use.
#[derive(Debug, thiserror::Error)]
pub enum NotShareable {
    #[error("{} cannot be shared with the sandbox: {source}", .path.display())]
    Missing {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} (mode {mode:o}, owner uid {owner}) is not {what} by the sandbox's host uid {uid}{why}: make it so (chmod o+rX), or keep the agent in a directory others may read",
        .path.display()
    )]
    Unreadable {
        path: PathBuf,
        mode: u32,
        owner: u32,
        /// "readable", or "readable and searchable" (a directory).
        what: &'static str,
        uid: u32,
        /// Why the sandbox's uid is not the operator's, when it is not.
        why: &'static str,
    },
}

/// Refuses, before anything starts, a read-only path the sandbox's host uid
/// could not use: with a root platform the sandbox is an unprivileged uid,
/// so the operator's private directories are closed to it (as they should
/// be to an agent), and the run would fail later with a bare EACCES.
pub(crate) fn readable_by(path: &Path, ids: config::HostIds) -> Result<(), NotShareable> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|source| NotShareable::Missing {
        path: path.to_owned(),
        source,
    })?;
    let mode = m.mode();
    let bits = if m.uid() == ids.uid {
        (mode >> 6) & 0o7
    } else if m.gid() == ids.gid {
        (mode >> 3) & 0o7
    } else {
        mode & 0o7
    };
    let need = if m.is_dir() { 0o5 } else { 0o4 };
    if bits & need == need {
        return Ok(());
    }
    Err(NotShareable::Unreadable {
        path: path.to_owned(),
        mode: mode & 0o7777,
        owner: m.uid(),
        what: if m.is_dir() {
            "readable and searchable"
        } else {
            "readable"
        },
        uid: ids.uid,
        why: if ids.switch {
            " (the platform is root, so each sandbox runs as a dedicated unprivileged uid)"
        } else {
            ""
        },
    })
}

/// [`readable_by`] for each shared path and for each file of a shared
/// directory that the command names (`agent.py` of `python3 agent.py`,
/// relative to the directory the agent starts in, or by its absolute
/// path): an agent file the sandbox's uid cannot read is refused before
/// anything starts, naming the file, as its directory would be. Other
/// files of the directory are the agent's business (a private `.env` it
/// never opens does not stop a run). Symbolic links are not followed (the
/// sandbox resolves them in its own view).
pub(crate) fn shared_paths_readable_by(
    ro_paths: &[PathBuf],
    command: &[String],
    ids: config::HostIds,
) -> Result<(), NotShareable> {
    for dir in ro_paths {
        readable_by(dir, ids)?;
        for arg in command {
            let named = dir.join(arg); // an absolute `arg` replaces `dir`
            let inside = named.starts_with(dir)
                && !Path::new(arg)
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir));
            let is_file = std::fs::symlink_metadata(&named).is_ok_and(|m| m.is_file());
            if inside && is_file {
                readable_by(&named, ids)?;
            }
        }
    }
    Ok(())
}

/// Why user namespaces do not work here: the probe's failed step and the
/// host settings that explain it, said in words an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsernsUnavailable {
    failure: sys::ProbeFailure,
    /// `user.max_user_namespaces`.
    max_user_namespaces: Option<String>,
    /// `kernel.unprivileged_userns_clone` is 0 (and the platform not root).
    unprivileged_clone_off: bool,
    /// `kernel.apparmor_restrict_unprivileged_userns` is 1 (and the
    /// platform not root).
    apparmor: bool,
}

impl std::error::Error for UsernsUnavailable {}

impl std::fmt::Display for UsernsUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let errno = std::io::Error::from_raw_os_error(self.failure.errno);
        let apparmor = self.apparmor;
        match (self.failure.step, self.failure.errno) {
            (sys::ProbeStep::Fork, _) => write!(f, "cannot fork a probe process: {errno}"),
            (sys::ProbeStep::Unshare, libc::ENOSPC | libc::EUSERS) => write!(
                f,
                "user namespaces are disabled or exhausted (user.max_user_namespaces = {})",
                self.max_user_namespaces.as_deref().unwrap_or("?")
            ),
            (sys::ProbeStep::Unshare, libc::EINVAL) => f.write_str("this kernel has no user namespaces (CONFIG_USER_NS off)"),
            (sys::ProbeStep::Unshare, libc::EPERM) if self.unprivileged_clone_off => {
                f.write_str("unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)")
            }
            (sys::ProbeStep::Unshare, libc::EPERM) if apparmor => {
                f.write_str("AppArmor forbids unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1): add an AppArmor profile granting `userns` to the airlock binary, or use the docker backend")
            }
            (sys::ProbeStep::Unshare, libc::EPERM) => {
                f.write_str("creating namespaces is forbidden (EPERM): typically a container's seccomp profile (Docker's default blocks unshare/clone of namespaces) or an LSM; run the container with a seccomp profile that allows them, or use the docker backend")
            }
            (sys::ProbeStep::UidMap, _) => write!(f, "the new user namespace's uid/gid map cannot be written: {errno}"),
            (sys::ProbeStep::Mount, libc::EPERM | libc::EACCES) if apparmor => {
                f.write_str("AppArmor lets user namespaces be created but strips their capabilities (kernel.apparmor_restrict_unprivileged_userns = 1): mounting fails; add an AppArmor profile for airlock, or use the docker backend")
            }
            (sys::ProbeStep::Mount, _) => write!(f, "mounting inside a new user+mount namespace fails: {errno} (an LSM or a container policy forbids it)"),
            (sys::ProbeStep::Unshare, _) => write!(f, "unshare of the sandbox namespaces fails: {errno}"),
        }
    }
}

/// Whether user namespaces work here, and why not.
pub fn userns_diagnosis() -> Result<(), UsernsUnavailable> {
    let Some(failure) = sys::probe_userns(sys::sandbox_namespaces()) else {
        return Ok(());
    };
    let sysctl = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let root = rustix::process::geteuid().is_root();
    Err(UsernsUnavailable {
        failure,
        max_user_namespaces: sysctl("/proc/sys/user/max_user_namespaces"),
        unprivileged_clone_off: !root
            && sysctl("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0"),
        apparmor: !root
            && sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref()
                == Some("1"),
    })
}

impl Backend for NamespaceBackend {
    fn name(&self) -> &'static str {
        "namespace"
    }

    /// Its own network namespace with loopback alone, and [`plan`]'s
    /// resolver file and low ports.
    fn transparent_plane(&self) -> bool {
        true
    }

    fn check(&self) -> Result<(), Unavailable> {
        if !cfg!(target_os = "linux") {
            return Err(Unavailable("namespaces are Linux only".into()));
        }
        if !self.init_exe.is_file() {
            return Err(Unavailable(format!(
                "the init binary {} does not exist",
                self.init_exe.display()
            )));
        }
        userns_diagnosis().map_err(|e| Unavailable(e.to_string()))?;
        if !std::path::Path::new("/proc/self/ns/cgroup").exists() {
            return Err(Unavailable("this kernel lacks cgroup namespaces".into()));
        }
        Ok(())
    }

    /// The init's own binary, bound read-only at [`config::EXE_INSIDE`]
    /// (whatever `host_exe` is: the sandbox runs the binary its init is).
    fn runtime_exe(&self, _host_exe: &Path) -> PathBuf {
        PathBuf::from(config::EXE_INSIDE)
    }

    fn paths(&self, run_dir: &Path) -> RunPaths {
        RunPaths {
            sockets_host: run_dir.join("sock"),
            sockets: PathBuf::from(config::SOCKETS_INSIDE),
            workspace: PathBuf::from(config::WORKSPACE_INSIDE),
        }
    }

    /// The sidecar is a host process (beside the sandbox, outside its
    /// limits): it gets cgroups of its own with the limits the docker
    /// backend's sidecar container has ([`crate::SIDECAR_MEMORY_MB`]), so an
    /// agent that makes it grow (connections held open, say) meets a bound.
    /// Without a cgroup hierarchy it runs unbounded with a warning, unless
    /// limits are required (then the run does not start).
    fn spawn_sidecar(&self, spec: &crate::SidecarSpec) -> Result<Sandbox, SandboxError> {
        let limits = cgroup::Limits {
            memory_mb: crate::SIDECAR_MEMORY_MB,
            cpus: 0.0,
            pids_max: crate::SIDECAR_PIDS_MAX,
        };
        let made = match self.layout() {
            Some(layout) => cgroup::RunCgroups::create_sidecar(layout, &spec.run_id, limits),
            None => Err(cgroup::CgroupError::NoHierarchy),
        };
        let cgroups = match made {
            Ok(c) => Some(c),
            Err(e) if self.require_limits => {
                return Err(SandboxError::SidecarLimits(e));
            }
            Err(e) => {
                tracing::warn!("the run's sidecar runs WITHOUT a memory limit: {e}");
                None
            }
        };
        crate::spawn_host_sidecar_in(spec, cgroups)
    }

    fn spawn(&self, spec: &SandboxSpec) -> Result<Sandbox, SandboxError> {
        config::check_run_id(&spec.run_id)?;
        let ids = config::HostIds::for_run(&spec.run_id);
        shared_paths_readable_by(&spec.ro_paths, &spec.command, ids)?;
        readable_by(&self.init_exe, ids)?;
        let me = rustix::process::getpid().as_raw_nonzero().get();
        // Checked before anything is taken or made: a refused spec costs nothing.
        let mut cfg = InitConfig::from_spec(spec, &self.init_exe, me, vec![])?;
        let mut standby = self.take_standby();
        let cgroups = self.run_cgroups(spec, &mut standby)?;
        let cgroups = cgroups.map(|(c, joined)| {
            if !joined {
                cfg.cgroups = c.joins();
            }
            Arc::new(c)
        });
        let child = match standby
            .map(|s| s.init)
            .map_or_else(|| self.start_init(), Ok)
        {
            Ok(c) => c,
            Err(e) => {
                if let Some(c) = &cgroups {
                    c.remove(Duration::from_millis(100));
                }
                return Err(e.into());
            }
        };
        let mut sandbox = Sandbox::in_cgroups(child, cgroups)?;
        sandbox.feed_stdin(cfg.encode(), spec.stdin.clone(), spec.hold_stdin);
        Ok(sandbox)
    }

    fn prepare(&self) {
        let Ok(mut slot) = self.standby.lock() else {
            return;
        };
        if let Some(s) = slot.as_mut()
            && matches!(s.init.try_wait(), Ok(None))
        {
            return;
        }
        if let Some(dead) = slot.take() {
            dead.discard();
        }
        let init = match self.start_init() {
            Ok(init) => init,
            Err(e) => {
                // The spawn will try again, and say why if it fails too.
                tracing::debug!("cannot start a sandbox init ahead: {e}");
                return;
            }
        };
        let standby = Standby {
            cgroups: self.standby_cgroups_now(),
            init,
        };
        if let Some(c) = &standby.cgroups {
            let head = config::Header::Standby { cgroups: c.joins() }.encode();
            // A few hundred bytes into an empty pipe: all or nothing.
            let sent = standby
                .init
                .stdin
                .as_ref()
                .map(|w| rustix::io::write(w, &head).ok() == Some(head.len()))
                .unwrap_or(false);
            if !sent {
                tracing::debug!("cannot hand standby cgroups to the init started ahead");
                standby.discard();
                return;
            }
        }
        *slot = Some(standby);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Another uid than the files' owner (and not in their group): what a
    /// root platform's sandbox is to the operator's files.
    fn stranger() -> config::HostIds {
        let me = rustix::process::geteuid().as_raw();
        let uid = if me == 65_000 { 65_001 } else { 65_000 };
        config::HostIds {
            uid,
            gid: uid,
            switch: true,
        }
    }

    fn agent_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for (name, mode) in [("agent.py", 0o600), ("lib.py", 0o644), (".env", 0o600)] {
            let p = d.path().join(name);
            std::fs::write(&p, "x").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        d
    }

    fn command(args: &[&str]) -> Vec<String> {
        ["/usr/bin/airlock", "runtime", "/usr/bin/python3"]
            .iter()
            .chain(args)
            .map(|s| (*s).to_owned())
            .collect()
    }

    /// The agent's own file, unreadable by the sandbox's uid, is refused
    /// before anything starts, naming it: by a relative name, by its
    /// absolute path, and the fix the message gives works.
    #[test]
    fn an_agent_file_the_sandbox_cannot_read_is_refused_naming_it() {
        let d = agent_dir();
        let dirs = vec![d.path().to_owned()];
        let abs = d.path().join("agent.py").display().to_string();
        for args in [vec!["agent.py"], vec!["-u", abs.as_str()]] {
            let e = shared_paths_readable_by(&dirs, &command(&args), stranger()).unwrap_err();
            assert!(
                matches!(&e, NotShareable::Unreadable { path, what: "readable", .. } if path.ends_with("agent.py")),
                "{e}"
            );
            assert!(e.to_string().contains("chmod o+rX"), "{e}");
        }
        let agent = d.path().join("agent.py");
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o644)).unwrap();
        shared_paths_readable_by(&dirs, &command(&["agent.py"]), stranger()).unwrap();
    }

    /// What the command does not name is not checked (a private `.env`
    /// beside the agent does not stop its run), nor a path outside the
    /// directory, nor an argument that is no file; the directory itself
    /// still is.
    #[test]
    fn only_the_files_the_command_names_are_checked_and_the_directory_always() {
        let d = agent_dir();
        let dirs = vec![d.path().to_owned()];
        for args in [
            vec!["lib.py"],
            vec!["-c", "print(1)"],
            vec!["../agent.py"],
            vec!["/etc/shadow"],
        ] {
            shared_paths_readable_by(&dirs, &command(&args), stranger()).unwrap();
        }
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = shared_paths_readable_by(&dirs, &command(&["lib.py"]), stranger()).unwrap_err();
        assert!(
            matches!(
                &e,
                NotShareable::Unreadable {
                    what: "readable and searchable",
                    ..
                }
            ),
            "{e}"
        );
    }
}

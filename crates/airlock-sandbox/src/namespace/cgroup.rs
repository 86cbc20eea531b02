//! Memory, CPU and PID limits through cgroups: plain files, no crate.
//!
//! Layout: `<mount>/airlock/airlock-<runId>` in the cgroup v2 hierarchy when
//! it offers the memory and pids controllers, else in each cgroup v1
//! hierarchy (memory, pids, cpu). Sandbox init joins them itself, while it is
//! still single-threaded and before it unshares anything ([`join_self`]), so
//! every process of the run is in them from its first instruction.
//!
//! How it joins matters for start time. Moving a *process* (a PID written to
//! `cgroup.procs`, or any PID written to v1 `tasks`) write-locks the kernel's
//! global `cgroup_threadgroup_rwsem`, a percpu rwsem whose writer waits for
//! an RCU grace period unless another writer ran in the last few ms: after
//! ≥ 50 ms without a migration on the host that is 5–25 ms (measured on
//! 6.18, v1 and v2 alike), back to back 0.02–0.2 ms. Moving the *calling
//! thread* (`0` written to v1 `tasks`) takes no such lock (the thread is
//! `current`: it cannot exit or exec under the kernel's hands): 0.1 ms,
//! idle or not. For a single-threaded process, moving its one thread is
//! moving the process, which [`join_self`] checks. cgroup v2 moves threads
//! only inside threaded subtrees (which the memory controller is not), so
//! there init still writes its PID to `cgroup.procs`.
//!
//! Making a run's cgroups costs more than joining them (0.4–0.6 ms here: a
//! memory cgroup's `mkdir` and its limit's first write are the dearest), so
//! on cgroup v1 they are made ahead with the init started ahead
//! ([`RunCgroups::create_standby`], `airlock-standby-<tag>`), which joins
//! them while it waits; the spawn that takes it renames them to its run's
//! ([`RunCgroups::adopt`], a rename in the same parent: ~10 µs) and writes
//! only the limits that differ. cgroup v2 refuses renames: there a run's
//! cgroups are made when it spawns.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub const PARENT: &str = "airlock";
pub const PREFIX: &str = "airlock-";
/// After [`PREFIX`]: cgroups made for an init started ahead ([`RunCgroups::create_standby`]).
pub const STANDBY: &str = "standby-";
/// After `airlock-<runId>`: the cgroups of the run's host sidecar
/// ([`RunCgroups::create_sidecar`]).
pub const SIDECAR_SUFFIX: &str = "-sidecar";

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no writable cgroup hierarchy with the memory and pids controllers (cgroup v2 with them enabled, or v1 memory+pids)"
    )]
    NoHierarchy,
    #[error("cgroup {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "the process joining its cgroups has {0} threads: moving only the calling thread would leave the others outside the limits"
    )]
    NotSingleThreaded(usize),
    #[error("only cgroup v1 standby cgroups can be given to a run")]
    NotStandby,
    #[error(
        "{}: {source} (rootless without a delegated cgroup tree: memory/CPU/pids limits are skipped)",
        .path.display()
    )]
    ParentNotCreatable { path: PathBuf, source: io::Error },
    #[error(
        "{} is not writable (rootless without a delegated cgroup tree: limits are skipped)",
        .path.display()
    )]
    ParentNotWritable { path: PathBuf },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// The cgroup2 mount point.
    V2(PathBuf),
    /// One mount point per controller: memory, pids, cpu (if mounted).
    V1(Vec<(String, PathBuf)>),
}

struct MountEntry {
    path: PathBuf,
    fstype: String,
    options: Vec<String>,
}

fn mounts() -> Vec<MountEntry> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            // id parent major:minor root mountpoint options ... - fstype source superoptions
            let (left, right) = l.split_once(" - ")?;
            let mountpoint = left.split(' ').nth(4)?;
            let mut r = right.split(' ');
            let fstype = r.next()?.to_string();
            let _source = r.next();
            let options = r
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::to_string)
                .collect();
            Some(MountEntry {
                path: PathBuf::from(mountpoint.replace("\\040", " ")),
                fstype,
                options,
            })
        })
        .collect()
}

/// Where limits can go on this host, if anywhere.
pub fn layout() -> Option<Layout> {
    let ms = mounts();
    if let Some(v2) = ms.iter().find(|m| m.fstype == "cgroup2") {
        let ctrl = fs::read_to_string(v2.path.join("cgroup.controllers")).unwrap_or_default();
        let ctrl: Vec<&str> = ctrl.split_whitespace().collect();
        if ctrl.contains(&"memory") && ctrl.contains(&"pids") {
            return Some(Layout::V2(v2.path.clone()));
        }
    }
    let mut v1 = vec![];
    for c in ["memory", "pids", "cpu"] {
        if let Some(m) = ms
            .iter()
            .find(|m| m.fstype == "cgroup" && m.options.iter().any(|o| o == c))
        {
            v1.push((c.to_string(), m.path.clone()));
        }
    }
    let has = |c: &str| v1.iter().any(|(n, _)| n == c);
    if has("memory") && has("pids") {
        Some(Layout::V1(v1))
    } else {
        None
    }
}

impl Layout {
    /// The `airlock` parent directories (one per hierarchy).
    pub fn parents(&self) -> Vec<PathBuf> {
        match self {
            Layout::V2(m) => vec![m.join(PARENT)],
            Layout::V1(v) => v.iter().map(|(_, m)| m.join(PARENT)).collect(),
        }
    }
}

/// A run's limits; 0 is no limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids_max: u64,
}

impl Limits {
    /// What a new cgroup has.
    pub const NONE: Limits = Limits {
        memory_mb: 0,
        cpus: 0.0,
        pids_max: 0,
    };

    fn memory_bytes(self) -> u64 {
        self.memory_mb.saturating_mul(1024 * 1024)
    }

    /// CFS quota per 100 ms period, in µs.
    fn quota(self) -> Option<u64> {
        (self.cpus > 0.0).then(|| crate::whole(self.cpus * 100_000.0, u64::MAX).max(1000))
    }
}

/// The cgroups of one run.
#[derive(Debug, Clone)]
pub struct RunCgroups {
    pub dirs: Vec<PathBuf>,
    /// cgroup v1: the controller of each of `dirs`.
    ctrls: Vec<String>,
    /// Directories ended with these ([`RunCgroups::absorb`]).
    spare: Vec<PathBuf>,
    /// The limits written to them (`None`: none yet).
    limits: Option<Limits>,
    v2: bool,
}

/// Sets a v1 hierarchy's limits of a run cgroup that has `was`, writing
/// only what differs (a value, or "no limit" for 0). The swap cap
/// (`memory.memsw.limit_in_bytes`, absent without swap accounting) may
/// never be below the memory limit, so it is lifted before a change and
/// set to the new limit after.
fn set_v1_limits(ctrl: &str, dir: &Path, new: Limits, was: Limits) -> Result<(), CgroupError> {
    match ctrl {
        "memory" if new.memory_mb != was.memory_mb => {
            let memsw = dir.join("memory.memsw.limit_in_bytes");
            if was.memory_mb > 0 {
                let _ = fs::write(&memsw, "-1");
            }
            if new.memory_mb > 0 {
                let bytes = new.memory_bytes().to_string();
                write(&dir.join("memory.limit_in_bytes"), &bytes)?;
                // No swap beyond the limit.
                let _ = fs::write(&memsw, bytes);
            } else {
                write(&dir.join("memory.limit_in_bytes"), "-1")?;
            }
        }
        "pids" if new.pids_max != was.pids_max => {
            let v = if new.pids_max > 0 {
                new.pids_max.to_string()
            } else {
                "max".into()
            };
            write(&dir.join("pids.max"), &v)?
        }
        "cpu" if new.quota() != was.quota() => match new.quota() {
            Some(q) => {
                if was.quota().is_none() {
                    write(&dir.join("cpu.cfs_period_us"), "100000")?;
                }
                write(&dir.join("cpu.cfs_quota_us"), &q.to_string())?;
            }
            None => write(&dir.join("cpu.cfs_quota_us"), "-1")?,
        },
        _ => {}
    }
    Ok(())
}

/// cgroup v1: caps the socket buffers of the memory cgroup `dir` at
/// [`crate::pools::SOCKET_BUFFER_BYTES`] (v1 keeps them out of the memory
/// limit, in the host's one `tcp_mem` pool). Before anything of the
/// sandbox has a socket: sockets made before it are not counted. A kernel
/// without the file (no socket accounting) has nothing to cap.
pub fn cap_socket_buffers(dir: &Path) -> Result<(), CgroupError> {
    let path = dir.join("memory.kmem.tcp.limit_in_bytes");
    match fs::write(&path, crate::pools::SOCKET_BUFFER_BYTES.to_string()) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r.map_err(io_at(&path)),
    }
}

/// cgroup v1: the memory cgroup of process `pid` (a container's init, as
/// this host sees it), if its path names `container` (so a process of
/// another host's daemon is never taken for it). `None` on cgroup v2, or
/// where the process is not found.
pub fn memory_cgroup_of(pid: i32, container: &str) -> Option<PathBuf> {
    let Some(Layout::V1(ctrls)) = layout() else {
        return None;
    };
    let mount = ctrls.iter().find(|(c, _)| c == "memory").map(|(_, m)| m)?;
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        ctrls.split(',').any(|c| c == "memory").then_some(path)
    })?;
    if !rel.contains(container) {
        return None;
    }
    Some(mount.join(rel.trim_start_matches('/')))
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(io_at(path))
}

fn enable_v2_controllers(dir: &Path) -> Result<(), CgroupError> {
    let avail = fs::read_to_string(dir.join("cgroup.controllers")).map_err(io_at(dir))?;
    let want: Vec<String> = avail
        .split_whitespace()
        .filter(|c| ["memory", "pids", "cpu"].contains(c))
        .map(|c| format!("+{c}"))
        .collect();
    write(&dir.join("cgroup.subtree_control"), &want.join(" "))
}

impl RunCgroups {
    pub fn create(
        layout: &Layout,
        run_id: &str,
        limits: Limits,
    ) -> Result<RunCgroups, CgroupError> {
        RunCgroups::create_named(layout, &format!("{PREFIX}{run_id}"), Some(limits), false)
    }

    /// The cgroups of run `run_id`'s sidecar when it is a host process
    /// (`airlock-<runId>-sidecar`): its memory and processes bounded as the
    /// docker backend's sidecar container's are. Made empty; the sidecar is
    /// moved in by [`RunCgroups::enter`] once started.
    pub fn create_sidecar(
        layout: &Layout,
        run_id: &str,
        limits: Limits,
    ) -> Result<RunCgroups, CgroupError> {
        RunCgroups::create_named(
            layout,
            &format!("{PREFIX}{run_id}{SIDECAR_SUFFIX}"),
            Some(limits),
            false,
        )
    }

    /// Moves process `pid`, every thread of it, into each of these cgroups
    /// (its PID to `cgroup.procs`). What it allocated before stays charged
    /// where it was; what it allocates from now on is charged here.
    pub fn enter(&self, pid: u32) -> Result<(), CgroupError> {
        for d in &self.dirs {
            write(&d.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// cgroup v1: cgroups made before their run is known, named
    /// `airlock-standby-<tag>`, with `limits` when given (the previous
    /// run's, most often the next one's too). An init started ahead joins
    /// them while it waits, off every run's critical path, and
    /// [`RunCgroups::adopt`] gives them to the run that takes it. `None` on
    /// cgroup v2, whose directories cannot be renamed.
    pub fn create_standby(
        layout: &Layout,
        tag: &str,
        limits: Option<Limits>,
    ) -> Result<Option<RunCgroups>, CgroupError> {
        match layout {
            Layout::V2(_) => Ok(None),
            Layout::V1(_) => {
                RunCgroups::create_named(layout, &format!("{PREFIX}{STANDBY}{tag}"), limits, true)
                    .map(Some)
            }
        }
    }

    fn create_named(
        layout: &Layout,
        name: &str,
        limits: Option<Limits>,
        standby: bool,
    ) -> Result<RunCgroups, CgroupError> {
        let mut made = RunCgroups {
            dirs: vec![],
            ctrls: vec![],
            spare: vec![],
            limits,
            v2: matches!(layout, Layout::V2(_)),
        };
        let r = (|| {
            match layout {
                Layout::V2(root) => {
                    let parent = root.join(PARENT);
                    fs::create_dir_all(&parent).map_err(io_at(&parent))?;
                    enable_v2_controllers(root)?;
                    enable_v2_controllers(&parent)?;
                    let dir = parent.join(name);
                    fs::create_dir(&dir).map_err(io_at(&dir))?;
                    made.dirs.push(dir.clone());
                    let Some(limits) = limits else {
                        return Ok(());
                    };
                    if limits.memory_mb > 0 {
                        write(&dir.join("memory.max"), &limits.memory_bytes().to_string())?;
                        let _ = fs::write(dir.join("memory.swap.max"), "0");
                    }
                    if limits.pids_max > 0 {
                        write(&dir.join("pids.max"), &limits.pids_max.to_string())?;
                    }
                    if let Some(q) = limits.quota().filter(|_| dir.join("cpu.max").exists()) {
                        write(&dir.join("cpu.max"), &format!("{q} 100000"))?;
                    }
                }
                Layout::V1(ctrls) => {
                    for (ctrl, mount) in ctrls {
                        let parent = mount.join(PARENT);
                        fs::create_dir_all(&parent).map_err(io_at(&parent))?;
                        let dir = parent.join(name);
                        match fs::create_dir(&dir) {
                            // A run's may exist (its id given twice); a standby's is new.
                            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !standby => {}
                            r => r.map_err(io_at(&dir))?,
                        }
                        made.dirs.push(dir.clone());
                        made.ctrls.push(ctrl.clone());
                        if ctrl == "memory" {
                            cap_socket_buffers(&dir)?;
                        }
                        if let Some(limits) = limits {
                            set_v1_limits(ctrl, &dir, limits, Limits::NONE)?;
                        }
                    }
                }
            }
            Ok(())
        })();
        match r {
            Ok(()) => Ok(made),
            Err(e) => {
                made.remove(Duration::from_millis(100));
                Err(e)
            }
        }
    }

    /// Gives standby cgroups ([`RunCgroups::create_standby`]) to the run
    /// `run_id`: renames them `airlock-<runId>` and sets its limits, writing
    /// only those that differ from what they have, all before the run's header
    /// leaves. On an error the directories keep the names they reached
    /// (in `dirs`), for [`RunCgroups::remove`].
    pub fn adopt(&mut self, run_id: &str, limits: Limits) -> Result<(), CgroupError> {
        if self.v2 || self.ctrls.len() != self.dirs.len() {
            return Err(CgroupError::NotStandby);
        }
        let name = format!("{PREFIX}{run_id}");
        for i in 0..self.dirs.len() {
            let to = match self.dirs[i].parent() {
                Some(p) => p.join(&name),
                None => return Err(CgroupError::NotStandby),
            };
            fs::rename(&self.dirs[i], &to).map_err(io_at(&self.dirs[i]))?;
            self.dirs[i] = to;
        }
        let was = self.limits.unwrap_or(Limits::NONE);
        for (ctrl, dir) in self.ctrls.iter().zip(&self.dirs) {
            set_v1_limits(ctrl, dir, limits, was)?;
        }
        self.limits = Some(limits);
        Ok(())
    }

    /// Whether the single-threaded process `pid` has joined these cgroups:
    /// its thread is in the last one's `tasks` ([`join_self`] joins them in order).
    pub fn holds(&self, pid: i32) -> bool {
        let Some(last) = self.dirs.last() else {
            return false;
        };
        let file = if self.v2 { "cgroup.procs" } else { "tasks" };
        let pid = pid.to_string();
        fs::read_to_string(last.join(file))
            .map(|t| t.lines().any(|l| l.trim() == pid))
            .unwrap_or(false)
    }

    /// Makes `other`'s directories part of these ones' end: killed with
    /// them and removed after them (standby cgroups an init may still be
    /// joining on its way to its run's).
    pub fn absorb(&mut self, mut other: RunCgroups) {
        self.spare.append(&mut other.dirs);
        self.spare.append(&mut other.spare);
    }

    /// The `cgroup.procs` files (one per hierarchy).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// How sandbox init enters each of these cgroups ([`join_self`]).
    pub fn joins(&self) -> Vec<Join> {
        self.dirs
            .iter()
            .map(|d| {
                if self.v2 {
                    Join::Process(d.clone())
                } else {
                    Join::Thread(d.clone())
                }
            })
            .collect()
    }

    pub fn pids(&self) -> Vec<i32> {
        let mut out: Vec<i32> = self
            .dirs
            .iter()
            .chain(&self.spare)
            .flat_map(|d| pids_in(d))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// SIGKILLs every process of the run (cgroup.kill on v2, else one by one
    /// until the cgroup is empty; PIDs cannot escape a cgroup they cannot
    /// write, and a pids limit bounds the work).
    pub fn kill(&self) {
        if self.v2 {
            for d in &self.dirs {
                let _ = fs::write(d.join("cgroup.kill"), "1");
            }
        }
        for _ in 0..64 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for p in pids {
                if let Some(pid) = rustix::process::Pid::from_raw(p) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
    }

    /// Kills what is left and removes the directories, waiting up to
    /// `patience` for the kernel to let go of exiting processes.
    pub fn remove(&self, patience: Duration) {
        let deadline = Instant::now() + patience;
        for d in self.dirs.iter().chain(&self.spare) {
            loop {
                self.kill();
                match fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => {
                        tracing::warn!(cgroup = %d.display(), "could not remove the run's cgroup: {e}");
                        break;
                    }
                }
            }
        }
    }
}

/// One of a run's cgroups, and how a process enters it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Join {
    /// A cgroup v1 directory: `0` (the calling thread) to its `tasks`,
    /// which skips the global lock and its grace period. Falls back to the
    /// PID in `cgroup.procs` where `tasks` may not be written (a delegated
    /// tree that handed out `cgroup.procs` only).
    Thread(PathBuf),
    /// A cgroup v2 directory: the PID to its `cgroup.procs`.
    Process(PathBuf),
}

/// Threads of the calling process (from `/proc/self/task`).
pub fn own_threads() -> Result<usize, CgroupError> {
    let task = Path::new("/proc/self/task");
    Ok(fs::read_dir(task).map_err(io_at(task))?.count())
}

/// Moves the calling process into every cgroup of `joins`. It must be
/// single-threaded when any of them is a [`Join::Thread`] (checked): only
/// the calling thread moves, and the threads and processes it starts later
/// are born inside.
pub fn join_self(joins: &[Join]) -> Result<(), CgroupError> {
    if joins.iter().any(|j| matches!(j, Join::Thread(_))) {
        let n = own_threads()?;
        if n != 1 {
            return Err(CgroupError::NotSingleThreaded(n));
        }
    }
    let pid = rustix::process::getpid().as_raw_nonzero().get().to_string();
    for j in joins {
        match j {
            Join::Thread(dir) => {
                let tasks = dir.join("tasks");
                match fs::write(&tasks, "0") {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                        write(&dir.join("cgroup.procs"), &pid)?
                    }
                    Err(e) => return Err(io_at(&tasks)(e)),
                }
            }
            Join::Process(dir) => write(&dir.join("cgroup.procs"), &pid)?,
        }
    }
    Ok(())
}

fn pids_in(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A run's cgroups left on this host (`airlock-<runId>` under the
/// `airlock` parents, one per hierarchy).
#[derive(Debug, Clone, PartialEq)]
pub struct Leftover {
    pub name: String,
    pub dirs: Vec<PathBuf>,
    /// Whether a process still lives in any of them.
    pub live: bool,
}

pub fn leftovers() -> Vec<Leftover> {
    let Some(layout) = layout() else {
        return vec![];
    };
    let mut out: Vec<Leftover> = vec![];
    for parent in layout.parents() {
        let Ok(rd) = fs::read_dir(&parent) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(PREFIX) || !e.path().is_dir() {
                continue;
            }
            let live = !pids_in(&e.path()).is_empty();
            match out.iter_mut().find(|l| l.name == name) {
                Some(l) => {
                    l.dirs.push(e.path());
                    l.live |= live;
                }
                None => out.push(Leftover {
                    name,
                    dirs: vec![e.path()],
                    live,
                }),
            }
        }
    }
    out
}

/// Removes the run cgroups a crashed run left behind, only those whose
/// processes are all gone. Returns what was removed. Call it at boot,
/// before any run starts: a run's cgroup is empty for an instant between
/// its creation and init joining it.
pub fn reclaim() -> Vec<PathBuf> {
    reclaim_matching(|_| true)
}

/// [`reclaim`] restricted to the runs whose cgroup name (`airlock-<runId>`) passes `select`.
pub fn reclaim_matching(select: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    leftovers()
        .into_iter()
        .filter(|l| !l.live && select(&l.name))
        .flat_map(|l| l.dirs)
        .filter(|d| fs::remove_dir(d).is_ok())
        .collect()
}

/// Removes the standby cgroups ([`RunCgroups::create_standby`]) of
/// platforms that are gone (`airlock-standby-<pid>-<n>` with no process
/// `<pid>`): they belong to no run, so no run's reclaim finds them. One whose
/// init somehow lives is kept (the kernel refuses to remove a populated
/// cgroup). Returns what was removed.
pub fn reclaim_standby() -> Vec<PathBuf> {
    let Some(layout) = layout() else {
        return vec![];
    };
    let mut removed = vec![];
    for parent in layout.parents() {
        let Ok(rd) = fs::read_dir(&parent) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(tag) = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .and_then(|n| n.strip_prefix(STANDBY))
            else {
                continue;
            };
            let Some(pid) = tag
                .split_once('-')
                .and_then(|(pid, _)| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() && fs::remove_dir(e.path()).is_ok() {
                removed.push(e.path());
            }
        }
    }
    removed
}

/// Whether run cgroups can be created here, and why not.
pub fn probe() -> Result<Layout, CgroupError> {
    let layout = layout().ok_or(CgroupError::NoHierarchy)?;
    for parent in layout.parents() {
        if let Err(source) = fs::create_dir_all(&parent) {
            return Err(CgroupError::ParentNotCreatable {
                path: parent,
                source,
            });
        }
        if rustix::fs::access(&parent, rustix::fs::Access::WRITE_OK).is_err() {
            return Err(CgroupError::ParentNotWritable { path: parent });
        }
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_join_refuses_a_multi_threaded_process_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        // The harness's main thread and this test's (at least).
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let extra = std::thread::spawn(move || rx.recv());
        let e = join_self(&[Join::Thread(dir.path().to_path_buf())]).unwrap_err();
        assert!(
            matches!(e, CgroupError::NotSingleThreaded(n) if n >= 2),
            "{e}"
        );
        assert!(!dir.path().join("tasks").exists());
        assert!(!dir.path().join("cgroup.procs").exists());
        drop(tx);
        let _ = extra.join();
    }

    #[test]
    fn v1_cgroups_are_joined_by_thread_and_v2_by_process() {
        let v1 = RunCgroups {
            dirs: vec!["/m/airlock/airlock-r".into(), "/p/airlock/airlock-r".into()],
            ctrls: vec!["memory".into(), "pids".into()],
            spare: vec![],
            limits: None,
            v2: false,
        };
        assert_eq!(
            v1.joins(),
            vec![
                Join::Thread("/m/airlock/airlock-r".into()),
                Join::Thread("/p/airlock/airlock-r".into())
            ]
        );
        let v2 = RunCgroups {
            dirs: vec!["/u/airlock/airlock-r".into()],
            ctrls: vec![],
            spare: vec![],
            limits: None,
            v2: true,
        };
        assert_eq!(
            v2.joins(),
            vec![Join::Process("/u/airlock/airlock-r".into())]
        );
    }
}

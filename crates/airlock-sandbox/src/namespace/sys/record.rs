//! The recording double of [`Sys`]: performs nothing, writes each call down
//! as one line (`"unshare …"`, `"bind /a /b"`), so the init's sequence and
//! the filesystem plan are unit-tested without root. What it answers is
//! set up front: the host's paths under `/oldroot` ([`Recorder::host`]),
//! the headers on stdin, the parent's PID. (Model: youki's
//! `syscall/test.rs`.)

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::super::cgroup::{CgroupError, Join};
use super::super::config::{ConfigError, Header};
use super::super::fs_rules::LandlockError;
use super::super::plan::PROC_MASKED_FILES;
use super::{CapSet, Command, Forked, Kind, Sys};
use crate::seccomp::{Filters, SeccompError};

/// The PIDs the double hands out: the forked stage B, and the command.
pub const STAGE_B_PID: i32 = 2;
pub const COMMAND_PID: i32 = 3;

#[derive(Default)]
pub struct Recorder {
    /// Every call, in order.
    pub ops: Vec<String>,
    /// What exists on the host (seen under `/oldroot` once pivoted).
    pub host: BTreeMap<PathBuf, Kind>,
    pub links: BTreeMap<PathBuf, PathBuf>,
    /// What [`Sys::list`] finds in a directory.
    pub dirs: BTreeMap<PathBuf, Vec<String>>,
    /// What stdin holds, header by header.
    pub headers: VecDeque<Header>,
    /// `getppid(2)`.
    pub parent: Option<i32>,
    /// The effective uid and gid, as the last `set_uid`/`set_gid` left them.
    pub ids: (u32, u32),
}

impl Recorder {
    fn op(&mut self, line: String) -> io::Result<()> {
        self.ops.push(line);
        Ok(())
    }
}

impl Sys for Recorder {
    fn new_session(&mut self) -> io::Result<()> {
        self.op("setsid".into())
    }
    fn die_with_parent(&mut self) -> io::Result<()> {
        self.op("pdeathsig".into())
    }
    fn parent(&self) -> Option<i32> {
        self.parent
    }
    fn cloexec_from_3(&mut self) -> io::Result<()> {
        self.op("close_range".into())
    }
    fn read_header(&mut self) -> Result<Header, ConfigError> {
        self.ops.push("read header".into());
        self.headers
            .pop_front()
            .ok_or_else(|| ConfigError::HeaderLength(io::ErrorKind::UnexpectedEof.into()))
    }
    fn join_cgroups(&mut self, joins: &[Join]) -> Result<(), CgroupError> {
        self.ops.push(format!("join cgroups {joins:?}"));
        Ok(())
    }
    fn drop_groups(&mut self) -> io::Result<()> {
        self.op("setgroups none".into())
    }
    fn set_gid(&mut self, gid: u32) -> io::Result<()> {
        self.ids.1 = gid;
        self.op(format!("setresgid {gid}"))
    }
    fn set_uid(&mut self, uid: u32) -> io::Result<()> {
        self.ids.0 = uid;
        self.op(format!("setresuid {uid}"))
    }
    fn effective_ids(&self) -> (u32, u32) {
        self.ids
    }
    fn set_dumpable(&mut self, dumpable: bool) -> io::Result<()> {
        self.op(if dumpable { "dumpable" } else { "non-dumpable" }.into())
    }
    fn unshare(&mut self, flags: rustix::thread::UnshareFlags) -> io::Result<()> {
        self.op(format!("unshare {:#x}", flags.bits()))
    }
    fn write(&mut self, path: &Path, data: &str) -> io::Result<()> {
        self.op(format!("write {} {data}", path.display()))
    }
    fn fork(&mut self) -> io::Result<Forked> {
        self.ops.push("fork".into());
        rustix::process::Pid::from_raw(STAGE_B_PID)
            .map(Forked::Parent)
            .ok_or_else(|| io::Error::other("pid 0"))
    }
    fn wait_child(&mut self, child: rustix::process::Pid) -> io::Result<i32> {
        self.op(format!("wait {}", child.as_raw_nonzero()))?;
        Ok(0)
    }
    fn set_hostname(&mut self, name: &str) -> io::Result<()> {
        self.op(format!("sethostname {name}"))
    }
    fn loopback_up(&mut self) -> io::Result<()> {
        self.op("loopback up".into())
    }
    fn limit_open_files(&mut self, n: u64) -> io::Result<()> {
        self.op(format!("RLIMIT_NOFILE {n}"))
    }
    fn clear_caps(&mut self, set: CapSet) -> io::Result<()> {
        self.op(format!("clear caps {set:?}"))
    }
    fn no_new_privs(&mut self) -> io::Result<()> {
        self.op("no_new_privs".into())
    }
    fn restrict_fs(&mut self, workspace: &Path) -> Result<(), LandlockError> {
        self.ops.push(format!("landlock {}", workspace.display()));
        Ok(())
    }
    fn install_seccomp(&mut self, _: &Filters) -> Result<(), SeccompError> {
        self.ops.push("seccomp".into());
        Ok(())
    }
    fn spawn(&mut self, command: &Command<'_>) -> io::Result<i32> {
        self.op(format!(
            "spawn {} in {}",
            command.program,
            command.cwd.display()
        ))?;
        Ok(COMMAND_PID)
    }
    fn reap_until(&mut self, main: i32) -> io::Result<i32> {
        self.op(format!("reap until {main}"))?;
        Ok(0)
    }

    fn make_private(&mut self, t: &Path) -> io::Result<()> {
        self.op(format!("private {}", t.display()))
    }
    fn mount_tmpfs(
        &mut self,
        t: &Path,
        size: u64,
        inodes: Option<u64>,
        mode: u32,
        attrs: u64,
    ) -> io::Result<()> {
        let inodes = inodes.map(|n| format!(" {n}i")).unwrap_or_default();
        self.op(format!(
            "tmpfs {} {size}m{inodes} {mode:o} {attrs:x}",
            t.display()
        ))
    }
    fn bind(&mut self, s: &Path, t: &Path) -> io::Result<()> {
        self.op(format!("bind {} {}", s.display(), t.display()))
    }
    fn set_attrs(&mut self, t: &Path, attrs: u64, rec: bool) -> io::Result<()> {
        self.op(format!(
            "attrs {} {attrs:x}{}",
            t.display(),
            if rec { " rec" } else { "" }
        ))
    }
    fn mount_proc(&mut self, t: &Path) -> io::Result<()> {
        self.op(format!("proc {}", t.display()))
    }
    fn pivot_root(&mut self, n: &Path, o: &Path) -> io::Result<()> {
        self.op(format!("pivot {} {}", n.display(), o.display()))
    }
    fn detach(&mut self, t: &Path) -> io::Result<()> {
        self.op(format!("detach {}", t.display()))
    }
    fn mkdir_all(&mut self, p: &Path) -> io::Result<()> {
        self.op(format!("mkdir {}", p.display()))
    }
    fn rmdir(&mut self, p: &Path) -> io::Result<()> {
        self.op(format!("rmdir {}", p.display()))
    }
    fn touch(&mut self, p: &Path) -> io::Result<()> {
        self.op(format!("touch {}", p.display()))
    }
    fn symlink(&mut self, t: &Path, l: &Path) -> io::Result<()> {
        self.op(format!("symlink {} {}", l.display(), t.display()))
    }
    fn chdir(&mut self, p: &Path) -> io::Result<()> {
        self.op(format!("chdir {}", p.display()))
    }
    fn chmod(&mut self, p: &Path, mode: u32) -> io::Result<()> {
        self.op(format!("chmod {} {mode:o}", p.display()))
    }
    fn clone_tree(&self, _: &Path) -> io::Result<OwnedFd> {
        Ok(std::fs::File::open("/dev/null")?.into())
    }
    fn attach(&mut self, _: &OwnedFd, t: &Path) -> io::Result<()> {
        self.op(format!("attach {}", t.display()))
    }
    fn kind(&self, p: &Path) -> Kind {
        if p.starts_with("/proc") {
            let s = p.to_str().unwrap_or_default();
            return if PROC_MASKED_FILES.contains(&s) || s == "/proc/sysrq-trigger" {
                Kind::File
            } else {
                Kind::Dir
            };
        }
        if p.starts_with("/.rw") {
            return Kind::Dir;
        }
        self.host.get(p).copied().unwrap_or(Kind::Missing)
    }
    fn read_link(&self, p: &Path) -> io::Result<PathBuf> {
        self.links
            .get(p)
            .cloned()
            .ok_or_else(|| io::ErrorKind::NotFound.into())
    }
    fn list(&self, p: &Path) -> Vec<String> {
        self.dirs.get(p).cloned().unwrap_or_default()
    }
}

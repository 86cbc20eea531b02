//! The ONE module with `unsafe` code and raw syscalls of the sandbox.
//!
//! [`Sys`] is every privileged call `sandbox-init` makes, in the order
//! [`super::init`] and the filesystem plan ([`super::plan`]) issue them;
//! [`Real`] performs them, and a recorder ([`record`], tests only) replays
//! the whole sequence without root, so its order is unit-tested. The free
//! functions below are the process-level calls of the other backends and
//! of `airlock doctor` that no safe wrapper covers (the user-namespace
//! probe, a new session at spawn, the container init's signal mask). Each
//! `unsafe` block says why it is sound. (The isolation probe's attack
//! attempts live in the test-only `airlock-probe` crate.)

#[cfg(test)]
pub mod record;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::process::{Signal, WaitOptions};

use super::cgroup::{self, CgroupError};
use super::config::{ConfigError, Header};
use super::fs_rules::{self, LandlockError};
use crate::seccomp::{Filters, SeccompError};

/// Mount attributes for [`Sys::set_attrs`] (linux/mount.h `MOUNT_ATTR_*`).
pub const ATTR_RDONLY: u64 = 0x1;
pub const ATTR_NOSUID: u64 = 0x2;
pub const ATTR_NODEV: u64 = 0x4;
pub const ATTR_NOEXEC: u64 = 0x8;

/// The capability sets the init clears ([`Sys::clear_caps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapSet {
    Bounding,
    Ambient,
    Inheritable,
    Effective,
    Permitted,
}

/// The command the init starts last ([`Sys::spawn`]).
pub struct Command<'a> {
    pub program: &'a str,
    pub args: &'a [String],
    pub env: &'a [(String, String)],
    pub cwd: &'a Path,
}

/// Every privileged call of the sandbox's setup: the process steps of
/// [`super::init`] (stage A in the host's namespaces, stage B as PID 1 of
/// the new ones), then the filesystem steps of [`super::plan`].
pub trait Sys {
    // --- the process (stage A, then stage B) ---

    /// `setsid(2)`: a new session, away from the operator's terminal.
    fn new_session(&mut self) -> io::Result<()>;
    /// `PR_SET_PDEATHSIG` to SIGKILL: dies with whoever started it.
    fn die_with_parent(&mut self) -> io::Result<()>;
    /// `getppid(2)`; `None` when the parent is outside the PID namespace.
    fn parent(&self) -> Option<i32>;
    /// Marks every descriptor from 3 on close-on-exec (`close_range(2)`).
    fn cloexec_from_3(&mut self) -> io::Result<()>;
    /// The next header on stdin, read without buffering (the bytes after
    /// it are the command's).
    fn read_header(&mut self) -> Result<Header, ConfigError>;
    /// Moves this process into the cgroups ([`cgroup::join_self`]).
    fn join_cgroups(&mut self, joins: &[cgroup::Join]) -> Result<(), CgroupError>;
    /// No supplementary group (`setgroups(2)` of none).
    fn drop_groups(&mut self) -> io::Result<()>;
    /// `setresgid(2)` of the calling thread (the init is single-threaded).
    fn set_gid(&mut self, gid: u32) -> io::Result<()>;
    /// `setresuid(2)` of the calling thread.
    fn set_uid(&mut self, uid: u32) -> io::Result<()>;
    /// The effective uid and gid.
    fn effective_ids(&self) -> (u32, u32);
    /// `PR_SET_DUMPABLE`.
    fn set_dumpable(&mut self, dumpable: bool) -> io::Result<()>;
    /// `unshare(2)` of namespaces only.
    fn unshare(&mut self, flags: rustix::thread::UnshareFlags) -> io::Result<()>;
    /// Writes a file of the process's own (`/proc/self/uid_map`, …).
    fn write(&mut self, path: &Path, data: &str) -> io::Result<()>;
    /// `fork(2)` of the single-threaded init.
    fn fork(&mut self) -> io::Result<Forked>;
    /// Waits for `child`, passing a stop on to it ([`FORWARDED`]), and
    /// returns its exit code (128+signal when killed).
    fn wait_child(&mut self, child: rustix::process::Pid) -> io::Result<i32>;
    /// `sethostname(2)`.
    fn set_hostname(&mut self, name: &str) -> io::Result<()>;
    /// Brings `lo` up in the current network namespace.
    fn loopback_up(&mut self) -> io::Result<()>;
    /// `RLIMIT_NOFILE`, soft and hard.
    fn limit_open_files(&mut self, n: u64) -> io::Result<()>;
    /// Clears one capability set of the calling thread.
    fn clear_caps(&mut self, set: CapSet) -> io::Result<()>;
    /// `PR_SET_NO_NEW_PRIVS`.
    fn no_new_privs(&mut self) -> io::Result<()>;
    /// Landlock ([`fs_rules::apply`]): writes under `workspace` and the
    /// other views of the one tmpfs only.
    fn restrict_fs(&mut self, workspace: &Path) -> Result<(), LandlockError>;
    /// Installs the compiled seccomp filters on the calling thread.
    fn install_seccomp(&mut self, filters: &Filters) -> Result<(), SeccompError>;
    /// Starts the command; its PID.
    fn spawn(&mut self, command: &Command<'_>) -> io::Result<i32>;
    /// As PID 1: reaps every child until `main` exits, passing a stop on to
    /// it ([`FORWARDED`]); its exit code.
    fn reap_until(&mut self, main: i32) -> io::Result<i32>;

    // --- the filesystem ([`super::plan`]) ---

    fn make_private(&mut self, target: &Path) -> io::Result<()>;
    /// A tmpfs of `size_mb` MiB (and at most `inodes` files when given).
    fn mount_tmpfs(
        &mut self,
        target: &Path,
        size_mb: u64,
        inodes: Option<u64>,
        mode: u32,
        attrs: u64,
    ) -> io::Result<()>;
    /// Recursive bind mount.
    fn bind(&mut self, source: &Path, target: &Path) -> io::Result<()>;
    /// Sets `attrs` on the mount at `target` (and every mount under it when `recursive`).
    fn set_attrs(&mut self, target: &Path, attrs: u64, recursive: bool) -> io::Result<()>;
    fn mount_proc(&mut self, target: &Path) -> io::Result<()>;
    fn pivot_root(&mut self, new_root: &Path, put_old: &Path) -> io::Result<()>;
    fn detach(&mut self, target: &Path) -> io::Result<()>;
    fn mkdir_all(&mut self, path: &Path) -> io::Result<()>;
    fn rmdir(&mut self, path: &Path) -> io::Result<()>;
    fn touch(&mut self, path: &Path) -> io::Result<()>;
    fn symlink(&mut self, target: &Path, link: &Path) -> io::Result<()>;
    fn chdir(&mut self, path: &Path) -> io::Result<()>;
    fn chmod(&mut self, path: &Path, mode: u32) -> io::Result<()>;
    /// A detached copy of the mount tree at `path` (`open_tree(2)` with
    /// `OPEN_TREE_CLONE`), to be attached later with [`Sys::attach`].
    fn clone_tree(&self, path: &Path) -> io::Result<OwnedFd>;
    /// Attaches a tree from [`Sys::clone_tree`] at `target` (`move_mount(2)`).
    fn attach(&mut self, tree: &OwnedFd, target: &Path) -> io::Result<()>;
    /// What is at `path` (not following a final symlink).
    fn kind(&self, path: &Path) -> Kind;
    fn read_link(&self, path: &Path) -> io::Result<std::path::PathBuf>;
    /// The names in the directory at `path` (none when it cannot be read).
    fn list(&self, path: &Path) -> Vec<String>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Missing,
    Dir,
    File,
    Symlink,
}

/// The real thing.
pub struct Real;

impl Sys for Real {
    fn new_session(&mut self) -> io::Result<()> {
        rustix::process::setsid()?;
        Ok(())
    }

    fn die_with_parent(&mut self) -> io::Result<()> {
        Ok(rustix::process::set_parent_process_death_signal(Some(
            Signal::KILL,
        ))?)
    }

    fn parent(&self) -> Option<i32> {
        rustix::process::getppid().map(|p| p.as_raw_nonzero().get())
    }

    fn cloexec_from_3(&mut self) -> io::Result<()> {
        cloexec_from_3()
    }

    fn read_header(&mut self) -> Result<Header, ConfigError> {
        Header::decode(RawStdin)
    }

    fn join_cgroups(&mut self, joins: &[cgroup::Join]) -> Result<(), CgroupError> {
        cgroup::join_self(joins)
    }

    fn drop_groups(&mut self) -> io::Result<()> {
        Ok(rustix::thread::set_thread_groups(&[])?)
    }

    fn set_gid(&mut self, gid: u32) -> io::Result<()> {
        let gid = rustix::process::Gid::from_raw(gid);
        Ok(rustix::thread::set_thread_res_gid(gid, gid, gid)?)
    }

    fn set_uid(&mut self, uid: u32) -> io::Result<()> {
        let uid = rustix::process::Uid::from_raw(uid);
        Ok(rustix::thread::set_thread_res_uid(uid, uid, uid)?)
    }

    fn effective_ids(&self) -> (u32, u32) {
        (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    }

    fn set_dumpable(&mut self, dumpable: bool) -> io::Result<()> {
        use rustix::process::DumpableBehavior as D;
        let d = if dumpable {
            D::Dumpable
        } else {
            D::NotDumpable
        };
        Ok(rustix::process::set_dumpable_behavior(d)?)
    }

    fn unshare(&mut self, flags: rustix::thread::UnshareFlags) -> io::Result<()> {
        unshare_namespaces(flags)
    }

    fn write(&mut self, path: &Path, data: &str) -> io::Result<()> {
        std::fs::write(path, data)
    }

    fn fork(&mut self) -> io::Result<Forked> {
        fork_single_threaded()
    }

    fn wait_child(&mut self, child: rustix::process::Pid) -> io::Result<i32> {
        wait_forwarding(child, Reap::Only)
    }

    fn set_hostname(&mut self, name: &str) -> io::Result<()> {
        Ok(rustix::system::sethostname(name.as_bytes())?)
    }

    fn loopback_up(&mut self) -> io::Result<()> {
        loopback_up()
    }

    fn limit_open_files(&mut self, n: u64) -> io::Result<()> {
        let limit = rustix::process::Rlimit {
            current: Some(n),
            maximum: Some(n),
        };
        Ok(rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            limit,
        )?)
    }

    fn clear_caps(&mut self, set: CapSet) -> io::Result<()> {
        let set = match set {
            CapSet::Bounding => caps::CapSet::Bounding,
            CapSet::Ambient => caps::CapSet::Ambient,
            CapSet::Inheritable => caps::CapSet::Inheritable,
            CapSet::Effective => caps::CapSet::Effective,
            CapSet::Permitted => caps::CapSet::Permitted,
        };
        caps::clear(None, set).map_err(io::Error::other)
    }

    fn no_new_privs(&mut self) -> io::Result<()> {
        Ok(rustix::thread::set_no_new_privs(true)?)
    }

    fn restrict_fs(&mut self, workspace: &Path) -> Result<(), LandlockError> {
        fs_rules::apply(workspace.to_path_buf()).map(drop)
    }

    fn install_seccomp(&mut self, filters: &Filters) -> Result<(), SeccompError> {
        filters.install()
    }

    fn spawn(&mut self, command: &Command<'_>) -> io::Result<i32> {
        let child = std::process::Command::new(command.program)
            .args(command.args)
            .env_clear()
            .envs(command.env.iter().map(|(k, v)| (k, v)))
            .current_dir(command.cwd)
            .spawn()?;
        // A pid fits an i32 (pid_max is at most 2^22).
        i32::try_from(child.id()).map_err(|e| io::Error::other(format!("pid: {e}")))
    }

    fn reap_until(&mut self, main: i32) -> io::Result<i32> {
        let main = rustix::process::Pid::from_raw(main).ok_or_else(|| io::Error::other("pid 0"))?;
        wait_forwarding(main, Reap::All)
    }

    fn make_private(&mut self, target: &Path) -> io::Result<()> {
        Ok(rustix::mount::mount_change(
            target,
            MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        )?)
    }

    fn mount_tmpfs(
        &mut self,
        target: &Path,
        size_mb: u64,
        inodes: Option<u64>,
        mode: u32,
        attrs: u64,
    ) -> io::Result<()> {
        let inodes = inodes
            .map(|n| format!(",nr_inodes={n}"))
            .unwrap_or_default();
        let data = CString::new(format!("size={size_mb}m,mode={mode:o}{inodes}"))
            .map_err(io::Error::other)?;
        let mut flags = MountFlags::empty();
        if attrs & ATTR_NOSUID != 0 {
            flags |= MountFlags::NOSUID;
        }
        if attrs & ATTR_NODEV != 0 {
            flags |= MountFlags::NODEV;
        }
        if attrs & ATTR_NOEXEC != 0 {
            flags |= MountFlags::NOEXEC;
        }
        Ok(rustix::mount::mount(
            "tmpfs",
            target,
            "tmpfs",
            flags,
            data.as_c_str(),
        )?)
    }

    fn bind(&mut self, source: &Path, target: &Path) -> io::Result<()> {
        Ok(rustix::mount::mount_bind_recursive(source, target)?)
    }

    fn set_attrs(&mut self, target: &Path, attrs: u64, recursive: bool) -> io::Result<()> {
        mount_setattr(target, attrs, recursive)
    }

    fn mount_proc(&mut self, target: &Path) -> io::Result<()> {
        let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
        Ok(rustix::mount::mount("proc", target, "proc", flags, None)?)
    }

    fn pivot_root(&mut self, new_root: &Path, put_old: &Path) -> io::Result<()> {
        Ok(rustix::process::pivot_root(new_root, put_old)?)
    }

    fn detach(&mut self, target: &Path) -> io::Result<()> {
        Ok(rustix::mount::unmount(target, UnmountFlags::DETACH)?)
    }

    fn mkdir_all(&mut self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn rmdir(&mut self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn touch(&mut self, path: &Path) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map(drop)
    }

    fn symlink(&mut self, target: &Path, link: &Path) -> io::Result<()> {
        std::os::unix::fs::symlink(target, link)
    }

    fn chdir(&mut self, path: &Path) -> io::Result<()> {
        std::env::set_current_dir(path)
    }

    fn clone_tree(&self, path: &Path) -> io::Result<OwnedFd> {
        use rustix::mount::OpenTreeFlags as F;
        Ok(rustix::mount::open_tree(
            rustix::fs::CWD,
            path,
            F::OPEN_TREE_CLONE | F::OPEN_TREE_CLOEXEC | F::AT_RECURSIVE | F::AT_SYMLINK_NOFOLLOW,
        )?)
    }

    fn attach(&mut self, tree: &OwnedFd, target: &Path) -> io::Result<()> {
        Ok(rustix::mount::move_mount(
            tree,
            "",
            rustix::fs::CWD,
            target,
            rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )?)
    }

    fn chmod(&mut self, path: &Path, mode: u32) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }

    fn kind(&self, path: &Path) -> Kind {
        match std::fs::symlink_metadata(path) {
            Err(_) => Kind::Missing,
            Ok(m) if m.file_type().is_symlink() => Kind::Symlink,
            Ok(m) if m.is_dir() => Kind::Dir,
            Ok(_) => Kind::File,
        }
    }

    fn read_link(&self, path: &Path) -> io::Result<std::path::PathBuf> {
        std::fs::read_link(path)
    }

    fn list(&self, path: &Path) -> Vec<String> {
        std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Reads fd 0 without buffering, so the bytes after the header stay there.
struct RawStdin;

impl io::Read for RawStdin {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::fd::AsFd;
        let stdin = io::stdin();
        Ok(rustix::io::read(stdin.as_fd(), buf)?)
    }
}

/// The exit code a wait status stands for: the code, 128+signal when
/// killed, else [`super::init::SETUP_FAILED`].
pub fn exit_code(st: rustix::process::WaitStatus) -> i32 {
    if let Some(c) = st.exit_status() {
        c
    } else if let Some(sig) = st.terminating_signal() {
        128 + sig
    } else {
        super::init::SETUP_FAILED
    }
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr(2)` (Linux 5.12): rustix does not wrap it.
fn mount_setattr(target: &Path, attrs: u64, recursive: bool) -> io::Result<()> {
    let path = CString::new(target.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 } | libc::AT_NO_AUTOMOUNT;
    // SAFETY: `path` is a valid NUL-terminated string and `attr` a properly
    // sized `struct mount_attr` that both outlive the call; the kernel only
    // reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags.cast_unsigned(), // the same flag bits
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Every namespace the sandbox gets.
pub fn sandbox_namespaces() -> rustix::thread::UnshareFlags {
    use rustix::thread::UnshareFlags as F;
    F::NEWUSER | F::NEWNS | F::NEWPID | F::NEWNET | F::NEWIPC | F::NEWUTS | F::NEWCGROUP
}

/// `unshare(2)` of namespaces only.
fn unshare_namespaces(flags: rustix::thread::UnshareFlags) -> io::Result<()> {
    use rustix::thread::UnshareFlags as F;
    if flags.intersects(F::FILES | F::FS | F::SYSVSEM) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: only namespace flags reach here (checked above); unsharing
    // namespaces does not invalidate anything this process holds (the
    // `unshare_unsafe` hazard is CLONE_FILES, excluded).
    Ok(unsafe { rustix::thread::unshare_unsafe(flags) }?)
}

pub enum Forked {
    Child,
    Parent(rustix::process::Pid),
}

/// `fork(2)`. Only called by `sandbox-init`, which is single-threaded (no
/// runtime, no threads spawned before), so the child may do anything.
fn fork_single_threaded() -> io::Result<Forked> {
    // SAFETY: the caller is single-threaded (sandbox-init starts no thread and
    // no async runtime), so no lock can be held by another thread across the
    // fork, and the child owns a consistent copy of the address space.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        p => Ok(Forked::Parent(
            rustix::process::Pid::from_raw(p)
                .ok_or_else(|| io::Error::other("fork returned pid 0"))?,
        )),
    }
}

/// Marks every descriptor from 3 on close-on-exec, so nothing the platform
/// leaked reaches the command.
fn cloexec_from_3() -> io::Result<()> {
    // SAFETY: CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; it closes
    // none, so no owner is invalidated.
    let r = unsafe {
        libc::close_range(
            3,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC.cast_signed(), // the same flag bits
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Brings `lo` up in the current network namespace (SIOCSIFFLAGS).
pub(crate) fn loopback_up() -> io::Result<()> {
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?;
    let mut req = IfReqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: 0,
        _pad: [0; 22],
    };
    req.name[..2].copy_from_slice(b"lo");
    let up = libc::c_short::try_from(libc::IFF_UP | libc::IFF_RUNNING).map_err(io::Error::other)?;
    // SAFETY: `req` is a correctly sized, initialised `struct ifreq` (name +
    // flags union member) that lives across both calls; the socket is open.
    unsafe {
        if libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCGIFFLAGS,
            &mut req as *mut IfReqFlags,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        req.flags |= up;
        if libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCSIFFLAGS,
            &mut req as *mut IfReqFlags,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The kernel's Landlock ABI version (`landlock_create_ruleset(NULL, 0, VERSION)`).
pub fn landlock_abi() -> io::Result<i64> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attribute pointer, size 0 and the VERSION flag the
    // call reads no memory and only returns a number.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Which step of [`probe_userns`] failed, and the errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeFailure {
    pub step: ProbeStep,
    pub errno: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeStep {
    Fork,
    Unshare,
    UidMap,
    Mount,
}

/// Forks a child that unshares every namespace the sandbox uses, maps its
/// IDs and mounts a tmpfs in its private mount namespace, then exits: the
/// real test of "user namespaces work here" (AppArmor's restriction lets
/// unshare succeed and only fails the mount). Safe to call from a
/// multi-threaded process: the child only issues raw syscalls on buffers
/// prepared before the fork and never allocates.
pub fn probe_userns(flags: rustix::thread::UnshareFlags) -> Option<ProbeFailure> {
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let uid_map = format!("{uid} {uid} 1");
    let gid_map = format!("{gid} {gid} 1");
    let (rd, wr) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok(p) => p,
        Err(e) => {
            return Some(ProbeFailure {
                step: ProbeStep::Fork,
                errno: e.raw_os_error(),
            });
        }
    };
    // SAFETY: the child runs only async-signal-safe raw syscalls (rustix
    // calls on pre-built strings, no allocation, no locks) and ends with
    // `_exit`, so forking a multi-threaded parent is sound.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let fail = |step: u8, e: rustix::io::Errno| -> ! {
            let b = e.raw_os_error().to_le_bytes();
            let _ = rustix::io::write(&wr, &[step, b[0], b[1], b[2], b[3]]);
            // SAFETY: `_exit` ends the forked child without running atexit
            // handlers or destructors that belong to the parent.
            unsafe { libc::_exit(1) }
        };
        // SAFETY: namespace flags only (no CLONE_FILES), see unshare_namespaces.
        if let Err(e) = unsafe { rustix::thread::unshare_unsafe(flags) } {
            fail(1, e);
        }
        if flags.contains(rustix::thread::UnshareFlags::NEWUSER) {
            for (file, data) in [
                (c"/proc/self/setgroups", &b"deny"[..]),
                (c"/proc/self/uid_map", uid_map.as_bytes()),
                (c"/proc/self/gid_map", gid_map.as_bytes()),
            ] {
                let r =
                    rustix::fs::open(file, rustix::fs::OFlags::WRONLY, rustix::fs::Mode::empty())
                        .and_then(|fd| rustix::io::write(&fd, data));
                if let Err(e) = r {
                    fail(2, e);
                }
            }
        }
        if flags.contains(rustix::thread::UnshareFlags::NEWNS) {
            if let Err(e) = rustix::mount::mount_change(
                c"/",
                MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
            ) {
                fail(3, e);
            }
            if let Err(e) =
                rustix::mount::mount(c"tmpfs", c"/tmp", c"tmpfs", MountFlags::empty(), c"size=1m")
            {
                fail(3, e);
            }
        }
        // SAFETY: as above.
        unsafe { libc::_exit(0) }
    }
    drop(wr);
    if pid < 0 {
        return Some(ProbeFailure {
            step: ProbeStep::Fork,
            errno: io::Error::last_os_error().raw_os_error().unwrap_or(0),
        });
    }
    let mut buf = [0u8; 5];
    let n = read_full(&rd, &mut buf);
    if let Some(p) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
    }
    if n < 5 {
        return None;
    }
    let errno = i32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]);
    let step = match buf[0] {
        1 => ProbeStep::Unshare,
        2 => ProbeStep::UidMap,
        _ => ProbeStep::Mount,
    };
    Some(ProbeFailure { step, errno })
}

fn read_full(fd: &OwnedFd, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match rustix::io::read(fd, &mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
    }
    n
}

/// Makes the spawned command the leader of a new session, with no
/// controlling terminal (the process backend, the microVM helper and its
/// VMM; `sandbox-init` calls `setsid` itself).
pub fn new_session_on_spawn(cmd: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before exec and calls only
    // setsid(2), which is async-signal-safe, allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            Ok(())
        });
    }
}

/// How a microVM's VMM is confined as it is spawned ([`confine_vmm_on_spawn`]).
#[derive(Debug, Clone, Copy)]
pub struct VmmConfinement {
    /// New network, IPC, UTS and mount namespaces and the run's own ids
    /// (the platform is root); otherwise only the last two steps.
    pub switch: bool,
    pub uid: u32,
    pub gid: u32,
    /// The spawning process: the VMM refuses to start once it is gone.
    pub parent: i32,
}

/// Waits until the process of the pidfd `fd` has exited (a pidfd polls
/// readable then); an error if the runtime cannot watch it.
pub async fn pidfd_exited(fd: OwnedFd) -> io::Result<()> {
    // SAFETY: `fd` is an OwnedFd moved into the AsyncFd: it stays open and
    // names the same pidfd for the AsyncFd's whole life, and its
    // `as_raw_fd` always returns that descriptor.
    let watched = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }
    .map_err(|e| io::Error::other(e.to_string()))?;
    let _ready = watched.readable().await?;
    Ok(())
}

/// Confines the spawned VMM in the forked child, before its exec: when
/// `switch`, its own network, IPC, UTS and mount namespaces (mounts
/// private) and the run's uid and gid with no supplementary group; always
/// no new privileges and SIGKILL when its parent dies. The death signal is
/// set after the ids (a change of credentials clears it) and then the
/// parent is checked: a VMM whose parent died before that point fails to
/// spawn (`ESRCH`) instead of outliving it (the race `setpriv --pdeathsig`
/// leaves).
pub fn confine_vmm_on_spawn(cmd: &mut tokio::process::Command, c: VmmConfinement) {
    use rustix::thread::UnshareFlags as F;
    // SAFETY: the closure runs in the forked child before exec. Each call is
    // a single raw syscall through rustix (unshare of namespaces only, mount
    // propagation of a static path, setgroups of none, setresgid, setresuid,
    // prctl, getppid): async-signal-safe, no allocation, no lock.
    unsafe {
        cmd.pre_exec(move || {
            if c.switch {
                unshare_namespaces(F::NEWNET | F::NEWIPC | F::NEWUTS | F::NEWNS)?;
                rustix::mount::mount_change(
                    c"/",
                    MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
                )?;
                rustix::thread::set_thread_groups(&[])?;
                let gid = rustix::process::Gid::from_raw(c.gid);
                rustix::thread::set_thread_res_gid(gid, gid, gid)?;
                let uid = rustix::process::Uid::from_raw(c.uid);
                rustix::thread::set_thread_res_uid(uid, uid, uid)?;
            }
            rustix::thread::set_no_new_privs(true)?;
            die_with(c.parent)
        });
    }
}

/// The spawned command gets SIGKILL when the thread that spawned it exits
/// (with its process), set in the forked child before its exec, so no
/// window is left in which the spawner can die unnoticed; a child whose
/// spawner died before that point fails to spawn (`ESRCH`).
pub fn die_with_spawner_on_spawn(cmd: &mut tokio::process::Command) {
    let parent = rustix::process::getpid().as_raw_nonzero().get();
    // SAFETY: the closure runs in the forked child before exec and makes two
    // raw syscalls (prctl, getppid): async-signal-safe, no allocation, no lock.
    unsafe {
        cmd.pre_exec(move || die_with(parent));
    }
}

/// In a forked child: SIGKILL when its parent dies, then a check that the
/// parent is still `parent` (it may have died before the signal was set).
/// Async-signal-safe.
fn die_with(parent: i32) -> io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
    if rustix::process::getppid().map(|p| p.as_raw_nonzero().get()) != Some(parent) {
        // ESRCH: std carries only an errno back to the spawner.
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(())
}

/// A set of signals (for [`block_signals`] and [`wait_signal`]).
fn sigset(signals: &[i32]) -> io::Result<libc::sigset_t> {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set it is given; sigaddset only
    // writes into that initialised set.
    unsafe {
        if libc::sigemptyset(set.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        for s in signals {
            if libc::sigaddset(set.as_mut_ptr(), *s) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(set.assume_init())
    }
}

/// Blocks `signals` in the calling thread (a single-threaded init): they
/// stay pending until [`wait_signal`] takes them. A command spawned
/// afterwards inherits the mask.
fn block_signals(signals: &[i32]) -> io::Result<()> {
    let set = sigset(signals)?;
    // SAFETY: `set` is an initialised sigset_t; the old mask is not asked for.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

/// The signals an init passes on to the process it waits for: how a stop
/// (`SIGTERM`: the platform's cancel or timeout, `docker stop`) or an
/// interrupt reaches the runtime, which then ends its agent and reports
/// what it still holds before it exits.
pub const FORWARDED: &[i32] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Which children [`wait_forwarding`] reaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reap {
    /// `main` only (an init that is not a namespace's PID 1).
    Only,
    /// Every child that ends: orphans are re-parented to a PID 1.
    All,
}

/// Waits until `main`, a child of the caller, exits, passing each
/// [`FORWARDED`] signal the caller is sent on to it; its exit code
/// (128+signal when it was killed). For a single-threaded init.
///
/// The signals are blocked and taken with `sigwaitinfo`: blocked, they are
/// queued even for a namespace's PID 1, which the kernel otherwise spares
/// every signal it has no handler for. They are blocked only here, once
/// `main` runs: a child inherits its parent's mask (a command started
/// after would never see its stop). A stop sent in between is lost; the
/// platform kills the sandbox at the end of its grace. A child that ended
/// before they were blocked (its `SIGCHLD` was then discarded) is found by
/// the reaping pass that comes before every wait.
pub fn wait_forwarding(main: rustix::process::Pid, reap: Reap) -> io::Result<i32> {
    let mut waited = FORWARDED.to_vec();
    waited.push(libc::SIGCHLD);
    block_signals(&waited)?;
    loop {
        loop {
            let ended = match reap {
                Reap::Only => rustix::process::waitpid(Some(main), WaitOptions::NOHANG),
                Reap::All => rustix::process::wait(WaitOptions::NOHANG),
            };
            match ended {
                Ok(Some((pid, st))) if pid == main => return Ok(exit_code(st)),
                Ok(Some(_)) | Err(rustix::io::Errno::INTR) => continue,
                Ok(None) => break,
                Err(e) => return Err(e.into()),
            }
        }
        let sig = wait_signal(&waited)?;
        if sig != libc::SIGCHLD
            && let Some(sig) = Signal::from_named_raw(sig)
        {
            // It may have ended meanwhile: the next pass reaps it.
            let _ = rustix::process::kill_process(main, sig);
        }
    }
}

/// Waits for one of `signals` (blocked beforehand) and returns it.
fn wait_signal(signals: &[i32]) -> io::Result<i32> {
    let set = sigset(signals)?;
    loop {
        // SAFETY: `set` is an initialised sigset_t; no siginfo is asked for.
        let r = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        if r >= 0 {
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Tries to make a native AIO context (`io_setup(1, …)`), destroying it if
/// one was made: `Ok` if the calling process may take from the host's AIO
/// pool, else why not (`airlock doctor` asks from inside a sandbox).
pub fn try_native_aio() -> io::Result<()> {
    let mut ctx: libc::c_ulong = 0;
    // SAFETY: io_setup writes one context id into `ctx`, a live local.
    let r = unsafe { libc::syscall(libc::SYS_io_setup, 1 as libc::c_long, &mut ctx) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: destroys the context just made, by its id.
    unsafe { libc::syscall(libc::SYS_io_destroy, ctx) };
    Ok(())
}

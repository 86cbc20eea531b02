//! The filesystem the sandbox sees, built step by step through [`Sys`] so the
//! sequence is unit-tested without root.
//!
//! Layout (everything else of the host is absent):
//! - `/usr`, `/etc` and the `/bin`, `/sbin`, `/lib*` entries (symlinks into
//!   `/usr` on merged-usr hosts) read-only, nosuid, nodev: programs and
//!   their libraries, the loader cache, passwd/nsswitch, CA certificates.
//!   Host secrets in `/etc` that root could read (shadow, gshadow, sudoers,
//!   SSH host keys, ssl/private) are masked (the sandbox's host uid is not
//!   root either). No `/home`, `/root`, `/var`, `/run` (host daemons'
//!   sockets), `/sys`, `/boot`, host `/tmp`.
//! - ONE tmpfs capped at `workspace_size_mb` takes every write of the
//!   sandbox: it is seen at the workspace, at `/tmp` and at `/dev/shm`, so
//!   their sum is capped (no host disk is writable from inside).
//! - `/proc` fresh for the new PID namespace, with `sys`, `sysrq-trigger`,
//!   `irq`, `bus`, `fs` read-only and the kernel-information entries runc
//!   and Docker mask ([`PROC_MASKED_FILES`], [`PROC_MASKED_DIRS`]) masked.
//! - `/dev`: a read-only tmpfs with null, zero, full, random, urandom, tty,
//!   the fd symlinks and `/dev/shm`.
//! - the sidecar's sockets directory read-only at [`SOCKETS_INSIDE`]
//!   (`connect(2)` works on a read-only mount; nothing can be renamed,
//!   replaced or created there); the `airlock` binary alone, read-only at
//!   [`EXE_INSIDE`] (not its directory: nothing else of the host's build
//!   or install tree); `ro_paths` (the agent's directory) read-only at the
//!   same path.
//! - `/` itself: a read-only tmpfs holding the mount points.
//! - the transparent plane's two parts of the sandbox (the runtime serves
//!   the rest; `airlock-runtime`'s `transparent` module): `/etc/resolv.conf`
//!   names its responder alone (a mask of the host's file, where that is a
//!   file), and the network namespace's `ip_unprivileged_port_start` is 0,
//!   so the runtime's unprivileged uid can listen on ports 53, 80 and 443
//!   of the sandbox's own loopback (no other network is there).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use airlock_platform_api::transparent::resolv_conf;

use super::config::{EXE_INSIDE, InitConfig, SOCKETS_INSIDE};
use super::sys::{ATTR_NODEV, ATTR_NOEXEC, ATTR_NOSUID, ATTR_RDONLY, Kind, Sys};

/// Where the host's root sits while the new root is populated.
const OLD: &str = "/oldroot";
/// The mount point turned into the new root (only inside our mount namespace).
const BASE: &str = "/tmp";
/// Where the writable tmpfs is mounted while its three views are bound.
const RW: &str = "/.rw";
/// The network namespace's lowest port an unprivileged uid may bind.
const UNPRIVILEGED_PORT_START: &str = "/proc/sys/net/ipv4/ip_unprivileged_port_start";
/// The masks' sources while they are bound ([`Masks`]).
const MASKS: &str = "/.masks";

pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];
const MASKED_FILES: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/security/opasswd",
];
const MASKED_DIRS: &[&str] = &["/etc/sudoers.d", "/etc/ssl/private"];
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
pub const PROC_READONLY: &[&str] = &[
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
];
/// Kernel information a sandbox has no use for (runc's and Docker's masked
/// paths, and the memory-layout files): each is replaced by `/dev/null`.
pub const PROC_MASKED_FILES: &[&str] = &[
    "/proc/kcore",
    "/proc/keys",
    "/proc/key-users",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/slabinfo",
    "/proc/vmallocinfo",
    "/proc/pagetypeinfo",
    "/proc/kallsyms",
    "/proc/kmsg",
    "/proc/kpagecount",
    "/proc/kpageflags",
    "/proc/kpagecgroup",
    "/proc/iomem",
    "/proc/ioports",
    "/proc/modules",
];
/// Directories of kernel information, each replaced by an empty read-only directory.
pub const PROC_MASKED_DIRS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/scsi",
    "/proc/driver",
    "/proc/dynamic_debug",
];

/// Files a tmpfs of `size_mb` may hold: generous for real trees
/// (`node_modules`), bounded so empty files cannot pin kernel memory.
pub fn tmpfs_inodes(size_mb: u64) -> u64 {
    size_mb.saturating_mul(256).max(4096)
}

#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct PlanError {
    pub step: String,
    #[source]
    pub source: std::io::Error,
}

trait Step<T> {
    fn step(self, what: impl FnOnce() -> String) -> Result<T, PlanError>;
}

impl<T> Step<T> for std::io::Result<T> {
    fn step(self, what: impl FnOnce() -> String) -> Result<T, PlanError> {
        self.map_err(|source| PlanError {
            step: what(),
            source,
        })
    }
}

fn old(p: &Path) -> PathBuf {
    Path::new(OLD).join(p.strip_prefix("/").unwrap_or(p))
}

/// What a mask is bound from, made once per sandbox on a small read-only
/// tmpfs at [`MASKS`]: the host's `/dev/null` (read-only, nosuid, nodev, so
/// it opens to nothing) and two empty directories (modes 0700 and 0555).
/// A bind takes its source mount's flags, so each mask is one bind, not a
/// bind and a `mount_setattr` (or a tmpfs of its own and one) per path.
struct Masks {
    null: PathBuf,
    private_dir: PathBuf,
    empty_dir: PathBuf,
    /// The transparent plane's `/etc/resolv.conf`.
    resolv: PathBuf,
}

impl Masks {
    fn make(sys: &mut impl Sys, host_null: &Path, ro: u64) -> Result<Masks, PlanError> {
        let root = Path::new(MASKS);
        let m = Masks {
            null: root.join("null"),
            private_dir: root.join("d700"),
            empty_dir: root.join("d555"),
            resolv: root.join("resolv.conf"),
        };
        sys.mkdir_all(root).step(|| "mkdir /.masks".into())?;
        sys.mount_tmpfs(root, 1, Some(16), 0o755, ATTR_NOSUID | ATTR_NODEV)
            .step(|| "tmpfs /.masks".into())?;
        sys.touch(&m.null).step(|| "create /.masks/null".into())?;
        sys.write(&m.resolv, &resolv_conf())
            .step(|| "create /.masks/resolv.conf".into())?;
        for (d, mode) in [(&m.private_dir, 0o700), (&m.empty_dir, 0o555)] {
            sys.mkdir_all(d).step(|| format!("mkdir {}", d.display()))?;
            sys.chmod(d, mode)
                .step(|| format!("chmod {}", d.display()))?;
        }
        sys.set_attrs(root, ro, false)
            .step(|| "read-only /.masks".into())?;
        sys.bind(host_null, &m.null)
            .step(|| "bind /.masks/null".into())?;
        sys.set_attrs(&m.null, ro, false)
            .step(|| "read-only /.masks/null".into())?;
        Ok(m)
    }

    /// Binds `source` (one of the masks) over `target`.
    fn over(sys: &mut impl Sys, source: &Path, target: &Path) -> Result<(), PlanError> {
        sys.bind(source, target)
            .step(|| format!("mask {}", target.display()))
    }
}

/// Copies of the host paths a root platform shares with the sandbox (the
/// sockets' directory, the `ro_paths`), taken while init is still root: the
/// sandbox's unprivileged uid could not reach them through the operator's
/// private directories (`/root`, a 0700 `$AIRLOCK_HOME`), and only their own
/// permissions should decide what it may read. Empty for a rootless
/// platform, whose uid reaches them by path.
#[derive(Default)]
pub struct Trees(Vec<(PathBuf, Kind, OwnedFd)>);

impl Trees {
    /// `open_tree(OPEN_TREE_CLONE)` of each path (a detached bind mount).
    pub fn detach(sys: &impl Sys, paths: &[&Path]) -> Result<Trees, PlanError> {
        let mut v = Vec::with_capacity(paths.len());
        for p in paths {
            let kind = sys.kind(p);
            if !matches!(kind, Kind::Dir | Kind::File) {
                return Err(PlanError {
                    step: format!("{} on the host", p.display()),
                    source: std::io::ErrorKind::NotFound.into(),
                });
            }
            let fd = sys
                .clone_tree(p)
                .step(|| format!("open_tree {}", p.display()))?;
            v.push((p.to_path_buf(), kind, fd));
        }
        Ok(Trees(v))
    }

    fn get(&self, host: &Path) -> Option<(Kind, &OwnedFd)> {
        self.0
            .iter()
            .find(|(p, _, _)| p == host)
            .map(|(_, k, fd)| (*k, fd))
    }
}

/// Builds the sandbox's root and leaves the process in the workspace.
/// Runs as PID 1 of the new PID namespace, inside the new mount namespace.
/// Each step below is one part of the layout (the module's contract), in
/// the order the kernel requires: the host's tree stays at [`OLD`] until the
/// last paths are bound from it and `/proc` is mounted.
pub fn build_root(sys: &mut impl Sys, cfg: &InitConfig, trees: &Trees) -> Result<(), PlanError> {
    pivot_into_tmpfs(sys)?;
    bind_system_dirs(sys)?;
    let masks = Masks::make(sys, &old(Path::new("/dev/null")), RO)?;
    mask_host_secrets(sys, &masks)?;
    let rw = writable_tmpfs(sys, cfg.workspace_size_mb)?;
    minimal_dev(sys, rw)?;
    fresh_proc(sys, &masks)?;
    bind_run_paths(sys, cfg, trees)?;
    drop_staging(sys, rw)?;
    sys.set_attrs(Path::new("/"), RO, false)
        .step(|| "read-only /".into())?;
    sys.chdir(&cfg.workspace)
        .step(|| "chdir workspace".into())?;
    Ok(())
}

/// Read-only, nosuid, nodev: what every host path the sandbox sees gets.
const RO: u64 = ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV;

/// The new root: a small tmpfs pivoted into, the host's root kept at [`OLD`].
fn pivot_into_tmpfs(sys: &mut impl Sys) -> Result<(), PlanError> {
    sys.make_private(Path::new("/"))
        .step(|| "make / private".into())?;
    sys.mount_tmpfs(Path::new(BASE), 1, None, 0o755, ATTR_NOSUID | ATTR_NODEV)
        .step(|| "new root tmpfs".into())?;
    sys.chdir(Path::new(BASE))
        .step(|| "chdir new root".into())?;
    let put_old = Path::new(BASE).join(OLD.trim_start_matches('/'));
    sys.mkdir_all(&put_old).step(|| "mkdir oldroot".into())?;
    sys.pivot_root(Path::new(BASE), &put_old)
        .step(|| "pivot_root".into())?;
    sys.chdir(Path::new("/")).step(|| "chdir /".into())
}

/// [`SYSTEM_DIRS`], read-only; those that are symlinks on the host (merged
/// `/usr`) are the same symlinks; those absent are skipped.
fn bind_system_dirs(sys: &mut impl Sys) -> Result<(), PlanError> {
    for dir in SYSTEM_DIRS {
        let dir = Path::new(dir);
        let host = old(dir);
        match sys.kind(&host) {
            Kind::Symlink => {
                let target = sys
                    .read_link(&host)
                    .step(|| format!("readlink {}", host.display()))?;
                sys.symlink(&target, dir)
                    .step(|| format!("symlink {}", dir.display()))?;
            }
            Kind::Dir => {
                sys.mkdir_all(dir)
                    .step(|| format!("mkdir {}", dir.display()))?;
                sys.bind(&host, dir)
                    .step(|| format!("bind {}", dir.display()))?;
                sys.set_attrs(dir, RO, true)
                    .step(|| format!("read-only {}", dir.display()))?;
            }
            Kind::File | Kind::Missing => {}
        }
    }
    Ok(())
}

/// The host's secrets in `/etc` ([`MASKED_FILES`], the SSH host keys,
/// [`MASKED_DIRS`]), each covered by a mask.
fn mask_host_secrets(sys: &mut impl Sys, masks: &Masks) -> Result<(), PlanError> {
    for f in MASKED_FILES {
        let f = Path::new(f);
        if sys.kind(&old(f)) == Kind::File {
            Masks::over(sys, &masks.null, f)?;
        }
    }
    // Host private keys: /etc/ssh/ssh_host_*_key (the .pub files may stay).
    for name in sys.list(&old(Path::new("/etc/ssh"))) {
        if name.starts_with("ssh_host_") && name.ends_with("_key") {
            Masks::over(sys, &masks.null, &Path::new("/etc/ssh").join(name))?;
        }
    }
    // Not a secret: the transparent plane's resolver in place of the
    // host's, which the sandbox could not reach anyway. A symlink (to a
    // resolver daemon's file under `/run`) cannot be covered: there the
    // sandbox keeps no usable resolver, as before.
    let resolv = Path::new("/etc/resolv.conf");
    if sys.kind(&old(resolv)) == Kind::File {
        Masks::over(sys, &masks.resolv, resolv)?;
    }
    let mut masked_dirs: Vec<PathBuf> = MASKED_DIRS.iter().map(PathBuf::from).collect();
    masked_dirs.retain(|d| sys.kind(&old(d)) == Kind::Dir);
    for d in &masked_dirs {
        Masks::over(sys, &masks.private_dir, d)?;
    }
    Ok(())
}

/// The one writable tmpfs, capped at `size_mb`, staged at [`RW`] with its
/// three views' directories (workspace, tmp, shm); `/tmp` is bound from it
/// here, `/dev/shm` and the workspace later. Returns where it is staged.
fn writable_tmpfs(sys: &mut impl Sys, size_mb: u64) -> Result<&'static Path, PlanError> {
    let rw = Path::new(RW);
    sys.mkdir_all(rw).step(|| "mkdir /.rw".into())?;
    sys.mount_tmpfs(
        rw,
        size_mb,
        Some(tmpfs_inodes(size_mb)),
        0o755,
        ATTR_NOSUID | ATTR_NODEV,
    )
    .step(|| "writable tmpfs".into())?;
    for (dir, mode) in [("workspace", 0o755), ("tmp", 0o1777), ("shm", 0o1777)] {
        let d = rw.join(dir);
        sys.mkdir_all(&d)
            .step(|| format!("mkdir {}", d.display()))?;
        sys.chmod(&d, mode)
            .step(|| format!("chmod {}", d.display()))?;
    }
    let tmp = Path::new("/tmp");
    sys.mkdir_all(tmp).step(|| "mkdir /tmp".into())?;
    sys.bind(&rw.join("tmp"), tmp).step(|| "bind /tmp".into())?;
    sys.set_attrs(tmp, ATTR_NOSUID | ATTR_NODEV, false)
        .step(|| "attrs /tmp".into())?;
    Ok(rw)
}

/// `/dev`: a read-only tmpfs with the host's [`DEVICES`] that exist, the fd
/// symlinks, and `/dev/shm` (a view of the writable tmpfs at `rw`).
fn minimal_dev(sys: &mut impl Sys, rw: &Path) -> Result<(), PlanError> {
    let dev = Path::new("/dev");
    sys.mkdir_all(dev).step(|| "mkdir /dev".into())?;
    sys.mount_tmpfs(dev, 1, Some(64), 0o755, ATTR_NOSUID | ATTR_NOEXEC)
        .step(|| "tmpfs /dev".into())?;
    for d in DEVICES {
        let node = dev.join(d);
        let host = old(&node);
        if sys.kind(&host) == Kind::Missing {
            continue;
        }
        sys.touch(&node)
            .step(|| format!("create {}", node.display()))?;
        sys.bind(&host, &node)
            .step(|| format!("bind {}", node.display()))?;
        sys.set_attrs(&node, ATTR_NOSUID | ATTR_NOEXEC, false)
            .step(|| format!("attrs {}", node.display()))?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        sys.symlink(Path::new(target), &dev.join(link))
            .step(|| format!("symlink /dev/{link}"))?;
    }
    let shm = dev.join("shm");
    sys.mkdir_all(&shm).step(|| "mkdir /dev/shm".into())?;
    sys.bind(&rw.join("shm"), &shm)
        .step(|| "bind /dev/shm".into())?;
    sys.set_attrs(&shm, ATTR_NOSUID | ATTR_NODEV | ATTR_NOEXEC, false)
        .step(|| "attrs /dev/shm".into())?;
    sys.set_attrs(dev, ATTR_RDONLY | ATTR_NOSUID | ATTR_NOEXEC, false)
        .step(|| "read-only /dev".into())
}

/// A fresh `/proc` (while the host's is still visible under [`OLD`], which
/// the kernel requires of a user namespace mounting proc), with
/// [`PROC_READONLY`] read-only and the kernel-information entries masked.
fn fresh_proc(sys: &mut impl Sys, masks: &Masks) -> Result<(), PlanError> {
    let proc_ = Path::new("/proc");
    sys.mkdir_all(proc_).step(|| "mkdir /proc".into())?;
    sys.mount_proc(proc_).step(|| "mount /proc".into())?;
    // Before `/proc/sys` turns read-only. Where the host forbids it the
    // sandbox starts all the same: its runtime then says it cannot listen
    // on the plane's low ports.
    let _ = sys.write(Path::new(UNPRIVILEGED_PORT_START), "0");
    for p in PROC_READONLY {
        let p = Path::new(p);
        if sys.kind(p) == Kind::Missing {
            continue;
        }
        sys.bind(p, p).step(|| format!("bind {}", p.display()))?;
        sys.set_attrs(p, RO, true)
            .step(|| format!("read-only {}", p.display()))?;
    }
    for f in PROC_MASKED_FILES {
        let f = Path::new(f);
        if sys.kind(f) == Kind::File {
            Masks::over(sys, &masks.null, f)?;
        }
    }
    for d in PROC_MASKED_DIRS {
        let d = Path::new(d);
        if sys.kind(d) == Kind::Dir {
            Masks::over(sys, &masks.empty_dir, d)?;
        }
    }
    Ok(())
}

/// One of the run's own paths inside the sandbox.
enum RunPath {
    Workspace,
    Sockets,
    Exe,
    Ro,
}

/// The run's own paths (workspace, sockets, the binary, `ro_paths`),
/// parents before children.
fn bind_run_paths(sys: &mut impl Sys, cfg: &InitConfig, trees: &Trees) -> Result<(), PlanError> {
    let sockets = Path::new(SOCKETS_INSIDE);
    let mut paths: Vec<(&Path, RunPath)> = vec![
        (&cfg.workspace, RunPath::Workspace),
        (sockets, RunPath::Sockets),
        (Path::new(EXE_INSIDE), RunPath::Exe),
    ];
    paths.extend(cfg.ro_paths.iter().map(|p| (p.as_path(), RunPath::Ro)));
    paths.sort_by_key(|(p, _)| p.components().count());
    for (path, what) in paths {
        let (host, attrs) = match what {
            RunPath::Workspace => (None, ATTR_NOSUID | ATTR_NODEV),
            RunPath::Sockets => (Some(cfg.sockets_dir.as_path()), RO | ATTR_NOEXEC),
            RunPath::Exe => (Some(cfg.exe.as_path()), RO),
            RunPath::Ro => (Some(path), RO),
        };
        bind_run_path(sys, path, host, attrs, trees)?;
    }
    Ok(())
}

/// `path` inside the sandbox, from the host path `host` (a copy taken
/// while root when `trees` holds one) or, for the workspace, the writable
/// tmpfs; then `attrs` on it, recursively.
fn bind_run_path(
    sys: &mut impl Sys,
    path: &Path,
    host: Option<&Path>,
    attrs: u64,
    trees: &Trees,
) -> Result<(), PlanError> {
    let tree = host.and_then(|h| trees.get(h));
    let source = match host {
        None => Path::new(RW).join("workspace"),
        Some(h) => old(h),
    };
    let kind = match tree {
        Some((kind, _)) => kind,
        None => sys.kind(&source),
    };
    match kind {
        Kind::Dir => sys
            .mkdir_all(path)
            .step(|| format!("mkdir {}", path.display()))?,
        Kind::File => {
            if let Some(parent) = path.parent() {
                sys.mkdir_all(parent)
                    .step(|| format!("mkdir {}", parent.display()))?;
            }
            if sys.kind(path) == Kind::Missing {
                sys.touch(path)
                    .step(|| format!("create {}", path.display()))?;
            }
        }
        Kind::Symlink | Kind::Missing => {
            return Err(PlanError {
                step: format!("{} on the host", source.display()),
                source: std::io::ErrorKind::NotFound.into(),
            });
        }
    }
    match tree {
        Some((_, fd)) => sys
            .attach(fd, path)
            .step(|| format!("attach {}", path.display()))?,
        None => sys
            .bind(&source, path)
            .step(|| format!("bind {}", path.display()))?,
    }
    sys.set_attrs(path, attrs, true)
        .step(|| format!("attrs {}", path.display()))?;
    Ok(())
}

/// Unmounts what only the setup needed: the host's tree, the writable
/// tmpfs's staging mount (its views stay), the masks' sources.
fn drop_staging(sys: &mut impl Sys, rw: &Path) -> Result<(), PlanError> {
    sys.detach(Path::new(OLD))
        .step(|| "detach oldroot".into())?;
    sys.rmdir(Path::new(OLD)).step(|| "rmdir oldroot".into())?;
    sys.detach(rw).step(|| "detach /.rw".into())?;
    sys.rmdir(rw).step(|| "rmdir /.rw".into())?;
    sys.detach(Path::new(MASKS))
        .step(|| "detach /.masks".into())?;
    sys.rmdir(Path::new(MASKS)).step(|| "rmdir /.masks".into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::sys::record::Recorder;
    use super::*;

    /// A rootless run's header.
    pub(crate) fn cfg() -> InitConfig {
        InitConfig {
            parent_pid: 1,
            cgroups: vec![],
            command: vec!["/usr/bin/true".into()],
            env: vec![],
            sockets_dir: "/var/lib/airlock/runs/r1/sock".into(),
            exe: "/opt/airlock/bin/airlock".into(),
            ro_paths: vec!["/srv/agent".into()],
            workspace: "/workspace".into(),
            workspace_size_mb: 16,
            ids: super::super::config::HostIds {
                uid: 1,
                gid: 1,
                switch: false,
            },
        }
    }

    /// A merged-usr host holding the run's paths.
    pub(crate) fn host() -> Recorder {
        let mut r = Recorder::default();
        for (p, k) in [
            ("/oldroot/usr", Kind::Dir),
            ("/oldroot/etc", Kind::Dir),
            ("/oldroot/bin", Kind::Symlink),
            ("/oldroot/lib64", Kind::Symlink),
            ("/oldroot/etc/shadow", Kind::File),
            ("/oldroot/etc/resolv.conf", Kind::File),
            ("/oldroot/dev/null", Kind::File),
            ("/oldroot/dev/urandom", Kind::File),
            ("/oldroot/var/lib/airlock/runs/r1/sock", Kind::Dir),
            ("/oldroot/opt/airlock/bin/airlock", Kind::File),
            ("/oldroot/opt/airlock/bin/airlock-sidecar", Kind::File),
            ("/oldroot/srv/agent", Kind::Dir),
        ] {
            r.host.insert(p.into(), k);
        }
        r.links.insert("/oldroot/bin".into(), "usr/bin".into());
        r.links.insert("/oldroot/lib64".into(), "usr/lib64".into());
        r
    }

    pub(crate) fn pos(ops: &[String], needle: &str) -> usize {
        ops.iter()
            .position(|o| o == needle)
            .unwrap_or_else(|| panic!("missing {needle:?} in {ops:#?}"))
    }

    #[test]
    fn builds_the_documented_root_in_order() {
        let mut r = host();
        build_root(&mut r, &cfg(), &Trees::default()).unwrap();
        let ops = &r.ops;
        // pivot first, into a tmpfs, keeping the host at /oldroot
        assert_eq!(ops[0], "private /");
        assert_eq!(ops[1], "tmpfs /tmp 1m 755 6");
        assert!(pos(ops, "pivot /tmp /tmp/oldroot") < pos(ops, "bind /oldroot/usr /usr"));
        // system dirs read-only (rdonly|nosuid|nodev, recursive), symlinks kept
        assert!(pos(ops, "bind /oldroot/usr /usr") < pos(ops, "attrs /usr 7 rec"));
        pos(ops, "attrs /etc 7 rec");
        pos(ops, "symlink /bin usr/bin");
        pos(ops, "symlink /lib64 usr/lib64");
        assert!(
            !ops.iter()
                .any(|o| o.contains("/sbin") || o.contains("/lib32")),
            "absent host dirs are skipped"
        );
        // secrets masked: one bind each, from a source already read-only
        // (rdonly|nosuid|nodev: a bind takes its source mount's flags)
        let null_ro = pos(ops, "attrs /.masks/null 7");
        assert!(pos(ops, "bind /oldroot/dev/null /.masks/null") < null_ro);
        assert!(pos(ops, "attrs /.masks 7") < null_ro);
        assert!(null_ro < pos(ops, "bind /.masks/null /etc/shadow"));
        pos(ops, "chmod /.masks/d700 700");
        // the transparent plane: its resolver file written before the masks
        // turn read-only, bound over the host's; low ports while /proc/sys
        // is still writable
        let resolv = format!("write /.masks/resolv.conf {}", resolv_conf());
        assert!(pos(ops, &resolv) < pos(ops, "attrs /.masks 7"));
        pos(ops, "bind /.masks/resolv.conf /etc/resolv.conf");
        let ports = pos(ops, "write /proc/sys/net/ipv4/ip_unprivileged_port_start 0");
        assert!(pos(ops, "proc /proc") < ports);
        assert!(ports < pos(ops, "attrs /proc/sys 7 rec"));
        pos(ops, "chmod /.masks/d555 555");
        let masks_ro = pos(ops, "attrs /.masks 7");
        for (i, o) in ops.iter().enumerate() {
            if o.starts_with("bind /.masks/") {
                assert!(
                    i > null_ro && i > masks_ro,
                    "{o} before its source is read-only"
                );
            }
            if o.starts_with("touch /.masks") || o.starts_with("mkdir /.masks/") {
                assert!(i < masks_ro, "{o} after /.masks is read-only");
            }
        }
        // ONE capped tmpfs takes every write: workspace, /tmp and /dev/shm are views of it
        let rw = pos(ops, "tmpfs /.rw 16m 4096i 755 6");
        pos(ops, "chmod /.rw/tmp 1777");
        pos(ops, "chmod /.rw/shm 1777");
        assert!(rw < pos(ops, "bind /.rw/tmp /tmp"));
        assert!(rw < pos(ops, "bind /.rw/shm /dev/shm"));
        assert!(rw < pos(ops, "bind /.rw/workspace /workspace"));
        assert_eq!(
            ops.iter()
                .filter(|o| o.starts_with("tmpfs") && !o.contains(" 1m "))
                .count(),
            1,
            "no other sizeable tmpfs: {ops:#?}"
        );
        pos(ops, "attrs /workspace 6 rec");
        // devices: only those that exist on the host, not nodev
        pos(ops, "bind /oldroot/dev/null /dev/null");
        pos(ops, "attrs /dev/null a");
        assert!(!ops.iter().any(|o| o.contains("/dev/zero")));
        pos(ops, "attrs /dev b");
        // proc before the host's root goes away, its sysctl tree read-only,
        // the kernel-information files masked
        assert!(pos(ops, "proc /proc") < pos(ops, "detach /oldroot"));
        assert!(pos(ops, "bind /proc/sys /proc/sys") < pos(ops, "attrs /proc/sys 7 rec"));
        for f in [
            "/proc/keys",
            "/proc/timer_list",
            "/proc/kcore",
            "/proc/slabinfo",
        ] {
            let b = pos(ops, &format!("bind /.masks/null {f}"));
            assert!(pos(ops, "proc /proc") < b);
        }
        assert!(pos(ops, "proc /proc") < pos(ops, "bind /.masks/d555 /proc/acpi"));
        // the sockets: read-only (and noexec) at the fixed path, never the run directory
        let socks = pos(
            ops,
            "bind /oldroot/var/lib/airlock/runs/r1/sock /run/airlock",
        );
        assert!(socks < pos(ops, "attrs /run/airlock f rec"));
        // the binary: the file alone, read-only (not noexec) over a created
        // mount point at the fixed path, nothing of its host directory
        let f = pos(ops, "touch /.airlock/airlock");
        assert!(f > pos(ops, "mkdir /.airlock"));
        assert!(
            f < pos(
                ops,
                "bind /oldroot/opt/airlock/bin/airlock /.airlock/airlock"
            )
        );
        pos(ops, "attrs /.airlock/airlock 7 rec");
        assert!(
            !ops.iter().any(|o| o.contains("airlock-sidecar")
                || o.ends_with(" /opt/airlock/bin")
                || o.contains(" /opt")),
            "nothing of the binary's directory: {ops:#?}"
        );
        // ro_path: a directory, bound read-only at its own path
        pos(ops, "bind /oldroot/srv/agent /srv/agent");
        pos(ops, "attrs /srv/agent 7 rec");
        // the end: host gone, staging mount gone, root read-only, in the workspace
        let n = ops.len();
        assert_eq!(
            &ops[n - 8..],
            [
                "detach /oldroot",
                "rmdir /oldroot",
                "detach /.rw",
                "rmdir /.rw",
                "detach /.masks",
                "rmdir /.masks",
                "attrs / 7",
                "chdir /workspace"
            ]
        );
        // no host directory other than those asked for is ever bound, and
        // nothing of the host is bound writable
        for o in ops.iter().filter(|o| o.starts_with("bind /oldroot")) {
            let src = o.split(' ').nth(1).unwrap();
            assert!(
                [
                    "/oldroot/usr",
                    "/oldroot/etc",
                    "/oldroot/dev/",
                    "/oldroot/var/lib/airlock/runs/r1/sock",
                    "/oldroot/opt/airlock/bin/airlock",
                    "/oldroot/srv/agent"
                ]
                .iter()
                .any(|a| src.starts_with(a)),
                "unexpected bind {o}"
            );
        }
        for (i, o) in ops.iter().enumerate() {
            let Some(rest) = o.strip_prefix("bind /oldroot/") else {
                continue;
            };
            if rest.starts_with("dev/") {
                continue; // device nodes: their own permission checks
            }
            let target = o.split(' ').nth(2).unwrap();
            let attrs = ops[i + 1..]
                .iter()
                .find(|a| a.starts_with(&format!("attrs {target} ")))
                .unwrap_or_else(|| panic!("no attrs for {o}"));
            let bits = u64::from_str_radix(attrs.split(' ').nth(2).unwrap(), 16).unwrap();
            assert!(bits & ATTR_RDONLY != 0, "{o} is writable: {attrs}");
        }
    }

    #[test]
    fn the_host_ssh_private_keys_are_masked_and_their_public_halves_kept() {
        let mut r = host();
        r.dirs.insert(
            "/oldroot/etc/ssh".into(),
            vec![
                "ssh_host_ed25519_key".into(),
                "ssh_host_ed25519_key.pub".into(),
                "sshd_config".into(),
            ],
        );
        build_root(&mut r, &cfg(), &Trees::default()).unwrap();
        let ops = &r.ops;
        let key = pos(ops, "bind /.masks/null /etc/ssh/ssh_host_ed25519_key");
        assert!(pos(ops, "attrs /.masks/null 7") < key);
        assert!(
            !ops.iter()
                .any(|o| o.contains("ssh_host_ed25519_key.pub") || o.contains("sshd_config")),
            "{ops:#?}"
        );
    }

    #[test]
    fn a_missing_run_path_is_an_error_not_a_silent_skip() {
        let mut r = host();
        let mut c = cfg();
        c.ro_paths = vec!["/nope".into()];
        let e = build_root(&mut r, &c, &Trees::default()).unwrap_err();
        assert!(e.step.contains("/nope"), "{e}");
    }

    #[test]
    fn a_root_platform_attaches_copies_taken_while_root() {
        let mut r = host();
        let c = cfg();
        let shared = [
            c.sockets_dir.as_path(),
            c.exe.as_path(),
            c.ro_paths[0].as_path(),
        ];
        // taken from the host paths themselves (init is still root, in the host's view)
        r.host.insert(c.sockets_dir.clone(), Kind::Dir);
        r.host.insert(c.exe.clone(), Kind::File);
        r.host.insert(c.ro_paths[0].clone(), Kind::Dir);
        let trees = Trees::detach(&r, &shared).unwrap();
        build_root(&mut r, &c, &trees).unwrap();
        let ops = &r.ops;
        let a = pos(ops, "attach /run/airlock");
        assert!(a < pos(ops, "attrs /run/airlock f rec"));
        let f = pos(ops, "touch /.airlock/airlock");
        assert!(f < pos(ops, "attach /.airlock/airlock"));
        pos(ops, "attach /srv/agent");
        assert!(
            !ops.iter()
                .any(|o| o.starts_with("bind /oldroot/var/lib/airlock")
                    || o.starts_with("bind /oldroot/opt")
                    || o.starts_with("bind /oldroot/srv")),
            "no path-based bind of a shared path: {ops:#?}"
        );
        // a symlink is never shared
        r.host.insert("/evil".into(), Kind::Symlink);
        assert!(Trees::detach(&r, &[Path::new("/evil")]).is_err());
    }
}

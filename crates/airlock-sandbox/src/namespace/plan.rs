//! The filesystem the sandbox sees, built step by step through [`Sys`] so the
//! sequence is unit-tested without root.
//!
//! Layout (everything else of the host is absent):
//! - `/usr`, `/etc` and the `/bin`, `/sbin`, `/lib*` entries (symlinks into
//!   `/usr` on merged-usr hosts) read-only, nosuid, nodev: programs and
//!   their libraries, the loader cache, passwd/nsswitch, CA certificates.
//!   Host secrets in `/etc` that root could read (shadow, gshadow, sudoers,
//!   SSH host keys, ssl/private) are masked. No `/home`, `/root`, `/var`,
//!   `/run` (host daemons' sockets), `/sys`, `/boot`, host `/tmp`.
//! - `/proc` fresh for the new PID namespace, with `sys`, `sysrq-trigger`,
//!   `irq`, `bus`, `fs` read-only.
//! - `/dev`: a read-only tmpfs with null, zero, full, random, urandom, tty,
//!   the fd symlinks and a small `/dev/shm`.
//! - `/tmp`: a private tmpfs.
//! - `run_dir` read-write at the same path, `ro_paths` read-only at the same
//!   path, `workspace` a tmpfs capped at `workspace_size_mb`.
//! - `/` itself: a read-only tmpfs holding the mount points.

use std::path::{Path, PathBuf};

use super::config::InitConfig;
use super::sys::{ATTR_NODEV, ATTR_NOEXEC, ATTR_NOSUID, ATTR_RDONLY, Kind, Sys};

/// Where the host's root sits while the new root is populated.
const OLD: &str = "/oldroot";
/// The mount point turned into the new root (only inside our mount namespace).
const BASE: &str = "/tmp";

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
const PROC_READONLY: &[&str] = &[
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
];

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

/// Builds the sandbox's root and leaves the process in the workspace.
/// Runs as PID 1 of the new PID namespace, inside the new mount namespace.
pub fn build_root(sys: &mut impl Sys, cfg: &InitConfig) -> Result<(), PlanError> {
    let ro = ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV;
    sys.make_private(Path::new("/"))
        .step(|| "make / private".into())?;
    sys.mount_tmpfs(Path::new(BASE), 1, 0o755, ATTR_NOSUID | ATTR_NODEV)
        .step(|| "new root tmpfs".into())?;
    sys.chdir(Path::new(BASE))
        .step(|| "chdir new root".into())?;
    let put_old = Path::new(BASE).join(OLD.trim_start_matches('/'));
    sys.mkdir_all(&put_old).step(|| "mkdir oldroot".into())?;
    sys.pivot_root(Path::new(BASE), &put_old)
        .step(|| "pivot_root".into())?;
    sys.chdir(Path::new("/")).step(|| "chdir /".into())?;

    // System directories, read-only.
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
                sys.set_attrs(dir, ro, true)
                    .step(|| format!("read-only {}", dir.display()))?;
            }
            Kind::File | Kind::Missing => {}
        }
    }
    for f in MASKED_FILES {
        let f = Path::new(f);
        if sys.kind(&old(f)) == Kind::File {
            sys.bind(&old(Path::new("/dev/null")), f)
                .step(|| format!("mask {}", f.display()))?;
            sys.set_attrs(f, ro, false)
                .step(|| format!("mask {}", f.display()))?;
        }
    }
    let mut masked_dirs: Vec<PathBuf> = MASKED_DIRS.iter().map(PathBuf::from).collect();
    if let Ok(keys) = std::fs::read_dir(old(Path::new("/etc/ssh"))) {
        // Host private keys: /etc/ssh/ssh_host_*_key (the .pub files may stay).
        for e in keys.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("ssh_host_") && name.ends_with("_key") {
                let f = Path::new("/etc/ssh").join(name);
                sys.bind(&old(Path::new("/dev/null")), &f)
                    .step(|| format!("mask {}", f.display()))?;
                sys.set_attrs(&f, ro, false)
                    .step(|| format!("mask {}", f.display()))?;
            }
        }
    }
    masked_dirs.retain(|d| sys.kind(&old(d)) == Kind::Dir);
    for d in &masked_dirs {
        sys.mount_tmpfs(d, 1, 0o700, ro)
            .step(|| format!("mask {}", d.display()))?;
        sys.set_attrs(d, ro, false)
            .step(|| format!("mask {}", d.display()))?;
    }

    // Private /tmp.
    sys.mkdir_all(Path::new("/tmp"))
        .step(|| "mkdir /tmp".into())?;
    sys.mount_tmpfs(
        Path::new("/tmp"),
        cfg.tmp_size_mb,
        0o1777,
        ATTR_NOSUID | ATTR_NODEV,
    )
    .step(|| "tmpfs /tmp".into())?;

    // Minimal /dev.
    let dev = Path::new("/dev");
    sys.mkdir_all(dev).step(|| "mkdir /dev".into())?;
    sys.mount_tmpfs(dev, 1, 0o755, ATTR_NOSUID | ATTR_NOEXEC)
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
    sys.mount_tmpfs(
        &shm,
        cfg.tmp_size_mb,
        0o1777,
        ATTR_NOSUID | ATTR_NODEV | ATTR_NOEXEC,
    )
    .step(|| "tmpfs /dev/shm".into())?;
    sys.set_attrs(dev, ATTR_RDONLY | ATTR_NOSUID | ATTR_NOEXEC, false)
        .step(|| "read-only /dev".into())?;

    // Fresh /proc (while the host's /proc is still visible under /oldroot,
    // which the kernel requires of a user namespace mounting proc).
    let proc_ = Path::new("/proc");
    sys.mkdir_all(proc_).step(|| "mkdir /proc".into())?;
    sys.mount_proc(proc_).step(|| "mount /proc".into())?;
    for p in PROC_READONLY {
        let p = Path::new(p);
        if sys.kind(p) == Kind::Missing {
            continue;
        }
        sys.bind(p, p).step(|| format!("bind {}", p.display()))?;
        sys.set_attrs(p, ro, true)
            .step(|| format!("read-only {}", p.display()))?;
    }

    // The run's own paths, parents before children.
    enum What {
        Workspace,
        RunDir,
        Ro,
    }
    let mut paths: Vec<(&Path, What)> = vec![
        (&cfg.workspace, What::Workspace),
        (&cfg.run_dir, What::RunDir),
    ];
    paths.extend(cfg.ro_paths.iter().map(|p| (p.as_path(), What::Ro)));
    paths.sort_by_key(|(p, _)| p.components().count());
    for (path, what) in paths {
        match what {
            What::Workspace => {
                sys.mkdir_all(path)
                    .step(|| format!("mkdir workspace {}", path.display()))?;
                sys.mount_tmpfs(path, cfg.workspace_size_mb, 0o755, ATTR_NOSUID | ATTR_NODEV)
                    .step(|| format!("tmpfs workspace {}", path.display()))?;
            }
            What::RunDir | What::Ro => {
                let host = old(path);
                match sys.kind(&host) {
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
                            step: format!("{} on the host", path.display()),
                            source: std::io::ErrorKind::NotFound.into(),
                        });
                    }
                }
                sys.bind(&host, path)
                    .step(|| format!("bind {}", path.display()))?;
                let attrs = if matches!(what, What::Ro) {
                    ro
                } else {
                    ATTR_NOSUID | ATTR_NODEV
                };
                sys.set_attrs(path, attrs, true)
                    .step(|| format!("attrs {}", path.display()))?;
            }
        }
    }

    sys.detach(Path::new(OLD))
        .step(|| "detach oldroot".into())?;
    sys.rmdir(Path::new(OLD)).step(|| "rmdir oldroot".into())?;
    sys.set_attrs(Path::new("/"), ro, false)
        .step(|| "read-only /".into())?;
    sys.chdir(&cfg.workspace)
        .step(|| "chdir workspace".into())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io;

    use super::*;

    /// Records every operation; `host` says what exists under /oldroot.
    #[derive(Default)]
    struct Rec {
        ops: Vec<String>,
        host: BTreeMap<PathBuf, Kind>,
        links: BTreeMap<PathBuf, PathBuf>,
    }

    impl Sys for Rec {
        fn make_private(&mut self, t: &Path) -> io::Result<()> {
            self.ops.push(format!("private {}", t.display()));
            Ok(())
        }
        fn mount_tmpfs(&mut self, t: &Path, size: u64, mode: u32, attrs: u64) -> io::Result<()> {
            self.ops
                .push(format!("tmpfs {} {size}m {mode:o} {attrs:x}", t.display()));
            Ok(())
        }
        fn bind(&mut self, s: &Path, t: &Path) -> io::Result<()> {
            self.ops
                .push(format!("bind {} {}", s.display(), t.display()));
            Ok(())
        }
        fn set_attrs(&mut self, t: &Path, attrs: u64, rec: bool) -> io::Result<()> {
            self.ops.push(format!(
                "attrs {} {attrs:x}{}",
                t.display(),
                if rec { " rec" } else { "" }
            ));
            Ok(())
        }
        fn mount_proc(&mut self, t: &Path) -> io::Result<()> {
            self.ops.push(format!("proc {}", t.display()));
            Ok(())
        }
        fn pivot_root(&mut self, n: &Path, o: &Path) -> io::Result<()> {
            self.ops
                .push(format!("pivot {} {}", n.display(), o.display()));
            Ok(())
        }
        fn detach(&mut self, t: &Path) -> io::Result<()> {
            self.ops.push(format!("detach {}", t.display()));
            Ok(())
        }
        fn mkdir_all(&mut self, p: &Path) -> io::Result<()> {
            self.ops.push(format!("mkdir {}", p.display()));
            Ok(())
        }
        fn rmdir(&mut self, p: &Path) -> io::Result<()> {
            self.ops.push(format!("rmdir {}", p.display()));
            Ok(())
        }
        fn touch(&mut self, p: &Path) -> io::Result<()> {
            self.ops.push(format!("touch {}", p.display()));
            Ok(())
        }
        fn symlink(&mut self, t: &Path, l: &Path) -> io::Result<()> {
            self.ops
                .push(format!("symlink {} {}", l.display(), t.display()));
            Ok(())
        }
        fn chdir(&mut self, p: &Path) -> io::Result<()> {
            self.ops.push(format!("chdir {}", p.display()));
            Ok(())
        }
        fn kind(&self, p: &Path) -> Kind {
            if p.starts_with("/proc") {
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
    }

    fn cfg() -> InitConfig {
        InitConfig {
            parent_pid: 1,
            cgroup_procs: vec![],
            command: vec!["/usr/bin/true".into()],
            env: vec![],
            run_dir: "/tmp/runs/r1".into(),
            ro_paths: vec!["/opt/airlock/bin/airlock".into()],
            workspace: "/tmp/runs/r1/ws".into(),
            workspace_size_mb: 16,
            tmp_size_mb: 8,
        }
    }

    fn host() -> Rec {
        let mut r = Rec::default();
        for (p, k) in [
            ("/oldroot/usr", Kind::Dir),
            ("/oldroot/etc", Kind::Dir),
            ("/oldroot/bin", Kind::Symlink),
            ("/oldroot/lib64", Kind::Symlink),
            ("/oldroot/etc/shadow", Kind::File),
            ("/oldroot/dev/null", Kind::File),
            ("/oldroot/dev/urandom", Kind::File),
            ("/oldroot/tmp/runs/r1", Kind::Dir),
            ("/oldroot/opt/airlock/bin/airlock", Kind::File),
        ] {
            r.host.insert(p.into(), k);
        }
        r.links.insert("/oldroot/bin".into(), "usr/bin".into());
        r.links.insert("/oldroot/lib64".into(), "usr/lib64".into());
        r
    }

    fn pos(ops: &[String], needle: &str) -> usize {
        ops.iter()
            .position(|o| o == needle)
            .unwrap_or_else(|| panic!("missing {needle:?} in {ops:#?}"))
    }

    #[test]
    fn builds_the_documented_root_in_order() {
        let mut r = host();
        build_root(&mut r, &cfg()).unwrap();
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
        // secrets masked
        assert!(pos(ops, "bind /oldroot/dev/null /etc/shadow") < pos(ops, "attrs /etc/shadow 7"));
        // devices: only those that exist on the host, not nodev
        pos(ops, "bind /oldroot/dev/null /dev/null");
        pos(ops, "attrs /dev/null a");
        assert!(!ops.iter().any(|o| o.contains("/dev/zero")));
        pos(ops, "attrs /dev b");
        // proc before the host's root goes away, its sysctl tree read-only
        assert!(pos(ops, "proc /proc") < pos(ops, "detach /oldroot"));
        assert!(pos(ops, "bind /proc/sys /proc/sys") < pos(ops, "attrs /proc/sys 7 rec"));
        // /tmp tmpfs before run_dir (which lives under /tmp), run_dir before the workspace inside it
        let tmp = pos(ops, "tmpfs /tmp 8m 1777 6");
        let run = pos(ops, "bind /oldroot/tmp/runs/r1 /tmp/runs/r1");
        let ws = pos(ops, "tmpfs /tmp/runs/r1/ws 16m 755 6");
        assert!(tmp < run && run < ws);
        assert!(
            run < pos(ops, "attrs /tmp/runs/r1 6 rec"),
            "run_dir read-write but nosuid/nodev"
        );
        // ro_path: a file, bound read-only over a created mount point
        let f = pos(ops, "touch /opt/airlock/bin/airlock");
        assert!(
            f < pos(
                ops,
                "bind /oldroot/opt/airlock/bin/airlock /opt/airlock/bin/airlock"
            )
        );
        pos(ops, "attrs /opt/airlock/bin/airlock 7 rec");
        // the end: host gone, root read-only, in the workspace
        let n = ops.len();
        assert_eq!(
            &ops[n - 4..],
            [
                "detach /oldroot",
                "rmdir /oldroot",
                "attrs / 7",
                "chdir /tmp/runs/r1/ws"
            ]
        );
        // no host directory other than those asked for is ever bound
        for o in ops.iter().filter(|o| o.starts_with("bind /oldroot")) {
            let src = o.split(' ').nth(1).unwrap();
            assert!(
                [
                    "/oldroot/usr",
                    "/oldroot/etc",
                    "/oldroot/dev/",
                    "/oldroot/tmp/runs/r1",
                    "/oldroot/opt/airlock/bin/airlock"
                ]
                .iter()
                .any(|a| src.starts_with(a)),
                "unexpected bind {o}"
            );
        }
    }

    #[test]
    fn a_missing_run_path_is_an_error_not_a_silent_skip() {
        let mut r = host();
        let mut c = cfg();
        c.ro_paths = vec!["/nope".into()];
        let e = build_root(&mut r, &c).unwrap_err();
        assert!(e.step.contains("/nope"), "{e}");
    }
}

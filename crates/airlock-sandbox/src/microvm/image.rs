//! The microVM guest image, made on this machine from Debian's packages
//! (no registry): `airlock images build --microvm`.
//!
//! In [`images_dir`], three files make a guest:
//! - `kernel-<release>` — either the minimal kernel built here from
//!   Debian's `linux-source` ([`super::kernel`]; release
//!   `min-<version>-<fragment hash>`, every driver built in), or Debian's
//!   `linux-image-cloud-amd64` kernel (fetched with `apt-get download`,
//!   extracted, never installed on the host), whose virtio drivers are
//!   modules. Either way the guest boots through
//! - `initrd-<release>.cpio` — a tiny initramfs: Debian's static
//!   `busybox`, for Debian's kernel the five virtio modules ([`MODULES`]),
//!   and [`STAGE1`], a script that loads them (if any), mounts the root
//!   read-only and hands PID 1 to `airlock vm-init` in it;
//! - `root-<tag>.ext4` — the root filesystem, attached read-only: the same
//!   Debian root the docker agent image is built from (`mmdebstrap`,
//!   [`BASE_PACKAGES`]: python3 and the CA certificates), plus this build's
//!   `airlock` binary at [`EXE_IN_GUEST`]. `<tag>` is the docker images' tag
//!   ([`default_tag`]: version and build id), so the version contract is
//!   the same: a guest runs the runtime of the platform that boots it, and a
//!   rebuilt binary gets a new root.
//!
//! The base root is cached beside them (`base-<BASE_TAG>/`); a rebuild of the
//! binary only writes a new root image from it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::kernel::{self, KernelChoice, KernelKind};
use crate::docker::images::{BASE_PACKAGES, BASE_SUITE, BASE_TAG, default_tag};

/// Where the guest images live: `MICROVM_IMAGES_DIR`, else
/// `/var/cache/airlock/microvm` for root (the VMM's own uid reads it, so
/// not under root's home) or `$HOME/.cache/airlock/microvm` (a cache:
/// everything in it can be built again).
pub const ENV_MICROVM_IMAGES_DIR: &str = "MICROVM_IMAGES_DIR";

/// The Debian package whose dependency names the kernel.
pub const KERNEL_PACKAGE: &str = "linux-image-cloud-amd64";
/// The static busybox of the initramfs.
pub const BUSYBOX_PACKAGE: &str = "busybox-static";
/// The kernel modules the guest needs before its root, in load order (each
/// after the ones whose symbols it uses).
pub const MODULES: [&str; 5] = [
    "kernel/drivers/virtio/virtio_ring.ko",
    "kernel/drivers/virtio/virtio.ko",
    "kernel/drivers/virtio/virtio_mmio.ko",
    "kernel/drivers/block/virtio_blk.ko",
    "kernel/drivers/char/virtio_console.ko",
];
/// The `airlock` binary inside the guest (on its read-only root).
pub const EXE_IN_GUEST: &str = "/.airlock/airlock";
/// The guest init's subcommand.
pub const VM_INIT_SUBCOMMAND: &str = "vm-init";

/// The initramfs's `/init`: loads the modules, mounts the root (the first
/// virtio disk) read-only, and makes `airlock vm-init` PID 1 in it. Nothing
/// of a run is here: the run's header and secrets come over the channel.
pub const STAGE1: &str = r#"#!/bin/busybox sh
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox mount -t sysfs sys /sys
for m in /lib/modules/*.ko; do [ -e "$m" ] || continue; /bin/busybox insmod "$m" || exit 1; done
root=
n=0
while [ -z "$root" ] && [ $n -lt 500 ]; do
  for b in /sys/block/vd*; do
    [ "$(/bin/busybox cat $b/serial 2>/dev/null)" = airlock-root ] && root=/dev/${b##*/}
  done
  [ -z "$root" ] && /bin/busybox usleep 10000
  n=$((n+1))
done
/bin/busybox umount /sys
/bin/busybox mount -t ext4 -o ro,noatime,noload "$root" /newroot || exit 1
/bin/busybox mount --move /dev /newroot/dev
exec /bin/busybox switch_root /newroot /.airlock/airlock vm-init
"#;

/// The guest's three files, where they are (present or not).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GuestImage {
    /// Which kernel `kernel` is (the machine's devices are described for it).
    pub kind: KernelKind,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub root: PathBuf,
}

/// Why the guest image could not be found or built: one variant per step.
#[derive(Debug, thiserror::Error)]
pub enum GuestImageError {
    #[error(
        "{ENV_MICROVM_IMAGES_DIR} is unset and so is HOME: name a directory for the microVM images"
    )]
    NoDir,
    #[error("cannot run {program}: {source} (install it: apt-get install {package})")]
    Missing {
        program: &'static str,
        package: &'static str,
        source: std::io::Error,
    },
    #[error("{what} failed ({status}): {stderr}")]
    Step {
        what: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error(
        "apt knows no {0} here: run `apt-get update` (the guest's kernel and busybox are Debian's packages)"
    )]
    NoPackage(String),
    #[error("{}: {source}", .path.display())]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the microVM guest image for this build is not in {}: build it with `airlock images build --microvm`",
        .0.display()
    )]
    NotBuilt(PathBuf),
    #[error("the minimal kernel's configuration lacks what its fragment asks for: {0}")]
    KernelConfig(String),
    #[error(transparent)]
    Choice(#[from] kernel::BadKernelChoice),
}

/// The images directory ([`ENV_MICROVM_IMAGES_DIR`]).
pub fn images_dir() -> Result<PathBuf, GuestImageError> {
    if let Some(d) = std::env::var_os(ENV_MICROVM_IMAGES_DIR).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if rustix::process::geteuid().is_root() {
        return Ok(PathBuf::from("/var/cache/airlock/microvm"));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .ok_or(GuestImageError::NoDir)?;
    Ok(PathBuf::from(home).join(".cache/airlock/microvm"))
}

/// The package `apt` would fetch for the metapackage `meta`: the one it
/// depends on whose name starts with `prefix` (`linux-image-6.1.0-57-cloud-amd64`
/// for [`KERNEL_PACKAGE`], `linux-source-6.1` for `linux-source`).
pub(crate) fn apt_dependency(meta: &str, prefix: &str) -> Result<String, GuestImageError> {
    let out = run_output(
        Command::new("apt-cache").args(["depends", meta]),
        "apt-cache",
        "apt",
    )?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with(prefix) && !p.contains('<'))
        .map(str::to_owned)
        .ok_or_else(|| GuestImageError::NoPackage(meta.to_owned()))
}

impl GuestImage {
    /// The guest of `exe`'s build with the kernel `release`, in `dir`.
    pub fn at(dir: &Path, release: &str, exe: &Path) -> GuestImage {
        GuestImage {
            kind: KernelKind::of_release(release),
            kernel: dir.join(format!("kernel-{release}")),
            initrd: dir.join(format!("initrd-{release}.cpio")),
            root: dir.join(format!("root-{}.ext4", default_tag(exe))),
        }
    }

    /// The floor's initramfs (beside the guest's): busybox, and an `/init`
    /// that powers the guest off at once (the guest's `/bin/true`), for
    /// measuring the boot of the same machine and kernel with nothing after it.
    pub fn floor_initrd(&self) -> PathBuf {
        let name = self
            .initrd
            .file_name()
            .map(|n| n.to_string_lossy().replacen("initrd-", "initrd-true-", 1))
            .unwrap_or_default();
        self.initrd.with_file_name(name)
    }

    /// The guest of `exe`'s build in `dir`, with the kernel
    /// [`kernel::ENV_MICROVM_KERNEL`] chooses; `NotBuilt` when no such
    /// guest is whole.
    pub fn find(dir: &Path, exe: &Path) -> Result<GuestImage, GuestImageError> {
        GuestImage::find_with(dir, exe, KernelChoice::from_env()?)
    }

    /// The guest of `exe`'s build in `dir` with the first kernel of
    /// `choice`'s order that is there (the newest release of its kind; a
    /// minimal kernel only of this build's fragment).
    pub fn find_with(
        dir: &Path,
        exe: &Path,
        choice: KernelChoice,
    ) -> Result<GuestImage, GuestImageError> {
        let mut releases: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| n.strip_prefix("kernel-").map(str::to_owned))
            .collect();
        releases.sort();
        choice
            .order()
            .iter()
            .filter_map(|kind| {
                releases.iter().rev().find(|r| match kind {
                    KernelKind::Minimal => kernel::is_current_minimal(r),
                    KernelKind::Debian => KernelKind::of_release(r) == KernelKind::Debian,
                })
            })
            .map(|r| GuestImage::at(dir, r, exe))
            .find(|image| {
                [&image.kernel, &image.initrd, &image.root]
                    .iter()
                    .all(|p| p.is_file())
            })
            .ok_or_else(|| GuestImageError::NotBuilt(dir.to_owned()))
    }

    /// Builds what is missing of the guest of `exe`'s build in `dir`:
    /// Debian's kernel (the fallback), the minimal kernel (unless `choice`
    /// is Debian's alone), and the root; the guest `choice` boots.
    pub fn build(
        dir: &Path,
        exe: &Path,
        choice: KernelChoice,
        say: &(dyn Fn(&str) + Sync),
    ) -> Result<GuestImage, GuestImageError> {
        let file = |path: &Path| {
            let path = path.to_owned();
            move |source| GuestImageError::File { path, source }
        };
        std::fs::create_dir_all(dir).map_err(file(dir))?;
        let package = apt_dependency(KERNEL_PACKAGE, "linux-image-")?;
        let release = package.trim_start_matches("linux-image-").to_owned();
        let image = GuestImage::at(dir, &release, exe);
        let stage = Stage::new(dir)?;
        if !image.kernel.is_file() || !image.initrd.is_file() || !image.floor_initrd().is_file() {
            say(&format!(
                "fetching {package} and {BUSYBOX_PACKAGE} (apt-get download)"
            ));
            let kernel_tree = stage.extract(&package)?;
            let vmlinuz = kernel_tree.join(format!("boot/vmlinuz-{release}"));
            let modules = kernel_tree.join(format!("lib/modules/{release}"));
            image.write_initrds(&stage, Some(&modules))?;
            let kernel = std::fs::read(&vmlinuz).map_err(file(&vmlinuz))?;
            write_atomically(&image.kernel, &kernel)?;
        }
        if choice != KernelChoice::Only(KernelKind::Debian) {
            let (source, version) = kernel::source_package()?;
            let minimal = GuestImage::at(dir, &kernel::minimal_release(&version), exe);
            if !minimal.initrd.is_file() || !minimal.floor_initrd().is_file() {
                minimal.write_initrds(&stage, None)?;
            }
            if !minimal.kernel.is_file() {
                kernel::build(dir, &stage, (&source, &version), &minimal.kernel, say)?;
            }
        }
        drop(stage);
        if !image.root.is_file() {
            let stage = Stage::new(dir)?;
            let base = dir.join(format!("base-{BASE_TAG}"));
            if !base.join("usr/bin/python3").is_file() {
                say(&format!(
                    "making the guest's root with mmdebstrap ({BASE_SUITE}, {BASE_PACKAGES}; a minute or two)"
                ));
                mmdebstrap(&stage, &base)?;
            }
            say("writing the guest's root image (mkfs.ext4 -d)");
            root_image(&base, exe, &stage, &image.root)?;
        }
        GuestImage::find_with(dir, exe, choice)
    }

    /// This kernel's initramfs (with the virtio `modules` of a kernel
    /// tree, for Debian's) and the floor's beside it.
    fn write_initrds(&self, stage: &Stage, modules: Option<&Path>) -> Result<(), GuestImageError> {
        let busybox = stage.extract(BUSYBOX_PACKAGE)?.join("bin/busybox");
        let busybox = std::fs::read(&busybox).map_err(|source| GuestImageError::File {
            path: busybox,
            source,
        })?;
        write_atomically(&self.initrd, &initramfs(&busybox, modules)?)?;
        let mut floor = Cpio::default();
        floor.dir("bin");
        floor.file("bin/busybox", 0o755, &busybox);
        floor.file(
            "init",
            0o755,
            b"#!/bin/busybox sh\nexec /bin/busybox reboot -f\n",
        );
        write_atomically(&self.floor_initrd(), &floor.finish())
    }
}

/// A scratch directory inside the images directory (so files move into
/// place with a rename), removed when dropped.
pub(crate) struct Stage(PathBuf);

impl Stage {
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    fn new(dir: &Path) -> Result<Stage, GuestImageError> {
        let p = dir.join(format!(".stage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).map_err(|source| GuestImageError::File {
            path: p.clone(),
            source,
        })?;
        Ok(Stage(p))
    }

    /// `apt-get download PACKAGE`, extracted under the stage (once); its tree.
    pub(crate) fn extract(&self, package: &str) -> Result<PathBuf, GuestImageError> {
        let tree = self.0.join(format!("{package}.tree"));
        if tree.is_dir() {
            return Ok(tree);
        }
        let dl = self.0.join(format!("{package}.dl"));
        std::fs::create_dir_all(&dl).map_err(|source| GuestImageError::File {
            path: dl.clone(),
            source,
        })?;
        run(
            Command::new("apt-get")
                .args(["-q", "-o", "APT::Sandbox::User=root", "download", package])
                .current_dir(&dl),
            "apt-get",
            "apt",
        )?;
        let deb = std::fs::read_dir(&dl)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| GuestImageError::NoPackage(package.to_owned()))?;
        run(
            Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree),
            "dpkg-deb",
            "dpkg",
        )?;
        Ok(tree)
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn run(
    cmd: &mut Command,
    program: &'static str,
    package: &'static str,
) -> Result<(), GuestImageError> {
    run_output(cmd, program, package).map(drop)
}

/// Runs `cmd` to its end; its stdout, or a [`GuestImageError::Step`].
pub(crate) fn run_output(
    cmd: &mut Command,
    program: &'static str,
    package: &'static str,
) -> Result<String, GuestImageError> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| GuestImageError::Missing {
            program,
            package,
            source,
        })?;
    if !out.status.success() {
        return Err(GuestImageError::Step {
            what: format!("{cmd:?}"),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The base root into `base` (through a sibling directory, renamed when whole).
fn mmdebstrap(stage: &Stage, base: &Path) -> Result<(), GuestImageError> {
    let tmp = stage.0.join("base");
    run(
        Command::new("mmdebstrap")
            .args(["--quiet", "--variant=essential"])
            .arg(format!("--include={BASE_PACKAGES}"))
            // The docker agent base's root, without what no agent reads.
            .args(
                ["doc", "man", "locale"]
                    .map(|d| format!("--dpkgopt=path-exclude=/usr/share/{d}/*")),
            )
            .arg(BASE_SUITE)
            .arg(&tmp),
        "mmdebstrap",
        "mmdebstrap",
    )?;
    let _ = std::fs::remove_dir_all(base);
    std::fs::rename(&tmp, base).map_err(|source| GuestImageError::File {
        path: base.to_owned(),
        source,
    })
}

/// The directories the guest init mounts over (the root is read-only, so
/// they are made in the image).
pub const GUEST_MOUNT_POINTS: [&str; 6] = ["dev", "proc", "sys", "tmp", "run", ".airlock"];

/// `base` plus the stripped binary, as an ext4 image at `out`.
fn root_image(base: &Path, exe: &Path, stage: &Stage, out: &Path) -> Result<(), GuestImageError> {
    let file = |path: &Path| {
        let path = path.to_owned();
        move |source| GuestImageError::File { path, source }
    };
    for d in GUEST_MOUNT_POINTS {
        std::fs::create_dir_all(base.join(d)).map_err(file(&base.join(d)))?;
    }
    let bin = base.join(EXE_IN_GUEST.trim_start_matches('/'));
    std::fs::copy(exe, &bin).map_err(file(exe))?;
    // Without symbols the binary is a quarter of its size (a debug build).
    let _ = Command::new("strip").arg("--strip-all").arg(&bin).status();
    let bytes = tree_bytes(base);
    // Room for ext4's own tables; nothing is written to it in the guest.
    let size_mb = bytes / (1 << 20) * 5 / 4 + 64;
    let tmp = stage.0.join("root.ext4");
    run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "airlock-root", "-O", "^has_journal", "-d"])
            .arg(base)
            .arg(&tmp)
            .arg(format!("{size_mb}M")),
        "mkfs.ext4",
        "e2fsprogs",
    )?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .map_err(file(&tmp))?;
    std::fs::rename(&tmp, out).map_err(file(out))
}

/// The bytes of the regular files under `dir` (symbolic links not followed).
pub(crate) fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

/// Writes `data` to `path` through a temporary sibling and a rename (a
/// reader never sees half a file), world-readable (the VMM's own uid reads it).
pub(crate) fn write_atomically(path: &Path, data: &[u8]) -> Result<(), GuestImageError> {
    let tmp = path.with_extension("partial");
    let done = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(data))
        .and_then(|()| {
            std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    done.map_err(|source| GuestImageError::File {
        path: path.to_owned(),
        source,
    })
}

/// The initramfs: busybox, [`STAGE1`] as `/init`, and the [`MODULES`] of
/// the kernel tree `modules` (Debian's kernel; the minimal one has them
/// built in), named so that their order is the load order.
fn initramfs(busybox: &[u8], modules: Option<&Path>) -> Result<Vec<u8>, GuestImageError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| GuestImageError::File {
            path: p.to_owned(),
            source,
        })
    };
    let mut c = Cpio::default();
    for d in ["dev", "proc", "sys", "newroot", "bin", "lib", "lib/modules"] {
        c.dir(d);
    }
    c.file("bin/busybox", 0o755, busybox);
    c.file("init", 0o755, STAGE1.as_bytes());
    let Some(modules) = modules else {
        return Ok(c.finish());
    };
    for (i, m) in MODULES.iter().enumerate() {
        let name = Path::new(m)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        c.file(
            &format!("lib/modules/{i}-{name}"),
            0o644,
            &read(&modules.join(m))?,
        );
    }
    Ok(c.finish())
}

/// A `newc` cpio archive (what the kernel unpacks as an initramfs): written
/// here because it is a header of thirteen hex fields per file, no more.
#[derive(Default)]
pub(crate) struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let name_len = name.len() + 1;
        let size = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let fields = [
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            size,
            0,
            0,
            0,
            0,
            u32::try_from(name_len).unwrap_or(u32::MAX),
            0,
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    pub(crate) fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, &[]);
    }

    pub(crate) fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, data);
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

/// What [`prune`] removed from a guest images directory.
#[derive(Debug, Default)]
pub struct PrunedGuests {
    pub removed: Vec<PathBuf>,
    pub bytes: u64,
}

/// Removes from `dir` what no guest of `exe`'s build can boot, so that the
/// directory does not grow with every build: the roots of other builds
/// (`root-<tag>.ext4` of another tag, ~350 MB each), the minimal kernels of
/// other fragments, and Debian's kernels older than its newest (each with
/// its initramfs and floor). This build's root, the kernels
/// [`GuestImage::find_with`] would choose, the base root and the kernel
/// build trees stay. A guest that runs keeps booting from what it opened:
/// an unlinked file lives until its VMM closes it.
pub fn prune(dir: &Path, exe: &Path) -> std::io::Result<PrunedGuests> {
    let own_root = format!("root-{}.ext4", default_tag(exe));
    let names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let newest_debian = names
        .iter()
        .filter_map(|n| n.strip_prefix("kernel-"))
        .filter(|r| KernelKind::of_release(r) == KernelKind::Debian)
        .max()
        .map(str::to_owned);
    let stale_kernel = |release: &str| match KernelKind::of_release(release) {
        KernelKind::Minimal => !kernel::is_current_minimal(release),
        KernelKind::Debian => newest_debian.as_deref() != Some(release),
    };
    let mut out = PrunedGuests::default();
    for name in names {
        let release = name
            .strip_prefix("kernel-")
            .or_else(|| name.strip_prefix("initrd-true-")?.strip_suffix(".cpio"))
            .or_else(|| name.strip_prefix("initrd-")?.strip_suffix(".cpio"));
        let stale = match release {
            Some(r) => stale_kernel(r),
            None => name.starts_with("root-") && name.ends_with(".ext4") && name != own_root,
        };
        if !stale {
            continue;
        }
        let path = dir.join(&name);
        // Files only: a directory of that name is nobody's guest.
        let meta = std::fs::symlink_metadata(&path)?;
        if !meta.is_file() {
            continue;
        }
        std::fs::remove_file(&path)?;
        out.bytes += meta.len();
        out.removed.push(path);
    }
    out.removed.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A newc archive: each header is `070701` and thirteen 8-digit hex
    /// fields, names and data padded to 4 bytes, ending with the trailer.
    #[test]
    fn the_initramfs_is_a_newc_archive_the_kernel_reads() {
        let mut c = Cpio::default();
        c.dir("bin");
        c.file("init", 0o755, b"#!/bin/sh\n");
        let a = c.finish();
        assert_eq!(a.len() % 4, 0);
        assert!(a.starts_with(b"070701"));
        // The head (110) and "bin\0" (4), padded to a multiple of 4.
        let second = 116;
        assert_eq!(&a[second..second + 6], b"070701");
        let mode = std::str::from_utf8(&a[second + 14..second + 22]).unwrap();
        assert_eq!(u32::from_str_radix(mode, 16).unwrap(), 0o100_755);
        let size = std::str::from_utf8(&a[second + 54..second + 62]).unwrap();
        assert_eq!(u32::from_str_radix(size, 16).unwrap(), 10);
        assert!(a.windows(10).any(|w| w == b"TRAILER!!!"));
    }

    /// The images of two builds differ by their root only (the tag), and a
    /// directory without a kernel holds no guest.
    #[test]
    fn a_guest_is_found_only_whole() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("airlock");
        std::fs::write(&exe, b"not an elf").unwrap();
        assert!(matches!(
            GuestImage::find(dir.path(), &exe),
            Err(GuestImageError::NotBuilt(_))
        ));
        let g = GuestImage::at(dir.path(), "6.1.0-1-cloud-amd64", &exe);
        for p in [&g.kernel, &g.initrd] {
            std::fs::write(p, b"x").unwrap();
        }
        assert!(GuestImage::find(dir.path(), &exe).is_err());
        std::fs::write(&g.root, b"x").unwrap();
        assert_eq!(GuestImage::find(dir.path(), &exe).unwrap(), g);
    }

    /// A prune leaves exactly what this build's guest boots (with either
    /// kernel) and removes other builds' roots, other fragments' minimal
    /// kernels and Debian's older kernels, each with its initramfs.
    #[test]
    fn a_prune_keeps_this_builds_guest_and_removes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("airlock");
        std::fs::write(&exe, b"not an elf").unwrap();
        let min = kernel::minimal_release("6.1.192-3");
        let old_min = "min-6.1.192-3-000000000000";
        let (deb, old_deb) = ("6.1.0-41-cloud-amd64", "6.1.0-40-cloud-amd64");
        let own_root = format!("root-{}.ext4", default_tag(&exe));
        let kept = [
            format!("kernel-{min}"),
            format!("initrd-{min}.cpio"),
            format!("initrd-true-{min}.cpio"),
            format!("kernel-{deb}"),
            format!("initrd-{deb}.cpio"),
            own_root.clone(),
        ];
        let removed = [
            format!("kernel-{old_min}"),
            format!("initrd-{old_min}.cpio"),
            format!("initrd-true-{old_min}.cpio"),
            format!("kernel-{old_deb}"),
            format!("initrd-{old_deb}.cpio"),
            "root-0.1.0-0123456789ab.ext4".into(),
        ];
        for n in kept.iter().chain(&removed) {
            std::fs::write(dir.path().join(n), b"1234").unwrap();
        }
        // Directories are nobody's guest: the base root, a kernel's tree.
        for d in ["base-bookworm-1", "linux-6.1.192-3", "root-dir.ext4"] {
            std::fs::create_dir(dir.path().join(d)).unwrap();
        }
        let g = GuestImage::find(dir.path(), &exe).unwrap();
        let p = prune(dir.path(), &exe).unwrap();
        let mut want: Vec<_> = removed.iter().map(|n| dir.path().join(n)).collect();
        want.sort();
        assert_eq!(p.removed, want);
        assert_eq!(p.bytes, 4 * removed.len() as u64);
        for n in &kept {
            assert!(dir.path().join(n).is_file(), "{n} kept");
        }
        assert_eq!(
            GuestImage::find(dir.path(), &exe).unwrap(),
            g,
            "the same guest boots"
        );
        assert!(prune(dir.path(), &exe).unwrap().removed.is_empty());
    }
}

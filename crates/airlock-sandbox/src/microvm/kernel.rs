//! The guest's kernel: which one a guest boots ([`KernelKind`], chosen by
//! [`ENV_MICROVM_KERNEL`]), and the minimal one's build from Debian's
//! `linux-source` (fetched with `apt-get download` and extracted, never
//! installed): `make tinyconfig`, then the fragment kept beside this file
//! ([`FRAGMENT`], `kernel.config`), then `make vmlinux`.
//!
//! The minimal kernel's file is named by the source package's version and
//! the fragment's hash ([`minimal_release`]): a changed fragment or a new
//! Debian source is a new kernel, built once into the images directory; a
//! kernel of another fragment is never booted.
//!
//! Why it is the default: it has every driver built in (no module loading
//! in the initramfs) and nothing else (no ACPI, PCI, network drivers), so
//! under TCG it boots to the agent in about a third of Debian's cloud
//! kernel's time (`docs/performance.md`, the `microvm` bench prints both).

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::Digest;

use super::image::{GuestImageError, Stage, apt_dependency, run, run_output};

/// Which kernel the backend boots: `minimal` or `debian`; unset, the
/// minimal kernel where it is built, else Debian's.
pub const ENV_MICROVM_KERNEL: &str = "MICROVM_KERNEL";

/// The kernel configuration fragment applied after `make tinyconfig`.
pub const FRAGMENT: &str = include_str!("kernel.config");
/// The fragment's name in the source tree (`make airlock.config` merges it).
const FRAGMENT_NAME: &str = "airlock.config";
/// The Debian package whose dependency names the kernel source.
pub const SOURCE_PACKAGE: &str = "linux-source";
/// The prefix of the minimal kernel's release in its file names
/// (`kernel-min-<version>-<hash>`).
pub const MINIMAL_PREFIX: &str = "min-";

/// The kernel a guest boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelKind {
    /// Built here from `linux-source` with [`FRAGMENT`]: everything built
    /// in, no ACPI (QEMU names the virtio-mmio devices on the command line).
    Minimal,
    /// Debian's `linux-image-cloud-amd64`: its virtio drivers are modules
    /// the initramfs loads, its devices found through ACPI.
    Debian,
}

impl KernelKind {
    /// The kind of a release as named in the images directory.
    pub fn of_release(release: &str) -> KernelKind {
        if release.starts_with(MINIMAL_PREFIX) {
            KernelKind::Minimal
        } else {
            KernelKind::Debian
        }
    }

    /// Whether the machine describes its devices with ACPI tables (Debian's
    /// kernel) or on the kernel's command line (the minimal one has no ACPI).
    pub fn acpi(self) -> bool {
        self == KernelKind::Debian
    }
}

/// The operator's choice ([`ENV_MICROVM_KERNEL`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelChoice {
    /// The minimal kernel where it is built, else Debian's.
    Default,
    Only(KernelKind),
}

/// Why [`ENV_MICROVM_KERNEL`] was refused.
#[derive(Debug, thiserror::Error)]
#[error("{ENV_MICROVM_KERNEL}={0:?}: expected `minimal` or `debian`")]
pub struct BadKernelChoice(String);

impl KernelChoice {
    pub fn parse(v: &str) -> Result<KernelChoice, BadKernelChoice> {
        match v {
            "" => Ok(KernelChoice::Default),
            "minimal" => Ok(KernelChoice::Only(KernelKind::Minimal)),
            "debian" => Ok(KernelChoice::Only(KernelKind::Debian)),
            other => Err(BadKernelChoice(other.to_owned())),
        }
    }

    pub fn from_env() -> Result<KernelChoice, BadKernelChoice> {
        KernelChoice::parse(&std::env::var(ENV_MICROVM_KERNEL).unwrap_or_default())
    }

    /// The kinds to look for, in order of preference.
    pub fn order(self) -> &'static [KernelKind] {
        match self {
            KernelChoice::Default => &[KernelKind::Minimal, KernelKind::Debian],
            KernelChoice::Only(KernelKind::Minimal) => &[KernelKind::Minimal],
            KernelChoice::Only(KernelKind::Debian) => &[KernelKind::Debian],
        }
    }
}

/// The first 12 hex digits of the fragment's SHA-256: its version.
pub fn fragment_hash() -> String {
    hex::encode(sha2::Sha256::digest(FRAGMENT.as_bytes()))[..12].to_owned()
}

/// The minimal kernel's release for the source package version `version`:
/// `min-<version>-<fragment hash>`.
pub fn minimal_release(version: &str) -> String {
    format!("{MINIMAL_PREFIX}{version}-{}", fragment_hash())
}

/// Whether `release` is a minimal kernel of this build's fragment.
pub fn is_current_minimal(release: &str) -> bool {
    release.starts_with(MINIMAL_PREFIX) && release.ends_with(&format!("-{}", fragment_hash()))
}

/// The source package `apt` would fetch (`linux-source-6.1`) and its
/// candidate version (`6.1.192-3`).
pub fn source_package() -> Result<(String, String), GuestImageError> {
    let package = apt_dependency(SOURCE_PACKAGE, "linux-source-")?;
    let policy = run_output(
        Command::new("apt-cache").args(["policy", &package]),
        "apt-cache",
        "apt",
    )?;
    let version = policy
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Candidate: "))
        .find(|v| *v != "(none)")
        .map(str::to_owned)
        .ok_or_else(|| GuestImageError::NoPackage(package.clone()))?;
    Ok((package, version))
}

/// The `CONFIG_…=y` lines of the fragment that are not `=y` in `config`
/// (a built `.config`): options Kconfig dropped for an unmet dependency.
pub fn unmet(config: &str) -> Vec<&'static str> {
    let built: std::collections::HashSet<&str> = config.lines().map(str::trim).collect();
    FRAGMENT
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("CONFIG_") && l.ends_with("=y"))
        .filter(|l| !built.contains(l))
        .collect()
}

/// The minimal kernel's build directory for source `version`, in the
/// images directory: `linux-<version>/src` (the extracted source, kept, so
/// a changed fragment rebuilds only what it changes) and `linux-<version>/obj`
/// (make's output).
pub fn build_dir(images: &Path, version: &str) -> PathBuf {
    images.join(format!("linux-{version}"))
}

/// Builds the minimal kernel of source `package` at `version` into `out`
/// (an uncompressed ELF `vmlinux`, which QEMU and Firecracker boot
/// directly through its PVH entry): the source fetched and extracted once
/// into [`build_dir`] (through `stage`), configured, checked against the
/// fragment, built there with one job per CPU (`make -j2` on two). The
/// build directories of other source versions are removed once it is done.
pub(crate) fn build(
    images: &Path,
    stage: &Stage,
    (package, version): (&str, &str),
    out: &Path,
    say: &(dyn Fn(&str) + Sync),
) -> Result<(), GuestImageError> {
    let dir = build_dir(images, version);
    let src = dir.join("src");
    if !src.join("Makefile").is_file() {
        say(&format!(
            "fetching {package} {version} (apt-get download) for the minimal kernel"
        ));
        extract_source(stage, package, &dir)?;
    }
    let fragment = src.join("kernel/configs").join(FRAGMENT_NAME);
    std::fs::write(&fragment, FRAGMENT).map_err(|source| GuestImageError::File {
        path: fragment,
        source,
    })?;
    let obj = dir.join("obj");
    let make = |targets: &[&str], jobs: usize| -> Result<(), GuestImageError> {
        run(
            Command::new("make")
                .arg("-s")
                .arg(format!("-j{jobs}"))
                .arg("ARCH=x86_64")
                .arg(format!("O={}", obj.display()))
                .args(targets)
                .current_dir(&src),
            "make",
            "make gcc flex bison bc libelf-dev libssl-dev",
        )
    };
    make(&["tinyconfig"], 1)?;
    make(&[FRAGMENT_NAME], 1)?;
    let config_path = obj.join(".config");
    let config = std::fs::read_to_string(&config_path).map_err(|source| GuestImageError::File {
        path: config_path,
        source,
    })?;
    let missing = unmet(&config);
    if !missing.is_empty() {
        return Err(GuestImageError::KernelConfig(missing.join(" ")));
    }
    let jobs = std::thread::available_parallelism().map_or(2, usize::from);
    say(&format!(
        "building the minimal kernel (make -j{jobs} vmlinux in {}; minutes, once)",
        dir.display()
    ));
    make(&["vmlinux"], jobs)?;
    let vmlinux = obj.join("vmlinux");
    let bytes = std::fs::read(&vmlinux).map_err(|source| GuestImageError::File {
        path: vmlinux,
        source,
    })?;
    super::image::write_atomically(out, &bytes)?;
    for e in std::fs::read_dir(images).into_iter().flatten().flatten() {
        let other = e.file_name().to_string_lossy().starts_with("linux-") && e.path() != dir;
        if other && e.path().is_dir() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    Ok(())
}

/// `package`'s source tarball, extracted under `stage` and moved whole to
/// `dir/src` (a half-extracted tree is never taken for a source).
fn extract_source(stage: &Stage, package: &str, dir: &Path) -> Result<(), GuestImageError> {
    let file = |path: &Path| {
        let path = path.to_owned();
        move |source| GuestImageError::File { path, source }
    };
    let tree = stage.extract(package)?;
    let usr_src = tree.join("usr/src");
    let tarball = std::fs::read_dir(&usr_src)
        .map_err(file(&usr_src))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".tar.xz"))
        .ok_or_else(|| GuestImageError::NoPackage(package.to_owned()))?;
    let unpacked = stage.path().join("src");
    std::fs::create_dir_all(&unpacked).map_err(file(&unpacked))?;
    run(
        Command::new("tar")
            .arg("-xJf")
            .arg(&tarball)
            .arg("-C")
            .arg(&unpacked),
        "tar",
        "tar xz-utils",
    )?;
    let root = std::fs::read_dir(&unpacked)
        .map_err(file(&unpacked))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.join("Makefile").is_file())
        .ok_or_else(|| GuestImageError::NoPackage(SOURCE_PACKAGE.to_owned()))?;
    std::fs::create_dir_all(dir).map_err(file(dir))?;
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::rename(&root, &src).map_err(file(&src))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fragment asks for what the brief's guest needs and nothing
    /// loadable or networked; its hash names the kernel.
    #[test]
    fn the_fragment_builds_in_what_the_guest_needs_and_no_modules_or_nics() {
        for want in [
            "CONFIG_64BIT=y",
            "CONFIG_VIRTIO_MMIO=y",
            "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y",
            "CONFIG_VIRTIO_BLK=y",
            "CONFIG_VIRTIO_CONSOLE=y",
            "CONFIG_EXT4_FS=y",
            "CONFIG_DEVTMPFS=y",
            "CONFIG_TMPFS=y",
            "CONFIG_BINFMT_SCRIPT=y",
            "CONFIG_MULTIUSER=y",
            "CONFIG_UNIX=y",
        ] {
            assert!(FRAGMENT.lines().any(|l| l == want), "{want}");
        }
        for off in [
            "# CONFIG_MODULES is not set",
            "# CONFIG_NETDEVICES is not set",
        ] {
            assert!(FRAGMENT.lines().any(|l| l == off), "{off}");
        }
        let r = minimal_release("6.1.192-3");
        assert!(r.starts_with("min-6.1.192-3-") && is_current_minimal(&r));
        assert!(!is_current_minimal("min-6.1.192-3-000000000000"));
        assert_eq!(KernelKind::of_release(&r), KernelKind::Minimal);
        assert_eq!(
            KernelKind::of_release("6.1.0-57-cloud-amd64"),
            KernelKind::Debian
        );
    }

    /// An option Kconfig dropped is named; a config with all of them is whole.
    #[test]
    fn a_dropped_option_is_named() {
        let all: String = FRAGMENT
            .lines()
            .filter(|l| l.starts_with("CONFIG_"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(unmet(&all).is_empty());
        let without = all.replace("CONFIG_VIRTIO_BLK=y\n", "");
        assert_eq!(unmet(&without), vec!["CONFIG_VIRTIO_BLK=y"]);
    }

    #[test]
    fn the_choice_is_minimal_first_unless_named() {
        assert_eq!(
            KernelChoice::parse("").unwrap().order(),
            &[KernelKind::Minimal, KernelKind::Debian]
        );
        assert_eq!(
            KernelChoice::parse("debian").unwrap().order(),
            &[KernelKind::Debian]
        );
        assert!(KernelChoice::parse("tiny").is_err());
    }
}

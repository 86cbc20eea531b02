//! The Firecracker driver: one guest under Firecracker's jailer (its own
//! chroot, uid and gid, mount namespace), configured over Firecracker's API
//! socket and stopped at the run's end.
//!
//! - [`api`]: the requests, typed after Firecracker's published API
//!   definition, and their client;
//! - [`jail`]: the chroot the jailer enters, with the kernel, initramfs and
//!   disks placed in it (hard links, else copies), removed after;
//! - [`vm`]: the sequence: jail, jailer, API socket, boot source, drives,
//!   machine, vsock, start; the guest's channel; the stop.
//!
//! The guest has no network interface (none is ever configured). Its channel
//! is the vsock device: the guest connects to the host's
//! [`VSOCK_PORT`], which Firecracker forwards to the unix socket
//! `v.sock_<port>` in the jail, where the helper listens. Firecracker needs
//! KVM: there is no emulated fallback as with QEMU.

pub mod api;
pub mod jail;
pub mod vm;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::image::GuestImage;
use crate::Unavailable;

/// The Firecracker binary: `MICROVM_FIRECRACKER`, else `firecracker` on `PATH`.
pub const ENV_MICROVM_FIRECRACKER: &str = "MICROVM_FIRECRACKER";
/// Its jailer: `MICROVM_JAILER`, else `jailer` on `PATH`.
pub const ENV_MICROVM_JAILER: &str = "MICROVM_JAILER";
pub const DEFAULT_FIRECRACKER: &str = "firecracker";
pub const DEFAULT_JAILER: &str = "jailer";

/// The host port the guest's channel connects to (the host is CID 2).
pub const VSOCK_PORT: u32 = 52;
/// The guest's context id.
pub const GUEST_CID: u32 = 3;
/// Firecracker's API socket, as the jailed VMM names it (`--api-sock`).
pub const API_SOCKET: &str = "api.socket";
/// The vsock device's socket in the jail; the guest's connections to port
/// `P` reach `v.sock_P` beside it.
pub const VSOCK_SOCKET: &str = "v.sock";
/// Bound on each API request, and on the API socket's appearance.
pub const API_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on the guest's boot, from its start to its channel's connection.
pub const GUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopped guest has to power off before its VMM is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// Firecracker's range of vCPUs.
pub const MAX_VCPUS: u64 = 32;

/// The kernel's command line: the serial console, a reboot (the guest's
/// end) that exits Firecracker, no PCI probing, the initramfs's init.
pub const BOOT_ARGS: &str = "console=ttyS0 reboot=k panic=1 pci=off rdinit=/init quiet";

/// The binaries the driver runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub firecracker: PathBuf,
    pub jailer: PathBuf,
}

impl Binaries {
    /// From [`ENV_MICROVM_FIRECRACKER`] and [`ENV_MICROVM_JAILER`].
    pub fn from_env() -> Binaries {
        let var = |name: &str, default: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(default), PathBuf::from)
        };
        Binaries {
            firecracker: var(ENV_MICROVM_FIRECRACKER, DEFAULT_FIRECRACKER),
            jailer: var(ENV_MICROVM_JAILER, DEFAULT_JAILER),
        }
    }

    /// Both, found (on `PATH` for a bare name), or which is missing.
    pub fn resolve(&self) -> Result<Binaries, Unavailable> {
        let find = |bin: &Path, var: &str| {
            super::on_path(bin).ok_or_else(|| {
                Unavailable(format!(
                    "{} is not installed (Firecracker's release archive has both firecracker and jailer), or set {var}",
                    bin.display()
                ))
            })
        };
        Ok(Binaries {
            firecracker: find(&self.firecracker, ENV_MICROVM_FIRECRACKER)?,
            jailer: find(&self.jailer, ENV_MICROVM_JAILER)?,
        })
    }

    /// Whether the driver can run here: both binaries, root (the jailer
    /// makes the chroot and device nodes, then drops to the run's uid), KVM.
    pub fn check(&self, accel: super::qemu::Accel) -> Result<(), Unavailable> {
        self.resolve()?;
        if !rustix::process::geteuid().is_root() {
            return Err(Unavailable(
                "the firecracker driver runs its jailer, which needs root (it builds the chroot, then runs Firecracker as the run's own uid)".into(),
            ));
        }
        if accel != super::qemu::Accel::Kvm {
            return Err(Unavailable(
                "Firecracker needs KVM (/dev/kvm usable, with VMX or SVM, not PVM): it has no emulated fallback; use RUN_ADAPTER=microvm (QEMU) here".into(),
            ));
        }
        Ok(())
    }
}

/// One guest's machine under Firecracker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirecrackerPlan {
    /// The jailer's `--id`, [`jail_id`] of the run's id.
    pub id: String,
    pub firecracker: PathBuf,
    pub jailer: PathBuf,
    /// The jailer's `--chroot-base-dir`: in the run's own directory, so a
    /// jail is removed with it whatever ends the run.
    pub chroot_base: PathBuf,
    /// The VMM's uid and gid (the run's own, as QEMU's).
    pub uid: u32,
    pub gid: u32,
    pub image: GuestImage,
    pub memory_mb: u64,
    pub vcpus: u64,
    /// Read-only disks after the root, in order (drives `agent<i>`).
    pub disks: Vec<PathBuf>,
    pub api_timeout_ms: u64,
    pub guest_timeout_ms: u64,
    pub stop_grace_ms: u64,
}

impl FirecrackerPlan {
    /// The jailer's command line: the run's id, the Firecracker binary,
    /// the run's uid and gid, the chroot base; after `--`, Firecracker's
    /// own API socket in the jail. No `--netns`: the guest has no network
    /// interface. No `--cgroup`: the VMM stays in the run's cgroups, which
    /// its helper is in and which hold the run's limits (a child cgroup
    /// with its own controllers cannot be made under one with processes).
    /// No `--daemonize` or `--new-pid-ns`: the jailer execs Firecracker in
    /// place, so the helper's child is the VMM itself.
    pub fn jailer_argv(&self) -> Vec<String> {
        vec![
            self.jailer.display().to_string(),
            "--id".into(),
            self.id.clone(),
            "--exec-file".into(),
            self.firecracker.display().to_string(),
            "--uid".into(),
            self.uid.to_string(),
            "--gid".into(),
            self.gid.to_string(),
            "--chroot-base-dir".into(),
            self.chroot_base.display().to_string(),
            "--".into(),
            "--api-sock".into(),
            format!("/{API_SOCKET}"),
        ]
    }

    /// The jail's root: `<chroot base>/<exec file name>/<id>/root`.
    pub fn jail_root(&self) -> PathBuf {
        let exec = self
            .firecracker
            .file_name()
            .map_or_else(|| DEFAULT_FIRECRACKER.into(), |n| n.to_os_string());
        self.chroot_base.join(exec).join(&self.id).join("root")
    }

    pub fn api_timeout(&self) -> Duration {
        Duration::from_millis(self.api_timeout_ms)
    }
    pub fn guest_timeout(&self) -> Duration {
        Duration::from_millis(self.guest_timeout_ms)
    }
    pub fn stop_grace(&self) -> Duration {
        Duration::from_millis(self.stop_grace_ms)
    }
}

/// The jailer's id of run `run_id`: `airlock-<id>`, which the jailer takes
/// only of letters, digits and hyphens, at most 64 (`_` becomes `-`; a
/// longer one is cut and ends with a hash of the whole id).
pub fn jail_id(run_id: &str) -> String {
    let clean: String = run_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let id = format!("airlock-{clean}");
    if id.len() <= 64 {
        return id;
    }
    let h = run_id.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{}-{h:08x}", &id[..55])
}

/// Why a Firecracker guest did not start, or stopped: one variant per step.
#[derive(Debug, thiserror::Error)]
pub enum FirecrackerError {
    #[error("cannot make the jail {path}: {source}")]
    Jail {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot put {from} into the jail: {source}")]
    Place {
        from: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen for the guest's channel in the jail: {0}")]
    Channel(std::io::Error),
    #[error("cannot start the jailer {program}: {source}")]
    Jailer {
        program: String,
        source: std::io::Error,
    },
    #[error("the jailer or Firecracker exited ({0}) before its API answered")]
    Exited(std::process::ExitStatus),
    #[error("Firecracker's API socket did not appear within {0:?}")]
    NoApiSocket(Duration),
    #[error("Firecracker's API, {step}: {source}")]
    Api {
        step: api::Step,
        source: api::ApiError,
    },
    #[error("the guest did not connect its channel within {0:?} of its start")]
    NoGuest(Duration),
    #[error("Firecracker exited ({0}) before the guest connected its channel")]
    Stopped(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> FirecrackerPlan {
        FirecrackerPlan {
            id: jail_id("run_1"),
            firecracker: "/usr/bin/firecracker".into(),
            jailer: "/usr/bin/jailer".into(),
            chroot_base: "/r/run_1/vm/jail".into(),
            uid: 70001,
            gid: 70001,
            image: GuestImage {
                kind: crate::microvm::kernel::KernelKind::Debian,
                kernel: "/i/vmlinux".into(),
                initrd: "/i/initrd.cpio".into(),
                root: "/i/root.ext4".into(),
            },
            memory_mb: 512,
            vcpus: 2,
            disks: vec![],
            api_timeout_ms: 5000,
            guest_timeout_ms: 30_000,
            stop_grace_ms: 2000,
        }
    }

    /// The jailer gets the run's id, the binary, the run's uid and gid, the
    /// chroot base, and Firecracker its API socket; nothing that gives the
    /// guest a network or takes the VMM out of the helper's process tree.
    #[test]
    fn the_jailers_command_line() {
        let a = plan().jailer_argv();
        assert_eq!(
            a.join(" "),
            "/usr/bin/jailer --id airlock-run-1 --exec-file /usr/bin/firecracker --uid 70001 \
             --gid 70001 --chroot-base-dir /r/run_1/vm/jail -- --api-sock /api.socket"
        );
        for absent in ["--netns", "--daemonize", "--new-pid-ns"] {
            assert!(!a.iter().any(|s| s == absent), "{absent}");
        }
        assert_eq!(
            plan().jail_root(),
            Path::new("/r/run_1/vm/jail/firecracker/airlock-run-1/root")
        );
    }

    /// Only letters, digits and hyphens, at most 64, and distinct ids stay
    /// distinct when cut.
    #[test]
    fn jail_ids_are_what_the_jailer_takes() {
        assert_eq!(jail_id("run_01ab"), "airlock-run-01ab");
        let long_a = format!("run_{}", "a".repeat(60));
        let long_b = format!("run_{}b", "a".repeat(59));
        for id in [jail_id(&long_a), jail_id(&long_b)] {
            assert!(id.len() <= 64, "{id}");
            assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        }
        assert_ne!(jail_id(&long_a), jail_id(&long_b));
    }
}

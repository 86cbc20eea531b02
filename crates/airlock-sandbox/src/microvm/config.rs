//! What the host hands its VMM helper, and what the helper hands the guest:
//! one typed definition each, for the side that writes and the side that reads.

use std::path::PathBuf;

use airlock_platform_api::channel::NONCE_LEN;
use serde::{Deserialize, Serialize};

/// The run's header as the guest's init receives it over the channel,
/// after boot. Nothing secret: the runtime's secrets follow it as stdin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestHeader {
    /// The run's nonce, which the init's end frame carries (the helper
    /// draws it; the backend leaves it zero).
    pub nonce: [u8; NONCE_LEN],
    /// `airlock runtime -- AGENT…`, argv[0] inside the guest.
    pub command: Vec<String>,
    /// The command's whole environment.
    pub env: Vec<(String, String)>,
    /// The agent's workspace: a tmpfs of `workspace_mb` MiB.
    pub workspace: PathBuf,
    pub workspace_mb: u64,
    /// The read-only disks after the root, in order (serial `agent<i>`),
    /// each mounted at its path.
    pub disks: Vec<PathBuf>,
    /// The uid and gid the runtime and the agent run as in the guest.
    pub uid: u32,
}

/// The helper's (`airlock microvm-host`) first line on stdin; the
/// runtime's secrets follow it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// The guest's machine, by driver.
    pub plan: VmmPlan,
    /// The VMM's host uid and gid, and whether to switch to them (the
    /// platform is root: then in namespaces of its own, too).
    pub vmm_uid: u32,
    pub vmm_gid: u32,
    pub vmm_switch: bool,
    /// The host directory of the sidecar's sockets.
    pub sockets_dir: PathBuf,
    pub guest: GuestHeader,
}

/// The guest's machine: what the helper starts it with.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmmPlan {
    /// QEMU's command line, the channel and disks passed as descriptors.
    Qemu(super::qemu::QemuPlan),
    /// Firecracker under its jailer, configured over its API.
    Firecracker(super::firecracker::FirecrackerPlan),
}

/// Largest first line the helper reads.
pub const MAX_CONFIG_BYTES: u64 = 256 * 1024;

/// Where the guest's init puts what the runtime reaches: the sidecar's
/// sockets (relayed over the channel) and the workspace.
pub const SOCKETS_IN_GUEST: &str = "/run/airlock";
pub const WORKSPACE_IN_GUEST: &str = "/workspace";
/// The unprivileged uid of the runtime and the agent inside the guest.
pub const GUEST_UID: u32 = 65_534;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::microvm::{firecracker, image::GuestImage, qemu};

    /// What the backend writes, the helper reads, for either driver.
    #[test]
    fn a_host_configuration_crosses_to_the_helper_for_either_driver() {
        let image = GuestImage {
            kind: crate::microvm::kernel::KernelKind::Debian,
            kernel: "/i/k".into(),
            initrd: "/i/i".into(),
            root: "/i/r".into(),
        };
        let plans = [
            VmmPlan::Qemu(qemu::QemuPlan {
                name: "airlock-r".into(),
                qemu: "qemu-system-x86_64".into(),
                accel: qemu::Accel::Tcg,
                tsc_khz: 1,
                image: image.clone(),
                memory_mb: 256,
                vcpus: 1,
                disks: vec![],
            }),
            VmmPlan::Firecracker(firecracker::FirecrackerPlan {
                id: firecracker::jail_id("r"),
                firecracker: "/usr/bin/firecracker".into(),
                jailer: "/usr/bin/jailer".into(),
                chroot_base: "/r/vm/jail".into(),
                uid: 1,
                gid: 1,
                image,
                memory_mb: 256,
                vcpus: 1,
                disks: vec!["/r/vm/agent0.ext4".into()],
                api_timeout_ms: 1,
                guest_timeout_ms: 1,
                stop_grace_ms: 1,
            }),
        ];
        for plan in plans {
            let cfg = HostConfig {
                plan,
                vmm_uid: 1,
                vmm_gid: 1,
                vmm_switch: false,
                sockets_dir: "/r/sock".into(),
                guest: GuestHeader {
                    nonce: [0; NONCE_LEN],
                    command: vec!["true".into()],
                    env: vec![],
                    workspace: WORKSPACE_IN_GUEST.into(),
                    workspace_mb: 64,
                    disks: vec![],
                    uid: GUEST_UID,
                },
            };
            let line = serde_json::to_string(&cfg).unwrap();
            let back: HostConfig = serde_json::from_str(&line).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), line);
        }
    }
}

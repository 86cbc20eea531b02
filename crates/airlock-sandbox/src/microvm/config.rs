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
    /// A pooled guest's agent directory, which reaches it at its claim in
    /// place of a disk ([`GuestView`]); none for a cold start's guest.
    #[serde(default)]
    pub view: Option<GuestView>,
}

impl GuestHeader {
    /// The header of `spec`'s run: its agent's directory as the disks
    /// `disks` (a cold start) or as `view` (a pooled guest's claim); the
    /// nonce left zero for the helper to draw.
    pub fn of(
        spec: &crate::SandboxSpec,
        disks: Vec<PathBuf>,
        view: Option<GuestView>,
    ) -> GuestHeader {
        GuestHeader {
            nonce: [0; NONCE_LEN],
            command: spec.command.clone(),
            env: spec.env.clone(),
            workspace: spec.workspace.clone(),
            workspace_mb: spec.workspace_size_mb,
            disks,
            uid: GUEST_UID,
            view,
        }
    }
}

/// The agent's directory of a run on a pooled guest, which booted before
/// the run and so without its disk: a tar archive of `bytes` bytes that
/// leads the guest's stdin (the runtime's secrets follow it), unpacked by
/// the guest's init at `path` on a tmpfs of its own that is then made
/// read-only (as a cold start's disk is mounted). Bounded by
/// [`crate::warm::MAX_VIEW_BYTES`] and [`crate::warm::MAX_VIEW_ENTRIES`]
/// on both sides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestView {
    pub path: PathBuf,
    /// The archive's length.
    pub bytes: u64,
    /// The bytes of its files and its entries (the tmpfs is sized for them).
    pub file_bytes: u64,
    pub entries: u64,
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

/// The helper's first line: a cold start's whole configuration, or a
/// pooled guest's machine alone, which boots holding nothing of any run
/// and waits; its run's part ([`HostRun`]) is the next line, at its claim.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum HostLine {
    Cold(HostConfig),
    Pooled(PooledConfig),
}

/// A pooled guest's machine: a [`HostConfig`] without its run's part.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PooledConfig {
    pub plan: VmmPlan,
    pub vmm_uid: u32,
    pub vmm_gid: u32,
    pub vmm_switch: bool,
}

/// A pooled guest's run, given to its helper at the claim: the run's
/// sockets and the guest's header (its nonce drawn by the helper then).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostRun {
    pub sockets_dir: PathBuf,
    pub guest: GuestHeader,
}

/// What a pooled guest's helper writes on its stdout once its guest has
/// booted and waits for its header, before anything of a run.
pub const POOLED_READY: &[u8] = b"airlock-microvm-ready\n";

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
                    view: None,
                },
            };
            let line = serde_json::to_string(&cfg).unwrap();
            let back: HostConfig = serde_json::from_str(&line).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), line);
        }
    }
}

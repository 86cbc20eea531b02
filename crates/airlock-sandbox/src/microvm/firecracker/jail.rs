//! The jail one Firecracker runs in: `<chroot base>/<exec file name>/<id>/root`,
//! made before the jailer starts (which then takes it as it is, chowns its
//! root to the VMM's uid and pivots into it), with what the VMM opens by
//! path put in it: the kernel, the initramfs, the root image and the
//! agent's disks, and the listening socket of the guest's channel.
//! Removed whole when the guest stops (and, being in the run's directory,
//! with it whatever ends the run).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::{FirecrackerError, FirecrackerPlan, VSOCK_PORT, VSOCK_SOCKET};

/// The names of the guest's files in the jail, as the VMM opens them.
pub const KERNEL: &str = "kernel";
pub const INITRD: &str = "initrd";
pub const ROOT_DISK: &str = "root.ext4";

/// The `i`th agent disk's name in the jail.
pub fn agent_disk(i: usize) -> String {
    format!("agent{i}.ext4")
}

/// A made jail; removed when dropped.
#[derive(Debug)]
pub struct Jail {
    /// `<chroot base>/<exec file name>/<id>`: what is removed.
    dir: PathBuf,
    root: PathBuf,
    /// The root, opened: its paths are reached through
    /// `/proc/self/fd/<fd>/…`, short whatever the run directory's length
    /// (a unix socket's path is at most 107 bytes).
    root_fd: OwnedFd,
}

impl Jail {
    /// Makes the jail of `plan` (refused if it exists: a jail is one run's)
    /// and puts the guest's files in it. A failure leaves nothing.
    pub fn make(plan: &FirecrackerPlan) -> Result<Jail, FirecrackerError> {
        let root = plan.jail_root();
        let dir = root
            .parent()
            .map_or_else(|| root.clone(), Path::to_path_buf);
        let made = |path: &Path, r: std::io::Result<()>| {
            r.map_err(|source| FirecrackerError::Jail {
                path: path.to_path_buf(),
                source,
            })
        };
        if let Some(parent) = dir.parent() {
            made(parent, std::fs::create_dir_all(parent))?;
        }
        made(&dir, std::fs::create_dir(&dir))?;
        let opened = std::fs::create_dir(&root).and_then(|()| {
            rustix::fs::open(
                &root,
                rustix::fs::OFlags::PATH
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(std::io::Error::from)
        });
        let root_fd = match opened {
            Ok(fd) => fd,
            Err(source) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(FirecrackerError::Jail { path: root, source });
            }
        };
        let jail = Jail { dir, root, root_fd };
        jail.place(&plan.image.kernel, KERNEL, None)?;
        jail.place(&plan.image.initrd, INITRD, None)?;
        jail.place(&plan.image.root, ROOT_DISK, None)?;
        for (i, disk) in plan.disks.iter().enumerate() {
            jail.place(disk, &agent_disk(i), Some((plan.uid, plan.gid)))?;
        }
        Ok(jail)
    }

    /// The jail's root on the host.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `name` in the jail's root, by a path of bounded length.
    pub fn at(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}/{name}", self.root_fd.as_raw_fd()))
    }

    /// `from` as `name` in the jail: a hard link (the images are shared by
    /// runs and never written), else a copy. `own`: the file is the run's
    /// alone (an agent disk), made the VMM's and read-only to it.
    fn place(
        &self,
        from: &Path,
        name: &str,
        own: Option<(u32, u32)>,
    ) -> Result<(), FirecrackerError> {
        let to = self.root.join(name);
        let placed = std::fs::hard_link(from, &to)
            .or_else(|_| std::fs::copy(from, &to).map(drop))
            .and_then(|()| match own {
                Some((uid, gid)) => {
                    std::os::unix::fs::chown(&to, Some(uid), Some(gid)).and_then(|()| {
                        std::fs::set_permissions(
                            &to,
                            std::os::unix::fs::PermissionsExt::from_mode(0o400),
                        )
                    })
                }
                None => Ok(()),
            });
        placed.map_err(|source| FirecrackerError::Place {
            from: from.to_path_buf(),
            source,
        })
    }

    /// Listens where Firecracker forwards the guest's connections to
    /// [`VSOCK_PORT`], a socket only the VMM's uid may connect to.
    pub fn listen_channel(
        &self,
        uid: u32,
        gid: u32,
    ) -> Result<tokio::net::UnixListener, FirecrackerError> {
        let name = format!("{VSOCK_SOCKET}_{VSOCK_PORT}");
        let l =
            tokio::net::UnixListener::bind(self.at(&name)).map_err(FirecrackerError::Channel)?;
        let host_path = self.root.join(&name);
        std::os::unix::fs::chown(&host_path, Some(uid), Some(gid))
            .and_then(|()| {
                std::fs::set_permissions(
                    &host_path,
                    std::os::unix::fs::PermissionsExt::from_mode(0o600),
                )
            })
            .map_err(FirecrackerError::Channel)?;
        Ok(l)
    }
}

impl Drop for Jail {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("cannot remove the jail {}: {e}", self.dir.display());
        }
    }
}

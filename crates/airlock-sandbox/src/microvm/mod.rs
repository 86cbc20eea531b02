//! The `microvm` backend: each run's agent in a virtual machine of its own
//! (QEMU's `-M microvm`, or Firecracker), whose one way out is one channel
//! (a virtio-serial port; a vsock under Firecracker) that the runtime's
//! relays are multiplexed over to the sidecar outside.
//!
//! - [`image`]: the guest (kernel, initramfs, read-only root), built by
//!   `airlock images build --microvm`;
//! - [`driver`]: which VMM ([`ENV_MICROVM_DRIVER`](driver::ENV_MICROVM_DRIVER),
//!   `RUN_ADAPTER=firecracker`);
//! - [`qemu`]: the QEMU driver (the machine's command line, KVM or TCG);
//! - [`firecracker`]: the Firecracker driver (its jail, its API, KVM only);
//! - [`host`]: `airlock microvm-host`, the host side of one guest (the
//!   channel's end, the VMM's parent), which the backend starts in the
//!   run's cgroups as the sandbox's first process;
//! - [`guest`]: `airlock vm-init`, PID 1 in the guest;
//! - [`pool`]: the warm pool (`MICROVM_WARM_POOL`): guests booted before
//!   any run, each claimed by one;
//! - [`mux`]: the channel's streams, the same on both sides; the frames
//!   themselves are the contract crate's (`airlock_platform_api::channel`).
//!
//! The VMM is confined besides the guest's own kernel: it runs as the run's
//! unprivileged host uid (the namespace backend's), in new network, IPC,
//! UTS and mount namespaces, with no new privileges, QEMU's seccomp filter
//! (`-sandbox on`), inside the run's cgroups, and dies with its helper,
//! which dies with the platform. Under Firecracker the jailer makes the
//! confinement instead (a chroot in the run's directory, a mount namespace,
//! the run's uid and gid) and Firecracker applies its own seccomp filters;
//! it stays in the run's cgroups, killed with them at the run's end or by
//! the next boot's reclaim (the jailer's uid switch clears the death
//! signal, so it does not die with its helper).

pub mod config;
pub mod driver;
pub mod firecracker;
pub mod guest;
pub mod host;
pub mod image;
pub mod kernel;
pub mod mux;
pub mod pool;
pub mod qemu;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::namespace::{cgroup, config as ns_config};
use crate::{Backend, RunPaths, Sandbox, SandboxError, SandboxKind, SandboxSpec, Unavailable};
use config::{GuestHeader, HostConfig, HostLine, SOCKETS_IN_GUEST, VmmPlan, WORKSPACE_IN_GUEST};

/// What the VMM process may use beyond the guest's memory (QEMU itself,
/// its emulator's code cache under TCG).
pub const VMM_OVERHEAD_MB: u64 = 512;

/// Its clones share its warm pool.
#[derive(Clone)]
pub struct MicrovmBackend {
    /// The `airlock` binary (it runs `microvm-host`).
    pub exe: PathBuf,
    pub driver: driver::Driver,
    pub qemu: PathBuf,
    /// The firecracker driver's binaries.
    pub firecracker: firecracker::Binaries,
    pub images: PathBuf,
    /// Which kernel the guests boot ([`kernel::ENV_MICROVM_KERNEL`]).
    pub kernel: kernel::KernelChoice,
    pub accel: qemu::Accel,
    /// Fail a spawn when cgroups cannot be made (default: when root).
    pub require_limits: bool,
    layout: std::sync::OnceLock<Option<cgroup::Layout>>,
    /// Booted guests waiting for runs ([`pool`], `MICROVM_WARM_POOL`).
    pool: Arc<pool::Pool>,
}

impl MicrovmBackend {
    /// The backend `adapter` (`microvm` or `firecracker`) names, from the
    /// environment ([`driver::ENV_MICROVM_DRIVER`], [`qemu::ENV_MICROVM_QEMU`],
    /// [`firecracker::Binaries::from_env`], [`image::ENV_MICROVM_IMAGES_DIR`]),
    /// with the running executable.
    pub fn from_env(adapter: &str) -> Result<MicrovmBackend, SandboxError> {
        let exe = std::env::current_exe().map_err(SandboxError::InitBinary)?;
        let setting = std::env::var(driver::ENV_MICROVM_DRIVER).ok();
        let driver = driver::Driver::select(adapter, setting.as_deref()).map_err(|e| {
            SandboxError::Config {
                var: driver::ENV_MICROVM_DRIVER,
                message: e.0,
            }
        })?;
        let qemu = std::env::var_os(qemu::ENV_MICROVM_QEMU)
            .filter(|q| !q.is_empty())
            .map_or_else(|| PathBuf::from(qemu::DEFAULT_QEMU), PathBuf::from);
        let images = image::images_dir().map_err(|e| SandboxError::Config {
            var: image::ENV_MICROVM_IMAGES_DIR,
            message: e.to_string(),
        })?;
        let kernel = kernel::KernelChoice::from_env().map_err(|e| SandboxError::Config {
            var: kernel::ENV_MICROVM_KERNEL,
            message: e.to_string(),
        })?;
        let pool_size =
            pool::size_from(std::env::var(pool::ENV_MICROVM_WARM_POOL).ok().as_deref())?;
        Ok(MicrovmBackend {
            exe,
            driver,
            qemu,
            firecracker: firecracker::Binaries::from_env(),
            images,
            kernel,
            accel: qemu::accel(),
            require_limits: rustix::process::geteuid().is_root(),
            layout: std::sync::OnceLock::new(),
            pool: Arc::new(pool::Pool::new(pool_size)),
        })
    }

    /// The same backend with a warm pool of `size` guests per key (its
    /// own, whatever `MICROVM_WARM_POOL` says).
    pub fn with_warm_pool(mut self, size: usize) -> MicrovmBackend {
        self.pool = Arc::new(pool::Pool::new(size));
        self
    }

    /// This process's pool as it stands.
    pub fn pool_status(&self) -> pool::PoolStatus {
        self.pool.status()
    }

    fn layout(&self) -> Option<&cgroup::Layout> {
        self.layout.get_or_init(cgroup::layout).as_ref()
    }

    /// The QEMU binary, found on `PATH` when it is a bare name.
    fn qemu_path(&self) -> Option<PathBuf> {
        on_path(&self.qemu)
    }

    /// The guest's machine under this backend's driver.
    fn plan(
        &self,
        spec: &SandboxSpec,
        ids: &ns_config::HostIds,
        image: image::GuestImage,
        disks: Vec<PathBuf>,
        vm_dir: &Path,
    ) -> Result<VmmPlan, SandboxError> {
        let name = format!("airlock-{}", spec.run_id);
        let vcpus = crate::whole(spec.cpus.ceil(), 64);
        Ok(match self.driver {
            driver::Driver::Qemu => VmmPlan::Qemu(qemu::QemuPlan {
                name,
                qemu: self.qemu_path().unwrap_or_else(|| self.qemu.clone()),
                accel: self.accel,
                tsc_khz: qemu::tsc_khz(),
                image,
                memory_mb: spec.memory_mb,
                vcpus,
                disks,
            }),
            driver::Driver::Firecracker => {
                let bins = self
                    .firecracker
                    .resolve()
                    .map_err(|u| SandboxError::Unavailable {
                        backend: "firecracker",
                        reason: u.0,
                    })?;
                VmmPlan::Firecracker(firecracker::FirecrackerPlan {
                    id: firecracker::jail_id(&spec.run_id),
                    firecracker: bins.firecracker,
                    jailer: bins.jailer,
                    chroot_base: vm_dir.join("jail"),
                    uid: ids.uid,
                    gid: ids.gid,
                    image,
                    memory_mb: spec.memory_mb,
                    vcpus,
                    disks,
                    api_timeout_ms: millis(firecracker::API_TIMEOUT),
                    guest_timeout_ms: millis(firecracker::GUEST_TIMEOUT),
                    stop_grace_ms: millis(firecracker::STOP_GRACE),
                })
            }
        })
    }

    /// The run's cgroups (its helper and VMM), or none with a warning
    /// where limits are not required.
    fn cgroups(&self, spec: &SandboxSpec) -> Result<Option<cgroup::RunCgroups>, SandboxError> {
        let limits = cgroup::Limits {
            memory_mb: spec.memory_mb + VMM_OVERHEAD_MB,
            cpus: spec.cpus,
            pids_max: 256,
        };
        let made = match self.layout() {
            Some(layout) => cgroup::RunCgroups::create(layout, &spec.run_id, limits),
            None => Err(cgroup::CgroupError::NoHierarchy),
        };
        match made {
            Ok(c) => Ok(Some(c)),
            Err(e) if self.require_limits => Err(SandboxError::Limits(e)),
            Err(e) => {
                tracing::warn!("the microVM's VMM runs WITHOUT cgroup limits: {e}");
                Ok(None)
            }
        }
    }
}

/// A started helper, its cgroups, and its first line (to be written).
type Started = (
    tokio::process::Child,
    Option<Arc<cgroup::RunCgroups>>,
    Vec<u8>,
);

impl MicrovmBackend {
    /// The guest of this build.
    fn image(&self) -> Result<image::GuestImage, SandboxError> {
        image::GuestImage::find_with(&self.images, &self.exe, self.kernel).map_err(|e| {
            SandboxError::Unavailable {
                backend: self.name(),
                reason: e.to_string(),
            }
        })
    }

    /// Starts the helper of `spec`'s guest in its cgroups, its first line
    /// `line` (returned to be written to its stdin).
    fn start_helper(&self, spec: &SandboxSpec, line: &HostLine) -> Result<Started, SandboxError> {
        let mut head = serde_json::to_vec(line).map_err(|e| SandboxError::Io(e.into()))?;
        head.push(b'\n');
        let cgroups = self.cgroups(spec)?.map(Arc::new);
        let mut helper = tokio::process::Command::new(&self.exe);
        helper
            .arg(host::HOST_SUBCOMMAND)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Out of the operator's session and away from its terminal, with
        // the VMM it starts; and gone with the platform.
        crate::namespace::sys::new_session_on_spawn(&mut helper);
        crate::namespace::sys::die_with_spawner_on_spawn(&mut helper);
        let child = match helper.spawn() {
            Ok(c) => c,
            Err(e) => {
                if let Some(c) = &cgroups {
                    c.remove(Duration::from_millis(100));
                }
                return Err(e.into());
            }
        };
        if let (Some(c), Some(pid)) = (&cgroups, child.id()) {
            c.enter(pid).map_err(SandboxError::Limits)?;
        }
        Ok((child, cgroups, head))
    }

    /// A pooled guest's helper for `spec` (its machine alone): started,
    /// its first line written.
    pub(crate) fn start_pooled(
        &self,
        spec: &SandboxSpec,
    ) -> Result<(tokio::process::Child, Option<Arc<cgroup::RunCgroups>>), SandboxError> {
        ns_config::check_run_id(&spec.run_id)?;
        let ids = ns_config::HostIds::for_run(&spec.run_id);
        let image = self.image()?;
        // The QEMU driver's plan: no directory of its own.
        let plan = self.plan(spec, &ids, image, vec![], Path::new("/"))?;
        let line = HostLine::Pooled(config::PooledConfig {
            plan,
            vmm_uid: ids.uid,
            vmm_gid: ids.gid,
            vmm_switch: ids.switch,
        });
        let (child, cgroups, head) = self.start_helper(spec, &line)?;
        // A line of a few hundred bytes: the pipe takes it whole.
        if let Some(stdin) = child.stdin.as_ref() {
            use std::os::fd::AsFd;
            let mut sent = 0;
            while sent < head.len() {
                match rustix::io::write(stdin.as_fd(), &head[sent..]) {
                    Ok(n) => sent += n,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(SandboxError::Io(e.into())),
                }
            }
        }
        Ok((child, cgroups))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `bin` itself when it is a path, else the first file by that name on `PATH`.
pub(crate) fn on_path(bin: &Path) -> Option<PathBuf> {
    if bin.components().count() > 1 {
        return bin.is_file().then(|| bin.to_path_buf());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

/// The VMM's command (either driver's): no environment, no stdin, its
/// output to the helper's stderr, killed with the helper's handle, and
/// confined as it is spawned ([`crate::namespace::sys::confine_vmm_on_spawn`]:
/// with `switch`, its own namespaces and the run's `uid`/`gid`; always no
/// new privileges and death with the helper, race-free).
pub(crate) fn vmm_command(
    program: &str,
    args: &[String],
    switch: bool,
    uid: u32,
    gid: u32,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .kill_on_drop(true);
    crate::namespace::sys::confine_vmm_on_spawn(
        &mut cmd,
        crate::namespace::sys::VmmConfinement {
            switch,
            uid,
            gid,
            parent: rustix::process::getpid().as_raw_nonzero().get(),
        },
    );
    cmd
}

/// The agent's directory as a read-only ext4 image at `out` (`mkfs.ext4
/// -d`: a copy, in the run's own directory, gone with it).
fn agent_disk(dir: &Path, out: &Path) -> Result<(), SandboxError> {
    let size_mb = image::tree_bytes(dir) / (1 << 20) * 5 / 4 + 16;
    let o = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-O", "^has_journal", "-d"])
        .arg(dir)
        .arg(out)
        .arg(format!("{size_mb}M"))
        .stdin(Stdio::null())
        .output()
        .map_err(SandboxError::Io)?;
    if !o.status.success() {
        return Err(SandboxError::Io(std::io::Error::other(format!(
            "mkfs.ext4 -d {}: {}",
            dir.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ))));
    }
    Ok(())
}

impl Backend for MicrovmBackend {
    fn name(&self) -> &'static str {
        self.driver.backend_name()
    }

    fn check(&self) -> Result<(), Unavailable> {
        if self.driver == driver::Driver::Firecracker {
            return self.firecracker.check(self.accel);
        }
        if self.qemu_path().is_none() {
            return Err(Unavailable(format!(
                "{} is not installed (apt-get install qemu-system-x86), or set {}",
                self.qemu.display(),
                qemu::ENV_MICROVM_QEMU
            )));
        }
        if self.accel == qemu::Accel::Tcg {
            tracing::warn!("{}", qemu::TCG_WARNING);
        }
        Ok(())
    }

    /// The guest of this build is kept present: what is missing of it is
    /// built (a new build's root, from the cached base: seconds).
    fn boot(&self, say: &(dyn Fn(&str) + Sync)) -> Result<(), SandboxError> {
        if image::GuestImage::find_with(&self.images, &self.exe, self.kernel).is_err() {
            say("building the microVM guest of this build (missing)");
            image::GuestImage::build(&self.images, &self.exe, self.kernel, say).map_err(|e| {
                SandboxError::Unavailable {
                    backend: self.name(),
                    reason: e.to_string(),
                }
            })?;
        }
        Ok(())
    }

    fn paths(&self, run_dir: &Path) -> RunPaths {
        RunPaths {
            sockets_host: run_dir.join("sock"),
            sockets: PathBuf::from(SOCKETS_IN_GUEST),
            workspace: PathBuf::from(WORKSPACE_IN_GUEST),
        }
    }

    fn runtime_exe(&self, _host_exe: &Path) -> PathBuf {
        PathBuf::from(image::EXE_IN_GUEST)
    }

    /// The guest's programs are its root image's, not the host's.
    fn host_programs(&self) -> bool {
        false
    }

    fn local_runners(&self) -> Result<(), crate::NoLocalRunners> {
        Err(crate::NoLocalRunners::NotOnMicrovm)
    }

    fn spawn(&self, spec: &SandboxSpec) -> Result<Sandbox, SandboxError> {
        if spec.kind != SandboxKind::Agent {
            return Err(SandboxError::Unavailable {
                backend: self.name(),
                reason: crate::NoLocalRunners::NotOnMicrovm.to_string(),
            });
        }
        ns_config::check_run_id(&spec.run_id)?;
        if let Some(claimed) = self.take_claimed(spec) {
            return claimed;
        }
        let ids = ns_config::HostIds::for_run(&spec.run_id);
        let image = self.image()?;
        let run_dir = spec.sockets_dir.parent().unwrap_or(&spec.sockets_dir);
        let vm = run_dir.join("vm");
        std::fs::create_dir_all(&vm)?;
        let mut disks = vec![];
        for (i, dir) in spec.ro_paths.iter().enumerate() {
            let out = vm.join(format!("agent{i}.ext4"));
            agent_disk(dir, &out)?;
            std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o400))?;
            disks.push(out);
        }
        let plan = self.plan(spec, &ids, image, disks, &vm)?;
        let host = HostLine::Cold(HostConfig {
            plan,
            vmm_uid: ids.uid,
            vmm_gid: ids.gid,
            vmm_switch: ids.switch,
            sockets_dir: spec.sockets_dir.clone(),
            guest: GuestHeader::of(spec, spec.ro_paths.clone(), None),
        });
        let (child, cgroups, head) = self.start_helper(spec, &host)?;
        let mut sandbox = Sandbox::in_cgroups(child, cgroups)?;
        sandbox.feed_stdin(head, spec.stdin.clone(), spec.hold_stdin);
        Ok(sandbox)
    }

    fn claim_prepared(
        &self,
        tenant: &str,
        sandbox: &SandboxSpec,
        sidecar: &crate::SidecarSpec,
    ) -> bool {
        self.claim_guest(tenant, sandbox, sidecar)
    }

    fn drop_prepared(&self) {
        self.drain_pool();
    }
}

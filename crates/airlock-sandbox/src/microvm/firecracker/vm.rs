//! One guest's life under Firecracker: [`Vm::boot`] makes its jail, starts
//! the jailer, configures the machine over the API and starts it;
//! [`Vm::channel`] is the guest's connection; [`Vm::stop`] ends it and
//! removes the jail. A configuration step the API refuses is the boot's
//! error, naming the step, and the machine is never started.

use std::time::Duration;

use super::api::{Action, ActionType, Api, BootSource, Drive, MachineConfig, Step, Vsock};
use super::jail::{self, Jail};
use super::{
    API_SOCKET, BOOT_ARGS, FirecrackerError, FirecrackerPlan, GUEST_CID, MAX_VCPUS, VSOCK_SOCKET,
};

/// How often the API socket is looked for: Firecracker says nothing when
/// it listens, so its socket's answering is polled, within the API's bound.
const SOCKET_POLL: Duration = Duration::from_millis(5);

/// A started (or starting) guest.
#[derive(Debug)]
pub struct Vm {
    vmm: tokio::process::Child,
    api: Api,
    channel: tokio::net::UnixListener,
    started: bool,
    guest_timeout: Duration,
    stop_grace: Duration,
    /// Last: dropped (removed) after the VMM is gone.
    jail: Jail,
}

impl Vm {
    /// The jail, the jailer (its stdout, Firecracker's log and the guest's
    /// console, to this process's stderr), the configuration and the start.
    /// On an error, what was started is stopped and the jail removed.
    pub async fn boot(plan: &FirecrackerPlan) -> Result<Vm, FirecrackerError> {
        let jail = Jail::make(plan)?;
        let channel = jail.listen_channel(plan.uid, plan.gid)?;
        let argv = plan.jailer_argv();
        let (program, args) = argv.split_first().ok_or_else(|| FirecrackerError::Jailer {
            program: String::new(),
            source: std::io::ErrorKind::InvalidInput.into(),
        })?;
        // The jailer switches to the run's ids itself, after its chroot.
        let mut jailer = super::super::vmm_command(program, args, false, plan.uid, plan.gid);
        let vmm = jailer.spawn().map_err(|source| FirecrackerError::Jailer {
            program: program.clone(),
            source,
        })?;
        let mut vm = Vm {
            vmm,
            api: Api {
                socket: jail.at(API_SOCKET),
                timeout: plan.api_timeout(),
            },
            channel,
            started: false,
            guest_timeout: plan.guest_timeout(),
            stop_grace: plan.stop_grace(),
            jail,
        };
        match vm.configure(plan).await {
            Ok(()) => Ok(vm),
            Err(e) => {
                vm.stop().await;
                Err(e)
            }
        }
    }

    /// The VMM's process id (the jailer's, which execs Firecracker in place).
    pub fn pid(&self) -> Option<u32> {
        self.vmm.id()
    }

    /// The jail's root on the host.
    pub fn jail_root(&self) -> &std::path::Path {
        self.jail.root()
    }

    /// The pre-boot configuration, in the order the API documents, then
    /// the start.
    async fn configure(&mut self, plan: &FirecrackerPlan) -> Result<(), FirecrackerError> {
        self.api_ready().await?;
        self.put(
            Step::BootSource,
            &BootSource {
                kernel_image_path: format!("/{}", jail::KERNEL),
                initrd_path: Some(format!("/{}", jail::INITRD)),
                boot_args: BOOT_ARGS.into(),
            },
        )
        .await?;
        let drives = std::iter::once(("root".to_string(), jail::ROOT_DISK.to_string()))
            .chain((0..plan.disks.len()).map(|i| (format!("agent{i}"), jail::agent_disk(i))));
        for (id, file) in drives {
            let body = Drive {
                drive_id: id.clone(),
                path_on_host: format!("/{file}"),
                is_root_device: false,
                is_read_only: true,
            };
            self.put(Step::Drive(id), &body).await?;
        }
        self.put(
            Step::MachineConfig,
            &MachineConfig {
                vcpu_count: plan.vcpus.clamp(1, MAX_VCPUS),
                mem_size_mib: plan.memory_mb.max(128),
                smt: false,
            },
        )
        .await?;
        self.put(
            Step::Vsock,
            &Vsock {
                guest_cid: GUEST_CID,
                uds_path: format!("/{VSOCK_SOCKET}"),
            },
        )
        .await?;
        self.put(
            Step::InstanceStart,
            &Action {
                action_type: ActionType::InstanceStart,
            },
        )
        .await?;
        self.started = true;
        Ok(())
    }

    async fn put<T: serde::Serialize>(&self, step: Step, body: &T) -> Result<(), FirecrackerError> {
        self.api
            .put(&step, body)
            .await
            .map_err(|source| FirecrackerError::Api { step, source })
    }

    /// Until the API socket accepts a connection, the VMM exits, or the
    /// API's bound passes.
    async fn api_ready(&mut self) -> Result<(), FirecrackerError> {
        let bound = self.api.timeout;
        let socket = self.api.socket.clone();
        let answering = async {
            while tokio::net::UnixStream::connect(&socket).await.is_err() {
                tokio::time::sleep(SOCKET_POLL).await;
            }
        };
        tokio::select! {
            r = tokio::time::timeout(bound, answering) => {
                r.map_err(|_| FirecrackerError::NoApiSocket(bound))
            }
            s = self.vmm.wait() => Err(match s {
                Ok(s) => FirecrackerError::Exited(s),
                Err(e) => FirecrackerError::Stopped(e.to_string()),
            }),
        }
    }

    /// The guest's channel: its connection to the host's port, within the
    /// guest's bound, unless the VMM exits first.
    pub async fn channel(&mut self) -> Result<tokio::net::UnixStream, FirecrackerError> {
        let bound = self.guest_timeout;
        tokio::select! {
            r = tokio::time::timeout(bound, self.channel.accept()) => match r {
                Ok(Ok((s, _))) => Ok(s),
                Ok(Err(e)) => Err(FirecrackerError::Channel(e)),
                Err(_) => Err(FirecrackerError::NoGuest(bound)),
            },
            s = self.vmm.wait() => Err(FirecrackerError::Stopped(match s {
                Ok(s) => s.to_string(),
                Err(e) => e.to_string(),
            })),
        }
    }

    /// Until the VMM exits (the guest powered off or crashed).
    pub async fn exited(&mut self) -> String {
        match self.vmm.wait().await {
            Ok(s) => s.to_string(),
            Err(e) => e.to_string(),
        }
    }

    /// Ends the guest: a started one is asked to (`SendCtrlAltDel`, which
    /// makes Firecracker exit once the guest reboots) and given the grace;
    /// then the VMM is killed, waited for, and the jail removed.
    pub async fn stop(mut self) {
        if self.started && matches!(self.vmm.try_wait(), Ok(None)) {
            let asked = self
                .api
                .put(
                    &Step::SendCtrlAltDel,
                    &Action {
                        action_type: ActionType::SendCtrlAltDel,
                    },
                )
                .await;
            if asked.is_ok() {
                let _ = tokio::time::timeout(self.stop_grace, self.vmm.wait()).await;
            }
        }
        let _ = self.vmm.start_kill();
        let _ = self.vmm.wait().await;
    }
}

//! Sandboxes for runs: one [`Backend`] trait, several backends.
//!
//! A backend starts one command (normally `airlock runtime -- AGENT…`) in an
//! isolated environment and hands back a [`Sandbox`] to wait on or kill.
//! Everything the sandbox needs from outside is in [`SandboxSpec`]: the
//! sidecar is reached through the unix sockets in `sockets_dir`, which the
//! sandbox sees read-only (`connect(2)` works on a read-only mount, nothing
//! else does); the sandbox writes nowhere on the host disk: every write
//! lands on a capped tmpfs. [`Backend::paths`] says where the sandbox sees
//! the sockets and its workspace; [`Backend::sidecar_placement`] where the
//! run's sidecar runs (a host process on unix sockets, or — docker — a
//! container of its own that listens on those same unix sockets, the
//! sockets' directory bound into it).
#![deny(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitStatus;

/// What to start, and within which limits.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub run_id: String,
    /// argv[0] must be an absolute path visible inside the sandbox.
    pub command: Vec<String>,
    /// The complete environment of the command (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Written to the command's stdin, then stdin is closed (the runtime's secrets).
    pub stdin: Vec<u8>,
    /// Keeps `stdin` back until [`Sandbox::release_stdin`]: the sandbox
    /// starts meanwhile and its command blocks reading it. The orchestrator
    /// releases the runtime's secrets once the sidecar is ready, so the
    /// runtime's first connection to it succeeds (nothing polls), and a run
    /// whose sidecar never came up never hands its secrets over.
    pub hold_stdin: bool,
    /// Host directory holding the sidecar's sockets (nothing else). The
    /// sandbox sees it read-only at [`RunPaths::sockets`]; the docker
    /// backend writes the sandbox's resolver file beside it
    /// ([`docker::plane::resolver_file`]), never in it.
    pub sockets_dir: PathBuf,
    /// Extra host paths visible read-only at the same path (the agent's
    /// directory). The `airlock` binary is the backend's to provide
    /// ([`Backend::runtime_exe`]), not a path of this list.
    pub ro_paths: Vec<PathBuf>,
    /// The agent's working directory inside the sandbox ([`RunPaths::workspace`]:
    /// a tmpfs in the namespace backend, a host directory in the process backend).
    pub workspace: PathBuf,
    pub workspace_size_mb: u64,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids_max: u64,
    /// Whose sandbox this is: the agent's, or a local MCP runner's beside it.
    pub kind: SandboxKind,
}

/// Whose sandbox a [`SandboxSpec`] describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxKind {
    /// The run's agent (`airlock runtime -- AGENT…`).
    Agent,
    /// A local MCP runner of run `run` (`airlock runner -- SERVER…`), in a
    /// sandbox of its own: it reaches its sidecar through `sockets_dir`
    /// only, and has no network at all (no sandbox of the namespace or
    /// docker backends has one: a docker container of either kind gets
    /// `--network none`).
    Runner { run: String },
}

/// Where a sandbox sees what the platform prepares for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPaths {
    /// Host directory the platform creates for the sidecar's sockets.
    pub sockets_host: PathBuf,
    /// The same directory as the sandbox sees it (read-only there).
    pub sockets: PathBuf,
    /// The agent's working directory as the sandbox sees it.
    pub workspace: PathBuf,
}

pub use airlock_platform_api::launch::{BadHostPort, Endpoint, HostPort};

/// Where a run's sidecar runs and how the two sides meet: a backend's
/// decision ([`Backend::sidecar_placement`]), not the orchestrator's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarPlacement {
    /// Where the sidecar listens, as the sidecar sees it: API, proxy.
    pub listen: (Endpoint, Endpoint),
    /// How the runtime in the sandbox reaches them: API, proxy.
    pub reach: (Endpoint, Endpoint),
    /// The platform's internal-API socket, as the sidecar sees it.
    pub platform_socket: PathBuf,
    /// Names the sidecar refuses on every egress call besides the built-in
    /// ones (the run's own containers).
    pub blocked_names: Vec<String>,
    /// Where the sidecar opens the run's egress journal when that is not
    /// its host path (a sidecar in a container: a bind mount).
    pub egress_journal_inside: Option<PathBuf>,
    /// Where the sidecar sees the runners' sockets' directories when not at
    /// their host paths (a sidecar in a container: each bound under this
    /// directory by its name).
    pub runner_dirs_inside: Option<PathBuf>,
    /// The unix sockets of `listen` as the host names them: the platform
    /// opens them to the sandbox's uid once the sidecar is ready (a sidecar
    /// in a container names them by its own mount of their directory).
    pub host_sockets: Vec<PathBuf>,
}

impl SidecarPlacement {
    /// A runner's sockets' directory (`host_dir`, on the host) as the
    /// sidecar sees it: where it listens for that runner.
    pub fn runner_dir(&self, host_dir: &Path) -> PathBuf {
        match (&self.runner_dirs_inside, host_dir.file_name()) {
            (Some(inside), Some(name)) => inside.join(name),
            _ => host_dir.to_owned(),
        }
    }
}

/// What a backend needs to start a run's sidecar.
#[derive(Debug, Clone)]
pub struct SidecarSpec {
    pub run_id: String,
    /// The `airlock` binary on the host (a host-process sidecar runs
    /// `airlock sidecar`)…
    pub exe: PathBuf,
    /// …or this `airlock-sidecar` of the same build ([`own_sidecar_binary`]).
    pub own_binary: Option<PathBuf>,
    /// `AIRLOCK_LOG` of the sidecar.
    pub log: String,
    /// The configuration document, written to its stdin (then closed).
    pub config: Vec<u8>,
    /// The platform's internal-API socket on the host.
    pub platform_socket: PathBuf,
    /// The run's egress journal on the host (the platform's file, which
    /// the sidecar appends to).
    pub egress_journal: PathBuf,
    /// The run's sockets' directory on the host ([`RunPaths::sockets_host`]):
    /// where the sidecar listens for the agent. A host sidecar is told its
    /// sockets' paths in its configuration; a sidecar in a container
    /// (docker) has this directory bound into it.
    pub sockets_dir: PathBuf,
    /// The sockets' directory of each of the run's local runners, where
    /// the sidecar listens for it: on the host, and as the sidecar sees it
    /// ([`SidecarPlacement::runner_dir`]).
    pub runner_dirs: Vec<(PathBuf, PathBuf)>,
}

/// The unix-socket placement of the process and namespace backends: the
/// sidecar is a host process listening in the run's sockets directory.
pub fn host_sidecar_placement(paths: &RunPaths, platform_socket: &Path) -> SidecarPlacement {
    let (api, proxy) = (
        paths.sockets_host.join(SIDECAR_SOCKET),
        paths.sockets_host.join(PROXY_SOCKET),
    );
    SidecarPlacement {
        host_sockets: vec![api.clone(), proxy.clone()],
        listen: (Endpoint::Unix(api), Endpoint::Unix(proxy)),
        reach: (
            Endpoint::Unix(paths.sockets.join(SIDECAR_SOCKET)),
            Endpoint::Unix(paths.sockets.join(PROXY_SOCKET)),
        ),
        platform_socket: platform_socket.to_owned(),
        blocked_names: vec![],
        egress_journal_inside: None,
        runner_dirs_inside: None,
    }
}

/// In the sockets' directory: the sidecar's API and proxy sockets.
pub const SIDECAR_SOCKET: &str = "sidecar.sock";
pub const PROXY_SOCKET: &str = "proxy.sock";

/// The sidecar's own binary, `airlock-sidecar`, when it sits next to `exe`
/// (the `airlock` binary) and is of the same build: it holds only the
/// sidecar's code, so a run's sidecar maps less memory than `airlock
/// sidecar`, the same program. A binary that does not answer `--build` with
/// `build` (one left from another build, or anything else by that name) is
/// never used: `None`, and the platform starts `airlock sidecar`.
pub fn own_sidecar_binary(exe: &Path, build: &str) -> Option<PathBuf> {
    let own = exe.with_file_name(SIDECAR_EXE);
    if !std::fs::metadata(&own).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let out = std::process::Command::new(&own)
        .arg("--build")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let said = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && said.trim_end() == build {
        Some(own)
    } else {
        tracing::warn!(
            binary = %own.display(),
            "not starting this sidecar binary: it is not of this build of airlock (rebuild both: cargo build); using `airlock sidecar`"
        );
        None
    }
}

/// A pidfd for a child just spawned (not yet waited for, so `pid` is still
/// its own).
pub(crate) fn pid_fd(pid: Option<u32>) -> Option<std::os::fd::OwnedFd> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid?).ok()?)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// The sidecar's own binary's name (beside `airlock`).
pub const SIDECAR_EXE: &str = "airlock-sidecar";

/// Starts the sidecar as a host process (the process and namespace
/// backends' placement): its own binary where [`own_sidecar_binary`] found
/// one, else `airlock sidecar`.
pub fn spawn_host_sidecar(spec: &SidecarSpec) -> Result<Sandbox, SandboxError> {
    spawn_host_sidecar_in(spec, None)
}

/// What a run's sidecar may use, whichever backend runs it: the docker
/// backend's sidecar container has these limits, and so has the namespace
/// backend's host sidecar, in cgroups of its own
/// ([`namespace::cgroup::RunCgroups::create_sidecar`]). Memory in MiB, swap
/// included; processes and threads.
pub const SIDECAR_MEMORY_MB: u64 = 1024;
pub const SIDECAR_PIDS_MAX: u64 = 512;

/// [`spawn_host_sidecar`], the process moved into `cgroups` before it is
/// given its configuration (so before it listens or allocates for any
/// client); killed with them, and they are removed after it.
pub(crate) fn spawn_host_sidecar_in(
    spec: &SidecarSpec,
    cgroups: Option<namespace::cgroup::RunCgroups>,
) -> Result<Sandbox, SandboxError> {
    use tokio::io::AsyncWriteExt;
    let mut command = match &spec.own_binary {
        Some(own) => tokio::process::Command::new(own),
        None => {
            let mut c = tokio::process::Command::new(&spec.exe);
            c.arg("sidecar");
            c
        }
    };
    let mut child = command
        .env_clear()
        .env("AIRLOCK_LOG", &spec.log)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(SandboxError::SidecarStart)?;
    let pid = child.id();
    let cgroups = cgroups.map(std::sync::Arc::new);
    if let Some(c) = &cgroups {
        let entered = pid
            .ok_or(SandboxError::SidecarExited)
            .and_then(|pid| c.enter(pid).map_err(SandboxError::SidecarEnter));
        if let Err(e) = entered {
            let _ = child.start_kill();
            c.remove(std::time::Duration::from_millis(500));
            return Err(e);
        }
    }
    if let Some(mut stdin) = child.stdin.take() {
        let data = spec.config.clone();
        tokio::spawn(async move {
            let _ = stdin.write_all(&data).await;
            let _ = stdin.shutdown().await;
        });
    }
    Sandbox::in_cgroups(child, cgroups)
}

/// What a backend guarantees, as a program can read it (the run report
/// carries it, not only a warning on stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Isolation {
    /// Whether the agent is isolated from the host at all.
    pub isolates: bool,
    /// What the operator must know, when it does not.
    pub warning: Option<&'static str>,
}

/// The isolation of the backend named `name` (as stored with a run).
pub fn isolation_of(name: &str) -> Isolation {
    match name {
        "process" => Isolation {
            isolates: false,
            warning: Some(process::WARNING),
        },
        _ => Isolation {
            isolates: true,
            warning: None,
        },
    }
}

/// Why a backend cannot run here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

/// Why a sandbox (or a backend-placed sidecar) did not start: one variant
/// per failing step. The setup steps' messages start with `sandbox setup
/// failed:`.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("the {backend} backend is not available here: {reason}")]
    Unavailable {
        backend: &'static str,
        reason: String,
    },
    /// An operator setting that cannot work: found before anything starts.
    #[error("{var}: {message}")]
    Config { var: &'static str, message: String },
    #[error("sandbox I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The spec's command has no program.
    #[error("sandbox setup failed: empty command")]
    EmptyCommand,
    /// The process backend's command was gone before it could be watched.
    #[error("sandbox setup failed: the command exited at once")]
    CommandExited,
    /// A sandbox's first process was gone before it could be watched.
    #[error("sandbox setup failed: the sandbox exited before it started")]
    ExitedBeforeStart,
    /// The spec cannot be handed to the namespace init (or names a run no
    /// container may be named after).
    #[error("sandbox setup failed: {0}")]
    Spec(#[from] namespace::config::ConfigError),
    /// A read-only path the sandbox's host uid could not use.
    #[error("sandbox setup failed: {0}")]
    NotShareable(#[from] namespace::NotShareable),
    /// The running executable (the namespace init) cannot be found.
    #[error("sandbox setup failed: cannot locate the airlock binary: {0}")]
    InitBinary(#[source] std::io::Error),
    /// The run's cgroups cannot be made, and limits are required.
    #[error("sandbox setup failed: resource limits: {0}")]
    Limits(#[source] namespace::cgroup::CgroupError),
    /// No cgroup hierarchy to make the run's in, and limits are required.
    #[error("sandbox setup failed: {0}")]
    NoLimits(#[source] namespace::cgroup::CgroupError),
    /// The host sidecar's cgroups cannot be made, and limits are required.
    #[error("sandbox setup failed: the sidecar's limits: {0}")]
    SidecarLimits(#[source] namespace::cgroup::CgroupError),
    #[error("sandbox setup failed: cannot start the sidecar: {0}")]
    SidecarStart(#[source] std::io::Error),
    #[error("sandbox setup failed: the sidecar exited at once")]
    SidecarExited,
    /// The started sidecar cannot be moved into its cgroups.
    #[error("sandbox setup failed: cannot put the sidecar under its limits: {0}")]
    SidecarEnter(#[source] namespace::cgroup::CgroupError),
    /// The docker daemon, its networks or a container's start.
    #[error("sandbox setup failed: {0}")]
    Docker(#[from] docker::DockerError),
    /// Building or checking the docker backend's images.
    #[error("sandbox setup failed: {0}")]
    Images(#[from] docker::images::ImageError),
}

/// What a started sandbox's streams are read through.
pub type OutputStream = Box<dyn tokio::io::AsyncRead + Send + Unpin>;

/// A started sandbox (or a backend-placed sidecar): the host-side handle of
/// its first process, or of its container.
pub struct Sandbox {
    /// Host PID of the sandbox's first process (0 for a container: its
    /// processes are the container runtime's, not ours).
    pub pid: u32,
    stdout: Option<OutputStream>,
    stderr: Option<OutputStream>,
    inner: Inner,
    /// Lets the held stdin through ([`SandboxSpec::hold_stdin`]).
    stdin_gate: Option<tokio::sync::oneshot::Sender<()>>,
}

enum Inner {
    Child {
        child: tokio::process::Child,
        /// Kills everything the sandbox started (not only the first process).
        killer: Box<dyn Fn() + Send + Sync>,
        /// Removes what the backend created on the host (cgroups, mounts, …).
        cleaner: Option<Box<dyn FnOnce() + Send>>,
    },
    Container(docker::Container),
}

impl Sandbox {
    /// Wraps a started child. `killer` must kill every process of the
    /// sandbox; `cleaner` runs once, after the sandbox is gone.
    pub fn new(
        mut child: tokio::process::Child,
        killer: Box<dyn Fn() + Send + Sync>,
        cleaner: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<Sandbox, SandboxError> {
        let pid = child.id().ok_or(SandboxError::ExitedBeforeStart)?;
        let stdout = child.stdout.take().map(|s| Box::new(s) as OutputStream);
        let stderr = child.stderr.take().map(|s| Box::new(s) as OutputStream);
        Ok(Sandbox {
            pid,
            stdout,
            stderr,
            inner: Inner::Child {
                child,
                killer,
                cleaner,
            },
            stdin_gate: None,
        })
    }

    /// Wraps a started child whose processes are all in `cgroups` (when
    /// any): killed through a pidfd and with the cgroups, which are removed
    /// once it is gone. A pidfd names this process and no other: once it has
    /// exited and been reaped, its PID may be another process's (a server
    /// starts thousands), and a kill by number would hit that one.
    pub(crate) fn in_cgroups(
        child: tokio::process::Child,
        cgroups: Option<std::sync::Arc<namespace::cgroup::RunCgroups>>,
    ) -> Result<Sandbox, SandboxError> {
        let pidfd = pid_fd(child.id());
        let kill_cg = cgroups.clone();
        let killer = Box::new(move || {
            if let Some(fd) = &pidfd {
                let _ = rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL);
            }
            if let Some(c) = &kill_cg {
                c.kill();
            }
        });
        let cleaner: Option<Box<dyn FnOnce() + Send>> = cgroups.map(|c| {
            Box::new(move || c.remove(std::time::Duration::from_secs(2)))
                as Box<dyn FnOnce() + Send>
        });
        Sandbox::new(child, killer, cleaner)
    }

    /// `stdin_gate` holds the container's stdin back until
    /// [`Sandbox::release_stdin`] ([`SandboxSpec::hold_stdin`]).
    pub(crate) fn container(
        c: docker::Container,
        stdout: OutputStream,
        stderr: OutputStream,
        stdin_gate: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Sandbox {
        Sandbox {
            pid: 0,
            stdout: Some(stdout),
            stderr: Some(stderr),
            inner: Inner::Container(c),
            stdin_gate,
        }
    }

    /// Writes `head`, then `body` (once released when `hold` is set), to
    /// the child's stdin, then closes it. What the pipe takes of `head` at
    /// once is written here (all of a small one: the child reads it without
    /// waiting for a task to be scheduled), the rest in the background.
    /// Dropping the sandbox (or cleaning it up) before the release closes
    /// stdin without `body`.
    pub(crate) fn feed_stdin(&mut self, head: Vec<u8>, body: Vec<u8>, hold: bool) {
        use std::os::fd::AsFd;
        use tokio::io::AsyncWriteExt;
        let Inner::Child { child, .. } = &mut self.inner else {
            return;
        };
        let Some(mut stdin) = child.stdin.take() else {
            return;
        };
        let mut sent = 0;
        while sent < head.len() {
            match rustix::io::write(stdin.as_fd(), &head[sent..]) {
                Ok(n) => sent += n,
                Err(rustix::io::Errno::INTR) => {}
                // Full (or gone): the task below takes it from here.
                Err(_) => break,
            }
        }
        let gate = hold.then(|| {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            self.stdin_gate = Some(tx);
            rx
        });
        tokio::spawn(async move {
            if stdin.write_all(&head[sent..]).await.is_err() {
                return;
            }
            if let Some(gate) = gate
                && gate.await.is_err()
            {
                return;
            }
            let _ = stdin.write_all(&body).await;
            let _ = stdin.shutdown().await;
        });
    }

    /// The stream read as the command's stdout, in place of the child's
    /// own (a pooled microVM guest's, whose first line its pool read).
    pub(crate) fn set_stdout(&mut self, s: OutputStream) {
        self.stdout = Some(s);
    }

    /// Runs `f` once the sandbox is gone, after what the backend cleans
    /// (a pooled guest's tenant share is given back so).
    pub(crate) fn also_clean(&mut self, f: Box<dyn FnOnce() + Send>) {
        if let Inner::Child { cleaner, .. } = &mut self.inner {
            let before = cleaner.take();
            *cleaner = Some(Box::new(move || {
                if let Some(b) = before {
                    b();
                }
                f();
            }));
        }
    }

    /// The container a docker sandbox is ([`docker::pool`] renames it).
    pub(crate) fn container_mut(&mut self) -> Option<&mut docker::Container> {
        match &mut self.inner {
            Inner::Container(c) => Some(c),
            Inner::Child { .. } => None,
        }
    }

    /// Holds the container's stdin back behind a gate opened by
    /// [`Sandbox::release_stdin`] (a claimed pooled container's).
    pub(crate) fn gate_stdin(&mut self) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        self.stdin_gate = Some(tx);
        rx
    }

    /// Lets the held stdin ([`SandboxSpec::hold_stdin`]) through to the
    /// command. Does nothing when it was not held, or once released.
    pub fn release_stdin(&mut self) {
        if let Some(gate) = self.stdin_gate.take() {
            let _ = gate.send(());
        }
    }

    /// The command's stdout and stderr (the runtime's own diagnostics).
    pub fn take_output(&mut self) -> (Option<OutputStream>, Option<OutputStream>) {
        (self.stdout.take(), self.stderr.take())
    }

    /// Waits for the first process to exit.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match &mut self.inner {
            Inner::Child { child, .. } => child.wait().await,
            Inner::Container(c) => c.wait().await,
        }
    }

    /// Kills every process of the sandbox. Safe to call more than once.
    pub fn kill(&self) {
        match &self.inner {
            Inner::Child { killer, .. } => killer(),
            Inner::Container(c) => c.kill(),
        }
    }

    /// Asks the first process to stop (SIGTERM), waits up to `grace` for it
    /// to exit by itself, then kills what is left and cleans up.
    pub async fn stop(mut self, grace: std::time::Duration) {
        self.terminate(grace, std::future::pending::<()>()).await;
        self.cleanup().await;
    }

    /// Asks the first process to stop (SIGTERM) and waits, at most `grace`,
    /// until it says it is done (`done`) or exits, whichever is first.
    /// `false`: neither within `grace`. Kills and removes nothing (see
    /// [`Sandbox::cleanup`]). A sidecar is stopped this way, so every event
    /// it holds reaches the platform before the run's end is recorded.
    pub async fn terminate(
        &mut self,
        grace: std::time::Duration,
        done: impl std::future::Future<Output = ()>,
    ) -> bool {
        // A stdin still held is closed, never released.
        self.stdin_gate = None;
        match &mut self.inner {
            Inner::Child { child, .. } => {
                if let Some(pid) = child
                    .id()
                    .and_then(|p| rustix::process::Pid::from_raw(i32::try_from(p).ok()?))
                {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                }
            }
            Inner::Container(c) => c.signal_term().await,
        }
        let over = async {
            tokio::select! {
                () = done => {}
                _ = self.wait() => {}
            }
        };
        tokio::time::timeout(grace, over).await.is_ok()
    }

    /// Kills every process of the sandbox and waits for the first to have
    /// exited; what the backend created on the host stays until
    /// [`Sandbox::cleanup`].
    pub async fn halt(&mut self) {
        self.stdin_gate = None;
        self.kill();
        let _ = self.wait().await;
        if let Inner::Container(c) = &self.inner {
            c.stopped();
        }
    }

    /// Kills what is left and removes what the backend created on the host.
    pub async fn cleanup(mut self) {
        // A stdin still held is closed, never released (a container's start
        // is over only once its stdin is).
        self.stdin_gate = None;
        self.kill();
        match &mut self.inner {
            Inner::Child { child, cleaner, .. } => {
                let _ = child.wait().await;
                if let Some(clean) = cleaner.take() {
                    clean();
                }
            }
            Inner::Container(c) => c.remove().await,
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        match &mut self.inner {
            Inner::Child {
                killer, cleaner, ..
            } => {
                killer();
                if let Some(clean) = cleaner.take() {
                    clean();
                }
            }
            Inner::Container(c) => c.forget(),
        }
    }
}

/// A way to build sandboxes.
pub trait Backend: Send + Sync {
    /// `process`, `namespace`, …
    fn name(&self) -> &'static str;
    /// Whether the backend works on this host, and why not.
    fn check(&self) -> Result<(), Unavailable>;
    /// Whether the backend isolates anything at all.
    fn isolates(&self) -> bool {
        isolation_of(self.name()).isolates
    }
    /// Where the sandbox of the run whose host directory is `run_dir` sees
    /// the sidecar's sockets and its workspace.
    fn paths(&self, run_dir: &Path) -> RunPaths;
    /// Starts `spec.command`. Must not block for long. Call it from a
    /// thread that outlives the run (a runtime's worker, or the thread
    /// blocking on the runtime; not `spawn_blocking`, whose threads come and
    /// go): a sandbox dies with the thread that started it.
    fn spawn(&self, spec: &SandboxSpec) -> Result<Sandbox, SandboxError>;
    /// The `airlock` binary as the sandbox sees it (it runs `airlock
    /// runtime`): the host's own by default (the process backend); the
    /// namespace backend binds the file alone read-only at a fixed path,
    /// the docker backend's images hold it.
    fn runtime_exe(&self, host_exe: &Path) -> PathBuf {
        host_exe.to_owned()
    }
    /// Where the run's sidecar runs, and how the sandbox reaches it. By
    /// default a host process on the run's unix sockets.
    fn sidecar_placement(
        &self,
        run_id: &str,
        paths: &RunPaths,
        platform_socket: &Path,
    ) -> SidecarPlacement {
        let _ = run_id;
        host_sidecar_placement(paths, platform_socket)
    }
    /// Once, when a platform starts with this backend: reclaims what dead
    /// platforms left and makes sure what every run needs is there (docker:
    /// its images, kept present; the egress network). Tells `say` what it does.
    fn boot(&self, say: &(dyn Fn(&str) + Sync)) -> Result<(), SandboxError> {
        let _ = say;
        Ok(())
    }
    /// Whether its sandboxes are ready for the transparent plane
    /// (`airlock_platform_api::transparent`): a resolver address the
    /// runtime may listen on, named by the sandbox's `/etc/resolv.conf`,
    /// and low ports it may bind, on a loopback of the sandbox's own.
    fn transparent_plane(&self) -> bool {
        false
    }
    /// Whether a sandbox's programs outside the agent's directory are the
    /// host's own (its `/usr`, read-only), so that the platform can check
    /// one before anything starts; docker: no, they are the agent image's.
    fn host_programs(&self) -> bool {
        true
    }
    /// Whether this backend can start a local MCP runner in a sandbox of its
    /// own ([`SandboxKind::Runner`]) that isolates it from the sidecar, the
    /// agent and the host; the refusal says why not, and what to do.
    fn local_runners(&self) -> Result<(), NoLocalRunners> {
        if self.isolates() {
            Ok(())
        } else {
            Err(NoLocalRunners::IsolatesNothing {
                backend: self.name(),
            })
        }
    }
    /// Starts the run's sidecar where [`Backend::sidecar_placement`] put it.
    /// Must not block for long.
    fn spawn_sidecar(&self, spec: &SidecarSpec) -> Result<Sandbox, SandboxError> {
        spawn_host_sidecar(spec)
    }
    /// A spawn is coming: start, in the background, what can be started
    /// before its spec is known (the namespace backend starts its init,
    /// which waits for the spec holding nothing of any run, and on cgroup
    /// v1 makes standby cgroups for it to join meanwhile, which the spawn
    /// renames to its run's). At most one is kept; the next spawn takes it,
    /// and a spawn without one starts cold.
    /// From the same kind of thread as [`Backend::spawn`]. Nothing by
    /// default (the process and docker backends).
    fn prepare(&self) {}
    /// Sets aside, for the run `sandbox` and `sidecar` describe, a sandbox
    /// and a sidecar the backend started before any run and that hold
    /// nothing of one (docker's warm pool, `DOCKER_WARM_POOL`), within
    /// `tenant`'s share of them; the run's [`Backend::spawn`] and
    /// [`Backend::spawn_sidecar`] then take them instead of starting cold.
    /// Whether one was set aside (false by default: every start is cold).
    /// Called once per run, right before its spawns.
    fn claim_prepared(&self, tenant: &str, sandbox: &SandboxSpec, sidecar: &SidecarSpec) -> bool {
        let _ = (tenant, sandbox, sidecar);
        false
    }
    /// A run's end is recorded: what the backend held back so as not to
    /// slow that run starts now (docker's warm pool starts the pair that
    /// replaces the one the run took, [`Backend::claim_prepared`]). From
    /// the same kind of thread as [`Backend::spawn`]. Nothing by default.
    fn run_ended(&self) {}
    /// The platform stops: what the backend started ahead and no run
    /// claimed is removed now (what a platform killed leaves is its
    /// backend's boot reclaim's). Blocks until done.
    fn drop_prepared(&self) {}
}

/// Why a backend cannot start a local MCP runner ([`Backend::local_runners`]),
/// and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoLocalRunners {
    #[error(
        "the {backend} backend isolates nothing: the runner would be a same-user process beside the \
         sidecar, able to read its memory and environment. Run it with RUN_ADAPTER=namespace \
         (this version has no INTEGRATION_RUNTIME_ADAPTER)"
    )]
    IsolatesNothing { backend: &'static str },
    #[error(
        "the microvm backend runs no local MCP runner (a runner would need a guest of its own); \
         run it with RUN_ADAPTER=namespace"
    )]
    NotOnMicrovm,
}

/// `x` as a whole number in `0..=max`, rounded down: what a limit
/// computed in floating point (CPUs × a period) means. A float-to-integer
/// `as` saturates and maps NaN to 0; the clamp says so.
pub(crate) fn whole(x: f64, max: u64) -> u64 {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let n = x.clamp(0.0, max as f64) as u64;
    n
}

pub mod diagnose;
pub mod docker;
pub mod microvm;
pub mod namespace;
pub mod pools;
pub mod process;
pub mod seccomp;
pub mod syscalls;
pub mod warm;

/// Kept at their old paths for the platform and the CLI: they live in
/// `airlock-untrusted`, which the in-sandbox runtime links instead of this crate.
pub use airlock_untrusted::{file as untrusted, terminal};
pub use diagnose::{Diagnosis, diagnose};

/// The backend for a `RUN_ADAPTER` value: `process`, `namespace`, `docker`,
/// `microvm`, `firecracker` (the microvm backend's firecracker driver), or `auto` (`namespace` where it works here, else `process` with a loud
/// warning; `auto` never picks `docker`: the Docker socket is root on the
/// host, an operator opts into it by name).
/// `namespace` uses the running executable (the `airlock` binary) as the
/// sandbox init; see [`namespace::NamespaceBackend::with_exe`] for another.
pub fn select(name: &str) -> Result<Box<dyn Backend>, SandboxError> {
    match name {
        "process" => Ok(Box::new(process::ProcessBackend)),
        "namespace" => {
            let ns = namespace::NamespaceBackend::current()?;
            ns.check().map_err(|u| SandboxError::Unavailable {
                backend: "namespace",
                reason: u.0,
            })?;
            Ok(Box::new(ns))
        }
        "auto" => {
            let ns = namespace::NamespaceBackend::current()?;
            match ns.check() {
                Ok(()) => Ok(Box::new(ns)),
                Err(Unavailable(why)) => {
                    tracing::warn!(
                        "the namespace sandbox is not available here ({why}); falling back to the process backend: {}",
                        process::WARNING
                    );
                    Ok(Box::new(process::ProcessBackend))
                }
            }
        }
        "docker" => {
            let d = docker::DockerBackend::from_env()?;
            d.check().map_err(|u| SandboxError::Unavailable {
                backend: "docker",
                reason: u.0,
            })?;
            Ok(Box::new(d))
        }
        "microvm" | "firecracker" => {
            let m = microvm::MicrovmBackend::from_env(name)?;
            m.check().map_err(|u| SandboxError::Unavailable {
                backend: m.name(),
                reason: u.0,
            })?;
            Ok(Box::new(m))
        }
        other => Err(SandboxError::Unavailable {
            backend: "unknown",
            reason: format!(
                "no backend named {other:?} (process, namespace, docker, microvm, firecracker, auto)"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    /// A script named `airlock-sidecar` beside a (pretend) `airlock`.
    fn beside(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
        let own = dir.join(super::SIDECAR_EXE);
        std::fs::write(&own, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir.join("airlock")
    }

    /// Only a sidecar binary that says it is of this very build is started
    /// in place of `airlock sidecar`: one left from another build, one that
    /// fails, or one that is not there is not.
    #[test]
    fn only_a_sidecar_binary_of_the_same_build_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("airlock");
        assert_eq!(super::own_sidecar_binary(&exe, "0.1.0-abc"), None);
        let exe = beside(dir.path(), r#"[ "$1" = --build ] && echo 0.1.0-abc"#);
        assert_eq!(
            super::own_sidecar_binary(&exe, "0.1.0-abc"),
            Some(dir.path().join(super::SIDECAR_EXE))
        );
        assert_eq!(super::own_sidecar_binary(&exe, "0.1.0-def"), None);
        let exe = beside(dir.path(), "echo 0.1.0-abc; exit 3");
        assert_eq!(super::own_sidecar_binary(&exe, "0.1.0-abc"), None);
        // A directory by that name is not a binary.
        let other = tempfile::tempdir().unwrap();
        std::fs::create_dir(other.path().join(super::SIDECAR_EXE)).unwrap();
        assert_eq!(
            super::own_sidecar_binary(&other.path().join("airlock"), "0.1.0-abc"),
            None
        );
    }
}

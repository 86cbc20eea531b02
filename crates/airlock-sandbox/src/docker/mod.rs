//! The `docker` backend: each run is an agent container with no network
//! and a sidecar container on the shared egress network; they meet only
//! through unix sockets on a bind mount.
//!
//! ```text
//!  (no network: `--network none`, `lo` alone)
//!    agent    airlock-<run>-agent    `airlock runtime -- AGENT…`, AGENT_IMAGE
//!               /run/airlock (ro) = runs/<id>/sock/{sidecar.sock,proxy.sock}
//!    runner   airlock-<run>-r<N>-runner  `airlock runner -- SERVER…`, AGENT_IMAGE
//!               /run/airlock (ro) = runs/<id>/runner-<N>/{mcp.sock,proxy.sock}
//!  airlock-egress  (shared, created once, never deleted; no traffic between
//!                   its containers)
//!    sidecar  airlock-<run>-sidecar  `airlock sidecar`, SIDECAR_IMAGE
//!               listens in /run/airlock/agent (rw) = runs/<id>/sock
//!               and /run/airlock/runners/runner-<N> (rw) = runs/<id>/runner-<N>
//! ```
//!
//! The agent's container, like a local MCP runner's, has a network
//! namespace of its own with nothing in it but `lo`: no interface, no
//! route, no resolver but its own runtime's. Its runtime reaches its
//! sidecar only through the two unix sockets of the run's sockets'
//! directory (`runs/<id>/sock/`), bound read-only at `/run/airlock`
//! (`connect(2)` works on a read-only mount, nothing else does), and relays
//! the agent's loopback to them, as the namespace backend's does. The
//! sidecar's container has that directory bound at
//! [`AGENT_SOCKETS_IN_SIDECAR`], where it listens, and each runner's at
//! `/run/airlock/runners/runner-<N>`; the platform opens the sockets to
//! the sandboxes' uids once the sidecar is ready. No network is made per
//! run (boot reclaim still removes the `airlock-exec-<run>` networks an
//! earlier version left, [`reclaim`]).
//!
//! Unix sockets on a bind mount need the sandbox's kernel to reach the
//! host's: runc's is the host's; gVisor's refuses host sockets unless
//! registered with `--host-uds=open`, and a gVisor `DOCKER_RUNTIME`
//! without it is refused at boot ([`diagnose::host_sockets_verdict`]).
//! The sidecar reaches the platform through the platform's unix socket,
//! bound read-only into its container.
//!
//! The agent container: `CapDrop: ALL`, `no-new-privileges`, the namespace
//! backend's seccomp deny list as a Docker profile ([`profile`]), the
//! namespace backend's masked `/proc` entries, a read-only root, a dedicated
//! unprivileged uid per run, memory/CPU/pids limits, tmpfs workspace and
//! `/tmp` capped at `WORKSPACE_TMPFS_SIZE_MB`, no `/dev/shm`, no log file on
//! the host (`LogConfig: none`; output is read through attach). Under runc
//! the agent's and the runners' containers get the transparent plane's part
//! of the sandbox ([`plane`]).
//!
//! Talks to the Engine API with `bollard` (version negotiated: Docker 20.10
//! speaks 1.41); `DOCKER_HOST` may be `unix://` or `tcp://`. Bind mounts
//! (the agent's directory, the platform socket) name paths of the machine the
//! daemon runs on: a remote daemon needs them there too.
//!
//! The trait's calls are synchronous and must not block: `spawn` and
//! `spawn_sidecar` return at once and the containers are created and started
//! in a task; a failure shows on the handle's stderr as
//! `airlock sandbox-init: docker: …` and as exit status 125.
//! A run's two containers start concurrently (each its own task, neither
//! waits for the other: the agent's runtime waits on its stdin for its
//! secrets, which the platform hands over once the sidecar is ready), or
//! not at all: with
//! `DOCKER_WARM_POOL`, a pair started before the run and holding nothing of
//! it is claimed instead ([`pool`]).

pub mod diagnose;
pub mod egress;
mod error;
pub mod images;
pub mod init;
pub mod plane;
pub mod pool;
pub mod profile;
pub mod reclaim;

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, NetworkCreateRequest};
use bollard::query_parameters as q;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::{
    Backend, Endpoint, HostPort, RunPaths, Sandbox, SandboxError, SandboxKind, SandboxSpec,
    SidecarPlacement, SidecarSpec, Unavailable,
};

pub use error::{ApiError, DockerError};
pub use images::{ImageRef, ImagesConfig};

/// The API version Airlock asks for at least (Docker 20.10).
pub const MIN_API_VERSION: &str = "1.41";
/// The shared egress network: created once, never deleted (several platforms
/// may share one daemon).
pub const EGRESS_NETWORK: &str = "airlock-egress";
/// Where the sidecar's container sees the run's sockets' directory
/// ([`RunPaths::sockets_host`]), where it listens for the agent.
pub const AGENT_SOCKETS_IN_SIDECAR: &str = "/run/airlock/agent";
/// The platform's socket inside the sidecar's container.
pub const PLATFORM_SOCKET_INSIDE: &str = "/run/airlock/platform.sock";
/// The run's egress journal in the sidecar's container (a bind mount of
/// the platform's file; nothing else of the run directory is mounted).
pub const EGRESS_JOURNAL_INSIDE: &str = "/run/airlock/egress.journal";
/// Where an agent's or a runner's container sees its sockets' directory
/// ([`RunPaths::sockets`]).
pub const SOCKETS_INSIDE: &str = "/run/airlock";
/// Where the sidecar's container sees the runners' sockets' directories.
pub const RUNNERS_INSIDE: &str = "/run/airlock/runners";
/// The `airlock` binary inside both images.
pub const AIRLOCK_IN_IMAGE: &str = "/usr/local/bin/airlock";
/// The agent's workspace inside its container.
pub const WORKSPACE: &str = "/workspace";

/// Labels every object Airlock creates carries.
pub const LABEL_MANAGED: &str = "airlock.managed";
pub const LABEL_RUN: &str = "airlock.run";
pub const LABEL_ROLE: &str = "airlock.role";
/// Who owns a run's objects: `<boot id>:<pid>:<start time>` of the platform.
pub const LABEL_OWNER: &str = "airlock.owner";

/// The name of a run's network: none is made any more (every sandbox
/// container is on `--network none`); boot reclaim still removes those a
/// platform of an earlier version left ([`reclaim`]).
pub fn network_name(run_id: &str) -> String {
    format!("airlock-exec-{run_id}")
}

/// The name of a run's container of `role` (`agent`, `sidecar`).
pub fn container_name(run_id: &str, role: &str) -> String {
    format!("airlock-{run_id}-{role}")
}

/// The operator's settings of the docker backend, read from the environment
/// and checked before anything starts.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// `DOCKER_HOST` (`unix:///var/run/docker.sock` when unset).
    pub host: String,
    pub images: ImagesConfig,
    /// `DOCKER_RUNTIME` for the agent container (`runc` when unset; `runsc`
    /// for gVisor).
    pub runtime: Option<String>,
    /// `DOCKER_WARM_POOL`: idle pairs kept per [`pool::PoolKey`] (0, the
    /// default: no pool).
    pub warm_pool: usize,
    /// `DOCKER_EGRESS_SUBNET`: the range [`EGRESS_NETWORK`] is created with
    /// ([`egress::DEFAULT_EGRESS_SUBNET`] when unset).
    pub egress_subnet: ipnet::Ipv4Net,
}

/// The largest `DOCKER_WARM_POOL`.
pub const MAX_WARM_POOL: usize = 64;

impl DockerConfig {
    pub fn from_env() -> Result<DockerConfig, SandboxError> {
        let vars: HashMap<String, String> = std::env::vars().collect();
        Self::from_vars(&vars, &std::env::current_exe()?)
    }

    /// From explicit variables; `exe` is the `airlock` binary the default
    /// image tags are derived from.
    pub fn from_vars(
        vars: &HashMap<String, String>,
        exe: &Path,
    ) -> Result<DockerConfig, SandboxError> {
        let get = |k: &str| vars.get(k).map(String::as_str).filter(|v| !v.is_empty());
        let host = get("DOCKER_HOST")
            .unwrap_or("unix:///var/run/docker.sock")
            .to_owned();
        let host_ok = host
            .strip_prefix("unix://")
            .is_some_and(|p| p.starts_with('/'))
            || ["tcp://", "http://"].iter().any(|s| {
                host.strip_prefix(s)
                    .is_some_and(|a| HostPort::try_from(a.trim_end_matches('/').to_owned()).is_ok())
            });
        if !host_ok {
            return Err(SandboxError::Config {
                var: "DOCKER_HOST",
                message: format!("{host:?} is not unix:///path or tcp://host:port"),
            });
        }
        let runtime = get("DOCKER_RUNTIME").map(str::to_owned);
        if let Some(r) = &runtime
            && !(r.len() <= 64
                && r.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
        {
            return Err(SandboxError::Config {
                var: "DOCKER_RUNTIME",
                message: format!("{r:?} is not a runtime name (runc, runsc, …)"),
            });
        }
        let warm_pool = match get("DOCKER_WARM_POOL") {
            None => 0,
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= MAX_WARM_POOL)
                .ok_or_else(|| SandboxError::Config {
                    var: "DOCKER_WARM_POOL",
                    message: format!("{v:?} is not a number of pairs from 0 to {MAX_WARM_POOL}"),
                })?,
        };
        let egress_subnet = egress::parse_subnet(
            get(egress::ENV_EGRESS_SUBNET).unwrap_or(egress::DEFAULT_EGRESS_SUBNET),
        )
        .map_err(|message| SandboxError::Config {
            var: egress::ENV_EGRESS_SUBNET,
            message,
        })?;
        let images = ImagesConfig::from_vars(vars, exe)?;
        Ok(DockerConfig {
            host,
            images,
            runtime,
            warm_pool,
            egress_subnet,
        })
    }
}

/// Connects to the daemon of `host` and negotiates the API version (never
/// above what the daemon speaks; at least [`MIN_API_VERSION`]).
pub async fn connect(host: &str) -> Result<Docker, DockerError> {
    let d = Docker::connect_with_host(host)
        .map_err(|source| DockerError::Client {
            host: host.to_owned(),
            source,
        })?
        .with_timeout(Duration::from_secs(300));
    let d = d
        .negotiate_version()
        .await
        .map_err(|source| DockerError::NoAnswer {
            host: host.to_owned(),
            source,
        })?;
    let v = d.client_version();
    if (v.major_version, v.minor_version) < (1, 41) {
        return Err(DockerError::OldApi {
            host: host.to_owned(),
            major: v.major_version,
            minor: v.minor_version,
        });
    }
    Ok(d)
}

/// Runs `f` to completion on a thread of its own (a current-thread runtime):
/// for the trait's synchronous calls made from inside another runtime.
pub(crate) fn block_on<T: Send>(f: impl std::future::Future<Output = T> + Send) -> Option<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()
                .map(|rt| rt.block_on(f))
        })
        .join()
        .ok()
        .flatten()
    })
}

fn not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

fn conflict(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 409,
            ..
        }
    )
}

/// The backend's client of the daemon, once connected.
pub(crate) type Daemon = Arc<tokio::sync::OnceCell<Docker>>;

/// The client in `daemon`, connected to `host` first if it is not yet (an
/// API version negotiated once, not per container).
pub(crate) async fn client_of(daemon: &Daemon, host: &str) -> Result<Docker, DockerError> {
    daemon.get_or_try_init(|| connect(host)).await.cloned()
}

pub struct DockerBackend {
    pub cfg: DockerConfig,
    /// Connected once, in the runtime of the first caller (a container's
    /// start task among them), then shared by every call of this backend.
    docker: Daemon,
    /// The platform that owns what this backend creates ([`LABEL_OWNER`]).
    owner: String,
    /// Pairs started before their runs ([`pool`]).
    pool: pool::Pool,
}

impl DockerBackend {
    pub fn from_env() -> Result<DockerBackend, SandboxError> {
        Ok(DockerBackend::new(DockerConfig::from_env()?))
    }

    pub fn new(cfg: DockerConfig) -> DockerBackend {
        DockerBackend {
            pool: pool::new_pool(cfg.warm_pool),
            cfg,
            docker: Daemon::default(),
            owner: reclaim::owner_label(),
        }
    }

    /// The daemon (connected once, in the runtime of the first caller).
    pub async fn docker(&self) -> Result<Docker, SandboxError> {
        Ok(self
            .docker
            .get_or_try_init(|| connect(&self.cfg.host))
            .await
            .cloned()?)
    }

    /// The shared egress network, created if missing. Several platforms may
    /// race here: API 1.41 has no atomic create-if-absent, so a duplicate
    /// name is settled by keeping the oldest.
    pub async fn ensure_egress_network(&self) -> Result<(), SandboxError> {
        let d = self.docker().await?;
        Ok(ensure_egress_network(&d, self.cfg.egress_subnet).await?)
    }

    fn labels(&self, run_id: &str, role: &str) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_MANAGED.into(), "true".into()),
            (LABEL_RUN.into(), run_id.into()),
            (LABEL_ROLE.into(), role.into()),
            (LABEL_OWNER.into(), self.owner.clone()),
        ])
    }

    /// Starts container `name` of run `run_id` in a task: create, attach,
    /// start, stdin as `feed` says. `egress`: the sidecar's, whose one
    /// network is [`EGRESS_NETWORK`] (made first if missing); every other
    /// container has none.
    fn launch(
        &self,
        run_id: &str,
        name: String,
        body: ContainerCreateBody,
        feed: Feed,
        egress: bool,
    ) -> Result<Sandbox, SandboxError> {
        crate::namespace::config::check_run_id(run_id)?;
        let handle = tokio::runtime::Handle::try_current().map_err(|_| DockerError::NoRuntime)?;
        let (out_r, out_w) = tokio::io::simplex(64 * 1024);
        let (err_r, err_tx) = stderr_of(&handle);
        let shared = Arc::new(Shared {
            client: std::sync::OnceLock::new(),
            killed: AtomicBool::new(false),
            slot: std::sync::OnceLock::new(),
        });
        if let Some(d) = self.docker.get() {
            let _ = shared.client.set(d.clone());
        }
        let (done, started) = tokio::sync::watch::channel::<Option<bool>>(None);
        let (gate_tx, feed) = match feed {
            Feed::Now(stdin) => (None, StartFeed::Now(stdin)),
            Feed::Held(stdin) => {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                (Some(tx), StartFeed::Held(stdin, rx))
            }
            Feed::Parked(tx) => (None, StartFeed::Parked(tx)),
        };
        let task = StartTask {
            host: self.cfg.host.clone(),
            daemon: self.docker.clone(),
            name: name.clone(),
            shared: shared.clone(),
            egress,
            egress_subnet: self.cfg.egress_subnet,
            feed: Some(feed),
            body,
            out_w: Some(out_w),
            err_tx,
        };
        handle.spawn(async move {
            let ok = task.run().await;
            let _ = done.send(Some(ok));
        });
        let c = Container {
            name,
            host: self.cfg.host.clone(),
            started,
            shared,
            handle,
            removed: false,
            exited: None,
        };
        Ok(Sandbox::container(
            c,
            Box::new(out_r),
            Box::new(err_r),
            gate_tx,
        ))
    }
}

/// A container's stderr as its handle reads it, and the one way to write
/// to it: it has two writers (the container, and this backend's own words
/// when a start fails), so one task owns it.
fn stderr_of(
    handle: &tokio::runtime::Handle,
) -> (
    tokio::io::ReadHalf<tokio::io::SimplexStream>,
    tokio::sync::mpsc::Sender<bytes::Bytes>,
) {
    let (err_r, mut err_w) = tokio::io::simplex(16 * 1024);
    let (err_tx, mut err_rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
    handle.spawn(async move {
        while let Some(m) = err_rx.recv().await {
            if err_w.write_all(&m).await.is_err() {
                continue;
            }
        }
        let _ = err_w.shutdown().await;
    });
    (err_r, err_tx)
}

/// What a container's handle shares with its start task.
struct Shared {
    client: std::sync::OnceLock<Docker>,
    /// Set by `kill`/`remove`: a start not yet made is not made.
    killed: AtomicBool,
    /// A pooled pair's host directory and tenant share ([`pool`]): let go
    /// once both of the pair's containers are.
    slot: std::sync::OnceLock<Arc<pool::SlotGuard>>,
}

/// The task that starts one container, owning what its start needs.
struct StartTask {
    host: String,
    daemon: Daemon,
    name: String,
    shared: Arc<Shared>,
    egress: bool,
    egress_subnet: ipnet::Ipv4Net,
    feed: Option<StartFeed>,
    body: ContainerCreateBody,
    /// Stdout's writer, until the start hands it to its pump.
    out_w: Option<tokio::io::WriteHalf<tokio::io::SimplexStream>>,
    err_tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
}

impl StartTask {
    /// Connects (once per backend) and starts the container; whether it
    /// started. A failure is said on the container's stderr as
    /// `airlock sandbox-init: docker: …`.
    async fn run(mut self) -> bool {
        let r = self.start().await;
        // A start that failed never handed stdout to its pump: end it here.
        if let Some(mut w) = self.out_w.take() {
            let _ = w.shutdown().await;
        }
        if let Err(e) = &r {
            let _ = self
                .err_tx
                .send(bytes::Bytes::from(format!(
                    "airlock sandbox-init: docker: {e}\n"
                )))
                .await;
        }
        r.is_ok()
    }

    async fn start(&mut self) -> Result<(), DockerError> {
        if self.shared.client.get().is_none() {
            let d = client_of(&self.daemon, &self.host).await?;
            let _ = self.shared.client.set(d);
        }
        let Some(d) = self.shared.client.get().cloned() else {
            return Err(DockerError::NoClient);
        };
        let start = Start {
            name: &self.name,
            egress: self.egress,
            egress_subnet: self.egress_subnet,
            killed: &self.shared.killed,
            feed: self.feed.take(),
            // Everything but the sidecar (the one on the egress network).
            sandbox: !self.egress,
        };
        let body = std::mem::take(&mut self.body);
        start
            .run(&d, body, &mut self.out_w, self.err_tx.clone())
            .await
    }
}

/// One container's start: the egress network (the sidecar's), the
/// container, its streams, its start and its stdin.
struct Start<'a> {
    name: &'a str,
    egress: bool,
    /// The range [`EGRESS_NETWORK`] is created with, if missing.
    egress_subnet: ipnet::Ipv4Net,
    killed: &'a AtomicBool,
    /// What becomes of stdin once the container has started.
    feed: Option<StartFeed>,
    /// A sandbox's container (an agent's, a runner's): its socket buffers
    /// are capped once it has started, before its stdin is written.
    sandbox: bool,
}

type Attached = bollard::container::AttachContainerResults;

impl Start<'_> {
    async fn run(
        self,
        d: &Docker,
        body: ContainerCreateBody,
        out_w: &mut Option<tokio::io::WriteHalf<tokio::io::SimplexStream>>,
        err_tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
    ) -> Result<(), DockerError> {
        if self.egress {
            ensure_egress_network(d, self.egress_subnet).await?;
        }
        self.stopped()?;
        let (id, attached) = self.create_and_attach(d, body).await?;
        self.stopped()?;
        d.start_container(self.name, None::<q::StartContainerOptions>)
            .await
            .map_err(|e| ApiError::new(format!("starting {}", self.name), e))?;
        if self.sandbox {
            cap_socket_buffers(d, self.name).await;
        }
        let input = attached.input;
        let out_w = out_w.take().ok_or(DockerError::StdoutTaken)?;
        pump_output(attached.output, out_w, err_tx.clone());
        match self.feed {
            Some(StartFeed::Parked(tx)) => {
                // Claimed later: its stdin goes with it ([`pool`]).
                tx.send(Parked { id, input })
                    .map_err(|_| DockerError::Stopped)?;
                Ok(())
            }
            Some(StartFeed::Held(stdin, gate)) => {
                feed_stdin(d, self.name, self.killed, input, stdin, Some(gate), err_tx).await
            }
            Some(StartFeed::Now(stdin)) => {
                feed_stdin(d, self.name, self.killed, input, stdin, None, err_tx).await
            }
            None => Err(DockerError::StdoutTaken),
        }
    }

    /// `Err` once the container was killed or removed: a start not yet
    /// made is not made.
    fn stopped(&self) -> Result<(), DockerError> {
        if self.killed.load(Ordering::SeqCst) {
            return Err(DockerError::Stopped);
        }
        Ok(())
    }

    /// Creates the container (its network, if any, is in `body`) and
    /// attaches to its three streams.
    async fn create_and_attach(
        &self,
        d: &Docker,
        body: ContainerCreateBody,
    ) -> Result<(String, Attached), DockerError> {
        let name = self.name;
        let created = d
            .create_container(
                Some(
                    q::CreateContainerOptionsBuilder::default()
                        .name(name)
                        .build(),
                ),
                body,
            )
            .await
            .map_err(|e| ApiError::new(format!("creating {name}"), e))?;
        let attached = d
            .attach_container(
                name,
                Some(
                    q::AttachContainerOptionsBuilder::default()
                        .stdin(true)
                        .stdout(true)
                        .stderr(true)
                        .stream(true)
                        .build(),
                ),
            )
            .await
            .map_err(|e| ApiError::new(format!("attaching to {name}"), e))?;
        Ok((created.id, attached))
    }
}

/// A started container's stdin, as its attach gave it.
pub(crate) type Input = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// What a container is fed on its stdin once started.
pub(crate) enum Feed {
    /// These bytes at once, then end-of-file.
    Now(Vec<u8>),
    /// These bytes once [`Sandbox::release_stdin`]
    /// ([`crate::SandboxSpec::hold_stdin`]); dropped unreleased, stdin
    /// closes without them.
    Held(Vec<u8>),
    /// Nothing: the started container waits, reading, and its stdin is
    /// handed over here, for its claim ([`pool`]).
    Parked(tokio::sync::oneshot::Sender<Parked>),
}

/// [`Feed`] inside the start task.
enum StartFeed {
    Now(Vec<u8>),
    Held(Vec<u8>, tokio::sync::oneshot::Receiver<()>),
    Parked(tokio::sync::oneshot::Sender<Parked>),
}

/// A started container waiting for its claim: its id and its stdin.
pub(crate) struct Parked {
    pub(crate) id: String,
    pub(crate) input: Input,
}

/// Writes `stdin` to the started container `name`, then end-of-file (the
/// daemon closes the container's stdin: `StdinOnce`); held, in the
/// background once `gate` opens. Kills the container if it was killed
/// meanwhile.
async fn feed_stdin(
    d: &Docker,
    name: &str,
    killed: &AtomicBool,
    mut input: Input,
    stdin: Vec<u8>,
    gate: Option<tokio::sync::oneshot::Receiver<()>>,
    err_tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
) -> Result<(), DockerError> {
    {
        if let Some(gate) = gate {
            // Held (the runtime's secrets, once the sidecar is ready): the
            // start is over, stdin follows in the background. The container
            // waits for it, reading.
            let who = name.to_owned();
            tokio::spawn(async move {
                if gate.await.is_ok()
                    && let Err(e) = input.write_all(&stdin).await
                {
                    let _ = err_tx
                        .send(bytes::Bytes::from(format!(
                            "airlock sandbox-init: docker: writing to {who}'s stdin: {e}\n"
                        )))
                        .await;
                }
                let _ = input.shutdown().await;
            });
        } else {
            let wrote = input.write_all(&stdin).await;
            let _ = input.shutdown().await;
            drop(input);
            wrote.map_err(|source| DockerError::Stdin {
                name: name.to_owned(),
                source,
            })?;
        }
        if killed.load(Ordering::SeqCst) {
            kill_now(d, name).await;
        }
        Ok(())
    }
}

/// The container's streams, demultiplexed, until it ends: stdout to its
/// handle's reader, stderr to its one writer.
fn pump_output(
    mut output: std::pin::Pin<
        Box<
            dyn futures_util::Stream<
                    Item = Result<bollard::container::LogOutput, bollard::errors::Error>,
                > + Send,
        >,
    >,
    mut out_w: tokio::io::WriteHalf<tokio::io::SimplexStream>,
    err_tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
) {
    tokio::spawn(async move {
        let mut reading = true;
        while let Some(frame) = output.next().await {
            match frame {
                Ok(bollard::container::LogOutput::StdOut { message })
                | Ok(bollard::container::LogOutput::Console { message }) => {
                    // Nobody reads any more: keep draining, so the
                    // container never blocks on its output.
                    if reading && out_w.write_all(&message).await.is_err() {
                        reading = false;
                    }
                }
                Ok(bollard::container::LogOutput::StdErr { message }) => {
                    let _ = err_tx.send(message).await;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let _ = out_w.shutdown().await;
    });
}

/// cgroup v1: caps the started container's socket buffers
/// ([`crate::pools::SOCKET_BUFFER_BYTES`]) in its memory cgroup, which
/// Docker 20.10's API (`KernelMemoryTCP`) no longer reaches through
/// today's client. Its command waits on stdin (the runtime's secrets, the
/// runner's) until this is done, so nothing of it has a socket yet. Needs a
/// local daemon and a root platform: otherwise said once, and by `airlock
/// doctor`.
async fn cap_socket_buffers(d: &Docker, name: &str) {
    let found = d
        .inspect_container(name, None::<q::InspectContainerOptions>)
        .await
        .ok()
        .and_then(|c| Some((c.id?, c.state?.pid?)));
    let done = found.and_then(|(id, pid)| {
        let dir = crate::namespace::cgroup::memory_cgroup_of(i32::try_from(pid).ok()?, &id)?;
        Some(crate::namespace::cgroup::cap_socket_buffers(&dir))
    });
    if let Some(Err(e)) = done {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::warn!(
                "the docker sandboxes' socket buffers are not capped (cgroup v1 keeps them out of the memory limit): {e}"
            )
        });
    }
}

async fn kill_now(d: &Docker, name: &str) {
    let _ = d
        .kill_container(
            name,
            Some(
                q::KillContainerOptionsBuilder::default()
                    .signal("KILL")
                    .build(),
            ),
        )
        .await;
}

/// The networks named [`EGRESS_NETWORK`] (two or more after a race).
async fn list_egress(d: &Docker) -> Result<Vec<bollard::models::Network>, DockerError> {
    let filters = HashMap::from([("name", vec![EGRESS_NETWORK])]);
    d.list_networks(Some(
        q::ListNetworksOptionsBuilder::default()
            .filters(&filters)
            .build(),
    ))
    .await
    .map(|v| {
        v.into_iter()
            .filter(|n| n.name.as_deref() == Some(EGRESS_NETWORK))
            .collect::<Vec<_>>()
    })
    .map_err(|e| ApiError::new("listing networks", e).into())
}

/// The IPv4 ranges of a network's address management.
fn subnets_of(ipam: Option<&bollard::models::Ipam>) -> Vec<ipnet::Ipv4Net> {
    ipam.and_then(|i| i.config.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.subnet.as_deref()?.parse().ok())
        .collect()
}

/// Whether a network's address management is `subnet`, gateway included
/// (what [`egress_gateway`] reads; the daemon does not fill one in where
/// the subnet was given).
fn has_range(ipam: Option<&bollard::models::Ipam>, subnet: ipnet::Ipv4Net) -> bool {
    ipam.and_then(|i| i.config.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.gateway.is_some() && c.subnet.as_deref().and_then(|s| s.parse().ok()) == Some(subnet)
        })
}

/// Creates [`EGRESS_NETWORK`] with `subnet` if missing, once
/// [`check_egress_subnet`] finds the range free. One of another range, or
/// without a gateway (made by the daemon's pools before
/// `DOCKER_EGRESS_SUBNET`, or under another setting), is replaced while no
/// container is attached to it, and refused otherwise
/// ([`DockerError::EgressNetworkInUse`]). Of duplicates a race made, the
/// oldest stays.
pub async fn ensure_egress_network(d: &Docker, subnet: ipnet::Ipv4Net) -> Result<(), DockerError> {
    let found = list_egress(d).await?;
    if let [one] = found.as_slice() {
        if has_range(one.ipam.as_ref(), subnet) {
            return Ok(());
        }
        remove_unused_egress(d, subnet).await?;
    }
    if found.len() <= 1 {
        let made = async {
            check_egress_subnet(d, subnet).await?;
            create_egress_network(d, subnet).await
        };
        if let Err(e) = made.await {
            // Another platform may have just created it with this range.
            let now = list_egress(d).await?;
            if !now.iter().any(|n| has_range(n.ipam.as_ref(), subnet)) {
                return Err(e);
            }
        }
    }
    let mut found = list_egress(d).await?;
    if found.len() > 1 {
        found.sort_by(|a, b| a.created.cmp(&b.created).then(a.id.cmp(&b.id)));
        for extra in found.iter().skip(1) {
            if let Some(id) = &extra.id {
                let _ = d.remove_network(id).await;
            }
        }
    }
    Ok(())
}

/// Removes [`EGRESS_NETWORK`], whose range is not `want`, if no container
/// is attached to it (one already gone is fine).
async fn remove_unused_egress(d: &Docker, want: ipnet::Ipv4Net) -> Result<(), DockerError> {
    let n = match d
        .inspect_network(EGRESS_NETWORK, None::<q::InspectNetworkOptions>)
        .await
    {
        Ok(n) => n,
        Err(e) if not_found(&e) => return Ok(()),
        Err(e) => return Err(ApiError::new(format!("inspecting {EGRESS_NETWORK}"), e).into()),
    };
    let containers = n.containers.as_ref().map_or(0, HashMap::len);
    if containers > 0 {
        let found = subnets_of(n.ipam.as_ref())
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        return Err(DockerError::EgressNetworkInUse {
            found,
            want,
            containers,
        });
    }
    match d.remove_network(EGRESS_NETWORK).await {
        Err(e) if !not_found(&e) => {
            Err(ApiError::new(format!("removing {EGRESS_NETWORK} of another range"), e).into())
        }
        _ => Ok(()),
    }
}

/// Refuses `subnet` where it shares an address with one of the host's
/// routes or another network of the daemon.
async fn check_egress_subnet(d: &Docker, subnet: ipnet::Ipv4Net) -> Result<(), DockerError> {
    let table = std::fs::read_to_string(egress::HOST_ROUTES).map_err(DockerError::HostRoutes)?;
    let mut taken = egress::host_routes(&table);
    let networks = d
        .list_networks(None::<q::ListNetworksOptions>)
        .await
        .map_err(|e| ApiError::new("listing networks", e))?;
    for n in networks {
        let by = format!("docker network {}", n.name.as_deref().unwrap_or("?"));
        if n.name.as_deref() == Some(EGRESS_NETWORK) {
            continue;
        }
        for net in subnets_of(n.ipam.as_ref()) {
            taken.push(egress::Taken {
                by: by.clone(),
                net,
            });
        }
    }
    match egress::first_overlap(subnet, &taken) {
        Some(t) => Err(DockerError::EgressSubnetTaken {
            subnet,
            by: t.by.clone(),
            taken: t.net,
        }),
        None => Ok(()),
    }
}

async fn create_egress_network(d: &Docker, subnet: ipnet::Ipv4Net) -> Result<(), DockerError> {
    let req = NetworkCreateRequest {
        name: EGRESS_NETWORK.into(),
        driver: Some("bridge".into()),
        internal: Some(false),
        ipam: Some(bollard::models::Ipam {
            config: Some(vec![bollard::models::IpamConfig {
                subnet: Some(subnet.to_string()),
                // The first address, as the daemon's pools give it.
                gateway: subnet.hosts().next().map(|g| g.to_string()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        options: Some(HashMap::from([
            // Sidecars of different runs cannot reach one another.
            (
                "com.docker.network.bridge.enable_icc".into(),
                "false".into(),
            ),
        ])),
        labels: Some(HashMap::from([
            (LABEL_MANAGED.into(), "true".into()),
            (LABEL_ROLE.into(), "egress".into()),
        ])),
        ..Default::default()
    };
    d.create_network(req)
        .await
        .map_err(|e| ApiError::new(format!("creating network {EGRESS_NETWORK}"), e))?;
    Ok(())
}

/// This host's address on [`EGRESS_NETWORK`] (its bridge gateway): where a
/// sidecar reaches a service of the host (the demo's example API). Creates
/// the network with `subnet` if missing.
pub async fn egress_gateway(
    d: &Docker,
    subnet: ipnet::Ipv4Net,
) -> Result<std::net::IpAddr, SandboxError> {
    ensure_egress_network(d, subnet).await?;
    let n = d
        .inspect_network(EGRESS_NETWORK, None::<q::InspectNetworkOptions>)
        .await
        .map_err(|e| DockerError::from(ApiError::new("inspecting the egress network", e)))?;
    Ok(n.ipam
        .and_then(|i| i.config)
        .into_iter()
        .flatten()
        .find_map(|c| c.gateway?.parse().ok())
        .ok_or(DockerError::NoGateway)?)
}

/// A container of a run, as [`Sandbox`] holds it.
pub(crate) struct Container {
    name: String,
    host: String,
    /// Whether the container started, once its start is over.
    started: tokio::sync::watch::Receiver<Option<bool>>,
    shared: Arc<Shared>,
    handle: tokio::runtime::Handle,
    removed: bool,
    /// Its end, once a wait saw it (it ends once).
    exited: Option<ExitStatus>,
}

/// The status a container that never ran reports (as `docker run` does).
const NOT_STARTED: i32 = 125;

impl Container {
    /// From now on the container is named by `id` (a pooled container is
    /// renamed at its claim: its id stays).
    pub(crate) fn name_by_id(&mut self, id: String) {
        self.name = id;
    }

    /// Its run is over (it has stopped): a pooled pair's tenant share is
    /// given back now, not once it is removed.
    pub(crate) fn stopped(&self) {
        if let Some(slot) = self.shared.slot.get() {
            slot.release_share();
        }
    }

    /// Holds `slot` until this container is let go ([`pool`]).
    pub(crate) fn hold_slot(&self, slot: Arc<pool::SlotGuard>) {
        let _ = self.shared.slot.set(slot);
    }

    /// The pool removed it itself ([`crate::warm::Shelf::drain`]): nothing is left
    /// to do when it is dropped.
    pub(crate) fn disown(&mut self) {
        self.shared.killed.store(true, Ordering::SeqCst);
        self.removed = true;
    }

    /// The daemon, once the container has started; `None` if it never will.
    async fn started(&mut self) -> Option<Docker> {
        let ok = match self.started.wait_for(|v| v.is_some()).await {
            Ok(v) => *v == Some(true),
            Err(_) => false,
        };
        if ok {
            self.shared.client.get().cloned()
        } else {
            None
        }
    }

    /// Waits for the container's end: its `die` event or the daemon's
    /// answer to a wait, whichever comes first (the same exit code). The
    /// daemon sends `die` once the container's task is deleted — its init
    /// gone, and with it (the kernel kills and reaps the rest of a pid
    /// namespace before its init's exit completes) every process of the
    /// container: nothing of it runs any more. It answers a wait only once
    /// it has also taken down the container's network endpoint and mounts,
    /// 100–350 ms later on a loaded host: a run's end need not wait for
    /// that. The end is kept: a later wait answers at once.
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(s) = self.exited {
            return Ok(s);
        }
        let Some(d) = self.started().await else {
            return Ok(ExitStatus::from_raw(NOT_STARTED << 8));
        };
        let code = tokio::select! {
            Some(code) = died(&d, &self.name) => code,
            waited = self.waited(&d) => waited?,
        };
        let status = ExitStatus::from_raw(((code & 0xff) as i32) << 8);
        self.exited = Some(status);
        Ok(status)
    }

    /// The daemon's answer to a wait for the container to be not running:
    /// its exit code.
    async fn waited(&self, d: &Docker) -> std::io::Result<i64> {
        let mut s = d.wait_container(
            &self.name,
            Some(
                q::WaitContainerOptionsBuilder::default()
                    .condition("not-running")
                    .build(),
            ),
        );
        match s.next().await {
            Some(Ok(r)) => Ok(r.status_code),
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => Ok(code),
            Some(Err(e)) => Err(std::io::Error::other(ApiError::new(
                format!("waiting for {}", self.name),
                e,
            ))),
            None => Err(std::io::Error::other(format!(
                "waiting for {}: no answer",
                self.name
            ))),
        }
    }

    pub(crate) fn kill(&self) {
        self.shared.killed.store(true, Ordering::SeqCst);
        // Not connected yet: the start task sees `killed` before it starts.
        let Some(d) = self.shared.client.get().cloned() else {
            return;
        };
        let name = self.name.clone();
        self.handle.spawn(async move { kill_now(&d, &name).await });
    }

    /// Sends SIGTERM to the container's first process (`docker-init`
    /// passes it on), once its start is over; waits for nothing else.
    pub(crate) async fn signal_term(&mut self) {
        if let Some(d) = self.started().await {
            let _ = d
                .kill_container(
                    &self.name,
                    Some(
                        q::KillContainerOptionsBuilder::default()
                            .signal("TERM")
                            .build(),
                    ),
                )
                .await;
        }
    }

    /// Removes the container (killed first).
    pub(crate) async fn remove(&mut self) {
        self.shared.killed.store(true, Ordering::SeqCst);
        // Whatever the start became, it is over before anything is removed.
        let _ = self.started.wait_for(|v| v.is_some()).await;
        let d = match self.shared.client.get().cloned() {
            Some(d) => d,
            None => match connect(&self.host).await {
                Ok(d) => d,
                Err(_) => return,
            },
        };
        let _ = d
            .remove_container(
                &self.name,
                Some(
                    q::RemoveContainerOptionsBuilder::default()
                        .force(true)
                        .build(),
                ),
            )
            .await;
        self.removed = true;
    }

    /// Dropped without `cleanup`: killed and removed in the background.
    pub(crate) fn forget(&mut self) {
        if self.removed {
            return;
        }
        self.removed = true;
        self.shared.killed.store(true, Ordering::SeqCst);
        let mut me = Container {
            name: self.name.clone(),
            host: self.host.clone(),
            started: self.started.clone(),
            shared: self.shared.clone(),
            handle: self.handle.clone(),
            removed: false,
            exited: self.exited,
        };
        self.handle.spawn(async move { me.remove().await });
    }
}

/// How far back a container's `die` event is looked for: it may have died
/// before the subscription reached the daemon, which replays what it still
/// holds of its recent events (a wide margin: the daemon's clock may not be
/// this host's; only this container's `die` is asked for, and it dies once).
const DIE_LOOKBACK: Duration = Duration::from_secs(300);

/// The exit code in `name`'s `die` event (see [`Container::wait`]); never
/// answers when the events stream ends or fails first, or the event has
/// no readable code (the wait's answer decides then). `name` is the
/// container's name or id, matched here: Docker 20.10's `container` filter
/// did not match a container's events by name (seen: none came).
async fn died(d: &Docker, name: &str) -> Option<i64> {
    let since = std::time::SystemTime::now()
        .checked_sub(DIE_LOOKBACK)
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |t| t.as_secs());
    let filters = HashMap::from([
        ("type".to_owned(), vec!["container".to_owned()]),
        ("event".to_owned(), vec!["die".to_owned()]),
    ]);
    let mut events = d.events(Some(
        q::EventsOptionsBuilder::default()
            .since(&since.to_string())
            .filters(&filters)
            .build(),
    ));
    while let Some(item) = events.next().await {
        // An event this client cannot read (another container's) is
        // skipped; a failed stream ends after its error.
        let Ok(e) = item else { continue };
        let Some(actor) = e.actor.filter(|_| e.action.as_deref() == Some("die")) else {
            continue;
        };
        let attributes = actor.attributes.unwrap_or_default();
        let ours = actor.id.as_deref() == Some(name)
            || attributes.get("name").map(String::as_str) == Some(name);
        if !ours {
            continue;
        }
        let code = attributes
            .get("exitCode")
            .and_then(|c| c.parse::<i64>().ok());
        if code.is_some() {
            return code;
        }
    }
    std::future::pending().await
}

/// Removes a network; a container the daemon is still tearing down holds
/// it for a moment, so a refusal is retried (briefly).
pub(crate) async fn remove_network(d: &Docker, name: &str) {
    for _ in 0..100 {
        match d.remove_network(name).await {
            Ok(()) => return,
            Err(e) if not_found(&e) => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// An empty read-only tmpfs, mounted over what a container must not see.
const EMPTY_RO_TMPFS: &str = "ro,nosuid,nodev,noexec,size=4k,nr_inodes=16,mode=0555";

fn tmpfs_opts(size_mb: u64, uid: u32, gid: u32) -> String {
    format!(
        "rw,nosuid,nodev,size={size_mb}m,nr_inodes={},mode=0700,uid={uid},gid={gid}",
        crate::namespace::plan::tmpfs_inodes(size_mb)
    )
}

impl DockerBackend {
    /// The container of `spec`, an agent's or a runner's: no network
    /// (`--network none`: its own network namespace, `lo` alone), its
    /// sockets' directory bound read-only at [`RunPaths::sockets`], where
    /// its sidecar's two unix sockets are its one way out.
    fn sandbox_body(&self, spec: &SandboxSpec) -> Result<ContainerCreateBody, SandboxError> {
        // Each sandbox its own uid: a runner's is not its agent's.
        let ids = agent_ids(&spec.run_id);
        let mut binds = Vec::new();
        crate::namespace::shared_paths_readable_by(&spec.ro_paths, &spec.command, ids)?;
        for p in &spec.ro_paths {
            binds.push(format!("{s}:{s}:ro", s = bindable(p)?));
        }
        let plane = plane::available(self.cfg.runtime.as_deref());
        if plane {
            binds.push(plane::resolver_bind(&spec.sockets_dir)?);
        }
        binds.push(format!(
            "{}:{SOCKETS_INSIDE}:ro",
            bindable(&spec.sockets_dir)?
        ));
        let labels = match &spec.kind {
            SandboxKind::Agent => self.labels(&spec.run_id, "agent"),
            SandboxKind::Runner { run } => self.labels(run, "runner"),
        };
        // PID 1 is Airlock's own init (not dumpable, the sandbox's seccomp
        // filters), not docker-init.
        let mut cmd = vec![
            AIRLOCK_IN_IMAGE.to_owned(),
            init::SUBCOMMAND.into(),
            "--".into(),
        ];
        cmd.extend(spec.command.iter().cloned());
        let mut host_config = self.sandbox_host_config(spec, ids, binds);
        host_config.sysctls = plane.then(plane::sysctls);
        Ok(ContainerCreateBody {
            image: Some(self.cfg.images.agent.to_string()),
            cmd: Some(cmd),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            user: Some(format!("{}:{}", ids.uid, ids.gid)),
            working_dir: Some(spec.workspace.display().to_string()),
            hostname: Some(crate::namespace::config::HOSTNAME.into()),
            labels: Some(labels),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            host_config: Some(host_config),
            ..Default::default()
        })
    }

    /// The sandbox container's confinement: no capability, the seccomp
    /// profile, a read-only root with capped tmpfs for the workspace and
    /// `/tmp`, masked `/proc` entries, no `/sys` or pseudo-terminals, the
    /// limits, no log file on the host.
    fn sandbox_host_config(
        &self,
        spec: &SandboxSpec,
        ids: crate::namespace::config::HostIds,
        binds: Vec<String>,
    ) -> HostConfig {
        let cap = spec.workspace_size_mb;
        let memory_bytes =
            i64::try_from(spec.memory_mb.saturating_mul(1 << 20)).unwrap_or(i64::MAX);
        HostConfig {
            network_mode: Some("none".into()),
            binds: Some(binds),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([
                (
                    spec.workspace.display().to_string(),
                    tmpfs_opts(cap, ids.uid, ids.gid),
                ),
                ("/tmp".into(), tmpfs_opts(cap, ids.uid, ids.gid)),
                // No pseudo-terminals (the namespace sandbox has none):
                // Docker's devpts instance draws on the host's one pool
                // (kernel.pty.max less the host's reserve).
                ("/dev/pts".into(), EMPTY_RO_TMPFS.into()),
                // No host sysfs (hardware, kernel state).
                ("/sys".into(), EMPTY_RO_TMPFS.into()),
            ])),
            ipc_mode: Some("none".into()),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec![
                "no-new-privileges:true".into(),
                format!("seccomp={}", profile::seccomp_profile()),
            ]),
            masked_paths: Some(profile::masked_paths()),
            readonly_paths: Some(profile::readonly_paths()),
            pids_limit: Some(i64::try_from(spec.pids_max).unwrap_or(i64::MAX)),
            ulimits: Some(vec![bollard::models::ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(i64::try_from(crate::pools::OPEN_FILES).unwrap_or(i64::MAX)),
                hard: Some(i64::try_from(crate::pools::OPEN_FILES).unwrap_or(i64::MAX)),
            }]),
            memory: Some(memory_bytes),
            memory_swap: Some(memory_bytes),
            nano_cpus: Some(
                i64::try_from(crate::whole(spec.cpus * 1e9, u64::MAX)).unwrap_or(i64::MAX),
            ),
            init: Some(false),
            runtime: self.cfg.runtime.clone(),
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".into()),
                config: None,
            }),
            ..Default::default()
        }
    }

    /// The sidecar's container: on [`EGRESS_NETWORK`] only, listening for
    /// the agent in the run's sockets' directory (bound at
    /// [`AGENT_SOCKETS_IN_SIDECAR`]) and for each runner in its own.
    fn sidecar_body(&self, spec: &SidecarSpec) -> Result<ContainerCreateBody, SandboxError> {
        let sock = spec
            .platform_socket
            .to_str()
            .filter(|s| !s.contains(':'))
            .ok_or(DockerError::PlatformSocketPath)?;
        let journal = spec
            .egress_journal
            .to_str()
            .filter(|s| !s.contains(':'))
            .ok_or(DockerError::JournalPath)?;
        let mut binds = vec![
            format!("{sock}:{PLATFORM_SOCKET_INSIDE}:ro"),
            format!("{journal}:{EGRESS_JOURNAL_INSIDE}:rw"),
            format!(
                "{}:{AGENT_SOCKETS_IN_SIDECAR}:rw",
                bindable(&spec.sockets_dir)?
            ),
        ];
        // Each runner's sockets' directory, where the sidecar listens for it.
        for (host, inside) in &spec.runner_dirs {
            binds.push(format!("{}:{}:rw", bindable(host)?, inside.display()));
        }
        // The platform's own uid: the one its socket admits.
        let (uid, gid) = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        Ok(ContainerCreateBody {
            image: Some(self.cfg.images.sidecar.to_string()),
            cmd: Some(vec![AIRLOCK_IN_IMAGE.into(), "sidecar".into()]),
            env: Some(vec![format!("AIRLOCK_LOG={}", spec.log)]),
            user: Some(format!("{uid}:{gid}")),
            labels: Some(self.labels(&spec.run_id, "sidecar")),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            host_config: Some(HostConfig {
                network_mode: Some(EGRESS_NETWORK.into()),
                binds: Some(binds),
                readonly_rootfs: Some(true),
                tmpfs: Some(HashMap::from([(
                    "/tmp".into(),
                    "rw,nosuid,nodev,size=64m".into(),
                )])),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges:true".into()]),
                pids_limit: Some(i64::try_from(crate::SIDECAR_PIDS_MAX).unwrap_or(i64::MAX)),
                memory: Some(i64::try_from(crate::SIDECAR_MEMORY_MB << 20).unwrap_or(i64::MAX)),
                memory_swap: Some(
                    i64::try_from(crate::SIDECAR_MEMORY_MB << 20).unwrap_or(i64::MAX),
                ),
                init: Some(true),
                log_config: Some(HostConfigLogConfig {
                    typ: Some("none".into()),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

/// Refuses a `DOCKER_RUNTIME` whose agents could not reach their sidecar's
/// unix sockets ([`diagnose::host_sockets_verdict`]: gVisor without
/// `--host-uds=open`), before any run starts.
async fn check_runtime(d: &Docker, runtime: Option<&str>) -> Result<(), DockerError> {
    let Some(rt) = runtime else {
        return Ok(());
    };
    let info = d
        .info()
        .await
        .map_err(|e| ApiError::new("reading the daemon's runtimes", e))?;
    diagnose::host_sockets_verdict(Some(&info), rt)
}

/// `p` as a bind mount's source (a path with `:` cannot be one).
fn bindable(p: &Path) -> Result<&str, DockerError> {
    p.to_str()
        .filter(|s| !s.contains(':'))
        .ok_or_else(|| DockerError::NotBindable(p.to_owned()))
}

/// The agent's uid/gid: a dedicated unprivileged host id per run, whoever
/// the platform is (there is no user namespace: the container's uid is the
/// host's).
pub fn agent_ids(run_id: &str) -> crate::namespace::config::HostIds {
    let h = run_id.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let id = crate::namespace::config::HOST_ID_BASE + h % crate::namespace::config::HOST_ID_SPAN;
    crate::namespace::config::HostIds {
        uid: id,
        gid: id,
        switch: true,
    }
}

impl Backend for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn check(&self) -> Result<(), Unavailable> {
        let host = self.cfg.host.clone();
        let r = block_on(async move {
            let d = connect(&host).await?;
            d.ping().await.map_err(DockerError::Ping)?;
            Ok::<(), SandboxError>(())
        });
        match r {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(Unavailable(e.to_string())),
            None => Err(Unavailable(
                "cannot start a thread to reach the daemon".into(),
            )),
        }
    }

    fn paths(&self, run_dir: &Path) -> RunPaths {
        RunPaths {
            sockets_host: run_dir.join("sock"),
            sockets: PathBuf::from(SOCKETS_INSIDE),
            workspace: PathBuf::from(WORKSPACE),
        }
    }

    fn runtime_exe(&self, _host_exe: &Path) -> PathBuf {
        PathBuf::from(AIRLOCK_IN_IMAGE)
    }

    /// The namespace backend's unix sockets, the sidecar in its container:
    /// it listens in the run's sockets' directory as its container sees it
    /// ([`AGENT_SOCKETS_IN_SIDECAR`]), the agent connects in the same
    /// directory as its own sees it ([`RunPaths::sockets`]).
    fn sidecar_placement(
        &self,
        run_id: &str,
        paths: &RunPaths,
        platform_socket: &Path,
    ) -> SidecarPlacement {
        let host = crate::host_sidecar_placement(paths, platform_socket);
        let inside = Path::new(AGENT_SOCKETS_IN_SIDECAR);
        SidecarPlacement {
            listen: (
                Endpoint::Unix(inside.join(crate::SIDECAR_SOCKET)),
                Endpoint::Unix(inside.join(crate::PROXY_SOCKET)),
            ),
            reach: host.reach,
            host_sockets: host.host_sockets,
            platform_socket: PathBuf::from(PLATFORM_SOCKET_INSIDE),
            blocked_names: run_container_names(run_id),
            egress_journal_inside: Some(PathBuf::from(EGRESS_JOURNAL_INSIDE)),
            runner_dirs_inside: Some(PathBuf::from(RUNNERS_INSIDE)),
        }
    }

    fn boot(&self, say: &(dyn Fn(&str) + Sync)) -> Result<(), SandboxError> {
        let cfg = self.cfg.clone();
        let r = block_on(async move {
            let d = connect(&cfg.host).await?;
            let r = reclaim::reclaim(&d).await?;
            if !r.runs.is_empty() {
                say(&format!(
                    "reclaimed the docker leftovers of {} run(s) of stopped platforms: {} container(s), {} network(s)",
                    r.runs.len(),
                    r.containers.len(),
                    r.networks.len()
                ));
            }
            images::ensure(&d, &cfg.images, say).await?;
            check_runtime(&d, cfg.runtime.as_deref()).await?;
            Ok::<(), SandboxError>(ensure_egress_network(&d, cfg.egress_subnet).await?)
        });
        r.unwrap_or_else(|| Err(DockerError::NoThread.into()))
    }

    fn spawn(&self, spec: &SandboxSpec) -> Result<Sandbox, SandboxError> {
        if spec.kind == SandboxKind::Agent
            && let Some(claimed) = self.take_claimed_agent(spec)
        {
            return Ok(claimed);
        }
        let body = self.sandbox_body(spec)?;
        let (run, name) = match &spec.kind {
            SandboxKind::Agent => (&spec.run_id, container_name(&spec.run_id, "agent")),
            SandboxKind::Runner { run } => (run, container_name(&spec.run_id, "runner")),
        };
        let feed = match spec.hold_stdin {
            true => Feed::Held(spec.stdin.clone()),
            false => Feed::Now(spec.stdin.clone()),
        };
        self.launch(run, name, body, feed, false)
    }

    /// Under runc: [`plane`]'s resolver file and low ports, in the
    /// container's own network namespace.
    fn transparent_plane(&self) -> bool {
        plane::available(self.cfg.runtime.as_deref())
    }

    fn host_programs(&self) -> bool {
        false
    }

    fn claim_prepared(&self, tenant: &str, sandbox: &SandboxSpec, sidecar: &SidecarSpec) -> bool {
        self.claim_pair(tenant, sandbox, sidecar)
    }

    fn run_ended(&self) {
        self.refill_pool();
    }

    fn drop_prepared(&self) {
        self.drain_pool();
    }

    fn spawn_sidecar(&self, spec: &SidecarSpec) -> Result<Sandbox, SandboxError> {
        if let Some(claimed) = self.take_claimed_sidecar(spec) {
            return Ok(claimed);
        }
        self.launch(
            &spec.run_id,
            container_name(&spec.run_id, "sidecar"),
            self.sidecar_body(spec)?,
            Feed::Now(spec.config.clone()),
            true,
        )
    }
}

/// The names of a run's own containers (refused by its sidecar's guard on
/// every egress call, beside the built-in `sidecar` and `agent`).
pub fn run_container_names(run_id: &str) -> Vec<String> {
    vec![
        container_name(run_id, "agent"),
        container_name(run_id, "sidecar"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipam(subnet: &str, gateway: Option<&str>) -> bollard::models::Ipam {
        bollard::models::Ipam {
            config: Some(vec![bollard::models::IpamConfig {
                subnet: Some(subnet.into()),
                gateway: gateway.map(Into::into),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn the_egress_network_is_kept_only_with_the_range_and_a_gateway() {
        let want: ipnet::Ipv4Net = "10.213.0.0/20".parse().unwrap();
        assert!(has_range(
            Some(&ipam("10.213.0.0/20", Some("10.213.0.1"))),
            want
        ));
        // The daemon's pools made it: another range.
        assert!(!has_range(
            Some(&ipam("10.200.0.16/28", Some("10.200.0.17"))),
            want
        ));
        // Made with the range but no gateway: egress_gateway could not answer.
        assert!(!has_range(Some(&ipam("10.213.0.0/20", None)), want));
        assert!(!has_range(None, want));
    }
}

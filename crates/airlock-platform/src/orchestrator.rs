//! Runs: start the sidecar and the sandbox in parallel, watch the run
//! (timeout, boot deadline, heartbeats), end it with one of four statuses,
//! and remove everything it created, whatever happened.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_platform_api::launch;
use airlock_platform_api::wire::RunEvent;
use airlock_sandbox::{Backend, OutputStream, Sandbox, SandboxKind, SandboxSpec, SidecarSpec};
use airlock_store::{NewRun, RunEnd, RunStatus, Store};
use airlock_vault::RunTokens;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;

use crate::internal_api::{Grant, InternalApi};
use crate::manifest::Manifest;
use crate::settings::Settings;

/// What the operator asked for.
pub struct RunRequest {
    /// The organization the run belongs to ([`airlock_store::LOCAL_ORG`] for `airlock run`).
    pub org: String,
    pub manifest: Manifest,
    /// The manifest's directory: the agent's working directory (read-only).
    pub agent_dir: PathBuf,
    pub prompt: Option<String>,
    /// Replaces `agent.command`.
    pub command: Option<Vec<String>>,
    /// Where the sandbox's lines go on this process's stderr.
    pub echo: Echo,
}

/// What the platform writes on its own stderr of a run's sandbox (its
/// agent's lines reach the store either way, as the run's log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// `airlock run`: the operator's live view, every line as it comes.
    LiveView,
    /// `airlock serve`: a server's log shared by every run of every
    /// organization. The agent's lines are left to the store (`runs logs`);
    /// the runtime's and the sandbox setup's own diagnostics are written,
    /// each tagged with its run and organization.
    Tagged,
}

/// Stops a run before its end: `None` while it may run; set, the reason
/// its end records (`airlock run`'s Ctrl-C: "cancelled by the operator";
/// `airlock serve`: the API key that asked, or its replica's shutdown).
pub type Cancel = watch::Receiver<Option<String>>;

/// Milestones, for a live view.
#[derive(Debug, Clone)]
pub enum Progress {
    Starting {
        run_id: String,
        backend: &'static str,
        isolates: bool,
    },
    SidecarUp {
        after: Duration,
    },
    SandboxUp {
        after: Duration,
    },
    Running {
        elapsed: Duration,
    },
    /// Waiting for one of the `max_concurrent_runs` slots shared by every
    /// platform on this store.
    Queued {
        limit: u32,
    },
    Ending {
        status: RunStatus,
    },
}

#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub run_id: String,
    pub status: RunStatus,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
    pub duration: Duration,
    pub backend: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Store(#[from] airlock_store::StoreError),
    #[error(transparent)]
    Sandbox(#[from] airlock_sandbox::SandboxError),
    #[error("{0}")]
    Setup(String),
    /// Found before anything started: nothing was recorded.
    #[error("{0}")]
    Refused(String),
    #[error("cancelled while waiting for a free run slot")]
    CancelledWhileQueued,
}

/// The embedded platform of `airlock run` (and, later, `airlock serve`).
pub struct Orchestrator {
    pub home: PathBuf,
    pub store: Store,
    pub api: InternalApi,
    pub api_socket: PathBuf,
    pub tokens: RunTokens,
    pub settings: Settings,
    pub backend: Box<dyn Backend>,
    /// The `airlock` binary (sidecar and runtime are subcommands of it).
    pub exe: PathBuf,
    /// `airlock-sidecar` beside it, of the same build, when there is one
    /// ([`airlock_sandbox::own_sidecar_binary`]): what host sidecars run.
    pub sidecar_exe: Option<PathBuf>,
}

fn now_ms() -> i64 {
    airlock_store::now_ms()
}

impl Orchestrator {
    /// Runs one agent to its end. `cancel` set cancels the run, with its reason.
    pub async fn run(
        &self,
        req: RunRequest,
        mut cancel: Cancel,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<RunOutcome, RunError> {
        // Whatever the backend can start before the spec is known starts
        // now, beside the checks and the store's records.
        self.backend.prepare();
        let run_id = format!(
            "run_{}",
            airlock_vault::random_hex::<6>().map_err(|e| RunError::Setup(e.to_string()))?
        );
        let m = &req.manifest;
        self.preflight(&req.org, m, &req.agent_dir).await?;
        let model_name = m.model.as_ref().map(|x| x.provider.as_str());
        // The run directory and its owner file exist before the run is in the
        // store, so a concurrent platform's boot reclaim never mistakes a
        // starting run for a crashed one.
        let run_dir = self.home.join("runs").join(&run_id);
        create_private_dir(&run_dir)
            .map_err(|e| RunError::Setup(format!("run directory {}: {e}", run_dir.display())))?;
        write_owner(&run_dir).map_err(|e| RunError::Setup(e.to_string()))?;
        let new_run = NewRun {
            org: &req.org,
            owner: None,
            id: &run_id,
            agent: m.agent.name.as_str(),
            backend: self.backend.name(),
            model: model_name,
            status: RunStatus::Running,
            created_at: None,
        };
        let recorded = async {
            match self.settings.limits.max_concurrent_runs {
                None => self.store.insert_run(&new_run).await?,
                Some(limit) => {
                    // Wait, in the open, for a slot (every platform on this
                    // store shares them); Ctrl-C gives up.
                    let mut told = false;
                    while !self.store.insert_run_within_limit(&new_run, limit).await? {
                        if !told {
                            progress(Progress::Queued { limit });
                            told = true;
                        }
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                            _ = cancel.changed() => {
                                if cancel.borrow().is_some() {
                                    return Err(RunError::CancelledWhileQueued);
                                }
                            }
                        }
                    }
                }
            }
            self.store.mark_run_started(&run_id, now_ms()).await?;
            Ok::<(), RunError>(())
        };
        if let Err(e) = recorded.await {
            let _ = std::fs::remove_dir_all(&run_dir);
            return Err(e);
        }
        tracing::debug!(target: "airlock::phase", "run recorded");
        self.execute(run_id, run_dir, req, cancel, progress).await
    }

    /// Runs a run `airlock serve` queued and this replica has claimed (it is
    /// `running` in the store, owned by this replica). A run that cannot
    /// start is failed with the reason, as every other failed run.
    pub async fn run_claimed(
        &self,
        run_id: String,
        req: RunRequest,
        cancel: Cancel,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<RunOutcome, RunError> {
        self.backend.prepare();
        let fail = |reason: String| async {
            self.store.fail_run(&run_id, &reason).await?;
            Ok::<RunOutcome, RunError>(RunOutcome {
                run_id: run_id.clone(),
                status: RunStatus::Failed,
                exit_code: None,
                error: Some(reason),
                duration: Duration::ZERO,
                backend: self.backend.name(),
            })
        };
        if let Err(e) = self
            .preflight(&req.org, &req.manifest, &req.agent_dir)
            .await
        {
            return fail(e.to_string()).await;
        }
        let run_dir = self.home.join("runs").join(&run_id);
        let made = create_private_dir(&run_dir).and_then(|()| write_owner(&run_dir));
        if let Err(e) = made {
            return fail(format!("run directory {}: {e}", run_dir.display())).await;
        }
        if let Err(e) = self.store.mark_run_started(&run_id, now_ms()).await {
            let _ = std::fs::remove_dir_all(&run_dir);
            return Err(e.into());
        }
        self.execute(run_id, run_dir, req, cancel, progress).await
    }

    /// A recorded run, from its start to its recorded end.
    async fn execute(
        &self,
        run_id: String,
        run_dir: PathBuf,
        req: RunRequest,
        mut cancel: Cancel,
        progress: &(dyn Fn(Progress) + Send + Sync),
    ) -> Result<RunOutcome, RunError> {
        let m = &req.manifest;
        let (memory_mb, cpus, timeout_secs) =
            self.settings
                .effective(m.agent.memory_mb, m.agent.cpus, m.agent.timeout);
        // The run starts now (a wait for a slot is not part of it: the boot
        // deadline and the duration count from here).
        let started = Instant::now();
        progress(Progress::Starting {
            run_id: run_id.clone(),
            backend: self.backend.name(),
            isolates: self.backend.isolates(),
        });

        // Every egress record the sidecar journals reaches the store from
        // here while the run is live (the sidecar sends none itself).
        let journal = crate::journal::Follower::start(&self.store, &run_id, &run_dir);
        let result = self
            .run_inner(
                &run_id,
                &run_dir,
                &req,
                (memory_mb, cpus, timeout_secs),
                &mut cancel,
                progress,
                started,
            )
            .await;
        self.api.revoke(&run_id);
        // The sidecar has exited: the rest of what it journalled (every
        // request that left and how each ended, the agent's end, its usage
        // and log lines) goes into the store before the run's end is
        // recorded and its directory removed.
        let kept = journal.finish().await;
        let (status, exit_code, error) = match result {
            Ok(Judged::Final(status, exit_code, error)) => (status, exit_code, error),
            Ok(Judged::BySandbox { status, diagnostic }) => {
                self.judge_sandbox_end(&run_id, status, diagnostic, kept.result)
                    .await
            }
            Err(e) => (RunStatus::Failed, None, Some(e.to_string())),
        };
        tracing::debug!(target: "airlock::phase", "run judged");
        progress(Progress::Ending { status });
        let end = PendingEnd {
            status: status.as_str().to_owned(),
            exit_code,
            error: error.clone(),
            at: now_ms(),
        };
        // Recorded as ended before its directory goes: a concurrent boot
        // reclaim never sees it `running` without a directory.
        let finished = match kept.stored {
            true => self.store.finish_run(&run_id, &end.as_run_end()).await,
            false => Err(airlock_store::StoreError::Corrupt(
                "the run's journal is not stored yet".into(),
            )),
        };
        tracing::debug!(target: "airlock::phase", "end recorded");
        let finished = match finished {
            Ok(f) => f,
            Err(e) => {
                // The store is down (or refused): the run's journal and its
                // end stay on disk, stored when the store takes them.
                tracing::warn!(
                    run_id,
                    "the run's end is kept on disk until the store takes it: {e}"
                );
                keep_end_on_disk(&self.store, &run_id, &run_dir, &end);
                return Ok(RunOutcome {
                    run_id,
                    status,
                    exit_code,
                    error,
                    duration: started.elapsed(),
                    backend: self.backend.name(),
                });
            }
        };
        let _ = std::fs::remove_dir_all(&run_dir);
        tracing::debug!(target: "airlock::phase", "run directory removed");
        // Ended first by someone else (cancelled, or failed by a reclaim):
        // what the store says is the outcome, not what this platform saw.
        let (status, exit_code, error) = match finished {
            true => (status, exit_code, error),
            false => match self.store.get_run(&run_id).await? {
                Some(stored) => (stored.status, stored.exit_code, stored.error),
                None => (status, exit_code, error),
            },
        };
        Ok(RunOutcome {
            run_id,
            status,
            exit_code,
            error,
            duration: started.elapsed(),
            backend: self.backend.name(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_inner(
        &self,
        run_id: &str,
        run_dir: &Path,
        req: &RunRequest,
        (memory_mb, cpus, timeout_secs): (u64, f64, u64),
        cancel: &mut Cancel,
        progress: &(dyn Fn(Progress) + Send + Sync),
        started: Instant,
    ) -> Result<Judged, RunError> {
        let m = &req.manifest;
        // The run directory stays the platform's (owner file, 0700); the
        // sandbox sees only the sockets' directory, read-only.
        let paths = self.backend.paths(run_dir);
        create_sockets_dir(&paths.sockets_host).map_err(|e| {
            RunError::Setup(format!(
                "sockets directory {}: {e}",
                paths.sockets_host.display()
            ))
        })?;
        // Where the sidecar runs and how the sandbox reaches it: the backend's call.
        let placement = self
            .backend
            .sidecar_placement(run_id, &paths, &self.api_socket);
        // The egress journal: the platform's file in the run's directory
        // (never in the sandbox's view), appended to by the sidecar.
        let journal = crate::journal::create(run_dir).map_err(|e| {
            RunError::Setup(format!("egress journal in {}: {e}", run_dir.display()))
        })?;

        // What the run may fetch from the platform.
        let mut grant = Grant {
            org: req.org.clone(),
            agent: m.agent.name.to_string(),
            connections: Default::default(),
        };
        for i in &m.integrations {
            if let Some(c) = &i.connection {
                grant
                    .connections
                    .insert(i.namespace.to_string(), c.to_string());
            }
        }
        if let Some(model) = &m.model {
            grant
                .connections
                .insert("@model".into(), model.connection.to_string());
        }
        self.api.grant(run_id, grant);

        let sidecar_token =
            airlock_vault::generate_sidecar_token().map_err(|e| RunError::Setup(e.to_string()))?;
        let run_token = self.tokens.issue(run_id);
        let network = m
            .network
            .as_ref()
            .map(|n| n.egress.clone())
            .unwrap_or(airlock_platform_api::types::NetworkEgress::None);
        let listen = launch::Listen::from_endpoints(&placement.listen.0, &placement.listen.1)
            .map_err(|e| RunError::Setup(e.to_string()))?;
        // A CA of this run's own, only when an integration asks for the
        // intercepting proxy: its key goes to the sidecar, its certificate
        // to the sandbox, and neither is kept here.
        let proxy_ca = if m.integrations.iter().any(|i| {
            i.inject == Some(crate::manifest::Inject::Proxy) || i.local_command().is_some()
        }) {
            Some(crate::proxy_ca::generate(run_id).map_err(|e| RunError::Setup(e.to_string()))?)
        } else {
            None
        };
        let proxy_ca_pem = proxy_ca.as_ref().map(|c| c.cert_pem.clone());
        let agent_intercepted = m
            .integrations
            .iter()
            .any(|i| i.inject == Some(crate::manifest::Inject::Proxy));
        let placeholders: Vec<(String, String)> = m
            .integrations
            .iter()
            .filter(|i| i.inject == Some(crate::manifest::Inject::Proxy))
            .map(|i| {
                let p = launch::placeholder(i.namespace.as_str());
                (p.clone(), p)
            })
            .collect();
        // Each local runner: its sockets' directory (seen only by its own
        // sandbox), its token, and where the sidecar listens for it.
        let mut runners: Vec<RunnerPlan> = Vec::new();
        for (n, i) in m.integrations.iter().enumerate() {
            let Some(command) = i.local_command() else {
                continue;
            };
            let dir = run_dir.join(format!("runner-{n}"));
            create_sockets_dir(&dir).map_err(|e| {
                RunError::Setup(format!("runner sockets directory {}: {e}", dir.display()))
            })?;
            let token = airlock_vault::generate_sidecar_token()
                .map_err(|e| RunError::Setup(e.to_string()))?;
            // Where the sidecar listens for it: this directory, as it sees it.
            let inside = placement.runner_dir(&dir);
            let listen = launch::Runner {
                mcp: launch::Endpoint::Unix(inside.join(RUNNER_MCP_SOCKET)),
                proxy: launch::Endpoint::Unix(inside.join(RUNNER_PROXY_SOCKET)),
                token,
            };
            runners.push(RunnerPlan {
                namespace: i.namespace.to_string(),
                sandbox_id: format!("{run_id}-r{n}"),
                command: command.to_vec(),
                listen,
                dir,
                inside,
                credentialed: i.connection.is_some(),
            });
        }
        let sidecar_cfg = launch::SidecarConfig {
            run_id: run_id.to_owned(),
            sidecar_token: sidecar_token.clone(),
            run_token,
            platform_socket: placement.platform_socket.clone(),
            listen,
            integrations: m
                .integrations
                .iter()
                .map(|i| launch::Integration {
                    namespace: i.namespace.to_string(),
                    authorized_uris: i.authorized_uris.clone(),
                    allow_all_uris: i.allow_all_uris,
                    has_connection: i.connection.is_some(),
                    delivery: i.delivery.as_ref().map(|d| launch::Delivery {
                        header: d.header.to_string(),
                        prefix: d.prefix.to_string(),
                        field: d.field.clone(),
                    }),
                    mcp_url: i.remote_mcp_url().map(str::to_owned),
                    inject_proxy: i.inject == Some(crate::manifest::Inject::Proxy),
                    runner: runners
                        .iter()
                        .find(|r| r.namespace == i.namespace.as_str())
                        .map(|r| r.listen.clone()),
                })
                .collect(),
            model: m.model.as_ref().map(|x| launch::Model {
                provider: x.provider,
                base_url: x.base_url.clone(),
                price_in_per_mtok_usd: x.price_in_per_mtok_usd,
                price_out_per_mtok_usd: x.price_out_per_mtok_usd,
                provider_tools: x.provider_tools.clone(),
                provider_fetch_uris: x.provider_fetch_uris.clone(),
            }),
            network: launch::Network { egress: network },
            egress: launch::EgressSettings {
                allow_internal_hosts: self.settings.allow_internal_hosts.clone(),
                dns_server: self.settings.dns_server.clone(),
                extra_ca_pem: self.settings.extra_ca_pem.clone(),
                blocked_names: placement.blocked_names.clone(),
                ..Default::default()
            },
            limits: launch::Limits::default(),
            proxy_url: None,
            egress_journal: Some(
                placement
                    .egress_journal_inside
                    .clone()
                    .unwrap_or_else(|| journal.clone()),
            ),
            proxy_ca,
        };

        // Sandbox and sidecar start in parallel, the sandbox first (its start
        // is the longer); the runtime gets its secrets (and so starts the
        // agent) once the sidecar is ready.
        let runtime_exe = self.backend.runtime_exe(&self.exe);
        let mut command = vec![
            runtime_exe.display().to_string(),
            "runtime".into(),
            "--".into(),
        ];
        command.extend(
            req.command
                .clone()
                .unwrap_or_else(|| m.agent.command.clone()),
        );
        let secrets = launch::RuntimeSecrets {
            run_id: run_id.to_owned(),
            sidecar: placement.reach.0.clone(),
            proxy: Some(placement.reach.1.clone()),
            sidecar_token,
            heartbeat_interval_secs: self.settings.heartbeat_interval_secs,
            workspace: paths.workspace.clone(),
            cwd: Some(req.agent_dir.clone()),
            prompt: req.prompt.clone(),
            env: placeholders,
            proxy_ca_pem: proxy_ca_pem.clone().filter(|_| agent_intercepted),
        };
        // The agent's directory only: the binary is the backend's to provide.
        let ro_paths = vec![req.agent_dir.clone()];
        let spec = SandboxSpec {
            run_id: run_id.to_owned(),
            command,
            env: vec![
                ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
                (
                    "AIRLOCK_LOG".into(),
                    std::env::var("AIRLOCK_RUNTIME_LOG").unwrap_or_else(|_| "warn".into()),
                ),
            ],
            stdin: secrets.to_json(),
            // Released once the sidecar is ready (below): the runtime's
            // first connection to it succeeds, and a run whose sidecar never
            // came up never hands the runtime its secrets.
            hold_stdin: true,
            sockets_dir: paths.sockets_host.clone(),
            ro_paths,
            workspace: paths.workspace.clone(),
            workspace_size_mb: self.settings.workspace_tmpfs_mb,
            memory_mb,
            cpus,
            pids_max: 256,
            kind: SandboxKind::Agent,
        };
        let mut sandbox = self.backend.spawn(&spec)?;
        tracing::debug!(target: "airlock::phase", "sandbox spawned");
        // Each runner in a sandbox of its own beside the agent's: its own
        // sockets (its MCP stream and its proxy), its own uid and cgroup.
        let mut runner_sandboxes: Vec<Sandbox> = Vec::new();
        let mut runner_pumps: Vec<tokio::task::JoinHandle<()>> = Vec::new();
        for r in &runners {
            let mut command = vec![
                runtime_exe.display().to_string(),
                "runner".into(),
                "--".into(),
            ];
            command.extend(r.command.iter().cloned());
            let ph = launch::placeholder(&r.namespace);
            let secrets = launch::RuntimeSecrets {
                run_id: run_id.to_owned(),
                sidecar: launch::Endpoint::Unix(paths.sockets.join(RUNNER_MCP_SOCKET)),
                proxy: Some(launch::Endpoint::Unix(
                    paths.sockets.join(RUNNER_PROXY_SOCKET),
                )),
                sidecar_token: r.listen.token.clone(),
                heartbeat_interval_secs: self.settings.heartbeat_interval_secs,
                workspace: paths.workspace.clone(),
                cwd: Some(req.agent_dir.clone()),
                prompt: None,
                env: if r.credentialed {
                    vec![(ph.clone(), ph)]
                } else {
                    vec![]
                },
                proxy_ca_pem: proxy_ca_pem.clone(),
            };
            let runner_spec = SandboxSpec {
                run_id: r.sandbox_id.clone(),
                command,
                stdin: secrets.to_json(),
                sockets_dir: r.dir.clone(),
                kind: SandboxKind::Runner {
                    run: run_id.to_owned(),
                },
                ..spec.clone()
            };
            match self.backend.spawn(&runner_spec) {
                Ok(mut sb) => {
                    runner_pumps.extend(log_runner_output(
                        &self.store,
                        run_id,
                        &r.namespace,
                        &mut sb,
                    ));
                    runner_sandboxes.push(sb);
                }
                Err(e) => {
                    sandbox.cleanup().await;
                    for sb in runner_sandboxes {
                        sb.cleanup().await;
                    }
                    return Err(RunError::Setup(format!(
                        "the local runner of integration {}: {e}",
                        r.namespace
                    )));
                }
            }
        }
        let tag = match req.echo {
            Echo::LiveView => None,
            Echo::Tagged => Some(format!("[run {run_id} org {}] ", req.org)),
        };
        let mut output = SandboxOutput::start(&mut sandbox, tag.clone());
        let (mut sidecar, mut sidecar_log) =
            match self.spawn_sidecar(run_id, &sidecar_cfg, &journal, &runners, tag.as_deref()) {
                Ok(s) => s,
                Err(e) => {
                    sandbox.cleanup().await;
                    output.finish().await;
                    return Err(e);
                }
            };
        tracing::debug!(target: "airlock::phase", "sidecar spawned");
        progress(Progress::SandboxUp {
            after: started.elapsed(),
        });
        let sidecar_ready =
            tokio::time::timeout(Duration::from_secs(30), read_ready(&mut sidecar_log.stdout))
                .await;
        match sidecar_ready {
            Ok(Ok(())) => {
                tracing::debug!(target: "airlock::phase", "sidecar ready");
                // The sandbox's uid is not the platform's: it may connect to
                // the sockets (their directory is the platform's, 0711, and
                // read-only inside the sandbox).
                let runner_sockets: Vec<PathBuf> = runners
                    .iter()
                    .flat_map(|r| [RUNNER_MCP_SOCKET, RUNNER_PROXY_SOCKET].map(|s| r.dir.join(s)))
                    .collect();
                let runner_sockets = runner_sockets.iter().map(PathBuf::as_path);
                for s in placement.host_sockets().into_iter().chain(runner_sockets) {
                    if let Err(e) = std::fs::set_permissions(
                        s,
                        std::os::unix::fs::PermissionsExt::from_mode(0o666),
                    ) {
                        tracing::warn!("{}: {e}", s.display());
                    }
                }
                for sb in &mut runner_sandboxes {
                    sb.release_stdin();
                }
                sandbox.release_stdin();
                progress(Progress::SidecarUp {
                    after: started.elapsed(),
                })
            }
            Ok(Err(e)) => {
                sandbox.cleanup().await;
                sidecar.stop(SIDECAR_STOP_GRACE).await;
                // Its own last words are the reason (it reads its config
                // before it says it is ready).
                let why = sidecar_log.finish().await.unwrap_or(e);
                return Err(RunError::Setup(format!("the sidecar did not start: {why}")));
            }
            Err(_) => {
                sandbox.cleanup().await;
                sidecar.stop(SIDECAR_STOP_GRACE).await;
                return Err(RunError::Setup(
                    "the sidecar did not start within 30 s".into(),
                ));
            }
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout_secs));
        tokio::pin!(deadline);
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        let watchdog_every = Duration::from_secs(self.settings.watchdog_interval_secs);
        let mut last_sweep = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let ended = loop {
            tokio::select! {
                status = sandbox.wait() => break Ended::Sandbox(status.ok()),
                status = sidecar.wait() => break Ended::Sidecar(status.ok()),
                _ = &mut deadline => break Ended::Stopped(RunStatus::TimedOut, format!("the run hit its {timeout_secs} s timeout")),
                _ = cancel.changed() => {
                    let why = cancel.borrow().clone();
                    if let Some(why) = why {
                        break Ended::Stopped(RunStatus::Cancelled, why);
                    }
                }
                _ = tick.tick() => progress(Progress::Running { elapsed: started.elapsed() }),
                _ = sweep.tick() => {
                    if last_sweep.elapsed() >= watchdog_every {
                        last_sweep = Instant::now();
                        if let Some(reason) = self.stalled(run_id, started).await {
                            break Ended::Stopped(RunStatus::Failed, reason);
                        }
                    }
                }
            }
        };
        tracing::debug!(target: "airlock::phase", "sandbox exited");
        sandbox.cleanup().await;
        for sb in runner_sandboxes {
            sb.cleanup().await;
        }
        // The runners' last lines are in the run's log before it ends.
        for p in runner_pumps {
            let _ = tokio::time::timeout(Duration::from_secs(2), p).await;
        }
        tracing::debug!(target: "airlock::phase", "sandbox cleaned up");
        // Stopped after the sandbox, so every event the runtime handed it
        // (the agent's end among them) is in the store when it exits.
        sidecar.stop(SIDECAR_STOP_GRACE).await;
        tracing::debug!(target: "airlock::phase", "sidecar exited");
        output.finish().await;
        Ok(match ended {
            Ended::Stopped(status, reason) => Judged::Final(status, None, Some(reason)),
            Ended::Sidecar(status) => Judged::Final(
                RunStatus::Failed,
                None,
                Some(format!(
                    "the sidecar stopped unexpectedly ({}); the sandbox was stopped",
                    describe_exit(status)
                )),
            ),
            Ended::Sandbox(status) => Judged::BySandbox {
                status,
                diagnostic: output.last_diagnostic(),
            },
        })
    }

    /// How a run whose sandbox ended by itself ends: the agent's exit code
    /// as the runtime reported it, or — when the runtime never reported the
    /// agent's end — the runtime's or sandbox setup's own words.
    ///
    /// The agent's end is read from the run's journal (`journalled`: the
    /// sidecar keeps it there before it answers the runtime), so the
    /// judgement needs no store; the store is asked only when the journal
    /// had none (a sidecar without a journal).
    async fn judge_sandbox_end(
        &self,
        run_id: &str,
        status: Option<std::process::ExitStatus>,
        diagnostic: Option<String>,
        journalled: Option<RunEvent>,
    ) -> (RunStatus, Option<i64>, Option<String>) {
        let reported = match journalled {
            Some(r) => Some(r),
            None => self
                .store
                .last_event_of_kind(run_id, "result")
                .await
                .ok()
                .flatten()
                .and_then(|e| serde_json::from_str::<RunEvent>(&e.payload).ok()),
        };
        if let Some(RunEvent::Result { exit_code, .. }) = reported {
            let code = i64::from(exit_code);
            return match exit_code {
                0 => (RunStatus::Succeeded, Some(code), None),
                c if c > 128 && c <= 128 + 64 => (
                    RunStatus::Failed,
                    Some(code),
                    Some(format!(
                        "the agent was killed by signal {} (exit code {c})",
                        c - 128
                    )),
                ),
                c => (
                    RunStatus::Failed,
                    Some(code),
                    Some(format!("the agent exited with code {c}")),
                ),
            };
        }
        let reason = match diagnostic.as_deref() {
            Some(l) if l.starts_with("airlock sandbox-init: ") => format!(
                "the sandbox could not be set up: {}",
                &l["airlock sandbox-init: ".len()..]
            ),
            Some(l) if l.starts_with("airlock runtime: ") => {
                format!("the runtime failed: {}", &l["airlock runtime: ".len()..])
            }
            _ => format!(
                "the runtime in the sandbox ended without reporting the agent's end ({})",
                describe_exit(status)
            ),
        };
        (RunStatus::Failed, None, Some(reason))
    }

    /// What can be checked before anything starts: every connection the run
    /// needs is stored and can be decrypted with a configured key.
    async fn preflight(&self, org: &str, m: &Manifest, agent_dir: &Path) -> Result<(), RunError> {
        for i in &m.integrations {
            let Some(command) = i.local_command() else {
                continue;
            };
            refuse_local_runner(self.backend.as_ref(), i.namespace.as_str())?;
            check_runner_program(
                i.namespace.as_str(),
                command,
                agent_dir,
                self.backend.host_programs(),
            )?;
        }
        let ring = self.api.keyring();
        for (who, name) in m.connections() {
            let Some(rec) = self.store.get_connection(org, name.as_str()).await? else {
                return Err(RunError::Refused(format!(
                    "{who}: connection {:?} is not stored (store it with `airlock connections add {} …`)",
                    name.as_str(),
                    name.as_str()
                )));
            };
            let kid = airlock_vault::Envelope::kid_of(&rec.envelope).map_err(|e| {
                RunError::Refused(format!("{who}: connection {:?}: {e}", name.as_str()))
            })?;
            if !ring.kids().any(|k| k == kid) {
                let hint = if ring.active_kid() == EPHEMERAL_KID {
                    "CONNECTION_ENCRYPTION_KEY is not set".to_string()
                } else {
                    format!(
                        "the configured key ids are {}; an older key belongs in CONNECTION_ENCRYPTION_KEYS",
                        ring.kids().collect::<Vec<_>>().join(", ")
                    )
                };
                return Err(RunError::Refused(format!(
                    "{who}: connection {:?} is encrypted under key id {kid:?}, which is not configured ({hint})",
                    name.as_str()
                )));
            }
        }
        Ok(())
    }

    /// The watchdog's judgement of a run: `Some(reason)` when it must stop.
    async fn stalled(&self, run_id: &str, started: Instant) -> Option<String> {
        let run = self.store.get_run(run_id).await.ok()??;
        match run.last_heartbeat_at {
            None if started.elapsed() > Duration::from_secs(self.settings.boot_deadline_secs) => {
                Some(format!(
                    "no sign of life within the {} s boot deadline",
                    self.settings.boot_deadline_secs
                ))
            }
            Some(at)
                if now_ms() - at
                    > i64::try_from(self.settings.stall_threshold_secs.saturating_mul(1000))
                        .unwrap_or(i64::MAX) =>
            {
                Some(format!(
                    "no heartbeat for more than {} s (stalled)",
                    self.settings.stall_threshold_secs
                ))
            }
            _ => None,
        }
    }

    fn spawn_sidecar(
        &self,
        run_id: &str,
        cfg: &launch::SidecarConfig,
        egress_journal: &Path,
        runners: &[RunnerPlan],
        tag: Option<&str>,
    ) -> Result<(Sandbox, SidecarLog), RunError> {
        let mut sidecar = self.backend.spawn_sidecar(&SidecarSpec {
            run_id: run_id.to_owned(),
            exe: self.exe.clone(),
            own_binary: self.sidecar_exe.clone(),
            log: std::env::var("AIRLOCK_SIDECAR_LOG").unwrap_or_else(|_| "warn".into()),
            config: cfg.to_json(),
            platform_socket: self.api_socket.clone(),
            egress_journal: egress_journal.to_owned(),
            runner_dirs: runners
                .iter()
                .map(|r| (r.dir.clone(), r.inside.clone()))
                .collect(),
        })?;
        let (stdout, stderr) = sidecar.take_output();
        let mut log = SidecarLog {
            stdout,
            ..Default::default()
        };
        if let Some(err) = stderr {
            let prefix = format!("  sidecar: {}", tag.unwrap_or(""));
            log.pump = Some(tokio::spawn(pump(
                err,
                Shown::Echoed(prefix.into()),
                Some(log.lines.clone()),
            )));
        }
        Ok((sidecar, log))
    }
}

/// How long a stopped sidecar has to exit after SIGTERM before it is killed
/// ([`Sandbox::stop`](airlock_sandbox::Sandbox::stop)). The platform waits
/// for its exit (not a fixed time): this must outlast the sidecar's own
/// deadline for draining what is in flight (events, egress records, model
/// streams), or its last records are lost.
pub const SIDECAR_STOP_GRACE: Duration = Duration::from_secs(5);

/// In a runner's sockets' directory: its MCP stream and its proxy.
const RUNNER_MCP_SOCKET: &str = "mcp.sock";
const RUNNER_PROXY_SOCKET: &str = "proxy.sock";

/// One local MCP runner of a run, before it starts.
struct RunnerPlan {
    namespace: String,
    /// Its sandbox's id (its cgroup and host uid derive from it).
    sandbox_id: String,
    command: Vec<String>,
    /// Its sockets' directory on the host, seen by its sandbox only…
    dir: PathBuf,
    /// …and by the sidecar, here.
    inside: PathBuf,
    listen: launch::Runner,
    credentialed: bool,
}

/// Whether `backend` can start a local MCP runner (the backend's call,
/// [`airlock_sandbox::Backend::local_runners`]); the refusal says why not.
fn refuse_local_runner(backend: &dyn Backend, namespace: &str) -> Result<(), RunError> {
    backend.local_runners().map_err(|why| {
        RunError::Refused(format!(
            "integration {namespace}: a local MCP runner (source.kind = \"local\") cannot start \
             on the {} backend: {why}",
            backend.name()
        ))
    })
}

/// A runner's program must be there before anything starts (a typo in
/// the manifest is the operator's error now, not a tool that times out
/// later): an absolute path, a path in the agent's directory, or a name on
/// the sandbox's `PATH` (the host's `/usr/local/bin:/usr/bin:/bin`, which
/// the namespace sandbox sees read-only), and executable. Where the
/// sandbox's programs are not the host's (`host_programs` false: docker's
/// are the agent image's), only one in the agent's directory (bound at the
/// same path) is checked here.
fn check_runner_program(
    namespace: &str,
    command: &[String],
    agent_dir: &Path,
    host_programs: bool,
) -> Result<(), RunError> {
    use std::os::unix::fs::PermissionsExt;
    let Some(program) = command.first() else {
        return Ok(());
    };
    let in_agent_dir = program.contains('/') && agent_dir.join(program).starts_with(agent_dir);
    if !host_programs && !in_agent_dir {
        return Ok(());
    }
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![agent_dir.join(program)]
    } else {
        ["/usr/local/bin", "/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(program))
            .collect()
    };
    let runnable = candidates.iter().any(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    });
    if runnable {
        return Ok(());
    }
    Err(RunError::Refused(format!(
        "integration {namespace}: source.command[0] {program:?} is not an executable file \
         (looked for {}); a relative path is taken in the agent's directory, a bare name on \
         /usr/local/bin:/usr/bin:/bin",
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

/// A runner's output (its server's stderr, its own diagnostics) goes to
/// the platform's log, a bounded line at a time: its launcher's own
/// diagnostics (`airlock runner: …`) as warnings, the server's as info.
/// The run's log keeps it too (stream `runner:<namespace>`, what `airlock
/// runs logs` shows), up to [`KEPT_RUNNER_LINES`] lines a stream: a runner
/// that writes without end fills the platform's log, not the store.
fn log_runner_output(
    store: &Store,
    run_id: &str,
    namespace: &str,
    sandbox: &mut Sandbox,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (out, err) = sandbox.take_output();
    let mut pumps = Vec::new();
    for pipe in [out, err].into_iter().flatten() {
        let (store, run_id, namespace) = (store.clone(), run_id.to_owned(), namespace.to_owned());
        pumps.push(tokio::spawn(async move {
            use airlock_sandbox::terminal;
            let stream = runner_stream(&namespace);
            let mut kept = 0usize;
            let mut pipe = tokio::io::BufReader::new(pipe);
            while let Ok(Some(line)) = terminal::next_line(&mut pipe, terminal::MAX_LINE).await {
                if line.starts_with("airlock runner:") {
                    tracing::warn!(target: "airlock::runner", integration = %namespace, "{line}");
                } else {
                    tracing::info!(target: "airlock::runner", integration = %namespace, "{line}");
                }
                let line = match kept.cmp(&KEPT_RUNNER_LINES) {
                    std::cmp::Ordering::Less => line,
                    std::cmp::Ordering::Equal => format!(
                        "airlock: the runner's further output is not kept in the run's log (past {KEPT_RUNNER_LINES} lines; the platform's log has it)"
                    ),
                    std::cmp::Ordering::Greater => continue,
                };
                kept += 1;
                let at = now_ms();
                let event = RunEvent::Log {
                    at,
                    stream: stream.clone(),
                    line,
                };
                let payload = serde_json::to_string(&event).unwrap_or_else(|_| "{}".into());
                let stored = store
                    .append_event(&airlock_store::NewEvent {
                        run_id: &run_id,
                        at,
                        kind: "log",
                        payload: &payload,
                    })
                    .await;
                if let Err(e) = stored {
                    tracing::warn!(target: "airlock::runner", integration = %namespace, "not kept in the run's log: {e}");
                }
            }
        }));
    }
    pumps
}

/// Lines of a runner's output kept in the run's log, per stream.
pub const KEPT_RUNNER_LINES: usize = 10_000;

/// The log streams of local runners start so (then the integration's
/// namespace).
pub const RUNNER_STREAM: &str = "runner:";

/// The log stream of the runner of integration `namespace`.
pub fn runner_stream(namespace: &str) -> String {
    format!("{RUNNER_STREAM}{namespace}")
}

async fn read_ready(stdout: &mut Option<OutputStream>) -> Result<(), String> {
    let out = stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(out).lines();
    match lines.next_line().await {
        Ok(Some(line)) if line.contains("\"ready\":true") => Ok(()),
        Ok(Some(line)) => Err(format!("unexpected output {line:?}")),
        Ok(None) => Err("it exited".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The sidecar's stderr, shown to the operator and kept (its last lines).
#[derive(Default)]
struct SidecarLog {
    /// Its stdout, until the readiness line is read.
    stdout: Option<OutputStream>,
    lines: Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    pump: Option<tokio::task::JoinHandle<()>>,
}

impl SidecarLog {
    /// Its last line, once its stderr has ended (it has exited).
    async fn finish(&mut self) -> Option<String> {
        if let Some(p) = self.pump.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), p).await;
        }
        self.lines.lock().ok()?.back().cloned()
    }
}

/// How the run loop's end is judged: at once, or (the sandbox ended by
/// itself) by the agent's end in the run's journal.
enum Judged {
    Final(RunStatus, Option<i64>, Option<String>),
    BySandbox {
        status: Option<std::process::ExitStatus>,
        diagnostic: Option<String>,
    },
}

/// A run's end the store did not take yet, kept in its directory
/// ([`END_FILE`]) beside its journal until it does.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PendingEnd {
    pub status: String,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
    pub at: i64,
}

impl PendingEnd {
    fn as_run_end(&self) -> RunEnd<'_> {
        RunEnd {
            status: RunStatus::parse(&self.status).unwrap_or(RunStatus::Failed),
            exit_code: self.exit_code,
            error: self.error.as_deref(),
            at: self.at,
        }
    }
}

/// In a run directory: the run's end, while the store has not taken it.
pub const END_FILE: &str = "end.json";

/// Largest end file read back (an error text is short).
const MAX_END_FILE: u64 = 64 * 1024;

/// How long a run's end kept on disk is offered to the store again, at
/// most this far apart (from 1 s, doubling).
const END_RETRY_MAX: Duration = Duration::from_secs(30);

/// Keeps `end` in the run's directory and stores it, with the rest of the
/// run's journal, once the store takes them (retried in the background
/// while this process lives; otherwise the next boot reclaim does it). The
/// directory is removed once both are stored.
fn keep_end_on_disk(store: &Store, run_id: &str, run_dir: &Path, end: &PendingEnd) {
    let written = serde_json::to_vec(end)
        .map_err(std::io::Error::other)
        .and_then(|b| write_private(&run_dir.join(END_FILE), &b));
    if let Err(e) = written {
        tracing::error!(run_id, "the run's end could not be kept on disk: {e}");
    }
    let (store, run_id, run_dir, end) = (
        store.clone(),
        run_id.to_owned(),
        run_dir.to_owned(),
        end.clone(),
    );
    tokio::spawn(async move {
        let mut wait = Duration::from_secs(1);
        loop {
            tokio::time::sleep(wait).await;
            if store_pending_end(&store, &run_id, &run_dir, &end).await {
                tracing::info!(run_id, "the run's end kept on disk is stored");
                return;
            }
            wait = (wait * 2).min(END_RETRY_MAX);
        }
    });
}

/// Stores a run's journal and then its kept end; removes its directory
/// once both are in. `false` while the store does not take them.
async fn store_pending_end(store: &Store, run_id: &str, run_dir: &Path, end: &PendingEnd) -> bool {
    if !crate::journal::ingest_run_dir(store, run_id, run_dir).await {
        return false;
    }
    match store.finish_run(run_id, &end.as_run_end()).await {
        Ok(_) | Err(airlock_store::StoreError::RunNotFound(_)) => {
            let _ = std::fs::remove_dir_all(run_dir);
            true
        }
        Err(e) => {
            tracing::debug!(run_id, "the run's end is not stored yet: {e}");
            false
        }
    }
}

/// Writes a new private file (0600, never through a link).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits().cast_signed())
        .open(path)?;
    f.write_all(bytes)
}

/// Why the run loop stopped.
enum Ended {
    Sandbox(Option<std::process::ExitStatus>),
    Sidecar(Option<std::process::ExitStatus>),
    Stopped(RunStatus, String),
}

fn describe_exit(status: Option<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => "no exit status".into(),
        },
        None => "no exit status".into(),
    }
}

/// The sandbox's two streams, shown live to the operator (on stderr: stdout
/// is kept for the run report, `--json`), written out safely so an agent's
/// escape sequences never reach the operator's terminal. Stdout carries the
/// agent's lines; stderr only the runtime's and the sandbox setup's own
/// diagnostics (the agent holds no descriptor of it), whose last lines are
/// kept: they are the reason of a run that failed before the agent's end.
struct SandboxOutput {
    pumps: Vec<tokio::task::JoinHandle<()>>,
    diagnostics: Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
}

/// Diagnostic lines kept per run.
const KEPT_DIAGNOSTICS: usize = 16;

impl SandboxOutput {
    /// `tag`: [`Echo::Tagged`]'s prefix (the agent's lines are then read
    /// and dropped, never echoed); `None`: the live view.
    fn start(sandbox: &mut airlock_sandbox::Sandbox, tag: Option<String>) -> SandboxOutput {
        let diagnostics: Arc<std::sync::Mutex<std::collections::VecDeque<String>>> = Arc::default();
        let (out, err) = sandbox.take_output();
        let mut pumps = Vec::new();
        let tag: Option<Arc<str>> = tag.map(Into::into);
        if let Some(out) = out {
            let shown = match &tag {
                None => Shown::Echoed("  │ ".into()),
                Some(_) => Shown::Dropped,
            };
            pumps.push(tokio::spawn(pump(out, shown, None)));
        }
        if let Some(err) = err {
            let prefix = format!("  ! {}", tag.as_deref().unwrap_or(""));
            pumps.push(tokio::spawn(pump(
                err,
                Shown::Echoed(prefix.into()),
                Some(diagnostics.clone()),
            )));
        }
        SandboxOutput { pumps, diagnostics }
    }

    /// Waits (briefly) for the streams to end: the sandbox is gone.
    async fn finish(&mut self) {
        for p in self.pumps.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), p).await;
        }
    }

    /// The last line the runtime or the sandbox setup wrote about itself (a
    /// fatal error starts `airlock runtime: ` or `airlock sandbox-init: `;
    /// warnings start `airlock runtime warning:`).
    fn last_diagnostic(&self) -> Option<String> {
        let d = self.diagnostics.lock().ok()?;
        d.iter()
            .rev()
            .find(|l| l.starts_with("airlock runtime:") || l.starts_with("airlock sandbox-init:"))
            .or(d.back())
            .cloned()
    }
}

/// What [`pump`] does with a stream's lines on this process's stderr.
enum Shown {
    /// Each line after this prefix.
    Echoed(Arc<str>),
    /// None (the stream is still read to its end).
    Dropped,
}

async fn pump<R: tokio::io::AsyncRead + Unpin>(
    r: R,
    shown: Shown,
    keep: Option<Arc<std::sync::Mutex<std::collections::VecDeque<String>>>>,
) {
    use airlock_sandbox::terminal;
    let mut r = BufReader::new(r);
    while let Ok(Some(line)) = terminal::next_line(&mut r, terminal::MAX_LINE).await {
        let Shown::Echoed(prefix) = &shown else {
            continue;
        };
        let line = terminal::safe(&line).into_owned();
        eprintln!("{prefix}{line}");
        if let Some(keep) = &keep
            && let Ok(mut k) = keep.lock()
        {
            if k.len() == KEPT_DIAGNOSTICS {
                k.pop_front();
            }
            k.push_back(line);
        }
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes the owner file of `run_dir`: this process's PID, whole or not at
/// all (written beside it, then renamed). A concurrent platform's boot
/// reclaim reads it at any moment: a file caught half-written (empty) read
/// as no owner, and that reclaim removed a starting run's directory and
/// failed the run (one in ~150 of 50 concurrent `airlock run`s).
fn write_owner(run_dir: &Path) -> std::io::Result<()> {
    let pid = std::process::id().to_string();
    let partial = run_dir.join(format!("{OWNER_FILE}.partial"));
    std::fs::write(&partial, pid)?;
    std::fs::rename(&partial, run_dir.join(OWNER_FILE))
}

/// The PID an owner file names; `None` if it names none (garbage).
fn owner_pid(contents: &[u8]) -> Option<i32> {
    std::str::from_utf8(contents)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
}

/// The sockets' directory: the platform's, searchable (not listable or
/// writable) by the sandbox's unprivileged uid.
fn create_sockets_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(dir)?;
    // The umask may have taken bits the mode asked for.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
}

/// The key id of the throwaway key an embedded platform uses when no
/// `CONNECTION_ENCRYPTION_KEY` is set (it decrypts nothing stored).
pub const EPHEMERAL_KID: &str = "ephemeral";

/// In a run directory: the PID of the platform that owns the run.
pub const OWNER_FILE: &str = "owner.pid";
/// In the sockets' directory: the sidecar's API and proxy sockets.
pub use airlock_sandbox::{PROXY_SOCKET, SIDECAR_SOCKET};
/// Largest owner file reclaim reads (a PID).
const MAX_OWNER_FILE: u64 = 32;

/// Boot reclaim: run directories whose owner process is gone are removed
/// (their egress journal read into the store first), and runs the store
/// still has as `running` with no live owner are failed.
pub async fn reclaim(home: &Path, store: &Store) -> Result<Vec<String>, RunError> {
    let mut reclaimed = Vec::new();
    let runs = home.join("runs");
    if let Ok(entries) = std::fs::read_dir(&runs) {
        for e in entries.flatten() {
            // Never trusted, followed or read whole: no symlink, no FIFO, a few bytes.
            let owner =
                airlock_sandbox::untrusted::read_file(&e.path().join(OWNER_FILE), MAX_OWNER_FILE);
            let alive = match owner {
                Ok(b) => match owner_pid(&b) {
                    Some(pid) => {
                        Path::new(&format!("/proc/{pid}")).exists()
                            && i32::try_from(std::process::id()).ok() != Some(pid)
                    }
                    None => false,
                },
                // Being created right now by another platform (the owner file
                // follows the directory within microseconds).
                Err(airlock_sandbox::untrusted::UntrustedFileError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    e.metadata()
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() < 60))
                }
                // A FIFO, a symlink, a device, a huge file: not an owner.
                Err(_) => false,
            };
            if !alive {
                // What its sidecar journalled reaches the store before the
                // run is failed (below) and its directory goes; a run that
                // ended while the store was down is ended as it ended.
                let run_id = e.file_name().to_string_lossy().into_owned();
                let end =
                    airlock_sandbox::untrusted::read_file(&e.path().join(END_FILE), MAX_END_FILE)
                        .ok()
                        .and_then(|b| serde_json::from_slice::<PendingEnd>(&b).ok());
                let stored = match &end {
                    Some(end) => store_pending_end(store, &run_id, &e.path(), end).await,
                    None => crate::journal::ingest_run_dir(store, &run_id, &e.path()).await,
                };
                if !stored {
                    // Kept for the next reclaim: the store did not take it.
                    continue;
                }
                let _ = std::fs::remove_dir_all(e.path());
                reclaimed.push(run_id);
            }
        }
    }
    // The store first, then the directories: a run is recorded only after
    // its directory exists, so every run in this snapshot that is alive has
    // its directory in the listing below.
    let running = store
        .list_runs(&airlock_store::RunQuery {
            status: Some(RunStatus::Running),
            limit: Some(10_000),
            ..Default::default()
        })
        .await?;
    let live: Vec<String> = std::fs::read_dir(&runs)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    // A run an `airlock serve` replica owns is that replica's to end, or,
    // when the replica is gone, its leader's sweep's
    // ([`airlock_store::Store::sweep_dead_replicas`]), never another
    // process's guess from this machine's run directories.
    for run in running
        .into_iter()
        .filter(|r| !live.contains(&r.id) && r.owner.is_none())
    {
        store
            .finish_run(&run.id, &RunEnd { status: RunStatus::Failed, exit_code: None, error: Some("the platform stopped while this run was running; reclaimed at the next start"), at: now_ms() })
            .await?;
        if !reclaimed.contains(&run.id) {
            reclaimed.push(run.id);
        }
    }
    // The agents' files of the runs `airlock serve` ran (`bundles/<runId>`,
    // removed at a run's end): those of the runs just reclaimed, and any
    // other with no run directory, once older than a minute (a bundle is
    // written just before its run's directory: a younger one may be a run
    // that another platform on this home is starting).
    let bundles = reclaim_bundles(&home.join("bundles"), &reclaimed, &live);
    if bundles > 0 {
        tracing::info!("removed the agent files of {bundles} ended run(s)");
    }
    // The internal-API sockets of platforms that are gone.
    let stale = reclaim_platform_sockets(&home.join("sockets"));
    if stale > 0 {
        tracing::info!("removed {stale} socket(s) of stopped platforms");
    }
    // Cgroups of those runs (only theirs: another live platform's new run
    // may have an empty cgroup for a moment), when there are any.
    let cgroups = reclaim_cgroups_of(&reclaimed);
    if cgroups > 0 {
        tracing::info!("reclaimed {cgroups} cgroup(s) of crashed runs");
    }
    // And those made ahead for the next run of a platform that is gone.
    let standby = reclaim_standby_cgroups();
    if standby > 0 {
        tracing::info!("removed {standby} standby cgroup(s) of stopped platforms");
    }
    Ok(reclaimed)
}

/// Removes this machine's cgroups of the runs `ids` (ended runs whose
/// platform is gone) whose processes are all gone; returns how many
/// directories went. Only those runs': another live platform's new run may
/// have an empty cgroup for a moment. A cgroup still populated stays (the
/// next boot on its platform's home reclaims it).
pub fn reclaim_cgroups_of(ids: &[String]) -> usize {
    if ids.is_empty() {
        return 0;
    }
    use airlock_sandbox::namespace::cgroup::{PREFIX, SIDECAR_SUFFIX};
    // A run's own (`airlock-<runId>`) and its host sidecar's (`…-sidecar`).
    airlock_sandbox::namespace::cgroup::reclaim_matching(|name| {
        name.strip_prefix(PREFIX).is_some_and(|id| {
            let id = id.strip_suffix(SIDECAR_SUFFIX).unwrap_or(id);
            ids.iter().any(|d| d == id)
        })
    })
    .len()
}

/// Removes this machine's standby cgroups (made ahead for a platform's next
/// run) of platforms that are gone; returns how many directories went.
pub fn reclaim_standby_cgroups() -> usize {
    airlock_sandbox::namespace::cgroup::reclaim_standby().len()
}

/// Removes the directories of `bundles` that belong to no live run (see
/// [`reclaim`]); returns how many went.
fn reclaim_bundles(bundles: &Path, reclaimed: &[String], live: &[String]) -> usize {
    let Ok(entries) = std::fs::read_dir(bundles) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let id = e.file_name().to_string_lossy().into_owned();
        let dead = reclaimed.contains(&id)
            || (!live.contains(&id)
                && e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() >= 60)));
        // Never followed: a symlink is removed as itself.
        if dead
            && std::fs::remove_dir_all(e.path())
                .or_else(|_| std::fs::remove_file(e.path()))
                .is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// This process's internal-API socket on `home`: made at its start, removed
/// at its clean stop (`airlock run`'s end, `airlock serve`'s stop).
pub fn own_platform_socket(home: &Path) -> PathBuf {
    home.join("sockets")
        .join(platform_socket_name(std::process::id()))
}

/// The name of a platform's internal-API socket in `$AIRLOCK_HOME/sockets`.
pub fn platform_socket_name(pid: u32) -> String {
    format!("platform-{pid}.sock")
}

/// Removes `platform-<pid>.sock` files whose platform process is gone;
/// returns how many.
fn reclaim_platform_sockets(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("platform-")?.strip_suffix(".sock"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists();
        if !alive && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Shared state for several concurrent runs.
pub type SharedOrchestrator = Arc<Orchestrator>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Boot reclaim removes the agent files (`bundles/<runId>`) of the runs
    /// it reclaims and of any run with no directory left once a minute old;
    /// a live run's, and a young one (a run starting), stay (issue 45,
    /// item 13: they were left every time).
    #[test]
    fn boot_reclaim_removes_the_bundles_of_dead_runs_only() {
        let home = tempfile::tempdir().expect("tempdir");
        let bundles = home.path().join("bundles");
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for id in ["run_dead", "run_orphan", "run_young", "run_live"] {
            let d = bundles.join(id);
            std::fs::create_dir_all(&d).expect("bundle");
            std::fs::write(d.join("agent.py"), "print(1)").expect("file");
            if id != "run_young" {
                std::fs::File::open(&d)
                    .and_then(|f| f.set_modified(old))
                    .expect("mtime");
            }
        }
        let removed = reclaim_bundles(&bundles, &["run_dead".into()], &["run_live".into()]);
        assert_eq!(removed, 2);
        let mut left: Vec<String> = std::fs::read_dir(&bundles)
            .expect("bundles")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["run_live", "run_young"]);
    }

    /// A reader of the owner file (a concurrent platform's boot reclaim)
    /// never catches it half-written: it finds no file yet, or the whole
    /// PID. (Written in place, an empty file was caught and read as no
    /// owner: the starting run's directory was removed and the run failed.)
    #[test]
    fn the_owner_file_is_never_read_half_written() {
        let home = tempfile::tempdir().expect("tempdir");
        let dirs: Vec<PathBuf> = (0..1000)
            .map(|i| home.path().join(format!("run_{i}")))
            .collect();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (dirs, done) = (dirs.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut whole, mut torn) = (0u32, Vec::new());
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    for d in &dirs {
                        // (Not there yet: a reclaim waits for it.)
                        let read = airlock_sandbox::untrusted::read_file(
                            &d.join(OWNER_FILE),
                            MAX_OWNER_FILE,
                        );
                        if let Ok(b) = read {
                            match owner_pid(&b) {
                                Some(_) => whole += 1,
                                None => torn.push(b),
                            }
                        }
                    }
                }
                (whole, torn)
            })
        };
        for d in &dirs {
            create_private_dir(d).expect("run directory");
            write_owner(d).expect("owner file");
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        let (whole, torn) = reader.join().expect("reader");
        assert!(torn.is_empty(), "owner files read half-written: {torn:?}");
        assert!(whole > 0, "the reader saw owner files at all");
        for d in &dirs {
            let b = std::fs::read(d.join(OWNER_FILE)).expect("owner file");
            assert_eq!(owner_pid(&b), i32::try_from(std::process::id()).ok());
            assert!(!d.join(format!("{OWNER_FILE}.partial")).exists());
        }
    }

    #[test]
    fn local_runners_start_only_where_they_are_isolated() {
        use airlock_sandbox::docker::{DockerBackend, DockerConfig};
        let docker = |runtime: Option<&str>| {
            let mut vars = std::collections::HashMap::new();
            if let Some(r) = runtime {
                vars.insert("DOCKER_RUNTIME".to_owned(), r.to_owned());
            }
            DockerBackend::new(
                DockerConfig::from_vars(&vars, Path::new("/usr/bin/airlock")).unwrap(),
            )
        };
        assert!(refuse_local_runner(&docker(None), "gh").is_ok());
        assert!(refuse_local_runner(&docker(Some("runc")), "gh").is_ok());
        let process = airlock_sandbox::process::ProcessBackend;
        let gvisor = docker(Some("runsc"));
        for (backend, must) in [
            (
                &process as &dyn Backend,
                "the process backend isolates nothing",
            ),
            (&gvisor, "DOCKER_RUNTIME=runsc"),
        ] {
            let e = refuse_local_runner(backend, "gh").unwrap_err().to_string();
            assert!(e.contains("integration gh: ") && e.contains(must), "{e}");
            assert!(e.contains("RUN_ADAPTER=namespace"), "{e}");
        }
    }

    #[test]
    fn a_runner_program_is_found_as_the_sandbox_would_find_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("server.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let cmd = |p: &str| vec![p.to_owned()];
        // Not executable yet: refused; then found relative to the agent's directory.
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let check = |p: &str, host: bool| check_runner_program("x", &cmd(p), dir.path(), host);
        assert!(check("./server.sh", true).is_err());
        // (Docker: the agent's directory is bound at the same path: checked too.)
        assert!(check("./server.sh", false).is_err());
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check("./server.sh", true).is_ok());
        assert!(check(script.to_str().unwrap(), true).is_ok());
        assert!(check(script.to_str().unwrap(), false).is_ok());
        // A bare name on the sandbox's PATH; a directory is not a program.
        assert!(check("sh", true).is_ok());
        let e = check("/usr/bin", true).unwrap_err();
        assert!(e.to_string().contains("is not an executable file"), "{e}");
        assert!(check("nosuchserver", true).is_err());
        assert!(check("./nosuch.py", false).is_err());
        // Docker: a program of the image is not the host's to judge.
        assert!(check("nosuchserver", false).is_ok());
        assert!(check("/usr/bin/pyhton3", false).is_ok());
    }
}

//! Starting a run from its plan: the directories the plan names, then the
//! agent's sandbox, each runner's, and the sidecar, in parallel (the
//! sandbox first: its start is the longer); the sandboxes get their
//! secrets once the sidecar says it is ready.
//!
//! A [`StartedRun`] holds every process of the run, and
//! [`StartedRun::teardown`] is the one way they go, on every path: the
//! run's end, a spawn that failed, a sidecar that never came up.

use std::path::Path;
use std::time::{Duration, Instant};

use airlock_platform_api::launch;
use airlock_sandbox::{OutputStream, Sandbox, terminal};
use airlock_store::RunPhase;
use tokio::io::BufReader;

use super::error::{NotReady, RunError};
use super::output::{RUNNER_LOG_GRACE, RunnerPump, SandboxOutput, SidecarLog, log_runner_output};
use super::parts::{Orchestrator, SIDECAR_STOP_GRACE};
use super::plan::{Keys, RunPlan, Site};
use super::removal::Leftovers;
use super::request::{Progress, ProgressFn, RunRequest};
use super::rundir::create_sockets_dir;

/// How long the sidecar has to say it is ready.
pub const SIDECAR_READY_WITHIN: Duration = Duration::from_secs(30);

/// The processes of a run, while they live.
pub(super) struct StartedRun {
    pub(super) sandbox: Sandbox,
    runners: Vec<Sandbox>,
    /// The runners' output, on its way to the run's log.
    runner_pumps: Vec<RunnerPump>,
    output: Option<SandboxOutput>,
    pub(super) sidecar: Option<Sandbox>,
    sidecar_log: SidecarLog,
}

/// What is left of a run once its processes are stopped: what they said,
/// and what the backends made for them, to remove.
pub(super) struct Remains {
    pub(super) output: Option<SandboxOutput>,
    sidecar_log: SidecarLog,
    pub(super) leftovers: Leftovers,
}

impl Orchestrator {
    /// The plan of `req` as run `run_id` in `run_dir`, and the directories
    /// it names, made.
    pub(super) fn plan(
        &self,
        run_id: &str,
        run_dir: &Path,
        req: &RunRequest,
        org_budget: bool,
        proxy: &crate::proxies::RunProxy,
    ) -> Result<RunPlan, RunError> {
        // The run directory stays the platform's (owner file, 0700); the
        // sandbox sees only the sockets' directory, read-only.
        let paths = self.backend.paths(run_dir);
        // Where the sidecar runs and how the sandbox reaches it: the backend's call.
        let placement = self
            .backend
            .sidecar_placement(run_id, &paths, &self.api_socket);
        let runtime_log = std::env::var("AIRLOCK_RUNTIME_LOG").unwrap_or_else(|_| "warn".into());
        let sidecar_log = std::env::var("AIRLOCK_SIDECAR_LOG").unwrap_or_else(|_| "warn".into());
        let runtime_exe = self.backend.runtime_exe(&self.exe);
        let known_prices = req
            .manifest
            .model
            .as_ref()
            .map(|m| self.models.prices_for(m.provider))
            .unwrap_or_default();
        let site = Site {
            run_id,
            run_dir,
            paths: &paths,
            placement: &placement,
            exe: &self.exe,
            runtime_exe: &runtime_exe,
            sidecar_exe: self.sidecar_exe.as_deref(),
            api_socket: &self.api_socket,
            runtime_log: &runtime_log,
            sidecar_log: &sidecar_log,
            org_budget,
            proxy_url: proxy.url.as_ref(),
            known_prices: &known_prices,
            transparent_plane: self.backend.transparent_plane(),
            traced: self.traces.is_some(),
        };
        let keys = Keys::mint(run_id, &req.manifest, &self.tokens)?;
        let plan = RunPlan::build(req, &self.settings, &site, keys)?;
        create_sockets_dir(&paths.sockets_host).map_err(|error| RunError::SocketsDir {
            path: paths.sockets_host.clone(),
            error,
        })?;
        // The egress journal: the platform's file in the run's directory
        // (never in the sandbox's view), appended to by the sidecar.
        crate::journal::create(run_dir).map_err(|error| RunError::EgressJournal {
            dir: run_dir.to_owned(),
            error,
        })?;
        for r in &plan.runners {
            create_sockets_dir(&r.dir).map_err(|error| RunError::RunnerDir {
                path: r.dir.clone(),
                error,
            })?;
        }
        Ok(plan)
    }

    /// Starts the processes of `plan` (a run of `org`); on a failure, those
    /// started are torn down before the error is returned.
    pub(super) async fn start(
        &self,
        run_id: &str,
        org: &str,
        plan: &RunPlan,
        progress: ProgressFn<'_>,
        started: Instant,
    ) -> Result<StartedRun, RunError> {
        // A sandbox and sidecar the backend prepared before the run, if it
        // keeps any and the organization's share allows: the spawns below
        // take them.
        if self
            .backend
            .claim_prepared(org, &plan.sandbox, &plan.sidecar)
        {
            tracing::debug!(target: "airlock::phase", "prepared sandbox claimed");
        }
        let sandbox = self
            .backend
            .spawn(&plan.sandbox)
            .map_err(RunError::SandboxSpawn)?;
        tracing::debug!(target: "airlock::phase", "sandbox spawned");
        self.metrics
            .sandbox_started(self.backend.name(), started.elapsed());
        let mut run = StartedRun {
            sandbox,
            runners: Vec::new(),
            runner_pumps: Vec::new(),
            output: None,
            sidecar: None,
            sidecar_log: SidecarLog::default(),
        };
        match self
            .bring_up(&mut run, run_id, plan, progress, started)
            .await
        {
            Ok(()) => Ok(run),
            Err(e) => {
                let mut remains = run.teardown(None).await;
                self.removals
                    .spawn(run_id, std::mem::take(&mut remains.leftovers));
                Err(match e {
                    // Its own last words are the reason (it reads its
                    // config before it says it is ready).
                    RunError::SidecarNotReady(first) => RunError::SidecarNotReady(
                        remains.sidecar_log.finish().await.unwrap_or(first),
                    ),
                    e => e,
                })
            }
        }
    }

    /// The runners, the sidecar, and the secrets handed over once it is ready.
    async fn bring_up(
        &self,
        run: &mut StartedRun,
        run_id: &str,
        plan: &RunPlan,
        progress: ProgressFn<'_>,
        started: Instant,
    ) -> Result<(), RunError> {
        for r in &plan.runners {
            let mut sb = self
                .backend
                .spawn(&r.spec)
                .map_err(|error| RunError::RunnerSpawn {
                    namespace: r.namespace.clone(),
                    error,
                })?;
            let pumps = log_runner_output(&self.store, run_id, &r.namespace, &mut sb);
            run.runner_pumps.extend(pumps);
            run.runners.push(sb);
        }
        run.output = Some(SandboxOutput::start(&mut run.sandbox, plan.tag.clone()));
        let sidecar_spawned = Instant::now();
        let mut sidecar = self
            .backend
            .spawn_sidecar(&plan.sidecar)
            .map_err(RunError::SidecarSpawn)?;
        run.sidecar_log = SidecarLog::start(&mut sidecar, plan.tag.as_deref());
        run.sidecar = Some(sidecar);
        tracing::debug!(target: "airlock::phase", "sidecar spawned");
        progress(Progress::SandboxUp {
            after: started.elapsed(),
        });
        self.record_phase(run_id, RunPhase::SandboxUp).await;
        let ready = read_ready(&mut run.sidecar_log.stdout);
        match tokio::time::timeout(SIDECAR_READY_WITHIN, ready).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(RunError::SidecarNotReady(e.to_string())),
            Err(_) => return Err(RunError::SidecarReadyTimeout(SIDECAR_READY_WITHIN)),
        }
        tracing::debug!(target: "airlock::phase", "sidecar ready");
        self.metrics
            .sidecar_started(self.backend.name(), sidecar_spawned.elapsed());
        open_to_sandboxes(&plan.sockets);
        for sb in &mut run.runners {
            sb.release_stdin();
        }
        run.sandbox.release_stdin();
        progress(Progress::SidecarUp {
            after: started.elapsed(),
        });
        self.record_phase(run_id, RunPhase::SidecarUp).await;
        Ok(())
    }

    /// Stores that the run reached `phase`, now. A failed write is logged
    /// and the run goes on: its phases are for the operator to look at,
    /// and its end and result must never be lost to them.
    async fn record_phase(&self, run_id: &str, phase: RunPhase) {
        let at = airlock_store::now_ms();
        if let Err(error) = self.store.record_run_phase(run_id, phase, at).await {
            tracing::warn!(run_id, ?phase, error = %airlock_store::Chain(&error), "the run's phase was not stored");
        }
    }
}

impl StartedRun {
    /// Stops every process of the run, whatever ended it: the sandboxes
    /// first (killed, and waited for; the agent's sandbox given `grace`
    /// first, when the platform stops a live run, so that its runtime
    /// reports what the agent wrote before the stop), then the sidecar, asked to stop and
    /// waited for until it has flushed ([`SidecarLog::flushed`]) or exited,
    /// so every request it let out and every event the runtime handed it
    /// (the agent's end among them) is recorded and nothing more can be;
    /// the runners' last lines are in the run's log before this returns.
    /// What the backends made for them is left for [`Remains::leftovers`]'
    /// removal, once the run's end is recorded.
    pub(super) async fn teardown(self, grace: Option<Duration>) -> Remains {
        let StartedRun {
            mut sandbox,
            mut runners,
            runner_pumps,
            mut output,
            sidecar,
            mut sidecar_log,
        } = self;
        if let Some(grace) = grace
            && !sandbox.terminate(grace, std::future::pending()).await
        {
            tracing::warn!("the sandbox did not stop within {grace:?} of being asked: killed");
        }
        sandbox.halt().await;
        for sb in &mut runners {
            sb.halt().await;
        }
        let deadline = tokio::time::Instant::now() + RUNNER_LOG_GRACE;
        for p in runner_pumps {
            p.finish(deadline).await;
        }
        tracing::debug!(target: "airlock::phase", "sandbox stopped");
        let mut leftovers = Leftovers(vec![sandbox]);
        leftovers.0.extend(runners);
        if let Some(mut sidecar) = sidecar {
            if !sidecar
                .terminate(SIDECAR_STOP_GRACE, sidecar_log.flushed())
                .await
            {
                tracing::warn!(
                    "the sidecar neither flushed nor exited within {SIDECAR_STOP_GRACE:?}: killed"
                );
                sidecar.halt().await;
            }
            tracing::debug!(target: "airlock::phase", "sidecar flushed");
            leftovers.0.push(sidecar);
        }
        if let Some(o) = output.as_mut() {
            o.finish().await;
        }
        Remains {
            output,
            sidecar_log,
            leftovers,
        }
    }
}

/// The sidecar's first line: its readiness.
async fn read_ready(stdout: &mut Option<BufReader<OutputStream>>) -> Result<(), NotReady> {
    let out = stdout.as_mut().ok_or(NotReady::NoStdout)?;
    match terminal::next_line(out, terminal::MAX_LINE).await {
        Ok(Some(line)) => match launch::SidecarReady::from_line(&line) {
            Ok(_) => Ok(()),
            Err(why) => Err(NotReady::Unexpected { line, why }),
        },
        Ok(None) => Err(NotReady::Exited),
        Err(e) => Err(NotReady::Read(e)),
    }
}

/// The sandboxes' uids are not the platform's: they may connect to the
/// sidecar's sockets (their directory is the platform's, 0711, and
/// read-only inside the sandbox).
fn open_to_sandboxes(sockets: &[std::path::PathBuf]) {
    for s in sockets {
        if let Err(e) =
            std::fs::set_permissions(s, std::os::unix::fs::PermissionsExt::from_mode(0o666))
        {
            tracing::warn!("{}: {e}", s.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use airlock_sandbox::{Backend, SandboxKind, SandboxSpec};
    use tokio::io::AsyncBufReadExt;

    use super::*;

    /// A process on the process backend that says its pid, then sleeps.
    async fn sleeper(dir: &Path, name: &str) -> (Sandbox, u32) {
        let spec = SandboxSpec {
            run_id: format!("run_teardown-{name}"),
            command: vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo $$; exec sleep 600".into(),
            ],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            stdin: vec![],
            hold_stdin: false,
            sockets_dir: dir.to_owned(),
            ro_paths: vec![],
            workspace: dir.join(name),
            workspace_size_mb: 1,
            memory_mb: 64,
            cpus: 1.0,
            pids_max: 16,
            kind: SandboxKind::Agent,
        };
        let mut sb = airlock_sandbox::process::ProcessBackend
            .spawn(&spec)
            .expect("spawn");
        let (out, _) = sb.take_output();
        let mut lines = BufReader::new(out.expect("stdout")).lines();
        let pid = lines.next_line().await.unwrap().unwrap().parse().unwrap();
        (sb, pid)
    }

    /// The one teardown removes the agent's sandbox, every runner's and the
    /// sidecar, and also what a start left half-made (no sidecar yet).
    #[tokio::test]
    async fn one_teardown_removes_every_process_of_the_run() {
        let dir = tempfile::tempdir().unwrap();
        for with_sidecar in [true, false] {
            let (sandbox, agent) = sleeper(dir.path(), "agent").await;
            let (r0, p0) = sleeper(dir.path(), "r0").await;
            let (r1, p1) = sleeper(dir.path(), "r1").await;
            let mut pids = vec![agent, p0, p1];
            let sidecar = match with_sidecar {
                true => {
                    let (sb, pid) = sleeper(dir.path(), "sidecar").await;
                    pids.push(pid);
                    Some(sb)
                }
                false => None,
            };
            for p in &pids {
                assert!(Path::new(&format!("/proc/{p}")).exists(), "{p} runs");
            }
            let run = StartedRun {
                sandbox,
                runners: vec![r0, r1],
                runner_pumps: vec![],
                output: None,
                sidecar,
                sidecar_log: SidecarLog::default(),
            };
            let remains = run.teardown(None).await;
            assert!(remains.output.is_none());
            for p in &pids {
                assert!(!Path::new(&format!("/proc/{p}")).exists(), "{p} is gone");
            }
        }
    }
}

//! Watching a started run until something ends it: its sandbox exits, its
//! sidecar dies, its timeout, a cancel, or the watchdog (a boot deadline,
//! then heartbeats).

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use airlock_sandbox::Sandbox;
use airlock_store::RunStatus;

use super::parts::Orchestrator;
use super::request::{Cancel, Progress, ProgressFn};
use super::start::StartedRun;

/// Why the watch stopped.
pub(super) enum Ended {
    /// The sandbox exited by itself.
    Sandbox(Option<ExitStatus>),
    /// The sidecar did (the sandbox is stopped for it).
    Sidecar(Option<ExitStatus>),
    /// The platform stopped the run: its status and reason.
    Stopped(RunStatus, String),
}

impl Orchestrator {
    /// Watches `run` until it ends; `timeout_secs` counts from now.
    pub(super) async fn watch(
        &self,
        run: &mut StartedRun,
        run_id: &str,
        timeout_secs: u64,
        cancel: &mut Cancel,
        progress: ProgressFn<'_>,
        started: Instant,
    ) -> Ended {
        let deadline = tokio::time::sleep(Duration::from_secs(timeout_secs));
        tokio::pin!(deadline);
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        let watchdog_every = Duration::from_secs(self.settings.watchdog_interval_secs);
        let mut last_sweep = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let ended = loop {
            tokio::select! {
                status = run.sandbox.wait() => break Ended::Sandbox(status.ok()),
                status = exit_of(&mut run.sidecar) => break Ended::Sidecar(status),
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
        ended
    }

    /// The watchdog's judgement of a run: `Some(reason)` when it must stop.
    async fn stalled(&self, run_id: &str, started: Instant) -> Option<String> {
        let run = self.store.get_run(run_id).await.ok()??;
        let now = airlock_store::now_ms();
        match run.last_heartbeat_at {
            None if started.elapsed() > Duration::from_secs(self.settings.boot_deadline_secs) => {
                Some(format!(
                    "no sign of life within the {} s boot deadline",
                    self.settings.boot_deadline_secs
                ))
            }
            Some(at)
                if now - at
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
}

/// The sidecar's exit (never, while there is none).
async fn exit_of(sidecar: &mut Option<Sandbox>) -> Option<ExitStatus> {
    match sidecar {
        Some(s) => s.wait().await.ok(),
        None => std::future::pending().await,
    }
}

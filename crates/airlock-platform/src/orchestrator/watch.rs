//! Watching a started run until something ends it: its sidecar says the
//! agent's end is kept, its sandbox exits, its sidecar dies, its timeout, a
//! cancel, or the watchdog (a boot deadline, then heartbeats).

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use airlock_sandbox::Sandbox;
use airlock_store::RunStatus;
use tokio::sync::Notify;

use super::parts::Orchestrator;
use super::request::{Cancel, Progress, ProgressFn};
use super::start::StartedRun;

/// Why the watch stopped.
pub(super) enum Ended {
    /// The sidecar kept the agent's end, as the runtime reported it: the
    /// sandbox is about to exit by itself (it is stopped, then judged as
    /// [`Ended::Sandbox`] is, by the end in the run's journal).
    Reported,
    /// The sandbox exited by itself.
    Sandbox(Option<ExitStatus>),
    /// The sidecar did (the sandbox is stopped for it).
    Sidecar(Option<ExitStatus>),
    /// The platform stopped the run: its status and reason.
    Stopped(RunStatus, String),
}

impl Orchestrator {
    /// Watches `run` until it ends; `timeout_secs` counts from now;
    /// `reported` is told when the sidecar kept the agent's end
    /// ([`crate::internal_api::InternalApi::end_reports`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn watch(
        &self,
        run: &mut StartedRun,
        run_id: &str,
        timeout_secs: u64,
        cancel: &mut Cancel,
        progress: ProgressFn<'_>,
        started: Instant,
        reported: &Notify,
    ) -> Ended {
        let deadline = tokio::time::sleep(Duration::from_secs(timeout_secs));
        tokio::pin!(deadline);
        let mut sweep = tokio::time::interval(Duration::from_secs(1));
        let watchdog_every = Duration::from_secs(self.settings.watchdog_interval_secs);
        let mut last_sweep = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        // Each exit is one future for the whole watch (a docker sandbox's
        // wait is a request to the daemon: one, not one per tick).
        let sandbox_exit = run.sandbox.wait();
        tokio::pin!(sandbox_exit);
        let sidecar_exit = exit_of(&mut run.sidecar);
        tokio::pin!(sidecar_exit);
        let end_kept = reported.notified();
        tokio::pin!(end_kept);
        let ended = loop {
            tokio::select! {
                // First: a sandbox that exited after its end was kept ends
                // the run the same way either way.
                biased;
                () = &mut end_kept => break Ended::Reported,
                status = &mut sandbox_exit => break Ended::Sandbox(status.ok()),
                status = &mut sidecar_exit => break Ended::Sidecar(status),
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
        match &ended {
            Ended::Reported => tracing::debug!(target: "airlock::phase", "agent's end kept"),
            _ => tracing::debug!(target: "airlock::phase", "sandbox exited"),
        }
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

//! A run's end: judged from what ended it, then stored with its true
//! reason, the run's journal first (kept on disk, and stored later, while
//! the store does not take it); and the ways a run is ended outside its
//! own end, each telling whoever sends the webhook deliveries its end
//! queued: [`fail_run`] (one run), [`cancel_run`] (one run, asked by a
//! tenant), [`fail_runs_of_gone_replicas`] (the leader's sweep).

use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use airlock_platform_api::wire::RunEvent;
use airlock_store::{CancelOutcome, RunEnd, RunStatus, Store, StoreError, Sweep};
use tokio::sync::Notify;

use super::error::RunError;
use super::parts::Orchestrator;
use super::request::RunOutcome;
use super::rundir::write_private;
use super::start::Remains;
use super::watch::Ended;

/// How a run ends: its status, the agent's exit code, and why.
pub(super) struct Verdict {
    pub(super) status: RunStatus,
    pub(super) exit_code: Option<i64>,
    pub(super) error: Option<String>,
}

impl Verdict {
    fn new(status: RunStatus, exit_code: Option<i64>, error: Option<String>) -> Verdict {
        Verdict {
            status,
            exit_code,
            error,
        }
    }

    /// A run that could not run, for `e`.
    pub(super) fn failed(e: &RunError) -> Verdict {
        Verdict::new(RunStatus::Failed, None, Some(e.to_string()))
    }
}

/// How the watch's end is judged: at once, or (the sandbox ended by
/// itself) by the agent's end in the run's journal.
pub(super) enum Judged {
    Final(Verdict),
    BySandbox {
        status: Option<ExitStatus>,
        diagnostic: Option<String>,
    },
}

/// What ended a run, judged with what its processes said.
pub(super) fn judge(ended: Ended, remains: &Remains) -> Judged {
    match ended {
        Ended::Stopped(status, reason) => Judged::Final(Verdict::new(status, None, Some(reason))),
        Ended::Sidecar(status) => Judged::Final(Verdict::new(
            RunStatus::Failed,
            None,
            Some(format!(
                "the sidecar stopped unexpectedly ({}); the sandbox was stopped",
                describe_exit(status)
            )),
        )),
        Ended::Sandbox(status) => Judged::BySandbox {
            status,
            diagnostic: remains.output.as_ref().and_then(|o| o.last_diagnostic()),
        },
        // Judged by the agent's end in the journal, as a sandbox's own exit
        // is: the exit code is the one the runtime reported, never the
        // sandbox's (which the stop may have made).
        Ended::Reported => Judged::BySandbox {
            status: None,
            diagnostic: remains.output.as_ref().and_then(|o| o.last_diagnostic()),
        },
    }
}

/// Fails run `run_id` now, with `reason`: a run that could not start, or
/// whose platform is gone. Its end and the webhook deliveries it owes are
/// stored in one transaction ([`Store::fail_run`]); `ends` is told, so
/// that they go out now. `false`: it had already ended (its end stands).
pub async fn fail_run(
    store: &Store,
    ends: &Notify,
    run_id: &str,
    reason: &str,
) -> Result<bool, StoreError> {
    let failed = store.fail_run(run_id, reason).await?;
    if failed {
        ends.notify_one();
    }
    Ok(failed)
}

/// Cancels `org`'s run `run_id`, saying why (`reason`: who asked): a
/// queued run ends `cancelled` now, its end and deliveries stored in one
/// transaction ([`Store::request_cancel`]), and `ends` is told; a running
/// one is marked for its platform to stop, whose end records `reason`.
pub async fn cancel_run(
    store: &Store,
    ends: &Notify,
    org: &str,
    run_id: &str,
    reason: &str,
) -> Result<CancelOutcome, StoreError> {
    let outcome = store.request_cancel(org, run_id, reason).await?;
    if matches!(outcome, CancelOutcome::CancelledQueued) {
        ends.notify_one();
    }
    Ok(outcome)
}

/// The leader's sweep ([`Store::sweep_dead_replicas`], one transaction):
/// replicas silent for more than `lease_ms` are dropped and the runs they
/// held failed, with their deliveries; `ends` is told when any was.
pub async fn fail_runs_of_gone_replicas(
    store: &Store,
    ends: &Notify,
    lease_ms: i64,
    sweeper: &str,
) -> Result<Sweep, StoreError> {
    let swept = store.sweep_dead_replicas(lease_ms, sweeper).await?;
    if !swept.failed.is_empty() {
        ends.notify_one();
    }
    Ok(swept)
}

impl Orchestrator {
    /// [`cancel_run`] on this platform's store.
    pub async fn cancel_run(
        &self,
        org: &str,
        run_id: &str,
        reason: &str,
    ) -> Result<CancelOutcome, StoreError> {
        let outcome = cancel_run(&self.store, &self.ends, org, run_id, reason).await?;
        if matches!(outcome, CancelOutcome::CancelledQueued) {
            // It never ran: no backend, no duration.
            self.metrics.run_ended(RunStatus::Cancelled, "none", None);
        }
        Ok(outcome)
    }

    /// [`fail_run`] on this platform's store.
    pub async fn fail_run(&self, run_id: &str, reason: &str) -> Result<bool, StoreError> {
        fail_run(&self.store, &self.ends, run_id, reason).await
    }

    /// Judges a watched run's end: the sandbox's end by the agent's.
    pub(super) async fn verdict(
        &self,
        run_id: &str,
        judged: Result<Judged, RunError>,
        journalled: Option<RunEvent>,
    ) -> Verdict {
        match judged {
            Ok(Judged::Final(v)) => v,
            Ok(Judged::BySandbox { status, diagnostic }) => {
                self.judge_sandbox_end(run_id, status, diagnostic, journalled)
                    .await
            }
            Err(e) => Verdict::failed(&e),
        }
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
        status: Option<ExitStatus>,
        diagnostic: Option<String>,
        journalled: Option<RunEvent>,
    ) -> Verdict {
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
                0 => Verdict::new(RunStatus::Succeeded, Some(code), None),
                c if c > 128 && c <= 128 + 64 => Verdict::new(
                    RunStatus::Failed,
                    Some(code),
                    Some(format!(
                        "the agent was killed by signal {} (exit code {c})",
                        c - 128
                    )),
                ),
                c => Verdict::new(
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
        Verdict::new(RunStatus::Failed, None, Some(reason))
    }

    /// Stores the run's end (`journal_stored`: its journal is in the
    /// store), then removes its directory; the outcome is the store's when
    /// someone else ended it first.
    pub(super) async fn record_end(
        &self,
        run_id: String,
        run_dir: &Path,
        started: Instant,
        v: Verdict,
        journal_stored: bool,
    ) -> Result<RunOutcome, RunError> {
        let end = PendingEnd {
            status: v.status.as_str().to_owned(),
            exit_code: v.exit_code,
            error: v.error.clone(),
            at: airlock_store::now_ms(),
        };
        // Recorded as ended before its directory goes: a concurrent boot
        // reclaim never sees it `running` without a directory.
        let finished = match journal_stored {
            true => self.store.finish_run(&run_id, &end.as_run_end()).await,
            false => Err(StoreError::JournalNotStored),
        };
        tracing::debug!(target: "airlock::phase", "end recorded");
        let outcome = |v: Verdict| RunOutcome {
            run_id: run_id.clone(),
            status: v.status,
            exit_code: v.exit_code,
            error: v.error,
            duration: started.elapsed(),
            backend: self.backend.name(),
        };
        let finished = match finished {
            Ok(f) => f,
            Err(e) => {
                // The store is down (or refused): the run's journal and its
                // end stay on disk, stored when the store takes them.
                tracing::warn!(
                    run_id,
                    "the run's end is kept on disk until the store takes it: {e}"
                );
                keep_end_on_disk(&self.store, &run_id, run_dir, &end);
                return Ok(outcome(v));
            }
        };
        if finished {
            self.ends.notify_one();
        }
        let _ = std::fs::remove_dir_all(run_dir);
        tracing::debug!(target: "airlock::phase", "run directory removed");
        // Ended first by someone else (cancelled, or failed by a reclaim):
        // what the store says is the outcome, not what this platform saw.
        if finished {
            return Ok(outcome(v));
        }
        Ok(match self.store.get_run(&run_id).await? {
            Some(stored) => outcome(Verdict::new(stored.status, stored.exit_code, stored.error)),
            None => outcome(v),
        })
    }
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
    pub(super) fn as_run_end(&self) -> RunEnd<'_> {
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
pub(super) const MAX_END_FILE: u64 = 64 * 1024;

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
pub(super) async fn store_pending_end(
    store: &Store,
    run_id: &str,
    run_dir: &Path,
    end: &PendingEnd,
) -> bool {
    if !crate::journal::ingest_run_dir(store, run_id, run_dir).await {
        return false;
    }
    match store.finish_run(run_id, &end.as_run_end()).await {
        Ok(_) | Err(StoreError::RunNotFound(_)) => {
            let _ = std::fs::remove_dir_all(run_dir);
            true
        }
        Err(e) => {
            tracing::debug!(run_id, "the run's end is not stored yet: {e}");
            false
        }
    }
}

/// An exit status, said.
fn describe_exit(status: Option<ExitStatus>) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::tests::store_with_run;

    /// Whether `ends` was told (a permit waits), taking the permit.
    fn told(ends: &Notify) -> bool {
        let n = std::pin::pin!(ends.notified());
        n.enable()
    }

    /// A failed run keeps its true reason and whoever sends its webhook
    /// deliveries is told; a run already ended keeps its end, and nobody is
    /// told again.
    #[tokio::test]
    async fn a_failed_run_keeps_its_reason_and_its_webhooks_are_told() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_run(dir.path()).await;
        let ends = Notify::new();
        let why = "writing the agent's files: disk full";
        assert!(fail_run(&store, &ends, "run_t", why).await.unwrap());
        let run = store.get_run("run_t").await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::Failed);
        assert_eq!(run.error.as_deref(), Some(why));
        assert!(told(&ends));
        assert!(!fail_run(&store, &ends, "run_t", "later").await.unwrap());
        let run = store.get_run("run_t").await.unwrap().unwrap();
        assert_eq!(run.error.as_deref(), Some(why));
        assert!(!told(&ends));
    }
}

//! What the backends made for a run's processes (containers, networks,
//! cgroups), removed once the run's end is recorded: a run is over for
//! its tenant when its agent has exited and its sidecar has flushed, not
//! when the daemon has taken its containers apart.
//!
//! Every removal is bounded ([`REMOVAL_WITHIN`] a sandbox) and tracked:
//! the platform's stop waits for those still going ([`Removals::finish`]).
//! A platform that dies before they are done leaves its sandboxes to the
//! next boot's reclaim, as it leaves a run it was running: each carries
//! its owner's label or cgroup, judged dead there.

use std::time::Duration;

use airlock_sandbox::Sandbox;
use tokio_util::task::TaskTracker;

/// How long one sandbox's removal may take before it is given up here
/// (what is left goes in the background, or at the next boot's reclaim).
pub const REMOVAL_WITHIN: Duration = Duration::from_secs(30);

/// A run's stopped sandboxes: its agent's, its runners' and its sidecar's.
#[derive(Default)]
pub(super) struct Leftovers(pub(super) Vec<Sandbox>);

impl Leftovers {
    /// Removes them all, side by side, each within [`REMOVAL_WITHIN`].
    async fn remove(self) {
        let mut each = tokio::task::JoinSet::new();
        for sb in self.0 {
            each.spawn(async move {
                if tokio::time::timeout(REMOVAL_WITHIN, sb.cleanup())
                    .await
                    .is_err()
                {
                    tracing::warn!("a sandbox was not removed within {REMOVAL_WITHIN:?}");
                }
            });
        }
        while each.join_next().await.is_some() {}
    }
}

/// The removals of this platform's runs still going.
#[derive(Default)]
pub struct Removals(TaskTracker);

impl Removals {
    /// Removes `leftovers` of run `run_id` in the background.
    pub(super) fn spawn(&self, run_id: &str, leftovers: Leftovers) {
        if leftovers.0.is_empty() {
            return;
        }
        let run_id = run_id.to_owned();
        self.0.spawn(async move {
            leftovers.remove().await;
            tracing::debug!(target: "airlock::phase", run = %run_id, "sandboxes removed");
        });
    }

    /// How many are still going.
    pub fn pending(&self) -> usize {
        self.0.len()
    }

    /// Waits until every removal started so far is done (the platform's
    /// stop). Removals started later are still tracked.
    pub async fn finish(&self) {
        self.0.close();
        self.0.wait().await;
        self.0.reopen();
    }
}

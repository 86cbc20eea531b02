//! What a run is asked with, what it tells a live view on its way, and what
//! it answers at its end.

use std::path::PathBuf;
use std::time::Duration;

use airlock_store::RunStatus;
use tokio::sync::watch;

use crate::manifest::Manifest;

/// What the operator asked for.
pub struct RunRequest {
    /// The organization the run belongs to ([`airlock_store::LOCAL_ORG`] for `airlock run`).
    pub org: String,
    pub manifest: Manifest,
    /// The manifest's directory: the agent's working directory (read-only).
    pub agent_dir: PathBuf,
    pub prompt: Option<String>,
    /// A directory holding the run's input files (the sandbox sees it
    /// read-only; the runtime copies them into the workspace).
    pub inputs_dir: Option<PathBuf>,
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

/// A live view's callback.
pub type ProgressFn<'a> = &'a (dyn Fn(Progress) + Send + Sync);

#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub run_id: String,
    pub status: RunStatus,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
    pub duration: Duration,
    pub backend: &'static str,
}

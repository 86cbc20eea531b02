//! Runs, in phases, each in its own file:
//!
//! - [`preflight`]: what is checked before anything starts or is recorded;
//! - [`plan`]: everything a run is started with, built (pure, unit-tested)
//!   from the manifest, the settings and the backend's placement;
//! - [`start`]: the plan's directories, then the sandbox, the runners and
//!   the sidecar in parallel; a started run holds them, and its one
//!   teardown stops them on every path (the sandboxes, then the sidecar
//!   until it has flushed);
//! - [`watch`]: until the sidecar says the agent's end is kept (the
//!   runtime reported it), the sandbox or the sidecar exits, the timeout, a
//!   cancel, or the watchdog;
//! - [`end`]: the end judged and stored with its true reason, and the
//!   ways a run is ended outside its own end ([`fail_run`], [`cancel_run`],
//!   [`fail_runs_of_gone_replicas`]);
//! - [`removal`]: what the backends made for the run, removed after its
//!   end is recorded (bounded, and awaited by the platform's stop);
//! - [`reclaim`]: what a platform that is gone left behind.
//!
//! [`lifecycle`] drives a run through them.

mod end;
mod error;
mod lifecycle;
mod output;
mod parts;
pub mod plan;
mod preflight;
mod reclaim;
mod removal;
mod request;
mod rundir;
mod start;
mod watch;

/// In the sockets' directory: the sidecar's API and proxy sockets.
pub use airlock_sandbox::{PROXY_SOCKET, SIDECAR_SOCKET};
pub use end::{END_FILE, PendingEnd, cancel_run, fail_run, fail_runs_of_gone_replicas};
pub use error::{NotReady, Refusal, RunError};
pub use output::{KEPT_RUNNER_LINES, RUNNER_STREAM, runner_stream};
pub use parts::{
    AGENT_STOP_GRACE, EPHEMERAL_KID, Orchestrator, SIDECAR_STOP_GRACE, SharedOrchestrator,
};
pub use reclaim::{
    own_platform_socket, platform_socket_name, reclaim, reclaim_cgroups_of, reclaim_standby_cgroups,
};
pub use removal::{REMOVAL_WITHIN, Removals};
pub use request::{Cancel, Echo, Progress, ProgressFn, RunOutcome, RunRequest};
pub use rundir::OWNER_FILE;
pub use start::SIDECAR_READY_WITHIN;

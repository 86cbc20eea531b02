//! The parts a platform runs its runs with ([`crate::platform::Platform::start`]
//! puts them together).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use airlock_sandbox::Backend;
use airlock_store::Store;
use airlock_vault::RunTokens;
use tokio::sync::Notify;

use crate::internal_api::InternalApi;
use crate::settings::Settings;

/// The embedded platform of `airlock run`, and each `airlock serve` replica's.
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
    /// Told whenever this platform stores a run's end: the webhook
    /// deliveries the end owes are queued with it ([`Store::finish_run`]),
    /// and whoever sends them (`airlock serve`'s deliverer) waits on this.
    pub ends: Arc<Notify>,
    /// The models this platform knows (bundled, and the live catalog's).
    pub models: Arc<crate::models::ModelRegistry>,
    /// What this platform counts for its operator ([`crate::metrics`]).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Its runs' traces, when `OTEL_EXPORTER_OTLP_ENDPOINT` asks for them
    /// ([`crate::traces`]).
    pub traces: Option<Arc<crate::traces::Traces>>,
    /// Its runs' sandboxes still being removed after their ends were
    /// recorded ([`super::removal`]); its stop waits for them.
    pub removals: super::Removals,
}

impl Orchestrator {
    /// Exports the traces still pending and stops exporting (the
    /// platform's stop; nothing when traces are off).
    pub async fn finish_traces(&self) {
        if let Some(t) = &self.traces {
            t.shutdown().await;
        }
    }
}

impl Orchestrator {
    /// Waits for the removals of its runs' sandboxes still going (the
    /// platform's stop).
    pub async fn finish_removals(&self) {
        self.removals.finish().await;
    }
}

/// Shared state for several concurrent runs.
pub type SharedOrchestrator = Arc<Orchestrator>;

/// How long a stopped sidecar has to flush after SIGTERM (say so, or exit)
/// before it is killed
/// ([`Sandbox::terminate`](airlock_sandbox::Sandbox::terminate)). The
/// platform waits for its flush (not a fixed time): this must outlast the
/// sidecar's own deadline for draining what is in flight (events, egress
/// records, model streams), or its last records are lost.
pub const SIDECAR_STOP_GRACE: Duration = Duration::from_secs(5);

/// How long a sandbox the platform stops (a cancel, the run's timeout, the
/// watchdog) has after SIGTERM before it is killed: its runtime ends the
/// agent at once and reports the lines it read and its count of what it
/// shed, then exits ([`Sandbox::terminate`](airlock_sandbox::Sandbox::terminate)).
/// The platform waits for the sandbox's exit, not for this time.
pub const AGENT_STOP_GRACE: Duration = Duration::from_secs(3);

/// The key id of the throwaway key an embedded platform uses when no
/// `CONNECTION_ENCRYPTION_KEY` is set (it decrypts nothing stored).
pub const EPHEMERAL_KID: &str = "ephemeral";

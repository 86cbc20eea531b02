//! Row types and inputs.

/// How a connection's credential is presented upstream: the contract
/// crate's one type (its `as_str` is the column's text).
pub use airlock_platform_api::connection_types::AuthType;

/// A connection to store. `envelope` is a `v1:` envelope: the store never sees plaintext.
#[derive(Debug, Clone, Copy)]
pub struct NewConnection<'a> {
    /// The organization it belongs to ([`crate::LOCAL_ORG`] for the CLI's).
    pub org: &'a str,
    pub name: &'a str,
    pub integration: &'a str,
    pub auth_type: AuthType,
    pub envelope: &'a str,
}

/// A connection without its envelope (what listings show).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    pub org_id: String,
    pub name: String,
    pub integration: String,
    pub auth_type: AuthType,
    /// The key id its envelope is under.
    pub kid: String,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A connection with its (encrypted) envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionRecord {
    pub info: ConnectionInfo,
    pub envelope: String,
}

/// A run's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
}

impl RunStatus {
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::TimedOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::TimedOut => "timed_out",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Whether the run has ended.
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunStatus::Queued | RunStatus::Running)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A run to record.
#[derive(Debug, Clone, Copy)]
pub struct NewRun<'a> {
    /// The organization it belongs to ([`crate::LOCAL_ORG`] for `airlock run`'s).
    pub org: &'a str,
    /// The `airlock serve` replica running it (`None`: an embedded platform).
    pub owner: Option<&'a str>,
    pub id: &'a str,
    pub agent: &'a str,
    pub backend: &'a str,
    pub model: Option<&'a str>,
    pub status: RunStatus,
    /// Defaults to now.
    pub created_at: Option<i64>,
}

/// A run, with the denormalised columns a run list shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub id: String,
    pub agent: String,
    pub status: RunStatus,
    pub backend: String,
    pub model: Option<String>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    /// When its sandbox was up (Unix ms; `None`: not yet, or never).
    pub sandbox_up_at: Option<i64>,
    /// When its sidecar was ready and the agent let go (Unix ms).
    pub sidecar_up_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub last_heartbeat_at: Option<i64>,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
    pub tokens_in: i64,
    pub tokens_out: i64,
    /// Cost in millionths of a US dollar.
    pub cost_microusd: i64,
    pub org_id: String,
    /// The `airlock serve` replica that runs it (`None`: an embedded platform or not started).
    pub owner: Option<String>,
    /// Metered model calls.
    pub requests: i64,
    /// The model budget it is held to (its own limits; none: not limited).
    pub budget: crate::BudgetLimits,
    /// The upstream proxy its guarded connections went through: a
    /// `SYSTEM_PROXIES` name, `PROXY_URL`, or `None` (direct, or not
    /// started). Never a URL.
    pub proxy: Option<String>,
}

/// A phase of a started run that its row records the time of
/// ([`crate::Store::record_run_phase`]), between its start and its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunPhase {
    /// Its sandbox is up.
    SandboxUp,
    /// Its sidecar is ready and the sandboxes have their secrets.
    SidecarUp,
}

/// Filters for [`crate::Store::list_runs`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RunQuery<'a> {
    /// Only this organization's runs (`None`: every organization's, for the operator).
    pub org: Option<&'a str>,
    pub status: Option<RunStatus>,
    pub agent: Option<&'a str>,
    /// Only runs created strictly before this (Unix ms): for paging.
    pub before: Option<i64>,
    /// With `before`: also runs created at `before` whose id sorts before
    /// this (the last row of the previous page), so a page never splits a
    /// millisecond and loses rows.
    pub before_id: Option<&'a str>,
    /// Default 100.
    pub limit: Option<u32>,
}

/// How a run ended.
#[derive(Debug, Clone, Copy)]
pub struct RunEnd<'a> {
    pub status: RunStatus,
    pub exit_code: Option<i64>,
    pub error: Option<&'a str>,
    pub at: i64,
}

/// Metered usage to add to a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub cost_microusd: i64,
}

/// An event to append.
#[derive(Debug, Clone, Copy)]
pub struct NewEvent<'a> {
    pub run_id: &'a str,
    pub at: i64,
    /// e.g. `heartbeat`, `log`, `result`, `cost`.
    pub kind: &'a str,
    /// JSON text.
    pub payload: &'a str,
}

/// An event read from a run's journal: stored once per `(run_id, seq)`
/// however often the journal is read, and its usage (a model call's)
/// added to the run only when the event is stored the first time.
#[derive(Debug, Clone)]
pub struct JournalledEvent {
    /// The event's place in the run's journal (its line's byte offset).
    pub seq: i64,
    pub at: i64,
    pub kind: String,
    /// JSON text.
    pub payload: String,
    pub usage: Option<Usage>,
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: i64,
    pub run_id: String,
    pub at: i64,
    pub kind: String,
    pub payload: String,
}

/// The egress record's enums, the wire's types: one definition for the
/// sidecar that writes a record, the platform that reads it and the store
/// that keeps it (each column holds its `as_str`, read back by `FromStr`).
pub use airlock_platform_api::wire::{EgressDecision, EgressPlane, EgressSource, RefusalCode};

/// What became of an allowed request: the wire's type, one definition for
/// the sidecar that reports it and the store that keeps it.
pub use airlock_platform_api::wire::EgressOutcome;

/// Whether a model call was metered from the provider's own usage report
/// (the wire's `Metering`).
pub use airlock_platform_api::wire::Metering as EgressMetering;

/// An outbound request to log. `url` must already be free of credentials.
///
/// With a `seq`, [`crate::Store::append_egress`] is an upsert on
/// `(run_id, seq)`: the first write of a request (`outcome: Incomplete`)
/// inserts its row, the completion updates it, and a repeated start never
/// undoes a completion.
#[derive(Debug, Clone, Copy)]
pub struct NewEgress<'a> {
    pub run_id: &'a str,
    pub at: i64,
    pub source: EgressSource,
    pub integration: Option<&'a str>,
    pub method: &'a str,
    pub url: &'a str,
    pub host: &'a str,
    /// The guard's decision.
    pub decision: EgressDecision,
    /// The guard's refusal code, when refused.
    pub reason: Option<RefusalCode>,
    /// Upstream HTTP status, when there was one.
    pub status: Option<i64>,
    pub duration_ms: Option<i64>,
    /// Bytes sent upstream (request body, or what a tunnel carried out).
    pub bytes_out: i64,
    /// Bytes received from upstream.
    pub bytes_in: i64,
    /// The record's number within the run (the sidecar's), if any.
    pub seq: Option<i64>,
    /// What became of an allowed request; `None` for a refusal.
    pub outcome: Option<EgressOutcome>,
    /// Model calls: whether the usage was metered.
    pub metering: Option<EgressMetering>,
    /// The path that carried it to the guard.
    pub plane: EgressPlane,
    /// A `rule_refused` refusal: the id of the L7 rule that refused it.
    pub rule: Option<&'a str>,
}

/// A logged outbound request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressEntry {
    pub id: i64,
    pub run_id: String,
    pub at: i64,
    pub source: EgressSource,
    pub integration: Option<String>,
    pub method: String,
    pub url: String,
    pub host: String,
    /// The guard's decision.
    pub decision: EgressDecision,
    /// The guard's refusal code.
    pub reason: Option<RefusalCode>,
    pub status: Option<i64>,
    pub duration_ms: Option<i64>,
    pub bytes_out: i64,
    pub bytes_in: i64,
    pub seq: Option<i64>,
    /// `None` for refusals (nothing was sent).
    pub outcome: Option<EgressOutcome>,
    pub metering: Option<EgressMetering>,
    /// The path that carried it to the guard.
    pub plane: EgressPlane,
    /// A `rule_refused` refusal: the id of the L7 rule that refused it.
    pub rule: Option<String>,
}

/// An agent's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memory {
    pub id: i64,
    pub agent: String,
    pub run_id: Option<String>,
    pub content: String,
    pub created_at: i64,
}

/// A result body stored for a run (above the inline cap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    pub run_id: String,
    pub id: String,
    pub content_type: String,
    pub body: Vec<u8>,
    pub created_at: i64,
}

/// What one re-encryption batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Rows rewritten under the active key.
    pub rewritten: usize,
    /// Rows read (rows changed by someone else meanwhile are read but not rewritten).
    pub scanned: usize,
    /// The last name read: the cursor for the next batch.
    pub last: String,
}

//! The internal API's wire protocol: HTTP/1.1 + JSON over a unix socket.
//!
//! Every request carries `Authorization: Bearer <run token>`
//! (`<runId>.<hex HMAC-SHA256>`). The platform derives the run from the token
//! itself; nothing in a path or body can name another run. Errors are
//! `{"error": "<code>", "message": "…"}` with 401 (missing/invalid token),
//! 403 (the run is not running, or the integration is not the run's),
//! 404 (unknown integration, result or run), 400 (bad request).
//!
//! | method | path | body | answer |
//! |---|---|---|---|
//! | GET  | `/internal/v1/credentials/{integration}` | – | [`CredentialResponse`] |
//! | GET  | `/internal/v1/history?limit=N&fields=checkpoint,result` | – | [`HistoryResponse`] |
//! | GET  | `/internal/v1/memories?q=TEXT&limit=N` | – | [`MemoriesResponse`] |
//! | POST | `/internal/v1/events` | [`EventBatch`] | [`Accepted`] |
//! | POST | `/internal/v1/ended` | – | [`Accepted`] (see [`ENDED_PATH`]) |
//! | POST | `/internal/v1/results` | raw bytes, `content-type` kept | [`StoredResultRef`] |
//! | GET  | `/internal/v1/results/{id}` | – | the raw bytes, with their `content-type` |
//! | POST | `/internal/v1/artifacts` | the file's raw bytes; its path in `x-airlock-artifact-path`, or empty with `x-airlock-artifact-refused` | [`ArtifactAnswer`] |

use std::collections::BTreeMap;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

pub const PREFIX: &str = "/internal/v1";

/// The sidecar's word that the agent's end ([`RunEvent::Result`], as the
/// runtime reported it) is kept in the run's journal: the platform stops
/// watching the run and tears it down at once, instead of waiting for the
/// sandbox's exit to be reported. It carries nothing: what the run's end
/// is, is read from the journal, never from this request. Only the
/// sidecar sends it (the run token is the sidecar's; the sandbox never
/// holds it).
pub const ENDED_PATH: &str = "/internal/v1/ended";

/// The integration name of the model's connection: what the model relay
/// asks `/credentials/{integration}` for, and the key of the run's grant
/// that holds the model's connection. Never a namespace (those start with
/// a letter or a digit).
pub const MODEL_CREDENTIAL: &str = "@model";

/// Largest egress journal of one run (docs/security.md, "What the egress
/// log records"): the sidecar refuses a request whose record would take
/// its journal past this, and the platform reads at most this much of it.
pub const EGRESS_JOURNAL_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// The egress journal's file name in a run's directory.
pub const EGRESS_JOURNAL_FILE: &str = "egress.journal";

/// Most bytes of the agent's log lines one run keeps (docs/configuration.md,
/// "What a run keeps"): each line counts its text and
/// [`LOG_LINE_OVERHEAD`]. Past it the sidecar journals one truncation
/// marker, and every later line is shed and counted ([`RunEvent::Shed`]).
pub const RUN_LOG_MAX_BYTES: u64 = 8 * 1024 * 1024;

/// What one kept log line costs against [`RUN_LOG_MAX_BYTES`] beside its
/// text (its row, its JSON): a flood of empty lines is bounded too.
pub const LOG_LINE_OVERHEAD: u64 = 96;

/// Room in a run's journal for what is never shed (the agent's end and
/// result, model usage, the counts of what was shed): past the egress and
/// log budgets, these still fit.
pub const JOURNAL_RESERVE_BYTES: u64 = 4 * 1024 * 1024;

/// Largest journal of one run: its egress records, its kept log lines and
/// the reserve. The platform reads at most this much of it.
pub const JOURNAL_MAX_BYTES: u64 =
    EGRESS_JOURNAL_MAX_BYTES + RUN_LOG_MAX_BYTES + JOURNAL_RESERVE_BYTES;

/// Refusals of one code to one host recorded one by one in a run's egress
/// log; past it (or past [`REFUSALS_RECORDED_MAX`] in all) they are only
/// counted, per code and host ([`RunEvent::Refusals`]).
pub const REFUSAL_SAMPLES_PER_KEY: u64 = 20;

/// Refusals recorded one by one in a run, whatever their code and host.
pub const REFUSALS_RECORDED_MAX: u64 = 200;

/// Distinct (code, host) counts a run keeps; refusals past it are counted
/// under their code and the host `*`.
pub const REFUSAL_KEYS_MAX: usize = 256;

/// Longest URL an egress record keeps; a longer one is cut, and ends with
/// [`TRUNCATED_MARK`].
pub const LOGGED_URL_MAX_BYTES: usize = 1024;

/// The mark at the end of a cut URL or host in an egress record.
pub const TRUNCATED_MARK: &str = "…[truncated]";

/// `s` cut to at most `max` bytes (on a character boundary) with
/// [`TRUNCATED_MARK`] at its end when it was longer.
pub fn truncate_logged(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut cut = max.saturating_sub(TRUNCATED_MARK.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s.push_str(TRUNCATED_MARK);
    s
}

/// A credential's fields: names in the clear, values secret (absent from
/// every `Debug`, zeroed when dropped). Read a value with
/// [`secrecy::ExposeSecret`] where it is used.
pub type CredentialFields = BTreeMap<String, SecretString>;

/// A connection's credential, decrypted by the platform for this request
/// only. Field values are secrets: the sidecar keeps them in memory for the
/// one outbound call and never logs them.
#[derive(Deserialize, Serialize)]
pub struct CredentialResponse {
    pub integration: String,
    pub connection: String,
    pub auth_type: crate::connection_types::AuthType,
    /// Written out by the platform, the one side that sends them.
    #[serde(serialize_with = "expose_fields")]
    pub fields: CredentialFields,
}

fn expose_fields<S: serde::Serializer>(fields: &CredentialFields, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(fields.len()))?;
    for (name, value) in fields {
        map.serialize_entry(name, value.expose_secret())?;
    }
    map.end()
}

impl std::fmt::Debug for CredentialResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialResponse")
            .field("integration", &self.integration)
            .field("connection", &self.connection)
            .field("auth_type", &self.auth_type)
            .field("fields", &self.fields.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct HistoryEntry {
    pub run_id: String,
    pub status: String,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct HistoryResponse {
    pub runs: Vec<HistoryEntry>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct MemoryEntry {
    pub id: i64,
    pub content: String,
    pub created_at: i64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct MemoriesResponse {
    pub memories: Vec<MemoryEntry>,
}

/// What a run reports. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunEvent {
    /// The runtime is alive.
    Heartbeat { at: i64 },
    /// A line the agent wrote (`stream` is `stdout` or `stderr`).
    Log {
        at: i64,
        stream: String,
        line: String,
    },
    /// The agent finished: its exit code and optional result document.
    Result {
        at: i64,
        exit_code: i32,
        #[serde(default)]
        result: Option<serde_json::Value>,
        #[serde(default)]
        checkpoint: Option<serde_json::Value>,
    },
    /// One model call, metered by the sidecar.
    Cost(CostRecord),
    /// One outbound decision (allowed or refused).
    Egress(EgressRecord),
    /// Log lines not kept: shed by the runtime (its queue was full) or past
    /// the run's log cap ([`RUN_LOG_MAX_BYTES`]). Counted, never silent.
    Shed { at: i64, lines: u64, bytes: u64 },
    /// Refusals of one code to one host counted, not recorded one by one
    /// (past [`REFUSAL_SAMPLES_PER_KEY`] or [`REFUSALS_RECORDED_MAX`]).
    Refusals {
        at: i64,
        code: RefusalCode,
        host: String,
        count: u64,
    },
    /// A tool an integration's tools allowlist hides, left out of a
    /// `tools/list` (`called: false`) or refused when called by name
    /// (`called: true`): the sidecar's decision, kept (never shed) for the
    /// run's audit, the first of each `(integration, tool, called)` only.
    ToolExcluded {
        at: i64,
        integration: String,
        tool: String,
        called: bool,
    },
    /// A request an `ask` rule held, waiting for a person's answer: what
    /// it would do, never a credential, a header, a query or a body.
    /// Written by the platform only ([`RunEvent::is_platforms`]).
    #[serde(rename = "approval.pending")]
    ApprovalPending {
        at: i64,
        #[serde(flatten)]
        approval: crate::approval::Pending,
    },
    /// How a held request was settled, and who answered it. Written by
    /// the platform only.
    #[serde(rename = "approval.settled")]
    ApprovalSettled {
        at: i64,
        id: String,
        rule: String,
        outcome: crate::approval::Outcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answered_by: Option<String>,
    },
}

impl RunEvent {
    /// The kind an event is stored under (`run_events.kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            RunEvent::Heartbeat { .. } => "heartbeat",
            RunEvent::Log { .. } => "log",
            RunEvent::Result { .. } => "result",
            RunEvent::Cost(_) => "cost",
            RunEvent::Egress(_) => "egress",
            RunEvent::Shed { .. } => "shed",
            RunEvent::Refusals { .. } => "refusals",
            RunEvent::ToolExcluded { .. } => "tool_excluded",
            RunEvent::ApprovalPending { .. } => "approval.pending",
            RunEvent::ApprovalSettled { .. } => "approval.settled",
        }
    }

    /// An event only the platform writes (a person's approval): refused
    /// from a sidecar's report or journal, so no run can forge one.
    pub fn is_platforms(&self) -> bool {
        matches!(
            self,
            RunEvent::ApprovalPending { .. } | RunEvent::ApprovalSettled { .. }
        )
    }

    /// When the event happened (Unix ms).
    pub fn at(&self) -> i64 {
        match self {
            RunEvent::Heartbeat { at }
            | RunEvent::Log { at, .. }
            | RunEvent::Result { at, .. }
            | RunEvent::Shed { at, .. }
            | RunEvent::Refusals { at, .. }
            | RunEvent::ToolExcluded { at, .. }
            | RunEvent::ApprovalPending { at, .. }
            | RunEvent::ApprovalSettled { at, .. } => *at,
            RunEvent::Cost(c) => c.at,
            RunEvent::Egress(r) => r.at,
        }
    }
}

/// One line of a run's journal: an egress record (written as it is), or
/// `{"event": …}` for the other events the journal carries.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct JournalEvent {
    pub event: RunEvent,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct CostRecord {
    pub at: i64,
    pub provider: String,
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Millionths of a US dollar, when the price of the model is known.
    #[serde(default)]
    pub cost_microusd: Option<u64>,
    /// The provider's usage never arrived (the answer was cut, failed, or
    /// carried none): the tokens are what the relay saw, possibly none. Or
    /// it was past [`MAX_CALL_TOKENS`] / [`MAX_CALL_COST_MICROUSD`]: then
    /// the numbers are 0.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unmetered: bool,
    /// Why the call is unmetered, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmetered_reason: Option<String>,
}

/// The most tokens one model call may report, in or out, and be metered:
/// far past any model's context, and small enough that no sum of a run's
/// calls reaches `i64::MAX` in the store (2^31 calls at the bound).
pub const MAX_CALL_TOKENS: u64 = 1 << 32;
/// The most one model call may cost and be metered: a million US dollars.
pub const MAX_CALL_COST_MICROUSD: u64 = 1_000_000_000_000;

impl CostRecord {
    /// Why this record's numbers are not believable (a provider reporting
    /// `prompt_tokens = 2^64-1`), or `None`. One decision, made by the relay
    /// when it writes the record and by the platform when it stores it.
    pub fn implausible(&self) -> Option<String> {
        let past = |what: &str, n: u64, bound: u64| {
            (n > bound)
                .then(|| format!("the provider reported {n} {what}, past the bound of {bound}"))
        };
        past("input tokens", self.input_tokens, MAX_CALL_TOKENS)
            .or_else(|| past("output tokens", self.output_tokens, MAX_CALL_TOKENS))
            .or_else(|| {
                past(
                    "µUSD of cost",
                    self.cost_microusd.unwrap_or(0),
                    MAX_CALL_COST_MICROUSD,
                )
            })
    }

    /// The record with implausible numbers made unmetered: tokens and cost
    /// 0, and the reason. A believable record is returned as it is.
    #[must_use]
    pub fn bounded(mut self) -> Self {
        if let Some(why) = self.implausible() {
            self.input_tokens = 0;
            self.output_tokens = 0;
            self.cost_microusd = self.cost_microusd.map(|_| 0);
            self.unmetered = true;
            self.unmetered_reason = Some(why);
        }
        self
    }
}

/// One outbound request in the run's egress log (docs/security.md, "What the egress log records").
///
/// The sidecar sends a request's record twice: when the guard has allowed it
/// and before a byte of it leaves (`outcome: incomplete`, appended to the
/// run's egress journal — or, for a sidecar started without one,
/// acknowledged by the platform — before the request is sent), then when
/// it is over, with the same `seq` and its final outcome. The journal holds
/// the same records, one JSON object per line. A record the platform holds as
/// `incomplete` after the run is a request that left and whose end nobody
/// saw (the sidecar was killed). A refusal is one record, sent once.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct EgressRecord {
    pub at: i64,
    pub source: EgressSource,
    /// The path that carried it to the guard. Absent from older sidecars:
    /// [`EgressRecord::plane`] reads the one its source implies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plane: Option<EgressPlane>,
    #[serde(default)]
    pub integration: Option<String>,
    pub method: String,
    /// Without userinfo, query or fragment, credentials redacted.
    pub url: String,
    pub host: String,
    pub decision: EgressDecision,
    /// The guard's refusal code (docs/egress.md), only when refused.
    #[serde(default)]
    pub code: Option<RefusalCode>,
    /// Upstream HTTP status, when there was one.
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub bytes_out: u64,
    #[serde(default)]
    pub bytes_in: u64,
    #[serde(default)]
    pub duration_ms: Option<u64>,
    /// The record's number, unique within the run (the sidecar's start in
    /// Unix ms × 10⁶, then counting): a later record with the same `seq`
    /// completes an earlier one. (Absent from older sidecars.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// What became of an allowed request (absent when refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<EgressOutcome>,
    /// Model calls only: whether the provider's usage was metered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metering: Option<Metering>,
    /// The sidecar's own steps of this request, when the run is traced
    /// (`SidecarConfig::trace_steps`): the platform makes them the
    /// request's child spans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Steps>,
    /// A `rule_refused` refusal only: the L7 rule and what it lacked
    /// (credential values in a path redacted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<airlock_egress::RuleRefusal>,
}

/// One step the sidecar took for a request: when it started (Unix
/// microseconds) and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub struct Step {
    pub at_us: i64,
    pub dur_us: u64,
}

/// The sidecar's steps of one request (each when it took it): the guard's
/// decision, the credential's fetch, the exchange with the upstream, and
/// the redaction of its answer. Fixed-size: keeping them allocates nothing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub struct Steps {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<Step>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<Step>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Step>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redaction: Option<Step>,
}

impl Steps {
    /// Each step taken, with its name (the span it becomes).
    pub fn each(&self) -> impl Iterator<Item = (&'static str, Step)> {
        [
            ("guard", self.guard),
            ("credential", self.credential),
            ("upstream", self.upstream),
            ("redaction", self.redaction),
        ]
        .into_iter()
        .filter_map(|(n, s)| s.map(|s| (n, s)))
    }
}

/// Awaits `f`, timing it as a [`Step`] when `on` (when off, no clock is read).
pub async fn timed<T>(on: bool, f: impl std::future::Future<Output = T>) -> (T, Option<Step>) {
    if !on {
        return (f.await, None);
    }
    let at_us = crate::clock::now_us();
    let started = std::time::Instant::now();
    let out = f.await;
    let dur_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    (out, Some(Step { at_us, dur_us }))
}

impl EgressRecord {
    /// The path that carried the request ([`EgressRecord::plane`]'s, or,
    /// from a sidecar that did not say, the one its source implies).
    pub fn plane(&self) -> EgressPlane {
        self.plane.unwrap_or(EgressPlane::implied_by(self.source))
    }

    /// Appends the record as serde_json writes it (the same bytes:
    /// `egress_records_are_written_as_serde_writes_them` checks every
    /// optional field both ways), with the keys written as they are: a
    /// record is journalled before its request leaves, on the request's
    /// path.
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        fn value<T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) -> serde_json::Result<()> {
            serde_json::to_writer(&mut *out, v)
        }
        out.extend_from_slice(br#"{"at":"#);
        value(out, &self.at)?;
        out.extend_from_slice(br#","source":"#);
        value(out, &self.source)?;
        if let Some(plane) = self.plane {
            out.extend_from_slice(br#","plane":"#);
            value(out, plane.as_str())?;
        }
        out.extend_from_slice(br#","integration":"#);
        value(out, &self.integration)?;
        out.extend_from_slice(br#","method":"#);
        value(out, &self.method)?;
        out.extend_from_slice(br#","url":"#);
        value(out, &self.url)?;
        out.extend_from_slice(br#","host":"#);
        value(out, &self.host)?;
        out.extend_from_slice(br#","decision":"#);
        value(out, &self.decision)?;
        out.extend_from_slice(br#","code":"#);
        value(out, &self.code)?;
        out.extend_from_slice(br#","status":"#);
        value(out, &self.status)?;
        out.extend_from_slice(br#","bytes_out":"#);
        value(out, &self.bytes_out)?;
        out.extend_from_slice(br#","bytes_in":"#);
        value(out, &self.bytes_in)?;
        out.extend_from_slice(br#","duration_ms":"#);
        value(out, &self.duration_ms)?;
        if let Some(seq) = self.seq {
            out.extend_from_slice(br#","seq":"#);
            value(out, &seq)?;
        }
        if let Some(outcome) = self.outcome {
            out.extend_from_slice(br#","outcome":"#);
            value(out, outcome.as_str())?;
        }
        if let Some(metering) = self.metering {
            out.extend_from_slice(br#","metering":"#);
            value(out, metering.as_str())?;
        }
        if let Some(steps) = &self.steps {
            out.extend_from_slice(br#","steps":"#);
            value(out, steps)?;
        }
        if let Some(rule) = &self.rule {
            out.extend_from_slice(br#","rule":"#);
            value(out, rule)?;
        }
        out.push(b'}');
        Ok(())
    }
}

/// Where an outbound request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressSource {
    ApiCall,
    Llm,
    Proxy,
    /// A remote MCP server's HTTP exchange (the sidecar as its client).
    Mcp,
    /// A local MCP runner's request through its own proxy listener (the
    /// record's integration is the runner's).
    Runner,
}

/// Which path carried an outbound request to the guard: the egress log's
/// one meaning whichever way a request came (docs/egress.md, "The
/// transparent plane"). Beside [`EgressSource`], which says what asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressPlane {
    /// The sidecar's own API: the sidecar made the request itself
    /// (`api_call`, `/llm`, a remote MCP server's exchange).
    Api,
    /// The client's own connection through the forward proxy its proxy
    /// variables name (the agent's, or a local runner's listener).
    Proxy,
    /// The client's own connection, carried by the sandbox's transparent
    /// plane (a tool that ignores proxy variables connected to the
    /// synthetic address of a name).
    Transparent,
}

/// The guard's decision on an outbound request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressDecision {
    Allowed,
    /// Refused, with its [`RefusalCode`].
    Refused,
}

/// The guard's refusal code (docs/egress.md): the guard's own type, the
/// one spelling of a refusal on the wire, in the journal and in the store.
pub use airlock_egress::EgressCode as RefusalCode;

/// A text that is none of an enum's spellings (a stored column, a query).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not an egress {what}")]
pub struct UnknownSpelling {
    pub what: &'static str,
    pub value: String,
}

/// `as_str`, `ALL` and the `FromStr` that is its inverse, for a wire enum
/// whose serde spelling is its `as_str` (a test checks both agree).
macro_rules! spelled {
    ($ty:ident, $what:literal, { $($v:ident => $s:literal),+ $(,)? }) => {
        impl $ty {
            pub const ALL: [$ty; [$($s),+].len()] = [$($ty::$v),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$v => $s),+
                }
            }
        }

        impl std::str::FromStr for $ty {
            type Err = UnknownSpelling;
            fn from_str(s: &str) -> Result<$ty, UnknownSpelling> {
                $ty::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| UnknownSpelling { what: $what, value: s.to_owned() })
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

spelled!(EgressSource, "source", {
    ApiCall => "api_call",
    Llm => "llm",
    Proxy => "proxy",
    Mcp => "mcp",
    Runner => "runner",
});

spelled!(EgressPlane, "plane", {
    Api => "api",
    Proxy => "proxy",
    Transparent => "transparent",
});

impl EgressPlane {
    /// The plane of a record that does not name one (a sidecar older than
    /// the transparent plane): the proxy's for the proxy's sources, the
    /// sidecar's API for the rest.
    pub fn implied_by(source: EgressSource) -> EgressPlane {
        match source {
            EgressSource::Proxy | EgressSource::Runner => EgressPlane::Proxy,
            EgressSource::ApiCall | EgressSource::Llm | EgressSource::Mcp => EgressPlane::Api,
        }
    }
}

spelled!(EgressDecision, "decision", {
    Allowed => "allowed",
    Refused => "refused",
});

/// What became of a request the guard allowed. Separate from the decision:
/// a connection refused by the upstream is `allowed` + `upstream_failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressOutcome {
    /// Recorded before it was sent; not (yet) completed.
    Incomplete,
    /// The upstream answered (see `status`) and the exchange ended.
    Completed,
    /// The upstream could not be reached, or failed or timed out mid-answer.
    UpstreamFailed,
    /// The sidecar stopped waiting: the agent went away, or the run ended
    /// while the request was in flight.
    Aborted,
    /// The upstream answered but the answer was not passed on (an encoded
    /// body that could not be checked for the credential).
    Withheld,
    /// Recorded, then not sent after all: the sidecar could not finish the
    /// request (no model key, an argument the credential could not fill).
    NotSent,
}

spelled!(EgressOutcome, "outcome", {
    Incomplete => "incomplete",
    Completed => "completed",
    UpstreamFailed => "upstream_failed",
    Aborted => "aborted",
    Withheld => "withheld",
    NotSent => "not_sent",
});

/// Whether a model call's usage was metered from the provider's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metering {
    Metered,
    /// The provider's usage never arrived; the cost event holds what was seen.
    Unmetered,
}

spelled!(Metering, "metering", {
    Metered => "metered",
    Unmetered => "unmetered",
});

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct EventBatch {
    pub events: Vec<RunEvent>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Accepted {
    pub accepted: usize,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct StoredResultRef {
    pub id: String,
    /// `airlock://result/<runId>/<id>`
    pub uri: String,
    pub bytes: u64,
}

/// What became of an artifact handed to `/internal/v1/artifacts`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct ArtifactAnswer {
    /// `None`: stored with the run; else recorded refused, for this reason.
    pub refused: Option<crate::files::ArtifactRefusal>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ErrorBody {
    pub error: String,
    #[serde(default)]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`EgressRecord::write_json`] against serde's own serialisation, byte
    /// for byte: every optional field absent and present, every outcome and
    /// metering, strings that need escaping, extreme numbers.
    #[test]
    fn egress_records_are_written_as_serde_writes_them() {
        let texts = [
            "",
            "api_call",
            "http://h.test/a b?\"q\"\\\u{0}\u{1f}\u{7f} é 中 🦀 \u{2028}",
        ];
        let outcomes = std::iter::once(None).chain(EgressOutcome::ALL.into_iter().map(Some));
        let mut checked = 0;
        for (i, outcome) in outcomes.enumerate() {
            for metering in [None, Some(Metering::Metered), Some(Metering::Unmetered)] {
                for bits in 0u8..32 {
                    let on = |b: u8| bits & (1 << b) != 0;
                    let text = texts[(i + usize::from(bits)) % texts.len()];
                    let rec = EgressRecord {
                        at: if on(0) { i64::MIN } else { 1_764_000_000_000 },
                        source: EgressSource::ALL
                            [(i + usize::from(bits)) % EgressSource::ALL.len()],
                        plane: on(3).then_some(
                            EgressPlane::ALL[(i + usize::from(bits)) % EgressPlane::ALL.len()],
                        ),
                        integration: on(1).then(|| text.to_owned()),
                        method: "GET".into(),
                        url: text.into(),
                        host: text.into(),
                        decision: EgressDecision::ALL[usize::from(bits) % 2],
                        code: on(2).then_some(RefusalCode::BlockedAddress),
                        status: on(3).then_some(599),
                        bytes_out: u64::MAX,
                        bytes_in: u64::from(bits),
                        duration_ms: on(4).then_some(0),
                        seq: on(0).then_some(1_764_000_000_000_000_007),
                        outcome,
                        metering,
                        steps: on(1).then_some(Steps {
                            guard: Some(Step {
                                at_us: i64::MIN,
                                dur_us: u64::MAX,
                            }),
                            credential: None,
                            upstream: on(2).then_some(Step {
                                at_us: 1,
                                dur_us: 2,
                            }),
                            redaction: None,
                        }),
                        rule: on(2).then(|| airlock_egress::RuleRefusal {
                            rule: text.into(),
                            missing: airlock_egress::Missing::Path { path: text.into() },
                        }),
                    };
                    let mut ours = Vec::new();
                    rec.write_json(&mut ours).unwrap();
                    let serde = serde_json::to_vec(&rec).unwrap();
                    assert_eq!(
                        String::from_utf8_lossy(&ours),
                        String::from_utf8_lossy(&serde)
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 7 * 3 * 32);
    }

    /// Each wire enum is written as its `as_str`, and read back from it.
    #[test]
    fn every_spelling_is_its_serde_spelling() {
        fn check<T>(all: &[T], as_str: fn(T) -> &'static str)
        where
            T: Copy + PartialEq + std::fmt::Debug + Serialize + std::str::FromStr,
            T: for<'de> Deserialize<'de>,
            <T as std::str::FromStr>::Err: std::fmt::Debug,
        {
            for &v in all {
                let text = serde_json::to_string(&v).unwrap();
                assert_eq!(text, format!("\"{}\"", as_str(v)));
                assert_eq!(serde_json::from_str::<T>(&text).unwrap(), v);
                assert_eq!(as_str(v).parse::<T>().unwrap(), v);
            }
            assert!("nope".parse::<T>().is_err());
        }
        check(&EgressSource::ALL, EgressSource::as_str);
        check(&EgressPlane::ALL, EgressPlane::as_str);
        check(&EgressDecision::ALL, EgressDecision::as_str);
        check(&RefusalCode::ALL, RefusalCode::as_str);
        check(&EgressOutcome::ALL, EgressOutcome::as_str);
        check(&Metering::ALL, Metering::as_str);
    }
}

//! `/v1`'s bodies. Times are Unix milliseconds; every id is scoped to the
//! caller's organization.
//!
//! Contracts of the wire, kept by these types:
//! - Request bodies refuse unknown fields (`deny_unknown_fields`: a typo is
//!   a 422, never ignored). Answers accept them (a newer server may add
//!   fields; an older client reads what it knows).
//! - An answer's optional field is `null` when it has no value, except the
//!   few marked "omitted" (`skip_serializing_if`), which are absent.
//! - Each answer's fields are declared in alphabetical order: the bytes on
//!   the wire are those of a sorted JSON map, as they always were.
//! - An enumerated field (a run's status, a connection's type, a webhook's
//!   events) is its stored spelling; its schema lists the values from the
//!   one place that defines them (`airlock_store`).

use std::collections::BTreeMap;

use airlock_store::{
    AuthType, EgressDecision, EgressMetering, EgressOutcome, EgressPlane, EgressSource,
    RefusalCode, RunStatus,
};
use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{Array, Object, ObjectBuilder, Schema, Type};
use utoipa::{IntoParams, ToSchema};

/// The events a webhook may subscribe to (`run.` and the state a run
/// reached, [`airlock_store::run_event`] names a run's;
/// [`airlock_store::THRESHOLD_EVENT`], a budget's threshold reached; and
/// a held request's approval, pending and settled).
pub const WEBHOOK_EVENTS: &[&str] = &[
    "run.started",
    "run.succeeded",
    "run.failed",
    "run.cancelled",
    "run.timed_out",
    airlock_store::THRESHOLD_EVENT,
    airlock_store::APPROVAL_PENDING_EVENT,
    airlock_store::APPROVAL_SETTLED_EVENT,
];

/// The states of a webhook delivery.
pub const DELIVERY_STATES: &[&str] = &["pending", "delivered", "failed"];

fn one_of(values: &[&str], description: &str) -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values.iter().copied()))
        .description(Some(description))
        .build()
}

fn run_status() -> Object {
    one_of(
        &RunStatus::ALL.map(RunStatus::as_str),
        "queued and running, then the state it ended in",
    )
}

fn auth_type() -> Object {
    one_of(
        &AuthType::ALL.map(AuthType::as_str),
        "how the credential is presented upstream",
    )
}

fn egress_plane() -> Object {
    one_of(
        &EgressPlane::ALL.map(EgressPlane::as_str),
        "the path that carried the request to the guard",
    )
}

fn webhook_events() -> RefOr<Schema> {
    RefOr::T(Schema::Array(Array::new(RefOr::T(Schema::Object(one_of(
        WEBHOOK_EVENTS,
        "a run event, budget.threshold, approval.pending or approval.settled",
    ))))))
}

fn delivery_state() -> Object {
    one_of(DELIVERY_STATES, "failed: given up after the last attempt")
}

/// A refusal's spelling, or null (stored).
fn artifact_refusal() -> Schema {
    let reasons = one_of(
        &airlock_platform_api::files::ArtifactRefusal::ALL.map(|r| r.as_str()),
        "why it was not stored",
    );
    Schema::OneOf(
        utoipa::openapi::schema::OneOfBuilder::new()
            .item(reasons)
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .description(Some("why it was not stored; null: stored, downloadable"))
            .build(),
    )
}

fn memory_mb() -> Object {
    #[allow(clippy::cast_precision_loss)] // a small constant
    let min = airlock_platform::manifest::MIN_MEMORY_MB as f64;
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(min))
        .description(Some("MiB of memory, as the manifest's agent.memory_mb"))
        .build()
}

fn cpus() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Number)
        .exclusive_minimum(Some(0.0))
        .maximum(Some(airlock_platform::manifest::MAX_CPUS))
        .description(Some("CPUs, as the manifest's agent.cpus"))
        .build()
}

// ---------------------------------------------------------------- errors

/// Every failure: its HTTP status, and this body. A 500 says only that the
/// platform failed (the cause is in its log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Error {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable: `bad_request`, `unauthorized`, `not_found`, `conflict`,
    /// `invalid`, `too_large`, `rate_limited`, `quota_exceeded`,
    /// `storage_full`, `unavailable`, `internal`, …
    pub code: String,
    /// For a person; may change.
    pub message: String,
}

impl Error {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Error {
            error: ErrorDetail {
                code: code.into(),
                message: message.into(),
            },
        }
    }
}

// ------------------------------------------------------ health, readiness

/// `/healthz`: the process answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: String,
}

impl Health {
    pub fn ok() -> Self {
        Health {
            status: "ok".to_owned(),
        }
    }
}

/// `/.well-known/openid-configuration`: the workload identity issuer's
/// OpenID Connect discovery document (what a cloud's STS reads to trust
/// the runs' identity tokens).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OpenIdConfiguration {
    /// The issuer URL: every token's `iss`.
    pub issuer: String,
    /// Where the issuer's public keys are (`/.well-known/jwks.json`).
    pub jwks_uri: String,
    /// `["id_token"]`.
    pub response_types_supported: Vec<String>,
    /// `["public"]`.
    pub subject_types_supported: Vec<String>,
    /// `["ES256"]`.
    pub id_token_signing_alg_values_supported: Vec<String>,
    /// The claims a token carries.
    pub claims_supported: Vec<String>,
}

/// `/.well-known/jwks.json`: the issuer's public keys (RFC 7517), the
/// signing key first; keys still published after a rotation verify the
/// tokens they signed until those expire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Jwks {
    pub keys: Vec<Jwk>,
}

/// One public key of the issuer: an EC P-256 key for ES256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Jwk {
    /// `EC`.
    pub kty: String,
    /// `P-256`.
    pub crv: String,
    /// The point's x coordinate, base64url.
    pub x: String,
    /// The point's y coordinate, base64url.
    pub y: String,
    /// The key's id: its RFC 7638 thumbprint, a token's header `kid`.
    pub kid: String,
    /// `sig`.
    #[serde(rename = "use")]
    pub key_use: String,
    /// `ES256`.
    pub alg: String,
}

/// `/readyz`: the store answers and this replica takes work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Ready {
    /// The sandbox backend its runs use.
    pub backend: String,
    /// This replica's id.
    pub replica: String,
    /// Runs running on this replica.
    pub running: usize,
    /// `ready`.
    pub status: String,
}

// ------------------------------------------------ organization, API keys

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Organization {
    pub created_at: i64,
    pub id: String,
    /// Its own ceiling on running runs (`null`: only the platform's).
    pub max_concurrent_runs: Option<i64>,
    pub name: String,
}

impl From<&airlock_store::Organization> for Organization {
    fn from(o: &airlock_store::Organization) -> Self {
        Organization {
            created_at: o.created_at,
            id: o.id.clone(),
            max_concurrent_runs: o.max_concurrent_runs,
            name: o.name.clone(),
        }
    }
}

/// A budget period's limits on the organization's model calls; `null`:
/// that measure is not limited. Every limit is at least 1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetLimits {
    /// Millionths of a US dollar, at each model's prices.
    pub cost_microusd: Option<i64>,
    /// Model requests.
    pub requests: Option<i64>,
    /// Tokens, input and output together.
    pub tokens: Option<i64>,
}

impl From<airlock_store::BudgetLimits> for BudgetLimits {
    fn from(l: airlock_store::BudgetLimits) -> Self {
        BudgetLimits {
            cost_microusd: l.cost_microusd,
            requests: l.requests,
            tokens: l.tokens,
        }
    }
}

impl From<BudgetLimits> for airlock_store::BudgetLimits {
    fn from(l: BudgetLimits) -> Self {
        airlock_store::BudgetLimits {
            tokens: l.tokens,
            cost_microusd: l.cost_microusd,
            requests: l.requests,
        }
    }
}

/// `PUT /v1/org/budget`: the organization's model budgets per UTC day and
/// per UTC month (`{}`: no limit in that period), and the thresholds at
/// which its webhooks hear of each budget's spend.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetOrgBudget {
    pub day: BudgetLimits,
    pub month: BudgetLimits,
    /// Fractions of each budget (above 0, at most 1, in thousandths, at
    /// most 10) at which a `budget.threshold` webhook event is sent, for
    /// the organization's budgets and its runs' own; `[]`: none; omitted or
    /// `null`: the default, `[0.5, 0.8, 1.0]`.
    #[serde(default)]
    pub thresholds: Option<Vec<f64>>,
}

/// `GET /v1/org/proxy`: the upstream proxy the organization's runs go
/// through, by name (never a URL: a proxy's URL may hold credentials).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OrgProxy {
    /// The operator's proxies (`SYSTEM_PROXIES`) the organization may choose.
    pub offered: Vec<String>,
    /// The name it chose (`null`: none; its runs use the operator's
    /// default proxy, `PROXY_URL`, or go direct).
    pub proxy: Option<String>,
}

/// `PUT /v1/org/proxy`: the operator proxy the organization's runs go
/// through, by one of the names offered (`null`: none); a name not offered
/// is refused (422). Runs started from then use it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetOrgProxy {
    pub proxy: Option<String>,
}

/// What a period has spent: settled calls at their usage, calls in flight
/// (or whose usage never came) at their reservation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PeriodSpend {
    pub cost_microusd: i64,
    /// `day:YYYY-MM-DD` or `month:YYYY-MM` (UTC).
    pub period: String,
    pub requests: i64,
    /// Of `cost_microusd`, what is reserved by calls not yet settled.
    pub reserved_cost_microusd: i64,
    /// Of `tokens`, what is reserved by calls not yet settled.
    pub reserved_tokens: i64,
    pub tokens: i64,
}

impl PeriodSpend {
    pub fn new(period: &str, s: &airlock_store::PeriodSpend) -> Self {
        PeriodSpend {
            cost_microusd: s.cost_microusd,
            period: period.to_owned(),
            requests: s.requests,
            reserved_cost_microusd: s.reserved_cost_microusd,
            reserved_tokens: s.reserved_tokens,
            tokens: s.tokens,
        }
    }
}

/// The organization's model budgets and what today and this month spent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OrgBudget {
    pub day: BudgetLimits,
    pub day_spend: PeriodSpend,
    pub month: BudgetLimits,
    pub month_spend: PeriodSpend,
    /// The fractions of each budget at which a `budget.threshold` webhook
    /// event is sent, ascending.
    #[serde(default)]
    pub thresholds: Vec<f64>,
}

/// A `budget.threshold` event's budget: which one, the threshold its spend
/// reached, and the spend and limit then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetThreshold {
    /// `run` (the run's own), `org_day` or `org_month` (the organization's).
    #[schema(schema_with = budget_kind)]
    pub budget: String,
    pub crossed_at: i64,
    /// Its limit of `measure`.
    pub limit: i64,
    /// `tokens`, `cost_microusd` or `requests`.
    #[schema(schema_with = budget_measure)]
    pub measure: String,
    pub org_id: String,
    /// The run's id (a run budget), or `day:YYYY-MM-DD` or `month:YYYY-MM`
    /// (UTC).
    pub period: String,
    /// The run whose model call reached it.
    pub run_id: String,
    /// Metered spend of `measure` when it was reached (an organization's:
    /// settled calls, reservations outstanding left out).
    pub spent: i64,
    /// The fraction of the limit reached.
    pub threshold: f64,
}

fn budget_kind() -> Object {
    one_of(&["run", "org_day", "org_month"], "which budget")
}

fn budget_measure() -> Object {
    one_of(&["tokens", "cost_microusd", "requests"], "which measure")
}

impl From<&airlock_store::Crossing> for BudgetThreshold {
    fn from(c: &airlock_store::Crossing) -> Self {
        BudgetThreshold {
            budget: c.budget.clone(),
            crossed_at: c.crossed_at,
            limit: c.limit,
            measure: c.measure.clone(),
            org_id: c.org_id.clone(),
            period: c.period.clone(),
            run_id: c.run_id.clone(),
            spent: c.spent,
            threshold: airlock_store::Thresholds::fraction(c.threshold),
        }
    }
}

/// An API key's record (never the key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiKey {
    pub created_at: i64,
    pub id: String,
    pub name: String,
    pub revoked_at: Option<i64>,
}

impl From<&airlock_store::ApiKeyRow> for ApiKey {
    fn from(k: &airlock_store::ApiKeyRow) -> Self {
        ApiKey {
            created_at: k.created_at,
            id: k.id.clone(),
            name: k.name.clone(),
            revoked_at: k.revoked_at,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyList {
    pub api_keys: Vec<ApiKey>,
}

/// `POST /v1/api-keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewApiKey {
    /// 1–64 of `A-Z a-z 0-9 _ - .`, starting with a letter or digit.
    pub name: String,
}

/// A new key's record, with the key: shown in this answer only (only its
/// hash is kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NewApiKeyAnswer {
    pub created_at: i64,
    pub id: String,
    /// `alk_…`: shown in this answer only.
    pub key: String,
    pub name: String,
    pub revoked_at: Option<i64>,
}

impl NewApiKeyAnswer {
    pub fn new(k: ApiKey, key: String) -> Self {
        NewApiKeyAnswer {
            created_at: k.created_at,
            id: k.id,
            key,
            name: k.name,
            revoked_at: k.revoked_at,
        }
    }
}

// ---------------------------------------------------------------- agents

/// `POST /v1/agents`: an agent's manifest and the files of its directory.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterAgent {
    /// Relative path → UTF-8 content.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// `airlock.toml`'s text.
    pub manifest: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Agent {
    pub created_at: i64,
    /// The paths of its files.
    pub files: Vec<String>,
    /// The manifest's text: `GET /v1/agents/{name}` only (omitted elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    pub name: String,
    pub updated_at: i64,
}

impl Agent {
    /// A registered agent, with its manifest's text or without.
    pub fn of(a: &airlock_store::AgentRow, with_manifest: bool) -> Self {
        let files: BTreeMap<String, String> = serde_json::from_str(&a.files).unwrap_or_default();
        Agent {
            created_at: a.created_at,
            files: files.into_keys().collect(),
            manifest: with_manifest.then(|| a.manifest.clone()),
            name: a.name.clone(),
            updated_at: a.updated_at,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AgentList {
    pub agents: Vec<Agent>,
}

// ------------------------------------------------------------------ runs

/// `POST /v1/runs`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewRun {
    /// A registered agent's name.
    pub agent: String,
    /// Limits tighter (or other) than the manifest's, checked as a manifest's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RunLimits>,
    /// The run's input files: relative path → UTF-8 content, placed in the
    /// agent's workspace (`$AIRLOCK_WORKSPACE/<path>`) before it starts.
    /// Paths are checked as a bundle's; at most 64 files, 1 MiB each, 4 MiB
    /// in all.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    /// The run's prompt (at most 256 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

/// The limits a run is queued with (each replaces the manifest's); kept
/// with the queued run in this form.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = cpus)]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = memory_mb)]
    pub memory_mb: Option<u64>,
    /// Seconds, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub timeout_seconds: Option<u64>,
}

/// Tokens and cost metered by a run's model relay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Cost {
    /// Millionths of a US dollar.
    pub cost_microusd: i64,
    /// `cost_microusd` in dollars.
    pub cost_usd: f64,
    pub tokens_in: i64,
    pub tokens_out: i64,
}

impl From<&airlock_store::Run> for Cost {
    fn from(r: &airlock_store::Run) -> Self {
        Cost {
            cost_microusd: r.cost_microusd,
            #[allow(clippy::cast_precision_loss)] // dollars for reading; the exact figure is beside it
            cost_usd: r.cost_microusd as f64 / 1e6,
            tokens_in: r.tokens_in,
            tokens_out: r.tokens_out,
        }
    }
}

/// A run's model budget: the limits it is held to (its manifest's
/// `[budget]` within the operator's ceilings; `null`: not limited) and what
/// it spent against them. Its organization's budgets are `GET /v1/org/budget`'s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunBudget {
    pub limits: BudgetLimits,
    pub spend: RunSpend,
}

/// What a run's model calls spent: tokens input and output together,
/// cost at the model's prices, metered requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunSpend {
    /// Millionths of a US dollar.
    pub cost_microusd: i64,
    pub requests: i64,
    pub tokens: i64,
}

impl From<&airlock_store::Run> for RunBudget {
    fn from(r: &airlock_store::Run) -> Self {
        RunBudget {
            limits: r.budget.into(),
            spend: RunSpend {
                cost_microusd: r.cost_microusd,
                requests: r.requests,
                tokens: r.tokens_in.saturating_add(r.tokens_out),
            },
        }
    }
}

/// A run's metered usage: its totals, and each model call with the key
/// that paid for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunCost {
    /// Each metered model call, in the order recorded (at most the first
    /// 10,000).
    pub calls: Vec<CostCall>,
    /// The run's totals, as [`Cost`] (its fields, flat: an answer's fields
    /// are its schema's own properties).
    pub cost_microusd: i64,
    pub cost_usd: f64,
    pub tokens_in: i64,
    pub tokens_out: i64,
}

/// One model call of a run, as the platform recorded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CostCall {
    pub at: i64,
    /// Millionths of a US dollar; `null` when the model's price is unknown.
    pub cost_microusd: Option<i64>,
    pub model: String,
    /// Which key paid, as the platform handed it (never the key):
    /// `manifest:<connection>`, `organization:<connection>` or
    /// `system:<provider>`; `null` when no handout was recorded before the
    /// call (a run from before this was recorded).
    pub paid_by: Option<String>,
    pub provider: String,
    pub tokens_in: i64,
    pub tokens_out: i64,
    /// The provider's usage never arrived or was not believable: the
    /// numbers are what the relay saw, possibly none.
    pub unmetered: bool,
}

impl RunCost {
    /// The run's totals, and its calls from its stored `cost` events, each
    /// paid by the last `model_key` event (`{"paid_by": …}`) at or before
    /// it. An event that does not parse is left out.
    pub fn of(
        run: &airlock_store::Run,
        costs: &[airlock_store::Event],
        payers: &[airlock_store::Event],
    ) -> Self {
        #[derive(Deserialize)]
        struct PayerEvent {
            paid_by: String,
        }
        let payers: Vec<(i64, String)> = payers
            .iter()
            .filter_map(|e| {
                let p: PayerEvent = serde_json::from_str(&e.payload).ok()?;
                Some((e.at, p.paid_by))
            })
            .collect();
        let calls = costs
            .iter()
            .filter_map(|e| {
                let airlock_platform_api::wire::RunEvent::Cost(c) =
                    serde_json::from_str(&e.payload).ok()?
                else {
                    return None;
                };
                let at_most = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                Some(CostCall {
                    at: c.at,
                    cost_microusd: c.cost_microusd.map(at_most),
                    model: c.model,
                    paid_by: payers
                        .iter()
                        .rev()
                        .find(|(at, _)| *at <= c.at)
                        .map(|(_, p)| p.clone()),
                    provider: c.provider,
                    tokens_in: at_most(c.input_tokens),
                    tokens_out: at_most(c.output_tokens),
                    unmetered: c.unmetered,
                })
            })
            .collect();
        let Cost {
            cost_microusd,
            cost_usd,
            tokens_in,
            tokens_out,
        } = Cost::from(run);
        RunCost {
            calls,
            cost_microusd,
            cost_usd,
            tokens_in,
            tokens_out,
        }
    }
}

/// A run. Also the `end` event of an event stream, and a webhook's `data.run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Run {
    pub agent: String,
    pub backend: String,
    /// Its model budget and what it spent against it.
    #[serde(default)]
    pub budget: RunBudget,
    pub cost: Cost,
    pub created_at: i64,
    pub ended_at: Option<i64>,
    pub error: Option<String>,
    pub exit_code: Option<i64>,
    pub id: String,
    /// The model provider its manifest names.
    pub model: Option<String>,
    /// While running: how many of its requests an `ask` rule holds for a
    /// person's answer (`0` included; omitted otherwise). Answered at
    /// `/v1/runs/{id}/approvals`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_approvals: Option<i64>,
    /// The upstream proxy its guarded connections went through: an
    /// operator proxy's name, `PROXY_URL`, or `null` (direct, or not
    /// started). Never a URL.
    #[serde(default)]
    pub proxy: Option<String>,
    /// While queued: how many queued runs are ahead (omitted otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i64>,
    /// The `airlock serve` replica that runs (or ran) it.
    pub replica: Option<String>,
    /// When its sandbox was up (Unix ms; `null`: not reached).
    pub sandbox_up_at: Option<i64>,
    /// When its sidecar was ready and its agent let go (Unix ms; `null`: not reached).
    pub sidecar_up_at: Option<i64>,
    pub started_at: Option<i64>,
    #[schema(schema_with = run_status)]
    pub status: String,
}

impl Run {
    /// The run with `pending_approvals` set from `counts` (the store's
    /// [`airlock_store::Store::pending_approval_counts`]: a running run it
    /// leaves out holds none) while it is running.
    pub fn with_pending(mut self, counts: &std::collections::HashMap<String, i64>) -> Self {
        if self.status == airlock_store::RunStatus::Running.as_str() {
            self.pending_approvals = Some(counts.get(&self.id).copied().unwrap_or(0));
        }
        self
    }

    /// A stored run as the API shows it; `queue_position` while it is queued.
    pub fn of(r: &airlock_store::Run, queue_position: Option<i64>) -> Self {
        Run {
            agent: r.agent.clone(),
            backend: r.backend.clone(),
            budget: RunBudget::from(r),
            cost: Cost::from(r),
            created_at: r.created_at,
            ended_at: r.ended_at,
            error: r.error.clone(),
            exit_code: r.exit_code,
            id: r.id.clone(),
            model: r.model.clone(),
            pending_approvals: None,
            proxy: r.proxy.clone(),
            queue_position,
            replica: r.owner.clone(),
            sandbox_up_at: r.sandbox_up_at,
            sidecar_up_at: r.sidecar_up_at,
            started_at: r.started_at,
            status: r.status.as_str().to_owned(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    /// The next page's `cursor`; `null` on the last page.
    pub next_cursor: Option<String>,
    pub runs: Vec<Run>,
}

/// `GET /v1/runs`'s query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RunsQuery {
    /// Only this agent's runs.
    pub agent: Option<String>,
    /// A previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// 1–100, default 50.
    pub limit: Option<u32>,
    /// Only runs in this state.
    pub status: Option<String>,
}

/// A paged list's query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// A previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// 1–100, default 50.
    pub limit: Option<u32>,
}

/// `GET /v1/runs/{id}/egress`'s query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LimitQuery {
    /// 1–10000, default 1000.
    pub limit: Option<u32>,
}

/// `GET /v1/runs/{id}/events` and `/logs`' query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only events after this id (or `Last-Event-ID`).
    pub after: Option<i64>,
    /// 1–100, default 50 (JSON pages only).
    pub limit: Option<u32>,
}

/// One stored event of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    pub at: i64,
    pub id: i64,
    /// `log`, `shed`, `result`, `cost`, …
    pub kind: String,
    /// The event as the run reported it (a JSON object; its text if it is
    /// not JSON).
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
}

impl From<&airlock_store::Event> for Event {
    fn from(e: &airlock_store::Event) -> Self {
        Event {
            at: e.at,
            id: e.id,
            kind: e.kind.clone(),
            payload: serde_json::from_str(&e.payload)
                .unwrap_or_else(|_| serde_json::Value::String(e.payload.clone())),
        }
    }
}

/// The field of a run's result that makes it an HTML preview: a result
/// `{"html": "<!doctype html>…"}` (the agent's `$AIRLOCK_RESULT` file) is
/// shown by the console in a sandboxed frame (docs/console.md).
pub const HTML_RESULT_FIELD: &str = "html";

/// The HTML of a run's result event (`GET /v1/runs/{id}/result`: its
/// `result` is what the agent reported) when that result is an HTML
/// preview ([`HTML_RESULT_FIELD`]).
pub fn html_result(result_event: &serde_json::Value) -> Option<&str> {
    result_event.get("result")?.get(HTML_RESULT_FIELD)?.as_str()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventPage {
    pub events: Vec<Event>,
    /// The `after` of the next page (this one's if it is empty).
    pub next_after: i64,
}

/// A file the run's agent left in its output directory (`agent.outputs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Artifact {
    /// Its size as the agent left it.
    pub bytes: u64,
    pub created_at: i64,
    /// A short-lived signed URL to download it (no API key needed while it
    /// lasts); `null` when it was not stored.
    pub download_url: Option<String>,
    /// When `download_url` stops working (Unix seconds).
    pub download_expires_at: Option<i64>,
    /// Relative to the output directory.
    pub path: String,
    /// Why it was not stored: `symlink`, `not_a_file`, `too_large`,
    /// `bad_path`, `unreadable`, `run_files`, `run_quota`, `org_quota`.
    #[schema(schema_with = artifact_refusal)]
    pub refused: Option<airlock_platform_api::files::ArtifactRefusal>,
}

/// `GET /v1/runs/{id}/artifacts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactList {
    pub artifacts: Vec<Artifact>,
}

/// `GET /v1/runs/{id}/artifacts/download`'s query: what a signed URL carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ArtifactDownload {
    /// The artifact's path.
    pub path: String,
    /// Unix seconds.
    pub expires: i64,
    /// Lowercase hex HMAC-SHA256.
    pub signature: String,
}

/// One request that left a run's sandbox, or one refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EgressRecord {
    pub at: i64,
    pub bytes_in: i64,
    pub bytes_out: i64,
    /// `allowed` or `refused`.
    #[schema(value_type = String)]
    pub decision: EgressDecision,
    pub duration_ms: Option<i64>,
    pub host: String,
    pub integration: Option<String>,
    /// Model calls: `metered`, or `unmetered` when the provider's usage
    /// never arrived (`null` for other requests).
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub metering: Option<EgressMetering>,
    pub method: String,
    /// What became of an allowed request (`null` for a refusal).
    #[schema(value_type = Option<String>)]
    pub outcome: Option<EgressOutcome>,
    /// The path that carried it to the guard: `api` (the sidecar's own
    /// call: `api_call`, `llm`, `mcp`), `proxy` (the client's connection
    /// through the forward proxy), or `transparent` (the client's
    /// connection through the sandbox's transparent plane, for tools that
    /// ignore proxy variables). The rest of a record means the same
    /// whichever path carried it.
    #[schema(schema_with = egress_plane)]
    pub plane: EgressPlane,
    /// The guard's refusal code.
    #[schema(value_type = Option<String>)]
    pub reason: Option<RefusalCode>,
    /// The id of the L7 rule that refused it (`rule_refused`; a tunnel a
    /// live change closed too), else `null`.
    #[serde(default)]
    pub rule: Option<String>,
    /// Its number within the run.
    pub seq: Option<i64>,
    /// `api_call`, `proxy`, `llm`, …
    #[schema(value_type = String)]
    pub source: EgressSource,
    /// The upstream's HTTP status.
    pub status: Option<i64>,
    /// Free of credentials.
    pub url: String,
}

impl From<&airlock_store::EgressEntry> for EgressRecord {
    fn from(e: &airlock_store::EgressEntry) -> Self {
        EgressRecord {
            at: e.at,
            bytes_in: e.bytes_in,
            bytes_out: e.bytes_out,
            decision: e.decision,
            duration_ms: e.duration_ms,
            host: e.host.clone(),
            integration: e.integration.clone(),
            metering: e.metering,
            method: e.method.clone(),
            outcome: e.outcome,
            plane: e.plane,
            reason: e.reason,
            rule: e.rule.clone(),
            seq: e.seq,
            source: e.source,
            status: e.status,
            url: e.url.clone(),
        }
    }
}

/// A run's audit, one [`AuditRecord`] a line (`GET /v1/runs/{id}/audit.jsonl`).
pub use crate::audit::{AuditDecider, AuditDecision, AuditFormat, AuditKind, AuditRecord};

/// `GET /v1/runs/{id}/audit.jsonl`'s query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// `airlock` (the default) or `ocsf`.
    #[param(inline)]
    pub format: Option<AuditFormat>,
}

/// Where a held request's approval stands (docs/egress.md, "Human approval").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Waiting for a person's answer.
    Pending,
    AllowedOnce,
    /// This request and every later one of the run matching the same rule,
    /// method and host.
    AllowedRun,
    Denied,
    /// No answer within the rule's timeout: denied.
    Expired,
    /// The run ended while it was held.
    Dropped,
}

impl From<airlock_store::ApprovalState> for ApprovalState {
    fn from(s: airlock_store::ApprovalState) -> Self {
        use airlock_store::ApprovalState as S;
        match s {
            S::Pending => ApprovalState::Pending,
            S::AllowedOnce => ApprovalState::AllowedOnce,
            S::AllowedRun => ApprovalState::AllowedRun,
            S::Denied => ApprovalState::Denied,
            S::Expired => ApprovalState::Expired,
            S::Dropped => ApprovalState::Dropped,
        }
    }
}

/// A request an `ask` rule held: what it would do (never a credential, a
/// header, a query or a body), and its answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Approval {
    /// The id of the API key that answered, when someone did.
    pub answered_by: Option<String>,
    pub created_at: i64,
    /// When no answer denies it.
    pub expires_at: i64,
    /// The target's host (and port when not the scheme's default).
    pub host: String,
    pub id: String,
    /// The integration whose rule held it (`null`: the run's network rules).
    pub integration: Option<String>,
    pub method: String,
    /// The target's path, without its query.
    pub path: String,
    /// The `ask` rule that held it.
    pub rule: String,
    pub run_id: String,
    /// When it stopped being pending.
    pub settled_at: Option<i64>,
    pub state: ApprovalState,
}

impl From<&airlock_store::ApprovalRow> for Approval {
    fn from(r: &airlock_store::ApprovalRow) -> Self {
        Approval {
            answered_by: r.answered_by.clone(),
            created_at: r.created_at,
            expires_at: r.expires_at,
            host: r.host.clone(),
            id: r.id.clone(),
            integration: r.integration.clone(),
            method: r.method.clone(),
            path: r.path.clone(),
            rule: r.rule.clone(),
            run_id: r.run_id.clone(),
            settled_at: r.settled_at,
            state: r.state.into(),
        }
    }
}

/// A run's approvals, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalList {
    pub approvals: Vec<Approval>,
}

/// A person's answer to a held request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// This request goes on.
    AllowOnce,
    /// This request and every later one of the run matching the same rule,
    /// method and host go on without a hold.
    AllowRun,
    /// The request is refused (`approval_denied`).
    Deny,
}

/// `POST /v1/runs/{id}/approvals/{approval_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerApproval {
    pub decision: ApprovalDecision,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EgressLog {
    pub egress: Vec<EgressRecord>,
}

// ----------------------------------------------------------- connections

/// `POST /v1/connections`: a credential, stored encrypted; no route returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewConnection {
    /// The credential's fields (which ones: by its type).
    pub fields: BTreeMap<String, String>,
    pub integration: String,
    pub name: String,
    #[serde(rename = "type")]
    #[schema(schema_with = auth_type)]
    pub auth_type: String,
}

/// `PUT /v1/connections/{name}`: the new secret (a rotation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateConnection {
    pub fields: BTreeMap<String, String>,
}

/// A connection (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Connection {
    pub created_at: i64,
    pub integration: String,
    /// The id of the key its secret is encrypted under.
    pub kid: String,
    pub name: String,
    #[serde(rename = "type")]
    #[schema(schema_with = auth_type)]
    pub auth_type: AuthType,
    pub updated_at: i64,
}

impl From<&airlock_store::ConnectionInfo> for Connection {
    fn from(c: &airlock_store::ConnectionInfo) -> Self {
        Connection {
            created_at: c.created_at,
            integration: c.integration.clone(),
            kid: c.kid.clone(),
            name: c.name.clone(),
            auth_type: c.auth_type,
            updated_at: c.updated_at,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ConnectionList {
    pub connections: Vec<Connection>,
}

// -------------------------------------------------------------- webhooks

/// `POST /v1/webhooks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewWebhook {
    /// At least one.
    #[schema(schema_with = webhook_events)]
    pub events: Vec<String>,
    /// Judged by the egress guard now and at every delivery.
    #[schema(format = "uri")]
    pub url: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Webhook {
    pub created_at: i64,
    #[schema(schema_with = webhook_events)]
    pub events: Vec<String>,
    pub id: String,
    pub url: String,
}

impl From<&airlock_store::WebhookRow> for Webhook {
    fn from(h: &airlock_store::WebhookRow) -> Self {
        Webhook {
            created_at: h.created_at,
            events: serde_json::from_str(&h.events).unwrap_or_default(),
            id: h.id.clone(),
            url: h.url.clone(),
        }
    }
}

/// A new webhook, with its signing secret: shown in this answer only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NewWebhookAnswer {
    pub created_at: i64,
    #[schema(schema_with = webhook_events)]
    pub events: Vec<String>,
    pub id: String,
    /// `whsec_…`: the signing secret, in this answer only.
    pub secret: String,
    pub url: String,
}

impl NewWebhookAnswer {
    pub fn new(h: Webhook, secret: String) -> Self {
        NewWebhookAnswer {
            created_at: h.created_at,
            events: h.events,
            id: h.id,
            secret,
            url: h.url,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<Webhook>,
}

/// One event to deliver to one webhook, and how its delivery went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Delivery {
    pub attempts: i64,
    pub created_at: i64,
    pub delivered_at: Option<i64>,
    pub event: String,
    pub id: String,
    pub last_error: Option<String>,
    /// The receiver's last HTTP status.
    pub last_status: Option<i64>,
    pub next_attempt_at: i64,
    pub run_id: String,
    #[schema(schema_with = delivery_state)]
    pub state: String,
}

impl From<&airlock_store::DeliveryRow> for Delivery {
    fn from(d: &airlock_store::DeliveryRow) -> Self {
        Delivery {
            attempts: d.attempts,
            created_at: d.created_at,
            delivered_at: d.delivered_at,
            event: d.event.clone(),
            id: d.id.clone(),
            last_error: d.last_error.clone(),
            last_status: d.last_status,
            next_attempt_at: d.next_attempt_at,
            run_id: d.run_id.clone(),
            state: d.state.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryList {
    pub deliveries: Vec<Delivery>,
    /// The next page's `cursor`; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// The body a webhook delivery POSTs (signed: `Airlock-Signature`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WebhookEvent {
    pub created_at: i64,
    pub data: WebhookEventData,
    /// The delivery's id (`Airlock-Delivery`), the same on every retry.
    pub id: String,
    /// One of the webhook events.
    #[serde(rename = "type")]
    pub event: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WebhookEventData {
    /// `approval.pending`'s and `approval.settled`'s: the held request's
    /// approval (what the request would do, never a credential, a header,
    /// a query or a body); `approval.pending`'s as it was when held
    /// (pending). Absent from the other events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// `budget.threshold`'s: the budget and the threshold reached (absent
    /// from a run event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetThreshold>,
    /// The run as the event left it (`budget.threshold`: the run whose
    /// model call reached the threshold, as it is when the event is sent).
    pub run: Run,
}

/// A method preset of an L7 rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RuleAccess {
    /// GET, HEAD, OPTIONS.
    ReadOnly,
    /// read-only and POST, PUT, PATCH (never DELETE).
    ReadWrite,
    /// Every method.
    Full,
}

/// One L7 rule, in the manifest's grammar (docs/egress.md, "L7 rules").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// A preset; exactly one of `access` and `methods` is given. Omitted
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<RuleAccess>,
    /// `scheme://host[:port]`, wildcards as in `authorized_uris`.
    pub host: String,
    /// Named in refusals and records (default `rules[N]`). Omitted when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Omitted when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Path patterns; default `["/**"]`. Omitted when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// `"any"` (the default), `"none"`, or the parameter names allowed.
    /// Omitted when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub query: Option<serde_json::Value>,
}

/// Every rule list of a run: the network list's and each integration's
/// (by namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyLists {
    #[serde(default)]
    pub integrations: BTreeMap<String, Vec<PolicyRule>>,
    #[serde(default)]
    pub network: Vec<PolicyRule>,
}

/// `GET /v1/runs/{id}/policy`: a run's live egress rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RunPolicy {
    /// Who made the live version: `manifest` (version 0), else `key <id>`.
    pub actor: String,
    /// The version the run's sidecar reported applied.
    pub applied_version: i64,
    /// When the live version was made (`null`: version 0 of a run whose
    /// manifest has no rules).
    pub at: Option<i64>,
    /// The manifest's rules: the ceiling of every change.
    pub manifest: PolicyLists,
    /// The rules in force.
    pub rules: PolicyLists,
    /// 0: the manifest's; each change adds one.
    pub version: i64,
}

/// `PATCH /v1/runs/{id}/policy`: the run's new live rules (replacing every
/// list: a list left out withdraws its manifest rules), or `reset` back to
/// the manifest's. Give exactly one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetRunPolicy {
    /// Made only if the live version is still this one (409 otherwise).
    #[serde(default)]
    pub expect_version: Option<i64>,
    #[serde(default)]
    pub reset: bool,
    #[serde(default)]
    pub rules: Option<PolicyLists>,
}

/// `PATCH /v1/runs/{id}/policy`'s query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PolicyQuery {
    /// Answer once the run's sidecar has applied the change (at most 10 s;
    /// 202 when it has not by then).
    pub wait: Option<bool>,
}

#[cfg(test)]
mod tests {
    use serde::Serialize;
    use serde::de::DeserializeOwned;
    use serde_json::json;

    use super::*;

    /// Serializes `v`, reads it back, and checks nothing was lost; returns
    /// its JSON.
    fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
        v: &T,
    ) -> serde_json::Value {
        let text = serde_json::to_string(v).expect("serializes");
        let back: T = serde_json::from_str(&text).expect("reads back");
        assert_eq!(&back, v, "{text}");
        // The bytes are a sorted map's: the fields are declared in order.
        let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(value.to_string(), text, "fields out of order");
        value
    }

    fn run() -> Run {
        Run {
            agent: "bot".into(),
            backend: "process".into(),
            budget: RunBudget {
                limits: BudgetLimits {
                    tokens: Some(1000),
                    ..BudgetLimits::default()
                },
                spend: RunSpend {
                    cost_microusd: 1_500_000,
                    requests: 2,
                    tokens: 30,
                },
            },
            cost: Cost {
                cost_microusd: 1_500_000,
                cost_usd: 1.5,
                tokens_in: 10,
                tokens_out: 20,
            },
            created_at: 1,
            ended_at: None,
            error: None,
            exit_code: None,
            id: "run_1".into(),
            model: None,
            pending_approvals: None,
            proxy: Some("eu".into()),
            queue_position: None,
            replica: None,
            sandbox_up_at: None,
            sidecar_up_at: None,
            started_at: None,
            status: "queued".into(),
        }
    }

    #[test]
    fn every_answer_round_trips_and_keeps_its_wire_shape() {
        let r = run();
        let v = round_trip(&r);
        // Unset optional fields are null, except queue_position (omitted).
        assert_eq!(v["started_at"], serde_json::Value::Null);
        assert!(v.get("started_at").is_some() && v.get("queue_position").is_none());
        let queued = round_trip(&Run {
            queue_position: Some(2),
            ..run()
        });
        assert_eq!(queued["queue_position"], 2);
        assert!(v.get("pending_approvals").is_none());
        let counts = std::collections::HashMap::from([("run_1".to_owned(), 3)]);
        let running = Run {
            status: "running".into(),
            ..run()
        };
        assert_eq!(
            round_trip(&running.clone().with_pending(&counts))["pending_approvals"],
            3
        );
        let none = std::collections::HashMap::new();
        assert_eq!(
            round_trip(&running.with_pending(&none))["pending_approvals"],
            0
        );
        assert!(
            round_trip(&run().with_pending(&counts))
                .get("pending_approvals")
                .is_none()
        );
        round_trip(&RunList {
            next_cursor: None,
            runs: vec![r.clone()],
        });
        round_trip(&Error::new("not_found", "no such run"));
        round_trip(&Health::ok());
        round_trip(&Ready {
            backend: "process".into(),
            replica: "rep_1".into(),
            running: 0,
            status: "ready".into(),
        });
        round_trip(&Organization {
            created_at: 1,
            id: "org_1".into(),
            max_concurrent_runs: None,
            name: "Acme".into(),
        });
        let key = ApiKey {
            created_at: 1,
            id: "k1".into(),
            name: "ci".into(),
            revoked_at: None,
        };
        round_trip(&ApiKeyList {
            api_keys: vec![key.clone()],
        });
        let v = round_trip(&NewApiKeyAnswer::new(key, "alk_x".into()));
        assert_eq!(v["revoked_at"], serde_json::Value::Null);
        let agent = Agent {
            created_at: 1,
            files: vec!["main.py".into()],
            manifest: None,
            name: "bot".into(),
            updated_at: 2,
        };
        assert!(round_trip(&agent).get("manifest").is_none());
        round_trip(&AgentList {
            agents: vec![Agent {
                manifest: Some("[agent]".into()),
                ..agent
            }],
        });
        round_trip(&r.cost);
        round_trip(&EventPage {
            events: vec![Event {
                at: 1,
                id: 3,
                kind: "log".into(),
                payload: json!({"type": "log", "at": 1, "stream": "stdout", "line": "hi"}),
            }],
            next_after: 3,
        });
        round_trip(&EgressLog {
            egress: vec![EgressRecord {
                at: 1,
                bytes_in: 2,
                bytes_out: 3,
                decision: EgressDecision::Allowed,
                duration_ms: Some(4),
                host: "example.com".into(),
                integration: None,
                metering: Some(EgressMetering::Metered),
                method: "GET".into(),
                outcome: Some(EgressOutcome::Completed),
                plane: EgressPlane::Api,
                reason: None,
                rule: None,
                seq: Some(0),
                source: EgressSource::ApiCall,
                status: Some(200),
                url: "https://example.com/".into(),
            }],
        });
        let c = Connection {
            created_at: 1,
            integration: "gh".into(),
            kid: "k1".into(),
            name: "gh".into(),
            auth_type: AuthType::Bearer,
            updated_at: 1,
        };
        let v = round_trip(&c);
        assert_eq!(v["type"], "bearer");
        round_trip(&ConnectionList {
            connections: vec![c],
        });
        let hook = Webhook {
            created_at: 1,
            events: vec!["run.failed".into()],
            id: "wh_1".into(),
            url: "http://127.0.0.1:9/".into(),
        };
        round_trip(&WebhookList {
            webhooks: vec![hook.clone()],
        });
        round_trip(&NewWebhookAnswer::new(hook, "whsec_x".into()));
        round_trip(&DeliveryList {
            deliveries: vec![Delivery {
                attempts: 1,
                created_at: 1,
                delivered_at: None,
                event: "run.failed".into(),
                id: "dl_1".into(),
                last_error: Some("refused".into()),
                last_status: None,
                next_attempt_at: 2,
                run_id: "run_1".into(),
                state: "pending".into(),
            }],
            next_cursor: Some("c".into()),
        });
        let v = round_trip(&WebhookEvent {
            created_at: 1,
            data: WebhookEventData {
                approval: None,
                budget: None,
                run: r.clone(),
            },
            id: "dl_1".into(),
            event: "run.succeeded".into(),
        });
        assert_eq!(v["type"], "run.succeeded");
        assert!(v["data"].get("budget").is_none(), "{v}");
        let crossing = airlock_store::Crossing {
            org_id: "org_1".into(),
            run_id: "run_1".into(),
            budget: "org_day".into(),
            period: "day:2026-12-06".into(),
            measure: "tokens".into(),
            threshold: 800,
            spent: 8000,
            limit: 10_000,
            crossed_at: 7,
        };
        let v = round_trip(&WebhookEvent {
            created_at: 7,
            data: WebhookEventData {
                approval: None,
                budget: Some(BudgetThreshold::from(&crossing)),
                run: r,
            },
            id: "dl_2".into(),
            event: airlock_store::THRESHOLD_EVENT.into(),
        });
        assert_eq!(v["type"], "budget.threshold");
        assert_eq!(
            v["data"]["budget"],
            json!({"budget": "org_day", "period": "day:2026-12-06", "measure": "tokens",
                   "threshold": 0.8, "spent": 8000, "limit": 10_000, "org_id": "org_1",
                   "run_id": "run_1", "crossed_at": 7})
        );
        assert!(WEBHOOK_EVENTS.contains(&airlock_store::THRESHOLD_EVENT));
    }

    #[test]
    fn every_request_round_trips_and_refuses_unknown_fields() {
        let v = round_trip(&NewRun {
            agent: "bot".into(),
            files: BTreeMap::new(),
            limits: None,
            prompt: None,
        });
        assert_eq!(v, json!({"agent": "bot"}), "unset options are omitted");
        round_trip(&NewRun {
            agent: "bot".into(),
            files: BTreeMap::new(),
            limits: Some(RunLimits {
                cpus: Some(0.5),
                memory_mb: Some(64),
                timeout_seconds: None,
            }),
            prompt: Some("hi".into()),
        });
        round_trip(&NewRun {
            agent: "bot".into(),
            files: BTreeMap::from([("data/in.txt".into(), "x".into())]),
            limits: None,
            prompt: None,
        });
        round_trip(&RegisterAgent {
            files: [("a.py".to_owned(), "print(1)".to_owned())].into(),
            manifest: "[agent]".into(),
        });
        round_trip(&NewApiKey { name: "ci".into() });
        round_trip(&NewConnection {
            fields: [("token".to_owned(), "t".to_owned())].into(),
            integration: "gh".into(),
            name: "gh".into(),
            auth_type: "bearer".into(),
        });
        round_trip(&RotateConnection {
            fields: BTreeMap::new(),
        });
        round_trip(&NewWebhook {
            events: vec!["run.started".into()],
            url: "http://127.0.0.1:9/".into(),
        });
        for (body, ok) in [
            (json!({"agent": "a", "agnet": "a"}), false),
            (json!({"agent": "a", "limits": {"cpu": 1}}), false),
            (json!({"agent": "a", "prompt": null}), true),
        ] {
            assert_eq!(serde_json::from_value::<NewRun>(body).is_ok(), ok);
        }
        assert!(serde_json::from_value::<NewApiKey>(json!({"name": "a", "x": 1})).is_err());
    }

    #[test]
    fn enumerated_fields_list_the_stored_spellings() {
        let s = serde_json::to_value(run_status()).expect("schema");
        assert_eq!(
            s["enum"],
            json!([
                "queued",
                "running",
                "succeeded",
                "failed",
                "cancelled",
                "timed_out"
            ])
        );
        let s = serde_json::to_value(auth_type()).expect("schema");
        assert_eq!(
            s["enum"].as_array().map(Vec::len),
            Some(AuthType::ALL.len())
        );
        for status in RunStatus::ALL {
            if let Some(e) = airlock_store::run_event(status) {
                assert!(WEBHOOK_EVENTS.contains(&e), "{e}");
            }
        }
    }
}

//! Model budgets across the platform's boundary: the run's own limits as
//! the sidecar is started with them ([`RunBudget`], in the launch
//! contract), and the internal API's exchange that charges a call to its
//! organization's budgets before it leaves ([`ReserveRequest`],
//! [`ReserveAnswer`]) and settles it once its usage is known
//! ([`SettleRequest`]).
//!
//! Every amount is a [`Amount`]: tokens (input and output together),
//! millionths of a US dollar, and model requests.

use serde::{Deserialize, Serialize};

/// The internal API's path that reserves a call's charge.
pub const RESERVE_PATH: &str = "/internal/v1/budget/reserve";
/// The internal API's path that settles a reservation.
pub const SETTLE_PATH: &str = "/internal/v1/budget/settle";

/// Output tokens reserved for a model request that names no bound of its
/// own (`max_tokens`, `max_completion_tokens`, `max_output_tokens`).
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 4096;

/// What a call is charged, or a budget's limits (`None`: not limited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub tokens: Option<u64>,
    pub cost_microusd: Option<u64>,
    pub requests: Option<u64>,
}

impl Limits {
    /// Whether any measure is limited.
    pub fn any(&self) -> bool {
        self.tokens.is_some() || self.cost_microusd.is_some() || self.requests.is_some()
    }
}

/// A charge: what one call reserves or used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Amount {
    pub tokens: u64,
    pub cost_microusd: u64,
    pub requests: u64,
}

/// The budgets a run's sidecar enforces.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunBudget {
    /// The run's own limits (the manifest's `[budget]`, within the
    /// operator's ceilings): kept by the sidecar alone.
    pub run: Limits,
    /// The run's organization has budgets: every call is also reserved
    /// with the platform ([`RESERVE_PATH`]) before it leaves.
    pub org: bool,
    /// Output tokens reserved for a request that names no bound
    /// ([`DEFAULT_MAX_OUTPUT_TOKENS`] when 0).
    pub default_max_output_tokens: u64,
}

impl RunBudget {
    /// Whether any budget applies (else the relay reserves nothing).
    pub fn enforced(&self) -> bool {
        self.run.any() || self.org
    }

    /// Output tokens reserved for a request that names no bound.
    pub fn default_output(&self) -> u64 {
        if self.default_max_output_tokens == 0 {
            DEFAULT_MAX_OUTPUT_TOKENS
        } else {
            self.default_max_output_tokens
        }
    }
}

/// Which budget a refusal names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The run's own.
    Run,
    /// The organization's, for the day (UTC).
    OrgDay,
    /// The organization's, for the month (UTC).
    OrgMonth,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Run => "run's",
            Scope::OrgDay => "organization's day",
            Scope::OrgMonth => "organization's month",
        }
    }
}

/// Which measure of a budget a refusal names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    Tokens,
    CostMicrousd,
    Requests,
}

impl Measure {
    pub fn as_str(self) -> &'static str {
        match self {
            Measure::Tokens => "tokens",
            Measure::CostMicrousd => "cost_microusd",
            Measure::Requests => "requests",
        }
    }
}

/// A call refused by a budget: which one, its limit, what is left, and
/// what the call would have needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub struct Exceeded {
    pub scope: Scope,
    pub measure: Measure,
    pub limit: u64,
    pub left: u64,
    pub needed: u64,
}

/// `POST` [`RESERVE_PATH`]: charge `amount` to the run's organization.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveRequest {
    pub amount: Amount,
    /// The model has a price: `amount.cost_microusd` is its cost (else 0,
    /// and a cost budget cannot be kept).
    pub priced: bool,
}

/// The platform's answer to a [`ReserveRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ReserveAnswer {
    /// Charged; settle it with this id.
    Granted { id: String },
    /// Not charged.
    Exceeded(Exceeded),
    /// Not charged: the organization has a cost budget and the call's
    /// model has no price.
    Unpriced,
}

/// `POST` [`SETTLE_PATH`]: replace reservation `id` with what the call used.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SettleRequest {
    pub id: String,
    pub used: Amount,
}

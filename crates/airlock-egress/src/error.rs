//! The guard's typed refusals. Codes and HTTP statuses are a stable contract
//! (docs/egress.md): callers map them to tool errors, proxy responses and log
//! entries without parsing messages.

use std::fmt;

use crate::rules::RuleRefusal;

/// Stable, machine-readable refusal codes: the `code` of a refused egress
/// record on the wire, in the journal and in the store (the contract crate
/// re-exports it as `RefusalCode`), always spelled by [`EgressCode::as_str`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum EgressCode {
    InvalidUrl,
    NotAuthorized,
    CredentialExfiltrationRefused,
    BlockedHost,
    BlockedAddress,
    RedirectBlocked,
    Unresolvable,
    UpstreamFailed,
    TooManyRedirects,
    /// An L7 rule covering the host does not allow the method, path or query.
    RuleRefused,
    /// An `ask` rule holds the request, and this path cannot wait for a
    /// person's answer (a redirect hop, a remote MCP server, a model call).
    ApprovalRequired,
    /// A person denied the held request.
    ApprovalDenied,
    /// No one answered the held request within its rule's timeout.
    ApprovalTimeout,
    /// The run already holds as many requests as it may.
    ApprovalCap,
    /// The run asked for as many approvals as it may over its life (the
    /// platform's bound): no later request is held, each is refused.
    ApprovalsExhausted,
}

impl EgressCode {
    pub const ALL: [EgressCode; 15] = [
        EgressCode::InvalidUrl,
        EgressCode::NotAuthorized,
        EgressCode::CredentialExfiltrationRefused,
        EgressCode::BlockedHost,
        EgressCode::BlockedAddress,
        EgressCode::RedirectBlocked,
        EgressCode::Unresolvable,
        EgressCode::UpstreamFailed,
        EgressCode::TooManyRedirects,
        EgressCode::RuleRefused,
        EgressCode::ApprovalRequired,
        EgressCode::ApprovalDenied,
        EgressCode::ApprovalTimeout,
        EgressCode::ApprovalCap,
        EgressCode::ApprovalsExhausted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EgressCode::InvalidUrl => "invalid_url",
            EgressCode::NotAuthorized => "not_authorized",
            EgressCode::CredentialExfiltrationRefused => "credential_exfiltration_refused",
            EgressCode::BlockedHost => "blocked_host",
            EgressCode::BlockedAddress => "blocked_address",
            EgressCode::RedirectBlocked => "redirect_blocked",
            EgressCode::Unresolvable => "unresolvable",
            EgressCode::UpstreamFailed => "upstream_failed",
            EgressCode::TooManyRedirects => "too_many_redirects",
            EgressCode::RuleRefused => "rule_refused",
            EgressCode::ApprovalRequired => "approval_required",
            EgressCode::ApprovalDenied => "approval_denied",
            EgressCode::ApprovalTimeout => "approval_timeout",
            EgressCode::ApprovalCap => "approval_cap",
            EgressCode::ApprovalsExhausted => "approvals_exhausted",
        }
    }

    /// The HTTP status a refusal with this code is reported as.
    pub fn http_status(self) -> u16 {
        match self {
            EgressCode::InvalidUrl => 400,
            EgressCode::NotAuthorized
            | EgressCode::CredentialExfiltrationRefused
            | EgressCode::BlockedHost
            | EgressCode::BlockedAddress
            | EgressCode::RedirectBlocked
            | EgressCode::RuleRefused
            | EgressCode::ApprovalRequired
            | EgressCode::ApprovalDenied
            | EgressCode::ApprovalTimeout => 403,
            EgressCode::ApprovalCap | EgressCode::ApprovalsExhausted => 429,
            EgressCode::Unresolvable
            | EgressCode::UpstreamFailed
            | EgressCode::TooManyRedirects => 502,
        }
    }

    /// SSRF refusals (where the request would have gone) versus policy
    /// refusals (what the integration is allowed to do); the log line differs.
    pub fn is_ssrf(self) -> bool {
        matches!(
            self,
            EgressCode::BlockedHost | EgressCode::BlockedAddress | EgressCode::Unresolvable
        )
    }
}

/// A text that is no [`EgressCode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an egress refusal code")]
pub struct UnknownEgressCode(pub String);

impl std::str::FromStr for EgressCode {
    type Err = UnknownEgressCode;
    fn from_str(s: &str) -> Result<EgressCode, UnknownEgressCode> {
        EgressCode::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownEgressCode(s.to_owned()))
    }
}

impl fmt::Display for EgressCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which check tripped; named in every refusal message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardStep {
    UrlParser,
    AuthorizedUris,
    /// The L7 rules that narrow `authorized_uris` or the network list.
    Rules,
    CredentialRules,
    BlockedNames,
    Resolver,
    AddressTable,
    Redirects,
    Upstream,
    /// The transparent plane's check that a connection presents (TLS SNI,
    /// HTTP `Host`) the name its synthetic address was issued for.
    TransparentName,
    /// A person's answer to a request an `ask` rule held (or its absence).
    Approval,
}

impl GuardStep {
    pub fn as_str(self) -> &'static str {
        match self {
            GuardStep::UrlParser => "url parser",
            GuardStep::AuthorizedUris => "authorized_uris",
            GuardStep::Rules => "l7 rules",
            GuardStep::CredentialRules => "credential rules",
            GuardStep::BlockedNames => "blocked names",
            GuardStep::Resolver => "resolver",
            GuardStep::AddressTable => "address table",
            GuardStep::Redirects => "redirect check",
            GuardStep::Upstream => "upstream",
            GuardStep::TransparentName => "transparent plane name check",
            GuardStep::Approval => "human approval",
        }
    }
}

/// A refusal or failure of an outbound request.
///
/// Its `Display` ([`EgressError::tenant_message`]) is what whoever asked for
/// the request may read, a tenant (the `/v1` API) or an agent (every answer
/// of the sidecar's): the rule, the guard step and the host as it was given,
/// never an address the guard resolved or dialled, so that the instance's
/// internal DNS is not an oracle for them. The address is the operator's
/// alone: [`EgressError::operator_message`], for the operator's log.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.tenant_message())]
pub struct EgressError {
    pub code: EgressCode,
    pub guard: GuardStep,
    /// The host the refusal is about, when there is one.
    pub host: Option<String>,
    /// What was decided and why. Never holds a resolved address (that goes
    /// in `address`).
    pub detail: String,
    /// The address(es) the decision is about (resolved or dialled), for the
    /// operator's log only.
    pub address: Option<String>,
    /// The L7 rule that refused, and what it lacked (`rule_refused` only).
    pub rule: Option<Box<RuleRefusal>>,
}

impl EgressError {
    pub fn new(
        code: EgressCode,
        guard: GuardStep,
        host: Option<&str>,
        detail: impl Into<String>,
    ) -> Self {
        EgressError {
            code,
            guard,
            host: host.map(str::to_owned),
            detail: detail.into(),
            address: None,
            rule: None,
        }
    }

    /// The same error, refused by an L7 rule.
    #[must_use]
    pub fn by_rule(mut self, refusal: RuleRefusal) -> Self {
        self.rule = Some(Box::new(refusal));
        self
    }

    /// The same error, about `address` (kept out of tenant messages).
    #[must_use]
    pub fn at(mut self, address: impl fmt::Display) -> Self {
        self.address = Some(address.to_string());
        self
    }

    /// The refusal as a tenant or an agent may read it: code, rule, guard
    /// step and the host as given; no resolved or dialled address.
    pub fn tenant_message(&self) -> String {
        format!(
            "{}: {} (guard: {}, host: {})",
            self.code,
            self.detail,
            self.guard.as_str(),
            self.host.as_deref().unwrap_or("-")
        )
    }

    /// The refusal as the operator's log keeps it: the tenant's message and
    /// the address(es) it is about.
    pub fn operator_message(&self) -> String {
        match &self.address {
            Some(a) => format!("{} (address: {a})", self.tenant_message()),
            None => self.tenant_message(),
        }
    }

    pub fn invalid_url(detail: impl Into<String>) -> Self {
        Self::new(EgressCode::InvalidUrl, GuardStep::UrlParser, None, detail)
    }

    pub fn upstream(host: &str, detail: impl Into<String>) -> Self {
        Self::new(
            EgressCode::UpstreamFailed,
            GuardStep::Upstream,
            Some(host),
            detail,
        )
    }

    pub fn http_status(&self) -> u16 {
        self.code.http_status()
    }
}

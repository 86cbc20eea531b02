//! Airlock's egress guard: what may leave a sandbox, and the only HTTP client
//! that sends it.
//!
//! Every outbound request of a run (an `api_call`, a forward-proxy tunnel, an
//! LLM relay call, every redirect hop of each) goes through the same steps, in
//! this order, and a step that refuses stops the request before any later step
//! runs (so a refused target is never even looked up):
//!
//! 1. parse and canonicalise ([`Target`], `invalid_url`);
//! 2. the call's `authorized_uris` and the credential rules ([`policy`],
//!    `not_authorized`, `credential_exfiltration_refused`), then the L7
//!    rules that narrow them ([`rules`]: method, path, query; `rule_refused`);
//! 3. blocked names (`blocked_host`);
//! 4. the operator's internal-host exemption (`EGRESS_ALLOW_INTERNAL_HOSTS`);
//! 5. resolution through a pluggable [`Resolve`] (`unresolvable`);
//! 6. every answer against the block table ([`addr`], `blocked_address`);
//! 7. dial only a validated address ([`GuardedClient`]), directly or through
//!    the operator's upstream proxy ([`upstream`]: a CONNECT to that address).

#![forbid(unsafe_code)]

pub mod addr;
mod client;
pub mod conn;
mod error;
pub mod glob;
pub mod pattern;
pub mod policy;
mod resolve;
pub mod rules;
mod target;
pub mod upstream;

pub use addr::{BlockedRange, Treatment, blocked_ranges};
pub use client::{
    Admission, ClientConfig, Dial, GuardedClient, GuardedResponse, OutboundRequest, StreamingBody,
    StreamingResponse, TcpDialer,
};
pub use error::{EgressCode, EgressError, GuardStep, UnknownEgressCode};
pub use pattern::{AuthorizedUris, Diagnostic, PatternError, RulesSource, UriPattern};
pub use policy::{Admitted, BLOCKED_NAMES, CallRules, Checked, EgressPolicy, Guard};
pub use resolve::{
    DnsServerResolver, LookupFuture, Resolve, ResolveError, StaticResolver, SystemResolver,
};
pub use rules::live::{LiveRuleError, LiveRuleSet, LiveRules};
pub use rules::{
    Action, Hold, Intent, Missing, Preset, QueryKeyword, QuerySpec, Rule, RuleError, RuleList,
    RuleRefusal, RuleSpec, Rules,
};
pub use target::{Target, TargetHost, TargetMemo};

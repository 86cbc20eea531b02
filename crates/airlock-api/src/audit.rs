//! A run's audit as `/v1` exports it (`GET /v1/runs/{id}/audit.jsonl`):
//! every decision made for the run, one [`AuditRecord`] a line.
//!
//! Contracts:
//! - Each record carries [`AUDIT_SCHEMA_VERSION`]. A record's fields keep
//!   their meaning within a version; a later server may add fields (a
//!   reader ignores what it does not know); a field that changes meaning
//!   or goes away changes the version.
//! - A record is one of the store's rows ([`AuditEntry`]): an egress record
//!   (every request the sidecar let out or refused, on every egress path),
//!   refusals counted rather than recorded one by one, a tool an
//!   integration's allowlist hid, or a change to the run's live egress
//!   rules (who made it, the version, the rule ids before and after). Its `id` is that row's, stable across
//!   exports; the export is append-only (a completed request is exported
//!   completed, never its start beside it).
//! - A record never carries a credential: egress URLs are stored without
//!   userinfo, query or credential values.

use airlock_platform_api::policy::{POLICY_CHANGE_EVENT, PolicyChange};
use airlock_platform_api::wire::{RefusalCode, RunEvent};
use airlock_store::{AuditEntry, EgressDecision, EgressEntry, Event};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Rows of each store table an export reads per page: what it holds of a
/// run at once.
pub const AUDIT_PAGE: u32 = 500;

/// The form of an export's lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditFormat {
    /// [`AuditRecord`]s.
    #[default]
    Airlock,
    /// OCSF 1.1 events (HTTP Activity 4002, Network Activity 4001); a tool
    /// exclusion has no OCSF form and is left out.
    Ocsf,
}

/// Appends `entries` to `out` as lines of `format`, each whole: the one
/// writer of the export, for the API and the CLI.
pub fn write_lines(entries: &[AuditEntry], format: AuditFormat, out: &mut Vec<u8>) {
    for record in entries.iter().filter_map(AuditRecord::of) {
        let line = match format {
            AuditFormat::Airlock => serde_json::to_vec(&record),
            AuditFormat::Ocsf => match crate::ocsf::event(&record) {
                Some(e) => serde_json::to_vec(&e),
                None => continue,
            },
        };
        // Serializing these types cannot fail; a line that did would be
        // left out whole, never cut.
        if let Ok(line) = line {
            out.extend_from_slice(&line);
            out.push(b'\n');
        }
    }
}

/// The version of [`AuditRecord`]'s shape.
pub const AUDIT_SCHEMA_VERSION: u32 = 1;

/// What a record is a decision about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    /// One request on an egress path (`source`), let out or refused.
    Egress,
    /// Refusals of one code to one host counted (`count`), past the
    /// sidecar's threshold for recording them one by one.
    Refusals,
    /// A tool an integration's tools allowlist hid (`tool`).
    ToolExcluded,
    /// The run's live egress rules changed (`actor`, `version`,
    /// `old_rules`, `new_rules`).
    PolicyChange,
    /// A request an `ask` rule held for a person (`decision: held`), or
    /// how it was settled (`outcome`: `allowed_once`, `allowed_run`,
    /// `denied`, `expired`, `dropped`; `answered_by`: the key that
    /// answered); `approval_id` ties the two. A held request's `url` is its
    /// path alone (never its query).
    Approval,
}

/// The decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditDecision {
    Allowed,
    Refused,
    /// Left out of a tool list, or refused when called by name.
    Hidden,
    /// A policy change was made.
    Changed,
    /// Held by an `ask` rule until a person answers.
    Held,
}

/// Who decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditDecider {
    /// The sidecar's egress guard: the URL policy, the credential rules,
    /// blocked names and addresses, resolution.
    EgressGuard,
    /// An L7 rule of the manifest (`rule` names it).
    L7Rule,
    /// An integration's tools allowlist.
    ToolAllowlist,
    /// A person, through the API with a key (`actor`).
    ApiKey,
    /// A person, through an API key (`answered_by`).
    Person,
}

/// One decision of a run's audit: a line of `audit.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditRecord {
    /// A policy change: who made it (`key <id>`).
    pub actor: Option<String>,
    /// An approval's settlement: the id of the API key that answered
    /// (`null` when no one did: it expired or its run ended).
    pub answered_by: Option<String>,
    /// An approval's id (`approval` records).
    pub approval_id: Option<String>,
    /// Unix ms.
    pub at: i64,
    /// Bytes received from upstream.
    pub bytes_in: i64,
    /// Bytes sent upstream.
    pub bytes_out: i64,
    /// A refusal's code (`docs/egress.md`); `null` otherwise.
    pub code: Option<String>,
    /// `refusals`: how many were counted.
    pub count: Option<i64>,
    /// A tool exclusion: whether the tool was called by name (`false`:
    /// left out of a list).
    pub called: Option<bool>,
    pub decider: AuditDecider,
    pub decision: AuditDecision,
    /// How long the request took upstream, when it was sent.
    pub duration_ms: Option<i64>,
    pub host: Option<String>,
    /// `egress:<n>` or `event:<n>`: unique within the run, the same in
    /// every export.
    pub id: String,
    pub integration: Option<String>,
    pub kind: AuditKind,
    pub method: Option<String>,
    /// A policy change: each rule (`list:id`) in force after it.
    pub new_rules: Option<Vec<String>>,
    /// A policy change: each rule (`list:id`) in force before it.
    pub old_rules: Option<Vec<String>>,
    /// What became of an allowed request (`completed`, `upstream_failed`,
    /// `incomplete`, …).
    pub outcome: Option<String>,
    /// The path that carried an egress request to the guard: `api` (the
    /// sidecar made the call), `proxy` (the client's own connection through
    /// the forward proxy), `transparent` (carried by the transparent plane).
    pub plane: Option<String>,
    /// The L7 rule that refused the request.
    pub rule: Option<String>,
    pub run_id: String,
    /// [`AUDIT_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The egress path: `api_call`, `proxy`, `llm`, `mcp`, `runner`.
    pub source: Option<String>,
    /// The upstream's HTTP status.
    pub status: Option<i64>,
    /// A tool exclusion: the tool's name as the integration's server (or
    /// the agent's call) named it.
    pub tool: Option<String>,
    /// Free of credentials.
    pub url: Option<String>,
    /// A policy change: the version it made (0: the manifest's rules).
    pub version: Option<i64>,
}

impl AuditRecord {
    /// The record of one of the store's audit entries; `None` for an event
    /// whose payload is not one of the audit's (a row written by a newer
    /// platform).
    pub fn of(entry: &AuditEntry) -> Option<AuditRecord> {
        match entry {
            AuditEntry::Egress(e) => Some(AuditRecord::egress(e)),
            AuditEntry::Event(e) => AuditRecord::event(e),
        }
    }

    fn blank(id: String, run_id: &str, at: i64, kind: AuditKind) -> AuditRecord {
        AuditRecord {
            actor: None,
            answered_by: None,
            approval_id: None,
            at,
            bytes_in: 0,
            bytes_out: 0,
            code: None,
            count: None,
            called: None,
            decider: AuditDecider::EgressGuard,
            decision: AuditDecision::Refused,
            duration_ms: None,
            host: None,
            id,
            integration: None,
            kind,
            method: None,
            new_rules: None,
            old_rules: None,
            outcome: None,
            plane: None,
            rule: None,
            run_id: run_id.to_owned(),
            schema_version: AUDIT_SCHEMA_VERSION,
            source: None,
            status: None,
            tool: None,
            url: None,
            version: None,
        }
    }

    fn egress(e: &EgressEntry) -> AuditRecord {
        let refused = e.decision == EgressDecision::Refused;
        AuditRecord {
            bytes_in: e.bytes_in,
            bytes_out: e.bytes_out,
            code: e.reason.map(|c| c.as_str().to_owned()),
            decider: if e.reason == Some(RefusalCode::RuleRefused) {
                AuditDecider::L7Rule
            } else {
                AuditDecider::EgressGuard
            },
            decision: if refused {
                AuditDecision::Refused
            } else {
                AuditDecision::Allowed
            },
            duration_ms: e.duration_ms,
            host: Some(e.host.clone()),
            integration: e.integration.clone(),
            method: Some(e.method.clone()),
            outcome: e.outcome.map(|o| o.as_str().to_owned()),
            plane: Some(e.plane.as_str().to_owned()),
            rule: e.rule.clone(),
            source: Some(e.source.as_str().to_owned()),
            status: e.status,
            url: Some(e.url.clone()),
            ..AuditRecord::blank(
                format!("egress:{}", e.id),
                &e.run_id,
                e.at,
                AuditKind::Egress,
            )
        }
    }

    fn event(e: &Event) -> Option<AuditRecord> {
        let id = format!("event:{}", e.id);
        if e.kind == POLICY_CHANGE_EVENT {
            let c = serde_json::from_str::<PolicyChange>(&e.payload).ok()?;
            return Some(AuditRecord {
                actor: Some(c.actor),
                decider: AuditDecider::ApiKey,
                decision: AuditDecision::Changed,
                new_rules: Some(c.new_rules),
                old_rules: Some(c.old_rules),
                version: Some(c.version),
                ..AuditRecord::blank(id, &e.run_id, e.at, AuditKind::PolicyChange)
            });
        }
        match serde_json::from_str::<RunEvent>(&e.payload).ok()? {
            RunEvent::Refusals {
                code, host, count, ..
            } => Some(AuditRecord {
                code: Some(code.as_str().to_owned()),
                count: Some(i64::try_from(count).unwrap_or(i64::MAX)),
                decider: if code == RefusalCode::RuleRefused {
                    AuditDecider::L7Rule
                } else {
                    AuditDecider::EgressGuard
                },
                host: Some(host),
                ..AuditRecord::blank(id, &e.run_id, e.at, AuditKind::Refusals)
            }),
            RunEvent::ToolExcluded {
                integration,
                tool,
                called,
                ..
            } => Some(AuditRecord {
                called: Some(called),
                decider: AuditDecider::ToolAllowlist,
                decision: AuditDecision::Hidden,
                integration: Some(integration),
                tool: Some(tool),
                ..AuditRecord::blank(id, &e.run_id, e.at, AuditKind::ToolExcluded)
            }),
            RunEvent::ApprovalPending { approval, .. } => Some(AuditRecord {
                approval_id: Some(approval.id),
                decider: AuditDecider::L7Rule,
                decision: AuditDecision::Held,
                host: Some(approval.request.host),
                integration: approval.request.integration,
                method: Some(approval.request.method),
                rule: Some(approval.request.rule),
                url: Some(approval.request.path),
                ..AuditRecord::blank(id, &e.run_id, e.at, AuditKind::Approval)
            }),
            RunEvent::ApprovalSettled {
                id: approval_id,
                rule,
                outcome,
                answered_by,
                ..
            } => {
                use airlock_platform_api::approval::Outcome;
                let code = match outcome {
                    Outcome::AllowedOnce | Outcome::AllowedRun => None,
                    Outcome::Denied | Outcome::Dropped => Some(RefusalCode::ApprovalDenied),
                    Outcome::Expired => Some(RefusalCode::ApprovalTimeout),
                };
                let outcome = serde_json::to_value(outcome)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned));
                Some(AuditRecord {
                    code: code.map(|c| c.as_str().to_owned()),
                    decider: if answered_by.is_some() {
                        AuditDecider::Person
                    } else {
                        AuditDecider::L7Rule
                    },
                    decision: if code.is_none() {
                        AuditDecision::Allowed
                    } else {
                        AuditDecision::Refused
                    },
                    answered_by,
                    approval_id: Some(approval_id),
                    outcome,
                    rule: Some(rule),
                    ..AuditRecord::blank(id, &e.run_id, e.at, AuditKind::Approval)
                })
            }
            _ => None,
        }
    }
}

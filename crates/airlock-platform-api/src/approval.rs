//! Human approval across the platform's boundary: a sidecar that holds a
//! request under an `ask` rule (docs/egress.md, "Human approval") asks the
//! platform with one call, [`ASK_PATH`], which creates the pending approval
//! and answers once a person did, or once the hold's time ran out.
//!
//! What the sidecar sends describes what the request would do, taken from
//! the agent's request before any credential is injected: method, host,
//! path (no query), integration and rule. Never a header value, a query, a
//! body or a credential.

use serde::{Deserialize, Serialize};

/// The internal API's path that holds a request for a person's answer.
pub const ASK_PATH: &str = "/internal/v1/approvals";

/// The code of the platform's refusal (429) of an ask from a run that
/// asked for as many approvals as it may: the sidecar refuses the request
/// at once with the same code (`airlock_egress::EgressCode::ApprovalsExhausted`).
pub const EXHAUSTED: &str = "approvals_exhausted";

/// The code of the platform's refusal (409) of an ask from a run that is
/// ending (its held requests were dropped for its teardown): no one is
/// asked and nothing is stored; the sidecar refuses the request at once
/// (`airlock_egress::EgressCode::ApprovalDenied`).
pub const RUN_ENDING: &str = "run_ending";

/// Longest a hold waits ([`airlock_egress::rules::ASK_TIMEOUT_BOUNDS`]'s end).
pub const MAX_WAIT_MS: u64 = *airlock_egress::rules::ASK_TIMEOUT_BOUNDS.end() * 1000;

/// Longest a described field (host, path, rule, integration) is kept; a
/// longer one is cut at a character boundary.
pub const MAX_FIELD: usize = 512;

/// What a held request would do.
/// (Read flattened into [`AskRequest`] and [`Pending`]: no
/// `deny_unknown_fields`, which flattening does not support.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Description {
    pub method: String,
    /// The target's host and, when not the scheme's default, port.
    pub host: String,
    /// The path alone, never the query.
    pub path: String,
    /// The integration whose rule holds it (`None`: the run's network rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integration: Option<String>,
    /// The `ask` rule's id.
    pub rule: String,
}

impl Description {
    /// Each field cut to [`MAX_FIELD`] bytes (at a character boundary).
    #[must_use]
    pub fn bounded(mut self) -> Description {
        for f in [
            &mut self.method,
            &mut self.host,
            &mut self.path,
            &mut self.rule,
        ]
        .into_iter()
        .chain(self.integration.as_mut())
        {
            if f.len() > MAX_FIELD {
                let mut end = MAX_FIELD;
                while !f.is_char_boundary(end) {
                    end -= 1;
                }
                f.truncate(end);
            }
        }
        self
    }
}

/// `POST` [`ASK_PATH`]: hold this request for at most `wait_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskRequest {
    #[serde(flatten)]
    pub request: Description,
    /// The rule's timeout, in milliseconds (at most [`MAX_WAIT_MS`]).
    pub wait_ms: u64,
}

/// How a held request was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// This request goes on.
    AllowedOnce,
    /// This request and every later one of the run matching the same rule,
    /// method and host go on.
    AllowedRun,
    Denied,
    /// No answer within the hold's time.
    Expired,
    /// The run ended while it was held.
    Dropped,
}

impl Outcome {
    pub fn allows(self) -> bool {
        matches!(self, Outcome::AllowedOnce | Outcome::AllowedRun)
    }
}

/// The answer to [`AskRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskAnswer {
    /// The approval's id.
    pub id: String,
    pub outcome: Outcome,
    /// Who answered (a key's id), when someone did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
}

/// A pending approval as the run's events and webhooks carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// The approval's id.
    pub id: String,
    #[serde(flatten)]
    pub request: Description,
    /// Unix ms when no answer denies it.
    pub expires_at: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RunEvent;

    fn what() -> Description {
        Description {
            method: "POST".into(),
            host: "api.test:8443".into(),
            path: "/x".into(),
            integration: Some("gh".into()),
            rule: "ask".into(),
        }
    }

    #[test]
    fn asks_and_events_round_trip_flattened() {
        let ask = AskRequest {
            request: what(),
            wait_ms: 5,
        };
        let text = serde_json::to_string(&ask).unwrap();
        assert_eq!(serde_json::from_str::<AskRequest>(&text).unwrap(), ask);
        let e = RunEvent::ApprovalPending {
            at: 1,
            approval: Pending {
                id: "a1".into(),
                request: what(),
                expires_at: 9,
            },
        };
        let text = serde_json::to_string(&e).unwrap();
        assert!(text.contains(r#""type":"approval.pending""#), "{text}");
        assert_eq!(serde_json::from_str::<RunEvent>(&text).unwrap(), e);
        assert!(e.is_platforms());
        assert_eq!(e.kind(), "approval.pending");
    }

    #[test]
    fn a_description_is_bounded_at_a_character_boundary() {
        let d = Description {
            path: format!("/{}", "é".repeat(MAX_FIELD)),
            ..what()
        }
        .bounded();
        assert!(d.path.len() <= MAX_FIELD);
        assert!(d.path.starts_with("/é"));
    }
}

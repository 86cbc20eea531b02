//! The audit of the tools an integration's tools allowlist hides: the one
//! place a hidden tool is recorded.
//!
//! Contract: each distinct `(integration, tool, called)` of a run is kept
//! once as a [`RunEvent::ToolExcluded`] in the run's journal (never shed),
//! the first [`MAX_EXCLUSIONS_KEPT`] of them; every exclusion is also a log
//! line (`airlock::policy`). The bound holds because a tool named in a call
//! is the agent's to choose.

use std::collections::HashSet;
use std::sync::Mutex;

use airlock_platform_api::wire::RunEvent;

use crate::clock::now_ms;
use crate::keep::Keeper;

/// The most distinct exclusions one run keeps in its audit.
pub const MAX_EXCLUSIONS_KEPT: usize = 1024;

#[derive(Default)]
pub struct Exclusions {
    seen: Mutex<HashSet<(String, String, bool)>>,
}

impl Exclusions {
    /// Records that `integration`'s allowlist hides `tool`: left out of a
    /// list (`called: false`) or refused when called by name.
    pub fn record(&self, keep: &Keeper, integration: &str, tool: &str, called: bool) {
        tracing::info!(target: "airlock::policy", integration = %integration, tool = %tool,
            called, "tool hidden by the integration's tools allowlist");
        let first = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            let key = (integration.to_owned(), tool.to_owned(), called);
            seen.len() < MAX_EXCLUSIONS_KEPT && seen.insert(key)
        };
        if first {
            let _ = keep.vital(RunEvent::ToolExcluded {
                at: now_ms(),
                integration: integration.to_owned(),
                tool: tool.to_owned(),
                called,
            });
        }
    }
}

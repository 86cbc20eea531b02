//! A run's live rules: the L7 rules a person set on a running run
//! (`PATCH /v1/runs/{id}/policy`, docs/egress.md "Live policy"), within the
//! manifest's, and the cell the sidecar swaps them in.
//!
//! Contracts:
//! - The manifest's rules of a list are its ceiling. A live rule must be
//!   *within* one manifest rule of the same list ([`within`]): its host the
//!   same (or a literal host the manifest's pattern covers), its methods
//!   among the manifest rule's, each of its paths inside one of the
//!   manifest rule's, its query no wider. The test is syntactic and
//!   conservative: a rule it cannot show to be within is refused.
//! - A manifest rule that no live rule replaces is withdrawn, not dropped:
//!   its host is refused ([`super::Missing::Withdrawn`]) rather than left to
//!   the list alone, so a live set admits at most what the manifest's does.
//! - [`LiveRuleSet`] holds every list of a run as one value swapped whole:
//!   a decision reads one snapshot of it; a request admitted under one set
//!   finishes under it.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use super::{Query, Rule, RuleError, RuleSpec, Rules};
use crate::target::Target;

/// Why a live list is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiveRuleError {
    #[error(transparent)]
    Rule(#[from] RuleError),
    #[error("rule {rule}: no rule of the manifest's contains it (a live rule may only narrow)")]
    Beyond { rule: String },
}

/// The rules of one list under a live policy: `live`, each within one of
/// `manifest`'s, with `manifest`'s coverage kept (a withdrawn rule's host is
/// refused).
pub fn narrowed(manifest: &Rules, live: &[RuleSpec]) -> Result<Rules, LiveRuleError> {
    let mut out = Rules::compile(live)?;
    if let Some(r) = out
        .rules
        .iter()
        .find(|r| !manifest.rules.iter().any(|m| within(r, m)))
    {
        return Err(LiveRuleError::Beyond { rule: r.id.clone() });
    }
    out.ceiling = manifest.rules.clone();
    Ok(out)
}

/// Whether every request `inner` admits, `outer` admits.
pub fn within(inner: &Rule, outer: &Rule) -> bool {
    host_within(inner, outer)
        && methods_within(inner, outer)
        && inner.path_srcs.iter().all(|p| {
            outer
                .path_srcs
                .iter()
                .zip(&outer.paths)
                .any(|(q, pat)| path_within(p, q, pat))
        })
        && query_within(&inner.query, &outer.query)
        && action_within(inner, outer)
}

/// An `ask` rule's requests wait for a person: a rule within it asks too
/// (a rule within an `allow` rule may ask or allow).
fn action_within(inner: &Rule, outer: &Rule) -> bool {
    outer.ask.is_none() || inner.ask.is_some()
}

fn host_within(inner: &Rule, outer: &Rule) -> bool {
    if inner.host_src.eq_ignore_ascii_case(&outer.host_src) {
        return true;
    }
    !inner.host_src.contains('*')
        && Target::parse(&format!("{}/", inner.host_src)).is_ok_and(|t| outer.covers(&t))
}

fn methods_within(inner: &Rule, outer: &Rule) -> bool {
    match (&inner.methods, &outer.methods) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(i), Some(o)) => i.iter().all(|m| o.contains(m)),
    }
}

/// `p` inside `q` (`pattern`: `q` compiled): the same pattern, `q` a
/// `prefix/**` whose literal prefix `p` starts with, or `p` a literal path
/// `q` matches.
fn path_within(p: &str, q: &str, pattern: &crate::pattern::UriPattern) -> bool {
    if p == q {
        return true;
    }
    if let Some(prefix) = q.strip_suffix("**")
        && prefix.ends_with('/')
        && !prefix.contains('*')
        && p.starts_with(prefix)
    {
        return true;
    }
    !p.contains('*') && pattern.matches_path(p)
}

fn query_within(inner: &Query, outer: &Query) -> bool {
    match (inner, outer) {
        (_, Query::Any) | (Query::None, _) => true,
        (Query::Names(i), Query::Names(o)) => i.iter().all(|n| o.contains(n)),
        _ => false,
    }
}

/// A run's rule lists by name.
pub type RuleLists = HashMap<String, Arc<Rules>>;

/// Every rule list of a run, by name, as one swappable value.
#[derive(Debug, Clone, Default)]
pub struct LiveRuleSet {
    cell: Arc<RwLock<Arc<RuleLists>>>,
}

impl LiveRuleSet {
    pub fn new(lists: RuleLists) -> LiveRuleSet {
        LiveRuleSet {
            cell: Arc::new(RwLock::new(Arc::new(lists))),
        }
    }

    /// Replaces every list at once: a decision made after this returns
    /// reads the new lists; one that read the old finishes under them.
    pub fn swap(&self, lists: RuleLists) {
        let mut cell = self.cell.write().unwrap_or_else(PoisonError::into_inner);
        *cell = Arc::new(lists);
    }

    /// One list of the set, read at each decision.
    pub fn list(&self, name: &str) -> LiveRules {
        LiveRules {
            set: self.clone(),
            name: Arc::from(name),
        }
    }

    fn load(&self, name: &str) -> Arc<Rules> {
        let cell = self.cell.read().unwrap_or_else(PoisonError::into_inner);
        cell.get(name).cloned().unwrap_or_default()
    }
}

/// One list of a [`LiveRuleSet`]: what an [`crate::AuthorizedUris`] judges
/// with when its rules may change while the run goes on.
#[derive(Debug, Clone)]
pub struct LiveRules {
    set: LiveRuleSet,
    name: Arc<str>,
}

impl LiveRules {
    /// The list's rules now (an absent list has none).
    pub fn load(&self) -> Arc<Rules> {
        self.set.load(&self.name)
    }
}

#[cfg(test)]
mod tests;

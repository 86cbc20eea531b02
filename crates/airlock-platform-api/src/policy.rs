//! A run's live policy (docs/egress.md, "Live policy"): the L7 rules a
//! person set on the running run, as the platform keeps them and the
//! sidecar applies them.
//!
//! Contracts:
//! - A [`PolicyRules`] names every rule list of the run: `network` and each
//!   integration's, by namespace. It replaces the whole live set: a list it
//!   leaves out has no live rule, so each of its manifest rules is
//!   withdrawn (its host refused).
//! - The manifest's lists are the ceiling ([`PolicyRules::compile`]): every
//!   live rule is within one manifest rule of its list, else the whole set
//!   is refused naming it. Version 0 is the manifest's own rules.
//! - The sidecar long-polls [`POLICY_PATH`] with the version it applied
//!   (`after`); the answer carries a later version's rules, or none after
//!   [`POLICY_WAIT`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use airlock_egress::rules::live::{LiveRuleError, RuleLists, narrowed};
use airlock_egress::{RuleSpec, Rules};
use serde::{Deserialize, Serialize};

/// The sidecar's long-poll for a newer policy (`?after=V`).
pub const POLICY_PATH: &str = "/internal/v1/policy";

/// How long the platform holds a long-poll with nothing newer.
pub const POLICY_WAIT: Duration = Duration::from_secs(25);

/// The name of the network list in a [`crate::launch`]-built rule set.
pub const NETWORK_LIST: &str = "network";

/// The name of an integration's list in a rule set.
pub fn integration_list(namespace: &str) -> String {
    format!("integration:{namespace}")
}

/// Every live rule list of a run, as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRules {
    /// The agent's network list's rules.
    #[serde(default)]
    pub network: Vec<RuleSpec>,
    /// Each integration's rules, by namespace.
    #[serde(default)]
    pub integrations: BTreeMap<String, Vec<RuleSpec>>,
}

/// Why a live policy is refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("integration {0:?}: the run has no such integration")]
    UnknownIntegration(String),
    #[error("{list}: {source}")]
    List {
        list: String,
        source: Box<LiveRuleError>,
    },
}

impl PolicyError {
    /// The rule the refusal names, when it names one.
    pub fn rule(&self) -> Option<&str> {
        match self {
            PolicyError::List { source, .. } => match &**source {
                LiveRuleError::Beyond { rule } => Some(rule),
                LiveRuleError::Rule(_) => None,
            },
            PolicyError::UnknownIntegration(_) => None,
        }
    }
}

impl PolicyRules {
    /// The live lists of a run whose manifest's lists are `ceiling`, each
    /// within its manifest list ([`narrowed`]), by list name.
    pub fn compile(&self, ceiling: &PolicyRules) -> Result<RuleLists, PolicyError> {
        if let Some(ns) = self
            .integrations
            .keys()
            .find(|ns| !ceiling.integrations.contains_key(*ns))
        {
            return Err(PolicyError::UnknownIntegration(ns.clone()));
        }
        let none = Vec::new();
        let lists = std::iter::once((NETWORK_LIST.to_owned(), &ceiling.network, &self.network))
            .chain(ceiling.integrations.iter().map(|(ns, manifest)| {
                let live = self.integrations.get(ns).unwrap_or(&none);
                (integration_list(ns), manifest, live)
            }));
        let mut out = HashMap::new();
        for (list, manifest, live) in lists {
            let err = |source| PolicyError::List {
                list: list.clone(),
                source: Box::new(source),
            };
            let manifest = Rules::compile(manifest).map_err(|e| err(e.into()))?;
            let rules = narrowed(&manifest, live).map_err(err)?;
            out.insert(list, Arc::new(rules));
        }
        Ok(out)
    }

    /// The lists of a launch: the ceiling of its run's live policy.
    pub fn of_launch(
        network: &crate::launch::Network,
        integrations: &[crate::launch::Integration],
    ) -> PolicyRules {
        PolicyRules {
            network: network.rules.specs().to_vec(),
            integrations: integrations
                .iter()
                .map(|i| (i.namespace.to_string(), i.rules.specs().to_vec()))
                .collect(),
        }
    }

    /// Whether any list holds a rule.
    pub fn is_empty(&self) -> bool {
        self.network.is_empty() && self.integrations.values().all(Vec::is_empty)
    }
}

/// The run event (`run_events.kind`) of a live policy change: on the run's
/// SSE stream and in its audit. Written by the platform only (a sidecar's
/// events are [`crate::wire::RunEvent`]s, which have no such kind).
pub const POLICY_CHANGE_EVENT: &str = "policy_change";

/// A live policy change, as its run event records it: never a rule's
/// content beyond its id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyChange {
    pub at: i64,
    /// Who made it: `key <id>` (the API key).
    pub actor: String,
    /// The version it made, and the one it replaced.
    pub version: i64,
    pub old_version: i64,
    /// Each rule's `list:id` before and after.
    pub old_rules: Vec<String>,
    pub new_rules: Vec<String>,
    /// Back to the manifest's rules.
    pub reset: bool,
}

impl PolicyRules {
    /// Every rule as `list:id` (`network:rules[0]`, `integration:gh:read`).
    pub fn rule_ids(&self) -> Vec<String> {
        let ids = |list: &str, rules: &[RuleSpec]| -> Vec<String> {
            rules
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let id = r.id.clone().unwrap_or_else(|| format!("rules[{i}]"));
                    format!("{list}:{id}")
                })
                .collect()
        };
        let mut out = ids(NETWORK_LIST, &self.network);
        for (ns, rules) in &self.integrations {
            out.extend(ids(&integration_list(ns), rules));
        }
        out
    }
}

/// The answer of a [`POLICY_PATH`] long-poll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyUpdate {
    /// The latest version (the `after` asked, when nothing is newer).
    pub version: u64,
    /// That version's rules; `None`: nothing newer than `after`.
    pub rules: Option<PolicyRules>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_egress::Preset;

    fn rule(id: &str, host: &str, access: Preset) -> RuleSpec {
        serde_json::from_value(serde_json::json!({
            "id": id, "host": host, "access": access,
        }))
        .unwrap()
    }

    fn ceiling() -> PolicyRules {
        PolicyRules {
            network: vec![rule("net", "https://net.example", Preset::Full)],
            integrations: BTreeMap::from([
                (
                    "gh".to_owned(),
                    vec![rule("gh", "https://gh.example", Preset::ReadWrite)],
                ),
                ("plain".to_owned(), vec![]),
            ]),
        }
    }

    #[test]
    fn every_list_is_held_to_its_own_manifest_list() {
        let ok = PolicyRules {
            network: vec![rule("n", "https://net.example", Preset::ReadOnly)],
            integrations: BTreeMap::from([(
                "gh".to_owned(),
                vec![rule("g", "https://gh.example", Preset::ReadOnly)],
            )]),
        };
        let lists = ok.compile(&ceiling()).unwrap();
        assert_eq!(lists.len(), 3);
        // The network's host is not the integration's ceiling.
        let crossed = PolicyRules {
            integrations: BTreeMap::from([(
                "gh".to_owned(),
                vec![rule("x", "https://net.example", Preset::ReadOnly)],
            )]),
            ..PolicyRules::default()
        };
        let e = crossed.compile(&ceiling()).unwrap_err();
        assert_eq!(e.rule(), Some("x"));
        let wider = PolicyRules {
            integrations: BTreeMap::from([(
                "gh".to_owned(),
                vec![rule("w", "https://gh.example", Preset::Full)],
            )]),
            ..PolicyRules::default()
        };
        assert_eq!(wider.compile(&ceiling()).unwrap_err().rule(), Some("w"));
        let unknown = PolicyRules {
            integrations: BTreeMap::from([("nope".to_owned(), vec![])]),
            ..PolicyRules::default()
        };
        assert!(matches!(
            unknown.compile(&ceiling()),
            Err(PolicyError::UnknownIntegration(_))
        ));
        // The manifest's own rules are within themselves.
        ceiling().compile(&ceiling()).unwrap();
    }

    #[test]
    fn the_document_reads_as_written() {
        let doc: PolicyRules = serde_json::from_str(
            r#"{"network":[{"host":"https://a.example","methods":["GET"],"paths":["/x/**"]}]}"#,
        )
        .unwrap();
        assert_eq!(doc.network[0].paths, ["/x/**"]);
        assert!(serde_json::from_str::<PolicyRules>(r#"{"netwrk":[]}"#).is_err());
    }
}

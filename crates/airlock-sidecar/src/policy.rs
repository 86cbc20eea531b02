//! The run's live policy (docs/egress.md, "Live policy"): the sidecar's one
//! set of L7 rule lists, which every egress site judges by, and the task
//! that follows the platform's changes to it.
//!
//! Contracts: every list (the network's, each integration's) is one
//! [`LiveRuleSet`], swapped whole when a change is applied; a decision
//! reads it once, so a request admitted under the old rules finishes under
//! them and every later decision (api_call, the forward proxy and its
//! interception, the transparent plane, remote MCP, the runners' proxies)
//! reads the new. A change is applied only within the manifest's rules,
//! checked here again; one that is not is refused and the old rules stay.
//! The version applied is what the next long-poll reports (`after`), and
//! what [`LivePolicy::changes`] announces to connections that outlive one
//! decision (a plain tunnel is closed once the rules would refuse it).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use airlock_egress::{LiveRuleSet, LiveRules, Rules};
use airlock_platform_api::launch::{Integration, Network};
use airlock_platform_api::policy::{
    NETWORK_LIST, PolicyError, PolicyRules, PolicyUpdate, integration_list,
};

use crate::state::Sidecar;

/// How long the follower waits before asking again after a failure (the
/// platform unreachable, or a change it could not apply).
const RETRY: Duration = Duration::from_secs(1);

/// The run's rule lists, live.
pub struct LivePolicy {
    set: LiveRuleSet,
    /// The manifest's lists: the ceiling of every change.
    ceiling: PolicyRules,
    applied: AtomicU64,
    /// The version applied, announced after each swap.
    changed: tokio::sync::watch::Sender<u64>,
}

impl LivePolicy {
    /// Version 0: the manifest's lists as they were read.
    pub fn new(network: &Network, integrations: &[Integration]) -> LivePolicy {
        let mut lists: HashMap<String, Arc<Rules>> = integrations
            .iter()
            .map(|i| (integration_list(i.namespace.as_str()), i.rules.compiled()))
            .collect();
        lists.insert(NETWORK_LIST.to_owned(), network.rules.compiled());
        LivePolicy {
            set: LiveRuleSet::new(lists),
            ceiling: PolicyRules::of_launch(network, integrations),
            applied: AtomicU64::new(0),
            changed: tokio::sync::watch::Sender::new(0),
        }
    }

    pub fn network(&self) -> LiveRules {
        self.set.list(NETWORK_LIST)
    }

    pub fn integration(&self, namespace: &str) -> LiveRules {
        self.set.list(&integration_list(namespace))
    }

    /// The version applied (0: the manifest's).
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Swaps in `rules` as `version`, every list at once, if they are
    /// within the manifest's; else nothing changes.
    pub fn apply(&self, version: u64, rules: &PolicyRules) -> Result<(), PolicyError> {
        let lists = rules.compile(&self.ceiling)?;
        self.set.swap(lists);
        self.applied.store(version, Ordering::Release);
        self.changed.send_replace(version);
        Ok(())
    }

    /// Announces every change applied after this call: a change applied
    /// between a decision and the call is announced too when the
    /// subscription is taken before the decision.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// Follows the platform's changes for as long as the sidecar runs.
pub async fn follow(sidecar: Arc<Sidecar>) {
    let policy = &sidecar.policy;
    loop {
        let after = policy.applied();
        match sidecar.platform.policy(after).await {
            Ok(PolicyUpdate {
                version,
                rules: Some(rules),
            }) => match policy.apply(version, &rules) {
                Ok(()) => tracing::info!(version, "live policy applied"),
                Err(e) => {
                    tracing::warn!(version, "live policy not applied: {e}");
                    tokio::time::sleep(RETRY).await;
                }
            },
            Ok(_) => {}
            Err(e) => {
                tracing::debug!("live policy: cannot ask the platform: {e}");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

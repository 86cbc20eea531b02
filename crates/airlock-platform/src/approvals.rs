//! Human approval on the platform's side (docs/egress.md, "Human
//! approval"): the pending approvals of held requests, the waits of the
//! sidecars that hold them, and the answers.
//!
//! Contracts:
//! - an approval is created pending by the sidecar's one call
//!   ([`Approvals::ask`]), which then waits for it to be settled: by an
//!   answer ([`Approvals::answer`]), by its hold's time running out
//!   (`expired`), or by its run ending (`dropped`). Each settlement is one
//!   conditional write in the store, so an approval is settled once
//!   whoever races for it (two replicas, two people, an answer and the
//!   timeout);
//! - an answer given on this replica wakes the wait at once; one given on
//!   another replica reaches it within [`POLL`] (the store is shared);
//! - the run's events carry `approval.pending` and `approval.settled`
//!   (who answered), written here only: a sidecar cannot report them
//!   ([`RunEvent::is_platforms`]); each is also queued, after its event,
//!   as a webhook delivery to the organization's webhooks that subscribed
//!   to it (the store's outbox sends and retries it);
//! - once a run's held requests are dropped for its teardown
//!   ([`Approvals::run_ending`]), it asks no one any more: what its sandbox
//!   still holds while it is being stopped is refused at once
//!   ([`ApprovalError::RunEnding`]), neither stored nor announced. The
//!   runs so marked are the ones this replica is tearing down: each is
//!   forgotten when its grant goes ([`Approvals::forget`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_platform_api::approval::{AskAnswer, AskRequest, MAX_WAIT_MS, Outcome, Pending};
use airlock_platform_api::clock::now_ms;
use airlock_platform_api::wire::RunEvent;
use airlock_store::{ApprovalRow, ApprovalState, NewApproval, NewEvent, Store, StoreError};
use tokio::sync::Notify;

/// How often a wait reads the store for an answer given on another replica.
pub const POLL: Duration = Duration::from_millis(500);

/// Why an approval could not be asked for or answered.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// The run asked for as many approvals as it may
    /// ([`airlock_store::MAX_APPROVALS_PER_RUN`]): refused at once.
    #[error("the run asked for as many approvals as it may ({limit})")]
    Exhausted { limit: i64 },
    #[error("an approval id could not be drawn: {0}")]
    Id(airlock_vault::VaultError),
    #[error("no such approval")]
    NotFound,
    #[error("the approval is already {0}")]
    Settled(&'static str),
    /// The run is ending (or its grant is gone): no one is asked.
    #[error("the run is ending: no one is asked")]
    RunEnding,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A person's answer (`POST /v1/runs/{id}/approvals/{aid}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    AllowOnce,
    AllowRun,
    Deny,
}

impl Decision {
    fn state(self) -> ApprovalState {
        match self {
            Decision::AllowOnce => ApprovalState::AllowedOnce,
            Decision::AllowRun => ApprovalState::AllowedRun,
            Decision::Deny => ApprovalState::Denied,
        }
    }
}

/// The outcome a settled state is, for the sidecar.
pub fn outcome(state: ApprovalState) -> Option<Outcome> {
    Some(match state {
        ApprovalState::Pending => return None,
        ApprovalState::AllowedOnce => Outcome::AllowedOnce,
        ApprovalState::AllowedRun => Outcome::AllowedRun,
        ApprovalState::Denied => Outcome::Denied,
        ApprovalState::Expired => Outcome::Expired,
        ApprovalState::Dropped => Outcome::Dropped,
    })
}

/// The waits of this replica: approval id → its run and its wake-up.
#[derive(Default)]
pub struct Approvals {
    waiting: Mutex<HashMap<String, (String, Arc<Notify>)>>,
    /// The runs this replica is tearing down ([`Approvals::run_ending`]),
    /// until [`Approvals::forget`].
    ending: Mutex<HashSet<String>>,
}

/// Removes a wait when it ends, however it ends (the sidecar may hang up).
struct Registered<'a> {
    approvals: &'a Approvals,
    id: String,
    wake: Arc<Notify>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Ok(mut w) = self.approvals.waiting.lock() {
            w.remove(&self.id);
        }
    }
}

impl Approvals {
    fn register(&self, id: &str, run_id: &str) -> Registered<'_> {
        let wake = Arc::new(Notify::new());
        if let Ok(mut w) = self.waiting.lock() {
            w.insert(id.to_owned(), (run_id.to_owned(), wake.clone()));
        }
        Registered {
            approvals: self,
            id: id.to_owned(),
            wake,
        }
    }

    fn wake(&self, which: impl Fn(&str, &str) -> bool) {
        if let Ok(w) = self.waiting.lock() {
            for (id, (run, wake)) in w.iter() {
                if which(id, run) {
                    wake.notify_one();
                }
            }
        }
    }

    /// Wakes the waits of a run that ended (its grant was withdrawn).
    pub fn run_ended(&self, run_id: &str) {
        self.wake(|_, run| run == run_id);
    }

    /// Creates the pending approval of a request `run_id` holds and waits
    /// until it is settled (at most the request's `wait_ms`);
    /// `running(run_id)` says whether the run still runs.
    pub async fn ask(
        &self,
        store: &Store,
        (run_id, org_id): (&str, &str),
        ask: AskRequest,
        running: impl Fn() -> bool,
    ) -> Result<AskAnswer, ApprovalError> {
        if !running() || self.is_ending(run_id) {
            return Err(ApprovalError::RunEnding);
        }
        let id = format!(
            "apr_{}",
            airlock_vault::random_hex::<8>().map_err(ApprovalError::Id)?
        );
        let wait = Duration::from_millis(ask.wait_ms.min(MAX_WAIT_MS));
        let deadline = tokio::time::Instant::now() + wait;
        let expires_at = now_ms().saturating_add(i64::try_from(wait.as_millis()).unwrap_or(0));
        let d = ask.request.bounded();
        // Registered before it is stored: no answer can come before. The
        // run's `approval.pending` is stored with the hold (one
        // transaction), and so are the webhook deliveries it owes.
        let registered = self.register(&id, run_id);
        let rule = d.rule.clone();
        let new = NewApproval {
            id: &id,
            run_id,
            org_id,
            method: &d.method,
            host: &d.host,
            path: &d.path,
            integration: d.integration.as_deref(),
            rule: &d.rule,
            expires_at,
        };
        let pending = RunEvent::ApprovalPending {
            at: now_ms(),
            approval: Pending {
                id: id.clone(),
                request: d.clone(),
                expires_at,
            },
        };
        let payload = serde_json::to_string(&pending).unwrap_or_else(|_| "{}".into());
        let event = NewEvent {
            run_id,
            at: pending.at(),
            kind: pending.kind(),
            payload: &payload,
        };
        store
            .insert_approval(&new, Some(&event))
            .await
            .map_err(|e| match e {
                StoreError::ApprovalsExhausted { limit, .. } => ApprovalError::Exhausted { limit },
                e => ApprovalError::Store(e),
            })?;
        let state = loop {
            if let Some(row) = store.approval_state(&id).await?
                && let Some(o) = outcome(row.state)
            {
                return Ok(AskAnswer {
                    id,
                    outcome: o,
                    answered_by: row.answered_by,
                });
            }
            let over = tokio::time::Instant::now() >= deadline;
            if !running() {
                break ApprovalState::Dropped;
            }
            if over {
                break ApprovalState::Expired;
            }
            tokio::select! {
                () = registered.wake.notified() => {}
                () = tokio::time::sleep(POLL) => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        };
        settle(store, (org_id, run_id), &id, &rule, state, None).await?;
        // Settled here, or by an answer that won the race: the stored state.
        let row = store.approval_state(&id).await?;
        let (o, by) = row
            .and_then(|r| Some((outcome(r.state)?, r.answered_by)))
            .unwrap_or((Outcome::Expired, None));
        Ok(AskAnswer {
            id,
            outcome: o,
            answered_by: by,
        })
    }

    /// A person's answer to pending approval `id` of `run_id` in `org_id`
    /// (by the key `by`), and the waiting sidecar woken on this replica.
    /// Another organization's approval is [`ApprovalError::NotFound`]; one
    /// no longer pending is [`ApprovalError::Settled`].
    pub async fn answer(
        &self,
        store: &Store,
        (org_id, run_id, id): (&str, &str, &str),
        decision: Decision,
        by: &str,
    ) -> Result<ApprovalRow, ApprovalError> {
        let row = store
            .get_approval(org_id, run_id, id)
            .await?
            .ok_or(ApprovalError::NotFound)?;
        if row.state != ApprovalState::Pending {
            return Err(ApprovalError::Settled(row.state.as_str()));
        }
        let settled = settle(
            store,
            (org_id, run_id),
            id,
            &row.rule,
            decision.state(),
            Some(by),
        )
        .await?;
        self.wake(|aid, _| aid == id);
        let now = store
            .get_approval(org_id, run_id, id)
            .await?
            .ok_or(ApprovalError::NotFound)?;
        if !settled {
            return Err(ApprovalError::Settled(now.state.as_str()));
        }
        Ok(now)
    }

    /// Forgets a run whose grant is gone (nothing of it can ask any more).
    pub fn forget(&self, run_id: &str) {
        self.ending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(run_id);
    }

    fn is_ending(&self, run_id: &str) -> bool {
        self.ending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(run_id)
    }

    /// The run is being torn down (by this replica): from now on it asks
    /// no one ([`ApprovalError::RunEnding`]) until [`Approvals::forget`],
    /// and what it holds is dropped ([`Approvals::drop_run`]).
    pub async fn run_ending(&self, store: &Store, run_id: &str) -> Result<(), StoreError> {
        self.ending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(run_id.to_owned());
        self.drop_run(store, run_id).await
    }

    /// Drops every pending approval of a run that ended (those whose wait
    /// is gone; a live wait drops its own), and wakes this replica's waits.
    pub async fn drop_run(&self, store: &Store, run_id: &str) -> Result<(), StoreError> {
        self.run_ended(run_id);
        for row in store.list_pending_approvals(run_id).await? {
            settle(
                store,
                (&row.org_id, run_id),
                &row.id,
                &row.rule,
                ApprovalState::Dropped,
                None,
            )
            .await?;
        }
        Ok(())
    }
}

/// Settles `id` as `state` if it is still pending, and records it in the
/// run's events and its organization's `approval.settled` deliveries;
/// whether this call settled it.
async fn settle(
    store: &Store,
    (org_id, run_id): (&str, &str),
    id: &str,
    rule: &str,
    state: ApprovalState,
    by: Option<&str>,
) -> Result<bool, StoreError> {
    // The settled deliveries are queued with the settlement itself.
    let announce = outcome(state).map(|_| (org_id, run_id, now_ms()));
    if !store.settle_approval(id, state, by, announce).await? {
        return Ok(false);
    }
    if let Some(o) = outcome(state) {
        let e = RunEvent::ApprovalSettled {
            at: now_ms(),
            id: id.to_owned(),
            rule: rule.to_owned(),
            outcome: o,
            answered_by: by.map(str::to_owned),
        };
        append(store, run_id, &e).await?;
    }
    Ok(true)
}

async fn append(store: &Store, run_id: &str, e: &RunEvent) -> Result<(), StoreError> {
    let payload = serde_json::to_string(e).unwrap_or_else(|_| "{}".into());
    store
        .append_event(&NewEvent {
            run_id,
            at: e.at(),
            kind: e.kind(),
            payload: &payload,
        })
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use airlock_platform_api::approval::Description;
    use airlock_store::{LOCAL_ORG, NewRun, RunStatus, StoreOptions};

    use super::*;

    async fn store_with(runs: &[&str]) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_sqlite(&dir.path().join("airlock.db"), &StoreOptions::default())
            .await
            .unwrap();
        for id in runs {
            store
                .insert_run(&NewRun {
                    org: LOCAL_ORG,
                    owner: None,
                    id,
                    agent: "a",
                    backend: "test",
                    model: None,
                    status: RunStatus::Running,
                    created_at: None,
                })
                .await
                .unwrap();
        }
        (dir, store)
    }

    fn ask() -> AskRequest {
        AskRequest {
            request: Description {
                method: "POST".into(),
                host: "api.test".into(),
                path: "/x".into(),
                integration: None,
                rule: "ask".into(),
            },
            wait_ms: 50,
        }
    }

    /// Once a run's held requests are dropped for its teardown, what its
    /// sandbox still holds asks no one: refused at once, neither stored
    /// nor announced. Another run asks as before; a run forgotten (its
    /// grant gone) is no longer remembered.
    #[tokio::test]
    async fn a_run_being_torn_down_asks_no_one() {
        let (_dir, store) = store_with(&["r_end", "r_live"]).await;
        let a = Approvals::default();
        a.run_ending(&store, "r_end").await.unwrap();
        let asked = a.ask(&store, ("r_end", LOCAL_ORG), ask(), || true).await;
        assert!(matches!(asked, Err(ApprovalError::RunEnding)), "{asked:?}");
        assert!(
            store
                .list_approvals(LOCAL_ORG, "r_end")
                .await
                .unwrap()
                .is_empty()
        );
        let announced = store
            .events_of_kind("r_end", airlock_store::APPROVAL_PENDING_EVENT, 10)
            .await
            .unwrap();
        assert!(announced.is_empty(), "{announced:?}");
        // A run whose grant is gone asks no one either.
        let gone = a.ask(&store, ("r_live", LOCAL_ORG), ask(), || false).await;
        assert!(matches!(gone, Err(ApprovalError::RunEnding)), "{gone:?}");
        // A live run's hold is stored and waits (here: out of time).
        let live = a
            .ask(&store, ("r_live", LOCAL_ORG), ask(), || true)
            .await
            .unwrap();
        assert_eq!(live.outcome, Outcome::Expired);
        assert_eq!(
            store
                .list_approvals(LOCAL_ORG, "r_live")
                .await
                .unwrap()
                .len(),
            1
        );
        a.forget("r_end");
        assert!(!a.is_ending("r_end"));
        // Dropping what an ended run still holds (the API does, for a run
        // whose replica died) marks nothing: the marks stay bounded by the
        // runs this replica is tearing down.
        a.drop_run(&store, "r_live").await.unwrap();
        assert!(!a.is_ending("r_live"));
        assert!(a.ending.lock().unwrap().is_empty());
    }
}

//! The outbox: a run's end and the webhook deliveries it owes, written in
//! one transaction ([`Store::finish_run`], the leader's sweep, a queued
//! run's cancel), whoever ends the run, so a crash never keeps one without
//! the other. A run event has at most one delivery per webhook (one id,
//! whoever queues it): its `event_key` is unique.
//!
//! Bounds: at most one delivery per webhook per run event, and an
//! organization's webhooks are capped by its quota (`ORG_MAX_WEBHOOKS`);
//! settled deliveries go with the retention sweep
//! (`RETENTION_DELIVERIES_DAYS`).

use crate::{RunEnd, RunStatus, Store, StoreError};

/// The webhook event a run in `status` is (`None` while queued).
pub fn run_event(status: RunStatus) -> Option<&'static str> {
    Some(match status {
        RunStatus::Running => "run.started",
        RunStatus::Succeeded => "run.succeeded",
        RunStatus::Failed => "run.failed",
        RunStatus::Cancelled => "run.cancelled",
        RunStatus::TimedOut => "run.timed_out",
        RunStatus::Queued => return None,
    })
}

/// Ends run `$id` with `$end` on the transaction `$tx`, and queues its
/// deliveries ([`queue_deliveries_in`]). `Ok(false)` when the run had
/// already ended (nothing is queued then).
macro_rules! end_run_in {
    ($self:expr, $tx:ident, $id:expr, $end:expr) => {
        async {
            let id: &str = $id;
            let end: &$crate::RunEnd<'_> = $end;
            let n = sqlx::query(
                "UPDATE runs SET status = $2, exit_code = $3, error = $4, ended_at = $5 \
                 WHERE id = $1 AND ended_at IS NULL",
            )
            .bind(id)
            .bind(end.status.as_str())
            .bind(end.exit_code)
            .bind(end.error)
            .bind(end.at)
            .execute(&mut *$tx)
            .await
            .map_err(|e| $self.err(e))?
            .rows_affected();
            if n > 0 {
                $crate::outbox::queue_deliveries_in!($self, $tx, id, end.status, end.at).await?;
            }
            Ok::<bool, $crate::StoreError>(n > 0)
        }
    };
}
pub(crate) use end_run_in;

/// Queues, on the transaction `$tx`, a delivery of run `$id`'s event (the
/// one `$status` is) for each of its organization's webhooks that
/// subscribed to it, its body rendered when first sent. Written once, for
/// both backends.
macro_rules! queue_deliveries_in {
    ($self:expr, $tx:ident, $id:expr, $status:expr, $at:expr) => {
        async {
            let id: &str = $id;
            let at: i64 = $at;
            let Some(event) = $crate::outbox::run_event($status) else {
                return Ok::<(), $crate::StoreError>(());
            };
            let org: String = sqlx::query_scalar("SELECT org_id FROM runs WHERE id = $1")
                .bind(id)
                .fetch_one(&mut *$tx)
                .await
                .map_err(|e| $self.err(e))?;
            $crate::outbox::queue_for_hooks_in!(
                $self,
                $tx,
                &org,
                id,
                event,
                at,
                &$crate::outbox::event_key(id, event)
            )
            .await?;
            Ok(())
        }
    };
}
pub(crate) use queue_deliveries_in;

/// Queues, on the transaction `$tx`, one delivery of `$event` (about run
/// `$run`, made one of its kind by `$key`) for each of organization
/// `$org`'s webhooks that subscribed to it, its body rendered when first
/// sent.
macro_rules! queue_for_hooks_in {
    ($self:expr, $tx:ident, $org:expr, $run:expr, $event:expr, $at:expr, $key:expr) => {
        async {
            let (org, run, event, at, key): (&str, &str, &str, i64, &str) =
                ($org, $run, $event, $at, $key);
            let hooks: Vec<(String, String)> =
                sqlx::query_as("SELECT id, events FROM webhooks WHERE org_id = $1")
                    .bind(org)
                    .fetch_all(&mut *$tx)
                    .await
                    .map_err(|e| $self.err(e))?;
            for (hook, events) in hooks {
                if !$crate::outbox::subscribes(&events, event) {
                    continue;
                }
                sqlx::query(
                    "INSERT INTO webhook_deliveries (id, webhook_id, org_id, run_id, event, \
                     payload, state, attempts, next_attempt_at, created_at, event_key) \
                     VALUES ($1, $2, $3, $4, $5, '', 'pending', 0, $6, $6, $7) \
                     ON CONFLICT DO NOTHING",
                )
                .bind($crate::outbox::new_delivery_id()?)
                .bind(&hook)
                .bind(org)
                .bind(run)
                .bind(event)
                .bind(at)
                .bind(key)
                .execute(&mut *$tx)
                .await
                .map_err(|e| $self.err(e))?;
            }
            Ok::<(), $crate::StoreError>(())
        }
    };
}
pub(crate) use queue_for_hooks_in;

/// Whether a webhook's `events` (a JSON array of names) holds `event`.
pub(crate) fn subscribes(events: &str, event: &str) -> bool {
    serde_json::from_str::<Vec<String>>(events).is_ok_and(|v| v.iter().any(|e| e == event))
}

/// What makes a delivery one of its kind: one per webhook per run event.
pub(crate) fn event_key(run_id: &str, event: &str) -> String {
    format!("{run_id}:{event}")
}

/// A fresh delivery id (`dlv_` and 16 hex digits).
pub fn new_delivery_id() -> Result<String, StoreError> {
    airlock_vault::random_hex::<8>()
        .map(|h| format!("dlv_{h}"))
        .map_err(|_| StoreError::Invalid {
            what: "delivery id",
            reason: "the system's random source failed",
        })
}

impl Store {
    /// Ends a run and queues the deliveries its end owes, in one
    /// transaction (the outbox). `false` if it had already
    /// ended.
    pub(crate) async fn end_run(&self, id: &str, end: &RunEnd<'_>) -> Result<bool, StoreError> {
        on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            let ended = end_run_in!(self, tx, id, end).await?;
            tx.commit().await.map_err(|e| self.err(e))?;
            Ok(ended)
        })
    }
}

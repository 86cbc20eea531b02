//! The webhook deliveries an approval owes (docs/egress.md, "Human
//! approval"): `approval.pending` when a request is held,
//! `approval.settled` when it leaves `pending`.
//!
//! Contracts: one delivery per webhook per approval and event, whoever
//! queues it (its `event_key` is `<event>:<approval id>`, unique per
//! webhook); a delivery is queued only for the approval's organization's
//! webhooks that subscribed to its event; its body is rendered when first
//! sent from the stored approval ([`Store::delivery_approval`]), which
//! holds what the request would do and never a credential, a header, a
//! query or a body.
//!
//! Bounds: at most two deliveries per webhook per approval, so at most
//! `2 × MAX_APPROVALS_PER_RUN` per webhook per run; settled deliveries go
//! with the retention sweep (`RETENTION_DELIVERIES_DAYS`).

use crate::outbox::{new_delivery_id, subscribes};
use crate::{ApprovalRow, Store, StoreError};

/// The webhook event a held request is.
pub const APPROVAL_PENDING_EVENT: &str = "approval.pending";

/// The webhook event an approval leaving `pending` is.
pub const APPROVAL_SETTLED_EVENT: &str = "approval.settled";

/// What makes a delivery of `event` about approval `id` one of its kind.
fn approval_key(event: &str, id: &str) -> String {
    format!("{event}:{id}")
}

/// One delivery's row (`ON CONFLICT DO NOTHING`: queueing is idempotent).
pub(crate) const INSERT_DELIVERY: &str = "INSERT INTO webhook_deliveries (id, webhook_id, \
     org_id, run_id, event, payload, state, attempts, next_attempt_at, created_at, event_key) \
     VALUES ($1, $2, $3, $4, $5, '', 'pending', 0, $6, $6, $7) ON CONFLICT DO NOTHING";

/// Queues what an [`Owed`] holds within the transaction `$tx` (its caller's
/// error type is `sqlx::Error`), for organization `$org`'s run `$run` at `$at`.
macro_rules! queue_owed {
    ($tx:expr, $owed:expr, $org:expr, $run:expr, $at:expr) => {
        for (dlv, hook) in &$owed.hooks {
            sqlx::query($crate::approval_hooks::INSERT_DELIVERY)
                .bind(dlv)
                .bind(hook)
                .bind($org)
                .bind($run)
                .bind($owed.event)
                .bind($at)
                .bind(&$owed.key)
                .execute(&mut *$tx)
                .await?;
        }
    };
}
pub(crate) use queue_owed;

/// The deliveries an approval's `event` owes, drawn before the write that
/// queues them: a fresh delivery id for each of the organization's
/// webhooks subscribed to it, and the key that makes each one of its kind.
pub(crate) struct Owed {
    pub event: &'static str,
    pub key: String,
    /// (delivery id, webhook id)
    pub hooks: Vec<(String, String)>,
}

impl Store {
    /// What approval `approval_id`'s `event` owes organization `org_id`'s
    /// webhooks (read before the transaction that queues it, so that
    /// transaction's first statement is its write).
    pub(crate) async fn owed_approval_deliveries(
        &self,
        org_id: &str,
        approval_id: &str,
        event: &'static str,
    ) -> Result<Owed, StoreError> {
        let hooks: Vec<(String, String)> = on_pool!(self, p => sqlx::query_as(
            "SELECT id, events FROM webhooks WHERE org_id = $1",
        )
        .bind(org_id)
        .fetch_all(p)
        .await
        .map_err(|e| self.err(e))?);
        let hooks = hooks
            .into_iter()
            .filter(|(_, events)| subscribes(events, event))
            .map(|(hook, _)| Ok((new_delivery_id()?, hook)))
            .collect::<Result<_, StoreError>>()?;
        Ok(Owed {
            event,
            key: approval_key(event, approval_id),
            hooks,
        })
    }
}

impl Store {
    /// Queues a delivery of `event` (one of the approval events) about
    /// approval `approval_id` of run `run_id` for each of organization
    /// `org_id`'s webhooks that subscribed to it; how many were new.
    /// Each insert stands alone (no transaction to upgrade, which SQLite
    /// refuses under a concurrent writer) and is idempotent, so queueing
    /// again after a failure adds only what is missing.
    pub async fn queue_approval_deliveries(
        &self,
        (org_id, run_id, approval_id): (&str, &str, &str),
        event: &'static str,
        at: i64,
    ) -> Result<usize, StoreError> {
        let key = approval_key(event, approval_id);
        on_pool!(self, p => {
            let hooks: Vec<(String, String)> =
                sqlx::query_as("SELECT id, events FROM webhooks WHERE org_id = $1")
                    .bind(org_id)
                    .fetch_all(p)
                    .await
                    .map_err(|e| self.err(e))?;
            let mut new = 0;
            for (hook, events) in hooks {
                if !subscribes(&events, event) {
                    continue;
                }
                let n = sqlx::query(INSERT_DELIVERY)
                .bind(new_delivery_id()?)
                .bind(&hook)
                .bind(org_id)
                .bind(run_id)
                .bind(event)
                .bind(at)
                .bind(&key)
                .execute(p)
                .await
                .map_err(|e| self.run_fk(e, run_id))?
                .rows_affected();
                new += usize::from(n > 0);
            }
            Ok(new)
        })
    }

    /// The approval a delivery of organization `org` is about (`None`: no
    /// such delivery, not an approval event's, or the approval is gone).
    pub async fn delivery_approval(
        &self,
        org: &str,
        delivery_id: &str,
    ) -> Result<Option<ApprovalRow>, StoreError> {
        let row: Option<(String, String, Option<String>)> = on_pool!(self, p => sqlx::query_as(
            "SELECT run_id, event, event_key FROM webhook_deliveries WHERE org_id = $1 AND id = $2",
        )
        .bind(org)
        .bind(delivery_id)
        .fetch_optional(p)
        .await
        .map_err(|e| self.err(e))?);
        let Some((run, event, Some(key))) = row else {
            return Ok(None);
        };
        let Some(id) = key
            .strip_prefix(event.as_str())
            .and_then(|k| k.strip_prefix(':'))
        else {
            return Ok(None);
        };
        self.get_approval(org, &run, id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_names_the_event_and_the_approval() {
        assert_eq!(
            approval_key(APPROVAL_PENDING_EVENT, "apr_1"),
            "approval.pending:apr_1"
        );
        assert_ne!(
            approval_key(APPROVAL_PENDING_EVENT, "apr_1"),
            approval_key(APPROVAL_SETTLED_EVENT, "apr_1")
        );
    }
}

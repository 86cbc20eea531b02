//! `webhook_deliveries`: one event to send to one webhook, and how its
//! sending went (claims, attempts, the outcome).
//!
//! Contracts: a delivery's body is set once, so every retry sends the same
//! bytes; a claim holds a delivery for one replica for a while (a claimer
//! that dies lets it fall due again); claims are taken fairly, one
//! organization's backlog never filling a batch while another's is due.
//!
//! Bounds: at most one delivery per webhook per run event (see
//! `outbox.rs`); settled deliveries go with the retention sweep
//! (`RETENTION_DELIVERIES_DAYS`).

use sqlx::Row as _;

use crate::outbox::event_key;
use crate::{Store, StoreError, now_ms};

/// One event to deliver to one webhook, and how its delivery went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRow {
    pub id: String,
    pub webhook_id: String,
    pub org_id: String,
    pub run_id: String,
    pub event: String,
    pub payload: String,
    /// `pending`, `delivered` or `failed` (gave up).
    pub state: String,
    pub attempts: i64,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub next_attempt_at: i64,
    pub created_at: i64,
    pub delivered_at: Option<i64>,
}

/// How one delivery attempt ended.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryAttempt<'a> {
    pub status: Option<i64>,
    pub error: Option<&'a str>,
    /// Delivered (a 2xx).
    pub delivered: bool,
    /// When to try again (`None`: give up, unless delivered).
    pub retry_at: Option<i64>,
}

macro_rules! delivery_row {
    ($r:expr, $s:expr) => {
        DeliveryRow {
            id: $r.try_get("id").map_err(|e| $s.err(e))?,
            webhook_id: $r.try_get("webhook_id").map_err(|e| $s.err(e))?,
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            run_id: $r.try_get("run_id").map_err(|e| $s.err(e))?,
            event: $r.try_get("event").map_err(|e| $s.err(e))?,
            payload: $r.try_get("payload").map_err(|e| $s.err(e))?,
            state: $r.try_get("state").map_err(|e| $s.err(e))?,
            attempts: $r.try_get("attempts").map_err(|e| $s.err(e))?,
            last_status: $r.try_get("last_status").map_err(|e| $s.err(e))?,
            last_error: $r.try_get("last_error").map_err(|e| $s.err(e))?,
            next_attempt_at: $r.try_get("next_attempt_at").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
            delivered_at: $r.try_get("delivered_at").map_err(|e| $s.err(e))?,
        }
    };
}

macro_rules! delivery_columns {
    () => {
        "id, webhook_id, org_id, run_id, event, payload, state, attempts, \
         last_status, last_error, next_attempt_at, created_at, delivered_at"
    };
}

impl Store {
    /// Queues one delivery (due at `next_attempt_at`), unless this run
    /// event already has one for this webhook: `false` then (one delivery
    /// id per event, whoever queues it).
    pub async fn enqueue_delivery(&self, d: &DeliveryRow) -> Result<bool, StoreError> {
        let n = on_pool!(self, p => sqlx::query(
            "INSERT INTO webhook_deliveries (id, webhook_id, org_id, run_id, event, payload, state, \
             attempts, next_attempt_at, created_at, event_key) \
             VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, $7, $8, $9) ON CONFLICT DO NOTHING",
        )
        .bind(&d.id)
        .bind(&d.webhook_id)
        .bind(&d.org_id)
        .bind(&d.run_id)
        .bind(&d.event)
        .bind(&d.payload)
        .bind(d.next_attempt_at)
        .bind(d.created_at)
        .bind(event_key(&d.run_id, &d.event))
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        Ok(n > 0)
    }

    /// Sets the body of a delivery queued by a run's end (an outbox row is
    /// queued without one), once: every retry sends the same bytes.
    /// Returns the body the delivery has now.
    pub async fn render_delivery(&self, id: &str, payload: &str) -> Result<String, StoreError> {
        on_pool!(self, p => {
            sqlx::query("UPDATE webhook_deliveries SET payload = $2 WHERE id = $1 AND payload = ''")
                .bind(id)
                .bind(payload)
                .execute(p)
                .await
                .map_err(|e| self.err(e))?;
            sqlx::query_scalar("SELECT payload FROM webhook_deliveries WHERE id = $1")
                .bind(id)
                .fetch_one(p)
                .await
                .map_err(|e| self.err(e))
        })
    }

    /// Releases every claim `claimer` holds on a pending delivery (a
    /// replica that stops): another replica may send them at once.
    pub async fn release_delivery_claims(&self, claimer: &str) -> Result<u64, StoreError> {
        on_pool!(self, p => sqlx::query(
            "UPDATE webhook_deliveries SET claimed_by = NULL, claimed_until = NULL \
             WHERE claimed_by = $1 AND state = 'pending'",
        )
        .bind(claimer)
        .execute(p)
        .await
        .map(|r| r.rows_affected())
        .map_err(|e| self.err(e)))
    }

    /// Claims up to `limit` pending deliveries that are due, for `claimer`,
    /// for `hold_ms` (another replica does not take them meanwhile; if the
    /// claimer dies they are due again when the hold ends). No fairness:
    /// [`Store::claim_due_deliveries_fairly`] with no bound per organization.
    pub async fn claim_due_deliveries(
        &self,
        claimer: &str,
        hold_ms: i64,
        limit: i64,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        self.claim_due_deliveries_fairly(claimer, hold_ms, limit, |_| limit)
            .await
    }

    /// As [`Store::claim_due_deliveries`], taken fairly: organizations in
    /// turn (each one's oldest due first, then each one's second, …), and
    /// at most `room(org)` of one organization's (the claimer's free share
    /// for it). One organization's backlog never fills a batch while
    /// another's delivery is due.
    pub async fn claim_due_deliveries_fairly(
        &self,
        claimer: &str,
        hold_ms: i64,
        limit: i64,
        room: impl Fn(&str) -> i64,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let now = now_ms();
        let candidates: Vec<(String, String)> = on_pool!(self, p => sqlx::query_as(
            "SELECT id, org_id FROM (SELECT id, org_id, next_attempt_at, \
             ROW_NUMBER() OVER (PARTITION BY org_id ORDER BY next_attempt_at, id) AS turn \
             FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at <= $1 \
             AND (claimed_until IS NULL OR claimed_until < $1)) due \
             WHERE turn <= $2 ORDER BY turn, next_attempt_at, id LIMIT $3",
        )
        .bind(now)
        .bind(limit)
        .bind(limit.saturating_mul(4))
        .fetch_all(p)
        .await
        .map_err(|e| self.err(e))?);
        let mut taken: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
        let mut ids = Vec::new();
        for (id, org) in &candidates {
            if i64::try_from(ids.len()).unwrap_or(i64::MAX) >= limit {
                break;
            }
            let t = taken.entry(org.as_str()).or_default();
            if *t < room(org) {
                *t += 1;
                ids.push(id.clone());
            }
        }
        let mut out = Vec::new();
        for id in ids {
            let n = on_pool!(self, p => sqlx::query(
                "UPDATE webhook_deliveries SET claimed_by = $2, claimed_until = $3 \
                 WHERE id = $1 AND state = 'pending' AND (claimed_until IS NULL OR claimed_until < $4)",
            )
            .bind(&id)
            .bind(claimer)
            .bind(now + hold_ms)
            .bind(now)
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
            if n == 0 {
                continue;
            }
            let row = on_pool!(self, p => {
                let r = sqlx::query(concat!("SELECT ", delivery_columns!(), " FROM webhook_deliveries WHERE id = $1"))
                    .bind(&id)
                    .fetch_one(p)
                    .await
                    .map_err(|e| self.err(e))?;
                delivery_row!(r, self)
            });
            out.push(row);
        }
        Ok(out)
    }

    /// Records one attempt's outcome and releases the claim.
    pub async fn record_delivery_attempt(
        &self,
        id: &str,
        a: &DeliveryAttempt<'_>,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let state = if a.delivered {
            "delivered"
        } else if a.retry_at.is_some() {
            "pending"
        } else {
            "failed"
        };
        on_pool!(self, p => sqlx::query(
            "UPDATE webhook_deliveries SET attempts = attempts + 1, state = $2, last_status = $3, \
             last_error = $4, next_attempt_at = $5, delivered_at = $6, claimed_by = NULL, \
             claimed_until = NULL WHERE id = $1",
        )
        .bind(id)
        .bind(state)
        .bind(a.status)
        .bind(a.error)
        .bind(a.retry_at.unwrap_or(now))
        .bind(a.delivered.then_some(now))
        .execute(p)
        .await
        .map(|_| ())
        .map_err(|e| self.err(e))?);
        Ok(())
    }

    /// One of `org`'s webhook's deliveries, newest first, at most `limit`;
    /// with `before` (a page's last `(created_at, id)`), those after it in
    /// that order (the next page).
    pub async fn list_deliveries(
        &self,
        org: &str,
        webhook_id: &str,
        limit: i64,
        before: Option<(i64, &str)>,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let (before_at, before_id) = match before {
            Some((at, id)) => (at, Some(id)),
            None => (i64::MAX, None),
        };
        on_pool!(self, p => {
            let rows = sqlx::query(concat!(
                "SELECT ", delivery_columns!(), " FROM webhook_deliveries \
                 WHERE org_id = $1 AND webhook_id = $2 \
                 AND (created_at < $4 OR (created_at = $4 AND $5 IS NOT NULL AND id < $5)) \
                 ORDER BY created_at DESC, id DESC LIMIT $3"
            ))
            .bind(org)
            .bind(webhook_id)
            .bind(limit)
            .bind(before_at)
            .bind(before_id)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(delivery_row!(r, self))).collect()
        })
    }
}

//! `webhooks`: each organization's webhooks, the events they subscribe to
//! and their signing secret (as a `v1:` envelope).
//!
//! Contract: every read or change names the organization.
//!
//! Bounds: an organization's webhooks are capped by its quota
//! (`ORG_MAX_WEBHOOKS`), counted in the insert's own statement.

use sqlx::Row as _;

use crate::{Store, StoreError};

/// A webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookRow {
    pub id: String,
    pub org_id: String,
    pub url: String,
    /// JSON array of event names.
    pub events: String,
    /// Its signing secret, as a `v1:` envelope.
    pub secret_envelope: String,
    pub created_at: i64,
}

macro_rules! webhook_row {
    ($r:expr, $s:expr) => {
        WebhookRow {
            id: $r.try_get("id").map_err(|e| $s.err(e))?,
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            url: $r.try_get("url").map_err(|e| $s.err(e))?,
            events: $r.try_get("events").map_err(|e| $s.err(e))?,
            secret_envelope: $r.try_get("secret_envelope").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
        }
    };
}

impl Store {
    /// Stores a webhook, unless its organization already has `max`
    /// ([`StoreError::QuotaExceeded`]).
    pub async fn create_webhook(&self, w: &WebhookRow, max: Option<u64>) -> Result<(), StoreError> {
        self.insert_within_quota(
            "webhooks",
            &w.org_id,
            "INSERT INTO webhooks (id, org_id, url, events, secret_envelope, created_at) \
             SELECT $1, $2, $3, $4, $5, $6 WHERE (SELECT COUNT(*) FROM webhooks \
             WHERE org_id = $2) < $7",
            &[&w.id, &w.org_id, &w.url, &w.events, &w.secret_envelope],
            w.created_at,
            max,
        )
        .await
    }

    pub async fn list_webhooks(&self, org: &str) -> Result<Vec<WebhookRow>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, org_id, url, events, secret_envelope, created_at FROM webhooks \
                 WHERE org_id = $1 ORDER BY created_at, id",
            )
            .bind(org)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(webhook_row!(r, self))).collect()
        })
    }

    pub async fn get_webhook(&self, org: &str, id: &str) -> Result<Option<WebhookRow>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT id, org_id, url, events, secret_envelope, created_at FROM webhooks \
                 WHERE org_id = $1 AND id = $2",
            )
            .bind(org)
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| -> Result<WebhookRow, StoreError> { Ok(webhook_row!(r, self)) }).transpose()
        })
    }

    pub async fn delete_webhook(&self, org: &str, id: &str) -> Result<bool, StoreError> {
        let n = on_pool!(self, p => sqlx::query("DELETE FROM webhooks WHERE org_id = $1 AND id = $2")
            .bind(org)
            .bind(id)
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
        Ok(n > 0)
    }
}

//! `api_keys`: each organization's API keys, as the keyed hash of their
//! secret part (never the key).
//!
//! Contracts: a key is found by its id (the key's public part) from any
//! organization, for authentication to compare the hash; every other read or
//! change names the organization. A revoked key stays revoked.
//!
//! Bounds: an organization's keys not revoked are capped by its quota
//! (`ORG_MAX_API_KEYS`), counted in the insert's own statement. Revoked keys
//! are kept (no sweep).

use sqlx::Row as _;

use crate::{Store, StoreError, now_ms, validate_name};

/// An API key as stored: its hash, never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRow {
    pub id: String,
    pub org_id: String,
    pub name: String,
    /// Lowercase hex of the keyed hash of the key's secret part.
    pub hash: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

macro_rules! api_key_row {
    ($r:expr, $s:expr) => {
        ApiKeyRow {
            id: $r.try_get("id").map_err(|e| $s.err(e))?,
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            name: $r.try_get("name").map_err(|e| $s.err(e))?,
            hash: $r.try_get("hash").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
            revoked_at: $r.try_get("revoked_at").map_err(|e| $s.err(e))?,
        }
    };
}

/// Revoked keys kept per organization (the newest).
pub const MAX_REVOKED_KEYS: i64 = 100;

impl Store {
    /// Stores a new API key of `org`, unless `org` already has `max` keys
    /// not revoked ([`StoreError::QuotaExceeded`]).
    pub async fn insert_api_key(
        &self,
        id: &str,
        org: &str,
        name: &str,
        hash: &str,
        max: Option<u64>,
    ) -> Result<ApiKeyRow, StoreError> {
        validate_name("API key name", name)?;
        let now = now_ms();
        self.insert_within_quota(
            "API keys",
            org,
            "INSERT INTO api_keys (id, org_id, name, hash, created_at) \
             SELECT $1, $2, $3, $4, $5 WHERE (SELECT COUNT(*) FROM api_keys \
             WHERE org_id = $2 AND revoked_at IS NULL) < $6",
            &[id, org, name, hash],
            now,
            max,
        )
        .await?;
        Ok(ApiKeyRow {
            id: id.to_owned(),
            org_id: org.to_owned(),
            name: name.to_owned(),
            hash: hash.to_owned(),
            created_at: now,
            revoked_at: None,
        })
    }

    /// A key by its id (the public part of the key), any organization's:
    /// what authentication looks up before it compares the hash.
    pub async fn get_api_key(&self, id: &str) -> Result<Option<ApiKeyRow>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT id, org_id, name, hash, created_at, revoked_at FROM api_keys WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| -> Result<ApiKeyRow, StoreError> { Ok(api_key_row!(r, self)) })
                .transpose()
        })
    }

    pub async fn list_api_keys(&self, org: &str) -> Result<Vec<ApiKeyRow>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, org_id, name, hash, created_at, revoked_at FROM api_keys \
                 WHERE org_id = $1 ORDER BY created_at, id",
            )
            .bind(org)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(api_key_row!(r, self))).collect()
        })
    }

    /// Revokes one of `org`'s keys; `false` when it has no such live key.
    pub async fn revoke_api_key(&self, org: &str, id: &str) -> Result<bool, StoreError> {
        on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            let n = sqlx::query(
                "UPDATE api_keys SET revoked_at = $3 WHERE org_id = $1 AND id = $2 AND revoked_at IS NULL",
            )
            .bind(org)
            .bind(id)
            .bind(now_ms())
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected();
            // Revoked keys are kept for the record, the newest
            // MAX_REVOKED_KEYS of them: an older one is forgotten (it
            // authenticates no more than a revoked one).
            sqlx::query(
                "DELETE FROM api_keys WHERE org_id = $1 AND revoked_at IS NOT NULL AND id NOT IN \
                 (SELECT id FROM api_keys WHERE org_id = $1 AND revoked_at IS NOT NULL \
                  ORDER BY revoked_at DESC, id DESC LIMIT $2)",
            )
            .bind(org)
            .bind(MAX_REVOKED_KEYS)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            tx.commit().await.map_err(|e| self.err(e))?;
            Ok(n > 0)
        })
    }
}

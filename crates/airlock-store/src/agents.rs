//! `agents`: each organization's registered agents, their manifest and the
//! files of their directory.
//!
//! Contract: one agent per `(org_id, name)`; registering it again replaces
//! it.
//!
//! Bounds: each row is bounded by the API's request body limit; an
//! organization's count of agents has no cap.

use sqlx::Row as _;

use crate::{Store, StoreError, now_ms, validate_name};

/// A registered agent: its manifest and the files of its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRow {
    pub org_id: String,
    pub name: String,
    /// The manifest's TOML text.
    pub manifest: String,
    /// JSON object: relative path → file content (UTF-8 text).
    pub files: String,
    pub created_at: i64,
    pub updated_at: i64,
}

macro_rules! agent_row {
    ($r:expr, $s:expr) => {
        AgentRow {
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            name: $r.try_get("name").map_err(|e| $s.err(e))?,
            manifest: $r.try_get("manifest").map_err(|e| $s.err(e))?,
            files: $r.try_get("files").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
            updated_at: $r.try_get("updated_at").map_err(|e| $s.err(e))?,
        }
    };
}

impl Store {
    /// Registers (or replaces) one of `org`'s agents.
    /// Stores agent `name` of `org`, replacing the one of that name; a new
    /// name is refused when `org` already has `max` agents
    /// ([`StoreError::QuotaExceeded`]; the operator's own commands pass `None`).
    pub async fn put_agent(
        &self,
        org: &str,
        name: &str,
        manifest: &str,
        files: &str,
        max: Option<u64>,
    ) -> Result<AgentRow, StoreError> {
        validate_name("agent name", name)?;
        self.insert_within_quota(
            "agents",
            org,
            "INSERT INTO agents (org_id, name, manifest, files, created_at, updated_at) \
             SELECT $1, $2, $3, $4, $5, $5 WHERE EXISTS (SELECT 1 FROM agents \
             WHERE org_id = $1 AND name = $2) \
             OR (SELECT COUNT(*) FROM agents WHERE org_id = $1) < $6 \
             ON CONFLICT (org_id, name) DO UPDATE SET manifest = excluded.manifest, \
             files = excluded.files, updated_at = excluded.updated_at",
            &[org, name, manifest, files],
            now_ms(),
            max,
        )
        .await?;
        self.get_agent(org, name)
            .await?
            .ok_or_else(|| StoreError::Vanished {
                what: "agent",
                name: name.to_owned(),
            })
    }

    pub async fn get_agent(&self, org: &str, name: &str) -> Result<Option<AgentRow>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT org_id, name, manifest, files, created_at, updated_at FROM agents \
                 WHERE org_id = $1 AND name = $2",
            )
            .bind(org)
            .bind(name)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| -> Result<AgentRow, StoreError> { Ok(agent_row!(r, self)) }).transpose()
        })
    }

    pub async fn list_agents(&self, org: &str) -> Result<Vec<AgentRow>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT org_id, name, manifest, files, created_at, updated_at FROM agents \
                 WHERE org_id = $1 ORDER BY name",
            )
            .bind(org)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(agent_row!(r, self))).collect()
        })
    }

    pub async fn delete_agent(&self, org: &str, name: &str) -> Result<bool, StoreError> {
        let n = on_pool!(self, p => sqlx::query("DELETE FROM agents WHERE org_id = $1 AND name = $2")
            .bind(org)
            .bind(name)
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
        Ok(n > 0)
    }
}

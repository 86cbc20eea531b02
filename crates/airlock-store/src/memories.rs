//! `memories`: what an agent keeps from one run to the next, per
//! organization.
//!
//! Contract: an agent's memories are read newest first, only within its
//! organization.
//!
//! Bounds: reads are capped by `limit`. The table has no row cap and is not
//! swept: nothing in the platform writes a memory today, and a writer must
//! bring its own bound.

use sqlx::Row as _;

use crate::{Memory, Store, StoreError, now_ms, returned_id};

impl Store {
    /// Stores a memory for an agent.
    pub async fn add_memory(
        &self,
        org: &str,
        agent: &str,
        run_id: Option<&str>,
        content: &str,
    ) -> Result<i64, StoreError> {
        on_pool!(self, p => sqlx::query_scalar(
            "INSERT INTO memories (agent, run_id, content, created_at, org_id) \
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(agent)
        .bind(run_id)
        .bind(content)
        .bind(now_ms())
        .bind(org)
        .fetch_all(p)
        .await
        .map_err(|e| self.err(e)))
        .and_then(returned_id)
    }

    /// An agent's memories, newest first.
    pub async fn list_memories(
        &self,
        org: &str,
        agent: &str,
        limit: u32,
    ) -> Result<Vec<Memory>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT id, agent, run_id, content, created_at FROM memories \
                 WHERE agent = $1 AND org_id = $3 ORDER BY id DESC LIMIT $2",
            )
            .bind(agent)
            .bind(i64::from(limit))
            .bind(org)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter()
                .map(|r| {
                    Ok(Memory {
                        id: r.try_get("id").map_err(|e| self.err(e))?,
                        agent: r.try_get("agent").map_err(|e| self.err(e))?,
                        run_id: r.try_get("run_id").map_err(|e| self.err(e))?,
                        content: r.try_get("content").map_err(|e| self.err(e))?,
                        created_at: r.try_get("created_at").map_err(|e| self.err(e))?,
                    })
                })
                .collect()
        })
    }
}

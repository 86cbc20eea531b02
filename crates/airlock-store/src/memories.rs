//! `memories`: what an agent keeps from one run to the next, per
//! organization.
//!
//! Contract: an agent's memories are read newest first, only within its
//! organization.
//!
//! Bounds: reads are capped by `limit`; a memory holds at most
//! [`MAX_MEMORY_BYTES`]; an agent keeps its newest [`MAX_MEMORIES_PER_AGENT`]
//! (a write past it forgets the oldest, in the same transaction).

use sqlx::Row as _;

use crate::{Memory, Store, StoreError, now_ms, returned_id};

/// Longest memory, in bytes.
pub const MAX_MEMORY_BYTES: usize = 64 * 1024;
/// Memories an agent keeps (the newest).
pub const MAX_MEMORIES_PER_AGENT: i64 = 1000;

impl Store {
    /// Stores a memory for an agent, forgetting its oldest past
    /// [`MAX_MEMORIES_PER_AGENT`].
    pub async fn add_memory(
        &self,
        org: &str,
        agent: &str,
        run_id: Option<&str>,
        content: &str,
    ) -> Result<i64, StoreError> {
        if content.len() > MAX_MEMORY_BYTES {
            return Err(StoreError::Invalid {
                what: "memory",
                reason: "longer than 64 KiB",
            });
        }
        on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            let ids: Vec<i64> = sqlx::query_scalar(
                "INSERT INTO memories (agent, run_id, content, created_at, org_id) \
                 VALUES ($1, $2, $3, $4, $5) RETURNING id",
            )
            .bind(agent)
            .bind(run_id)
            .bind(content)
            .bind(now_ms())
            .bind(org)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            sqlx::query(
                "DELETE FROM memories WHERE org_id = $1 AND agent = $2 AND id NOT IN \
                 (SELECT id FROM memories WHERE org_id = $1 AND agent = $2 ORDER BY id DESC LIMIT $3)",
            )
            .bind(org)
            .bind(agent)
            .bind(MAX_MEMORIES_PER_AGENT)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            tx.commit().await.map_err(|e| self.err(e))?;
            returned_id(ids)
        })
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

//! `replicas` and `leases`: the `airlock serve` replicas sharing the store,
//! their heartbeats, the leader lease, and the leader's sweep of the dead.
//!
//! Contracts: a replica whose row is gone stops taking work (it was judged
//! dead and its runs failed); the sweep drops the silent replicas, fails
//! their runs (with the deliveries those ends owe) and releases their
//! delivery claims in one transaction; runs of the embedded platform (no
//! owner) are never touched.
//!
//! Bounds: one `replicas` row per live replica (an upsert by id; the sweep
//! drops the silent ones) and one `leases` row per lease name.

use crate::outbox::end_run_in;
use crate::{RunEnd, RunStatus, Store, StoreError, now_ms};

/// The message a run of a dead replica is failed with.
pub const REPLICA_GONE: &str = "the platform stopped while this run was running (its airlock serve replica is gone); reclaimed by another replica";

/// What the leader's sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Replicas dropped (silent for longer than the lease).
    pub dropped: Vec<String>,
    /// Runs failed with [`REPLICA_GONE`] (they ran under a replica that is
    /// not registered).
    pub failed: Vec<String>,
    /// Webhook deliveries whose claim by such a replica was released.
    pub released: u64,
}

impl Store {
    /// Registers replica `id` (again, if its row was dropped: a replica
    /// judged dead that is alive registers under its own id).
    pub async fn register_replica(&self, id: &str, host: &str, pid: u32) -> Result<(), StoreError> {
        let now = now_ms();
        on_pool!(self, p => sqlx::query(
            "INSERT INTO replicas (id, host, pid, started_at, heartbeat_at) VALUES ($1, $2, $3, $4, $4) \
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
        )
        .bind(id)
        .bind(host)
        .bind(i64::from(pid))
        .bind(now)
        .execute(p)
        .await
        .map(|_| ())
        .map_err(|e| self.err(e))?);
        Ok(())
    }

    /// `false` when the replica's row is gone (another replica judged it
    /// dead and failed its runs: it must stop taking work).
    pub async fn heartbeat_replica(&self, id: &str) -> Result<bool, StoreError> {
        let n = on_pool!(self, p => sqlx::query("UPDATE replicas SET heartbeat_at = $2 WHERE id = $1")
            .bind(id)
            .bind(now_ms())
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
        Ok(n > 0)
    }

    pub async fn remove_replica(&self, id: &str) -> Result<(), StoreError> {
        on_pool!(self, p => sqlx::query("DELETE FROM replicas WHERE id = $1")
            .bind(id)
            .execute(p)
            .await
            .map(|_| ())
            .map_err(|e| self.err(e))?);
        Ok(())
    }

    /// Takes or renews the lease `name` for `holder` for `ttl_ms`: `true`
    /// when `holder` holds it now. A lease whose holder stopped renewing is
    /// taken over once it expires.
    pub async fn try_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<bool, StoreError> {
        let now = now_ms();
        let res = on_pool!(self, p => sqlx::query(
            "INSERT INTO leases (name, holder, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
             WHERE leases.holder = excluded.holder OR leases.expires_at < $4",
        )
        .bind(name)
        .bind(holder)
        .bind(now + ttl_ms)
        .bind(now)
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        Ok(res > 0)
    }

    /// Gives the lease up (a clean shutdown), if `holder` holds it.
    pub async fn release_lease(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        on_pool!(self, p => sqlx::query("DELETE FROM leases WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(p)
            .await
            .map(|_| ())
            .map_err(|e| self.err(e))?);
        Ok(())
    }

    /// The leader's sweep, in one transaction: replicas other than
    /// `sweeper` silent for more than `lease_ms` are dropped; every run
    /// still `running` under a replica that is not registered is failed
    /// with [`REPLICA_GONE`] (and its deliveries queued); deliveries such a
    /// replica had claimed are released at once. Runs of the embedded
    /// platform (no owner) are not touched. The caller judges whether its
    /// own view of the store is evidence enough to sweep (docs/serve.md).
    pub async fn sweep_dead_replicas(
        &self,
        lease_ms: i64,
        sweeper: &str,
    ) -> Result<Sweep, StoreError> {
        let now = now_ms();
        let end = RunEnd {
            status: RunStatus::Failed,
            exit_code: None,
            error: Some(REPLICA_GONE),
            at: now,
        };
        on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            let dropped: Vec<String> = sqlx::query_scalar(
                "DELETE FROM replicas WHERE heartbeat_at < $1 AND id <> $2 RETURNING id",
            )
            .bind(now - lease_ms)
            .bind(sweeper)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            let orphans: Vec<String> = sqlx::query_scalar(
                "SELECT id FROM runs WHERE status = 'running' AND owner IS NOT NULL \
                 AND owner NOT IN (SELECT id FROM replicas)",
            )
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            let mut failed = Vec::new();
            for id in orphans {
                if end_run_in!(self, tx, &id, &end).await? {
                    failed.push(id);
                }
            }
            let released = sqlx::query(
                "UPDATE webhook_deliveries SET claimed_by = NULL, claimed_until = NULL \
                 WHERE state = 'pending' AND claimed_by IS NOT NULL \
                 AND claimed_by NOT IN (SELECT id FROM replicas)",
            )
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected();
            tx.commit().await.map_err(|e| self.err(e))?;
            Ok(Sweep { dropped, failed, released })
        })
    }
}

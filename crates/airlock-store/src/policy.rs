//! `run_policy`: each run's live policy changes (docs/egress.md, "Live
//! policy"), and the version its sidecar applied (`runs.policy_applied`).
//!
//! Contracts: version 0 is the manifest's rules, written when the run
//! starts (only if its manifest has rules: none stored reads as none);
//! each change is the next version, written only on the version it
//! replaces ([`StoreError::PolicyChanged`] otherwise), so two changes
//! never both land on one version and none is lost. Rows are the store's
//! JSON text as the platform wrote it; this module does not read them.
//!
//! Bounds: at most [`MAX_POLICY_CHANGES`] changes per run (beyond:
//! [`StoreError::PolicyChangesExhausted`], nothing written); the rows go
//! with their run.

use sqlx::Row as _;

use crate::{Store, StoreError, is_unique_violation, now_ms};

/// Live policy changes a run may have.
pub const MAX_POLICY_CHANGES: i64 = 256;

/// One version of a run's live policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRow {
    pub version: i64,
    /// The rules, as JSON.
    pub rules: String,
    /// Who made it: `manifest` for version 0, else the API key.
    pub actor: String,
    pub at: i64,
}

/// The actor of version 0.
pub const MANIFEST_ACTOR: &str = "manifest";

impl Store {
    /// Writes the run's manifest rules as its policy's version 0.
    pub async fn put_policy_ceiling(&self, run_id: &str, rules: &str) -> Result<(), StoreError> {
        self.insert_policy(run_id, 0, rules, MANIFEST_ACTOR).await
    }

    /// Writes a change on `replaces` (the version it was made on) as the
    /// next version, and returns it.
    pub async fn change_policy(
        &self,
        run_id: &str,
        replaces: i64,
        rules: &str,
        actor: &str,
    ) -> Result<i64, StoreError> {
        let version = replaces + 1;
        if version > MAX_POLICY_CHANGES {
            return Err(StoreError::PolicyChangesExhausted {
                run_id: run_id.to_owned(),
                limit: MAX_POLICY_CHANGES,
            });
        }
        match self.insert_policy(run_id, version, rules, actor).await {
            Err(StoreError::PolicyChanged { .. }) => Err(StoreError::PolicyChanged {
                run_id: run_id.to_owned(),
                latest: self.policy_version(run_id).await?,
            }),
            other => other.map(|()| version),
        }
    }

    async fn insert_policy(
        &self,
        run_id: &str,
        version: i64,
        rules: &str,
        actor: &str,
    ) -> Result<(), StoreError> {
        let res = on_pool!(self, p => sqlx::query(
            "INSERT INTO run_policy (run_id, version, rules, actor, at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(run_id)
        .bind(version)
        .bind(rules)
        .bind(actor)
        .bind(now_ms())
        .execute(p)
        .await
        .map(|_| ()));
        match res {
            Ok(_) => {
                self.policy_written();
                Ok(())
            }
            Err(e) if is_unique_violation(&e) => Err(StoreError::PolicyChanged {
                run_id: run_id.to_owned(),
                latest: version,
            }),
            Err(e) => Err(self.err(e)),
        }
    }

    /// The run's latest version (0: none changed, or no rules stored).
    pub async fn policy_version(&self, run_id: &str) -> Result<i64, StoreError> {
        let v: Option<i64> = on_pool!(self, p => sqlx::query_scalar(
            "SELECT MAX(version) FROM run_policy WHERE run_id = $1",
        )
        .bind(run_id)
        .fetch_one(p)
        .await
        .map_err(|e| self.err(e))?);
        Ok(v.unwrap_or(0))
    }

    /// One version of the run's policy (`None`: not stored).
    pub async fn policy_at(
        &self,
        run_id: &str,
        version: i64,
    ) -> Result<Option<PolicyRow>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT version, rules, actor, at FROM run_policy \
                 WHERE run_id = $1 AND version = $2",
            )
            .bind(run_id)
            .bind(version)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| {
                Ok(PolicyRow {
                    version: r.try_get("version").map_err(|e| self.err(e))?,
                    rules: r.try_get("rules").map_err(|e| self.err(e))?,
                    actor: r.try_get("actor").map_err(|e| self.err(e))?,
                    at: r.try_get("at").map_err(|e| self.err(e))?,
                })
            })
            .transpose()
        })
    }

    /// Records the version the run's sidecar has applied.
    pub async fn record_policy_applied(
        &self,
        run_id: &str,
        version: i64,
    ) -> Result<(), StoreError> {
        on_pool!(self, p => sqlx::query(
            "UPDATE runs SET policy_applied = $2 WHERE id = $1 \
             AND (policy_applied IS NULL OR policy_applied < $2)",
        )
        .bind(run_id)
        .bind(version)
        .execute(p)
        .await
        .map(|_| ())
        .map_err(|e| self.err(e))?);
        self.policy_written();
        Ok(())
    }

    /// The version the run's sidecar last reported applied (0: none).
    pub async fn policy_applied(&self, run_id: &str) -> Result<i64, StoreError> {
        let v: Option<Option<i64>> = on_pool!(self, p => sqlx::query_scalar(
            "SELECT policy_applied FROM runs WHERE id = $1",
        )
        .bind(run_id)
        .fetch_optional(p)
        .await
        .map_err(|e| self.err(e))?);
        Ok(v.flatten().unwrap_or(0))
    }

    /// A mark that moves when any process adds a policy change (the
    /// changes' count and latest time: an add and a removal by retention
    /// between two reads would have to land on the same count and time to
    /// hide): what a replica's watcher polls to wake its long-polls for
    /// changes made through another replica.
    pub async fn policy_mark(&self) -> Result<(i64, i64), StoreError> {
        on_pool!(self, p => {
            let r = sqlx::query(
                "SELECT COUNT(*) AS changes, COALESCE(MAX(at), 0) AS latest FROM run_policy",
            )
            .fetch_one(p)
            .await
            .map_err(|e| self.err(e))?;
            let changes: i64 = r.try_get("changes").map_err(|e| self.err(e))?;
            let latest: i64 = r.try_get("latest").map_err(|e| self.err(e))?;
            Ok((changes, latest))
        })
    }

    /// Moves when a policy change or report is written through this store
    /// (or [`Store::policy_written`] is called): what a long-poll waits on.
    pub fn policy_watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.policy_writes.subscribe()
    }

    /// Wakes every [`Store::policy_watch`]er (a watcher that saw another
    /// process's change calls it).
    pub fn policy_written(&self) {
        self.policy_writes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

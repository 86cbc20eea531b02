//! `results`: large result bodies a run stored (above the inline cap), each
//! readable only by the run that stored it.
//!
//! Contract: a result id is written once per run ([`StoreError::ResultExists`]).
//!
//! Bounds: each run's total is capped by its caller against
//! [`Store::result_bytes`] (the sidecar's `run_result_bytes`); the retention
//! sweep (`RETENTION_RESULTS_DAYS`, and with the run); their bytes count
//! toward the organization's stored-bytes quota (`ORG_MAX_STORED_BYTES`).

use sqlx::Row as _;

use crate::{Store, StoreError, StoredResult, is_unique_violation, now_ms, validate_name};

impl Store {
    /// Stores a large result body for a run under `id`.
    pub async fn put_result(
        &self,
        run_id: &str,
        id: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<(), StoreError> {
        validate_name("result id", id)?;
        let res = on_pool!(self, p => sqlx::query(
            "INSERT INTO results (run_id, id, content_type, body, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(run_id)
        .bind(id)
        .bind(content_type)
        .bind(body)
        .bind(now_ms())
        .execute(p)
        .await
        .map(|_| ()));
        match res {
            Err(e) if is_unique_violation(&e) => Err(StoreError::ResultExists {
                run_id: run_id.to_owned(),
                id: id.to_owned(),
            }),
            other => other.map_err(|e| self.run_fk(e, run_id)),
        }
    }

    /// A stored result, only for the run that stored it.
    pub async fn get_result(
        &self,
        run_id: &str,
        id: &str,
    ) -> Result<Option<StoredResult>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT content_type, body, created_at FROM results WHERE run_id = $1 AND id = $2",
            )
            .bind(run_id)
            .bind(id)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| {
                Ok(StoredResult {
                    run_id: run_id.to_owned(),
                    id: id.to_owned(),
                    content_type: r.try_get("content_type").map_err(|e| self.err(e))?,
                    body: r.try_get("body").map_err(|e| self.err(e))?,
                    created_at: r.try_get("created_at").map_err(|e| self.err(e))?,
                })
            })
            .transpose()
        })
    }

    /// Total bytes of results stored for a run (for per-run caps).
    pub async fn result_bytes(&self, run_id: &str) -> Result<u64, StoreError> {
        on_pool!(self, p => {
            let n: Option<i64> = sqlx::query_scalar(
                "SELECT CAST(SUM(LENGTH(body)) AS BIGINT) FROM results WHERE run_id = $1",
            )
            .bind(run_id)
            .fetch_one(p)
            .await
            .map_err(|e| self.err(e))?;
            Ok(n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0))
        })
    }
}

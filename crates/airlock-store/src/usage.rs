//! A run's metered usage: the token, cost and request totals on its `runs`
//! row (one usage is one metered model call).
//!
//! Contract: usage is only ever added (never set), by
//! [`Store::add_run_usage`] or with a journalled event the first time that
//! event is stored ([`Store::append_journal_events`]), with one statement;
//! the thresholds of the run's budget it reaches are recorded in the same
//! transaction (`thresholds.rs`).
//!
//! Bounds: no row is added; the totals go with their run.

use crate::thresholds::cross_run_in;
use crate::{BudgetLimits, Store, StoreError, Usage};

/// The statement that adds usage `$u` (a [`Usage`]) to run `$id`'s totals,
/// bound, for any executor.
macro_rules! add_run_usage {
    ($id:expr, $u:expr) => {
        sqlx::query(
            "UPDATE runs SET tokens_in = tokens_in + $2, tokens_out = tokens_out + $3, \
             cost_microusd = cost_microusd + $4, requests = requests + 1 WHERE id = $1",
        )
        .bind($id)
        .bind($u.tokens_in)
        .bind($u.tokens_out)
        .bind($u.cost_microusd)
    };
}
pub(crate) use add_run_usage;

impl Store {
    /// Records the model budget a run is held to (its own limits).
    pub async fn set_run_budget(&self, id: &str, b: &BudgetLimits) -> Result<(), StoreError> {
        let n = on_pool!(self, p => sqlx::query(
            "UPDATE runs SET budget_tokens = $2, budget_cost_microusd = $3, budget_requests = $4 \
             WHERE id = $1",
        )
        .bind(id)
        .bind(b.tokens)
        .bind(b.cost_microusd)
        .bind(b.requests)
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        crate::runs::run_changed(id, n)
    }

    /// Records the upstream proxy a run's guarded connections go through:
    /// a `SYSTEM_PROXIES` name or `PROXY_URL` (`None`: direct). A label,
    /// never a URL.
    pub async fn set_run_proxy(&self, id: &str, proxy: Option<&str>) -> Result<(), StoreError> {
        let n = on_pool!(self, p => sqlx::query("UPDATE runs SET proxy = $2 WHERE id = $1")
            .bind(id)
            .bind(proxy)
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
        crate::runs::run_changed(id, n)
    }

    /// Adds metered usage (one model call) to a run's totals, and records
    /// the thresholds of its budget they reached (`thresholds.rs`), in one
    /// transaction.
    pub async fn add_run_usage(&self, id: &str, u: &Usage) -> Result<(), StoreError> {
        let n = on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            let n = add_run_usage!(id, u)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?
                .rows_affected();
            if n > 0 {
                cross_run_in!(self, tx, id).await?;
            }
            tx.commit().await.map_err(|e| self.err(e))?;
            n
        });
        crate::runs::run_changed(id, n)
    }
}

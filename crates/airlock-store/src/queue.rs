//! The run queue shared by every `airlock serve` replica: the `runs` rows
//! still `queued` (with the prompt and limit hints they were asked with), a
//! replica's claim of one, and the cancel requests a replica follows.
//!
//! Contracts: replicas claim queued runs in the order they were queued;
//! counting the running runs and claiming is one atomic step (as
//! [`Store::insert_run_within_limit`]), so neither the platform's nor an
//! organization's ceiling is ever passed; a queued run that is cancelled
//! ends at once, with its deliveries, in one transaction.
//!
//! Bounds: a queued run is a `runs` row, swept with the others once it
//! has ended (see `runs.rs`); an organization over its stored-bytes quota
//! (`ORG_MAX_STORED_BYTES`) gets no new one, nor one past its queued runs'
//! cap (`ORG_MAX_QUEUED_RUNS`, counted inside the insert).

use sqlx::Row as _;

use crate::outbox::queue_deliveries_in;
use crate::runs::in_run_slots;
use crate::{
    Run, RunEnd, RunStatus, Store, StoreError, is_unique_violation, now_ms, validate_name,
};

/// A run to queue.
#[derive(Debug, Clone, Copy)]
pub struct NewQueuedRun<'a> {
    pub org: &'a str,
    pub id: &'a str,
    pub agent: &'a str,
    pub backend: &'a str,
    pub model: Option<&'a str>,
    pub prompt: Option<&'a str>,
    /// JSON of the limit hints asked for with the run.
    pub hints: Option<&'a str>,
    /// JSON of the input files (path → text) asked for with the run.
    pub inputs: Option<&'a str>,
    /// At most this many of the organization's runs queued at once
    /// (`ORG_MAX_QUEUED_RUNS`): one more is [`StoreError::QuotaExceeded`]
    /// of `queued runs`, nothing written.
    pub max_queued: Option<u64>,
}

/// A queued run a replica has claimed: it is now `running` and the replica's.
#[derive(Debug, Clone)]
pub struct ClaimedRun {
    pub run: Run,
    pub prompt: Option<String>,
    pub hints: Option<String>,
    /// JSON of its input files (path → text).
    pub inputs: Option<String>,
}

/// What a cancel request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// It was queued: it is now `cancelled`.
    CancelledQueued,
    /// It is running: its replica stops it.
    Requested,
    /// It had already ended.
    AlreadyEnded(RunStatus),
    NotFound,
}

/// A strictly increasing position in the run queue for this process
/// (microseconds, bumped on a tie): runs queued one after another by one
/// client start in that order.
fn next_queue_seq() -> i64 {
    use std::sync::atomic::{AtomicI64, Ordering};
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now = now_ms().saturating_mul(1000);
    let mut prev = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(prev + 1);
        match LAST.compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(p) => prev = p,
        }
    }
}

impl Store {
    /// Queues a run (status `queued`); replicas claim queued runs in order.
    pub async fn enqueue_run(&self, r: &NewQueuedRun<'_>) -> Result<(), StoreError> {
        validate_name("run id", r.id)?;
        let limit = r
            .max_queued
            .and_then(|m| i64::try_from(m).ok())
            .unwrap_or(i64::MAX);
        let res = on_pool!(self, p => {
            async {
                let mut tx = locked_tx!(self, p, format!("queue:{}", r.org)).await?;
                let n = sqlx::query(
                    "INSERT INTO runs (id, agent, status, backend, model, created_at, org_id, prompt, \
                     hints, queue_seq, inputs) SELECT $1, $2, 'queued', $3, $4, $5, $6, $7, $8, $9, $10 \
                     WHERE (SELECT COUNT(*) FROM runs WHERE org_id = $6 AND status = 'queued') < $11",
                )
                .bind(r.id)
                .bind(r.agent)
                .bind(r.backend)
                .bind(r.model)
                .bind(now_ms())
                .bind(r.org)
                .bind(r.prompt)
                .bind(r.hints)
                .bind(next_queue_seq())
                .bind(r.inputs)
                .bind(limit)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                tx.commit().await?;
                Ok::<u64, sqlx::Error>(n)
            }
            .await
        });
        match res {
            Err(e) if is_unique_violation(&e) => Err(StoreError::RunExists(r.id.to_owned())),
            Err(e) => Err(self.err(e)),
            Ok(0) => Err(StoreError::QuotaExceeded {
                what: "queued runs",
                limit: r.max_queued.unwrap_or(u64::MAX),
            }),
            Ok(_) => Ok(()),
        }
    }

    /// Claims the oldest queued run that may start now for `owner`: fewer
    /// than `max_running` runs are running in the store (when set) and fewer
    /// than its organization's `max_concurrent_runs`. Counting and claiming
    /// are one atomic step, as in [`Store::insert_run_within_limit`].
    pub async fn claim_next_run(
        &self,
        owner: &str,
        max_running: Option<u32>,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        let max = max_running.map_or(i64::MAX, i64::from);
        let pick = "SELECT r.id FROM runs r LEFT JOIN organizations o ON o.id = r.org_id \
             WHERE r.status = 'queued' AND (SELECT COUNT(*) FROM runs a WHERE a.status = 'running') < $1 \
             AND (o.max_concurrent_runs IS NULL OR (SELECT COUNT(*) FROM runs x \
                  WHERE x.org_id = r.org_id AND x.status = 'running') < o.max_concurrent_runs) \
             ORDER BY r.queue_seq, r.id LIMIT 1";
        let claim =
            "UPDATE runs SET status = 'running', owner = $2 WHERE id = $1 AND status = 'queued'";
        let id: Option<String> = in_run_slots!(self, c => async move {
            let id: Option<String> = sqlx::query_scalar(pick)
                .bind(max)
                .fetch_optional(&mut *c)
                .await?;
            if let Some(id) = &id {
                sqlx::query(claim)
                    .bind(id)
                    .bind(owner)
                    .execute(&mut *c)
                    .await?;
            }
            Ok::<_, sqlx::Error>(id)
        }, keep if |id: &Option<String>| id.is_some())
        .map_err(|e| self.err(e))?;
        let Some(id) = id else { return Ok(None) };
        let run = self
            .get_run(&id)
            .await?
            .ok_or_else(|| StoreError::RunNotFound(id.clone()))?;
        let (prompt, hints, inputs): (Option<String>, Option<String>, Option<String>) = on_pool!(self, p => {
            let r = sqlx::query("SELECT prompt, hints, inputs FROM runs WHERE id = $1")
                .bind(&id)
                .fetch_one(p)
                .await
                .map_err(|e| self.err(e))?;
            (
                r.try_get("prompt").map_err(|e| self.err(e))?,
                r.try_get("hints").map_err(|e| self.err(e))?,
                r.try_get("inputs").map_err(|e| self.err(e))?,
            )
        });
        Ok(Some(ClaimedRun {
            run,
            prompt,
            hints,
            inputs,
        }))
    }

    /// How many runs are queued, in every organization (the queue's depth
    /// an operator's metrics show).
    pub async fn queue_depth(&self) -> Result<i64, StoreError> {
        on_pool!(self, p => sqlx::query_scalar("SELECT COUNT(*) FROM runs WHERE status = 'queued'")
        .fetch_one(p)
        .await
        .map_err(|e| self.err(e)))
    }

    /// How many queued runs are ahead of `id` (`None`: it is not queued).
    pub async fn queue_position(&self, id: &str) -> Result<Option<i64>, StoreError> {
        on_pool!(self, p => sqlx::query_scalar(
            "SELECT (SELECT COUNT(*) FROM runs q WHERE q.status = 'queued' \
             AND (q.queue_seq < r.queue_seq OR (q.queue_seq = r.queue_seq AND q.id < r.id))) \
             FROM runs r WHERE r.id = $1 AND r.status = 'queued'",
        )
        .bind(id)
        .fetch_optional(p)
        .await
        .map_err(|e| self.err(e)))
    }

    /// Cancels one of `org`'s runs, saying why (`reason`, e.g. which API
    /// key asked): a queued run ends `cancelled` now, with `reason` (and
    /// its deliveries, in the same transaction); a running one is marked
    /// for its replica to stop, which records `reason` as its end.
    pub async fn request_cancel(
        &self,
        org: &str,
        id: &str,
        reason: &str,
    ) -> Result<CancelOutcome, StoreError> {
        let queued_end = RunEnd {
            status: RunStatus::Cancelled,
            exit_code: None,
            error: Some(reason),
            at: now_ms(),
        };
        let ended = on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            // Only a run of this organization still queued is ended here
            // (one that a replica claims meanwhile is running: below).
            let n = sqlx::query(
                "UPDATE runs SET status = 'cancelled', error = $3, ended_at = $4 \
                 WHERE org_id = $1 AND id = $2 AND status = 'queued'",
            )
            .bind(org)
            .bind(id)
            .bind(queued_end.error)
            .bind(queued_end.at)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected();
            if n > 0 {
                queue_deliveries_in!(self, tx, id, queued_end.status, queued_end.at).await?;
            }
            tx.commit().await.map_err(|e| self.err(e))?;
            n > 0
        });
        if ended {
            return Ok(CancelOutcome::CancelledQueued);
        }
        let n = on_pool!(self, p => sqlx::query(
            "UPDATE runs SET cancel_requested = 1, cancel_reason = $3 \
             WHERE org_id = $1 AND id = $2 AND status = 'running'",
        )
        .bind(org)
        .bind(id)
        .bind(reason)
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        if n > 0 {
            return Ok(CancelOutcome::Requested);
        }
        Ok(match self.get_run_in(org, id).await? {
            None => CancelOutcome::NotFound,
            Some(r) if r.status.is_terminal() => CancelOutcome::AlreadyEnded(r.status),
            // Raced: it started between the two statements.
            Some(_) => Box::pin(self.request_cancel(org, id, reason)).await?,
        })
    }

    /// `owner`'s running runs that were asked to stop, with why.
    pub async fn cancel_requests_of(
        &self,
        owner: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        on_pool!(self, p => sqlx::query_as(
            "SELECT id, COALESCE(cancel_reason, 'cancelled through the API') FROM runs \
             WHERE owner = $1 AND status = 'running' AND cancel_requested <> 0",
        )
        .bind(owner)
        .fetch_all(p)
        .await
        .map_err(|e| self.err(e)))
    }

    /// The runs the store counts as `running` under `owner`, each with
    /// whether it has started (its sandbox was asked for).
    pub async fn running_runs_of(&self, owner: &str) -> Result<Vec<(String, bool)>, StoreError> {
        let rows: Vec<(String, Option<i64>)> = on_pool!(self, p => sqlx::query_as(
            "SELECT id, started_at FROM runs WHERE owner = $1 AND status = 'running'",
        )
        .bind(owner)
        .fetch_all(p)
        .await
        .map_err(|e| self.err(e))?);
        Ok(rows.into_iter().map(|(id, s)| (id, s.is_some())).collect())
    }

    /// Puts a run `owner` claimed but never started back in the queue, in
    /// its place (a claim whose answer never reached its replica). `false`
    /// when it is not such a run.
    pub async fn requeue_unstarted(&self, id: &str, owner: &str) -> Result<bool, StoreError> {
        let n = on_pool!(self, p => sqlx::query(
            "UPDATE runs SET status = 'queued', owner = NULL \
             WHERE id = $1 AND owner = $2 AND status = 'running' AND started_at IS NULL",
        )
        .bind(id)
        .bind(owner)
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        Ok(n > 0)
    }
}

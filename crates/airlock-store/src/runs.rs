//! `runs`: a run's row, from its creation to its end (the queue's columns
//! are `queue.rs`'s, its metered totals `usage.rs`'s).
//!
//! Contracts: a run is ended once (the first end wins, a later one is
//! `false`); a run's end and the webhook deliveries it owes are one
//! transaction (`outbox.rs`); a run that has ended is never marked
//! started again. Counting the running runs and inserting one is one atomic
//! step, on both backends.
//!
//! Bounds: ended runs go with the retention sweep (`RETENTION_RUNS_DAYS`,
//! everything of them with them); running ones are capped by the
//! platform's and each organization's concurrency limits.

use sqlx::Row as _;

use crate::{
    NewRun, Run, RunEnd, RunPhase, RunQuery, RunStatus, Store, StoreError, is_unique_violation,
    now_ms, validate_name,
};

macro_rules! run_columns {
    () => {
        "id, agent, status, backend, model, created_at, started_at, ended_at, \
         last_heartbeat_at, exit_code, error, tokens_in, tokens_out, cost_microusd, org_id, owner, \
         requests, budget_tokens, budget_cost_microusd, budget_requests, sandbox_up_at, \
         sidecar_up_at, proxy"
    };
}

/// Maps a runs row (selected with `run_columns!`) to [`Run`].
macro_rules! run_row {
    ($r:expr, $s:expr) => {{
        let status: String = $r.try_get("status").map_err(|e| $s.err(e))?;
        Run {
            id: $r.try_get("id").map_err(|e| $s.err(e))?,
            agent: $r.try_get("agent").map_err(|e| $s.err(e))?,
            status: RunStatus::parse(&status).ok_or(StoreError::Unspelled {
                column: "runs.status",
                value: Some(status),
            })?,
            backend: $r.try_get("backend").map_err(|e| $s.err(e))?,
            model: $r.try_get("model").map_err(|e| $s.err(e))?,
            created_at: $r.try_get("created_at").map_err(|e| $s.err(e))?,
            started_at: $r.try_get("started_at").map_err(|e| $s.err(e))?,
            sandbox_up_at: $r.try_get("sandbox_up_at").map_err(|e| $s.err(e))?,
            sidecar_up_at: $r.try_get("sidecar_up_at").map_err(|e| $s.err(e))?,
            ended_at: $r.try_get("ended_at").map_err(|e| $s.err(e))?,
            last_heartbeat_at: $r.try_get("last_heartbeat_at").map_err(|e| $s.err(e))?,
            exit_code: $r.try_get("exit_code").map_err(|e| $s.err(e))?,
            error: $r.try_get("error").map_err(|e| $s.err(e))?,
            tokens_in: $r.try_get("tokens_in").map_err(|e| $s.err(e))?,
            tokens_out: $r.try_get("tokens_out").map_err(|e| $s.err(e))?,
            cost_microusd: $r.try_get("cost_microusd").map_err(|e| $s.err(e))?,
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            owner: $r.try_get("owner").map_err(|e| $s.err(e))?,
            requests: $r.try_get("requests").map_err(|e| $s.err(e))?,
            budget: crate::BudgetLimits {
                tokens: $r.try_get("budget_tokens").map_err(|e| $s.err(e))?,
                cost_microusd: $r.try_get("budget_cost_microusd").map_err(|e| $s.err(e))?,
                requests: $r.try_get("budget_requests").map_err(|e| $s.err(e))?,
            },
            proxy: $r.try_get("proxy").map_err(|e| $s.err(e))?,
        }
    }};
}

/// Runs `$body` (an async block over `$c`, a connection, yielding a
/// `Result<T, sqlx::Error>`) as the one atomic step that counts the running
/// runs and changes them, so that no ceiling on running runs is passed by
/// two at once: on SQLite an immediate transaction (it takes the write lock
/// before it counts), on PostgreSQL a transaction holding the run slots'
/// advisory lock. What it wrote is kept only when `$keep(&T)`, and rolled
/// back otherwise or on an error. Evaluates to the body's result.
macro_rules! in_run_slots {
    ($self:expr, $c:ident => $body:expr, keep if $keep:expr) => {
        match &$self.pool {
            $crate::Pool::Sqlite(p) => {
                async {
                    let mut conn = p.acquire().await?;
                    sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
                    let body = {
                        let $c = &mut *conn;
                        $body.await
                    };
                    let end = if matches!(&body, Ok(v) if $keep(v)) {
                        "COMMIT"
                    } else {
                        "ROLLBACK"
                    };
                    sqlx::query(end).execute(&mut *conn).await?;
                    body
                }
                .await
            }
            $crate::Pool::Postgres(p) => {
                async {
                    let mut tx = p.begin().await?;
                    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('airlock.run_slots'))")
                        .execute(&mut *tx)
                        .await?;
                    let body = {
                        let $c = &mut *tx;
                        $body.await
                    };
                    if matches!(&body, Ok(v) if $keep(v)) {
                        tx.commit().await?;
                    }
                    body
                }
                .await
            }
        }
    };
}
pub(crate) use in_run_slots;

impl Store {
    /// Records a new run (status `queued` unless given).
    pub async fn insert_run(&self, r: &NewRun<'_>) -> Result<(), StoreError> {
        validate_name("run id", r.id)?;
        let res = on_pool!(self, p => {
            sqlx::query(
                "INSERT INTO runs (id, agent, status, backend, model, created_at, org_id, owner) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(r.id)
            .bind(r.agent)
            .bind(r.status.as_str())
            .bind(r.backend)
            .bind(r.model)
            .bind(r.created_at.unwrap_or_else(now_ms))
            .bind(r.org)
            .bind(r.owner)
            .execute(p)
            .await
            .map(|_| ())
        });
        match res {
            Err(e) if is_unique_violation(&e) => Err(StoreError::RunExists(r.id.to_owned())),
            other => other.map_err(|e| self.err(e)),
        }
    }

    /// Inserts `r` as `running` only while fewer than `max` runs are
    /// `running` in this store (every platform sharing it counts): `false`
    /// when the limit is reached. Counting and inserting are one atomic step
    /// ([`in_run_slots!`]).
    pub async fn insert_run_within_limit(
        &self,
        r: &NewRun<'_>,
        max: u32,
    ) -> Result<bool, StoreError> {
        validate_name("run id", r.id)?;
        let count_sql = "SELECT COUNT(*) FROM runs WHERE status = 'running'";
        let insert_sql = "INSERT INTO runs \
                          (id, agent, status, backend, model, created_at, org_id, owner) \
                          VALUES ($1, $2, 'running', $3, $4, $5, $6, $7)";
        let res = in_run_slots!(self, c => async move {
            let n: i64 = sqlx::query_scalar(count_sql).fetch_one(&mut *c).await?;
            if n >= i64::from(max) {
                return Ok(false);
            }
            sqlx::query(insert_sql)
                .bind(r.id)
                .bind(r.agent)
                .bind(r.backend)
                .bind(r.model)
                .bind(r.created_at.unwrap_or_else(now_ms))
                .bind(r.org)
                .bind(r.owner)
                .execute(&mut *c)
                .await?;
            Ok::<bool, sqlx::Error>(true)
        }, keep if |inserted: &bool| *inserted);
        match res {
            Err(e) if is_unique_violation(&e) => Err(StoreError::RunExists(r.id.to_owned())),
            other => other.map_err(|e| self.err(e)),
        }
    }

    /// One run.
    pub async fn get_run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(concat!("SELECT ", run_columns!(), " FROM runs WHERE id = $1"))
                .bind(id)
                .fetch_optional(p)
                .await
                .map_err(|e| self.err(e))?;
            row.map(|r| Ok(run_row!(r, self))).transpose()
        })
    }

    /// One of `org`'s runs.
    pub async fn get_run_in(&self, org: &str, id: &str) -> Result<Option<Run>, StoreError> {
        Ok(self.get_run(id).await?.filter(|r| r.org_id == org))
    }

    /// Runs, newest first, optionally only those with `status`, at most `limit`, created before
    /// `before` (Unix ms) for paging.
    pub async fn list_runs(&self, q: &RunQuery<'_>) -> Result<Vec<Run>, StoreError> {
        let limit = i64::from(q.limit.unwrap_or(100));
        let status = q.status.map(RunStatus::as_str);
        let agent = q.agent;
        let before = q.before.unwrap_or(i64::MAX);
        on_pool!(self, p => {
            let rows = sqlx::query(concat!(
                "SELECT ", run_columns!(), " FROM runs \
                 WHERE ($1 IS NULL OR status = $1) AND ($2 IS NULL OR agent = $2) \
                 AND ($5 IS NULL OR org_id = $5) \
                 AND (created_at < $3 OR (created_at = $3 AND $6 IS NOT NULL AND id < $6)) \
                 ORDER BY created_at DESC, id DESC LIMIT $4"
            ))
            .bind(status)
            .bind(agent)
            .bind(before)
            .bind(limit)
            .bind(q.org)
            .bind(q.before_id)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(run_row!(r, self))).collect()
        })
    }

    /// Marks a run started (status `running`, `started_at`, first heartbeat).
    pub async fn mark_run_started(&self, id: &str, at: i64) -> Result<(), StoreError> {
        // Never a run that has ended (failed by a reclaim, cancelled):
        // marking it `running` again would revive it in name only.
        match self
            .update_run(
                id,
                "UPDATE runs SET status = 'running', started_at = $2, last_heartbeat_at = $2 \
                 WHERE id = $1 AND ended_at IS NULL",
                at,
            )
            .await
        {
            Err(StoreError::RunNotFound(_)) => match self.get_run(id).await? {
                Some(run) => Err(StoreError::RunEnded {
                    id: id.to_owned(),
                    reason: run
                        .error
                        .unwrap_or_else(|| format!("it is {}", run.status.as_str())),
                }),
                None => Err(StoreError::RunNotFound(id.to_owned())),
            },
            other => other,
        }
    }

    /// Records when a started run reached `phase` (the first time only: a
    /// phase is reached once).
    pub async fn record_run_phase(
        &self,
        id: &str,
        phase: RunPhase,
        at: i64,
    ) -> Result<(), StoreError> {
        let sql = match phase {
            RunPhase::SandboxUp => {
                "UPDATE runs SET sandbox_up_at = COALESCE(sandbox_up_at, $2) WHERE id = $1"
            }
            RunPhase::SidecarUp => {
                "UPDATE runs SET sidecar_up_at = COALESCE(sidecar_up_at, $2) WHERE id = $1"
            }
        };
        self.update_run(id, sql, at).await
    }

    /// Records a heartbeat.
    pub async fn record_heartbeat(&self, id: &str, at: i64) -> Result<(), StoreError> {
        self.update_run(
            id,
            "UPDATE runs SET last_heartbeat_at = $2 WHERE id = $1",
            at,
        )
        .await
    }

    async fn update_run(&self, id: &str, sql: &'static str, at: i64) -> Result<(), StoreError> {
        let n = on_pool!(self, p => sqlx::query(sql)
            .bind(id)
            .bind(at)
            .execute(p)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected());
        run_changed(id, n)
    }

    /// Ends a run: final status, exit code, error, end time. A run already ended is left as
    /// it is (`false`).
    ///
    /// The webhook deliveries the end owes (its organization's webhooks
    /// subscribed to its event) are queued in the same transaction: an end
    /// is never stored without them, whoever records it.
    pub async fn finish_run(&self, id: &str, end: &RunEnd<'_>) -> Result<bool, StoreError> {
        let ended = self.end_run(id, end).await?;
        if !ended && self.get_run(id).await?.is_none() {
            return Err(StoreError::RunNotFound(id.to_owned()));
        }
        Ok(ended)
    }

    /// Ends a run as `failed` now, with `reason` (the one place a run that
    /// never got going, or whose platform is gone, is failed). `false` if it
    /// had already ended.
    pub async fn fail_run(&self, id: &str, reason: &str) -> Result<bool, StoreError> {
        self.finish_run(
            id,
            &RunEnd {
                status: RunStatus::Failed,
                exit_code: None,
                error: Some(reason),
                at: now_ms(),
            },
        )
        .await
    }
}

/// The outcome of an update of run `id` that changed `rows` rows: none is a
/// run that does not exist.
pub(crate) fn run_changed(id: &str, rows: u64) -> Result<(), StoreError> {
    if rows == 0 {
        return Err(StoreError::RunNotFound(id.to_owned()));
    }
    Ok(())
}

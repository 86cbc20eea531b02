//! What the store keeps, for how long, and how much an organization may hold.
//!
//! Contracts:
//! - Retention is per kind ([`Retention`]): a run goes with everything of it
//!   (events, egress records, results) once it has been over for
//!   `runs`; a run's egress records and its results may go sooner (`egress`,
//!   `results`); a webhook delivery goes once it is settled (delivered or
//!   given up) and older than `deliveries`. A run still queued or running,
//!   and a delivery still owed, are never swept.
//! - A sweep deletes in batches of at most [`SWEEP_BATCH`] rows, each batch
//!   its own short transaction: it never holds the store's write lock for
//!   long, and a sweep cut short (a crash, a store outage, a process that
//!   exits) loses nothing but its own progress.
//! - SQLite gives the space back: a store created by this version is in
//!   `auto_vacuum = INCREMENTAL` mode and a sweep ends with
//!   `PRAGMA incremental_vacuum`. (A store created before keeps the freed
//!   pages for its own reuse; `VACUUM` once converts it.) PostgreSQL's
//!   autovacuum reclaims as usual.
//! - Quotas ([`OrgQuotas`]) bound what one organization holds: API keys and
//!   webhooks are counted when one is created (the count and the insert
//!   are one statement); stored bytes (its runs' events, egress records and
//!   results) are measured by the sweep into `org_usage` and checked when a
//!   run is queued, so an organization over its quota gets no new run until
//!   retention (or its operator) brings it back under.

use std::time::Duration;

use sqlx::Row as _;

use crate::{Periods, Pool, Store, StoreError};

/// Rows deleted per statement (and per transaction) by a sweep.
pub const SWEEP_BATCH: i64 = 500;

/// How long each kind of record is kept after it is over (`None`: forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A run (and all of it) after its end. `RETENTION_RUNS_DAYS`, 30.
    pub runs: Option<Duration>,
    /// A run's egress records after its end. `RETENTION_EGRESS_DAYS`, 30.
    pub egress: Option<Duration>,
    /// A run's stored results after its end. `RETENTION_RESULTS_DAYS`, 30.
    pub results: Option<Duration>,
    /// A settled webhook delivery after it was queued.
    /// `RETENTION_DELIVERIES_DAYS`, 7.
    pub deliveries: Option<Duration>,
}

const DAY: Duration = Duration::from_secs(86_400);

impl Default for Retention {
    fn default() -> Self {
        Retention {
            runs: Some(DAY * 30),
            egress: Some(DAY * 30),
            results: Some(DAY * 30),
            deliveries: Some(DAY * 7),
        }
    }
}

/// A retention or quota setting that is not what it should be.
#[derive(Debug, thiserror::Error)]
#[error("{var}: {value:?} is not {expected}")]
pub struct SettingError {
    pub var: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// A number of days (fractions allowed, at most a hundred years), or
/// `forever`.
fn days(
    var: &'static str,
    v: Option<String>,
    default: Option<Duration>,
) -> Result<Option<Duration>, SettingError> {
    let Some(v) = v else { return Ok(default) };
    let t = v.trim();
    if t.eq_ignore_ascii_case("forever") {
        return Ok(None);
    }
    match t.parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 && n <= 36_500.0 => {
            Ok(Some(Duration::from_secs_f64(n * 86_400.0)))
        }
        _ => Err(SettingError {
            var,
            value: v,
            expected: "a number of days above 0 (at most 36500), or forever",
        }),
    }
}

/// A whole number from 1 to `max`, or `unlimited`.
fn cap(
    var: &'static str,
    v: Option<String>,
    default: Option<u64>,
    max: u64,
) -> Result<Option<u64>, SettingError> {
    let Some(v) = v else { return Ok(default) };
    let t = v.trim();
    if t.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    match t.parse::<u64>() {
        Ok(n) if (1..=max).contains(&n) => Ok(Some(n)),
        _ => Err(SettingError {
            var,
            value: v,
            expected: "a whole number above 0, or unlimited",
        }),
    }
}

impl Retention {
    /// From settings looked up by name (the environment, for the binaries);
    /// an unset or blank one takes its default.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, SettingError> {
        let d = Retention::default();
        Ok(Retention {
            runs: days("RETENTION_RUNS_DAYS", get("RETENTION_RUNS_DAYS"), d.runs)?,
            egress: days(
                "RETENTION_EGRESS_DAYS",
                get("RETENTION_EGRESS_DAYS"),
                d.egress,
            )?,
            results: days(
                "RETENTION_RESULTS_DAYS",
                get("RETENTION_RESULTS_DAYS"),
                d.results,
            )?,
            deliveries: days(
                "RETENTION_DELIVERIES_DAYS",
                get("RETENTION_DELIVERIES_DAYS"),
                d.deliveries,
            )?,
        })
    }
}

/// What one organization may hold (`None`: no bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrgQuotas {
    /// API keys not revoked. `ORG_MAX_API_KEYS`, 100.
    pub api_keys: Option<u64>,
    /// Webhooks. `ORG_MAX_WEBHOOKS`, 32.
    pub webhooks: Option<u64>,
    /// Agents (a replaced agent is not one more). `ORG_MAX_AGENTS`, 1000.
    pub agents: Option<u64>,
    /// Bytes of its runs' events, egress records and results, as last
    /// measured. `ORG_MAX_STORED_BYTES`, 10 GiB.
    pub stored_bytes: Option<u64>,
    /// Runs queued and not yet started. `ORG_MAX_QUEUED_RUNS`, 1000.
    pub queued_runs: Option<u64>,
    /// Connections. `ORG_MAX_CONNECTIONS`, 1000.
    pub connections: Option<u64>,
}

impl Default for OrgQuotas {
    fn default() -> Self {
        OrgQuotas {
            api_keys: Some(100),
            webhooks: Some(32),
            agents: Some(1000),
            stored_bytes: Some(10 << 30),
            queued_runs: Some(1000),
            connections: Some(1000),
        }
    }
}

impl OrgQuotas {
    /// From settings looked up by name; an unset or blank one takes its default.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, SettingError> {
        let d = OrgQuotas::default();
        Ok(OrgQuotas {
            api_keys: cap(
                "ORG_MAX_API_KEYS",
                get("ORG_MAX_API_KEYS"),
                d.api_keys,
                1_000_000,
            )?,
            webhooks: cap(
                "ORG_MAX_WEBHOOKS",
                get("ORG_MAX_WEBHOOKS"),
                d.webhooks,
                1_000_000,
            )?,
            agents: cap("ORG_MAX_AGENTS", get("ORG_MAX_AGENTS"), d.agents, 1_000_000)?,
            stored_bytes: cap(
                "ORG_MAX_STORED_BYTES",
                get("ORG_MAX_STORED_BYTES"),
                d.stored_bytes,
                i64::MAX.unsigned_abs(),
            )?,
            queued_runs: cap(
                "ORG_MAX_QUEUED_RUNS",
                get("ORG_MAX_QUEUED_RUNS"),
                d.queued_runs,
                1_000_000,
            )?,
            connections: cap(
                "ORG_MAX_CONNECTIONS",
                get("ORG_MAX_CONNECTIONS"),
                d.connections,
                1_000_000,
            )?,
        })
    }
}

/// What a sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Runs deleted (with their events, egress records and results).
    pub runs: u64,
    /// Egress records deleted from runs that were kept.
    pub egress: u64,
    /// Results deleted from runs that were kept.
    pub results: u64,
    /// Settled webhook deliveries deleted.
    pub deliveries: u64,
    /// Organizations' spend of past budget periods deleted
    /// ([`SPEND_DAYS_KEPT`], [`SPEND_MONTHS_KEPT`]).
    pub spend: u64,
    /// Budget thresholds crossed more than [`crate::CROSSINGS_KEPT_DAYS`] ago.
    pub crossings: u64,
    /// SQLite pages given back to the file system.
    pub freed_pages: u64,
}

impl SweepReport {
    /// Whether the sweep removed anything.
    pub fn is_empty(&self) -> bool {
        self.runs + self.egress + self.results + self.deliveries + self.spend + self.crossings == 0
    }
}

/// Days an organization's daily spend is kept after its day (a month's
/// statement can still be read from them).
pub const SPEND_DAYS_KEPT: i64 = 35;
/// Months an organization's monthly spend is kept after its month.
pub const SPEND_MONTHS_KEPT: i64 = 13;

/// The cutoff for records kept `keep` at `now` (milliseconds).
fn cutoff(now: i64, keep: Option<Duration>) -> Option<i64> {
    keep.map(|k| now.saturating_sub(i64::try_from(k.as_millis()).unwrap_or(i64::MAX)))
}

impl Store {
    /// Deletes what `r` no longer keeps at `now` (milliseconds since the
    /// epoch: the caller's clock, so a test controls it), batch by batch,
    /// then gives SQLite's freed pages back.
    pub async fn sweep_retention(
        &self,
        r: &Retention,
        now: i64,
    ) -> Result<SweepReport, StoreError> {
        let mut report = SweepReport::default();
        if let Some(before) = cutoff(now, r.runs) {
            // The run's events, egress records and results go with it (ON
            // DELETE CASCADE).
            report.runs = self
                .delete_batches(
                    "DELETE FROM runs WHERE id IN (SELECT id FROM runs \
                     WHERE ended_at IS NOT NULL AND ended_at < $1 LIMIT $2)",
                    before,
                )
                .await?;
        }
        if let Some(before) = cutoff(now, r.egress) {
            report.egress = self
                .delete_batches(
                    "DELETE FROM egress_log WHERE id IN (SELECT e.id FROM runs r \
                     JOIN egress_log e ON e.run_id = r.id \
                     WHERE r.ended_at IS NOT NULL AND r.ended_at < $1 LIMIT $2)",
                    before,
                )
                .await?;
        }
        if let Some(before) = cutoff(now, r.results) {
            report.results = self
                .delete_batches(
                    "DELETE FROM results WHERE run_id IN (SELECT DISTINCT x.run_id FROM runs r \
                     JOIN results x ON x.run_id = r.id \
                     WHERE r.ended_at IS NOT NULL AND r.ended_at < $1 LIMIT $2)",
                    before,
                )
                .await?;
        }
        if let Some(before) = cutoff(now, r.deliveries) {
            report.deliveries = self
                .delete_batches(
                    "DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM webhook_deliveries \
                     WHERE state IN ('delivered', 'failed') AND created_at < $1 LIMIT $2)",
                    before,
                )
                .await?;
        }
        report.spend = self.delete_past_spend(now).await?;
        report.crossings = self
            .delete_batches(
                "DELETE FROM budget_crossings WHERE (org_id, event_key) IN \
                 (SELECT org_id, event_key FROM budget_crossings WHERE crossed_at < $1 LIMIT $2)",
                now.saturating_sub(crate::CROSSINGS_KEPT_DAYS * 86_400_000),
            )
            .await?;
        if !report.is_empty() {
            report.freed_pages = self.give_back_space().await?;
        }
        Ok(report)
    }

    /// Deletes the spend rows of days more than [`SPEND_DAYS_KEPT`] and of
    /// months more than [`SPEND_MONTHS_KEPT`] before `now`'s (period names
    /// sort as their times do): `org_spend` holds two rows per
    /// organization per day otherwise forever. The current periods, and
    /// the reservations charged to them, are never touched.
    async fn delete_past_spend(&self, now: i64) -> Result<u64, StoreError> {
        const DAY_MS: i64 = 86_400_000;
        let days = Periods::at(now.saturating_sub(SPEND_DAYS_KEPT * DAY_MS)).day;
        // 31 days a month at most: the cutoff month is at least as old.
        let months = Periods::at(now.saturating_sub(SPEND_MONTHS_KEPT * 31 * DAY_MS)).month;
        let n = on_pool!(self, p => sqlx::query(
            "DELETE FROM org_spend WHERE (period LIKE 'day:%' AND period < $1) \
             OR (period LIKE 'month:%' AND period < $2)",
        )
        .bind(days)
        .bind(months)
        .execute(p)
        .await
        .map_err(|e| self.err(e))?
        .rows_affected());
        Ok(n)
    }

    /// Runs `sql` (a DELETE bound to a cutoff `$1` and a batch size `$2`)
    /// until a batch deletes nothing; the rows deleted in all.
    async fn delete_batches(&self, sql: &'static str, before: i64) -> Result<u64, StoreError> {
        let mut total = 0u64;
        loop {
            let n = on_pool!(self, p => sqlx::query(sql)
                .bind(before)
                .bind(SWEEP_BATCH)
                .execute(p)
                .await
                .map_err(|e| self.err(e))?
                .rows_affected());
            total += n;
            if n == 0 {
                return Ok(total);
            }
        }
    }

    /// SQLite: returns the free pages to the file system (a store in
    /// incremental auto-vacuum mode); the number of pages freed.
    async fn give_back_space(&self) -> Result<u64, StoreError> {
        let Pool::Sqlite(p) = &self.pool else {
            return Ok(0);
        };
        const FREE: &str = "PRAGMA freelist_count";
        let before: i64 = sqlx::query_scalar(FREE)
            .fetch_one(p)
            .await
            .map_err(|e| self.err(e))?;
        sqlx::query("PRAGMA incremental_vacuum")
            .execute(p)
            .await
            .map_err(|e| self.err(e))?;
        let after: i64 = sqlx::query_scalar(FREE)
            .fetch_one(p)
            .await
            .map_err(|e| self.err(e))?;
        Ok(u64::try_from(before.saturating_sub(after)).unwrap_or(0))
    }

    /// Measures every organization's stored bytes (its runs' events, egress
    /// records and results) into `org_usage`, at `now`. A full scan: the
    /// leader does it once per retention sweep.
    pub async fn measure_org_usage(&self, now: i64) -> Result<(), StoreError> {
        // LENGTH counts characters of text (bytes of a blob): near enough
        // for a quota, on both backends.
        const MEASURE: &str = "SELECT r.org_id AS org_id, CAST(COALESCE(SUM(x.n), 0) AS BIGINT) AS n FROM runs r JOIN (\
             SELECT run_id, SUM(LENGTH(payload)) AS n FROM run_events GROUP BY run_id \
             UNION ALL SELECT run_id, SUM(LENGTH(body)) AS n FROM results GROUP BY run_id \
             UNION ALL SELECT run_id, SUM(LENGTH(url) + LENGTH(host) + 64) AS n FROM egress_log GROUP BY run_id\
             ) x ON x.run_id = r.id GROUP BY r.org_id";
        const UPSERT: &str = "INSERT INTO org_usage (org_id, stored_bytes, measured_at) \
             VALUES ($1, $2, $3) ON CONFLICT (org_id) DO UPDATE SET \
             stored_bytes = excluded.stored_bytes, measured_at = excluded.measured_at";
        on_pool!(self, p => {
            let rows = sqlx::query(MEASURE).fetch_all(p).await.map_err(|e| self.err(e))?;
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            // An organization with nothing stored any more measures 0.
            sqlx::query("UPDATE org_usage SET stored_bytes = 0, measured_at = $1")
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
            for row in &rows {
                let org: String = row.try_get("org_id").map_err(|e| self.err(e))?;
                let n: i64 = row.try_get("n").map_err(|e| self.err(e))?;
                sqlx::query(UPSERT)
                    .bind(&org)
                    .bind(n)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
            }
            tx.commit().await.map_err(|e| self.err(e))?;
            Ok(())
        })
    }

    /// `org`'s stored bytes as last measured (0: never measured).
    pub async fn org_stored_bytes(&self, org: &str) -> Result<u64, StoreError> {
        let n: Option<i64> = on_pool!(self, p => sqlx::query_scalar(
            "SELECT stored_bytes FROM org_usage WHERE org_id = $1",
        )
        .bind(org)
        .fetch_optional(p)
        .await
        .map_err(|e| self.err(e))?);
        Ok(n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0))
    }

    /// Refuses a run for `org` when its stored bytes, as last measured, are
    /// at or over `quota`.
    pub async fn check_stored_bytes(
        &self,
        org: &str,
        quota: Option<u64>,
    ) -> Result<(), StoreError> {
        let Some(limit) = quota else { return Ok(()) };
        let used = self.org_stored_bytes(org).await?;
        if used >= limit {
            return Err(StoreError::QuotaExceeded {
                what: "stored bytes",
                limit,
            });
        }
        Ok(())
    }

    /// Runs `sql` (an `INSERT … SELECT` of `texts` as `$1…`, then `at`,
    /// then the quota, that inserts only while the count is under it) for
    /// `org`; nothing inserted is [`StoreError::QuotaExceeded`] of `what`,
    /// at `max`. On PostgreSQL the organization's
    /// creations are serialised by an advisory lock for the transaction:
    /// two at the same instant cannot both pass the count (SQLite has one
    /// writer at a time anyway).
    pub(crate) async fn insert_within_quota(
        &self,
        what: &'static str,
        org: &str,
        sql: &'static str,
        texts: &[&str],
        at: i64,
        max: Option<u64>,
    ) -> Result<(), StoreError> {
        let limit = max.and_then(|m| i64::try_from(m).ok()).unwrap_or(i64::MAX);
        let inserted = on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            if matches!(self.pool, Pool::Postgres(_)) {
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                    .bind(org)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
            }
            let mut q = sqlx::query(sql);
            for t in texts {
                q = q.bind(*t);
            }
            let n = q
                .bind(at)
                .bind(limit)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?
                .rows_affected();
            tx.commit().await.map_err(|e| self.err(e))?;
            n > 0
        });
        if !inserted {
            return Err(StoreError::QuotaExceeded {
                what,
                limit: max.unwrap_or(u64::MAX),
            });
        }
        Ok(())
    }
}

/// How often the leader sweeps (`RETENTION_SWEEP_SECONDS`, an hour).
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(3600);

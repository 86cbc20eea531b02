//! `org_budgets` and `org_spend`: an organization's model budgets per day
//! and per month, and what each period has spent.
//!
//! Contract: a model call is charged before it leaves, by
//! [`Store::reserve_org_budget`], which adds its reservation to the day's
//! and the month's spend in one transaction, and only if both stay within
//! their limits: each period's row is changed by one conditional `UPDATE`,
//! so two reservations racing for the last of a budget (two replicas on
//! PostgreSQL, two connections on SQLite) cannot both pass. Once the call's
//! usage is known, [`Store::settle_org_budget`] replaces the reservation
//! with it, and records the thresholds the settled spend reached
//! (`thresholds.rs`). A reservation never settled (the usage never came, the platform
//! went away, the store was unreachable) stays charged: the budget errs on
//! the side of spending less.
//!
//! Periods are UTC and named by the caller ([`Periods`]): `day:YYYY-MM-DD`,
//! `month:YYYY-MM`.
//!
//! Bounds: one `org_budgets` row per organization (written by its API
//! only); `org_spend` gains at most two rows per organization per day it
//! calls a model (its day's, and its month's on the first call of a month).

use sqlx::Row as _;

use crate::thresholds::{Spent, cross_in, read_thresholds};
use crate::{BudgetKind, Store, StoreError, now_ms};

/// The limits of one period; `None`: that measure is not limited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetLimits {
    pub tokens: Option<i64>,
    pub cost_microusd: Option<i64>,
    pub requests: Option<i64>,
}

impl BudgetLimits {
    /// Whether any measure is limited.
    pub fn any(&self) -> bool {
        self.tokens.is_some() || self.cost_microusd.is_some() || self.requests.is_some()
    }
}

/// An organization's budgets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OrgBudget {
    pub day: BudgetLimits,
    pub month: BudgetLimits,
}

impl OrgBudget {
    /// Whether any measure of any period is limited.
    pub fn any(&self) -> bool {
        self.day.any() || self.month.any()
    }
}

/// What a call charges to a budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charge {
    pub tokens: i64,
    pub cost_microusd: i64,
    pub requests: i64,
}

/// What one period has spent: settled charges and the reservations still
/// outstanding (`reserved_*`, counted in the totals too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeriodSpend {
    pub tokens: i64,
    pub cost_microusd: i64,
    pub requests: i64,
    pub reserved_tokens: i64,
    pub reserved_cost_microusd: i64,
}

/// The periods a charge made now falls in (UTC): `day:YYYY-MM-DD` and
/// `month:YYYY-MM`. Their names sort as their times do, which retention
/// relies on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Periods {
    pub day: String,
    pub month: String,
}

impl Periods {
    /// The day and month (UTC) of `unix_ms`.
    pub fn at(unix_ms: i64) -> Periods {
        let t = time::OffsetDateTime::from_unix_timestamp(unix_ms.div_euclid(1000))
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        let (y, m, d) = (t.year(), u8::from(t.month()), t.day());
        Periods {
            day: format!("day:{y:04}-{m:02}-{d:02}"),
            month: format!("month:{y:04}-{m:02}"),
        }
    }
}

/// A budget's period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    Day,
    Month,
}

/// A budget's measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    Tokens,
    CostMicrousd,
    Requests,
}

/// The answer to a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// Charged to every period.
    Granted,
    /// Charged to none: `period`'s `measure` has `spent` of `limit`, and the
    /// call's charge does not fit in what is left.
    Exceeded {
        period: Period,
        measure: Measure,
        limit: i64,
        spent: i64,
    },
}

/// Maps a `org_spend` row to [`PeriodSpend`].
macro_rules! spend_row {
    ($r:expr, $s:expr) => {
        PeriodSpend {
            tokens: $r.try_get("tokens").map_err(|e| $s.err(e))?,
            cost_microusd: $r.try_get("cost_microusd").map_err(|e| $s.err(e))?,
            requests: $r.try_get("requests").map_err(|e| $s.err(e))?,
            reserved_tokens: $r.try_get("reserved_tokens").map_err(|e| $s.err(e))?,
            reserved_cost_microusd: $r
                .try_get("reserved_cost_microusd")
                .map_err(|e| $s.err(e))?,
        }
    };
}

/// Reads organization `$org`'s budgets with executor `$e` (no row: none).
macro_rules! read_budget {
    ($s:expr, $e:expr, $org:expr) => {{
        let row = sqlx::query(
            "SELECT day_tokens, day_cost_microusd, day_requests, month_tokens, \
             month_cost_microusd, month_requests FROM org_budgets WHERE org_id = $1",
        )
        .bind($org)
        .fetch_optional($e)
        .await
        .map_err(|e| $s.err(e))?;
        match row {
            None => OrgBudget::default(),
            Some(r) => {
                let get = |col: &str| -> Result<Option<i64>, StoreError> {
                    r.try_get(col).map_err(|e| $s.err(e))
                };
                OrgBudget {
                    day: BudgetLimits {
                        tokens: get("day_tokens")?,
                        cost_microusd: get("day_cost_microusd")?,
                        requests: get("day_requests")?,
                    },
                    month: BudgetLimits {
                        tokens: get("month_tokens")?,
                        cost_microusd: get("month_cost_microusd")?,
                        requests: get("month_requests")?,
                    },
                }
            }
        }
    }};
}

const SPEND_COLUMNS: &str =
    "tokens, cost_microusd, requests, reserved_tokens, reserved_cost_microusd";

/// Which measure of `limits` a `charge` on top of `spent` would pass.
fn passed(
    limits: &BudgetLimits,
    spent: &PeriodSpend,
    charge: &Charge,
) -> Option<(Measure, i64, i64)> {
    let over = |limit: Option<i64>, spent: i64, add: i64| {
        limit
            .filter(|&l| spent.saturating_add(add) > l)
            .map(|l| (l, spent))
    };
    over(limits.tokens, spent.tokens, charge.tokens)
        .map(|(l, s)| (Measure::Tokens, l, s))
        .or_else(|| {
            over(
                limits.cost_microusd,
                spent.cost_microusd,
                charge.cost_microusd,
            )
            .map(|(l, s)| (Measure::CostMicrousd, l, s))
        })
        .or_else(|| {
            over(limits.requests, spent.requests, charge.requests)
                .map(|(l, s)| (Measure::Requests, l, s))
        })
}

impl Store {
    /// Sets an organization's budgets (all `None`: none).
    pub async fn set_org_budget(&self, org: &str, b: &OrgBudget) -> Result<(), StoreError> {
        on_pool!(self, p => sqlx::query(
            "INSERT INTO org_budgets (org_id, day_tokens, day_cost_microusd, day_requests, \
             month_tokens, month_cost_microusd, month_requests, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (org_id) DO UPDATE SET day_tokens = $2, day_cost_microusd = $3, \
             day_requests = $4, month_tokens = $5, month_cost_microusd = $6, \
             month_requests = $7, updated_at = $8",
        )
        .bind(org)
        .bind(b.day.tokens)
        .bind(b.day.cost_microusd)
        .bind(b.day.requests)
        .bind(b.month.tokens)
        .bind(b.month.cost_microusd)
        .bind(b.month.requests)
        .bind(now_ms())
        .execute(p)
        .await
        .map(|_| ())
        .map_err(|e| self.err(e)))
    }

    /// An organization's budgets (none set: no limit).
    pub async fn org_budget(&self, org: &str) -> Result<OrgBudget, StoreError> {
        Ok(on_pool!(self, p => read_budget!(self, p, org)))
    }

    /// What an organization has spent in the day and the month of `periods`.
    pub async fn org_spend(
        &self,
        org: &str,
        periods: &Periods,
    ) -> Result<(PeriodSpend, PeriodSpend), StoreError> {
        let mut out = (PeriodSpend::default(), PeriodSpend::default());
        on_pool!(self, p => {
            let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT period, {SPEND_COLUMNS} FROM org_spend \
                 WHERE org_id = $1 AND period IN ($2, $3)"
            )))
            .bind(org)
            .bind(&periods.day)
            .bind(&periods.month)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            for r in &rows {
                let period: String = r.try_get("period").map_err(|e| self.err(e))?;
                let spend = spend_row!(r, self);
                if period == periods.day {
                    out.0 = spend;
                } else {
                    out.1 = spend;
                }
            }
        });
        Ok(out)
    }

    /// Charges `charge` to the day and the month of `periods`, in one
    /// transaction, if it fits within every limit of both; else charges
    /// nothing and says which limit it would pass.
    pub async fn reserve_org_budget(
        &self,
        org: &str,
        periods: &Periods,
        charge: &Charge,
    ) -> Result<Reservation, StoreError> {
        on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            // Written first: a SQLite transaction that read before it wrote
            // could not take the write lock from a writer that came between.
            for period in [&periods.day, &periods.month] {
                sqlx::query(
                    "INSERT INTO org_spend (org_id, period) VALUES ($1, $2) \
                     ON CONFLICT (org_id, period) DO NOTHING",
                )
                .bind(org)
                .bind(period)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
            }
            let budget = read_budget!(self, &mut *tx, org);
            for (kind, period, limits) in [
                (Period::Day, &periods.day, budget.day),
                (Period::Month, &periods.month, budget.month),
            ] {
                let unlimited = |l: Option<i64>| l.unwrap_or(i64::MAX);
                // The condition is judged on the row as it is when this
                // statement holds its lock: a racing reservation's charge
                // is in it.
                let n = sqlx::query(
                    "UPDATE org_spend SET tokens = tokens + $3, \
                     cost_microusd = cost_microusd + $4, requests = requests + $5, \
                     reserved_tokens = reserved_tokens + $3, \
                     reserved_cost_microusd = reserved_cost_microusd + $4 \
                     WHERE org_id = $1 AND period = $2 AND tokens + $3 <= $6 \
                     AND cost_microusd + $4 <= $7 AND requests + $5 <= $8",
                )
                .bind(org)
                .bind(period)
                .bind(charge.tokens)
                .bind(charge.cost_microusd)
                .bind(charge.requests)
                .bind(unlimited(limits.tokens))
                .bind(unlimited(limits.cost_microusd))
                .bind(unlimited(limits.requests))
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?
                .rows_affected();
                if n == 0 {
                    let r = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "SELECT {SPEND_COLUMNS} FROM org_spend WHERE org_id = $1 AND period = $2"
                    )))
                    .bind(org)
                    .bind(period)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
                    let spent = spend_row!(r, self);
                    let (measure, limit, spent) = passed(&limits, &spent, charge)
                        .unwrap_or((Measure::Tokens, limits.tokens.unwrap_or(0), spent.tokens));
                    tx.rollback().await.map_err(|e| self.err(e))?;
                    return Ok(Reservation::Exceeded { period: kind, measure, limit, spent });
                }
            }
            tx.commit().await.map_err(|e| self.err(e))?;
        });
        Ok(Reservation::Granted)
    }

    /// Replaces a reservation made by [`Store::reserve_org_budget`] for
    /// `periods` with what run `run`'s call used (its requests stay
    /// counted), and records the thresholds of the organization's budgets
    /// the settled spend reached (`thresholds.rs`), in one transaction.
    pub async fn settle_org_budget(
        &self,
        org: &str,
        run: &str,
        periods: &Periods,
        reserved: &Charge,
        used: &Charge,
    ) -> Result<(), StoreError> {
        on_pool!(self, p => {
            let mut tx = p.begin().await.map_err(|e| self.err(e))?;
            // The day's row, then the month's, as a reservation takes them:
            // two settlements never wait on each other's second row.
            for period in [&periods.day, &periods.month] {
                sqlx::query(
                    "UPDATE org_spend SET tokens = tokens - $3 + $4, \
                     cost_microusd = cost_microusd - $5 + $6, \
                     reserved_tokens = reserved_tokens - $3, \
                     reserved_cost_microusd = reserved_cost_microusd - $5 \
                     WHERE org_id = $1 AND period = $2",
                )
                .bind(org)
                .bind(period)
                .bind(reserved.tokens)
                .bind(used.tokens)
                .bind(reserved.cost_microusd)
                .bind(used.cost_microusd)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
            }
            let budget = read_budget!(self, &mut *tx, org);
            if budget.any() {
                let thresholds = read_thresholds!(self, &mut *tx, org);
                for (kind, period, limits) in [
                    (BudgetKind::OrgDay, &periods.day, budget.day),
                    (BudgetKind::OrgMonth, &periods.month, budget.month),
                ] {
                    if !limits.any() {
                        continue;
                    }
                    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "SELECT {SPEND_COLUMNS} FROM org_spend WHERE org_id = $1 AND period = $2"
                    )))
                    .bind(org)
                    .bind(period)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
                    let Some(r) = row else { continue };
                    let s = spend_row!(r, self);
                    let spent = Spent {
                        tokens: s.tokens.saturating_sub(s.reserved_tokens),
                        cost_microusd: s.cost_microusd.saturating_sub(s.reserved_cost_microusd),
                        requests: s.requests,
                    };
                    cross_in!(self, tx, org, run, kind, period, &limits, &spent, &thresholds)
                        .await?;
                }
            }
            tx.commit().await.map_err(|e| self.err(e))?;
        });
        Ok(())
    }
}

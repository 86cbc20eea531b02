//! `budget_crossings`: each budget threshold a run's or an organization's
//! spend reached, and the `budget.threshold` webhook deliveries it owes.
//!
//! Contract: a threshold is crossed once per budget, measure, threshold and
//! period (a run budget's period is its run; an organization's, its UTC day
//! or month). The spend is added and its crossings recorded in one
//! transaction ([`cross_run_in!`] with a run's usage, the organization's at
//! a settlement, `budgets.rs`); a crossing's row is unique, so of two runs
//! or two replicas that reach it at once only one inserts it, and only the
//! one that inserted it queues its deliveries, in that same transaction
//! (the outbox's contract: a crossing is never stored without them, nor
//! sent twice). A delivery's body is rendered from its crossing when first
//! sent ([`Store::delivery_crossing`]).
//!
//! Spent is what is metered: a run's usage totals; an organization's
//! settled spend (its reservations still outstanding left out: a call's
//! reservation is its bound, not its spend). Requests count when reserved.
//!
//! Bounds: per run at most three measures times [`MAX_THRESHOLDS`] rows,
//! per organization as many per day and per month; rows older than
//! [`CROSSINGS_KEPT_DAYS`] go with the retention sweep.

use sqlx::Row as _;

use crate::{BudgetLimits, Store, StoreError};

/// The webhook event a crossing is.
pub const THRESHOLD_EVENT: &str = "budget.threshold";

/// Thresholds an organization may set at most.
pub const MAX_THRESHOLDS: usize = 10;

/// Days a crossing is kept: longer than any month, so a month's crossing
/// still stops a second one at the month's end.
pub const CROSSINGS_KEPT_DAYS: i64 = 62;

/// Why a list of thresholds is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThresholdsError {
    #[error("at most {MAX_THRESHOLDS} thresholds")]
    TooMany,
    #[error("a threshold is a fraction of the budget above 0 and at most 1")]
    OutOfRange,
    #[error("a threshold is a whole number of thousandths (0.5, 0.125)")]
    TooFine,
}

/// The fractions of each budget at which its organization is told (in
/// thousandths, ascending, distinct); by default 50 %, 80 % and 100 %.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thresholds(Vec<i64>);

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds(vec![500, 800, 1000])
    }
}

impl Thresholds {
    /// Thresholds from fractions of a budget (in `(0, 1]`, each a whole
    /// number of thousandths; repeats are one); `[]`: none.
    pub fn from_fractions(fractions: &[f64]) -> Result<Thresholds, ThresholdsError> {
        let mut out = Vec::with_capacity(fractions.len());
        for &f in fractions {
            if !(f > 0.0 && f <= 1.0) {
                return Err(ThresholdsError::OutOfRange);
            }
            let milli = (f * 1000.0).round();
            if (f * 1000.0 - milli).abs() > 1e-6 {
                return Err(ThresholdsError::TooFine);
            }
            // In 1..=1000: the conversion is exact.
            #[allow(clippy::cast_possible_truncation)]
            out.push(milli as i64);
        }
        out.sort_unstable();
        out.dedup();
        if out.len() > MAX_THRESHOLDS {
            return Err(ThresholdsError::TooMany);
        }
        Ok(Thresholds(out))
    }

    /// The thresholds as fractions, ascending.
    pub fn fractions(&self) -> Vec<f64> {
        self.0.iter().map(|&m| Thresholds::fraction(m)).collect()
    }

    /// A threshold in thousandths as a fraction.
    pub fn fraction(thousandths: i64) -> f64 {
        // Thresholds are at most 1000: exact in an f64.
        #[allow(clippy::cast_precision_loss)]
        let f = thousandths as f64;
        f / 1000.0
    }

    /// The thresholds in thousandths, ascending.
    pub fn thousandths(&self) -> &[i64] {
        &self.0
    }

    /// As stored: a JSON array of thousandths.
    fn to_column(&self) -> String {
        serde_json::to_string(&self.0).unwrap_or_else(|_| "[]".into())
    }

    /// As stored (`NULL`, or a value this version cannot read: the default).
    pub(crate) fn from_column(v: Option<&str>) -> Thresholds {
        v.and_then(|s| serde_json::from_str::<Vec<i64>>(s).ok())
            .filter(|v| v.iter().all(|m| (1..=1000).contains(m)))
            .map_or_else(Thresholds::default, Thresholds)
    }
}

/// Which budget a crossing is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetKind {
    /// A run's own (its period: the run).
    Run,
    /// The organization's, for a UTC day.
    OrgDay,
    /// The organization's, for a UTC month.
    OrgMonth,
}

impl BudgetKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetKind::Run => "run",
            BudgetKind::OrgDay => "org_day",
            BudgetKind::OrgMonth => "org_month",
        }
    }
}

/// What each measure has spent, in a budget's terms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Spent {
    pub tokens: i64,
    pub cost_microusd: i64,
    pub requests: i64,
}

/// One threshold of one budget, reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crossing {
    pub org_id: String,
    /// The run whose spend reached it.
    pub run_id: String,
    /// [`BudgetKind::as_str`].
    pub budget: String,
    /// The run's id, or `day:YYYY-MM-DD` / `month:YYYY-MM` (UTC).
    pub period: String,
    /// `tokens`, `cost_microusd` or `requests`.
    pub measure: String,
    /// In thousandths of the limit.
    pub threshold: i64,
    /// What was spent when it was reached.
    pub spent: i64,
    pub limit: i64,
    pub crossed_at: i64,
}

/// The thresholds `spent` has reached of each limited measure of
/// `limits`: `(measure, threshold, spent, limit)`.
pub(crate) fn reached(
    limits: &BudgetLimits,
    spent: &Spent,
    thresholds: &Thresholds,
) -> Vec<(&'static str, i64, i64, i64)> {
    let mut out = Vec::new();
    for (measure, limit, spent) in [
        ("tokens", limits.tokens, spent.tokens),
        ("cost_microusd", limits.cost_microusd, spent.cost_microusd),
        ("requests", limits.requests, spent.requests),
    ] {
        let Some(limit) = limit.filter(|l| *l > 0) else {
            continue;
        };
        for &t in thresholds.thousandths() {
            if i128::from(spent) * 1000 >= i128::from(t) * i128::from(limit) {
                out.push((measure, t, spent, limit));
            }
        }
    }
    out
}

/// What makes a crossing (and its deliveries, one per webhook) one of its kind.
pub(crate) fn crossing_key(budget: BudgetKind, period: &str, measure: &str, t: i64) -> String {
    format!("budget:{}:{period}:{measure}:{t}", budget.as_str())
}

/// Reads organization `$org`'s thresholds on the executor `$e`.
macro_rules! read_thresholds {
    ($s:expr, $e:expr, $org:expr) => {{
        let v: Option<Option<String>> =
            sqlx::query_scalar("SELECT thresholds FROM org_budgets WHERE org_id = $1")
                .bind($org)
                .fetch_optional($e)
                .await
                .map_err(|e| $s.err(e))?;
        $crate::thresholds::Thresholds::from_column(v.flatten().as_deref())
    }};
}
pub(crate) use read_thresholds;

/// On the transaction `$tx`: records each threshold of budget `$kind`
/// (period `$period`, limits `$limits`) that `$spent` reached and no
/// earlier spend did, and queues its deliveries to organization `$org`'s
/// webhooks that subscribed to [`THRESHOLD_EVENT`]. Evaluates to how many
/// crossings were new.
macro_rules! cross_in {
    ($self:expr, $tx:ident, $org:expr, $run:expr, $kind:expr, $period:expr, $limits:expr, $spent:expr, $thresholds:expr) => {
        async {
            let (org, run, kind, period): (&str, &str, $crate::BudgetKind, &str) =
                ($org, $run, $kind, $period);
            let reached = $crate::thresholds::reached($limits, $spent, $thresholds);
            let mut new = 0usize;
            let at = $crate::now_ms();
            for (measure, t, spent, limit) in reached {
                let key = $crate::thresholds::crossing_key(kind, period, measure, t);
                let n = sqlx::query(
                    "INSERT INTO budget_crossings (org_id, event_key, budget, period, measure, \
                     threshold, spent, limit_value, run_id, crossed_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING",
                )
                .bind(org)
                .bind(&key)
                .bind(kind.as_str())
                .bind(period)
                .bind(measure)
                .bind(t)
                .bind(spent)
                .bind(limit)
                .bind(run)
                .bind(at)
                .execute(&mut *$tx)
                .await
                .map_err(|e| $self.err(e))?
                .rows_affected();
                if n == 0 {
                    continue;
                }
                new += 1;
                $crate::outbox::queue_for_hooks_in!(
                    $self,
                    $tx,
                    org,
                    run,
                    $crate::THRESHOLD_EVENT,
                    at,
                    &key
                )
                .await?;
            }
            Ok::<usize, $crate::StoreError>(new)
        }
    };
}
pub(crate) use cross_in;

/// On the transaction `$tx`, once run `$id`'s usage was added: records
/// the thresholds of its own budget its totals reached ([`cross_in!`]).
macro_rules! cross_run_in {
    ($self:expr, $tx:ident, $id:expr) => {
        async {
            let id: &str = $id;
            let row = sqlx::query(
                "SELECT org_id, tokens_in + tokens_out AS tokens, cost_microusd, requests, \
                 budget_tokens, budget_cost_microusd, budget_requests FROM runs WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(&mut *$tx)
            .await
            .map_err(|e| $self.err(e))?;
            let Some(r) = row else {
                return Ok::<usize, $crate::StoreError>(0);
            };
            let get = |c: &str| -> Result<Option<i64>, $crate::StoreError> {
                sqlx::Row::try_get(&r, c).map_err(|e| $self.err(e))
            };
            let limits = $crate::BudgetLimits {
                tokens: get("budget_tokens")?,
                cost_microusd: get("budget_cost_microusd")?,
                requests: get("budget_requests")?,
            };
            if !limits.any() {
                return Ok(0);
            }
            let spent = $crate::thresholds::Spent {
                tokens: get("tokens")?.unwrap_or(0),
                cost_microusd: get("cost_microusd")?.unwrap_or(0),
                requests: get("requests")?.unwrap_or(0),
            };
            let org: String = sqlx::Row::try_get(&r, "org_id").map_err(|e| $self.err(e))?;
            let thresholds = $crate::thresholds::read_thresholds!($self, &mut *$tx, &org);
            $crate::thresholds::cross_in!(
                $self,
                $tx,
                &org,
                id,
                $crate::BudgetKind::Run,
                id,
                &limits,
                &spent,
                &thresholds
            )
            .await
        }
    };
}
pub(crate) use cross_run_in;

/// Maps a `budget_crossings` row to [`Crossing`].
macro_rules! crossing_row {
    ($r:expr, $s:expr) => {
        Crossing {
            org_id: $r.try_get("org_id").map_err(|e| $s.err(e))?,
            run_id: $r.try_get("run_id").map_err(|e| $s.err(e))?,
            budget: $r.try_get("budget").map_err(|e| $s.err(e))?,
            period: $r.try_get("period").map_err(|e| $s.err(e))?,
            measure: $r.try_get("measure").map_err(|e| $s.err(e))?,
            threshold: $r.try_get("threshold").map_err(|e| $s.err(e))?,
            spent: $r.try_get("spent").map_err(|e| $s.err(e))?,
            limit: $r.try_get("limit_value").map_err(|e| $s.err(e))?,
            crossed_at: $r.try_get("crossed_at").map_err(|e| $s.err(e))?,
        }
    };
}

impl Store {
    /// Sets the thresholds at which an organization's budgets (and its
    /// runs' own) are reported.
    pub async fn set_budget_thresholds(&self, org: &str, t: &Thresholds) -> Result<(), StoreError> {
        on_pool!(self, p => sqlx::query(
            "INSERT INTO org_budgets (org_id, thresholds, updated_at) VALUES ($1, $2, $3) \
             ON CONFLICT (org_id) DO UPDATE SET thresholds = $2, updated_at = $3",
        )
        .bind(org)
        .bind(t.to_column())
        .bind(crate::now_ms())
        .execute(p)
        .await
        .map(|_| ())
        .map_err(|e| self.err(e)))
    }

    /// The thresholds at which an organization's budgets are reported
    /// (none set: [`Thresholds::default`]).
    pub async fn budget_thresholds(&self, org: &str) -> Result<Thresholds, StoreError> {
        Ok(on_pool!(self, p => read_thresholds!(self, p, org)))
    }

    /// An organization's crossings, oldest first (at most `limit`).
    pub async fn budget_crossings(
        &self,
        org: &str,
        limit: i64,
    ) -> Result<Vec<Crossing>, StoreError> {
        on_pool!(self, p => {
            let rows = sqlx::query(
                "SELECT org_id, run_id, budget, period, measure, threshold, spent, limit_value, \
                 crossed_at FROM budget_crossings WHERE org_id = $1 \
                 ORDER BY crossed_at, event_key LIMIT $2",
            )
            .bind(org)
            .bind(limit)
            .fetch_all(p)
            .await
            .map_err(|e| self.err(e))?;
            rows.iter().map(|r| Ok(crossing_row!(r, self))).collect()
        })
    }

    /// The crossing a `budget.threshold` delivery is about (`None`: another
    /// event's, or gone with retention).
    pub async fn delivery_crossing(
        &self,
        org: &str,
        delivery_id: &str,
    ) -> Result<Option<Crossing>, StoreError> {
        on_pool!(self, p => {
            let row = sqlx::query(
                "SELECT c.org_id, c.run_id, c.budget, c.period, c.measure, c.threshold, c.spent, \
                 c.limit_value, c.crossed_at FROM webhook_deliveries d \
                 JOIN budget_crossings c ON c.org_id = d.org_id AND c.event_key = d.event_key \
                 WHERE d.org_id = $1 AND d.id = $2",
            )
            .bind(org)
            .bind(delivery_id)
            .fetch_optional(p)
            .await
            .map_err(|e| self.err(e))?;
            row.map(|r| -> Result<Crossing, StoreError> { Ok(crossing_row!(r, self)) }).transpose()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_are_whole_thousandths_of_a_budget() {
        assert_eq!(Thresholds::default().fractions(), vec![0.5, 0.8, 1.0]);
        let t = Thresholds::from_fractions(&[1.0, 0.5, 0.5, 0.125]).unwrap_or_default();
        assert_eq!(t.thousandths(), &[125, 500, 1000]);
        assert_eq!(Thresholds::from_fractions(&[]).map(|t| t.0), Ok(vec![]));
        for (bad, why) in [
            (0.0, ThresholdsError::OutOfRange),
            (1.01, ThresholdsError::OutOfRange),
            (-0.5, ThresholdsError::OutOfRange),
            (f64::NAN, ThresholdsError::OutOfRange),
            (0.0001, ThresholdsError::TooFine),
        ] {
            assert_eq!(Thresholds::from_fractions(&[bad]), Err(why), "{bad}");
        }
        let many: Vec<f64> = (1..=11).map(|i| f64::from(i) / 20.0).collect();
        assert_eq!(
            Thresholds::from_fractions(&many),
            Err(ThresholdsError::TooMany)
        );
        assert_eq!(Thresholds::from_column(None), Thresholds::default());
        assert_eq!(
            Thresholds::from_column(Some("[2000]")),
            Thresholds::default()
        );
        assert_eq!(Thresholds::from_column(Some(&t.to_column())), t);
    }

    #[test]
    fn a_threshold_is_reached_at_its_fraction_of_each_limited_measure() {
        let limits = BudgetLimits {
            tokens: Some(1000),
            cost_microusd: None,
            requests: Some(3),
        };
        let t = Thresholds::default();
        let spent = |tokens, requests| Spent {
            tokens,
            cost_microusd: 1 << 40,
            requests,
        };
        assert!(reached(&limits, &spent(499, 1), &t).is_empty());
        assert_eq!(
            reached(&limits, &spent(500, 2), &t),
            vec![("tokens", 500, 500, 1000), ("requests", 500, 2, 3)]
        );
        assert_eq!(reached(&limits, &spent(i64::MAX, 0), &t).len(), 3);
    }
}

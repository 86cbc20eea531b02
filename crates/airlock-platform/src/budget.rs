//! Organizations' model budgets as the internal API keeps them
//! ([`Reservations`]): a sidecar's reservation is charged to its run's
//! organization in the store (atomically, across replicas:
//! [`Store::reserve_org_budget`]) and held here until the sidecar settles
//! it with the call's usage. A reservation never settled (the sidecar died,
//! the run ended first, this platform restarted) stays charged.
//!
//! Periods are UTC days and months ([`periods_at`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use airlock_platform_api::budget::{
    Amount, Exceeded, Measure, ReserveAnswer, ReserveRequest, Scope, SettleRequest,
};
use airlock_store::{Charge, Period, Periods, Reservation, Store, StoreError};

/// Reservations held per run at most; past it a reservation is still
/// charged, but cannot be settled (it stays charged).
const HELD_PER_RUN: usize = 4096;

/// The day and month (UTC) of `unix_ms`, as the store names them.
pub fn periods_at(unix_ms: i64) -> Periods {
    Periods::at(unix_ms)
}

/// A charge in the store's terms (amounts past `i64::MAX` are `i64::MAX`).
fn charge(a: &Amount) -> Charge {
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Charge {
        tokens: n(a.tokens),
        cost_microusd: n(a.cost_microusd),
        requests: n(a.requests),
    }
}

/// One reservation charged and not yet settled.
struct Held {
    org: String,
    periods: Periods,
    charge: Charge,
}

/// Reservations charged and not yet settled, per run.
#[derive(Default)]
pub struct Reservations {
    held: Mutex<HashMap<String, HashMap<String, Held>>>,
    next: AtomicU64,
}

impl Reservations {
    /// Charges run `run_id`'s call to organization `org`'s budgets now.
    pub async fn reserve(
        &self,
        store: &Store,
        run_id: &str,
        org: &str,
        req: &ReserveRequest,
    ) -> Result<ReserveAnswer, StoreError> {
        if !req.priced {
            let b = store.org_budget(org).await?;
            if b.day.cost_microusd.is_some() || b.month.cost_microusd.is_some() {
                return Ok(ReserveAnswer::Unpriced);
            }
        }
        let periods = periods_at(airlock_platform_api::clock::now_ms());
        let c = charge(&req.amount);
        match store.reserve_org_budget(org, &periods, &c).await? {
            Reservation::Granted => {}
            Reservation::Exceeded {
                period,
                measure,
                limit,
                spent,
            } => {
                let u = |v: i64| u64::try_from(v).unwrap_or(0);
                let (measure, needed) = match measure {
                    airlock_store::Measure::Tokens => (Measure::Tokens, req.amount.tokens),
                    airlock_store::Measure::CostMicrousd => {
                        (Measure::CostMicrousd, req.amount.cost_microusd)
                    }
                    airlock_store::Measure::Requests => (Measure::Requests, req.amount.requests),
                };
                return Ok(ReserveAnswer::Exceeded(Exceeded {
                    scope: match period {
                        Period::Day => Scope::OrgDay,
                        Period::Month => Scope::OrgMonth,
                    },
                    measure,
                    limit: u(limit),
                    left: u(limit.saturating_sub(spent)),
                    needed,
                }));
            }
        }
        let id = format!("b{}", self.next.fetch_add(1, Ordering::Relaxed));
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let of_run = held.entry(run_id.to_owned()).or_default();
        if of_run.len() < HELD_PER_RUN {
            of_run.insert(
                id.clone(),
                Held {
                    org: org.to_owned(),
                    periods,
                    charge: c,
                },
            );
        }
        Ok(ReserveAnswer::Granted { id })
    }

    /// Replaces run `run_id`'s reservation with what its call used; `false`
    /// when the run holds no such reservation.
    pub async fn settle(
        &self,
        store: &Store,
        run_id: &str,
        req: &SettleRequest,
    ) -> Result<bool, StoreError> {
        let held = {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.get_mut(run_id).and_then(|r| r.remove(&req.id))
        };
        let Some(h) = held else { return Ok(false) };
        let used = charge(&req.used);
        if let Err(e) = store
            .settle_org_budget(&h.org, run_id, &h.periods, &h.charge, &used)
            .await
        {
            // Held again: a later settlement of the same call may land.
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.entry(run_id.to_owned())
                .or_default()
                .insert(req.id.clone(), h);
            return Err(e);
        }
        Ok(true)
    }

    /// Forgets a run's reservations (its end): those not settled stay charged.
    pub fn forget_run(&self, run_id: &str) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.remove(run_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_utc_days_and_months() {
        assert_eq!(
            periods_at(0),
            Periods {
                day: "day:1970-01-01".into(),
                month: "month:1970-01".into()
            }
        );
        // 2026-12-31T23:59:59.999Z, then the next millisecond.
        let last = 1_798_761_599_999;
        assert_eq!(periods_at(last).day, "day:2026-12-31");
        assert_eq!(periods_at(last + 1).day, "day:2027-01-01");
        assert_eq!(periods_at(last + 1).month, "month:2027-01");
    }
}

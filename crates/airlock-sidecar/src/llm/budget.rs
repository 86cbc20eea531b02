//! Model budgets, kept by the relay before a call leaves ([`Budgets`]).
//!
//! A metered call is charged a reservation taken from its request before
//! it is sent ([`reservation`]): its input counted as one token per byte
//! of the request body (no tokenizer makes more tokens than bytes), its
//! output as the bound it names (`max_tokens`, `max_completion_tokens`,
//! `max_output_tokens`) or, naming none, the run's default
//! ([`RunBudget::default_output`]), priced at the model's prices, and one
//! request. The run's own budget is kept here, under one lock, so two
//! calls cannot both take its last share; the organization's is kept by
//! the platform, which charges the store atomically
//! ([`PlatformClient::reserve_budget`]). A call that does not fit is
//! refused (429 `budget_exceeded`, naming the budget, its limit and what is
//! left) and nothing is charged.
//!
//! Once the answer ends, the reservation is settled ([`Hold::settle`]):
//! replaced by the usage the provider reported, or, when the usage did not
//! arrive whole (the call is unmetered), by the larger of the reservation
//! and what was seen. A call that never reached the provider's generation
//! (refused before it left, a redirect, an error status) is released
//! ([`Hold::release`]). A hold dropped otherwise keeps its reservation.
//!
//! Fail closed: when the organization's budget cannot be read (the
//! platform or its store is unreachable), the call is refused (503
//! `budget_unavailable`) and the reason recorded on the run; when a
//! settlement cannot be delivered, the reservation stays charged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use airlock_platform_api::PlatformClient;
use airlock_platform_api::budget::{
    Amount, Exceeded, Limits, Measure, ReserveAnswer, RunBudget, Scope,
};
use airlock_platform_api::wire::{MAX_CALL_TOKENS, RunEvent};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

use super::meter::{price, saturating_count};
use super::route::Price;
use crate::clock::now_ms;
use crate::keep::Keeper;

/// The budgets of one run's model calls.
pub(super) struct Budgets {
    cfg: RunBudget,
    platform: PlatformClient,
    /// What the run's calls are charged: settled usage and reservations
    /// outstanding.
    charged: Mutex<Amount>,
    /// Whether a refusal of each kind (exceeded, unavailable) was kept as a
    /// vital event already; later ones are log lines.
    recorded: [AtomicBool; 2],
}

/// Why a call may not leave.
pub(super) enum Refusal {
    /// A budget would be passed.
    Exceeded(Exceeded),
    /// The organization's budget could not be read.
    Unavailable(String),
}

/// A call's reservation, charged until it is settled or released.
pub(super) struct Hold {
    budgets: Arc<Budgets>,
    reserved: Amount,
    /// The platform's reservation, when the organization's budget is kept.
    org: Option<String>,
}

/// The members of a request body that bound its output; every other value
/// is skipped as it is parsed. The relay's lean reading of a body reads
/// them with its own members (`request_body::prepare`), so a call's body
/// is parsed once.
#[derive(Default, serde::Deserialize)]
pub(super) struct OutputBound {
    pub(super) max_tokens: Option<Value>,
    pub(super) max_completion_tokens: Option<Value>,
    pub(super) max_output_tokens: Option<Value>,
}

impl OutputBound {
    /// The output a request bounds itself to, if it names a bound (the
    /// largest it names; a bound that is not a count is no bound).
    pub(super) fn tokens(&self) -> Option<u64> {
        [
            &self.max_tokens,
            &self.max_completion_tokens,
            &self.max_output_tokens,
        ]
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .max()
    }
}

/// The output a request body bounds itself to, read for it alone: for a
/// body the lean reading leaves to the whole parsed tree. Every top-level
/// occurrence of a bound counts, so a member named twice
/// (`{"max_tokens":1,"max_tokens":100000}`) reserves its largest value,
/// whichever one the provider's parser keeps; a body that is not a JSON
/// object names no bound.
pub(super) fn output_bound(body: &[u8]) -> Option<u64> {
    serde_json::from_slice::<EveryBound>(body).ok()?.0
}

/// The largest count among every top-level `max_tokens`,
/// `max_completion_tokens` and `max_output_tokens` of an object (repeated
/// members included: a derived struct refuses those, a map keeps one).
struct EveryBound(Option<u64>);

impl<'de> serde::Deserialize<'de> for EveryBound {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = EveryBound;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<EveryBound, A::Error> {
                let mut most: Option<u64> = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if matches!(
                        key.as_ref(),
                        "max_tokens" | "max_completion_tokens" | "max_output_tokens"
                    ) {
                        let v = map.next_value::<Value>()?.as_u64();
                        most = most.max(v);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(EveryBound(most))
            }
        }
        d.deserialize_map(Members)
    }
}

/// µUSD for `input` and `output` tokens at prices per million tokens
/// (USD), rounded up, saturating.
fn priced(input: u64, output: u64, price_in: Option<f64>, price_out: Option<f64>) -> u64 {
    saturating_count(price(input, output, price_in, price_out).ceil())
}

/// The measure of `limits` that `charged` plus `amount` would pass.
fn passed(limits: &Limits, charged: &Amount, amount: &Amount) -> Option<Exceeded> {
    let check = |measure, limit: Option<u64>, have: u64, need: u64| {
        limit
            .filter(|&l| have.saturating_add(need) > l)
            .map(|limit| Exceeded {
                scope: Scope::Run,
                measure,
                limit,
                left: limit.saturating_sub(have),
                needed: need,
            })
    };
    check(
        Measure::Tokens,
        limits.tokens,
        charged.tokens,
        amount.tokens,
    )
    .or_else(|| {
        check(
            Measure::CostMicrousd,
            limits.cost_microusd,
            charged.cost_microusd,
            amount.cost_microusd,
        )
    })
    .or_else(|| {
        check(
            Measure::Requests,
            limits.requests,
            charged.requests,
            amount.requests,
        )
    })
}

fn add(a: &mut Amount, b: &Amount) {
    a.tokens = a.tokens.saturating_add(b.tokens);
    a.cost_microusd = a.cost_microusd.saturating_add(b.cost_microusd);
    a.requests = a.requests.saturating_add(b.requests);
}

fn sub(a: &mut Amount, b: &Amount) {
    a.tokens = a.tokens.saturating_sub(b.tokens);
    a.cost_microusd = a.cost_microusd.saturating_sub(b.cost_microusd);
    a.requests = a.requests.saturating_sub(b.requests);
}

impl Budgets {
    /// The run's budgets, or `None` when none applies.
    pub(super) fn new(cfg: &RunBudget, platform: &PlatformClient) -> Option<Arc<Budgets>> {
        cfg.enforced().then(|| {
            Arc::new(Budgets {
                cfg: cfg.clone(),
                platform: platform.clone(),
                charged: Mutex::default(),
                recorded: Default::default(),
            })
        })
    }

    /// What a call reserves whose request body, as the agent sent it, was
    /// `body_len` bytes and bounded its output to `output_bound` tokens, at
    /// its model's `price`.
    pub(super) fn reservation(
        &self,
        body_len: usize,
        output_bound: Option<u64>,
        price: Price,
    ) -> Amount {
        let cap = |n: u64| n.min(MAX_CALL_TOKENS);
        let input = cap(body_len as u64);
        let output = cap(output_bound.unwrap_or_else(|| self.cfg.default_output()));
        Amount {
            tokens: input + output,
            cost_microusd: priced(input, output, price.input, price.output),
            requests: 1,
        }
    }

    /// Charges `amount` to the run's budget, then to the organization's
    /// (`priced`: the call's model has a price, so its cost is kept).
    pub(super) async fn reserve(
        self: &Arc<Self>,
        amount: Amount,
        priced: bool,
    ) -> Result<Hold, Refusal> {
        {
            let mut charged = self.charged.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = passed(&self.cfg.run, &charged, &amount) {
                return Err(Refusal::Exceeded(e));
            }
            add(&mut charged, &amount);
        }
        let mut hold = Hold {
            budgets: self.clone(),
            reserved: amount,
            org: None,
        };
        if !self.cfg.org {
            return Ok(hold);
        }
        match self.platform.reserve_budget(amount, priced).await {
            Ok(ReserveAnswer::Granted { id }) => {
                hold.org = Some(id);
                Ok(hold)
            }
            Ok(ReserveAnswer::Exceeded(e)) => {
                hold.release();
                Err(Refusal::Exceeded(e))
            }
            Ok(ReserveAnswer::Unpriced) => {
                hold.release();
                Err(Refusal::Unavailable(
                    "the organization has a cost budget and this run's model has no price, \
                     so its cost cannot be kept"
                        .into(),
                ))
            }
            Err(e) => {
                hold.release();
                Err(Refusal::Unavailable(format!(
                    "the organization's budget cannot be read ({e})"
                )))
            }
        }
    }

    /// The agent's answer to a refused call, its reason kept on the run.
    pub(super) fn refuse(&self, refusal: &Refusal, keep: &Keeper) -> Response {
        let (status, kind, message, detail, i) = match refusal {
            Refusal::Exceeded(e) => (
                StatusCode::TOO_MANY_REQUESTS,
                "budget_exceeded",
                format!(
                    "model call refused by the relay: the {} {} budget is {}, {} is left \
                     and this call would need {} (its input and its max_tokens, or the default)",
                    e.scope.as_str(),
                    e.measure.as_str(),
                    e.limit,
                    e.left,
                    e.needed
                ),
                serde_json::to_value(e).unwrap_or(Value::Null),
                0,
            ),
            Refusal::Unavailable(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "budget_unavailable",
                format!("model call refused by the relay (fail closed): {why}"),
                Value::Null,
                1,
            ),
        };
        let line = format!("[airlock] {message}");
        let event = RunEvent::Log {
            at: now_ms(),
            stream: "airlock".into(),
            line,
        };
        if self.recorded[i].swap(true, Ordering::AcqRel) {
            keep.log(event);
        } else {
            let _ = keep.vital(event);
        }
        tracing::info!("{message}");
        let mut error = json!({"type": kind, "code": kind, "message": message});
        if !detail.is_null() {
            error["budget"] = detail;
        }
        (status, axum::Json(json!({"type": "error", "error": error}))).into_response()
    }
}

impl Hold {
    /// What the call reserved.
    pub(super) fn reserved(&self) -> Amount {
        self.reserved
    }

    /// The call never reached the provider's generation: nothing is charged.
    pub(super) fn release(self) {
        self.settle(Amount::default());
    }

    /// Replaces the reservation with `used` (its request stays counted).
    pub(super) fn settle(mut self, used: Amount) {
        let used = Amount {
            requests: self.reserved.requests,
            ..used
        };
        {
            let mut charged = self
                .budgets
                .charged
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            sub(&mut charged, &self.reserved);
            add(&mut charged, &used);
        }
        if let Some(id) = self.org.take() {
            let platform = self.budgets.platform.clone();
            // Not awaited by the answer; undelivered, the reservation
            // stays charged to the organization.
            if let Ok(h) = tokio::runtime::Handle::try_current() {
                h.spawn(async move {
                    if let Err(e) = platform.settle_budget(id, used).await {
                        tracing::warn!("model budget: a reservation stays charged: {e}");
                    }
                });
            }
        }
        // Settled: nothing left for the drop.
        self.reserved = Amount::default();
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.reserved != Amount::default() {
            tracing::debug!("model budget: a call's reservation stays charged");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reserves_its_bytes_and_its_output_bound() {
        assert_eq!(output_bound(br#"{"max_tokens": 50}"#), Some(50));
        assert_eq!(
            output_bound(br#"{"max_completion_tokens": 7, "max_tokens": 3}"#),
            Some(7)
        );
        assert_eq!(output_bound(br#"{"max_output_tokens": 9}"#), Some(9));
        assert_eq!(output_bound(br#"{"max_tokens": -1}"#), None);
        assert_eq!(output_bound(br#"{"max_tokens": "50"}"#), None);
        assert_eq!(output_bound(b"[1]"), None);
        assert_eq!(output_bound(b"not json"), None);
        // A bound named twice reserves its largest value, whichever one
        // the provider keeps; escapes in a key do not hide it.
        for (body, want) in [
            (
                &br#"{"max_tokens":1,"max_tokens":100000}"#[..],
                Some(100_000),
            ),
            (br#"{"max_tokens":100000,"max_tokens":1}"#, Some(100_000)),
            (br#"{"max_tokens":5,"max_t\u006fkens":900}"#, Some(900)),
            (
                br#"{"max_output_tokens":2,"m":{"max_tokens":99},"max_output_tokens":8}"#,
                Some(8),
            ),
            (br#"{"max_tokens":"9","max_tokens":4}"#, Some(4)),
        ] {
            assert_eq!(
                output_bound(body),
                want,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert_eq!(priced(1_000_000, 0, Some(2.5), None), 2_500_000);
        assert_eq!(priced(1, 1, Some(0.1), Some(0.1)), 1);
        assert_eq!(priced(u64::MAX, u64::MAX, Some(1e30), Some(1e30)), u64::MAX);
    }

    #[test]
    fn a_charge_past_a_limit_names_the_measure_and_what_is_left() {
        let limits = Limits {
            tokens: Some(100),
            cost_microusd: None,
            requests: Some(2),
        };
        let charged = Amount {
            tokens: 60,
            cost_microusd: 0,
            requests: 1,
        };
        let call = |tokens| Amount {
            tokens,
            cost_microusd: 5,
            requests: 1,
        };
        assert_eq!(passed(&limits, &charged, &call(40)), None);
        assert_eq!(
            passed(&limits, &charged, &call(41)),
            Some(Exceeded {
                scope: Scope::Run,
                measure: Measure::Tokens,
                limit: 100,
                left: 40,
                needed: 41
            })
        );
        let charged = Amount {
            requests: 2,
            ..charged
        };
        assert_eq!(
            passed(&limits, &charged, &call(1)).map(|e| e.measure),
            Some(Measure::Requests)
        );
    }
}

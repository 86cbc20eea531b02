//! The meter: the usage a provider reported ([`Usage`], folded in event by
//! event), what it costs ([`cost_of`]), and the call's cost event
//! ([`CostDraft::record`]).

use airlock_platform_api::wire::CostRecord;

use super::event::{Counts, EventView};
use super::route::provider_name;
use crate::clock::now_ms;
use crate::config::Provider;

/// What a cost event needs besides the usage.
pub(super) struct CostDraft {
    pub(super) provider: Provider,
    pub(super) model: Option<String>,
    pub(super) price_in: Option<f64>,
    pub(super) price_out: Option<f64>,
    /// The answer is one the relay can read (not content-encoded).
    pub(super) readable: bool,
}

/// Tokens and model as the provider reported them.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Usage {
    pub(super) input: Option<u64>,
    pub(super) output: Option<u64>,
    pub(super) model: Option<String>,
}

impl Usage {
    /// Folds one `usage` object in; later reports replace earlier ones
    /// field by field (Anthropic's `message_delta` carries only the output).
    pub(super) fn merge_usage(&mut self, u: &Counts) {
        if let Some(input) = u.prompt_tokens.or(u.input_tokens) {
            let cache = u
                .cache_creation_input_tokens
                .unwrap_or(0)
                .saturating_add(u.cache_read_input_tokens.unwrap_or(0));
            self.input = Some(input.saturating_add(cache));
        }
        if let Some(output) = u.completion_tokens.or(u.output_tokens) {
            self.output = Some(output);
        }
    }

    /// A reported model; an empty one is no report.
    fn note_model(&mut self, m: &str) {
        if !m.is_empty() && self.model.as_deref() != Some(m) {
            self.model = Some(m.to_owned());
        }
    }

    /// One SSE event or JSON answer: its `usage` and `model`, then those of
    /// its `response` and `message`.
    pub(super) fn observe_event(&mut self, e: &EventView<'_>) {
        let all = [Some(&e.top), e.response.as_ref(), e.message.as_ref()];
        for r in all.iter().flatten() {
            if let Some(u) = &r.usage {
                self.merge_usage(u);
            }
        }
        for r in all.iter().flatten() {
            if let Some(m) = &r.model {
                self.note_model(m);
            }
        }
    }
}

/// What `input` and `output` tokens cost in µUSD at prices per million
/// tokens in USD (a price per token in µUSD), unrounded.
pub(super) fn price(input: u64, output: u64, price_in: Option<f64>, price_out: Option<f64>) -> f64 {
    #[allow(clippy::cast_precision_loss)] // a cost, not an exact count
    let c = input as f64 * price_in.unwrap_or(0.0) + output as f64 * price_out.unwrap_or(0.0);
    c
}

/// A whole number of µUSD as a count: 0 for NaN or below, `u64::MAX` at
/// or past 2^64.
pub(super) fn saturating_count(c: f64) -> u64 {
    if c.is_nan() || c <= 0.0 {
        0
    } else if c >= 18_446_744_073_709_551_615.0 {
        u64::MAX
    } else {
        // In (0, 2^64): the conversion is exact up to f64's precision.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = c as u64;
        n
    }
}

/// What `input` and `output` tokens cost, rounded. A cost past
/// `u64::MAX` (only from hostile counts or prices) is `u64::MAX`, which
/// [`CostRecord::bounded`] then records as unmetered.
fn cost_of(input: u64, output: u64, price_in: Option<f64>, price_out: Option<f64>) -> u64 {
    saturating_count(price(input, output, price_in, price_out).round())
}

impl CostDraft {
    /// The cost event of a call that reported `usage` (its model taken);
    /// `unmetered` says why the call is recorded as unmetered, with the
    /// tokens that were seen.
    pub(super) fn record(self, usage: &mut Usage, unmetered: Option<&str>) -> CostRecord {
        let input = usage.input.unwrap_or(0);
        let output = usage.output.unwrap_or(0);
        if let Some(why) = unmetered {
            tracing::warn!(
                input,
                output,
                "model relay: a call is recorded as unmetered ({why}), with the tokens seen"
            );
        }
        let cost_microusd = (self.price_in.is_some() || self.price_out.is_some())
            .then(|| cost_of(input, output, self.price_in, self.price_out));
        let model = usage
            .model
            .take()
            .or(self.model)
            .unwrap_or_else(|| "unknown".into());
        let record = CostRecord {
            at: now_ms(),
            provider: provider_name(self.provider).into(),
            model,
            input_tokens: input,
            output_tokens: output,
            cost_microusd,
            unmetered: unmetered.is_some(),
            unmetered_reason: unmetered.map(str::to_owned),
        };
        // A provider's hostile numbers (2^64-1 tokens) are recorded as
        // unmetered, never as a count or a cost.
        if let Some(why) = record.implausible() {
            tracing::warn!("model relay: a call is recorded as unmetered ({why})");
        }
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::event;
    use crate::llm::twins::observe_value;
    use serde_json::{Value, json};

    /// What the meter takes of `v`, sent as one event's data.
    fn observe(u: &mut Usage, v: &Value) {
        u.observe_event(&event::read(&v.to_string()).unwrap());
    }

    #[test]
    fn usage_from_every_format() {
        let mut u = Usage::default();
        observe(
            &mut u,
            &json!({"model": "gpt-x", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}),
        );
        assert_eq!(
            (u.input, u.output, u.model.as_deref()),
            (Some(11), Some(7), Some("gpt-x"))
        );

        let mut u = Usage::default();
        observe(
            &mut u,
            &json!({"type": "response.created", "response": {"model": "gpt-r", "usage": null}}),
        );
        observe(
            &mut u,
            &json!({"type": "response.completed", "response": {"model": "gpt-r", "usage": {"input_tokens": 5, "output_tokens": 9}}}),
        );
        assert_eq!(
            (u.input, u.output, u.model.as_deref()),
            (Some(5), Some(9), Some("gpt-r"))
        );

        let mut u = Usage::default();
        observe(
            &mut u,
            &json!({"type": "message_start", "message": {"model": "claude-x", "usage": {"input_tokens": 25, "output_tokens": 1, "cache_read_input_tokens": 3}}}),
        );
        observe(
            &mut u,
            &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}),
        );
        observe(
            &mut u,
            &json!({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 15}}),
        );
        assert_eq!(
            (u.input, u.output, u.model.as_deref()),
            (Some(28), Some(15), Some("claude-x"))
        );

        // Chunks without usage change nothing.
        let before = u.clone();
        observe(
            &mut u,
            &json!({"type": "content_block_delta", "delta": {"text": "hi"}}),
        );
        observe(&mut u, &json!({"usage": "not an object", "model": 3}));
        assert_eq!(u, before);
    }

    /// An event's data read in place meters exactly what the same data
    /// parsed into a `Value` does, event after event (the model and counts
    /// carry over), for the providers' formats and for hostile ones:
    /// repeated keys, values of the wrong type, escapes, nesting.
    #[test]
    fn events_read_in_place_meter_as_a_value_would() {
        let streams: &[&[&str]] = &[
            &[
                r#"{"id":"c","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
                r#"{"id":"c","model":"gpt-x","choices":[{"index":0,"delta":{"content":"usage"}}],"usage":null}"#,
                r#"{"id":"c","model":"gpt-x","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}"#,
            ],
            &[
                r#"{"type":"message_start","message":{"id":"m","model":"claude-x","usage":{"input_tokens":25,"output_tokens":1,"cache_creation_input_tokens":4,"cache_read_input_tokens":3}}}"#,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"{\"usage\":1}"}}"#,
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}"#,
            ],
            &[
                r#"{"type":"response.created","response":{"model":"gpt-r","usage":null}}"#,
                r#"{"type":"response.completed","response":{"model":"gpt-r","usage":{"input_tokens":5,"output_tokens":9}},"model":""}"#,
            ],
            &[
                r#"{"usage":{"prompt_tokens":1},"usage":{"completion_tokens":2},"model":"a","model":"b"}"#,
                r#"{"usage":"no","model":3,"response":[{"usage":{"input_tokens":9}}],"message":"x"}"#,
                r#"{"usage":{"prompt_tokens":-4,"completion_tokens":2.0,"output_tokens":"7","input_tokens":18446744073709551615},"model":"mé"}"#,
                r#"{"message":{"usage":{"input_tokens":1},"usage":null,"model":"x","model":""},"response":{"model":"r"},"model":"t"}"#,
                r#"[{"usage":{"prompt_tokens":1}}]"#,
                r#"{"choices":{},"usage":{"prompt_tokens":6,"prompt_tokens":{"n":1}}}"#,
                "42",
            ],
        ];
        for stream in streams {
            let (mut as_value, mut in_place) = (Usage::default(), Usage::default());
            for data in *stream {
                observe_value(&mut as_value, &serde_json::from_str::<Value>(data).unwrap());
                in_place.observe_event(&event::read(data).unwrap());
                assert_eq!(in_place, as_value, "after {data}");
            }
        }
    }
}

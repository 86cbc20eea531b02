//! The platform's operator metrics (docs/observability.md): one registry
//! per platform process, written in Prometheus's text format by
//! [`Metrics::encode`] (`airlock serve` serves it on `METRICS_LISTEN`).
//!
//! Contracts:
//! - **Labels are bounded.** Every label value is one of a closed set (a
//!   run's status, a backend's name, an egress source, decision or refusal
//!   code, a provider), or a model name admitted by [`ModelLabels`]: at
//!   most [`MODEL_LABELS_MAX`] distinct plain names, every other one
//!   `other`. No run id, organization, URL, host or secret is ever a label.
//! - **Counted once, where the platform receives it.** What a sidecar
//!   reports (egress records, refusals, model usage) is counted as the
//!   platform's journal follower stores it ([`crate::journal`]): a record
//!   by its `seq` the first time it is stored, an event by its place in the
//!   journal. A sidecar that dies loses nothing (its journal is read to
//!   its end), and a journal read again counts nothing twice. A crashed
//!   platform's counters go with it: the boot reclaim stores its runs'
//!   journals without counting them.
//! - **Nothing on the request path.** The sidecar counts nothing; the
//!   platform counts per run and per journal read.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use airlock_platform_api::wire::{CostRecord, EgressRecord, RunEvent};
use airlock_store::RunStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The most distinct model names used as labels; later ones are `other`.
pub const MODEL_LABELS_MAX: usize = 32;

/// The longest model name used as a label.
const MODEL_LABEL_MAX_LEN: usize = 64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndLabels {
    status: &'static str,
    backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EgressLabels {
    source: &'static str,
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabelSet {
    provider: &'static str,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    provider: &'static str,
    model: String,
    kind: &'static str,
}

/// Each metric's help text (what `# HELP` says of it).
mod help {
    pub(super) const RUN_DURATION: &str =
        "How long runs ran, from their start to their recorded end";
    pub(super) const SANDBOX_START: &str = "From a run's start until its sandbox was spawned";
    pub(super) const SIDECAR_START: &str = "From a sidecar's spawn until it said it was ready";
    pub(super) const RUNS_ENDED: &str = "Runs this platform ended, by status and backend";
    pub(super) const RUNS_RUNNING: &str = "Runs running on this platform now, by backend";
    pub(super) const QUEUE_DEPTH: &str =
        "Runs queued in the store, every organization (read when scraped)";
    pub(super) const EGRESS_REQUESTS: &str = "Outbound requests the sidecars recorded, by source (api_call, llm, proxy, mcp, runner) and the guard's decision";
    pub(super) const EGRESS_REFUSALS: &str =
        "Outbound requests the guard refused, by refusal code (aggregated refusals included)";
    pub(super) const MODEL_CALLS: &str = "Model calls the sidecars metered, by provider and model";
    pub(super) const MODEL_TOKENS: &str =
        "Tokens of metered model calls, by provider, model and kind (input, output)";
    pub(super) const MODEL_COST: &str =
        "Cost of metered model calls in millionths of a US dollar, by provider and model";
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn run_seconds() -> Histogram {
    // 0.25 s to about 68 min.
    Histogram::new(exponential_buckets(0.25, 2.0, 15))
}

fn start_seconds() -> Histogram {
    // 5 ms to about 41 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// The platform's metrics. Shared by the orchestrator, its journal
/// followers and whoever serves them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    runs_ended: Family<EndLabels, Counter>,
    runs_running: Family<BackendLabels, Gauge>,
    run_duration: Histograms<EndLabels>,
    sandbox_start: Histograms<BackendLabels>,
    sidecar_start: Histograms<BackendLabels>,
    queue_depth: Gauge,
    egress: Family<EgressLabels, Counter>,
    refusals: Family<RefusalLabels, Counter>,
    model_calls: Family<ModelLabelSet, Counter>,
    tokens: Family<TokenLabels, Counter>,
    cost: Family<ModelLabelSet, Counter>,
    models: ModelLabels,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("airlock"),
            runs_ended: Family::default(),
            runs_running: Family::default(),
            run_duration: Family::new_with_constructor(run_seconds),
            sandbox_start: Family::new_with_constructor(start_seconds),
            sidecar_start: Family::new_with_constructor(start_seconds),
            queue_depth: Gauge::default(),
            egress: Family::default(),
            refusals: Family::default(),
            model_calls: Family::default(),
            tokens: Family::default(),
            cost: Family::default(),
            models: ModelLabels::default(),
        };
        let r = &mut m.registry;
        let seconds = Unit::Seconds;
        r.register_with_unit(
            "run_duration",
            help::RUN_DURATION,
            seconds.clone(),
            m.run_duration.clone(),
        );
        for (name, help, starts) in [
            ("sandbox_start", help::SANDBOX_START, &m.sandbox_start),
            ("sidecar_start", help::SIDECAR_START, &m.sidecar_start),
        ] {
            r.register_with_unit(name, help, seconds.clone(), starts.clone());
        }
        r.register("runs_ended", help::RUNS_ENDED, m.runs_ended.clone());
        r.register("runs_running", help::RUNS_RUNNING, m.runs_running.clone());
        r.register("queue_depth", help::QUEUE_DEPTH, m.queue_depth.clone());
        r.register("egress_requests", help::EGRESS_REQUESTS, m.egress.clone());
        r.register("egress_refusals", help::EGRESS_REFUSALS, m.refusals.clone());
        r.register("model_calls", help::MODEL_CALLS, m.model_calls.clone());
        r.register("model_tokens", help::MODEL_TOKENS, m.tokens.clone());
        r.register("model_cost_microusd", help::MODEL_COST, m.cost.clone());
        m
    }

    /// The metrics in Prometheus's text format (OpenMetrics text, which
    /// Prometheus's parsers read).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The queue's depth, as the store says it is now.
    pub fn set_queue_depth(&self, depth: i64) {
        self.queue_depth.set(depth);
    }

    /// A run started running on `backend`; the guard marks its end.
    pub fn run_started(&self, backend: &'static str) -> Running<'_> {
        self.runs_running
            .get_or_create(&BackendLabels { backend })
            .inc();
        Running {
            metrics: self,
            backend,
        }
    }

    /// A run of `backend` ended `status`, after `ran` (`None`: it never
    /// started, e.g. a queued run cancelled).
    pub fn run_ended(&self, status: RunStatus, backend: &'static str, ran: Option<Duration>) {
        let labels = EndLabels {
            status: status.as_str(),
            backend,
        };
        self.runs_ended.get_or_create(&labels).inc();
        if let Some(ran) = ran {
            self.run_duration
                .get_or_create(&labels)
                .observe(ran.as_secs_f64());
        }
    }

    /// A sandbox of `backend` was spawned `after` its run started.
    pub fn sandbox_started(&self, backend: &'static str, after: Duration) {
        self.sandbox_start
            .get_or_create(&BackendLabels { backend })
            .observe(after.as_secs_f64());
    }

    /// A sidecar of `backend` said it was ready `after` it was spawned.
    pub fn sidecar_started(&self, backend: &'static str, after: Duration) {
        self.sidecar_start
            .get_or_create(&BackendLabels { backend })
            .observe(after.as_secs_f64());
    }

    /// What one read of a run's journal stored: every record not counted
    /// before (by `seq`, noted in `seen`; a record without one is counted
    /// as it comes) and every event.
    pub fn journalled<'a>(
        &self,
        records: impl IntoIterator<Item = &'a EgressRecord>,
        events: impl IntoIterator<Item = &'a RunEvent>,
        seen: &mut HashSet<u64>,
    ) {
        for r in records {
            if r.seq.is_some_and(|s| !seen.insert(s)) {
                continue;
            }
            self.egress
                .get_or_create(&EgressLabels {
                    source: r.source.as_str(),
                    decision: r.decision.as_str(),
                })
                .inc();
            if let Some(code) = r.code {
                self.refusals
                    .get_or_create(&RefusalLabels {
                        code: code.as_str(),
                    })
                    .inc();
            }
        }
        for e in events {
            match e {
                RunEvent::Cost(c) => self.model_call(c),
                RunEvent::Refusals { code, count, .. } => {
                    self.refusals
                        .get_or_create(&RefusalLabels {
                            code: code.as_str(),
                        })
                        .inc_by(*count);
                }
                _ => {}
            }
        }
    }

    fn model_call(&self, c: &CostRecord) {
        let provider = provider_label(&c.provider);
        let model = self.models.label(&c.model);
        let labels = ModelLabelSet { provider, model };
        self.model_calls.get_or_create(&labels).inc();
        for (kind, n) in [("input", c.input_tokens), ("output", c.output_tokens)] {
            self.tokens
                .get_or_create(&TokenLabels {
                    provider,
                    model: labels.model.clone(),
                    kind,
                })
                .inc_by(n);
        }
        self.cost
            .get_or_create(&labels)
            .inc_by(c.cost_microusd.unwrap_or(0));
    }
}

/// A run running; dropped, it is no longer counted as running.
pub struct Running<'a> {
    metrics: &'a Metrics,
    backend: &'static str,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.metrics
            .runs_running
            .get_or_create(&BackendLabels {
                backend: self.backend,
            })
            .dec();
    }
}

/// A provider as a label: one of the relay's providers, else `other`.
fn provider_label(p: &str) -> &'static str {
    match p {
        "openai" => "openai",
        "anthropic" => "anthropic",
        _ => "other",
    }
}

/// The model names admitted as label values: plain names (letters, digits,
/// `.-_:/@`, at most [`MODEL_LABEL_MAX_LEN`]) up to [`MODEL_LABELS_MAX`]
/// of them, first come; every other name is `other`. (A model name is the
/// provider's, or the agent's when the provider named none: it is bounded
/// here, never trusted to be few.)
#[derive(Debug, Default)]
struct ModelLabels {
    admitted: Mutex<HashSet<String>>,
}

impl ModelLabels {
    fn label(&self, model: &str) -> String {
        let plain = !model.is_empty()
            && model.len() <= MODEL_LABEL_MAX_LEN
            && model
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-_:/@".contains(&b));
        if !plain {
            return "other".to_owned();
        }
        let Ok(mut admitted) = self.admitted.lock() else {
            return "other".to_owned();
        };
        if admitted.contains(model) || admitted.len() < MODEL_LABELS_MAX {
            admitted.insert(model.to_owned());
            return model.to_owned();
        }
        "other".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_platform_api::wire::{EgressDecision, RefusalCode};

    fn record(seq: u64, decision: EgressDecision, code: Option<RefusalCode>) -> EgressRecord {
        serde_json::from_value(serde_json::json!({
            "at": 1, "source": "api_call", "method": "GET", "url": "https://example.test/p",
            "host": "example.test", "decision": decision, "code": code, "seq": seq,
        }))
        .unwrap()
    }

    fn cost(model: &str) -> RunEvent {
        RunEvent::Cost(CostRecord {
            at: 1,
            provider: "openai".into(),
            model: model.into(),
            input_tokens: 7,
            output_tokens: 3,
            cost_microusd: Some(11),
            unmetered: false,
            unmetered_reason: None,
        })
    }

    /// A record read twice (its start, then its completion) is one request;
    /// refusals count by code, aggregated ones with their count.
    #[test]
    fn a_record_counts_once_by_its_seq_and_refusals_by_code() {
        let m = Metrics::new();
        let mut seen = HashSet::new();
        let refused = record(2, EgressDecision::Refused, Some(RefusalCode::NotAuthorized));
        let allowed = record(1, EgressDecision::Allowed, None);
        let agg = RunEvent::Refusals {
            at: 1,
            code: RefusalCode::NotAuthorized,
            host: "h".into(),
            count: 5,
        };
        m.journalled([&allowed, &refused], [&agg], &mut seen);
        m.journalled([&allowed], [], &mut seen);
        let text = m.encode();
        assert!(
            text.contains(
                r#"airlock_egress_requests_total{source="api_call",decision="allowed"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"airlock_egress_refusals_total{code="not_authorized"} 6"#),
            "{text}"
        );
    }

    /// Model names are bounded: odd ones and those past the cap are `other`.
    #[test]
    fn model_labels_are_bounded() {
        let m = Metrics::new();
        let mut seen = HashSet::new();
        let names: Vec<String> = (0..MODEL_LABELS_MAX + 5).map(|i| format!("m{i}")).collect();
        let events: Vec<RunEvent> = names
            .iter()
            .map(|n| cost(n))
            .chain([cost("has space"), cost(&"x".repeat(65))])
            .collect();
        m.journalled([], events.iter(), &mut seen);
        let text = m.encode();
        assert!(text.contains(r#"model="m0""#), "{text}");
        assert!(!text.contains(&format!("model=\"m{MODEL_LABELS_MAX}\"")));
        assert!(
            text.contains(r#"airlock_model_calls_total{provider="openai",model="other"} 7"#),
            "{text}"
        );
        assert!(!text.contains("has space"));
    }

    /// Running runs are counted while their guard lives; an end counts by
    /// status and backend with its duration.
    #[test]
    fn runs_are_counted_while_running_and_at_their_end() {
        let m = Metrics::new();
        let g = m.run_started("process");
        assert!(
            m.encode()
                .contains(r#"airlock_runs_running{backend="process"} 1"#)
        );
        drop(g);
        m.run_ended(
            RunStatus::Succeeded,
            "process",
            Some(Duration::from_secs(1)),
        );
        let text = m.encode();
        assert!(text.contains(r#"airlock_runs_running{backend="process"} 0"#));
        assert!(
            text.contains(r#"airlock_runs_ended_total{status="succeeded",backend="process"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"airlock_run_duration_seconds_count{status="succeeded",backend="process"} 1"#
            ),
            "{text}"
        );
    }
}

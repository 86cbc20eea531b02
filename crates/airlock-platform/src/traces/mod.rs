//! OpenTelemetry traces of runs (docs/observability.md): off unless
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set; exported over OTLP/HTTP (protobuf) by `opentelemetry-otlp`,
//! which reads the standard `OTEL_EXPORTER_OTLP_*` variables (headers,
//! timeout, compression), as the SDK reads `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_BSP_*`.
//!
//! Contracts:
//! - **One trace per run**: a root span `run`, with children `start` (plan
//!   and start), one span per outbound request the run's sidecar recorded
//!   (`api_call`, `model_call`, `proxy`, `mcp`, `runner`), and `teardown`.
//! - **The sidecar's spans are forwarded, not exported by the sidecar**:
//!   the sidecar writes what each request did into its egress record (the
//!   journal the platform already follows, so nothing is lost when it
//!   dies, and a sidecar holds no exporter or collector address); the
//!   platform makes the spans from the records, parented to the run's span.
//! - **The collector is an egress site**: [`exporter`] sends every export
//!   through the egress guard; the endpoint is judged at boot too.
//! - **Attributes carry no secret**: the run's id, backend and status, and
//!   of a request its source, method, host (never its URL, query or path),
//!   decision, refusal code, status and sizes. Nothing of a prompt, a
//!   credential or a header.
//! - **Off costs nothing**: with no endpoint, there is no provider; the
//!   orchestrator holds `None` and no record is kept for a trace.

mod exporter;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use airlock_egress::{EgressCode, EgressError};
use airlock_platform_api::wire::{EgressDecision, EgressOutcome, EgressRecord, EgressSource};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue, trace::TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use crate::settings::Settings;

pub use exporter::ExportError;

/// The variables that turn traces on (either one), and off again.
pub const ENV_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const ENV_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const ENV_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
pub const ENV_TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
/// One export's timeout in milliseconds (the traces one wins; 10000): the
/// guarded client applies it (the exporter's built-in clients would).
pub const ENV_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
pub const ENV_TRACES_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT";
/// The spans' `service.name` (`airlock` when unset).
pub const ENV_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    #[error("{var}: {value:?} is not a URL the OTLP exporter can send to: {source}")]
    Endpoint {
        var: &'static str,
        value: String,
        source: EgressError,
    },
    #[error(
        "{var}: the egress guard refuses the collector ({source}); a collector on a private address must be listed in EGRESS_ALLOW_INTERNAL_HOSTS"
    )]
    Refused {
        var: &'static str,
        source: EgressError,
    },
    #[error("AIRLOCK_DNS_SERVER: {0}")]
    Resolver(airlock_egress::ResolveError),
    #[error("the OTLP exporter's client: {0}")]
    Client(EgressError),
    #[error("the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The variable `var`; set to blanks is unset.
fn get(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}

/// The endpoint traces go to, as the OTLP exporter derives it: the traces
/// variable as it is, else the general one with `/v1/traces`; `None`:
/// traces are off. `get` reads a variable (blank is unset).
fn endpoint(get: impl Fn(&str) -> Option<String>) -> Option<(&'static str, String)> {
    let off = get(ENV_SDK_DISABLED).is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || get(ENV_TRACES_EXPORTER).is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    if off {
        return None;
    }
    if let Some(e) = get(ENV_TRACES_ENDPOINT) {
        return Some((ENV_TRACES_ENDPOINT, e.trim().to_owned()));
    }
    get(ENV_ENDPOINT).map(|e| {
        (
            ENV_ENDPOINT,
            format!("{}/v1/traces", e.trim().trim_end_matches('/')),
        )
    })
}

/// One export's timeout: `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else
/// `OTEL_EXPORTER_OTLP_TIMEOUT`, in milliseconds (10 s when unset or not
/// a whole number above 0).
fn export_timeout(get: impl Fn(&str) -> Option<String>) -> Duration {
    get(ENV_TRACES_TIMEOUT)
        .or_else(|| get(ENV_TIMEOUT))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

/// The platform's tracer, when traces are on.
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Traces")
    }
}

impl Traces {
    /// Traces as the environment asks (`None`: off), the collector judged
    /// by the egress guard now (a refusal stops the boot; a name that does
    /// not resolve yet is only warned about: every export is judged again).
    /// Call within the platform's tokio runtime.
    pub async fn from_env(settings: &Settings) -> Result<Option<Arc<Traces>>, TracesError> {
        let Some((var, url)) = endpoint(get) else {
            return Ok(None);
        };
        let target =
            airlock_egress::Target::parse(&url).map_err(|source| TracesError::Endpoint {
                var,
                value: url.clone(),
                source,
            })?;
        let mut policy = airlock_egress::EgressPolicy::new();
        policy.allow_internal_hosts(settings.allow_internal_hosts.iter().map(String::as_str));
        let resolver: Arc<dyn airlock_egress::Resolve> = match &settings.dns_server {
            Some(d) => Arc::new(
                airlock_egress::DnsServerResolver::parse_addr(d)
                    .and_then(airlock_egress::DnsServerResolver::new)
                    .map_err(TracesError::Resolver)?,
            ),
            None => Arc::new(airlock_egress::SystemResolver),
        };
        let client = airlock_egress::GuardedClient::new(
            airlock_egress::Guard::new(policy, resolver),
            exporter::client_config(export_timeout(get)),
        )
        .map_err(TracesError::Client)?;
        let export =
            exporter::GuardedExport::new(client, &target, tokio::runtime::Handle::current());
        match export.judge(&url).await {
            Ok(()) => {}
            Err(e) if e.code == EgressCode::Unresolvable => {
                tracing::warn!("{var}: the collector's name does not resolve yet: {e}");
            }
            Err(source) => return Err(TracesError::Refused { var, source }),
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url)
            .with_http_client(export)
            .build()?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(get(ENV_SERVICE_NAME).unwrap_or_else(|| "airlock".into()))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("airlock");
        Ok(Some(Arc::new(Traces { provider, tracer })))
    }

    /// Exports what is pending and stops (the platform's stop). The SDK's
    /// shutdown blocks until its export thread is done, and that export
    /// runs on this runtime: it waits on a blocking thread.
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("traces: {e}"),
            Err(e) => tracing::warn!("traces: {e}"),
        }
    }

    /// The root span of run `run_id`, on `backend`, started now.
    pub fn run(self: &Arc<Self>, run_id: &str, backend: &'static str) -> RunTrace {
        let span = self
            .tracer
            .span_builder("run")
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("airlock.run.id", run_id.to_owned()),
                KeyValue::new("airlock.backend", backend),
            ])
            .start_with_context(&self.tracer, &Context::new());
        RunTrace {
            traces: self.clone(),
            cx: Context::new().with_span(span),
        }
    }
}

/// A run's trace while it runs.
pub struct RunTrace {
    traces: Arc<Traces>,
    cx: Context,
}

/// A phase of a run (`start`, `teardown`): ended when dropped.
pub struct Phase {
    cx: Context,
}

impl Drop for Phase {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

impl RunTrace {
    /// A child span `name` of the run, from now until the guard is dropped.
    pub fn phase(&self, name: &'static str) -> Phase {
        let span = self
            .traces
            .tracer
            .span_builder(name)
            .start_with_context(&self.traces.tracer, &self.cx);
        Phase {
            cx: Context::new().with_span(span),
        }
    }

    /// The spans of the run's outbound requests, as its sidecar recorded
    /// them (each record's final state).
    pub fn requests<'a>(&self, records: impl IntoIterator<Item = &'a EgressRecord>) {
        for r in records {
            self.request(r);
        }
    }

    fn request(&self, r: &EgressRecord) {
        let tracer = &self.traces.tracer;
        // The request from its record (its start, its duration), widened to
        // the sidecar's steps (the guard's decision and the credential's
        // fetch come before its record is begun).
        let steps: Vec<(&'static str, SystemTime, SystemTime)> = r
            .steps
            .iter()
            .flat_map(|s| s.each())
            .map(|(name, s)| {
                let at = at_us(s.at_us);
                (name, at, at + Duration::from_micros(s.dur_us))
            })
            .collect();
        let recorded = at_ms(r.at);
        let start = steps.iter().map(|s| s.1).fold(recorded, SystemTime::min);
        let end = steps.iter().map(|s| s.2).fold(
            recorded + Duration::from_millis(r.duration_ms.unwrap_or(0)),
            SystemTime::max,
        );
        let mut attributes = vec![
            KeyValue::new("airlock.egress.source", r.source.as_str()),
            KeyValue::new("airlock.egress.decision", r.decision.as_str()),
            KeyValue::new("http.request.method", bounded(&r.method, 16)),
            KeyValue::new("server.address", bounded(&r.host, 256)),
            KeyValue::new("http.request.body.size", i64_of(r.bytes_out)),
            KeyValue::new("http.response.body.size", i64_of(r.bytes_in)),
        ];
        if let Some(code) = r.code {
            attributes.push(KeyValue::new("airlock.egress.code", code.as_str()));
        }
        if let Some(status) = r.status {
            attributes.push(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if let Some(outcome) = r.outcome {
            attributes.push(KeyValue::new("airlock.egress.outcome", outcome.as_str()));
        }
        let mut span = tracer
            .span_builder(span_name(r.source))
            .with_kind(SpanKind::Client)
            .with_start_time(start)
            .with_attributes(attributes)
            .start_with_context(tracer, &self.cx);
        let failed = r.decision == EgressDecision::Refused
            || matches!(
                r.outcome,
                Some(EgressOutcome::UpstreamFailed | EgressOutcome::Aborted)
            );
        if failed {
            span.set_status(Status::error(
                r.code.map_or("failed", EgressCode::as_str).to_owned(),
            ));
        }
        let cx = self.cx.with_span(span);
        for (name, at, until) in steps {
            tracer
                .span_builder(name)
                .with_start_time(at)
                .start_with_context(tracer, &cx)
                .end_with_timestamp(until);
        }
        cx.span().end_with_timestamp(end);
    }

    /// Ends the run's span with its status.
    pub fn end(self, status: airlock_store::RunStatus) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("airlock.run.status", status.as_str()));
        if status != airlock_store::RunStatus::Succeeded {
            span.set_status(Status::error(status.as_str()));
        }
        span.end();
    }
}

/// The span of a request from `source`.
fn span_name(source: EgressSource) -> &'static str {
    match source {
        EgressSource::ApiCall => "api_call",
        EgressSource::Llm => "model_call",
        EgressSource::Proxy => "proxy",
        EgressSource::Mcp => "mcp",
        EgressSource::Runner => "runner",
    }
}

fn at_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn at_us(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

fn i64_of(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// At most `max` bytes of `s` (on a character boundary).
fn bounded(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint_of(vars: &[(&str, &str)]) -> Option<(&'static str, String)> {
        endpoint(|k| {
            vars.iter()
                .find(|(n, v)| *n == k && !v.trim().is_empty())
                .map(|(_, v)| (*v).to_owned())
        })
    }

    /// Off unless an endpoint is set; the traces endpoint is used as it is
    /// and wins; the general one gets `/v1/traces`; the SDK's switches
    /// turn traces off again.
    #[test]
    fn traces_are_on_only_with_an_endpoint() {
        assert_eq!(endpoint_of(&[]), None);
        assert_eq!(endpoint_of(&[(ENV_ENDPOINT, " ")]), None);
        let general = (ENV_ENDPOINT, "http://c.test:4318/".to_owned());
        assert_eq!(
            endpoint_of(&[(general.0, &general.1)]),
            Some((ENV_ENDPOINT, "http://c.test:4318/v1/traces".into()))
        );
        let both = [
            (ENV_ENDPOINT, "http://c.test:4318"),
            (ENV_TRACES_ENDPOINT, "http://t.test/x"),
        ];
        assert_eq!(
            endpoint_of(&both),
            Some((ENV_TRACES_ENDPOINT, "http://t.test/x".into()))
        );
        for off in [(ENV_SDK_DISABLED, "TRUE"), (ENV_TRACES_EXPORTER, "none")] {
            assert_eq!(endpoint_of(&[both[0], off]), None, "{off:?}");
        }
    }

    #[test]
    fn an_export_times_out_as_the_variables_say() {
        let of = |vars: &'static [(&'static str, &'static str)]| {
            export_timeout(|k| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            })
        };
        assert_eq!(of(&[]), Duration::from_secs(10));
        assert_eq!(of(&[(ENV_TIMEOUT, "2500")]), Duration::from_millis(2500));
        assert_eq!(
            of(&[(ENV_TIMEOUT, "2500"), (ENV_TRACES_TIMEOUT, "700")]),
            Duration::from_millis(700)
        );
        assert_eq!(of(&[(ENV_TIMEOUT, "0")]), Duration::from_secs(10));
    }
}

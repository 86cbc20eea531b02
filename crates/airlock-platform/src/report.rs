//! The report of one run, as a program reads it: the one object `airlock
//! run --json` and `airlock runs show RUN --json` print (and the text
//! reports render).

use airlock_platform_api::wire::{EgressDecision, EgressSource, RefusalCode, RunEvent};
use airlock_sandbox::Isolation;
use airlock_store::{EgressEntry, Store, StoreError};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub run_id: String,
    pub agent: String,
    pub status: &'static str,
    pub backend: String,
    /// What the backend isolated: `isolates: false` for the process backend.
    pub isolation: Isolation,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub duration_ms: Option<i64>,
    pub exit_code: Option<i64>,
    /// Why it did not succeed, in words.
    pub error: Option<String>,
    /// The agent's result document (`$AIRLOCK_RESULT_FILE`), if it wrote one.
    pub result: Option<serde_json::Value>,
    pub egress: EgressReport,
    pub model: ModelUsage,
    /// The agent's log lines not kept (shed when a queue was full, or past
    /// the run's log cap): counted, never silent.
    pub logs_shed: LogsShed,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct LogsShed {
    pub lines: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct EgressReport {
    /// Counts by decision and code (the refusals counted and not recorded
    /// one by one among them).
    pub summary: Vec<EgressCount>,
    pub entries: Vec<EgressLine>,
    /// Refusals past the run's bounds, counted per code and host, not
    /// recorded one by one (their samples are among `entries`).
    pub refusals_counted: Vec<RefusalCount>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RefusalCount {
    pub code: RefusalCode,
    pub host: String,
    pub count: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct EgressCount {
    pub decision: String,
    pub code: String,
    pub count: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct EgressLine {
    pub at: i64,
    pub source: EgressSource,
    pub integration: Option<String>,
    pub method: String,
    pub url: String,
    pub host: String,
    pub decision: EgressDecision,
    /// The refusal code, when refused.
    pub code: Option<RefusalCode>,
    /// What the upstream did: `completed`, `upstream_failed`, `incomplete`,
    /// `aborted`, `withheld`, `not_sent` (none for a refusal).
    pub outcome: Option<&'static str>,
    /// Model calls: `metered`, or `unmetered` when the provider's usage never arrived.
    pub metering: Option<&'static str>,
    pub status: Option<i64>,
    pub duration_ms: Option<i64>,
    pub bytes_out: i64,
    pub bytes_in: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelUsage {
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub cost_usd: f64,
    /// Model calls whose provider usage never arrived (counted with what was seen).
    pub unmetered_calls: usize,
}

/// Most count events (shed lines, counted refusals) a report reads.
const MAX_COUNT_EVENTS: u32 = 10_000;

/// Largest egress log a report carries.
const MAX_ENTRIES: u32 = 100_000;

impl From<&EgressEntry> for EgressLine {
    fn from(e: &EgressEntry) -> Self {
        EgressLine {
            at: e.at,
            source: e.source,
            integration: e.integration.clone(),
            method: e.method.clone(),
            url: e.url.clone(),
            host: e.host.clone(),
            decision: e.decision,
            code: e.reason,
            outcome: e.outcome.map(|o| o.as_str()),
            metering: e.metering.map(|m| m.as_str()),
            status: e.status,
            duration_ms: e.duration_ms,
            bytes_out: e.bytes_out,
            bytes_in: e.bytes_in,
        }
    }
}

/// The report of `run_id` from the store; `None` when there is no such run.
pub async fn run_report(store: &Store, run_id: &str) -> Result<Option<RunReport>, StoreError> {
    let Some(run) = store.get_run(run_id).await? else {
        return Ok(None);
    };
    let egress = store.list_egress(run_id, MAX_ENTRIES).await?;
    let mut by: std::collections::BTreeMap<(String, String), usize> = Default::default();
    for e in &egress {
        let code = e.reason.map_or("-", RefusalCode::as_str);
        *by.entry((e.decision.as_str().to_owned(), code.to_owned()))
            .or_default() += 1;
    }
    let mut refusals_counted = Vec::new();
    for e in store
        .events_of_kind(run_id, "refusals", MAX_COUNT_EVENTS)
        .await?
    {
        if let Ok(RunEvent::Refusals {
            code, host, count, ..
        }) = serde_json::from_str::<RunEvent>(&e.payload)
        {
            let key = (
                EgressDecision::Refused.as_str().to_owned(),
                code.as_str().to_owned(),
            );
            *by.entry(key).or_default() += usize::try_from(count).unwrap_or(usize::MAX);
            refusals_counted.push(RefusalCount { code, host, count });
        }
    }
    let mut logs_shed = LogsShed::default();
    for e in store
        .events_of_kind(run_id, "shed", MAX_COUNT_EVENTS)
        .await?
    {
        if let Ok(RunEvent::Shed { lines, bytes, .. }) =
            serde_json::from_str::<RunEvent>(&e.payload)
        {
            logs_shed.lines += lines;
            logs_shed.bytes += bytes;
        }
    }
    let result = match store.last_event_of_kind(run_id, "result").await? {
        Some(e) => match serde_json::from_str::<RunEvent>(&e.payload) {
            Ok(RunEvent::Result { result, .. }) => result,
            _ => None,
        },
        None => None,
    };
    Ok(Some(RunReport {
        isolation: airlock_sandbox::isolation_of(&run.backend),
        duration_ms: match (run.started_at, run.ended_at) {
            (Some(s), Some(e)) => Some(e - s),
            _ => None,
        },
        run_id: run.id,
        agent: run.agent,
        status: run.status.as_str(),
        backend: run.backend,
        created_at: run.created_at,
        started_at: run.started_at,
        ended_at: run.ended_at,
        exit_code: run.exit_code,
        error: run.error,
        result,
        egress: EgressReport {
            summary: by
                .into_iter()
                .map(|((decision, code), count)| EgressCount {
                    decision,
                    code,
                    count,
                })
                .collect(),
            entries: egress.iter().map(EgressLine::from).collect(),
            refusals_counted,
        },
        logs_shed,
        model: ModelUsage {
            unmetered_calls: egress
                .iter()
                .filter(|e| e.metering == Some(airlock_store::EgressMetering::Unmetered))
                .count(),
            tokens_in: run.tokens_in,
            tokens_out: run.tokens_out,
            cost_usd: run.cost_microusd as f64 / 1e6,
        },
    }))
}

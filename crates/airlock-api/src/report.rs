//! The one JSON document of a run, schema [`SCHEMA`]: what `airlock run
//! --json` and `airlock runs show RUN --json` print, from the local store or
//! from a server (`--server`), and what the text reports render.
//!
//! Contracts:
//! - Its top-level fields are the API's run answer ([`Run`]) field for
//!   field (`id`, `status`, `exit_code`, `cost`, …), plus `schema` and what
//!   a report adds (isolation, duration, the agent's result, the egress
//!   log, the shed log lines). A program that reads a `/v1` run reads a
//!   report.
//! - `schema` changes only when a field changes meaning or goes; fields
//!   may be added within a version.
//! - It is built in one place ([`RunReport::build`]) from `/v1` parts, so a
//!   report read from the store and one read from a server are the same
//!   bytes for the same run.

use std::collections::BTreeMap;

use airlock_platform_api::wire::{EgressDecision, RefusalCode, RunEvent};
use serde::{Deserialize, Serialize};

use crate::v1::{EgressRecord, Run};

/// The version of the run report's schema.
pub const SCHEMA: &str = "airlock.run/v1";

/// Most egress records a report carries.
pub const MAX_ENTRIES: u32 = 100_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// [`SCHEMA`].
    pub schema: String,
    #[serde(flatten)]
    pub run: Run,
    /// What the backend isolated: `isolates: false` for the process backend.
    pub isolation: Isolation,
    /// From start to end; `null` while it has not ended.
    pub duration_ms: Option<i64>,
    /// The agent's result document (`$AIRLOCK_RESULT_FILE`), if it wrote one.
    pub result: Option<serde_json::Value>,
    pub egress: EgressReport,
    /// Model calls whose provider usage never arrived (their tokens are
    /// counted in `cost` as far as they were seen).
    pub unmetered_model_calls: usize,
    /// The agent's log lines not kept (shed when a queue was full, or past
    /// the run's log cap): counted, never silent.
    pub logs_shed: LogsShed,
}

/// What a backend isolates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    /// Whether the agent is isolated from the host at all.
    pub isolates: bool,
    /// What the operator must know, when it does not.
    pub warning: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsShed {
    pub lines: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressReport {
    /// Counts by decision and code (`-` for none), the refusals counted and
    /// not recorded one by one among them.
    pub summary: Vec<EgressCount>,
    /// Each request or refusal, as `GET /v1/runs/{id}/egress` lists it.
    pub entries: Vec<EgressRecord>,
    /// Refusals past the run's bounds, counted per code and host, not
    /// recorded one by one (their samples are among `entries`).
    pub refusals_counted: Vec<RefusalCount>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusalCount {
    pub code: RefusalCode,
    pub host: String,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressCount {
    pub decision: String,
    pub code: String,
    pub count: usize,
}

/// What a report reads from a run's events: its last result, its shed
/// lines, its counted refusals (other events are passed over).
#[derive(Debug, Default)]
struct Folded {
    result: Option<serde_json::Value>,
    logs_shed: LogsShed,
    refusals_counted: Vec<RefusalCount>,
}

fn fold<'a>(events: impl IntoIterator<Item = &'a RunEvent>) -> Folded {
    let mut f = Folded::default();
    for e in events {
        match e {
            RunEvent::Result { result, .. } => f.result.clone_from(result),
            RunEvent::Shed { lines, bytes, .. } => {
                f.logs_shed.lines += lines;
                f.logs_shed.bytes += bytes;
            }
            RunEvent::Refusals {
                code, host, count, ..
            } => f.refusals_counted.push(RefusalCount {
                code: *code,
                host: host.clone(),
                count: *count,
            }),
            _ => {}
        }
    }
    f
}

impl RunReport {
    /// The report of `run` from its egress records and its events (in the
    /// order they were recorded).
    pub fn build<'a>(
        run: Run,
        isolation: Isolation,
        egress: &[EgressRecord],
        events: impl IntoIterator<Item = &'a RunEvent>,
    ) -> RunReport {
        let folded = fold(events);
        let mut by: BTreeMap<(String, String), usize> = BTreeMap::new();
        for e in egress {
            let code = e.reason.map_or("-", RefusalCode::as_str);
            *by.entry((e.decision.to_string(), code.to_owned()))
                .or_default() += 1;
        }
        for c in &folded.refusals_counted {
            let key = (
                EgressDecision::Refused.as_str().to_owned(),
                c.code.as_str().to_owned(),
            );
            *by.entry(key).or_default() += usize::try_from(c.count).unwrap_or(usize::MAX);
        }
        let entries = egress.to_vec();
        RunReport {
            schema: SCHEMA.to_owned(),
            isolation,
            duration_ms: match (run.started_at, run.ended_at) {
                (Some(s), Some(e)) => Some(e - s),
                _ => None,
            },
            result: folded.result,
            unmetered_model_calls: entries
                .iter()
                .filter(|e| e.metering == Some(airlock_store::EgressMetering::Unmetered))
                .count(),
            egress: EgressReport {
                summary: by
                    .into_iter()
                    .map(|((decision, code), count)| EgressCount {
                        decision,
                        code,
                        count,
                    })
                    .collect(),
                entries,
                refusals_counted: folded.refusals_counted,
            },
            logs_shed: folded.logs_shed,
            run,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::Cost;

    fn run() -> Run {
        Run {
            agent: "a".into(),
            backend: "process".into(),
            budget: Default::default(),
            cost: Cost {
                cost_microusd: 0,
                cost_usd: 0.0,
                tokens_in: 0,
                tokens_out: 0,
            },
            created_at: 1,
            ended_at: Some(9),
            error: None,
            exit_code: Some(0),
            id: "run_x".into(),
            model: None,
            pending_approvals: None,
            proxy: None,
            queue_position: None,
            replica: None,
            sandbox_up_at: Some(5),
            sidecar_up_at: Some(6),
            started_at: Some(4),
            status: "succeeded".into(),
        }
    }

    #[test]
    fn a_report_is_the_run_answer_plus_its_schema_and_additions() {
        let r = RunReport::build(
            run(),
            Isolation {
                isolates: true,
                warning: None,
            },
            &[],
            &[
                RunEvent::Shed {
                    at: 1,
                    lines: 2,
                    bytes: 3,
                },
                RunEvent::Refusals {
                    at: 2,
                    code: RefusalCode::BlockedAddress,
                    host: "h".into(),
                    count: 5,
                },
            ],
        );
        let v = serde_json::to_value(&r).unwrap();
        let answer = serde_json::to_value(run()).unwrap();
        for (k, val) in answer.as_object().unwrap() {
            assert_eq!(&v[k], val, "{k}");
        }
        assert_eq!(v["schema"], SCHEMA);
        assert_eq!(v["duration_ms"], 5);
        assert_eq!(v["logs_shed"]["lines"], 2);
        assert_eq!(v["egress"]["summary"][0]["count"], 5);
        let back: RunReport = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }
}

//! A run's report ([`RunReport`], schema `airlock.run/v1`): read from the
//! local store or from a server, printed as JSON or as text. The same run
//! gives the same report either way.

use std::io::Write;

use airlock_api::report::{self, Isolation, RunReport};
use airlock_api::v1;
use airlock_platform_api::wire::{EgressDecision, EgressOutcome, EgressPlane, RunEvent};
use airlock_sandbox::terminal::safe;
use airlock_store::Store;
use anyhow::Result;
use serde::Deserialize as _;

use super::remote::Remote;

/// The event kinds a report reads.
const REPORT_EVENTS: [&str; 3] = ["result", "shed", "refusals"];

/// Most events of one kind a report reads from the store.
const MAX_COUNT_EVENTS: u32 = 10_000;

fn isolation_of(backend: &str) -> Isolation {
    let i = airlock_sandbox::isolation_of(backend);
    Isolation {
        isolates: i.isolates,
        warning: i.warning.map(str::to_owned),
    }
}

/// The report of run `id` from the local store; `None` when there is none.
pub async fn local(store: &Store, id: &str) -> Result<Option<RunReport>> {
    let Some(run) = store.get_run(id).await? else {
        return Ok(None);
    };
    let egress: Vec<v1::EgressRecord> = store
        .list_egress(id, report::MAX_ENTRIES)
        .await?
        .iter()
        .map(v1::EgressRecord::from)
        .collect();
    let mut events = Vec::new();
    for kind in REPORT_EVENTS {
        events.extend(store.events_of_kind(id, kind, MAX_COUNT_EVENTS).await?);
    }
    events.sort_by_key(|e| e.id);
    let events: Vec<RunEvent> = events
        .iter()
        .filter_map(|e| serde_json::from_str(&e.payload).ok())
        .collect();
    Ok(Some(RunReport::build(
        v1::Run::of(&run, None),
        isolation_of(&run.backend),
        &egress,
        &events,
    )))
}

/// The report of run `id` from a server's API.
pub async fn remote(r: &Remote, id: &str) -> Result<RunReport> {
    let run: v1::Run = r.get(&format!("/v1/runs/{id}")).await?;
    let egress: v1::EgressLog = r.get(&format!("/v1/runs/{id}/egress?limit=10000")).await?;
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page: v1::EventPage = r
            .get(&format!("/v1/runs/{id}/events?after={after}&limit=100"))
            .await?;
        events.extend(
            page.events
                .iter()
                .filter(|e| REPORT_EVENTS.contains(&e.kind.as_str()))
                .filter_map(|e| RunEvent::deserialize(&e.payload).ok()),
        );
        if page.next_after == after {
            break;
        }
        after = page.next_after;
    }
    let isolation = isolation_of(&run.backend);
    Ok(RunReport::build(run, isolation, &egress.egress, &events))
}

/// The report as one JSON object on a line of stdout.
pub fn print_json(r: &RunReport) -> std::io::Result<()> {
    super::out::try_line(format_args!("{}", serde_json::to_string(r)?))
}

/// A Unix time in milliseconds as a person reads it (UTC); `-` for none.
pub fn when(ms: Option<i64>) -> String {
    let Some(ms) = ms else {
        return "-".into();
    };
    match time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03} UTC",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        ),
        Err(_) => ms.to_string(),
    }
}

/// The run's cost as a person reads it: no price set is said, not `$0`.
pub fn cost(c: &v1::Cost) -> String {
    if c.cost_microusd == 0 && c.tokens_in + c.tokens_out > 0 {
        "cost unknown (no price set)".to_owned()
    } else {
        format!("${:.6}", c.cost_usd)
    }
}

/// The text report, to `out`. Everything an agent could have chosen (URLs,
/// hosts, the error) is written out terminal-safe.
pub fn print_text(r: &RunReport, out: &mut impl Write) -> std::io::Result<()> {
    let run = &r.run;
    writeln!(out, "Run {}  {}", run.id, run.status.to_uppercase())?;
    writeln!(out, "  status      {}", run.status)?;
    writeln!(out, "  agent       {}", safe(&run.agent))?;
    writeln!(out, "  backend     {}", run.backend)?;
    if let Some(w) = &r.isolation.warning {
        writeln!(out, "  isolation   NONE: {w}")?;
    }
    writeln!(out, "  created     {}", when(Some(run.created_at)))?;
    writeln!(out, "  started     {}", when(run.started_at))?;
    writeln!(out, "  sandbox up  {}", when(run.sandbox_up_at))?;
    writeln!(out, "  sidecar up  {}", when(run.sidecar_up_at))?;
    writeln!(out, "  ended       {}", when(run.ended_at))?;
    writeln!(
        out,
        "  duration    {}",
        r.duration_ms
            .map_or_else(|| "-".into(), |d| format!("{:.2} s", d as f64 / 1000.0))
    )?;
    writeln!(
        out,
        "  exit code   {}",
        run.exit_code.map_or_else(|| "-".into(), |c| c.to_string())
    )?;
    if let Some(err) = &run.error {
        writeln!(out, "  error       {}", safe(err))?;
    }
    print_egress(r, out)?;
    writeln!(
        out,
        "  model       {}{} tokens in, {} tokens out, {}",
        run.model
            .as_deref()
            .map(|m| format!("{}: ", safe(m)))
            .unwrap_or_default(),
        run.cost.tokens_in,
        run.cost.tokens_out,
        cost(&run.cost)
    )?;
    if r.unmetered_model_calls > 0 {
        writeln!(
            out,
            "  unmetered   {} model call(s): the provider's usage never arrived; counted with the tokens seen",
            r.unmetered_model_calls
        )?;
    }
    if r.logs_shed.lines > 0 {
        writeln!(
            out,
            "  logs shed   {} line(s), {} bytes: counted, not kept",
            r.logs_shed.lines, r.logs_shed.bytes
        )?;
    }
    Ok(())
}

fn print_egress(r: &RunReport, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "  egress      {} decision(s)", r.egress.entries.len())?;
    for e in &r.egress.entries {
        let allowed = e.decision == EgressDecision::Allowed;
        let mark = if allowed {
            "✓ allowed"
        } else {
            "✗ refused"
        };
        let detail = match (&e.reason, e.status, e.outcome) {
            (Some(code), _, _) if !allowed => code.to_string(),
            (_, Some(s), Some(EgressOutcome::Completed) | None) => format!("HTTP {s}"),
            (_, _, Some(o)) => o.as_str().to_owned(),
            _ => String::new(),
        };
        // The path is named when it is not the one the source implies (a
        // connection the transparent plane carried).
        let source = if e.plane == EgressPlane::implied_by(e.source) {
            e.source.as_str().to_owned()
        } else {
            format!("{}/{}", e.source, e.plane)
        };
        writeln!(
            out,
            "    {mark}  {:<8} {:<6} {:<40} {}",
            safe(&source),
            safe(&e.method),
            truncate(&safe(&e.url), 40),
            safe(&detail)
        )?;
    }
    for c in &r.egress.summary {
        writeln!(
            out,
            "    {} × {}{}",
            c.count,
            c.decision,
            if c.code == "-" {
                String::new()
            } else {
                format!(" ({})", safe(&c.code))
            }
        )?;
    }
    if r.egress
        .summary
        .iter()
        .any(|c| c.decision == "refused" && c.code == "blocked_address")
    {
        writeln!(
            out,
            "    (blocked_address: a loopback, private or metadata address; an operator who means to reach such a host lists it in EGRESS_ALLOW_INTERNAL_HOSTS)"
        )?;
    }
    for c in &r.egress.refusals_counted {
        writeln!(
            out,
            "    {} more × refused ({}) to {}: counted, not recorded one by one",
            c.count,
            safe(c.code.as_str()),
            safe(&c.host)
        )?;
    }
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_dates_and_an_unpriced_cost_says_so() {
        assert_eq!(when(Some(0)), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(when(Some(1_700_000_000_123)), "2023-11-14 22:13:20.123 UTC");
        assert_eq!(when(None), "-");
        let mut c = v1::Cost {
            cost_microusd: 0,
            cost_usd: 0.0,
            tokens_in: 10,
            tokens_out: 2,
        };
        assert_eq!(cost(&c), "cost unknown (no price set)");
        c.cost_microusd = 1500;
        c.cost_usd = 0.0015;
        assert_eq!(cost(&c), "$0.001500");
    }
}

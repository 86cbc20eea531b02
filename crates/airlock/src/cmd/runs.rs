//! `airlock runs list|show|logs`: what the store recorded.

use std::process::ExitCode;
use std::time::Duration;

use airlock_api::v1;
use airlock_platform_api::wire::RunEvent;
use airlock_store::{RunQuery, Store};
use anyhow::{Context, Result};
use clap::Subcommand;

#[derive(clap::Args)]
pub struct RunsArgs {
    /// Ask an `airlock serve` at this URL (default: AIRLOCK_SERVER; the
    /// organization's key in AIRLOCK_API_KEY) instead of the local store.
    #[arg(long, global = true)]
    pub server: Option<String>,
    #[command(subcommand)]
    pub cmd: RunsCommand,
}

#[derive(Subcommand)]
pub enum RunsCommand {
    /// Recent runs, newest first.
    List {
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// One run: its columns and its egress log.
    Show {
        id: String,
        /// Print the run report as one JSON object (the one `airlock run --json` prints).
        #[arg(long)]
        json: bool,
    },
    /// A run's log lines (`--follow` waits for more until the run ends).
    /// Control characters are written out as escapes (`\x1b`): an agent's
    /// output never drives the terminal; `--json` prints each line exactly,
    /// as a JSON string.
    Logs {
        id: String,
        #[arg(long)]
        follow: bool,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: RunsArgs) -> ExitCode {
    let cmd = args.cmd;
    crate::logging::init_quiet();
    let rt = match super::current_thread_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let done = match super::remote::server(args.server.as_deref()) {
        Some(server) => rt.block_on(remote(&server, cmd)),
        None => rt.block_on(run_async(cmd)),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn when(ms: Option<i64>) -> String {
    ms.map(|m| format!("{:.3}", m as f64 / 1000.0))
        .unwrap_or_else(|| "-".into())
}

/// The same, from a server's API.
async fn remote(server: &str, cmd: RunsCommand) -> Result<()> {
    let r = super::remote::Remote::new(server)?;
    match cmd {
        RunsCommand::List { limit } => {
            let v: v1::RunList = r
                .get(&format!("/v1/runs?limit={}", limit.clamp(1, 100)))
                .await?;
            println!(
                "{:<22} {:<10} {:<10} {:<16} {:>9} {:>6}",
                "RUN", "STATUS", "BACKEND", "AGENT", "DURATION", "EXIT"
            );
            for r in &v.runs {
                let dur = match (r.started_at, r.ended_at) {
                    (Some(s), Some(e)) => format!("{:.2}s", (e - s) as f64 / 1000.0),
                    _ => "-".into(),
                };
                println!(
                    "{:<22} {:<10} {:<10} {:<16} {:>9} {:>6}",
                    r.id,
                    r.status,
                    r.backend,
                    airlock_sandbox::terminal::safe(&r.agent),
                    dur,
                    r.exit_code
                        .map(|c| c.to_string())
                        .unwrap_or_else(|| "-".into()),
                );
            }
        }
        RunsCommand::Show { id, json } => {
            let run: v1::Run = r.get(&format!("/v1/runs/{id}")).await?;
            let egress: v1::EgressLog = r.get(&format!("/v1/runs/{id}/egress")).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"run": run, "egress": egress.egress})
                );
            } else {
                // As JSON shows them: `null` for a value not set.
                let text = |v: Option<String>| v.unwrap_or_else(|| "null".to_owned());
                let number = |v: Option<i64>| text(v.map(|n| n.to_string()));
                for (k, v) in [
                    ("id", run.id.clone()),
                    ("agent", run.agent.clone()),
                    ("status", run.status.clone()),
                    ("backend", run.backend.clone()),
                    ("replica", text(run.replica.clone())),
                    ("created_at", run.created_at.to_string()),
                    ("started_at", number(run.started_at)),
                    ("ended_at", number(run.ended_at)),
                    ("exit_code", number(run.exit_code)),
                    ("error", text(run.error.clone())),
                ] {
                    println!("{k:<12} {}", airlock_sandbox::terminal::safe(&v));
                }
                println!("cost         {}", serde_json::to_string(&run.cost)?);
                println!("egress log:");
                for e in &egress.egress {
                    let line = serde_json::to_string(e)?;
                    println!("  {}", airlock_sandbox::terminal::safe(&line));
                }
            }
        }
        RunsCommand::Logs { id, follow, json } => {
            if follow {
                r.follow(&format!("/v1/runs/{id}/logs"), |event, data| {
                    if event != "end" {
                        super::remote::print_log(data, json);
                    }
                })
                .await?;
            } else {
                let mut after = 0;
                loop {
                    let page: v1::EventPage = r
                        .get(&format!("/v1/runs/{id}/logs?after={after}&limit=100"))
                        .await?;
                    for e in &page.events {
                        super::remote::print_event(e, json);
                    }
                    let next = page.next_after;
                    if next == after {
                        break;
                    }
                    after = next;
                }
            }
        }
    }
    Ok(())
}

async fn run_async(cmd: RunsCommand) -> Result<()> {
    let store = Store::open_default().await?;
    match cmd {
        RunsCommand::List { limit } => {
            let runs = store
                .list_runs(&RunQuery {
                    limit: Some(limit),
                    ..Default::default()
                })
                .await?;
            println!(
                "{:<18} {:<10} {:<10} {:<16} {:>9} {:>6} {:>8} {:>8}",
                "RUN", "STATUS", "BACKEND", "AGENT", "DURATION", "EXIT", "TOK_IN", "TOK_OUT"
            );
            for r in runs {
                let dur = match (r.started_at, r.ended_at) {
                    (Some(s), Some(e)) => format!("{:.2}s", (e - s) as f64 / 1000.0),
                    _ => "-".into(),
                };
                println!(
                    "{:<18} {:<10} {:<10} {:<16} {:>9} {:>6} {:>8} {:>8}",
                    r.id,
                    r.status.as_str(),
                    r.backend,
                    r.agent,
                    dur,
                    r.exit_code
                        .map(|c| c.to_string())
                        .unwrap_or_else(|| "-".into()),
                    r.tokens_in,
                    r.tokens_out
                );
            }
        }
        RunsCommand::Show { id, json: true } => {
            let r = airlock_platform::report::run_report(&store, &id)
                .await?
                .with_context(|| format!("no run {id}"))?;
            println!("{}", serde_json::to_string(&r)?);
        }
        RunsCommand::Show { id, json: false } => {
            use airlock_sandbox::terminal::safe;
            let r = store
                .get_run(&id)
                .await?
                .with_context(|| format!("no run {id}"))?;
            println!("run          {}", r.id);
            println!("agent        {}", r.agent);
            println!("status       {}", r.status.as_str());
            println!("backend      {}", r.backend);
            println!("model        {}", r.model.as_deref().unwrap_or("-"));
            println!("started      {}", when(r.started_at));
            println!("ended        {}", when(r.ended_at));
            println!("heartbeat    {}", when(r.last_heartbeat_at));
            println!(
                "exit code    {}",
                r.exit_code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "-".into())
            );
            println!("error        {}", safe(r.error.as_deref().unwrap_or("-")));
            println!("tokens       {} in, {} out", r.tokens_in, r.tokens_out);
            println!("cost         ${:.6}", r.cost_microusd as f64 / 1e6);
            println!("egress log:");
            for e in store.list_egress(&id, 100_000).await? {
                // The refusal code, else the upstream status.
                let outcome = match (&e.reason, e.status) {
                    (Some(code), _) => code.to_string(),
                    (None, Some(status)) => status.to_string(),
                    (None, None) => "-".into(),
                };
                println!(
                    "  {} {:<8} {:<9} {:<7} {} {} out={}B in={}B {}",
                    e.at,
                    safe(e.source.as_str()),
                    e.decision.as_str(),
                    safe(&e.method),
                    safe(&e.url),
                    safe(&outcome),
                    e.bytes_out,
                    e.bytes_in,
                    e.duration_ms
                        .map(|d| format!("{d}ms"))
                        .unwrap_or_else(|| "-".into())
                );
            }
        }
        RunsCommand::Logs { id, follow, json } => {
            let mut after = 0;
            loop {
                let page = store.list_events(&id, after, 500).await?;
                for e in &page {
                    after = e.id;
                    if let Ok(ev) = serde_json::from_str::<RunEvent>(&e.payload) {
                        super::remote::print_run_event(&ev, json);
                    }
                }
                // Without --follow: every page there is, then the end.
                if !follow && page.is_empty() {
                    break;
                }
                if page.is_empty() {
                    let run = store
                        .get_run(&id)
                        .await?
                        .with_context(|| format!("no run {id}"))?;
                    if run.status.is_terminal() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }
    Ok(())
}

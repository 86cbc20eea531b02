//! `airlock runs list|show|logs`: what the store recorded.

use std::process::ExitCode;
use std::time::Duration;

use airlock_platform_api::wire::RunEvent;
use airlock_store::{RunQuery, Store};
use anyhow::{Context, Result};
use clap::Subcommand;

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

pub fn run(cmd: RunsCommand) -> ExitCode {
    crate::logging::init_quiet();
    let rt = match super::current_thread_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run_async(cmd)) {
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
                    (Some(code), _) => code.clone(),
                    (None, Some(status)) => status.to_string(),
                    (None, None) => "-".into(),
                };
                println!(
                    "  {} {:<8} {:<9} {:<7} {} {} out={}B in={}B {}",
                    e.at,
                    safe(&e.source),
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
                    if let Ok(RunEvent::Log { stream, line, at }) =
                        serde_json::from_str::<RunEvent>(&e.payload)
                    {
                        if json {
                            println!(
                                "{}",
                                serde_json::json!({"at": at, "stream": stream, "line": line})
                            );
                        } else if stream == "stderr" {
                            eprintln!("{}", airlock_sandbox::terminal::safe(&line));
                        } else {
                            println!("{}", airlock_sandbox::terminal::safe(&line));
                        }
                    }
                }
                if !follow {
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

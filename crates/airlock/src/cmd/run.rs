//! `airlock run`: one agent, in a sandbox beside its sidecar, with the
//! embedded platform and store; live progress, then a run report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use airlock_platform::Platform;
use airlock_platform::manifest::Manifest;
use airlock_platform::orchestrator::{Progress, RunOutcome, RunRequest};
use airlock_platform::report::RunReport;
use airlock_store::{EgressDecision, RunStatus, Store};
use anyhow::{Context, Result};
use clap::Args;

#[derive(Args)]
pub struct RunArgs {
    /// The agent manifest.
    #[arg(short = 'f', long = "file", default_value = "airlock.toml")]
    pub manifest: PathBuf,
    /// process | namespace | docker | auto (default: RUN_ADAPTER, else auto).
    #[arg(long)]
    pub backend: Option<String>,
    /// The prompt handed to the agent (a file in its workspace).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Run it on an `airlock serve` at this URL (default: AIRLOCK_SERVER;
    /// the organization's key in AIRLOCK_API_KEY): the manifest's directory
    /// is registered as the agent, the run queued there and followed here.
    #[arg(long)]
    pub server: Option<String>,
    /// Run this command instead of the manifest's `agent.command`.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Prints milestones to stderr (nothing when `quiet`).
pub fn progress_printer(quiet: bool) -> impl Fn(Progress) + Send + Sync {
    move |p: Progress| {
        // Waiting is always said: a run that does not start must say why.
        if quiet && !matches!(p, Progress::Queued { .. }) {
            return;
        }
        match p {
            Progress::Starting {
                run_id,
                backend,
                isolates,
            } => {
                eprintln!("▸ run {run_id} on the {backend} backend");
                if !isolates {
                    eprintln!("  ⚠ WARNING: {}", airlock_sandbox::process::WARNING);
                }
            }
            Progress::SandboxUp { after } => eprintln!(
                "▸ sandbox up          {:>7.1} ms",
                after.as_secs_f64() * 1000.0
            ),
            Progress::SidecarUp { after } => eprintln!(
                "▸ sidecar up          {:>7.1} ms",
                after.as_secs_f64() * 1000.0
            ),
            Progress::Running { elapsed } => {
                if elapsed.as_secs() % 5 == 0 {
                    eprintln!("▸ running             {:>7.1} s", elapsed.as_secs_f64());
                }
            }
            Progress::Queued { limit } => eprintln!(
                "▸ waiting for a free run slot: {limit} run(s) already running on this store (PLATFORM_RUN_LIMITS max_concurrent_runs); Ctrl-C gives up"
            ),
            Progress::Ending { status } => eprintln!("▸ {status}"),
        }
    }
}

/// Ctrl-C cancels the run.
pub fn cancel_on_ctrl_c() -> airlock_platform::orchestrator::Cancel {
    let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(None);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\nairlock: cancelling the run (Ctrl-C)…");
            let _ = cancel_tx.send(Some("cancelled by the operator".into()));
        }
    });
    cancel_rx
}

pub fn run(args: RunArgs) -> ExitCode {
    crate::logging::init_quiet();
    // Milestones of `airlock run` (`AIRLOCK_LOG=airlock::phase=debug`; the
    // run_e2e bench prints them as a per-phase breakdown).
    tracing::debug!(target: "airlock::phase", "main");
    let rt = match super::multi_thread_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(server) = super::remote::server(args.server.as_deref()) {
        if !args.command.is_empty() || args.backend.is_some() {
            eprintln!(
                "error: a run on a server takes the manifest's command and the server's backend (no `-- CMD`, no --backend)"
            );
            return ExitCode::from(2);
        }
        return match rt.block_on(super::remote::run(
            &server,
            &args.manifest,
            args.prompt.as_deref(),
            args.json,
        )) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    let done = rt.block_on(run_async(args));
    drop(rt);
    tracing::debug!(target: "airlock::phase", "exit");
    match done {
        Ok(outcome) if outcome.status == RunStatus::Succeeded => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run_async(args: RunArgs) -> Result<RunOutcome> {
    let manifest = Manifest::load(&args.manifest)?;
    tracing::debug!(target: "airlock::phase", "manifest loaded");
    let agent_dir = args
        .manifest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .canonicalize()?;
    let platform = Platform::from_env(args.backend.as_deref(), airlock_sidecar::BUILD).await?;
    let orch = &platform.orch;
    let cancel_rx = cancel_on_ctrl_c();
    let progress = progress_printer(args.json);
    let req = RunRequest {
        org: airlock_store::LOCAL_ORG.to_owned(),
        manifest,
        agent_dir,
        prompt: args.prompt.clone(),
        command: (!args.command.is_empty()).then(|| args.command.clone()),
        echo: airlock_platform::orchestrator::Echo::LiveView,
    };
    let outcome = orch.run(req, cancel_rx, &progress).await?;
    report(&orch.store, &outcome, args.json).await?;
    tracing::debug!(target: "airlock::phase", "report printed");
    platform.stop();
    Ok(outcome)
}

/// The run report: status, duration, exit code, egress by decision and code,
/// model usage; as JSON ([`RunReport`]) or as text for the operator.
pub async fn report(store: &Store, outcome: &RunOutcome, json_out: bool) -> Result<()> {
    let r = airlock_platform::report::run_report(store, &outcome.run_id)
        .await?
        .context("the run vanished from the store")?;
    if json_out {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    eprintln!();
    print_report(&r, outcome.duration);
    Ok(())
}

/// The text report of a run, on stderr. Everything an agent could have
/// chosen (URLs, hosts, the error) is written out terminal-safe.
pub fn print_report(r: &RunReport, duration: std::time::Duration) {
    use airlock_sandbox::terminal::safe;
    eprintln!("Run {}  {}", r.run_id, r.status.to_uppercase());
    eprintln!("  backend     {}", r.backend);
    if let Some(w) = r.isolation.warning {
        eprintln!("  isolation   NONE: {w}");
    }
    eprintln!("  duration    {:.2} s", duration.as_secs_f64());
    eprintln!(
        "  exit code   {}",
        r.exit_code
            .map(|c| c.to_string())
            .unwrap_or_else(|| "-".into())
    );
    if let Some(err) = &r.error {
        eprintln!("  error       {}", safe(err));
    }
    eprintln!("  egress      {} decision(s)", r.egress.entries.len());
    for e in &r.egress.entries {
        let mark = if e.decision == EgressDecision::Allowed {
            "✓ allowed"
        } else {
            "✗ refused"
        };
        let detail = match (&e.code, e.status, e.outcome) {
            (Some(code), _, _) if e.decision != EgressDecision::Allowed => code.to_string(),
            (_, Some(s), Some("completed") | None) => format!("HTTP {s}"),
            (_, _, Some(o)) => o.to_owned(),
            _ => String::new(),
        };
        eprintln!(
            "    {mark}  {:<8} {:<6} {:<40} {}",
            safe(e.source.as_str()),
            safe(&e.method),
            truncate(&safe(&e.url), 40),
            safe(&detail)
        );
    }
    for c in &r.egress.summary {
        eprintln!(
            "    {} × {}{}",
            c.count,
            c.decision,
            if c.code == "-" {
                String::new()
            } else {
                format!(" ({})", safe(&c.code))
            }
        );
    }
    eprintln!(
        "  model       {} tokens in, {} tokens out, ${:.6}",
        r.model.tokens_in, r.model.tokens_out, r.model.cost_usd
    );
    if r.model.unmetered_calls > 0 {
        eprintln!(
            "  unmetered   {} model call(s): the provider's usage never arrived; counted with the tokens seen",
            r.model.unmetered_calls
        );
    }
    for c in &r.egress.refusals_counted {
        eprintln!(
            "    {} more × refused ({}) to {}: counted, not recorded one by one",
            c.count,
            safe(c.code.as_str()),
            safe(&c.host)
        );
    }
    if r.logs_shed.lines > 0 {
        eprintln!(
            "  logs shed   {} line(s), {} bytes: counted, not kept",
            r.logs_shed.lines, r.logs_shed.bytes
        );
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}

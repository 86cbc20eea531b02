//! `airlock run`: one agent, in a sandbox beside its sidecar, with the
//! embedded platform and store; live progress, then a run report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use airlock_api::report::RunReport;
use airlock_platform::Platform;
use airlock_platform::manifest::Manifest;
use airlock_platform::operator::say;
use airlock_platform::orchestrator::{Progress, RunRequest};
use airlock_store::Store;
use anyhow::{Context, Result};
use clap::Args;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  airlock run -f agents/hello/airlock.toml\n  airlock run --backend docker --prompt 'summarize the repo' --json | jq .status\n  airlock run -f airlock.toml -- python3 agent.py --verbose\n\nExit status: the agent's own exit code (0 when the run succeeded); 2 when nothing was started (a bad argument, setting or manifest); 124 when the run timed out; 125 when it failed on Airlock's side; 130 when it was cancelled. See docs/cli.md."
)]
pub struct RunArgs {
    /// The agent's manifest (its directory is the agent's code).
    #[arg(short = 'f', long = "file", default_value = "airlock.toml")]
    pub manifest: PathBuf,
    /// process | namespace | docker | auto (default: RUN_ADAPTER, else auto).
    #[arg(long)]
    pub backend: Option<String>,
    /// The prompt handed to the agent (a file in its workspace).
    #[arg(long)]
    pub prompt: Option<String>,
    /// Print the run report as one JSON object on stdout (schema
    /// `airlock.run/v1`, as `airlock runs show RUN --json`).
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
                say(format_args!("▸ run {run_id} on the {backend} backend"));
                if !isolates {
                    say(format_args!(
                        "  ⚠ WARNING: {}",
                        airlock_sandbox::process::WARNING
                    ));
                }
            }
            Progress::SandboxUp { after } => say(format_args!(
                "▸ sandbox up          {:>7.1} ms",
                after.as_secs_f64() * 1000.0
            )),
            Progress::SidecarUp { after } => say(format_args!(
                "▸ sidecar up          {:>7.1} ms",
                after.as_secs_f64() * 1000.0
            )),
            Progress::Running { elapsed } => {
                if elapsed.as_secs() % 5 == 0 {
                    say(format_args!(
                        "▸ running             {:>7.1} s",
                        elapsed.as_secs_f64()
                    ));
                }
            }
            Progress::Queued { limit } => say(format_args!(
                "▸ waiting for a free run slot: {limit} run(s) already running on this store (PLATFORM_RUN_LIMITS max_concurrent_runs); Ctrl-C gives up"
            )),
            Progress::Ending { status } => say(format_args!("▸ {status}")),
        }
    }
}

/// Ctrl-C cancels the run.
pub fn cancel_on_ctrl_c() -> airlock_platform::orchestrator::Cancel {
    let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(None);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            say(format_args!("\nairlock: cancelling the run (Ctrl-C)…"));
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
            say(format_args!("error: {e}"));
            return ExitCode::from(super::exit::RUN_FAILED);
        }
    };
    let json = args.json;
    let done = match super::remote::server(args.server.as_deref()) {
        Some(server) => {
            if !args.command.is_empty() || args.backend.is_some() {
                say(format_args!(
                    "error: a run on a server takes the manifest's command and the server's backend (no `-- CMD`, no --backend)"
                ));
                return ExitCode::from(super::exit::USAGE);
            }
            rt.block_on(super::remote::run(
                &server,
                &args.manifest,
                args.prompt.as_deref(),
                json,
            ))
        }
        None => rt.block_on(run_async(args)),
    };
    drop(rt);
    tracing::debug!(target: "airlock::phase", "exit");
    match done {
        Ok(report) => {
            show(&report, json);
            tracing::debug!(target: "airlock::phase", "report printed");
            super::exit::run_exit(&report.run.status, report.run.exit_code)
        }
        Err(e) => {
            say(format_args!("error: {}", super::out::error_line(&e)));
            ExitCode::from(super::exit::USAGE)
        }
    }
}

/// The report of a run that ended: JSON on stdout, or text on stderr after
/// the live view. A reader of stdout that went away is not an error: the
/// run is over and recorded either way.
pub fn show(report: &RunReport, json: bool) {
    let written = if json {
        super::report::print_json(report)
    } else {
        say(format_args!(""));
        super::report::print_text(report, &mut std::io::stderr().lock())
    };
    if let Err(e) = written
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        say(format_args!("error: writing the report: {e}"));
    }
}

/// An error naming the fix when there is no manifest at `path`.
pub fn require_manifest(path: &Path) -> Result<()> {
    if !path.exists() {
        anyhow::bail!(
            "no manifest at {}: pass -f PATH (the agent's airlock.toml)",
            path.display()
        );
    }
    Ok(())
}

/// The manifest, with the fix when there is none where it was looked for,
/// and a warning for each private address it names that the operator's
/// setting does not list.
pub fn load_manifest(path: &Path) -> Result<Manifest> {
    require_manifest(path)?;
    let manifest = Manifest::load(path)?;
    for w in super::internal_hosts::warnings(&manifest, &super::internal_hosts::allowed_from_env())
    {
        say(format_args!("{w}"));
    }
    Ok(manifest)
}

async fn run_async(args: RunArgs) -> Result<RunReport> {
    let manifest = load_manifest(&args.manifest)?;
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
        inputs_dir: None,
        command: (!args.command.is_empty()).then(|| args.command.clone()),
        echo: airlock_platform::orchestrator::Echo::LiveView,
    };
    let outcome = orch.run(req, cancel_rx, &progress).await;
    platform.stop();
    platform.finish_removals().await;
    platform.finish_traces().await;
    report_of(&orch.store, &outcome?.run_id).await
}

/// The report of a run that just ended in `store`.
pub async fn report_of(store: &Store, run_id: &str) -> Result<RunReport> {
    super::report::local(store, run_id)
        .await?
        .context("the run vanished from the store")
}

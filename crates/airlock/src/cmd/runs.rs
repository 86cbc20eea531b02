//! `airlock runs list|show|logs|audit|policy|approvals|approve`: what the
//! store recorded, a running run's live egress rules, and a person's answer
//! to a request a run holds.

use std::process::ExitCode;
use std::time::Duration;

use super::out::outln;

use airlock_api::v1;
use airlock_platform_api::wire::RunEvent;
use airlock_store::{RunQuery, Store};
use anyhow::{Result, anyhow};
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
    #[command(after_help = "Examples:\n  airlock runs list\n  airlock runs list --limit 5 --json")]
    List {
        /// How many runs (at most 100 from a server).
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Print `{"runs": [...], "next_cursor": null}`, each run as the
        /// API's run answer.
        #[arg(long)]
        json: bool,
    },
    /// One run's report: its state, its egress log, its model usage.
    #[command(
        after_help = "Examples:\n  airlock runs show run_0123abcd\n  airlock runs show run_0123abcd --json | jq .status"
    )]
    Show {
        /// The run's id (`airlock runs list` shows them).
        id: String,
        /// Print the run report as one JSON object (schema `airlock.run/v1`,
        /// the one `airlock run --json` prints).
        #[arg(long)]
        json: bool,
    },
    /// A run's log lines (`--follow` waits for more until the run ends).
    /// Control characters are written out as escapes (`\x1b`): an agent's
    /// output never drives the terminal; `--json` prints each line exactly,
    /// as a JSON string.
    #[command(
        after_help = "Examples:\n  airlock runs logs run_0123abcd\n  airlock runs logs run_0123abcd --follow"
    )]
    Logs {
        /// The run's id.
        id: String,
        /// Wait for more lines until the run ends.
        #[arg(long)]
        follow: bool,
        /// One `{"at", "stream", "line"}` object a line.
        #[arg(long)]
        json: bool,
    },
    /// A run's audit: every decision made for it, oldest first, one JSON
    /// object a line (docs/audit.md), as `GET /v1/runs/{id}/audit.jsonl`
    /// answers it.
    #[command(
        after_help = "Examples:\n  airlock runs audit run_0123abcd > audit.jsonl\n  airlock runs audit run_0123abcd --ocsf"
    )]
    Audit {
        /// The run's id.
        id: String,
        /// The network decisions as OCSF 1.1 events instead.
        #[arg(long)]
        ocsf: bool,
    },
    /// A running run's live egress rules (docs/egress.md, "Live policy"):
    /// shown, or changed within its manifest's rules (on a server). A
    /// change returns once the run's sidecar has applied it; it prints the
    /// policy as `GET /v1/runs/{id}/policy` answers it.
    #[command(
        after_help = "Examples:\n  airlock runs policy run_0123abcd\n  airlock runs policy run_0123abcd --preset read-only --host https://api.github.com\n  airlock runs policy run_0123abcd --set rules.json\n  airlock runs policy run_0123abcd --reset"
    )]
    Policy {
        /// The run's id.
        id: String,
        /// Replace every live list with this file's (`{"network": [...],
        /// "integrations": {"ns": [...]}}`, the manifest's rule grammar).
        #[arg(long, value_name = "FILE.json", conflicts_with_all = ["preset", "reset"])]
        set: Option<std::path::PathBuf>,
        /// Set this method preset (read-only, read-write, full) on every
        /// live rule of `--host`.
        #[arg(long, requires = "host", conflicts_with = "reset", value_parser = parse_access)]
        preset: Option<v1::RuleAccess>,
        /// The rules' host (`scheme://host[:port]`, as written) `--preset` changes.
        #[arg(long, requires = "preset")]
        host: Option<String>,
        /// Back to the manifest's rules.
        #[arg(long)]
        reset: bool,
    },
    /// A run's held requests (docs/egress.md, "Human approval"), oldest
    /// first: pending ones wait for `airlock runs approve`.
    #[command(
        after_help = "Examples:\n  airlock runs approvals run_0123abcd\n  airlock runs approvals run_0123abcd --json"
    )]
    Approvals {
        /// The run's id.
        id: String,
        /// Print `{"approvals": [...]}` as the API answers it.
        #[arg(long)]
        json: bool,
    },
    /// Answers a held request: let it go once, let it and every later
    /// request matching the same rule, method and host go for the rest of
    /// the run, or deny it.
    #[command(
        after_help = "Examples:\n  airlock runs approve run_0123abcd apr_0123abcd --once\n  airlock runs approve run_0123abcd apr_0123abcd --deny"
    )]
    Approve {
        /// The run's id.
        id: String,
        /// The approval's id (`airlock runs approvals` shows them).
        approval: String,
        #[command(flatten)]
        decision: DecisionArgs,
    },
}

/// Exactly one answer.
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub struct DecisionArgs {
    /// Allow this request once.
    #[arg(long)]
    once: bool,
    /// Allow it and every later one of the run matching the same rule,
    /// method and host.
    #[arg(long)]
    run: bool,
    /// Deny it (the agent gets `approval_denied`).
    #[arg(long)]
    deny: bool,
}

impl DecisionArgs {
    fn decision(&self) -> v1::ApprovalDecision {
        if self.once {
            v1::ApprovalDecision::AllowOnce
        } else if self.run {
            v1::ApprovalDecision::AllowRun
        } else {
            v1::ApprovalDecision::Deny
        }
    }
}

/// A run's approvals, as text or as `--json`.
fn print_approvals(list: &v1::ApprovalList, json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string(list)?);
        return Ok(());
    }
    if list.approvals.is_empty() {
        outln!("no held requests");
    }
    for a in &list.approvals {
        let state = serde_json::to_value(a.state)?;
        outln!(
            "{}  {:<12}  {} {}{}  rule {}{}",
            a.id,
            state.as_str().unwrap_or("-"),
            a.method,
            a.host,
            a.path,
            a.rule,
            a.answered_by
                .as_deref()
                .map(|k| format!("  by {k}"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// The form `--ocsf` asks for.
fn audit_format(ocsf: bool) -> v1::AuditFormat {
    if ocsf {
        v1::AuditFormat::Ocsf
    } else {
        v1::AuditFormat::Airlock
    }
}

pub fn run(args: RunsArgs) -> ExitCode {
    let cmd = args.cmd;
    crate::logging::init_quiet();
    let rt = match super::current_thread_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(super::exit::FAILED);
        }
    };
    let done = match super::remote::server(args.server.as_deref()) {
        Some(server) => rt.block_on(remote(&server, cmd)),
        None => rt.block_on(local(cmd)),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", super::out::error_line(&e));
            ExitCode::from(super::exit::FAILED)
        }
    }
}

fn no_run(id: &str) -> anyhow::Error {
    anyhow!("no run {id} (`airlock runs list` shows the runs there are)")
}

/// The run list, as text or as `--json`, the same from a store or a server.
fn print_list(list: &v1::RunList, json: bool) -> Result<()> {
    if json {
        outln!("{}", serde_json::to_string(list)?);
        return Ok(());
    }
    outln!(
        "{:<22} {:<10} {:<10} {:<16} {:<23} {:>9} {:>5} {:>8} {:>8}",
        "RUN",
        "STATUS",
        "BACKEND",
        "AGENT",
        "CREATED",
        "DURATION",
        "EXIT",
        "TOK_IN",
        "TOK_OUT"
    );
    for r in &list.runs {
        let dur = match (r.started_at, r.ended_at) {
            (Some(s), Some(e)) => format!("{:.2}s", (e - s) as f64 / 1000.0),
            _ => "-".into(),
        };
        outln!(
            "{:<22} {:<10} {:<10} {:<16} {:<23} {:>9} {:>5} {:>8} {:>8}",
            r.id,
            r.status,
            r.backend,
            airlock_sandbox::terminal::safe(&r.agent),
            super::report::when(Some(r.created_at)),
            dur,
            r.exit_code.map_or_else(|| "-".into(), |c| c.to_string()),
            r.cost.tokens_in,
            r.cost.tokens_out,
        );
    }
    Ok(())
}

fn print_report(r: &airlock_api::report::RunReport, json: bool) -> Result<()> {
    let written = if json {
        super::report::print_json(r)
    } else {
        super::report::print_text(r, &mut std::io::stdout().lock())
    };
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        w => Ok(w?),
    }
}

/// An error unless the server has run `id`.
async fn exists(r: &super::remote::Remote, id: &str) -> Result<()> {
    match r.get::<v1::Run>(&format!("/v1/runs/{id}")).await {
        Err(e) if super::remote::is_not_found(&e) => Err(no_run(id)),
        other => other.map(|_| ()),
    }
}

/// The same, from a server's API.
async fn remote(server: &str, cmd: RunsCommand) -> Result<()> {
    let r = super::remote::Remote::new(server)?;
    match cmd {
        RunsCommand::List { limit, json } => {
            let v: v1::RunList = r
                .get(&format!("/v1/runs?limit={}", limit.clamp(1, 100)))
                .await?;
            print_list(&v, json)?;
        }
        RunsCommand::Show { id, json } => {
            exists(&r, &id).await?;
            print_report(&super::report::remote(&r, &id).await?, json)?;
        }
        RunsCommand::Logs { id, follow, json } => {
            exists(&r, &id).await?;
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
        RunsCommand::Policy {
            id,
            set,
            preset,
            host,
            reset,
        } => policy(&r, &id, set, preset.zip(host), reset).await?,
        RunsCommand::Audit { id, ocsf } => {
            exists(&r, &id).await?;
            let query = if ocsf { "?format=ocsf" } else { "" };
            r.stream(
                &format!("/v1/runs/{id}/audit.jsonl{query}"),
                super::out::bytes,
            )
            .await?;
        }
        RunsCommand::Approvals { id, json } => {
            let list: v1::ApprovalList = r.get(&format!("/v1/runs/{id}/approvals")).await?;
            print_approvals(&list, json)?;
        }
        RunsCommand::Approve {
            id,
            approval,
            decision,
        } => {
            let body = v1::AnswerApproval {
                decision: decision.decision(),
            };
            let a: v1::Approval = r
                .send_json(
                    "POST",
                    &format!("/v1/runs/{id}/approvals/{approval}"),
                    &body,
                )
                .await?;
            print_approvals(&v1::ApprovalList { approvals: vec![a] }, false)?;
        }
    }
    Ok(())
}

/// A preset as the rule grammar spells it.
fn parse_access(s: &str) -> Result<v1::RuleAccess, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| format!("{s:?} is not a preset (read-only, read-write, full)"))
}

/// `airlock runs policy` on a server: the policy shown, or changed (with
/// `?wait=true`) and then shown.
async fn policy(
    r: &super::remote::Remote,
    id: &str,
    set: Option<std::path::PathBuf>,
    preset: Option<(v1::RuleAccess, String)>,
    reset: bool,
) -> Result<()> {
    let path = format!("/v1/runs/{id}/policy");
    let current: v1::RunPolicy = match r.get(&path).await {
        Err(e) if super::remote::is_not_found(&e) => return Err(no_run(id)),
        other => other?,
    };
    let body = match (set, preset, reset) {
        (None, None, false) => None,
        (_, _, true) => Some(v1::SetRunPolicy {
            reset: true,
            ..Default::default()
        }),
        (Some(file), _, _) => {
            let text =
                std::fs::read_to_string(&file).map_err(|e| anyhow!("{}: {e}", file.display()))?;
            let rules: v1::PolicyLists =
                serde_json::from_str(&text).map_err(|e| anyhow!("{}: {e}", file.display()))?;
            Some(v1::SetRunPolicy {
                rules: Some(rules),
                ..Default::default()
            })
        }
        (None, Some((access, host)), false) => Some(v1::SetRunPolicy {
            expect_version: Some(current.version),
            rules: Some(with_preset(current.rules.clone(), access, &host)?),
            ..Default::default()
        }),
    };
    let shown = match body {
        None => current,
        Some(b) => {
            r.send_json("PATCH", &format!("{path}?wait=true"), &b)
                .await?
        }
    };
    outln!("{}", serde_json::to_string_pretty(&shown)?);
    Ok(())
}

/// `lists` with every rule of `host` set to `access` (its own methods
/// dropped); an error when no rule names `host`.
fn with_preset(
    mut lists: v1::PolicyLists,
    access: v1::RuleAccess,
    host: &str,
) -> Result<v1::PolicyLists> {
    let mut found = false;
    let all = lists
        .network
        .iter_mut()
        .chain(lists.integrations.values_mut().flatten());
    for rule in all.filter(|r| r.host.eq_ignore_ascii_case(host)) {
        rule.access = Some(access);
        rule.methods.clear();
        found = true;
    }
    if !found {
        return Err(anyhow!(
            "no live rule names the host {host:?} (`airlock runs policy ID` shows them)"
        ));
    }
    Ok(lists)
}

async fn local(cmd: RunsCommand) -> Result<()> {
    let store = Store::open_default().await?;
    match cmd {
        RunsCommand::Policy { .. } => {
            return Err(anyhow!(
                "a run's live policy is a server's: give --server (or AIRLOCK_SERVER)"
            ));
        }
        RunsCommand::List { limit, json } => {
            let runs = store
                .list_runs(&RunQuery {
                    limit: Some(limit),
                    ..Default::default()
                })
                .await?;
            let list = v1::RunList {
                next_cursor: None,
                runs: runs.iter().map(|r| v1::Run::of(r, None)).collect(),
            };
            print_list(&list, json)?;
        }
        RunsCommand::Show { id, json } => {
            let r = super::report::local(&store, &id)
                .await?
                .ok_or_else(|| no_run(&id))?;
            print_report(&r, json)?;
        }
        RunsCommand::Logs { id, follow, json } => {
            if store.get_run(&id).await?.is_none() {
                return Err(no_run(&id));
            }
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
                    let run = store.get_run(&id).await?.ok_or_else(|| no_run(&id))?;
                    if run.status.is_terminal() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
        RunsCommand::Audit { id, ocsf } => {
            if store.get_run(&id).await?.is_none() {
                return Err(no_run(&id));
            }
            // A page at a time, as the API streams it.
            let mut cursor = Some(airlock_store::AuditCursor::default());
            while let Some(after) = cursor {
                let page = store
                    .audit_page(&id, after, airlock_api::audit::AUDIT_PAGE)
                    .await?;
                let mut out = Vec::new();
                airlock_api::audit::write_lines(&page.entries, audit_format(ocsf), &mut out);
                super::out::bytes(&out);
                cursor = page.next;
            }
        }
        RunsCommand::Approvals { id, json } => {
            let run = store.get_run(&id).await?.ok_or_else(|| no_run(&id))?;
            let rows = store.list_approvals(&run.org_id, &id).await?;
            let list = v1::ApprovalList {
                approvals: rows.iter().map(v1::Approval::from).collect(),
            };
            print_approvals(&list, json)?;
        }
        RunsCommand::Approve { .. } => {
            return Err(anyhow!(
                "a held request is answered through the server that runs it: \
                 pass --server (or set AIRLOCK_SERVER)"
            ));
        }
    }
    Ok(())
}

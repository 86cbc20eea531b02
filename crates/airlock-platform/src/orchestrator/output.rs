//! What a run's processes write: the sandbox's two streams and the
//! sidecar's stderr on the platform's own stderr (terminal-safe), their
//! last diagnostic lines kept as the reason of a run that fails before the
//! agent's end; a local runner's output in the platform's log and the run's.

use std::sync::Arc;
use std::time::Duration;

use airlock_platform_api::launch;
use airlock_platform_api::wire::RunEvent;
use airlock_sandbox::{OutputStream, Sandbox};
use airlock_store::Store;
use tokio::io::BufReader;

/// The last lines of a stream, kept.
type Kept = Arc<std::sync::Mutex<std::collections::VecDeque<String>>>;

/// A runner's output (its server's stderr, its own diagnostics) goes to
/// the platform's log, a bounded line at a time: its launcher's own
/// diagnostics (`airlock runner: …`) as warnings, the server's as info.
/// The run's log keeps it too (stream `runner:<namespace>`, what `airlock
/// runs logs` shows), up to [`KEPT_RUNNER_LINES`] lines a stream: a runner
/// that writes without end fills the platform's log, not the store.
pub(super) fn log_runner_output(
    store: &Store,
    run_id: &str,
    namespace: &str,
    sandbox: &mut Sandbox,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (out, err) = sandbox.take_output();
    let mut pumps = Vec::new();
    for pipe in [out, err].into_iter().flatten() {
        let (store, run_id, namespace) = (store.clone(), run_id.to_owned(), namespace.to_owned());
        pumps.push(tokio::spawn(async move {
            use airlock_sandbox::terminal;
            let stream = runner_stream(&namespace);
            let mut kept = 0usize;
            let mut pipe = tokio::io::BufReader::new(pipe);
            while let Ok(Some(line)) = terminal::next_line(&mut pipe, terminal::MAX_LINE).await {
                if line.starts_with("airlock runner:") {
                    tracing::warn!(target: "airlock::runner", integration = %namespace, "{line}");
                } else {
                    tracing::info!(target: "airlock::runner", integration = %namespace, "{line}");
                }
                let line = match kept.cmp(&KEPT_RUNNER_LINES) {
                    std::cmp::Ordering::Less => line,
                    std::cmp::Ordering::Equal => format!(
                        "airlock: the runner's further output is not kept in the run's log (past {KEPT_RUNNER_LINES} lines; the platform's log has it)"
                    ),
                    std::cmp::Ordering::Greater => continue,
                };
                kept += 1;
                let at = airlock_store::now_ms();
                let event = RunEvent::Log {
                    at,
                    stream: stream.clone(),
                    line,
                };
                let payload = serde_json::to_string(&event).unwrap_or_else(|_| "{}".into());
                let stored = store
                    .append_event(&airlock_store::NewEvent {
                        run_id: &run_id,
                        at,
                        kind: "log",
                        payload: &payload,
                    })
                    .await;
                if let Err(e) = stored {
                    tracing::warn!(target: "airlock::runner", integration = %namespace, "not kept in the run's log: {e}");
                }
            }
        }));
    }
    pumps
}

/// Lines of a runner's output kept in the run's log, per stream.
pub const KEPT_RUNNER_LINES: usize = 10_000;

/// The log streams of local runners start so (then the integration's
/// namespace).
pub const RUNNER_STREAM: &str = "runner:";

/// The log stream of the runner of integration `namespace`.
pub fn runner_stream(namespace: &str) -> String {
    format!("{RUNNER_STREAM}{namespace}")
}

/// The sidecar's stderr, shown to the operator and kept (its last lines).
#[derive(Default)]
pub(super) struct SidecarLog {
    /// Its stdout: the readiness line, then (once it stops) the flushed line.
    pub(super) stdout: Option<BufReader<OutputStream>>,
    lines: Kept,
    pump: Option<tokio::task::JoinHandle<()>>,
}

impl SidecarLog {
    /// Takes the streams of `sidecar`: its stdout kept for the readiness
    /// and flushed lines, its stderr echoed (after `tag`) and its last lines kept.
    pub(super) fn start(sidecar: &mut Sandbox, tag: Option<&str>) -> SidecarLog {
        let (stdout, stderr) = sidecar.take_output();
        let mut log = SidecarLog {
            stdout: stdout.map(BufReader::new),
            ..Default::default()
        };
        if let Some(err) = stderr {
            let prefix = format!("  sidecar: {}", tag.unwrap_or(""));
            log.pump = Some(tokio::spawn(pump(
                err,
                Shown::Echoed(prefix.into()),
                Some(log.lines.clone()),
            )));
        }
        log
    }

    /// Returns once the sidecar has said it is flushed
    /// ([`launch::SidecarFlushed`]) or its stdout has ended (it exited);
    /// never, without a stdout.
    pub(super) async fn flushed(&mut self) {
        use airlock_sandbox::terminal;
        let Some(out) = self.stdout.as_mut() else {
            return std::future::pending().await;
        };
        while let Ok(Some(line)) = terminal::next_line(out, terminal::MAX_LINE).await {
            if launch::SidecarFlushed::is(&line) {
                return;
            }
        }
    }

    /// Its last line, once its stderr has ended (it has exited).
    pub(super) async fn finish(&mut self) -> Option<String> {
        if let Some(p) = self.pump.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), p).await;
        }
        self.lines.lock().ok()?.back().cloned()
    }
}

/// The sandbox's two streams, shown live to the operator (on stderr: stdout
/// is kept for the run report, `--json`), written out safely so an agent's
/// escape sequences never reach the operator's terminal. Stdout carries the
/// agent's lines; stderr only the runtime's and the sandbox setup's own
/// diagnostics (the agent holds no descriptor of it), whose last lines are
/// kept: they are the reason of a run that failed before the agent's end.
pub(super) struct SandboxOutput {
    pumps: Vec<tokio::task::JoinHandle<()>>,
    diagnostics: Kept,
}

/// Diagnostic lines kept per run.
const KEPT_DIAGNOSTICS: usize = 16;

impl SandboxOutput {
    /// `tag`: [`Echo::Tagged`](super::Echo::Tagged)'s prefix (the agent's lines are then read
    /// and dropped, never echoed); `None`: the live view.
    pub(super) fn start(sandbox: &mut Sandbox, tag: Option<String>) -> SandboxOutput {
        let diagnostics: Kept = Arc::default();
        let (out, err) = sandbox.take_output();
        let mut pumps = Vec::new();
        let tag: Option<Arc<str>> = tag.map(Into::into);
        if let Some(out) = out {
            let shown = match &tag {
                None => Shown::Echoed("  │ ".into()),
                Some(_) => Shown::Dropped,
            };
            pumps.push(tokio::spawn(pump(out, shown, None)));
        }
        if let Some(err) = err {
            let prefix = format!("  ! {}", tag.as_deref().unwrap_or(""));
            pumps.push(tokio::spawn(pump(
                err,
                Shown::Echoed(prefix.into()),
                Some(diagnostics.clone()),
            )));
        }
        SandboxOutput { pumps, diagnostics }
    }

    /// Waits (briefly) for the streams to end: the sandbox is gone.
    pub(super) async fn finish(&mut self) {
        for p in self.pumps.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), p).await;
        }
    }

    /// The last line the runtime or the sandbox setup wrote about itself (a
    /// fatal error starts `airlock runtime: ` or `airlock sandbox-init: `;
    /// warnings start `airlock runtime warning:`).
    pub(super) fn last_diagnostic(&self) -> Option<String> {
        let d = self.diagnostics.lock().ok()?;
        d.iter()
            .rev()
            .find(|l| l.starts_with("airlock runtime:") || l.starts_with("airlock sandbox-init:"))
            .or(d.back())
            .cloned()
    }
}

/// What [`pump`] does with a stream's lines on this process's stderr.
enum Shown {
    /// Each line after this prefix.
    Echoed(Arc<str>),
    /// None (the stream is still read to its end).
    Dropped,
}

async fn pump<R: tokio::io::AsyncRead + Unpin>(r: R, shown: Shown, keep: Option<Kept>) {
    use airlock_sandbox::terminal;
    let mut r = BufReader::new(r);
    while let Ok(Some(line)) = terminal::next_line(&mut r, terminal::MAX_LINE).await {
        let Shown::Echoed(prefix) = &shown else {
            continue;
        };
        let line = terminal::safe(&line).into_owned();
        crate::operator::say(format_args!("{prefix}{line}"));
        if let Some(keep) = &keep
            && let Ok(mut k) = keep.lock()
        {
            if k.len() == KEPT_DIAGNOSTICS {
                k.pop_front();
            }
            k.push_back(line);
        }
    }
}

//! What a run's processes write: the sandbox's two streams and the
//! sidecar's stderr on the platform's own stderr (terminal-safe), their
//! last diagnostic lines kept as the reason of a run that fails before the
//! agent's end; a local runner's output in the platform's log and the run's.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use airlock_platform_api::launch;
use airlock_platform_api::wire::RunEvent;
use airlock_sandbox::{OutputStream, Sandbox};
use airlock_store::Store;
use tokio::io::BufReader;

/// The last lines of a stream, kept.
type Kept = Arc<std::sync::Mutex<std::collections::VecDeque<String>>>;

/// A runner's output (its server's stderr, its own diagnostics) goes to
/// the platform's log, a bounded line at a time, as it is read: its
/// launcher's own diagnostics (`airlock runner: …`) as warnings, the
/// server's as info. The run's log keeps it too (stream
/// `runner:<namespace>`, what `airlock runs logs` shows), up to
/// [`KEPT_RUNNER_LINES`] lines a stream, stored in batches: a runner that
/// writes without end fills the platform's log, not the store.
pub(super) fn log_runner_output(
    store: &Store,
    run_id: &str,
    namespace: &str,
    sandbox: &mut Sandbox,
) -> Vec<RunnerPump> {
    let (out, err) = sandbox.take_output();
    [out, err]
        .into_iter()
        .flatten()
        .map(|pipe| RunnerPump::start(store, run_id, namespace, pipe))
        .collect()
}

/// How long a run's end waits, in all, for its runners' lines to be stored
/// once the runners are gone (each stream is at most [`KEPT_RUNNER_LINES`]
/// lines, stored [`RUNNER_BATCH`] at a time).
pub(super) const RUNNER_LOG_GRACE: Duration = Duration::from_secs(10);

/// Lines of a runner's output stored in one transaction, at most.
const RUNNER_BATCH: usize = 256;

/// One stream of a runner: read to its end, each line to the platform's
/// log at once and to the run's log in batches. What it read and has not
/// stored when the run's end cannot wait longer is counted and said in
/// the run's log ([`RunnerPump::finish`]): its lines are shed, never
/// silently.
pub(super) struct RunnerPump {
    task: tokio::task::JoinHandle<()>,
    store: Store,
    run_id: String,
    stream: String,
    /// Lines handed to the run's log, and those stored.
    read: Arc<AtomicUsize>,
    stored: Arc<AtomicUsize>,
}

impl RunnerPump {
    fn start(store: &Store, run_id: &str, namespace: &str, pipe: OutputStream) -> RunnerPump {
        let read = Arc::new(AtomicUsize::new(0));
        let stored = Arc::new(AtomicUsize::new(0));
        let stream = runner_stream(namespace);
        let (tx, rx) = tokio::sync::mpsc::channel::<(i64, String)>(RUNNER_BATCH * 2);
        let reader = read_runner(pipe, namespace.to_owned(), tx, read.clone());
        let writer = store_runner_lines(
            store.clone(),
            run_id.to_owned(),
            stream.clone(),
            rx,
            stored.clone(),
        );
        let task = tokio::spawn(async move {
            tokio::join!(reader, writer);
        });
        RunnerPump {
            task,
            store: store.clone(),
            run_id: run_id.to_owned(),
            stream,
            read,
            stored,
        }
    }

    /// Waits until the stream has ended and its lines are stored, or until
    /// `deadline`: then the pump stops and the run's log gets one line
    /// saying how many of its lines it does not hold.
    pub(super) async fn finish(self, deadline: tokio::time::Instant) {
        let mut task = self.task;
        if tokio::time::timeout_at(deadline, &mut task).await.is_ok() {
            return;
        }
        task.abort();
        let _ = task.await;
        let lost = self
            .read
            .load(Ordering::Acquire)
            .saturating_sub(self.stored.load(Ordering::Acquire));
        let line = if lost == 0 {
            "airlock: this runner's log stops here: its output had not ended when the run ended"
                .to_owned()
        } else {
            format!(
                "airlock: this runner's log stops here: the run ended before {lost} more of its lines were stored (the platform's log has them)"
            )
        };
        tracing::warn!(target: "airlock::runner", stream = %self.stream, "{line}");
        let at = airlock_store::now_ms();
        let payload = log_payload(at, &self.stream, line);
        let event = airlock_store::NewEvent {
            run_id: &self.run_id,
            at,
            kind: "log",
            payload: &payload,
        };
        if let Err(e) = self.store.append_event(&event).await {
            tracing::warn!(target: "airlock::runner", stream = %self.stream, "not kept in the run's log: {e}");
        }
    }
}

/// Reads a runner's stream to its end: every line to the platform's log,
/// the first [`KEPT_RUNNER_LINES`] (then one saying the rest is not kept)
/// to `kept`.
async fn read_runner(
    pipe: OutputStream,
    namespace: String,
    kept: tokio::sync::mpsc::Sender<(i64, String)>,
    read: Arc<AtomicUsize>,
) {
    use airlock_sandbox::terminal;
    let mut pipe = tokio::io::BufReader::new(pipe);
    let mut count = 0usize;
    while let Ok(Some(line)) = terminal::next_line(&mut pipe, terminal::MAX_LINE).await {
        if line.starts_with("airlock runner:") {
            tracing::warn!(target: "airlock::runner", integration = %namespace, "{line}");
        } else {
            tracing::info!(target: "airlock::runner", integration = %namespace, "{line}");
        }
        let line = match count.cmp(&KEPT_RUNNER_LINES) {
            std::cmp::Ordering::Less => line,
            std::cmp::Ordering::Equal => format!(
                "airlock: the runner's further output is not kept in the run's log (past {KEPT_RUNNER_LINES} lines; the platform's log has it)"
            ),
            std::cmp::Ordering::Greater => continue,
        };
        count += 1;
        read.fetch_add(1, Ordering::AcqRel);
        // (The writer ends only after this reader does.)
        let _ = kept.send((airlock_store::now_ms(), line)).await;
    }
}

/// Stores the lines `kept` hands over, as many as are waiting in one
/// transaction (at most [`RUNNER_BATCH`]).
async fn store_runner_lines(
    store: Store,
    run_id: String,
    stream: String,
    mut kept: tokio::sync::mpsc::Receiver<(i64, String)>,
    stored: Arc<AtomicUsize>,
) {
    let mut batch = Vec::with_capacity(RUNNER_BATCH);
    while kept.recv_many(&mut batch, RUNNER_BATCH).await > 0 {
        let events: Vec<(i64, String)> = batch
            .drain(..)
            .map(|(at, line)| (at, log_payload(at, &stream, line)))
            .collect();
        match store.append_events(&run_id, "log", &events).await {
            Ok(()) => {
                stored.fetch_add(events.len(), Ordering::AcqRel);
            }
            Err(e) => {
                tracing::warn!(target: "airlock::runner", stream = %stream, "{} lines not kept in the run's log: {e}", events.len());
            }
        }
    }
}

/// A log event's stored JSON.
fn log_payload(at: i64, stream: &str, line: String) -> String {
    let event = RunEvent::Log {
        at,
        stream: stream.to_owned(),
        line,
    };
    serde_json::to_string(&event).unwrap_or_else(|_| "{}".into())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(events: &[airlock_store::Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| {
                let v: serde_json::Value = serde_json::from_str(&e.payload).unwrap();
                assert_eq!(v["stream"], "runner:wild");
                v["line"].as_str().unwrap().to_owned()
            })
            .collect()
    }

    async fn all_events(store: &Store) -> Vec<airlock_store::Event> {
        let mut all = Vec::new();
        loop {
            let after = all.last().map_or(0, |e: &airlock_store::Event| e.id);
            let page = store.list_events("run_t", after, 1000).await.unwrap();
            if page.is_empty() {
                return all;
            }
            all.extend(page);
        }
    }

    /// A flood is stored in order up to the cap, then one line saying the
    /// rest is not kept; nothing in between is lost.
    #[tokio::test]
    async fn a_runners_flood_is_kept_in_order_up_to_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::journal::tests::store_with_run(dir.path()).await;
        let text: String = (0..KEPT_RUNNER_LINES + 50)
            .map(|k| format!("wild noise {k}\n"))
            .collect();
        let pipe: OutputStream = Box::new(std::io::Cursor::new(text.into_bytes()));
        let pump = RunnerPump::start(&store, "run_t", "wild", pipe);
        pump.finish(tokio::time::Instant::now() + Duration::from_secs(600))
            .await;
        let lines = lines_of(&all_events(&store).await);
        assert_eq!(lines.len(), KEPT_RUNNER_LINES + 1);
        for (k, line) in lines.iter().take(KEPT_RUNNER_LINES).enumerate() {
            assert_eq!(line, &format!("wild noise {k}"));
        }
        assert!(lines[KEPT_RUNNER_LINES].contains("not kept in the run's log"));
    }

    /// A stream that has not ended by the deadline is cut there, and the
    /// run's log says so after the lines it did store.
    #[tokio::test]
    async fn a_stream_still_open_at_the_deadline_is_cut_with_a_line_saying_so() {
        use tokio::io::AsyncWriteExt;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::journal::tests::store_with_run(dir.path()).await;
        let (mut writer, reader) = tokio::io::duplex(1 << 16);
        let pump = RunnerPump::start(&store, "run_t", "wild", Box::new(reader));
        writer.write_all(b"first\nsecond\n").await.unwrap();
        // Both lines stored (the writer still open): then the deadline.
        while pump.stored.load(Ordering::Acquire) < 2 {
            tokio::task::yield_now().await;
        }
        pump.finish(tokio::time::Instant::now()).await;
        let lines = lines_of(&all_events(&store).await);
        assert_eq!(lines[..2], ["first", "second"]);
        assert_eq!(lines.len(), 3);
        assert!(lines[2].contains("stops here"), "{}", lines[2]);
        drop(writer);
    }
}

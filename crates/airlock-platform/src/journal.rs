//! The platform's side of a run's egress journal (the sidecar's side and the
//! format: `airlock_sidecar::journal`): the file is created per run in the
//! run's own directory, followed into the store while the run is live
//! ([`Follower`]: the journal is how every egress record reaches the
//! platform, the sidecar sends none), read to its end when the run ends, and
//! read whole at the boot reclaim of a crashed run.
//!
//! The journal is the platform's own file (its run directory is 0700 and not
//! in the sandbox's view), yet it is read the way every file a run could
//! have touched is: without following symlinks, within a bound. Each line is
//! one egress record; a torn last line (a write cut by a kill or a full
//! disk) is skipped, and so is any other line that does not parse. The
//! records go in with the same upsert by `(run_id, seq)` as the events the
//! sidecar sent: a record already stored is left as it is unless the
//! journal completes it, and a repeated start never undoes a completion.
//!
//! The journal carries the run's other events that must not be lost too
//! (`{"event": …}` lines: the agent's end and result, model usage, the
//! counts of what was shed or aggregated) and its log lines within the
//! run's cap. Each is stored under its place in the journal (its line's
//! byte offset, `seq`): reading the journal again stores nothing twice, so
//! a read the store refused is simply tried again, from the live follower,
//! at the run's end, or at the boot reclaim.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use airlock_platform_api::wire::EgressOutcome;
use airlock_platform_api::wire::{
    EGRESS_JOURNAL_FILE, EgressRecord, JOURNAL_MAX_BYTES, JournalEvent, RunEvent,
};
use airlock_store::{BatchWrite, JournalledEvent, Store, Usage};

use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum JournalIngestError {
    #[error("egress journal: {0}")]
    Read(#[from] airlock_sandbox::untrusted::UntrustedFileError),
    #[error("egress journal of {run_id}: {source}")]
    Store {
        run_id: String,
        source: airlock_store::StoreError,
    },
}

/// The journal's path in a run directory.
pub fn path_in(run_dir: &Path) -> PathBuf {
    run_dir.join(EGRESS_JOURNAL_FILE)
}

/// Creates the (empty) journal of a run in its directory, mode 0600.
pub fn create(run_dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = path_in(run_dir);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits().cast_signed()) // the same flag bits
        .open(&path)?;
    Ok(path)
}

/// What a journal held.
#[derive(Debug, Default, PartialEq)]
pub struct Parsed {
    /// One record per `seq` (its last completion, else its start), in the
    /// order they were first seen; records without a `seq` as they came.
    pub records: Vec<EgressRecord>,
    /// The other events, each with its line's byte offset in the journal.
    pub events: Vec<(u64, RunEvent)>,
    /// Lines that did not parse (a torn last line among them).
    pub skipped: usize,
}

impl Parsed {
    /// The agent's end, as the runtime reported it (the last one).
    pub fn result(&self) -> Option<&RunEvent> {
        self.events
            .iter()
            .rev()
            .map(|(_, e)| e)
            .find(|e| matches!(e, RunEvent::Result { .. }))
    }
}

/// Parses a journal's bytes.
pub fn parse(bytes: &[u8]) -> Parsed {
    parse_at(bytes, 0)
}

/// Parses journal bytes that start at byte `base` of the journal.
pub fn parse_at(bytes: &[u8], base: u64) -> Parsed {
    let mut out = Parsed::default();
    let mut by_seq: HashMap<u64, usize> = HashMap::new();
    let mut at = base;
    for line in bytes.split(|b| *b == b'\n') {
        let offset = at;
        at += line.len() as u64 + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let Ok(rec) = serde_json::from_slice::<EgressRecord>(line) else {
            match serde_json::from_slice::<JournalEvent>(line) {
                Ok(e) => out.events.push((offset, e.event)),
                Err(_) => out.skipped += 1,
            }
            continue;
        };
        match rec.seq.and_then(|s| by_seq.get(&s).copied()) {
            Some(i) => {
                if rec.outcome != Some(EgressOutcome::Incomplete) {
                    out.records[i] = rec;
                }
            }
            None => {
                if let Some(s) = rec.seq {
                    by_seq.insert(s, out.records.len());
                }
                out.records.push(rec);
            }
        }
    }
    out
}

/// Reads the journal at `path` (if there is one) into the store; returns
/// how many records and events it held. A missing journal is none.
pub async fn ingest(store: &Store, run_id: &str, path: &Path) -> Result<usize, JournalIngestError> {
    Ok(ingest_whole(store, run_id, path).await?.0)
}

/// [`ingest`], with the agent's end the journal held.
pub async fn ingest_whole(
    store: &Store,
    run_id: &str,
    path: &Path,
) -> Result<(usize, Option<RunEvent>), JournalIngestError> {
    Ok(match ingest_parsed(store, run_id, path).await? {
        Some((n, parsed)) => (n, parsed.result().cloned()),
        None => (0, None),
    })
}

/// Reads the journal at `path` whole into the store: how many records and
/// events it held, and what they were (`None`: there is no journal).
async fn ingest_parsed(
    store: &Store,
    run_id: &str,
    path: &Path,
) -> Result<Option<(usize, Parsed)>, JournalIngestError> {
    let bytes = match airlock_sandbox::untrusted::read_file(path, JOURNAL_MAX_BYTES) {
        Ok(b) => b,
        Err(airlock_sandbox::untrusted::UntrustedFileError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let parsed = parse_reported(run_id, &bytes, 0);
    let n = store_parsed(store, run_id, &parsed).await?;
    Ok(Some((n, parsed)))
}

/// How soon a live run's journal is read again while records flow into it:
/// each read then stores a few milliseconds of work (one read every 500 ms
/// stored ~2000 records of a busy run in a 50 ms burst of the store's
/// thread, which showed in the platform's answers around it; the reads are
/// background work too, [`crate::background`]).
pub const FOLLOW_BUSY: std::time::Duration = std::time::Duration::from_millis(50);

/// The longest wait between two reads of a quiet journal (the wait doubles
/// from [`FOLLOW_BUSY`] while nothing new comes): an idle run costs about a
/// read a second, and a record is in the store within this of being written
/// (on a host with idle CPU time: the reads are background work).
pub const FOLLOW_QUIET: std::time::Duration = std::time::Duration::from_secs(1);

/// A journal read as it grows: each [`Tail::catch_up`] stores the complete
/// lines written since the last one. The file is opened once (never through
/// a symlink, a regular file only) and read at most to its bound.
pub struct Tail {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// Bytes read so far.
    offset: u64,
    /// What was read after the last complete line (a line being written),
    /// or lines the store did not take: kept, never read again.
    pending: Vec<u8>,
    /// The journal offset of `pending`'s first byte.
    consumed: u64,
    /// The agent's end, once a read saw it.
    result: Option<RunEvent>,
    /// Where what is stored is counted, when it is.
    count: Option<Count>,
}

/// What the platform observes of a followed journal besides storing it.
#[derive(Default)]
pub struct Observe {
    /// Counts what is stored (each record and event once).
    pub metrics: Option<Arc<Metrics>>,
    /// Keeps each record's last state, for the run's trace.
    pub keep_records: bool,
}

/// What a [`Tail`] observed: the records counted by `seq`, the events up
/// to a place in the journal, and (for a trace) each record's last state.
struct Count {
    metrics: Option<Arc<Metrics>>,
    seen: HashSet<u64>,
    /// The journal offset up to which events are counted.
    events_to: u64,
    kept: Option<BTreeMap<u64, EgressRecord>>,
}

impl Count {
    /// Counts what `parsed` holds that is not counted yet.
    fn add(&mut self, parsed: &Parsed) {
        let events_to = self.events_to;
        if let Some(m) = &self.metrics {
            let events = parsed
                .events
                .iter()
                .filter(|(at, _)| *at >= events_to)
                .map(|(_, e)| e);
            m.journalled(&parsed.records, events, &mut self.seen);
        }
        if let Some((at, _)) = parsed.events.last() {
            self.events_to = self.events_to.max(*at + 1);
        }
        if let Some(kept) = self.kept.as_mut() {
            for r in &parsed.records {
                let Some(seq) = r.seq else { continue };
                // A repeated start never undoes a completion (as in the store).
                if r.outcome == Some(EgressOutcome::Incomplete) && kept.contains_key(&seq) {
                    continue;
                }
                kept.insert(seq, r.clone());
            }
        }
    }
}

impl Tail {
    pub fn new(path: PathBuf) -> Tail {
        Tail {
            path,
            file: None,
            offset: 0,
            pending: Vec::new(),
            consumed: 0,
            result: None,
            count: None,
        }
    }

    /// Observes what it stores as `observe` asks.
    pub fn observed(mut self, observe: Observe) -> Tail {
        if observe.metrics.is_some() || observe.keep_records {
            self.count = Some(Count {
                metrics: observe.metrics,
                seen: HashSet::new(),
                events_to: 0,
                kept: observe.keep_records.then(BTreeMap::new),
            });
        }
        self
    }

    /// The records kept for a trace, each in its last state.
    fn take_records(&mut self) -> Vec<EgressRecord> {
        self.count
            .as_mut()
            .and_then(|c| c.kept.take())
            .map(|k| k.into_values().collect())
            .unwrap_or_default()
    }

    /// The agent's end, if a read saw it.
    pub fn result(&self) -> Option<&RunEvent> {
        self.result.as_ref()
    }

    /// Parses `bytes` (read from `base`), notes the agent's end, and stores
    /// them; lines the store did not take are kept for the next call.
    async fn store_read(
        &mut self,
        store: &Store,
        run_id: &str,
        base: u64,
        bytes: Vec<u8>,
    ) -> Result<usize, JournalIngestError> {
        if bytes.is_empty() {
            return Ok(0);
        }
        let parsed = parse_reported(run_id, &bytes, base);
        if let Some(r) = parsed.result() {
            self.result = Some(r.clone());
        }
        match store_parsed(store, run_id, &parsed).await {
            Ok(n) => {
                if let Some(c) = self.count.as_mut() {
                    c.add(&parsed);
                }
                Ok(n)
            }
            Err(e) => {
                // Read again next time (each line is stored once).
                let mut back = bytes;
                back.append(&mut self.pending);
                self.pending = back;
                self.consumed = base;
                Err(e)
            }
        }
    }

    /// Stores the records of the complete lines written since the last call
    /// (a line still being written waits for the next); returns how many
    /// there were. A journal not created yet holds none. The records go
    /// through `store`'s [`Store::own_connection`]: called from the
    /// background thread, its statements run at that thread's priority
    /// (see [`crate::background`]). Should that connection not open,
    /// nothing is read: the lines wait for the next call.
    pub async fn catch_up(
        &mut self,
        store: &Store,
        run_id: &str,
    ) -> Result<usize, JournalIngestError> {
        let own = store
            .own_connection()
            .await
            .map_err(|source| JournalIngestError::Store {
                run_id: run_id.to_owned(),
                source,
            })?;
        let (base, bytes) = self.read(false)?;
        self.store_read(&own, run_id, base, bytes).await
    }

    /// The last read, once the sidecar has stopped: every line left (a torn
    /// last one is skipped).
    pub async fn finish(
        &mut self,
        store: &Store,
        run_id: &str,
    ) -> Result<usize, JournalIngestError> {
        let (base, bytes) = self.read(true)?;
        self.store_read(store, run_id, base, bytes).await
    }

    /// The lines not handed out yet, with the journal offset they start
    /// at: up to the last newline read so far, or (`to_end`) everything.
    fn read(&mut self, to_end: bool) -> Result<(u64, Vec<u8>), JournalIngestError> {
        use std::os::unix::fs::FileExt;
        if self.file.is_none() {
            match airlock_sandbox::untrusted::open_regular(&self.path) {
                Ok(f) => self.file = Some(f),
                Err(airlock_sandbox::untrusted::UntrustedFileError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    return Ok((self.consumed, Vec::new()));
                }
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(file) = &self.file {
            let io = |source: std::io::Error| {
                JournalIngestError::Read(airlock_sandbox::untrusted::UntrustedFileError::Io {
                    path: self.path.display().to_string(),
                    source,
                })
            };
            let len = file.metadata().map_err(io)?.len().min(JOURNAL_MAX_BYTES);
            if let Some(new) = len.checked_sub(self.offset).filter(|n| *n > 0) {
                let start = self.pending.len();
                self.pending
                    .resize(start + usize::try_from(new).unwrap_or(usize::MAX), 0);
                let read = file.read_at(&mut self.pending[start..], self.offset);
                let n = read.as_ref().map_or(0, |n| *n);
                self.pending.truncate(start + n);
                self.offset += n as u64;
                read.map_err(io)?;
            }
        }
        let complete = if to_end {
            self.pending.len()
        } else {
            self.pending
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1)
        };
        let rest = self.pending.split_off(complete);
        let base = self.consumed;
        self.consumed += complete as u64;
        Ok((base, std::mem::replace(&mut self.pending, rest)))
    }
}

/// [`parse_at`], reporting the lines it skipped.
fn parse_reported(run_id: &str, bytes: &[u8], base: u64) -> Parsed {
    let parsed = parse_at(bytes, base);
    if parsed.skipped > 0 {
        tracing::warn!(
            run_id,
            skipped = parsed.skipped,
            "egress journal: skipped lines that do not parse (a torn last line)"
        );
    }
    parsed
}

/// How an event from a journal is stored: its kind, and the usage it adds.
fn journalled(seq: u64, e: &RunEvent) -> JournalledEvent {
    let usage = match e {
        RunEvent::Cost(c) => Some(Usage {
            tokens_in: i64::try_from(c.input_tokens).unwrap_or(i64::MAX),
            tokens_out: i64::try_from(c.output_tokens).unwrap_or(i64::MAX),
            cost_microusd: i64::try_from(c.cost_microusd.unwrap_or(0)).unwrap_or(i64::MAX),
        }),
        _ => None,
    };
    let (kind, at) = (e.kind(), e.at());
    JournalledEvent {
        seq: i64::try_from(seq).unwrap_or(i64::MAX),
        at,
        kind: kind.to_owned(),
        payload: serde_json::to_string(e).unwrap_or_else(|_| "{}".into()),
        usage,
    }
}

/// Stores parsed journal records and events; returns how many.
async fn store_parsed(
    store: &Store,
    run_id: &str,
    parsed: &Parsed,
) -> Result<usize, JournalIngestError> {
    let records: Vec<_> = parsed
        .records
        .iter()
        .map(|r| crate::internal_api::new_egress(run_id, r))
        .collect();
    // Statement by statement: the write lock is never held while this task
    // waits for a CPU between two statements, which on a saturated host a
    // foreground worker does too. (A batch stored in part and read again is
    // stored once: its records complete by `seq`.)
    store
        .append_egress_batch(&records, BatchWrite::ByStatement)
        .await
        .map_err(|source| JournalIngestError::Store {
            run_id: run_id.to_owned(),
            source,
        })?;
    // An approval event is the platform's own ([`RunEvent::is_platforms`]):
    // one in a sidecar's journal is not kept.
    let events: Vec<JournalledEvent> = parsed
        .events
        .iter()
        .filter(|(_, e)| !e.is_platforms())
        .map(|(seq, e)| journalled(*seq, e))
        .collect();
    store
        .append_journal_events(run_id, &events)
        .await
        .map_err(|source| JournalIngestError::Store {
            run_id: run_id.to_owned(),
            source,
        })?;
    Ok(records.len() + events.len())
}

/// The tail a [`Follower`] reads through: held by a read while it runs,
/// taken (`None`) once the follower is stopped or finished.
type SharedTail = Arc<tokio::sync::Mutex<Option<Tail>>>;

/// Follows `path` into the store until `stop` fires (or its sender is
/// dropped) or the tail is taken, on the background thread: every
/// [`FOLLOW_BUSY`] while records come, backing off to [`FOLLOW_QUIET`]
/// while none do; counts what it stored in `stored`.
async fn follow_live(
    store: Store,
    run_id: String,
    tail: SharedTail,
    stored: Arc<std::sync::atomic::AtomicUsize>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut wait = FOLLOW_BUSY;
    loop {
        tokio::select! {
            // A stop wins over a read that is due at the same moment: once
            // told to stop (or dropped), no further read is started.
            biased;
            _ = &mut stop => break,
            () = tokio::time::sleep(wait) => {}
        }
        let mut held = tail.lock().await;
        // Taken: the follower is stopped or finished, no read starts now.
        let Some(t) = held.as_mut() else { break };
        let read = t.catch_up(&store, &run_id).await;
        drop(held);
        wait = next_wait(wait, read.as_ref().ok().copied());
        match read {
            Ok(n) => {
                stored.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            }
            // Tried again later, and read whole at the end.
            Err(e) => tracing::warn!(run_id, "{e}"),
        }
    }
}

/// The wait before the next read of a followed journal, given the last wait
/// and how many records the last read stored (`None`: it failed).
fn next_wait(wait: std::time::Duration, stored: Option<usize>) -> std::time::Duration {
    match stored {
        Some(0) => (wait * 2).min(FOLLOW_QUIET),
        Some(_) => FOLLOW_BUSY,
        None => FOLLOW_QUIET,
    }
}

/// A live run's journal followed into the store (its egress log is in the
/// store while the run is live, within [`FOLLOW_QUIET`]): as background
/// work while the run is live, the last read by [`Follower::finish`]'s
/// caller. Dropped unfinished (its run's future was dropped), it stops
/// following: the run's directory stays, and the boot reclaim reads its
/// journal whole.
///
/// Its stop and finish take the tail from the background task rather than
/// wait for that task to return: it runs at idle priority, and on a busy
/// host it may not be scheduled for a while; they wait only for a read in
/// progress (which holds the tail) to end.
pub struct Follower {
    stop: tokio::sync::oneshot::Sender<()>,
    tail: SharedTail,
    stored: Arc<std::sync::atomic::AtomicUsize>,
    store: Store,
    run_id: String,
    run_dir: PathBuf,
}

impl Follower {
    /// Follows the journal of the run in `run_dir` (it may not exist yet),
    /// observing what it stores as `observe` asks.
    pub fn start(store: &Store, run_id: &str, run_dir: &Path, observe: Observe) -> Follower {
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let tail: SharedTail = Arc::new(tokio::sync::Mutex::new(Some(
            Tail::new(path_in(run_dir)).observed(observe),
        )));
        let stored = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // Not joined: it ends at its next wake-up once stopped (or the tail
        // is taken).
        drop(crate::background::spawn(follow_live(
            store.clone(),
            run_id.to_owned(),
            tail.clone(),
            stored.clone(),
            stopped,
        )));
        Follower {
            stop,
            tail,
            stored,
            store: store.clone(),
            run_id: run_id.to_owned(),
            run_dir: run_dir.to_owned(),
        }
    }

    /// Stops following without reading the rest: once this returns, nothing
    /// more of the journal reaches the store through this follower (a read
    /// in progress has ended).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        drop(self.tail.lock().await.take());
    }

    /// Once the sidecar has stopped: the rest of the journal goes into the
    /// store. Should following have failed, the journal is read whole.
    /// Returns what the run's end needs: the agent's end as the journal
    /// holds it, and whether everything is stored (not, while the store is
    /// down: the journal stays on disk, and [`ingest_whole`] reads it again).
    pub async fn finish(self) -> JournalEnd {
        let _ = self.stop.send(());
        let taken = self.tail.lock().await.take();
        let live = self.stored.load(std::sync::atomic::Ordering::Relaxed);
        match taken {
            Some(mut tail) => match tail.finish(&self.store, &self.run_id).await {
                Ok(last) => {
                    tracing::debug!(
                        run_id = self.run_id,
                        records = live + last,
                        "run journal followed into the store"
                    );
                    JournalEnd {
                        records: tail.take_records(),
                        result: tail.result,
                        stored: true,
                    }
                }
                Err(e) => {
                    tracing::warn!(run_id = self.run_id, "{e}: reading the journal whole");
                    let (seen, count) = (tail.result, tail.count);
                    Self::read_whole(&self.store, &self.run_id, &self.run_dir, seen, count).await
                }
            },
            None => {
                tracing::error!(
                    run_id = self.run_id,
                    "the run journal's follower lost its tail"
                );
                Self::read_whole(&self.store, &self.run_id, &self.run_dir, None, None).await
            }
        }
    }

    /// Reads the journal whole into the store; what the follower had not
    /// counted yet is counted (`count`: nothing when following failed).
    async fn read_whole(
        store: &Store,
        run_id: &str,
        run_dir: &Path,
        seen: Option<RunEvent>,
        count: Option<Count>,
    ) -> JournalEnd {
        match ingest_parsed(store, run_id, &path_in(run_dir)).await {
            Ok(parsed) => {
                let mut records = Vec::new();
                let result = parsed.and_then(|(_, p)| {
                    if let Some(mut c) = count {
                        c.add(&p);
                        records = c
                            .kept
                            .map(|k| k.into_values().collect())
                            .unwrap_or_default();
                    }
                    p.result().cloned()
                });
                JournalEnd {
                    records,
                    result: result.or(seen),
                    stored: true,
                }
            }
            Err(e) => {
                tracing::error!(run_id, "{e}");
                // What the store did not take is still on disk; the agent's
                // end is read from there even so.
                let result =
                    airlock_sandbox::untrusted::read_file(&path_in(run_dir), JOURNAL_MAX_BYTES)
                        .ok()
                        .and_then(|b| parse(&b).result().cloned())
                        .or(seen);
                JournalEnd {
                    records: Vec::new(),
                    result,
                    stored: false,
                }
            }
        }
    }
}

/// What a run's journal says at its end.
#[derive(Debug)]
pub struct JournalEnd {
    /// Each egress record's last state, when kept for a trace ([`Observe`]).
    pub records: Vec<EgressRecord>,
    /// The agent's end, as the runtime reported it.
    pub result: Option<RunEvent>,
    /// Whether everything in the journal is in the store.
    pub stored: bool,
}

/// [`ingest`] of the journal in a run directory, reporting instead of
/// failing; `false` when the store did not take it (read it again later).
pub async fn ingest_run_dir(store: &Store, run_id: &str, run_dir: &Path) -> bool {
    match ingest(store, run_id, &path_in(run_dir)).await {
        Ok(0) => true,
        Ok(n) => {
            tracing::debug!(run_id, records = n, "run journal read into the store");
            true
        }
        // Only the store's refusal leaves it to a later read: a journal that
        // cannot be read never will be.
        Err(e @ JournalIngestError::Store { .. }) => {
            tracing::error!(run_id, "{e}");
            false
        }
        Err(e) => {
            tracing::error!(run_id, "{e}");
            true
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn rec(seq: u64, outcome: EgressOutcome, status: Option<u16>) -> EgressRecord {
        EgressRecord {
            at: 1,
            source: airlock_platform_api::wire::EgressSource::Proxy,
            plane: None,
            integration: None,
            method: "GET".into(),
            url: "http://h.test/".into(),
            host: "h.test".into(),
            decision: airlock_platform_api::wire::EgressDecision::Allowed,
            code: None,
            status,
            bytes_out: 0,
            bytes_in: 0,
            duration_ms: None,
            seq: Some(seq),
            outcome: Some(outcome),
            metering: None,
            steps: None,
            rule: None,
        }
    }

    fn line(r: &EgressRecord) -> String {
        format!("{}\n", serde_json::to_string(r).unwrap())
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_a_repeated_start_never_undoes_a_completion() {
        let start1 = rec(1, EgressOutcome::Incomplete, None);
        let done1 = rec(1, EgressOutcome::Completed, Some(200));
        let start2 = rec(2, EgressOutcome::Incomplete, None);
        let mut text = line(&start1) + &line(&done1) + &line(&start1) + &line(&start2);
        let torn = line(&rec(3, EgressOutcome::Incomplete, None));
        text.push_str(&torn[..torn.len() / 2]);
        let p = parse(text.as_bytes());
        assert_eq!(p.records, vec![done1, start2]);
        assert_eq!(p.skipped, 1);
    }

    #[test]
    fn create_makes_a_private_new_file_and_never_follows_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = create(dir.path()).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A second create (or a planted file or link) is refused.
        assert!(create(dir.path()).is_err());
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(other.path().join("x"), path_in(other.path())).unwrap();
        assert!(create(other.path()).is_err());
        assert!(!other.path().join("x").exists());
    }

    /// A store in `dir` with one `running` run, `run_t`.
    pub(crate) async fn store_with_run(dir: &Path) -> Store {
        let store = Store::open_sqlite(&dir.join("airlock.db"), &Default::default())
            .await
            .unwrap();
        store
            .insert_run(&airlock_store::NewRun {
                org: airlock_store::LOCAL_ORG,
                owner: None,
                id: "run_t",
                agent: "a",
                backend: "test",
                model: None,
                status: airlock_store::RunStatus::Running,
                created_at: None,
            })
            .await
            .unwrap();
        store
    }

    fn append(path: &Path, text: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    fn outcomes(log: &[airlock_store::EgressEntry]) -> Vec<(Option<i64>, Option<EgressOutcome>)> {
        log.iter().map(|e| (e.seq, e.outcome)).collect()
    }

    /// The platform's live view: each catch-up stores the complete lines
    /// written since the last one, a line still being written waits, a
    /// completion written later completes its record, and the last read
    /// skips a torn end.
    #[tokio::test]
    async fn a_followed_journal_reaches_the_store_as_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_run(dir.path()).await;
        let path = path_in(dir.path());
        let mut tail = Tail::new(path.clone());
        // Not created yet: nothing, and no error.
        assert_eq!(tail.catch_up(&store, "run_t").await.unwrap(), 0);
        create(dir.path()).unwrap();
        let start1 = line(&rec(1, EgressOutcome::Incomplete, None));
        let start2 = line(&rec(2, EgressOutcome::Incomplete, None));
        append(&path, &start1);
        append(&path, &start2[..10]);
        assert_eq!(tail.catch_up(&store, "run_t").await.unwrap(), 1);
        // The line being written is kept, not read again at the next turn.
        assert_eq!(tail.offset, std::fs::metadata(&path).unwrap().len());
        assert_eq!(tail.pending, start2.as_bytes()[..10]);
        let log = store.list_egress("run_t", 100).await.unwrap();
        assert_eq!(outcomes(&log), [(Some(1), Some(EgressOutcome::Incomplete))]);
        append(&path, &start2[10..]);
        append(&path, &line(&rec(1, EgressOutcome::Completed, Some(200))));
        assert_eq!(tail.catch_up(&store, "run_t").await.unwrap(), 2);
        assert_eq!(tail.catch_up(&store, "run_t").await.unwrap(), 0);
        let torn = line(&rec(3, EgressOutcome::Incomplete, None));
        append(&path, &torn[..torn.len() / 2]);
        assert_eq!(tail.finish(&store, "run_t").await.unwrap(), 0);
        let log = store.list_egress("run_t", 100).await.unwrap();
        assert_eq!(
            outcomes(&log),
            [
                (Some(1), Some(EgressOutcome::Completed)),
                (Some(2), Some(EgressOutcome::Incomplete))
            ]
        );
        assert_eq!(log[0].status, Some(200));
    }

    /// A journal replaced by a symlink (to a file that never ends) is not
    /// read through it.
    #[tokio::test]
    async fn a_followed_journal_is_never_read_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_run(dir.path()).await;
        std::os::unix::fs::symlink("/dev/zero", path_in(dir.path())).unwrap();
        let mut tail = Tail::new(path_in(dir.path()));
        assert!(tail.catch_up(&store, "run_t").await.is_err());
        assert!(store.list_egress("run_t", 100).await.unwrap().is_empty());
    }

    /// A busy journal is read every `FOLLOW_BUSY`; a quiet one ever less
    /// often, never less than once per `FOLLOW_QUIET`; the first record
    /// after a quiet spell brings the reads back to `FOLLOW_BUSY`.
    #[test]
    fn a_quiet_journal_is_read_less_often_and_a_busy_one_soon_again() {
        let mut wait = FOLLOW_BUSY;
        let mut waits = vec![];
        for _ in 0..8 {
            wait = next_wait(wait, Some(0));
            waits.push(wait.as_millis());
        }
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000, 1000, 1000]);
        assert_eq!(next_wait(FOLLOW_QUIET, Some(3)), FOLLOW_BUSY);
        assert_eq!(next_wait(FOLLOW_BUSY, Some(1)), FOLLOW_BUSY);
        assert_eq!(next_wait(FOLLOW_BUSY, None), FOLLOW_QUIET);
    }

    /// The orchestrator's follower: what was written before the run's end
    /// is in the store once `finish` returns, whether or not a turn of
    /// following came first.
    #[tokio::test]
    async fn the_follower_stores_everything_by_the_time_it_finishes() {
        let dir = tempfile::tempdir().unwrap();
        let (store, follower) = following_three_records(dir.path()).await;
        follower.finish().await;
        let log = store.list_egress("run_t", 100).await.unwrap();
        assert_eq!(
            log.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [Some(1), Some(2), Some(3)]
        );
    }

    /// A run's store and follower, its journal holding three completed
    /// records.
    async fn following_three_records(dir: &Path) -> (Store, Follower) {
        let store = store_with_run(dir).await;
        let follower = Follower::start(&store, "run_t", dir, Observe::default());
        create(dir).unwrap();
        let path = path_in(dir);
        for seq in 1..=3 {
            append(&path, &line(&rec(seq, EgressOutcome::Completed, Some(204))));
        }
        (store, follower)
    }

    /// The attack on priority through the follower: a live run's records
    /// reach the store while it runs, written from the background thread
    /// through the store's own connection (at idle priority), never through
    /// the shared pool, whose connections all stay at normal priority.
    #[tokio::test]
    async fn a_live_read_is_stored_at_idle_priority_and_the_pool_keeps_its_own() {
        use crate::background::tests::{SCHED_IDLE, THREAD_PRIORITIES, normal, threads};
        let _alone = THREAD_PRIORITIES.lock().await;
        let normal = normal();
        let dir = tempfile::tempdir().unwrap();
        let (store, follower) = following_three_records(dir.path()).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while store.list_egress("run_t", 100).await.unwrap().len() < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "the live read reached the store"
            );
            tokio::time::sleep(FOLLOW_BUSY).await;
        }
        let own = threads(airlock_store::OWN_CONNECTION_THREAD);
        assert!(
            own.contains(&(SCHED_IDLE, crate::background::NICE)),
            "the live read's statements ran on an idle-priority connection: {own:?}"
        );
        let pooled = threads("sqlx-sqlite-wor");
        assert!(
            pooled.iter().all(|w| *w == normal),
            "every pooled connection's thread at normal priority: {pooled:?}"
        );
        follower.finish().await;
    }
}

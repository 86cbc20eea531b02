//! The egress log's one recorder, for every site that sends something out of
//! the sandbox (`api_call`, `/llm`, the forward proxy, and any later one).
//!
//! A site asks the guard first. A refusal is recorded with
//! [`Recorder::refused`]: one record, one log line (`Target refused (SSRF)` /
//! `Target refused (policy)`). An allowed request is recorded with
//! [`Recorder::begin`] *before any byte of it leaves*: the record is
//! appended to the run's egress [`Journal`] (one `write(2)`, no round trip).
//! The journal is how the platform gets every record: it follows the file
//! into the store while the run is live and reads it to its end when the
//! run ends (or at the next start's reclaim), so a request that left is in
//! the store even if the sidecar or the platform is killed a moment later
//! (it then stays `incomplete`), and no record costs a request to the
//! platform. A start the journal cannot take is not sent; a completion it
//! cannot take (after the fact) goes with the events instead, and a refusal
//! it cannot take is counted. The returned [`InFlight`] is
//! completed with the upstream's [`Outcome`]; dropped uncompleted (the agent
//! went away, the task was cancelled) it completes as `aborted`.
//!
//! The decision is the guard's alone (`allowed`, or `refused` with its code);
//! what the upstream did (status, `upstream_failed`, bytes, duration) is the
//! record's outcome.
//!
//! Redaction lives here, by construction: sites hand the recorder the URL as
//! it was sent and the call's [`Redactor`]; the recorder strips userinfo,
//! query and fragment, redacts, and is the only code that logs an outbound
//! request. The guard never logs (a refused URL may hold a substituted
//! credential that only the caller can recognise).
//!
//! Refusals are bounded (docs/configuration.md, "What a run keeps"): the
//! first [`REFUSAL_SAMPLES_PER_KEY`] of each code and host, and at most
//! [`REFUSALS_RECORDED_MAX`] in all, are recorded and logged one by one;
//! past that they are counted per code and host ([`Tally`]) and the counts
//! kept as [`RunEvent::Refusals`] when the sidecar stops. A record keeps at
//! most [`LOGGED_URL_MAX_BYTES`] of its URL, and the operator's log line
//! at most [`LOG_LINE_URL_MAX_BYTES`].
//!
//! When the sidecar stops, [`Recorder::drain`] waits for the requests in
//! flight within [`DRAIN_DEADLINE`], asks the rest to stop (a model stream
//! then records what it saw), completes what is still open as `aborted` and
//! hands the platform what the events still hold.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_egress::{EgressError, Missing, RuleRefusal, Target};
use airlock_platform_api::wire::{
    EgressDecision, EgressOutcome, EgressRecord, LOGGED_URL_MAX_BYTES, Metering, REFUSAL_KEYS_MAX,
    REFUSAL_SAMPLES_PER_KEY, REFUSALS_RECORDED_MAX, RefusalCode, RunEvent, Step, Steps,
    truncate_logged,
};
use tokio::sync::{Notify, watch};

use crate::clock::now_ms;
use crate::credential::Redactor;
use crate::event_sink::EventSink;
use crate::journal::{Class, Journal, JournalError};

/// The whole budget of a stopping sidecar for the egress log: requests in
/// flight finish within it and every record reaches the platform. The
/// orchestrator sends SIGTERM and waits 5 s before SIGKILL; this stays well
/// under that.
pub const DRAIN_DEADLINE: Duration = Duration::from_millis(2500);
/// The end of the drain kept for handing the last records to the platform.
const FINAL_FLUSH: Duration = Duration::from_millis(700);
/// How long sites asked to stop get to record themselves.
const STOP_GRACE: Duration = Duration::from_millis(250);

/// Where an outbound request comes from (the wire's type).
pub use airlock_platform_api::wire::EgressSource as Source;

/// Which path carried a request to the guard (the wire's type).
pub use airlock_platform_api::wire::EgressPlane as Plane;

/// A request the guard refused: what the site knows of it.
pub struct Refused<'a> {
    pub source: Source,
    pub plane: Plane,
    pub integration: Option<&'a str>,
    pub method: &'a str,
    /// The target as the site had it (it may hold a substituted credential).
    pub url: &'a str,
}

/// A request the guard allowed.
pub struct Allowed<'a> {
    pub source: Source,
    pub plane: Plane,
    pub integration: Option<&'a str>,
    pub method: &'a str,
    /// The admitted target (it may hold a substituted credential).
    pub target: &'a Target,
    /// Request body bytes, when known up front.
    pub bytes_out: u64,
}

/// Why an allowed request could not be recorded, so was not sent.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}; the request was not sent")]
    Journal(#[from] JournalError),
    #[error("the sidecar is stopping")]
    Stopping,
}

impl RecordError {
    /// The refusal code an agent sees (`egress_log_unavailable`, or
    /// `egress_journal_full` once the run's journal is at its bound).
    pub fn code(&self) -> &'static str {
        match self {
            RecordError::Journal(e) => e.code(),
            _ => "egress_log_unavailable",
        }
    }
}

/// Byte counters a long transfer updates as it goes: what an `aborted`
/// record reports.
#[derive(Debug, Default)]
pub struct Progress {
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
}

/// How an allowed request ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// `None` only with `refused`: nothing reached the upstream after all.
    pub kind: Option<EgressOutcome>,
    pub status: Option<u16>,
    /// `None`: the [`Progress`] counters (or what `begin` was told).
    pub bytes_out: Option<u64>,
    pub bytes_in: Option<u64>,
    pub metering: Option<Metering>,
    /// A later hop (a redirect) was refused by the guard, or a connection
    /// turned out to loop back into the sidecar: the record's decision
    /// becomes this refusal.
    pub refused: Option<RefusalCode>,
    /// The rule behind `refused`, when a rule decided it (a tunnel a live
    /// policy change refuses: withdrawn, or to be seen inside).
    pub rule: Option<airlock_egress::RuleRefusal>,
    /// The address a failure or a later refusal is about: the operator's
    /// log line names it, the record (which tenants read) does not.
    pub address: Option<String>,
    /// The sidecar's steps of the request, when the run is traced.
    pub steps: Option<Steps>,
}

impl Outcome {
    pub fn new(kind: EgressOutcome) -> Self {
        Outcome {
            kind: Some(kind),
            status: None,
            bytes_out: None,
            bytes_in: None,
            metering: None,
            refused: None,
            rule: None,
            address: None,
            steps: None,
        }
    }

    /// The upstream answered with `status`; the exchange is over.
    pub fn completed(status: u16) -> Self {
        Outcome {
            status: Some(status),
            ..Outcome::new(EgressOutcome::Completed)
        }
    }

    /// The outcome of a failed send after the first hop was allowed: the
    /// upstream failing, the guard refusing a redirect (the first hop was
    /// answered), or the connection looping back into the sidecar (nothing
    /// was sent).
    pub fn of_error(e: &EgressError) -> Self {
        use airlock_egress::{EgressCode, GuardStep};
        let outcome = match (e.code, e.guard) {
            (EgressCode::UpstreamFailed, _) => Outcome::new(EgressOutcome::UpstreamFailed),
            (code, GuardStep::Redirects) => Outcome {
                refused: Some(code),
                ..Outcome::new(EgressOutcome::Completed)
            },
            (code, _) => Outcome {
                kind: None,
                refused: Some(code),
                ..Outcome::new(EgressOutcome::Completed)
            },
        };
        Outcome {
            address: e.address.clone(),
            ..outcome
        }
    }

    pub fn status(mut self, s: Option<u16>) -> Self {
        self.status = s;
        self
    }

    pub fn bytes_in(mut self, n: u64) -> Self {
        self.bytes_in = Some(n);
        self
    }

    pub fn bytes_out(mut self, n: u64) -> Self {
        self.bytes_out = Some(n);
        self
    }

    pub fn metering(mut self, m: Option<Metering>) -> Self {
        self.metering = m;
        self
    }
}

struct Open {
    rec: EgressRecord,
    started: Instant,
    progress: Arc<Progress>,
}

/// Most of a URL the operator's log line about a request shows.
pub const LOG_LINE_URL_MAX_BYTES: usize = 200;

/// Longest host an egress record keeps (a DNS name is at most 253).
const LOGGED_HOST_MAX_BYTES: usize = 256;

/// The run's refusals: which are recorded one by one, and the counts of
/// the rest per code and host.
#[derive(Default)]
struct Tally {
    recorded: u64,
    /// Refusals recorded per (code, host).
    samples: std::collections::HashMap<(RefusalCode, String), u64>,
    /// Refusals counted, not recorded, per (code, host); at most
    /// [`REFUSAL_KEYS_MAX`] keys, then under the host `*`.
    counted: BTreeMap<(RefusalCode, String), u64>,
    /// Whether the operator was told that refusals are being counted.
    told: bool,
}

impl Tally {
    /// Whether a refusal of `code` to `host` is recorded one by one; if
    /// not, it is counted.
    fn admit(&mut self, code: RefusalCode, host: &str) -> bool {
        let key = (code, host.to_owned());
        let samples = self.samples.get(&key).copied().unwrap_or(0);
        if self.recorded < REFUSALS_RECORDED_MAX && samples < REFUSAL_SAMPLES_PER_KEY {
            self.recorded += 1;
            // Bounded: at most REFUSALS_RECORDED_MAX keys ever get here.
            self.samples.insert(key, samples + 1);
            return true;
        }
        self.count(code, host);
        false
    }

    fn count(&mut self, code: RefusalCode, host: &str) {
        let mut key = (code, host.to_owned());
        if !self.counted.contains_key(&key) && self.counted.len() >= REFUSAL_KEYS_MAX {
            key.1 = "*".into();
        }
        *self.counted.entry(key).or_default() += 1;
        if !self.told {
            self.told = true;
            tracing::warn!(target: "airlock::egress", "refusals past {REFUSAL_SAMPLES_PER_KEY} per code and host (or {REFUSALS_RECORDED_MAX} in all) are counted, not recorded or logged one by one");
        }
    }
}

struct Inner {
    events: EventSink,
    tally: Mutex<Tally>,
    /// The write-ahead journal: every record, before its request leaves.
    journal: Arc<Journal>,
    seq: AtomicU64,
    open: Mutex<BTreeMap<u64, Open>>,
    idle: Notify,
    draining: AtomicBool,
    stop: watch::Sender<bool>,
}

/// The recorder. Cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
}

/// What the egress log may keep of a URL: no userinfo, query or fragment.
fn loggable_url(u: &url::Url) -> String {
    // The usual URL has none of them: its text as it is (no copy to edit).
    if u.username().is_empty()
        && u.password().is_none()
        && u.query().is_none()
        && u.fragment().is_none()
    {
        return u.as_str().to_owned();
    }
    let mut u = u.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    String::from(u)
}

/// The record of a refusal: the target without userinfo, query or fragment,
/// and every credential value redacted (the host included).
fn refusal_record(
    req: &Refused<'_>,
    e: &EgressError,
    redactor: &Redactor,
    seq: u64,
) -> EgressRecord {
    let url = match url::Url::parse(req.url) {
        Ok(u) => truncate_logged(redactor.string(loggable_url(&u)), LOGGED_URL_MAX_BYTES),
        Err(_) => "<unparsable>".to_owned(),
    };
    let host = e
        .host
        .as_deref()
        .map(|h| truncate_logged(redactor.str(h), LOGGED_HOST_MAX_BYTES))
        .unwrap_or_else(|| "-".to_owned());
    EgressRecord {
        at: now_ms(),
        source: req.source,
        plane: Some(req.plane),
        integration: req.integration.map(str::to_owned),
        method: req.method.to_owned(),
        url,
        host,
        decision: EgressDecision::Refused,
        code: Some(e.code),
        status: None,
        bytes_out: 0,
        bytes_in: 0,
        duration_ms: None,
        seq: Some(seq),
        outcome: None,
        metering: None,
        steps: None,
        rule: e.rule.as_deref().map(|r| redacted_rule(r, redactor)),
    }
}

/// A rule's refusal as a record keeps it: a path it names may hold a
/// credential put into the target, and is redacted like the URL.
fn redacted_rule(r: &RuleRefusal, redactor: &Redactor) -> RuleRefusal {
    let missing = match &r.missing {
        Missing::Path { path } => Missing::Path {
            path: truncate_logged(redactor.str(path), LOGGED_URL_MAX_BYTES),
        },
        Missing::Query { parameter } => Missing::Query {
            parameter: truncate_logged(redactor.str(parameter), LOGGED_HOST_MAX_BYTES),
        },
        other => other.clone(),
    };
    RuleRefusal {
        rule: r.rule.clone(),
        missing,
    }
}

/// The operator's log line of a refusal: the record's fields and the
/// address the guard resolved or dialled (`-` when none), which the record
/// itself, read by tenants, and every answer to the agent leave out.
fn log_refusal(rec: &EgressRecord, address: Option<&str>) {
    let code = rec.code.map_or("-", RefusalCode::as_str);
    let ssrf = rec.code.is_some_and(RefusalCode::is_ssrf);
    let (source, host, method) = (&rec.source, &rec.host, &rec.method);
    let url = truncate_logged(rec.url.clone(), LOG_LINE_URL_MAX_BYTES);
    let address = address.unwrap_or("-");
    if ssrf {
        tracing::warn!(target: "airlock::egress", source = %source, code, host = %host, address, method = %method, url = %url, "Target refused (SSRF)");
    } else {
        tracing::warn!(target: "airlock::egress", source = %source, code, host = %host, address, method = %method, url = %url, "Target refused (policy)");
    }
}

/// The operator's log line of an allowed request's end, with the address
/// a failure was about (`-` when none).
fn log_completion(rec: &EgressRecord, address: Option<&str>) {
    tracing::info!(
        target: "airlock::egress",
        address = address.unwrap_or("-"),
        source = %rec.source,
        outcome = rec.outcome.map_or("-", EgressOutcome::as_str),
        status = rec.status.unwrap_or(0),
        host = %rec.host,
        method = %rec.method,
        url = %truncate_logged(rec.url.clone(), LOG_LINE_URL_MAX_BYTES),
        bytes_out = rec.bytes_out,
        bytes_in = rec.bytes_in,
        duration_ms = rec.duration_ms.unwrap_or(0),
        metering = rec.metering.map_or("-", Metering::as_str),
        "egress"
    );
}

impl Recorder {
    pub fn new(events: EventSink, journal: Arc<Journal>) -> Self {
        Recorder {
            inner: Arc::new(Inner {
                events,
                tally: Mutex::default(),
                journal,
                // Unique within the run even if another sidecar of the same
                // run recorded before this one: its start time in ms, times a
                // million, then counting.
                seq: AtomicU64::new(
                    u64::try_from(now_ms())
                        .unwrap_or(0)
                        .saturating_mul(1_000_000),
                ),
                open: Mutex::default(),
                idle: Notify::new(),
                draining: AtomicBool::new(false),
                stop: watch::Sender::new(false),
            }),
        }
    }

    fn next_seq(&self) -> u64 {
        self.inner.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Records a refusal by the guard (nothing was sent) and logs it once;
    /// past the run's refusal bounds, counts it ([`Tally`]).
    pub fn refused(&self, req: &Refused<'_>, e: &EgressError, redactor: &Redactor) {
        self.refused_after(req, e, redactor, None);
    }

    /// [`Recorder::refused`], with the steps the sidecar took before the
    /// refusal (a traced run's guard decision, its credential's fetch).
    pub fn refused_after(
        &self,
        req: &Refused<'_>,
        e: &EgressError,
        redactor: &Redactor,
        steps: Option<Steps>,
    ) {
        let code = e.code;
        let host = e.host.as_deref().unwrap_or("-");
        let admitted = match self.inner.tally.lock() {
            Ok(mut t) => t.admit(
                code,
                &truncate_logged(redactor.str(host), LOGGED_HOST_MAX_BYTES),
            ),
            Err(_) => false,
        };
        if !admitted {
            return;
        }
        let rec = EgressRecord {
            steps,
            ..refusal_record(req, e, redactor, self.next_seq())
        };
        log_refusal(&rec, e.address.as_deref());
        // A refusal the journal cannot take is counted, never sent with the
        // events: a flood of them cannot grow the store past the bounds.
        if let Err(err) = self.inner.journal.append(&rec) {
            tracing::debug!(target: "airlock::egress", "egress journal: {err}; the refusal is counted");
            if let Ok(mut t) = self.inner.tally.lock() {
                t.count(code, &rec.host);
            }
        }
    }

    /// Keeps the counts of the refusals not recorded one by one (at the
    /// sidecar's stop): one [`RunEvent::Refusals`] per code and host.
    fn keep_tally(&self) {
        let counted = match self.inner.tally.lock() {
            Ok(mut t) => std::mem::take(&mut t.counted),
            Err(_) => return,
        };
        for ((code, host), count) in counted {
            let event = RunEvent::Refusals {
                at: now_ms(),
                code,
                host,
                count,
            };
            if let Err(e) = self.inner.journal.append_event(&event, Class::Vital) {
                tracing::error!(target: "airlock::egress", "run journal: refusal counts not kept: {e}");
            }
        }
    }

    /// Keeps a record of something that already happened (a completion):
    /// in the journal, which the platform follows. A record the journal
    /// cannot take (a failure cannot unsend anything) is reported, and
    /// goes to the platform with the events instead (at most one per
    /// request started).
    fn keep_after(&self, rec: EgressRecord) {
        if let Err(e) = self.inner.journal.append(&rec) {
            tracing::error!(target: "airlock::egress", seq = rec.seq.unwrap_or(0), "egress journal: {e}; the record goes with the events");
            self.inner.events.send(RunEvent::Egress(rec));
        }
    }

    /// Records an allowed request before it is sent: returns once the
    /// record is in the journal. A request whose record could not be kept
    /// must not be sent.
    pub fn begin(&self, req: &Allowed<'_>, redactor: &Redactor) -> Result<InFlight, RecordError> {
        self.begin_as(req, redactor, None)
    }

    /// [`Recorder::begin`] of a request that may yet not be sent: dropped
    /// uncompleted (or while it is being recorded) it completes as
    /// `dropped_as` instead of `aborted`, until [`InFlight::will_send`].
    pub fn begin_as(
        &self,
        req: &Allowed<'_>,
        redactor: &Redactor,
        dropped_as: Option<EgressOutcome>,
    ) -> Result<InFlight, RecordError> {
        if self.inner.draining.load(Ordering::Acquire) {
            return Err(RecordError::Stopping);
        }
        let seq = self.next_seq();
        let rec = EgressRecord {
            at: now_ms(),
            source: req.source,
            plane: Some(req.plane),
            integration: req.integration.map(str::to_owned),
            method: req.method.to_owned(),
            url: truncate_logged(
                redactor.string(loggable_url(req.target.url())),
                LOGGED_URL_MAX_BYTES,
            ),
            host: truncate_logged(
                redactor.str(&req.target.host().bare()),
                LOGGED_HOST_MAX_BYTES,
            ),
            decision: EgressDecision::Allowed,
            code: None,
            status: None,
            bytes_out: req.bytes_out,
            bytes_in: 0,
            duration_ms: None,
            seq: Some(seq),
            outcome: Some(EgressOutcome::Incomplete),
            metering: None,
            steps: None,
            rule: None,
        };
        tracing::debug!(target: "airlock::egress", source = req.source.as_str(), seq, "egress starting");
        // Written ahead: once this returns the record survives a kill of the
        // sidecar or the platform, which follows the journal. A record the
        // journal did not take is not opened: its request is not sent.
        match self.inner.journal.append(&rec) {
            Ok(()) => Ok(self.open(rec, dropped_as)),
            Err(e) => {
                tracing::error!(target: "airlock::egress", seq, "egress journal: {e}");
                Err(RecordError::Journal(e))
            }
        }
    }

    /// Opens the flight of a started record: from here on the record is
    /// owned by the flight, and completing or dropping it settles the entry.
    fn open(&self, rec: EgressRecord, dropped_as: Option<EgressOutcome>) -> InFlight {
        let seq = rec.seq.unwrap_or(0);
        let progress = Arc::new(Progress::default());
        progress.bytes_out.store(rec.bytes_out, Ordering::Relaxed);
        if let Ok(mut open) = self.inner.open.lock() {
            open.insert(
                seq,
                Open {
                    rec,
                    started: Instant::now(),
                    progress: progress.clone(),
                },
            );
        }
        InFlight {
            recorder: self.clone(),
            seq,
            progress,
            settled: false,
            dropped_as: dropped_as.unwrap_or(EgressOutcome::Aborted),
            steps: None,
        }
    }

    /// Resolves once the sidecar asks the requests still in flight to stop
    /// (near the end of [`Recorder::drain`]).
    pub fn stop_requested(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.inner.stop.subscribe();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    /// Requests recorded and not completed yet.
    pub fn in_flight(&self) -> usize {
        self.inner.open.lock().map(|o| o.len()).unwrap_or(0)
    }

    async fn wait_idle_until(&self, until: tokio::time::Instant) -> bool {
        loop {
            let notified = self.inner.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return true;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return self.in_flight() == 0;
            }
        }
    }

    /// Finishes the egress log of a stopping sidecar within `deadline`:
    /// waits for the requests in flight, asks the rest to stop, completes
    /// what is still open as `aborted`, and hands the platform what the
    /// events hold. No request is recorded after this has started.
    pub async fn drain(&self, deadline: Duration) {
        self.inner.draining.store(true, Ordering::Release);
        let end = tokio::time::Instant::now() + deadline;
        let ask_at = end
            .checked_sub(FINAL_FLUSH + STOP_GRACE)
            .unwrap_or_else(tokio::time::Instant::now);
        let open = self.in_flight();
        if open > 0 {
            tracing::info!(target: "airlock::egress", open, "waiting for the requests in flight");
        }
        if !self.wait_idle_until(ask_at).await {
            self.inner.stop.send_replace(true);
            self.wait_idle_until(ask_at + STOP_GRACE).await;
        }
        let left: Vec<(u64, Open)> = match self.inner.open.lock() {
            Ok(mut o) => std::mem::take(&mut *o).into_iter().collect(),
            Err(_) => Vec::new(),
        };
        for (_, open) in left {
            self.emit(open, Outcome::new(EgressOutcome::Aborted));
        }
        self.keep_tally();
        if tokio::time::timeout_at(end, self.inner.events.flush())
            .await
            .is_err()
        {
            tracing::error!(target: "airlock::egress", "the platform did not take the last records in time");
        }
    }

    fn emit(&self, open: Open, outcome: Outcome) {
        let Open {
            mut rec,
            started,
            progress,
        } = open;
        rec.outcome = outcome.kind;
        rec.status = outcome.status;
        rec.bytes_out = outcome
            .bytes_out
            .unwrap_or_else(|| progress.bytes_out.load(Ordering::Relaxed));
        rec.bytes_in = outcome
            .bytes_in
            .unwrap_or_else(|| progress.bytes_in.load(Ordering::Relaxed));
        rec.duration_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        rec.metering = outcome.metering;
        rec.steps = outcome.steps;
        let address = outcome.address.as_deref();
        if let Some(code) = outcome.refused {
            rec.decision = EgressDecision::Refused;
            rec.code = Some(code);
            rec.rule = outcome.rule.or(rec.rule);
            log_refusal(&rec, address);
        } else {
            log_completion(&rec, address);
        }
        self.keep_after(rec);
    }

    fn take(&self, seq: u64) -> Option<Open> {
        let mut open = self.inner.open.lock().ok()?;
        let o = open.remove(&seq);
        if open.is_empty() {
            self.inner.idle.notify_waiters();
        }
        o
    }
}

/// An allowed request on its way: complete it with its [`Outcome`].
pub struct InFlight {
    recorder: Recorder,
    seq: u64,
    progress: Arc<Progress>,
    settled: bool,
    /// What a drop without completion records.
    dropped_as: EgressOutcome,
    /// The request's steps so far, when the run is traced.
    steps: Option<Steps>,
}

impl InFlight {
    /// The request is about to be sent: a drop from now on means `aborted`.
    pub fn will_send(&mut self) {
        self.dropped_as = EgressOutcome::Aborted;
    }

    /// Notes one of the sidecar's steps of the request (`None`: the run is
    /// not traced, nothing is kept); its completion carries them.
    pub fn step(&mut self, step: Option<Step>, which: fn(&mut Steps) -> &mut Option<Step>) {
        if let Some(step) = step {
            *which(self.steps.get_or_insert_with(Steps::default)) = Some(step);
        }
    }

    /// The counters an `aborted` completion reports.
    pub fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    /// Completes the record (once; a record the drain already completed is
    /// left as it is).
    pub fn complete(mut self, outcome: Outcome) {
        self.settled = true;
        let outcome = Outcome {
            steps: outcome.steps.or(self.steps),
            ..outcome
        };
        if let Some(open) = self.recorder.take(self.seq) {
            self.recorder.emit(open, outcome);
        }
    }

    /// [`InFlight::complete`], once the site has handed its answer back:
    /// the record of what already happened is journalled after the answer
    /// is written (the site's task writes it before a task spawned now
    /// runs), not in its way.
    pub fn complete_after_answer(self, outcome: Outcome) {
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move { self.complete(outcome) });
            }
            Err(_) => self.complete(outcome),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.settled
            && let Some(open) = self.recorder.take(self.seq)
        {
            let outcome = Outcome {
                steps: self.steps,
                ..Outcome::new(self.dropped_as)
            };
            self.recorder.emit(open, outcome);
        }
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight").field("seq", &self.seq).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_egress::{EgressCode, GuardStep};

    /// Userinfo, query and fragment are cut, each on its own; a URL with
    /// none of them is kept as it is.
    #[test]
    fn the_loggable_url_has_no_userinfo_query_or_fragment() {
        let cases = [
            ("https://api.test/v1/x", "https://api.test/v1/x"),
            ("https://u@api.test/v1/x", "https://api.test/v1/x"),
            ("https://u:p@api.test/v1/x", "https://api.test/v1/x"),
            ("https://:p@api.test/v1/x", "https://api.test/v1/x"),
            ("https://api.test/v1/x?k=v", "https://api.test/v1/x"),
            ("https://api.test/v1/x?", "https://api.test/v1/x"),
            ("https://api.test/v1/x#f", "https://api.test/v1/x"),
            ("https://api.test/v1/x#", "https://api.test/v1/x"),
            ("http://u:p@api.test:8080/?k#f", "http://api.test:8080/"),
        ];
        for (input, logged) in cases {
            let u = url::Url::parse(input).unwrap();
            assert_eq!(loggable_url(&u), logged, "{input}");
        }
    }

    #[test]
    fn a_refusal_record_holds_no_credential() {
        let secret = "Sekr3t-Value-42";
        let redactor = Redactor::new([secret]);
        let req = Refused {
            source: Source::ApiCall,
            plane: Plane::Api,
            integration: Some("svc"),
            method: "GET",
            url: "http://u:p@sekr3t-value-42.evil.test/a/Sekr3t-Value-42?k=Sekr3t-Value-42#f",
        };
        let e = EgressError::new(
            EgressCode::NotAuthorized,
            GuardStep::AuthorizedUris,
            Some("sekr3t-value-42.evil.test"),
            "x",
        );
        let rec = refusal_record(&req, &e, &redactor, 7);
        let all = format!("{rec:?}").to_ascii_lowercase();
        assert!(!all.contains(&secret.to_ascii_lowercase()), "{rec:?}");
        assert_eq!(rec.url, "http://[REDACTED].evil.test/a/[REDACTED]");
        assert_eq!(rec.host, "[REDACTED].evil.test");
        assert_eq!(
            (
                rec.decision.as_str(),
                rec.code.map(RefusalCode::as_str),
                rec.outcome,
                rec.seq
            ),
            ("refused", Some("not_authorized"), None, Some(7))
        );
        let bad = Refused {
            url: "not a url Sekr3t-Value-42",
            ..req
        };
        assert_eq!(refusal_record(&bad, &e, &redactor, 8).url, "<unparsable>");
    }

    #[test]
    fn outcomes_of_a_failed_send() {
        let failed = EgressError::upstream("h", "connection refused");
        let o = Outcome::of_error(&failed);
        assert_eq!(
            (o.kind, o.refused),
            (Some(EgressOutcome::UpstreamFailed), None)
        );
        let redirect = EgressError::new(
            EgressCode::RedirectBlocked,
            GuardStep::Redirects,
            Some("h"),
            "x",
        );
        let o = Outcome::of_error(&redirect);
        assert_eq!(
            (o.kind, o.refused),
            (
                Some(EgressOutcome::Completed),
                Some(EgressCode::RedirectBlocked)
            )
        );
        let looped = EgressError::new(
            EgressCode::BlockedAddress,
            GuardStep::AddressTable,
            Some("h"),
            "x",
        );
        let o = Outcome::of_error(&looped);
        assert_eq!(
            (o.kind, o.refused),
            (None, Some(EgressCode::BlockedAddress))
        );
    }

    /// The attack on refusals: a flood to one host keeps its first samples
    /// and counts the rest; floods to ever new hosts stop being recorded
    /// at the run's bound and their counts stop growing in keys.
    #[test]
    fn refusals_past_their_bounds_are_counted_per_code_and_host() {
        let mut t = Tally::default();
        let admitted = (0..1000)
            .filter(|_| t.admit(EgressCode::NotAuthorized, "a.test"))
            .count();
        assert_eq!(admitted as u64, REFUSAL_SAMPLES_PER_KEY);
        assert_eq!(
            t.counted[&(EgressCode::NotAuthorized, "a.test".to_owned())],
            1000 - REFUSAL_SAMPLES_PER_KEY
        );
        let admitted = (0..10_000)
            .filter(|i| t.admit(EgressCode::NotAuthorized, &format!("h{i}.test")))
            .count() as u64;
        assert_eq!(admitted + REFUSAL_SAMPLES_PER_KEY, REFUSALS_RECORDED_MAX);
        assert!(t.counted.len() <= REFUSAL_KEYS_MAX + 1);
        let total: u64 = t.counted.values().sum();
        assert_eq!(total + REFUSALS_RECORDED_MAX, 11_000);
        assert!(t.samples.len() as u64 <= REFUSALS_RECORDED_MAX);
    }
}

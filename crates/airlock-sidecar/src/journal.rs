//! The run's egress journal: the write-ahead half of the egress log.
//!
//! The platform creates one file per run in the run's own directory (mode
//! 0600 in a 0700 directory the sandbox never sees) and names it in the
//! sidecar's configuration. The sidecar opens it once and appends one JSON
//! line per egress record — a request's start before any byte of it leaves,
//! its completion after — each with a single `write(2)` on an `O_APPEND`
//! descriptor. Once `write(2)` has returned, the line is in the page cache:
//! a sidecar or platform killed a moment later loses nothing, and the
//! platform reads the journal into the store when the run ends (or at the
//! next start's reclaim of a crashed run). A power loss is out of scope (no
//! `fsync`).
//!
//! A line that cannot be written (a full disk, a closed descriptor, the
//! journal's bound) means the request is not sent: the caller gets a
//! [`JournalError`]. After a failed or short write the journal refuses
//! every later line, so a torn line can only be the last one.
//!
//! The journal is the run's lossless path for the rest of what must never
//! be dropped too ([`Journal::append_event`], `{"event": …}` lines): the
//! agent's end and result, the model calls' usage, the counts of what was
//! shed; and the agent's log lines up to the run's log cap. Each class has
//! its own budget: egress records the journal's bound (`max`), log lines
//! [`RUN_LOG_MAX_BYTES`], and what is never shed the reserve on top
//! ([`JOURNAL_RESERVE_BYTES`]), so a flood of one never crowds out another.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use airlock_platform_api::wire::{
    EgressRecord, JOURNAL_RESERVE_BYTES, LOG_LINE_OVERHEAD, RUN_LOG_MAX_BYTES, RunEvent,
};
use rustix::fs::{FileType, Mode, OFlags};

/// Why a record could not be journalled.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("the egress journal {path} cannot be opened: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("the egress journal {path} is not a regular file")]
    NotRegular { path: String },
    #[error("the egress journal is full ({max} bytes): no further request is sent in this run")]
    Full { max: u64 },
    #[error("the egress journal could not be written: {0}")]
    Write(std::io::Error),
    #[error("the egress journal failed earlier: no further request is sent in this run")]
    Broken,
    #[error("the run's log cap ({max} bytes) is reached")]
    LogFull { max: u64 },
    #[error("the run's journal is full ({max} bytes)")]
    ReserveFull { max: u64 },
}

/// What an event line is, for its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// An agent's log line: within [`RUN_LOG_MAX_BYTES`], else refused.
    Log,
    /// What is never shed: bounded only by the whole journal.
    Vital,
}

impl JournalError {
    /// The refusal code an agent sees.
    pub fn code(&self) -> &'static str {
        match self {
            JournalError::Full { .. } => "egress_journal_full",
            _ => "egress_log_unavailable",
        }
    }
}

/// An open journal. Appends are serialised by the kernel (`O_APPEND`).
pub struct Journal {
    fd: OwnedFd,
    path: PathBuf,
    /// Egress bytes in the file (at open: the whole file), counting the
    /// lines reserved by appends in progress; bounded by `max`.
    size: AtomicU64,
    max: u64,
    /// Log bytes kept (each line with [`LOG_LINE_OVERHEAD`]).
    log_size: AtomicU64,
    /// Bytes in the whole file; bounded by `max` + the log cap + the reserve.
    total: AtomicU64,
    broken: AtomicBool,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.path)
            .field("size", &self.size.load(Ordering::Relaxed))
            .field("max", &self.max)
            .finish()
    }
}

impl Journal {
    /// Opens the platform's journal at `path` for appending: never follows a
    /// symlink, never creates, never blocks on a FIFO, and refuses anything
    /// but a regular file. `max` bounds the file's size.
    pub fn open(path: &Path, max: u64) -> Result<Journal, JournalError> {
        let name = || path.display().to_string();
        let flags = OFlags::WRONLY
            | OFlags::APPEND
            | OFlags::NOFOLLOW
            | OFlags::CLOEXEC
            | OFlags::NOCTTY
            | OFlags::NONBLOCK;
        let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(|e| JournalError::Open {
            path: name(),
            source: e.into(),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| JournalError::Open {
            path: name(),
            source: e.into(),
        })?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(JournalError::NotRegular { path: name() });
        }
        let len = u64::try_from(st.st_size).unwrap_or(0);
        Ok(Journal {
            fd,
            path: path.to_owned(),
            size: AtomicU64::new(len),
            max,
            log_size: AtomicU64::new(0),
            total: AtomicU64::new(len),
            broken: AtomicBool::new(false),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `rec` as one line with one `write(2)`.
    pub fn append(&self, rec: &EgressRecord) -> Result<(), JournalError> {
        if self.broken.load(Ordering::Acquire) {
            return Err(JournalError::Broken);
        }
        // A record is about 300 bytes: written into room for it, not grown
        // from serde_json's 128.
        let mut line = Vec::with_capacity(512);
        rec.write_json(&mut line)
            .map_err(|e| JournalError::Write(std::io::Error::other(e.to_string())))?;
        line.push(b'\n');
        let len = line.len() as u64;
        // A completion follows the start the budget admitted (one each):
        // it only needs room in the whole journal, so a request that left
        // always has its end recorded.
        let completion = rec
            .outcome
            .is_some_and(|o| o != airlock_platform_api::wire::EgressOutcome::Incomplete);
        if completion {
            if !reserve(&self.total, len, self.hard_max()) {
                return Err(JournalError::ReserveFull {
                    max: self.hard_max(),
                });
            }
        } else {
            if !reserve(&self.size, len, self.max) {
                return Err(JournalError::Full { max: self.max });
            }
            self.total.fetch_add(len, Ordering::AcqRel);
        }
        self.write_line(&line)
    }

    /// The whole journal's bound: egress, logs and the reserve.
    fn hard_max(&self) -> u64 {
        self.max
            .saturating_add(RUN_LOG_MAX_BYTES)
            .saturating_add(JOURNAL_RESERVE_BYTES)
    }

    /// Appends `event` as one `{"event": …}` line within its class's budget.
    pub fn append_event(&self, event: &RunEvent, class: Class) -> Result<(), JournalError> {
        if self.broken.load(Ordering::Acquire) {
            return Err(JournalError::Broken);
        }
        let mut line = Vec::with_capacity(256);
        line.extend_from_slice(br#"{"event":"#);
        serde_json::to_writer(&mut line, event)
            .map_err(|e| JournalError::Write(std::io::Error::other(e.to_string())))?;
        line.extend_from_slice(b"}\n");
        let len = line.len() as u64;
        if class == Class::Log
            && !reserve(&self.log_size, len + LOG_LINE_OVERHEAD, RUN_LOG_MAX_BYTES)
        {
            return Err(JournalError::LogFull {
                max: RUN_LOG_MAX_BYTES,
            });
        }
        if !reserve(&self.total, len, self.hard_max()) {
            return Err(JournalError::ReserveFull {
                max: self.hard_max(),
            });
        }
        self.write_line(&line)
    }

    /// One `write(2)` of a whole line whose room is reserved.
    fn write_line(&self, line: &[u8]) -> Result<(), JournalError> {
        let written = loop {
            match rustix::io::write(&self.fd, line) {
                Err(rustix::io::Errno::INTR) => continue,
                other => break other,
            }
        };
        match written {
            Ok(n) if n == line.len() => Ok(()),
            Ok(n) => {
                // A short write (the disk filled up mid-line): the line is
                // torn; nothing may follow it.
                self.broken.store(true, Ordering::Release);
                Err(JournalError::Write(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    format!("{n} of {} bytes written", line.len()),
                )))
            }
            Err(e) => {
                self.broken.store(true, Ordering::Release);
                Err(JournalError::Write(e.into()))
            }
        }
    }
}

/// Adds `len` to `counter` if the sum stays within `max`.
fn reserve(counter: &AtomicU64, len: u64, max: u64) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            n.checked_add(len).filter(|t| *t <= max)
        })
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_platform_api::wire::{EgressDecision, EgressOutcome, EgressSource};

    fn record(seq: u64) -> EgressRecord {
        EgressRecord {
            at: 1,
            source: EgressSource::Proxy,
            plane: None,
            integration: None,
            method: "GET".into(),
            url: "http://h.test/".into(),
            host: "h.test".into(),
            decision: EgressDecision::Allowed,
            code: None,
            status: None,
            bytes_out: 0,
            bytes_in: 0,
            duration_ms: None,
            seq: Some(seq),
            outcome: Some(EgressOutcome::Incomplete),
            metering: None,
            steps: None,
            rule: None,
        }
    }

    fn private_file(dir: &Path) -> PathBuf {
        let p = dir.join("egress.journal");
        std::fs::write(&p, b"").unwrap();
        p
    }

    #[test]
    fn appends_one_line_per_record() {
        let dir = tempfile::tempdir().unwrap();
        let p = private_file(dir.path());
        let j = Journal::open(&p, 1 << 20).unwrap();
        j.append(&record(1)).unwrap();
        j.append(&record(2)).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<EgressRecord> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines, [record(1), record(2)]);
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn refuses_what_is_not_a_regular_file_and_never_creates() {
        let dir = tempfile::tempdir().unwrap();
        let target = private_file(dir.path());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(
            Journal::open(&link, 1024),
            Err(JournalError::Open { .. })
        ));
        assert!(matches!(
            Journal::open(dir.path(), 1024),
            Err(JournalError::Open { .. } | JournalError::NotRegular { .. })
        ));
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // No reader: a blocking open would hang; this one fails at once.
        assert!(Journal::open(&fifo, 1024).is_err());
        assert!(matches!(
            Journal::open(Path::new("/dev/null"), 1024),
            Err(JournalError::NotRegular { .. })
        ));
        let missing = dir.path().join("missing");
        assert!(Journal::open(&missing, 1024).is_err());
        assert!(!missing.exists());
    }

    #[test]
    fn past_its_bound_it_refuses_with_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = private_file(dir.path());
        let one = serde_json::to_vec(&record(1)).unwrap().len() as u64 + 1;
        let j = Journal::open(&p, one * 2 + one / 2).unwrap();
        j.append(&record(1)).unwrap();
        j.append(&record(2)).unwrap();
        let e = j.append(&record(3)).unwrap_err();
        assert_eq!(e.code(), "egress_journal_full");
        assert_eq!(std::fs::read(&p).unwrap().len() as u64, one * 2);
        // What was already in the file counts against the bound.
        let again = Journal::open(&p, one * 2 + one / 2).unwrap();
        assert!(matches!(
            again.append(&record(4)),
            Err(JournalError::Full { .. })
        ));
    }

    /// The attack on the budgets: a flood of log lines fills the log cap
    /// and is refused past it, and neither it nor a full egress budget
    /// keeps out what must never be shed (the agent's end) or a completion.
    #[test]
    fn a_log_flood_stops_at_its_cap_and_never_crowds_out_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = private_file(dir.path());
        let one = serde_json::to_vec(&record(1)).unwrap().len() as u64 + 1;
        let j = Journal::open(&p, one).unwrap();
        j.append(&record(1)).unwrap();
        assert!(matches!(
            j.append(&record(2)),
            Err(JournalError::Full { .. })
        ));
        let line = "x".repeat(1000);
        let mut kept = 0u64;
        loop {
            let log = RunEvent::Log {
                at: 1,
                stream: "stdout".into(),
                line: line.clone(),
            };
            match j.append_event(&log, Class::Log) {
                Ok(()) => kept += 1,
                Err(JournalError::LogFull { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(kept * (1000 + LOG_LINE_OVERHEAD) <= RUN_LOG_MAX_BYTES);
        assert!((kept + 1) * (1100 + LOG_LINE_OVERHEAD) > RUN_LOG_MAX_BYTES);
        let end = RunEvent::Result {
            at: 2,
            exit_code: 0,
            result: Some(serde_json::json!({"kept": true})),
            checkpoint: None,
        };
        j.append_event(&end, Class::Vital).unwrap();
        let mut done = record(1);
        done.outcome = Some(airlock_platform_api::wire::EgressOutcome::Completed);
        j.append(&done).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let last: Vec<&str> = text.lines().rev().take(2).collect();
        assert!(
            last[1].starts_with(r#"{"event":{"type":"result""#),
            "{}",
            last[1]
        );
        assert!(last[0].contains(r#""outcome":"completed""#), "{}", last[0]);
        let size = std::fs::metadata(&p).unwrap().len();
        assert!(size <= one + RUN_LOG_MAX_BYTES + JOURNAL_RESERVE_BYTES);
    }

    #[test]
    fn a_failed_write_refuses_everything_after() {
        // /dev/full is not a regular file, so test the failure on a
        // descriptor that cannot write: a file opened read-only.
        let dir = tempfile::tempdir().unwrap();
        let p = private_file(dir.path());
        let j = Journal {
            fd: rustix::fs::open(&p, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap(),
            path: p.clone(),
            size: AtomicU64::new(0),
            max: 1 << 20,
            log_size: AtomicU64::new(0),
            total: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        };
        let e = j.append(&record(1)).unwrap_err();
        assert!(matches!(e, JournalError::Write(_)), "{e}");
        assert_eq!(e.code(), "egress_log_unavailable");
        assert!(matches!(j.append(&record(2)), Err(JournalError::Broken)));
    }
}

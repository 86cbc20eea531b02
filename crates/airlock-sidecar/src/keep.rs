//! What the sidecar keeps of the run's events besides egress records: the
//! one place that decides which events may be shed and which may not.
//!
//! - Never shed (the agent's end and result, model usage, the counts of
//!   what was shed): appended to the run's journal ([`Class::Vital`]),
//!   which the platform follows into the store; a caller that must know
//!   learns whether it was kept.
//! - Log lines: appended to the journal within the run's log cap
//!   ([`RUN_LOG_MAX_BYTES`]); past it one truncation marker is kept and
//!   every later line is shed, counted in lines and bytes, and the count
//!   kept as a [`RunEvent::Shed`] (when the agent's end arrives, and when
//!   the sidecar stops).
//! - Heartbeats: liveness only, through the event sink (lossy).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use airlock_platform_api::wire::{RUN_LOG_MAX_BYTES, RunEvent};

use crate::clock::now_ms;
use crate::journal::{Class, Journal, JournalError};

/// The line that marks where a run's log was cut.
pub fn truncation_marker() -> String {
    format!(
        "[airlock: this run's log reached its cap of {RUN_LOG_MAX_BYTES} bytes; later lines are counted, not kept]"
    )
}

pub struct Keeper {
    journal: Arc<Journal>,
    marked: AtomicBool,
    shed_lines: AtomicU64,
    shed_bytes: AtomicU64,
    /// What [`Keeper::report_shed`] has kept so far.
    reported: std::sync::Mutex<(u64, u64)>,
}

impl Keeper {
    pub fn new(journal: Arc<Journal>) -> Keeper {
        Keeper {
            journal,
            marked: AtomicBool::new(false),
            shed_lines: AtomicU64::new(0),
            shed_bytes: AtomicU64::new(0),
            reported: Default::default(),
        }
    }

    /// Keeps an event that must never be shed: once this returns `Ok`, it
    /// is in the journal.
    pub fn vital(&self, event: RunEvent) -> Result<(), JournalError> {
        self.journal
            .append_event(&event, Class::Vital)
            .map_err(|e| {
                tracing::error!("run journal: {e}; an event that must be kept was not");
                e
            })
    }

    /// Keeps an agent's log line within the run's log cap, or counts it.
    pub fn log(&self, event: RunEvent) {
        let len = match &event {
            RunEvent::Log { line, .. } => line.len() as u64,
            _ => 0,
        };
        match self.journal.append_event(&event, Class::Log) {
            Ok(()) => {}
            Err(JournalError::LogFull { .. }) => {
                if !self.marked.swap(true, Ordering::AcqRel) {
                    let _ = self.vital(RunEvent::Log {
                        at: now_ms(),
                        stream: "airlock".into(),
                        line: truncation_marker(),
                    });
                }
                self.shed(1, len);
            }
            Err(e) => {
                tracing::warn!("run journal: a log line was not kept: {e}");
                self.shed(1, len);
            }
        }
    }

    /// Counts lines shed (here, or by the runtime before they came).
    pub fn shed(&self, lines: u64, bytes: u64) {
        self.shed_lines.fetch_add(lines, Ordering::Relaxed);
        self.shed_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Keeps the count of lines shed since the last report, if any.
    pub fn report_shed(&self) {
        let Ok(mut reported) = self.reported.lock() else {
            return;
        };
        let now = (
            self.shed_lines.load(Ordering::Acquire),
            self.shed_bytes.load(Ordering::Acquire),
        );
        let (lines, bytes) = (now.0 - reported.0, now.1 - reported.1);
        if lines == 0 && bytes == 0 {
            return;
        }
        if self
            .vital(RunEvent::Shed {
                at: now_ms(),
                lines,
                bytes,
            })
            .is_ok()
        {
            *reported = now;
        }
    }
}

//! One relayed answer as it passes ([`Relay`]): metered by its format
//! ([`Mode`]), and once it ends ([`End`]) its egress record completed and
//! its cost event kept.

use std::sync::Arc;
use std::time::Duration;

use airlock_egress::{EgressError, StreamingBody};
use airlock_platform_api::budget::Amount;
use airlock_platform_api::wire::{CostRecord, EgressOutcome, Metering, RunEvent};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

use super::budget::Hold;
use super::event;
use super::json_usage::JsonUsage;
use super::meter::{CostDraft, Usage};
use super::sse::{SseSplitter, event_data};
use crate::egress::{InFlight, Outcome};
use crate::state::Sidecar;

/// A client that went away mid-stream: the rest is read for metering for at
/// most this long (or until the sidecar stops: then what was seen is
/// recorded as unmetered).
const ABANDONED_STREAM_DEADLINE: Duration = Duration::from_secs(600);

/// How an answer is metered, by its format.
pub(super) enum Mode {
    /// Not metered: bytes pass through.
    Plain,
    /// A JSON answer: its usage is read as it passes.
    Json(Box<JsonUsage>),
    /// An SSE stream, split into events as it passes.
    Sse {
        splitter: SseSplitter,
        drop_usage_chunk: bool,
    },
}

/// The state of one relayed answer.
pub(super) struct Relay {
    pub(super) inner: StreamingBody,
    pub(super) mode: Mode,
    pub(super) usage: Usage,
    pub(super) sidecar: Arc<Sidecar>,
    /// The egress record, completed once by [`Relay::finish`].
    pub(super) flight: Option<InFlight>,
    pub(super) status: u16,
    /// A metered call's cost event to be (none: the call is not metered).
    pub(super) cost: Option<CostDraft>,
    /// The call's budgets' reservation, settled by [`Relay::finish`].
    pub(super) hold: Option<Hold>,
}

/// What a call used, for its budgets: its metered usage, or, unmetered (its
/// usage did not arrive whole, or was past belief), the larger of each
/// measure seen and reserved.
fn used(record: &CostRecord, reserved: Amount) -> Amount {
    let seen = Amount {
        tokens: record.input_tokens.saturating_add(record.output_tokens),
        cost_microusd: record.cost_microusd.unwrap_or(0),
        requests: 1,
    };
    if record.unmetered {
        Amount {
            tokens: seen.tokens.max(reserved.tokens),
            cost_microusd: seen.cost_microusd.max(reserved.cost_microusd),
            requests: 1,
        }
    } else {
        seen
    }
}

/// How a relayed answer ended.
pub(super) enum End {
    /// Read to its end.
    Whole,
    /// The upstream failed mid-answer.
    Failed,
    /// The relay stopped reading (the client left and the rest did not come
    /// in time, or the sidecar stopped).
    Cut(&'static str),
}

impl End {
    /// Why a metered call that ended so is recorded as unmetered.
    fn why_unmetered(&self, cost: &CostDraft) -> &'static str {
        match self {
            End::Whole if !cost.readable => "the answer was content-encoded",
            End::Whole => "the provider reported no usage",
            End::Failed => "the answer failed before its usage",
            End::Cut(why) => why,
        }
    }
}

impl Relay {
    /// Meters one event; returns whether it is forwarded.
    fn on_event(usage: &mut Usage, raw: &[u8], drop_usage_chunk: bool) -> bool {
        let Some(data) = event_data(raw) else {
            return true;
        };
        let Ok(e) = event::read(&data) else {
            return true;
        };
        usage.observe_event(&e);
        !(drop_usage_chunk && e.is_usage_only_chunk())
    }

    /// Takes one upstream data frame; returns what goes to the client.
    pub(super) fn on_data(&mut self, data: Bytes) -> Bytes {
        match &mut self.mode {
            Mode::Plain => data,
            Mode::Json(scan) => {
                scan.push(&data);
                data
            }
            Mode::Sse {
                splitter,
                drop_usage_chunk: false,
            } => {
                splitter.push(&data);
                while let Some(ev) = splitter.next_event() {
                    Self::on_event(&mut self.usage, &ev, false);
                }
                data
            }
            Mode::Sse {
                splitter,
                drop_usage_chunk: true,
            } => {
                splitter.push(&data);
                let mut out = BytesMut::new();
                while let Some(ev) = splitter.next_event() {
                    if Self::on_event(&mut self.usage, &ev, true) {
                        out.extend_from_slice(&ev);
                    }
                }
                out.freeze()
            }
        }
    }

    /// The upstream body ended; returns what is still owed to the client.
    pub(super) fn on_end(&mut self) -> Bytes {
        match &mut self.mode {
            Mode::Plain => Bytes::new(),
            Mode::Json(scan) => {
                scan.finish(&mut self.usage);
                Bytes::new()
            }
            Mode::Sse {
                splitter,
                drop_usage_chunk,
            } => {
                let filtering = *drop_usage_chunk;
                match splitter.finish() {
                    Some(rest) => {
                        let keep = Self::on_event(&mut self.usage, &rest, filtering);
                        if filtering && keep {
                            rest
                        } else {
                            Bytes::new()
                        }
                    }
                    None => Bytes::new(),
                }
            }
        }
    }

    /// Completes the egress record and writes the cost event (once). A
    /// metered call whose usage did not arrive whole (the answer was cut or
    /// failed, carried none, or could not be read) is recorded as unmetered,
    /// with the tokens that were seen.
    pub(super) fn finish(&mut self, end: End) {
        let Some(flight) = self.flight.take() else {
            return;
        };
        let reported = self.usage.input.is_some() || self.usage.output.is_some();
        let metering = self.cost.as_ref().map(|c| {
            if matches!(end, End::Whole) && reported && c.readable {
                Metering::Metered
            } else {
                Metering::Unmetered
            }
        });
        let kind = match end {
            End::Whole => EgressOutcome::Completed,
            End::Failed => EgressOutcome::UpstreamFailed,
            End::Cut(_) => EgressOutcome::Aborted,
        };
        // Journalled once the last frame is written to the agent (an answer
        // read whole in one go otherwise waited for this write).
        flight.complete_after_answer(
            Outcome::new(kind)
                .status(Some(self.status))
                .bytes_in(self.inner.bytes_read() as u64)
                .metering(metering),
        );
        let Some(cost) = self.cost.take() else {
            // Not a generation's success: nothing to charge.
            if let Some(h) = self.hold.take() {
                h.release();
            }
            return;
        };
        let unmetered = (metering == Some(Metering::Unmetered)).then(|| end.why_unmetered(&cost));
        let record = cost.record(&mut self.usage, unmetered).bounded();
        if let Some(hold) = self.hold.take() {
            let used = used(&record, hold.reserved());
            hold.settle(used);
        }
        // Kept, never shed: the run's bill.
        let _ = self.sidecar.keep.vital(RunEvent::Cost(record));
    }

    /// Reads (and meters) the rest of the answer; `Some` if it failed.
    async fn read_rest(&mut self) -> Option<EgressError> {
        loop {
            match self.inner.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let _ = self.on_data(data);
                    }
                }
                Some(Err(e)) => return Some(e),
                None => {
                    let _ = self.on_end();
                    return None;
                }
            }
        }
    }

    /// The client went away before the end: read the rest for metering,
    /// until it ends, [`ABANDONED_STREAM_DEADLINE`] passes, or the sidecar
    /// stops (then what was seen is recorded as unmetered).
    pub(super) async fn drain(mut self) {
        let stop = self.sidecar.egress.stop_requested();
        let read = tokio::time::timeout(ABANDONED_STREAM_DEADLINE, self.read_rest());
        let ended = tokio::select! {
            r = read => Some(r),
            _ = stop => None,
        };
        match ended {
            Some(Ok(None)) => self.finish(End::Whole),
            Some(Ok(Some(_))) => self.finish(End::Failed),
            Some(Err(_)) => self.finish(End::Cut(
                "the stream abandoned by the client did not end in time",
            )),
            None => self.finish(End::Cut("the sidecar stopped before the answer ended")),
        }
    }
}

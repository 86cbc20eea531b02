//! One relayed answer as it passes ([`Relay`]): metered by its format
//! ([`Mode`]) and redacted of the model key ([`Passage`]), and once it ends
//! ([`End`]) its egress record completed and its cost event kept.

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
use crate::credential::{Redactor, StreamRedactor};
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

/// One answer's bytes on their way to the agent: metered by its format
/// ([`Mode`]) from the provider's bytes as they came, then redacted of the
/// model connection's values. A stream of events goes out event by event,
/// each redacted whole as soon as it ends (the time to a token stays the
/// provider's); any other answer goes through a [`StreamRedactor`], which
/// finds a value cut by a chunk edge.
pub(super) struct Passage {
    pub(super) mode: Mode,
    pub(super) usage: Usage,
    redactor: Redactor,
    stream: StreamRedactor,
}

impl Passage {
    pub(super) fn new(mode: Mode, redactor: Redactor) -> Self {
        Passage {
            mode,
            usage: Usage::default(),
            stream: redactor.stream(),
            redactor,
        }
    }

    /// Whether a stream's events go out whole (each held until it ends):
    /// when some are dropped, or when they are redacted.
    fn whole_events(&self) -> bool {
        match self.mode {
            Mode::Sse {
                drop_usage_chunk, ..
            } => drop_usage_chunk || !self.redactor.is_empty(),
            _ => false,
        }
    }

    /// The redactor the answer passes through.
    pub(super) fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Whether the answer is redacted (there is a value to redact).
    pub(super) fn redacts(&self) -> bool {
        !self.redactor.is_empty()
    }

    /// Whether what goes out may differ in length from what came (the
    /// provider's length does not hold).
    pub(super) fn reshapes(&self) -> bool {
        self.redacts() || self.whole_events()
    }

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
        let whole_events = self.whole_events();
        let Passage {
            mode,
            usage,
            redactor,
            stream,
        } = self;
        match mode {
            Mode::Plain => chunk(stream, redactor, data),
            Mode::Json(scan) => {
                scan.push(&data);
                chunk(stream, redactor, data)
            }
            Mode::Sse { splitter, .. } if !whole_events => {
                // Nothing to redact or drop: the bytes pass as they came.
                splitter.push(&data);
                while let Some(ev) = splitter.next_event() {
                    Self::on_event(usage, &ev, false);
                }
                data
            }
            Mode::Sse {
                splitter,
                drop_usage_chunk,
            } => {
                splitter.push(&data);
                let mut out = BytesMut::new();
                while let Some(ev) = splitter.next_event() {
                    if Self::on_event(usage, &ev, *drop_usage_chunk) {
                        out.extend_from_slice(&event_out(redactor, ev));
                    }
                }
                out.freeze()
            }
        }
    }

    /// The upstream body ended; returns what is still owed to the client.
    pub(super) fn on_end(&mut self) -> Bytes {
        let whole_events = self.whole_events();
        match &mut self.mode {
            Mode::Plain => Bytes::from(self.stream.finish()),
            Mode::Json(scan) => {
                scan.finish(&mut self.usage);
                Bytes::from(self.stream.finish())
            }
            Mode::Sse {
                splitter,
                drop_usage_chunk,
            } => match splitter.finish() {
                Some(rest) => {
                    let keep = Self::on_event(&mut self.usage, &rest, *drop_usage_chunk);
                    if whole_events && keep {
                        event_out(&self.redactor, rest)
                    } else {
                        Bytes::new()
                    }
                }
                None => Bytes::new(),
            },
        }
    }
}

/// A chunk of an answer that is not a stream of events, as it goes out.
fn chunk(stream: &mut StreamRedactor, redactor: &Redactor, data: Bytes) -> Bytes {
    if redactor.is_empty() {
        return data;
    }
    Bytes::from(stream.push(&data))
}

/// One whole event as it goes out.
fn event_out(redactor: &Redactor, ev: Bytes) -> Bytes {
    if redactor.is_empty() {
        return ev;
    }
    Bytes::from(redactor.bytes(&ev))
}

/// The state of one relayed answer.
pub(super) struct Relay {
    pub(super) inner: StreamingBody,
    pub(super) passage: Passage,
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
    /// Not passed on: the answer is encoded in a way the redactor cannot
    /// read.
    Withheld,
}

impl End {
    /// Why a metered call that ended so is recorded as unmetered.
    fn why_unmetered(&self, cost: &CostDraft) -> &'static str {
        match self {
            End::Whole if !cost.readable => "the answer was content-encoded",
            End::Whole => "the provider reported no usage",
            End::Failed => "the answer failed before its usage",
            End::Cut(why) => why,
            End::Withheld => "the answer was content-encoded, so it was withheld",
        }
    }
}

impl Relay {
    /// Takes one upstream data frame; returns what goes to the client.
    pub(super) fn on_data(&mut self, data: Bytes) -> Bytes {
        self.passage.on_data(data)
    }

    /// The upstream body ended; returns what is still owed to the client.
    pub(super) fn on_end(&mut self) -> Bytes {
        self.passage.on_end()
    }

    /// Completes the egress record and writes the cost event (once). A
    /// metered call whose usage did not arrive whole (the answer was cut or
    /// failed, carried none, or could not be read) is recorded as unmetered,
    /// with the tokens that were seen.
    pub(super) fn finish(&mut self, end: End) {
        let Some(flight) = self.flight.take() else {
            return;
        };
        let usage = &mut self.passage.usage;
        let reported = usage.input.is_some() || usage.output.is_some();
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
            End::Withheld => EgressOutcome::Withheld,
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
        let record = cost.record(usage, unmetered).bounded();
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const KEY: &str = "sk-live-Provider/Key+7f3a&9c<x>";

    /// The key as a reflecting provider writes it: raw, JSON-escaped (each
    /// character as `\uXXXX`), percent-encoded, base64.
    fn reflections() -> Vec<String> {
        airlock_test_support::fake_provider::reflections(KEY)
    }

    /// What an answer carries once it went through `passage`, its bytes
    /// cut at `cut`.
    fn pass(passage: &mut Passage, answer: &[u8], cut: usize) -> Vec<u8> {
        let (a, b) = answer.split_at(cut);
        let mut out = Vec::new();
        for part in [a, b] {
            out.extend_from_slice(&passage.on_data(Bytes::copy_from_slice(part)));
        }
        out.extend_from_slice(&passage.on_end());
        out
    }

    fn assert_clean(out: &[u8], cut: usize) {
        let text = String::from_utf8_lossy(out);
        for r in reflections() {
            // The JSON escape is written as its text: the view is the
            // document's, where `\u` is a backslash and a `u`.
            assert!(!text.contains(&r), "cut at {cut}: {r} survived: {text}");
        }
        assert!(text.contains("Hello"), "cut at {cut}: {text}");
    }

    /// A provider that reflects the key in a stream of events, and the same
    /// in one JSON answer: cut at every byte, no form of the key reaches
    /// the agent, the legitimate text does, the usage is metered as
    /// reported, and the usage chunk the client did not ask for is dropped.
    #[test]
    fn a_reflected_key_is_redacted_at_every_cut_and_usage_still_metered() {
        let redactor = Redactor::new([KEY]);
        let chunk = |content: &str| {
            let v = json!({"object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": content}}]});
            // serde writes `\u` as `\\u`: put the escape back as a provider
            // that escapes each character writes it.
            format!("data: {}\n\n", v.to_string().replace("\\\\u", "\\u"))
        };
        let mut sse = chunk("Hello");
        for r in reflections() {
            sse.push_str(&chunk(&r));
        }
        sse.push_str(
            "data: {\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":17,\"completion_tokens\":5}}\n\n",
        );
        sse.push_str("data: [DONE]\n\n");
        for cut in 0..=sse.len() {
            let mut p = Passage::new(
                Mode::Sse {
                    splitter: SseSplitter::default(),
                    drop_usage_chunk: true,
                },
                redactor.clone(),
            );
            let out = pass(&mut p, sse.as_bytes(), cut);
            assert_clean(&out, cut);
            assert!(!String::from_utf8_lossy(&out).contains("prompt_tokens"));
            assert_eq!((p.usage.input, p.usage.output), (Some(17), Some(5)));
        }
        let content: String = reflections().join(" ");
        let answer = json!({"object": "chat.completion",
            "choices": [{"message": {"role": "assistant", "content": format!("Hello {content}")}}],
            "usage": {"prompt_tokens": 17, "completion_tokens": 5}})
        .to_string()
        .replace("\\\\u", "\\u");
        for cut in 0..=answer.len() {
            let mut p = Passage::new(Mode::Json(Box::default()), redactor.clone());
            let out = pass(&mut p, answer.as_bytes(), cut);
            assert_clean(&out, cut);
            assert_eq!((p.usage.input, p.usage.output), (Some(17), Some(5)));
            let mut plain = Passage::new(Mode::Plain, redactor.clone());
            assert_eq!(pass(&mut plain, answer.as_bytes(), cut), out);
        }
    }

    /// With no value to redact, a stream's bytes pass as they came, each
    /// chunk as soon as it arrives.
    #[test]
    fn with_nothing_to_redact_a_stream_passes_as_it_came() {
        let mut p = Passage::new(
            Mode::Sse {
                splitter: SseSplitter::default(),
                drop_usage_chunk: false,
            },
            Redactor::none(),
        );
        assert_eq!(
            &p.on_data(Bytes::from_static(b"data: {\"a\"")),
            &b"data: {\"a\""[..]
        );
        assert!(!p.reshapes());
        assert_eq!(&p.on_data(Bytes::from_static(b":1}\n\n")), &b":1}\n\n"[..]);
        assert!(p.on_end().is_empty());
    }
}

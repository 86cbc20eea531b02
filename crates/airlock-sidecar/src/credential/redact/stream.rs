//! Redaction of a streamed answer: a value split across chunks is found.
//!
//! The stream keeps back the last [`Redactor::longest_span`] bytes of what
//! it was given (a match starting there may end in a chunk not yet seen)
//! and the last [`Redactor::longest_escape`] bytes of what it already let
//! out, searched again as context so that an escape that began there is
//! read whole. A match that starts in what was let out was found when it
//! was let out (it was kept back until it ended); one that starts after
//! needs no more context: a base64 run is decoded at every offset, and an
//! escape decoder reads forward from an escape's first byte.

use super::{REDACTED, Redactor};

pub struct StreamRedactor {
    redactor: Redactor,
    /// Bytes already let out, kept as context: `buf[..emitted]`.
    buf: Vec<u8>,
    emitted: usize,
}

impl StreamRedactor {
    pub(super) fn new(redactor: Redactor) -> Self {
        StreamRedactor {
            redactor,
            buf: Vec::new(),
            emitted: 0,
        }
    }

    /// What of the answer so far can be let out, redacted: [`Self::feed`]
    /// then [`Self::flush`].
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.redactor.is_empty() {
            return chunk.to_vec();
        }
        self.feed(chunk);
        self.flush()
    }

    /// Takes `chunk` in without searching: what it lets out comes with the
    /// next [`Self::flush`] (or [`Self::push`], [`Self::finish`]). A caller
    /// with more of the answer at hand feeds it all and flushes once: one
    /// search of the lot instead of one per chunk, each of which also reads
    /// the kept-back bytes and decodes the ends of a base64 run again. What
    /// is let out does not depend on how the answer was cut.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// What of the answer fed so far can be let out, redacted.
    pub fn flush(&mut self) -> Vec<u8> {
        if self.redactor.is_empty() {
            // Nothing kept back: all of it goes (`emitted` stays 0).
            return std::mem::take(&mut self.buf);
        }
        let keep = self.redactor.longest_span();
        let Some(cut) = self.buf.len().checked_sub(keep) else {
            return Vec::new();
        };
        if cut <= self.emitted {
            return Vec::new();
        }
        self.take(cut)
    }

    /// The rest of the answer, redacted.
    pub fn finish(&mut self) -> Vec<u8> {
        if self.redactor.is_empty() {
            return std::mem::take(&mut self.buf);
        }
        let end = self.buf.len();
        let out = self.take(end);
        self.buf.clear();
        self.emitted = 0;
        out
    }

    /// Lets out `buf[emitted..cut]` (`cut` moved past a match that crosses
    /// it), and keeps the context and what follows.
    fn take(&mut self, cut: usize) -> Vec<u8> {
        let spans = self.redactor.spans(&self.buf);
        let mut cut = cut;
        for &(start, end) in &spans {
            if start < cut && end > cut {
                cut = end;
            }
        }
        let mut out = Vec::with_capacity(cut.saturating_sub(self.emitted));
        let mut from = self.emitted;
        for &(start, end) in &spans {
            if end <= from || start >= cut {
                continue;
            }
            // A span that began in the context was let out up to `from`
            // already (redacted, or it was not a match then); its rest goes.
            out.extend_from_slice(self.buf.get(from..start.max(from)).unwrap_or_default());
            out.extend_from_slice(REDACTED.as_bytes());
            from = end.min(cut);
        }
        out.extend_from_slice(self.buf.get(from..cut).unwrap_or_default());
        let context = self.redactor.longest_escape();
        let drop = cut.saturating_sub(context);
        self.buf.drain(..drop);
        self.emitted = cut - drop;
        out
    }
}

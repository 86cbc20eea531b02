//! Server-sent events as the relay reads them: a stream split into events
//! at blank lines whatever the chunk edges ([`SseSplitter`]), each event's
//! raw bytes kept to be forwarded unchanged, and the `data` of one event
//! ([`event_data`]).

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

/// Splits a server-sent-event stream into events at blank lines, whatever
/// the chunk edges (lines end in LF, CRLF or CR). Hand-written: the relay
/// needs each event's raw bytes to forward them unchanged, which SSE client
/// crates do not give.
#[derive(Default)]
pub(super) struct SseSplitter {
    buf: BytesMut,
    /// Start of the first line of `buf` not yet scanned.
    line_start: usize,
}

impl SseSplitter {
    pub(super) fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete event, with its terminating blank line.
    pub(super) fn next_event(&mut self) -> Option<Bytes> {
        loop {
            let rest = self.buf.get(self.line_start..)?;
            let i = memchr::memchr2(b'\n', b'\r', rest)?;
            let term = match (rest.get(i), rest.get(i + 1)) {
                (Some(b'\r'), Some(b'\n')) => 2,
                (Some(b'\r'), None) => return None, // a CRLF may be cut here
                _ => 1,
            };
            self.line_start += i + term;
            if i == 0 {
                let event = self
                    .buf
                    .split_to(self.line_start.min(self.buf.len()))
                    .freeze();
                self.line_start = 0;
                return Some(event);
            }
        }
    }

    /// Whatever is left at the end of the stream (an unterminated event).
    pub(super) fn finish(&mut self) -> Option<Bytes> {
        self.line_start = 0;
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }
}

/// The `data` of one raw event (lines joined with `\n`), if it has any.
pub(super) fn event_data(raw: &[u8]) -> Option<Cow<'_, str>> {
    // Valid UTF-8 (every event of a well-behaved provider) is checked by
    // `from_utf8`'s word-at-a-time scan; `from_utf8_lossy` would walk it
    // chunk by chunk to give the same borrowed text.
    if let Ok(text) = std::str::from_utf8(raw) {
        return data_lines(text);
    }
    let text = String::from_utf8_lossy(raw);
    data_lines(&text).map(|d| Cow::Owned(d.into_owned()))
}

/// The `data` lines of one event, joined by LF (one line: not copied).
fn data_lines(text: &str) -> Option<Cow<'_, str>> {
    let mut data: Option<Cow<'_, str>> = None;
    // Lines end at LF or CR (memchr: a char pattern tests char by char).
    let mut rest = Some(text);
    while let Some(r) = rest {
        let line = match memchr::memchr2(b'\n', b'\r', r.as_bytes()) {
            Some(i) => {
                rest = r.get(i + 1..);
                r.get(..i).unwrap_or_default()
            }
            None => {
                rest = None;
                r
            }
        };
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            match &mut data {
                Some(d) => {
                    let d = d.to_mut();
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(Cow::Borrowed(value)),
            }
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(chunks: &[&[u8]]) -> (Vec<Bytes>, Option<Bytes>) {
        let mut s = SseSplitter::default();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c);
            while let Some(e) = s.next_event() {
                out.push(e);
            }
        }
        (out, s.finish())
    }

    const STREAM: &str = "event: message_start\ndata: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: comment\r\rdata: x\ndata: y\n\n";

    #[test]
    fn splitter_gives_the_same_events_at_every_chunk_edge() {
        let whole = split_all(&[STREAM.as_bytes()]);
        assert_eq!(whole.0.len(), 4, "{:?}", whole.0);
        assert_eq!(whole.1, None);
        let joined: Vec<u8> = whole.0.iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(joined, STREAM.as_bytes(), "raw bytes are kept unchanged");
        let b = STREAM.as_bytes();
        for i in 0..b.len() {
            for j in i..b.len() {
                let parts = split_all(&[&b[..i], &b[i..j], &b[j..]]);
                assert_eq!(parts.0, whole.0, "split at {i},{j}");
            }
        }
        // One byte at a time.
        let bytes: Vec<&[u8]> = b.chunks(1).collect();
        assert_eq!(split_all(&bytes).0, whole.0);
    }

    #[test]
    fn splitter_keeps_an_unterminated_tail() {
        let (events, rest) = split_all(&[b"data: 1\n\ndata: 2\n"]);
        assert_eq!(events.len(), 1);
        assert_eq!(rest.as_deref(), Some(&b"data: 2\n"[..]));
        assert_eq!(event_data(b"data: 2\n").as_deref(), Some("2"));
    }

    #[test]
    fn event_data_joins_lines_and_ignores_other_fields() {
        assert_eq!(
            event_data(b"event: x\ndata: a\ndata:b\nid: 3\n\n").as_deref(),
            Some("a\nb")
        );
        assert_eq!(event_data(b": only a comment\n\n"), None);
        assert_eq!(event_data(b"data\n\n").as_deref(), Some(""));
        assert_eq!(
            event_data(b"data: a\r\ndata: b\rdata: c\n\n").as_deref(),
            Some("a\nb\nc")
        );
        // One line is not copied; bytes that are not UTF-8 read as U+FFFD.
        assert!(matches!(
            event_data(b"data: x\n\n"),
            Some(Cow::Borrowed("x"))
        ));
        assert_eq!(
            event_data(b"data: a\xff\ndata: b\n\n").as_deref(),
            Some("a\u{fffd}\nb")
        );
    }
}

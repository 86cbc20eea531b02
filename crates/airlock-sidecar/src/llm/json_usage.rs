//! The usage of a whole JSON answer, read as it streams past
//! ([`JsonUsage`]): only the top-level `usage` and `model` are kept
//! (bounded), never the answer, so an answer of any size up to the
//! response cap is metered in constant memory. It reads what parsing the
//! whole answer would (`json_usage_is_read_as_it_streams_at_every_chunk_edge`
//! compares both).

use super::event::{self, EventView};
use super::meter::Usage;

/// Reads `usage` and `model` out of one JSON answer as it streams past,
/// keeping only those two top-level values (bounded), never the answer: an
/// answer of any size up to the response cap is metered in constant memory.
/// Hand-written: it needs only the two values of an object's top level, and
/// the streaming JSON crates would parse (and allocate for) all of it.
#[derive(Default)]
pub(super) struct JsonUsage {
    /// Open objects and arrays.
    depth: u32,
    in_str: bool,
    esc: bool,
    state: Top,
    key: Vec<u8>,
    /// The top-level value being kept (its key is `usage` or `model`).
    capture: Option<Vec<u8>>,
    capture_is_usage: bool,
    usage: Option<Vec<u8>>,
    model: Option<Vec<u8>>,
    /// Not an object, or not JSON: nothing to meter.
    broken: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum Top {
    /// Before the opening `{`.
    #[default]
    Start,
    /// Expecting a key or `}`.
    Key,
    InKey,
    Colon,
    /// Expecting a value.
    Value,
    /// Inside a value (a scalar, a string, or a container at depth > 1).
    InValue,
    /// After a value: `,` or `}`.
    After,
    Done,
}

/// Longest top-level value kept (a `usage` object is a few hundred bytes).
const MAX_USAGE_VALUE: usize = 64 * 1024;
/// Longest key compared (longer keys are not `usage` or `model`).
const MAX_KEY: usize = 16;

impl JsonUsage {
    pub(super) fn push(&mut self, data: &[u8]) {
        let mut i = 0;
        while let Some(&b) = data.get(i) {
            if self.broken || self.state == Top::Done {
                return;
            }
            if self.in_str {
                match self.in_string(data, i) {
                    Some(next) => i = next,
                    None => return,
                }
                continue;
            }
            i += 1;
            if b.is_ascii_whitespace() {
                self.whitespace(b);
            } else {
                self.structural(b);
            }
        }
    }

    /// The bytes of a string from `data[at]` on: one, or (in a string
    /// nobody keeps) all of them up to its next quote or backslash. The
    /// index after them, or `None` once `data` is used up.
    #[inline]
    fn in_string(&mut self, data: &[u8], at: usize) -> Option<usize> {
        if self.capture.is_none() && self.state != Top::InKey && !self.esc {
            let rest = data.get(at..).unwrap_or_default();
            let p = rest.iter().position(|&c| c == b'"' || c == b'\\')?;
            let c = *data.get(at + p)?;
            self.string_byte(c);
            return Some(at + p + 1);
        }
        let b = *data.get(at)?;
        self.keep(b);
        if self.state == Top::InKey && self.key.len() <= MAX_KEY && (b != b'"' || self.esc) {
            self.key.push(b);
        }
        self.string_byte(b);
        Some(at + 1)
    }

    /// Whitespace outside a string.
    #[inline]
    fn whitespace(&mut self, b: u8) {
        if self.state == Top::InValue && self.depth == 1 && self.capture.is_some() {
            // A scalar ends at whitespace too; `,`/`}` confirms it.
            self.end_value();
            self.state = Top::After;
        } else if self.depth > 1 {
            self.keep(b);
        }
    }

    /// One byte outside a string that is not whitespace: the next step of
    /// the top-level object's grammar (or of a value nested in it).
    #[inline]
    fn structural(&mut self, b: u8) {
        match (self.depth, self.state) {
            (0, Top::Start) => {
                if b == b'{' {
                    self.depth = 1;
                    self.state = Top::Key;
                } else {
                    self.broken = true;
                }
            }
            (1, Top::Key) => match b {
                b'"' => {
                    self.in_str = true;
                    self.key.clear();
                    self.state = Top::InKey;
                }
                b'}' => self.close_top(),
                _ => self.broken = true,
            },
            (1, Top::Colon) => {
                if b == b':' {
                    self.state = Top::Value;
                    let k = self.key.as_slice();
                    if k == b"usage" || k == b"model" {
                        self.capture = Some(Vec::new());
                        self.capture_is_usage = k == b"usage";
                    }
                } else {
                    self.broken = true;
                }
            }
            (1, Top::Value) => {
                self.keep(b);
                self.state = Top::InValue;
                match b {
                    b'"' => self.in_str = true,
                    b'{' | b'[' => self.depth = 2,
                    _ => {}
                }
            }
            (1, Top::InValue) => match b {
                b',' => {
                    self.end_value();
                    self.state = Top::Key;
                }
                b'}' => {
                    self.end_value();
                    self.close_top();
                }
                _ => self.keep(b),
            },
            (1, Top::After) => match b {
                b',' => self.state = Top::Key,
                b'}' => self.close_top(),
                _ => self.broken = true,
            },
            (d, Top::InValue) if d > 1 => {
                self.keep(b);
                match b {
                    b'"' => self.in_str = true,
                    b'{' | b'[' => self.depth = d.saturating_add(1),
                    b'}' | b']' => {
                        self.depth = d - 1;
                        if self.depth == 1 {
                            self.end_value();
                            self.state = Top::After;
                        }
                    }
                    _ => {}
                }
            }
            _ => self.broken = true,
        }
    }

    /// One byte inside a string (after it was kept).
    fn string_byte(&mut self, b: u8) {
        if self.esc {
            self.esc = false;
        } else if b == b'\\' {
            self.esc = true;
        } else if b == b'"' {
            self.in_str = false;
            match self.state {
                Top::InKey => self.state = Top::Colon,
                Top::InValue if self.depth == 1 => {
                    self.end_value();
                    self.state = Top::After;
                }
                _ => {}
            }
        }
    }

    fn keep(&mut self, b: u8) {
        if let Some(c) = &mut self.capture {
            if c.len() < MAX_USAGE_VALUE {
                c.push(b);
            } else {
                self.capture = None;
            }
        }
    }

    fn end_value(&mut self) {
        if let Some(c) = self.capture.take() {
            if self.capture_is_usage {
                self.usage = Some(c);
            } else {
                self.model = Some(c);
            }
        }
    }

    fn close_top(&mut self) {
        self.depth = 0;
        self.state = Top::Done;
    }

    /// The answer ended: what it said about usage and model.
    pub(super) fn finish(&mut self, usage: &mut Usage) {
        if self.broken || self.state != Top::Done {
            return;
        }
        usage.observe_event(&EventView {
            top: event::read_top(self.usage.as_deref(), self.model.as_deref()),
            ..EventView::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::twins::observe_value;
    use serde_json::json;

    fn scan(chunks: &[&[u8]]) -> Usage {
        let mut j = JsonUsage::default();
        for c in chunks {
            j.push(c);
        }
        let mut u = Usage::default();
        j.finish(&mut u);
        u
    }

    #[test]
    fn json_usage_is_read_as_it_streams_at_every_chunk_edge() {
        let doc = br#"{"object":"list","data":[{"embedding":"a\"b}{[","index":0},[1,2,{"usage":{"prompt_tokens":999}}]],"usage" : {"prompt_tokens": 12, "total_tokens": 12},"model":"emb-\"x","n":-1.5e3,"t":true}"#;
        let whole = scan(&[doc]);
        assert_eq!(
            (whole.input, whole.output, whole.model.as_deref()),
            (Some(12), None, Some("emb-\"x"))
        );
        for i in 0..doc.len() {
            for j in i..doc.len() {
                assert_eq!(scan(&[&doc[..i], &doc[i..j], &doc[j..]]), whole, "{i},{j}");
            }
        }
        // The same as parsing the whole answer, for the providers' formats.
        for v in [
            json!({"model": "gpt-x", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7}}),
            json!({"id": "msg", "model": "claude-x", "usage": {"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 2}}),
            json!({"object": "response", "model": "gpt-r", "output": [{"content": [{"text": "usage"}]}], "usage": {"input_tokens": 1, "output_tokens": 2}}),
        ] {
            let mut parsed = Usage::default();
            observe_value(&mut parsed, &v);
            let pretty = serde_json::to_vec_pretty(&v).unwrap();
            assert_eq!(scan(&[&pretty]), parsed, "{v}");
        }
    }

    #[test]
    fn json_usage_ignores_what_is_not_a_whole_object() {
        for bad in [
            &b"[{\"usage\":{\"prompt_tokens\":1}}]"[..],
            b"{\"usage\":{\"prompt_tokens\":1}",
            b"\"usage\"",
            b"{\"usage\" {\"prompt_tokens\":1}}",
            b"\xff\xfe{",
            b"",
        ] {
            assert_eq!(
                scan(&[bad]),
                Usage::default(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A huge usage value is dropped rather than kept.
        let mut big = b"{\"usage\":{\"pad\":\"".to_vec();
        big.extend(std::iter::repeat_n(b'x', MAX_USAGE_VALUE + 10));
        big.extend(b"\",\"prompt_tokens\":3}}");
        assert_eq!(scan(&[&big]).input, None);
    }
}

//! Decoded views of an answer: the answer's text as each ordinary decoder
//! would read it, with, for each byte of the view, the span of the answer's
//! own bytes it was decoded from. A credential found in a view is redacted
//! in the answer by that span.
//!
//! Each decoder returns `None` when it would change nothing (no escape, no
//! base64 run long enough to hold a secret): most answers cost one scan
//! per decoder and no copy.

use super::forms;

/// A view: decoded bytes and, for each, the half-open span of the answer's
/// bytes it came from.
pub(super) struct View {
    pub(super) bytes: Vec<u8>,
    pub(super) spans: Vec<(u32, u32)>,
}

impl View {
    /// The answer's span of the view's bytes `start..end` (`end > start`).
    pub(super) fn span(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let first = self.spans.get(start)?;
        let last = self.spans.get(end.checked_sub(1)?)?;
        Some((first.0 as usize, last.1 as usize))
    }

    fn with_capacity(n: usize) -> View {
        View {
            bytes: Vec::with_capacity(n),
            spans: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, b: u8, span: (u32, u32)) {
        self.bytes.push(b);
        self.spans.push(span);
    }

    fn push_char(&mut self, c: char, span: (u32, u32)) {
        let mut buf = [0u8; 4];
        for b in c.encode_utf8(&mut buf).bytes() {
            self.push(b, span);
        }
    }
}

/// The decoders whose views are searched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decoder {
    /// JSON and JavaScript string escapes: `\"`, `\\`, `\/` (PHP), `\b`,
    /// `\f`, `\n`, `\r`, `\t`, `\uXXXX` (serde, Go's HTML-safe `\u0026`,
    /// JavaScript and Python's `ensure_ascii`), surrogate pairs, `\xHH`.
    Json,
    /// `%XX` in either case (`+` stays: a secret with a space is also
    /// searched with `+` for it).
    Percent,
    /// HTML character references: named, decimal, hexadecimal.
    Html,
    /// Runs of base64 (standard and URL-safe alphabets, padded or not, line
    /// breaks skipped), decoded from each of the four character offsets
    /// into the run (a run may begin with text that is not of it).
    Base64(u8),
}

impl Decoder {
    pub(super) const ALL: [Decoder; 7] = [
        Decoder::Json,
        Decoder::Percent,
        Decoder::Html,
        Decoder::Base64(0),
        Decoder::Base64(1),
        Decoder::Base64(2),
        Decoder::Base64(3),
    ];

    /// The most bytes of its input one decoded byte may come from: bounds
    /// the span of a match, and so what a stream keeps back.
    pub(super) const fn max_expansion(self) -> usize {
        match self {
            // `\u0026` for one byte.
            Decoder::Json => 6,
            Decoder::Percent => 3,
            Decoder::Html => forms::MAX_ENTITY_LEN,
            // 4 characters for 3 bytes, one more at either end, and line
            // breaks: 2 per byte is ample.
            Decoder::Base64(_) => 2,
        }
    }

    /// The view of `input` (itself the view `parent` of the answer, or the
    /// answer when `parent` is `None`), or `None` when it decodes nothing.
    /// `min_run`: the shortest base64 run worth decoding.
    pub(super) fn view(self, input: &[u8], parent: Option<&View>, min_run: usize) -> Option<View> {
        let span = |start: usize, end: usize| -> (u32, u32) {
            match parent {
                Some(p) => {
                    let (s, e) = p.span(start, end).unwrap_or((0, 0));
                    (to_u32(s), to_u32(e))
                }
                None => (to_u32(start), to_u32(end)),
            }
        };
        match self {
            Decoder::Json => json(input, span),
            Decoder::Percent => percent(input, span),
            Decoder::Html => html(input, span),
            Decoder::Base64(offset) => base64(input, usize::from(offset), min_run, span),
        }
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `input[at..at+n]` as a hexadecimal number.
fn hex_at(input: &[u8], at: usize, n: usize) -> Option<u32> {
    let digits = input.get(at..at.checked_add(n)?)?;
    digits
        .iter()
        .try_fold(0u32, |acc, &d| Some(acc * 16 + u32::from(hex(d)?)))
}

/// Copies `input` into a view, decoding each escape `decode` recognises at
/// a position holding `trigger`; `None` when it recognised none.
fn decode_escapes(
    input: &[u8],
    trigger: u8,
    span: impl Fn(usize, usize) -> (u32, u32),
    decode: impl Fn(&[u8], usize, &mut View, &dyn Fn(usize, usize) -> (u32, u32)) -> Option<usize>,
) -> Option<View> {
    let first = memchr::memchr(trigger, input)?;
    let mut view = View::with_capacity(input.len());
    let mut decoded_any = false;
    let mut i = 0;
    for (at, b) in input.iter().enumerate().take(first) {
        view.push(*b, span(at, at + 1));
        i = at + 1;
    }
    while let Some(&b) = input.get(i) {
        if b == trigger
            && let Some(used) = decode(input, i, &mut view, &span)
        {
            decoded_any = true;
            i += used;
            continue;
        }
        view.push(b, span(i, i + 1));
        i += 1;
    }
    decoded_any.then_some(view)
}

fn json(input: &[u8], span: impl Fn(usize, usize) -> (u32, u32)) -> Option<View> {
    decode_escapes(input, b'\\', span, |input, i, view, span| {
        let next = *input.get(i + 1)?;
        let simple = match next {
            b'"' | b'\\' | b'/' | b'\'' => Some(next),
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'0' => Some(0),
            _ => None,
        };
        if let Some(b) = simple {
            view.push(b, span(i, i + 2));
            return Some(2);
        }
        match next {
            b'x' => {
                let v = hex_at(input, i + 2, 2)?;
                view.push(u8::try_from(v).ok()?, span(i, i + 4));
                Some(4)
            }
            b'u' => {
                let hi = hex_at(input, i + 2, 4)?;
                if (0xd800..0xdc00).contains(&hi)
                    && input.get(i + 6) == Some(&b'\\')
                    && input.get(i + 7) == Some(&b'u')
                    && let Some(lo) = hex_at(input, i + 8, 4)
                    && (0xdc00..0xe000).contains(&lo)
                {
                    let c = char::from_u32(0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00))?;
                    view.push_char(c, span(i, i + 12));
                    return Some(12);
                }
                let c = char::from_u32(hi)?;
                view.push_char(c, span(i, i + 6));
                Some(6)
            }
            _ => None,
        }
    })
}

fn percent(input: &[u8], span: impl Fn(usize, usize) -> (u32, u32)) -> Option<View> {
    decode_escapes(input, b'%', span, |input, i, view, span| {
        let v = hex_at(input, i + 1, 2)?;
        view.push(u8::try_from(v).ok()?, span(i, i + 3));
        Some(3)
    })
}

fn html(input: &[u8], span: impl Fn(usize, usize) -> (u32, u32)) -> Option<View> {
    decode_escapes(input, b'&', span, |input, i, view, span| {
        let (c, used) = forms::entity(input.get(i..)?)?;
        view.push_char(c, span(i, i + used));
        Some(used)
    })
}

/// The value of a base64 character of either alphabet.
fn b64_value(b: u8) -> Option<u8> {
    match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'+' | b'-' => Some(62),
        b'/' | b'_' => Some(63),
        _ => None,
    }
}

fn base64(
    input: &[u8],
    offset: usize,
    min_run: usize,
    span: impl Fn(usize, usize) -> (u32, u32),
) -> Option<View> {
    let mut view: Option<View> = None;
    let mut i = 0;
    // The characters of the run (positions), line breaks skipped.
    let mut chars: Vec<usize> = Vec::new();
    while i < input.len() {
        chars.clear();
        while let Some(&b) = input.get(i) {
            if b64_value(b).is_some() {
                chars.push(i);
            } else if !(b == b'\n' || b == b'\r') || chars.is_empty() {
                break;
            }
            i += 1;
        }
        if chars.len() >= min_run.max(2) + offset {
            let v = view.get_or_insert_with(|| View::with_capacity(input.len() / 4 * 3));
            decode_run(input, chars.get(offset..).unwrap_or_default(), v, &span);
        }
        // Past the run and whatever ended it.
        i += 1;
    }
    view
}

/// Decodes the characters at `at` (positions in `input`), each decoded byte
/// spanning the characters its bits came from.
fn decode_run(
    input: &[u8],
    at: &[usize],
    view: &mut View,
    span: &impl Fn(usize, usize) -> (u32, u32),
) {
    let value = |k: usize| -> Option<(u8, usize)> {
        let pos = *at.get(k)?;
        Some((b64_value(*input.get(pos)?)?, pos))
    };
    let mut k = 0;
    while k + 1 < at.len() {
        // Byte j of a quantum takes its bits from characters j and j+1.
        for j in 0..3 {
            let (Some((a, pa)), Some((b, pb))) = (value(k + j), value(k + j + 1)) else {
                break;
            };
            let byte = match j {
                0 => (a << 2) | (b >> 4),
                1 => (a << 4) | (b >> 2),
                _ => (a << 6) | b,
            };
            view.push(byte, span(pa, pb + 1));
        }
        k += 4;
    }
}

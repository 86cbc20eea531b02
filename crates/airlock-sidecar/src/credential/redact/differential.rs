//! Random answers holding credential values written by chains of ordinary
//! encoders (and base64 inside longer base64 text, with line breaks), each
//! with the span of bytes the value was encoded into: what a redactor must
//! cover. Used by the differential tests of [`super::tests`].

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};

/// A small deterministic generator (no dependency for a test).
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n.max(1) as u64).unwrap_or(0)
    }

    fn pick<'a, T>(&mut self, of: &'a [T]) -> &'a T {
        &of[self.below(of.len())]
    }
}

/// Text and, for each byte of the text it was encoded from, the half-open
/// span of its bytes that byte became.
struct Encoded {
    text: Vec<u8>,
    spans: Vec<(usize, usize)>,
}

impl Encoded {
    fn per_byte(input: &[u8], f: impl Fn(u8) -> Vec<u8>) -> Encoded {
        let mut e = Encoded {
            text: Vec::new(),
            spans: Vec::new(),
        };
        for &b in input {
            let start = e.text.len();
            e.text.extend(f(b));
            e.spans.push((start, e.text.len()));
        }
        e
    }
}

/// A random secret of printable ASCII, with the characters encoders treat
/// differently.
pub(super) fn secret(rng: &mut Rng) -> String {
    const CHARS: &[u8] =
        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/+&<>\"'%=:._-~ \\";
    let len = 4 + rng.below(37);
    (0..len).map(|_| char::from(*rng.pick(CHARS))).collect()
}

fn json(input: &[u8], kind: usize) -> Encoded {
    Encoded::per_byte(input, |b| match (kind, b) {
        (3, _) => format!("\\u{:04x}", b).into_bytes(),
        (4, _) => format!("\\x{b:02X}").into_bytes(),
        (_, b'"' | b'\\') => vec![b'\\', b],
        (1 | 2, b'/') => b"\\/".to_vec(),
        (2, b'&' | b'<' | b'>') => format!("\\u{:04x}", b).into_bytes(),
        (_, b'\n') => b"\\n".to_vec(),
        _ => vec![b],
    })
}

fn percent(input: &[u8], kind: usize) -> Encoded {
    Encoded::per_byte(input, |b| match kind {
        0 => format!("%{b:02X}").into_bytes(),
        1 => format!("%{b:02x}").into_bytes(),
        _ if b.is_ascii_alphanumeric() || b"-._~".contains(&b) => vec![b],
        _ if b == b' ' => b"+".to_vec(),
        _ => format!("%{b:02x}").into_bytes(),
    })
}

fn html(input: &[u8], kind: usize) -> Encoded {
    Encoded::per_byte(input, |b| match (kind, b) {
        (1, _) => format!("&#{b};").into_bytes(),
        (2, _) => format!("&#x{b:X};").into_bytes(),
        (_, b'&') => b"&amp;".to_vec(),
        (_, b'<') => b"&lt;".to_vec(),
        (_, b'>') => b"&gt;".to_vec(),
        (_, b'"') => b"&quot;".to_vec(),
        (_, b'\'') => b"&#039;".to_vec(),
        (_, b'/') => b"&#x2F;".to_vec(),
        _ => vec![b],
    })
}

/// Base64 of `input` in one of the four engines, byte `i` spanning the
/// two characters its bits went into; with line breaks (`breaks`: 0 none,
/// 1 MIME lines of 76 with CRLF, 2 a LF at random places).
fn base64(input: &[u8], engine: usize, breaks: usize, rng: &mut Rng) -> Encoded {
    let engine = &[STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD][engine % 4];
    let chars = engine.encode(input).into_bytes();
    let mut text = Vec::new();
    let mut at = Vec::with_capacity(chars.len() + 1);
    for (k, &c) in chars.iter().enumerate() {
        let brk = match breaks {
            1 => k > 0 && k % 76 == 0,
            2 => k > 0 && rng.below(20) == 0,
            _ => false,
        };
        if brk {
            text.extend_from_slice(if breaks == 1 { b"\r\n" } else { b"\n" });
        }
        at.push(text.len());
        text.push(c);
    }
    at.push(text.len());
    let spans = (0..input.len())
        .map(|i| {
            let first = i / 3 * 4 + i % 3;
            (at[first], at[first + 1] + 1)
        })
        .collect();
    Encoded { text, spans }
}

/// One random answer holding `secrets` in random forms: the answer and the
/// spans each value was encoded into.
pub(super) fn answer(rng: &mut Rng, secrets: &[String]) -> (Vec<u8>, Vec<(usize, usize)>) {
    let mut out = Vec::new();
    let mut must = Vec::new();
    for _ in 0..1 + rng.below(4) {
        filler(rng, &mut out);
        let v = rng.pick(secrets).clone().into_bytes();
        let (text, span) = form(rng, &v);
        must.push((out.len() + span.0, out.len() + span.1));
        out.extend(text);
    }
    filler(rng, &mut out);
    (out, must)
}

/// Bytes around the values: random bytes, base64 text, or plain text.
fn filler(rng: &mut Rng, out: &mut Vec<u8>) {
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let n = rng.below(120);
    match rng.below(4) {
        0 => out.extend((0..n).map(|_| rng.next().to_le_bytes()[0])),
        1 => out.extend((0..n).map(|_| *rng.pick(B64))),
        // A long run that decodes to nothing a nested decoder reads.
        2 if rng.below(2) == 0 => out.extend(std::iter::repeat_n(b'Z', n * 30)),
        2 => out.extend((0..n).map(|_| *rng.pick(b"abc def\n{}\":,%&;\\"))),
        _ => out.push(b' '),
    }
    // An escape's first byte would take the value's first bytes with it
    // (`\` before `\u0041` is an escaped backslash): no encoder writes
    // that.
    if out.last().is_some_and(|b| b"\\%&".contains(b)) {
        out.push(b' ');
    }
}

/// `v` written by a random chain of one or two encoders, and the span of
/// the text it became.
fn form(rng: &mut Rng, v: &[u8]) -> (Vec<u8>, (usize, usize)) {
    let mut text = v.to_vec();
    let mut span = (0, v.len());
    if rng.below(6) == 0 {
        text.make_ascii_lowercase();
    }
    for _ in 0..1 + rng.below(2) {
        // Text around the value inside the encoded text.
        let mut lead: Vec<u8> = (0..rng.below(6))
            .map(|_| b"xyz\"{/ "[rng.below(7)])
            .collect();
        let mut trail: Vec<u8> = (0..rng.below(6))
            .map(|_| b"q}\" ,="[rng.below(6)])
            .collect();
        if rng.below(4) == 0 {
            // Bytes whose base64 is `ZZZZ`: a long run around the value.
            let z = |n: usize| {
                b"e\x96Y"
                    .iter()
                    .copied()
                    .cycle()
                    .take(n)
                    .collect::<Vec<u8>>()
            };
            lead.splice(0..0, z(rng.below(2000)));
            trail.extend(z(rng.below(2000)));
        }
        let mut inner = lead.clone();
        inner.extend_from_slice(&text);
        inner.extend_from_slice(&trail);
        let inner_span = (span.0 + lead.len(), span.1 + lead.len());
        let e = match rng.below(5) {
            0 => json(&inner, rng.below(5)),
            1 => percent(&inner, rng.below(3)),
            2 => html(&inner, rng.below(3)),
            3 => Encoded::per_byte(&inner, |b| vec![b]),
            _ => {
                let (engine, breaks) = (rng.below(4), rng.pick(&[0, 0, 1, 2]).to_owned());
                base64(&inner, engine, breaks, rng)
            }
        };
        span = (e.spans[inner_span.0].0, e.spans[inner_span.1 - 1].1);
        text = e.text;
    }
    (text, span)
}

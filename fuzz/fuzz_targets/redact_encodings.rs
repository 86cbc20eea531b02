//! The credential redactor against a random secret run through a random
//! chain of one or two encoders (JSON as serde, PHP, Go and JavaScript
//! write it, percent-encoding upper, lower and form, HTML named, decimal
//! and hex, base64 of both alphabets, padded or not, at a random
//! alignment inside a longer text), inside a random answer, whole and
//! streamed in random chunks.
//!
//! The invariant: whatever is left between the `[REDACTED]` markers,
//! decoded back through the chain (every way: both percent decodings, each
//! base64 offset), holds no copy of the secret.
#![no_main]

use airlock_sidecar::credential::{REDACTED, Redactor};
use base64::Engine;
use libfuzzer_sys::fuzz_target;

const SECRET_CHARS: &[char] = &[
    'a', 'b', 'Q', 'Z', 'k', '0', '7', '/', '+', '&', '<', '>', '"', '\'', '=', '%', ':', ';', ' ',
    '-', '_', '.', '~', '!', '#', '\\', '?', ',', '{', '}', 'é', '€', '😀', 'x', 'M', '9',
];
const TEXT_CHARS: &[u8] =
    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:=/+-_";

#[derive(Clone, Copy, Debug)]
enum Enc {
    Serde,
    Php,
    Go,
    Js,
    PctUpper,
    PctLower,
    Form,
    HtmlNamed,
    HtmlDec,
    HtmlHex,
    B64,
    B64UrlNoPad,
}

const ENCS: [Enc; 12] = [
    Enc::Serde,
    Enc::Php,
    Enc::Go,
    Enc::Js,
    Enc::PctUpper,
    Enc::PctLower,
    Enc::Form,
    Enc::HtmlNamed,
    Enc::HtmlDec,
    Enc::HtmlHex,
    Enc::B64,
    Enc::B64UrlNoPad,
];

fn encode(e: Enc, s: &str) -> String {
    let serde = || {
        let q = serde_json::to_string(s).unwrap_or_default();
        q.get(1..q.len().saturating_sub(1)).unwrap_or("").to_owned()
    };
    let pct = |lower: bool, form: bool| {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else if form && b == b' ' {
                    "+".into()
                } else if lower {
                    format!("%{b:02x}")
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
    };
    match e {
        Enc::Serde => serde(),
        Enc::Php => serde().replace('/', "\\/"),
        Enc::Go => serde()
            .replace('&', "\\u0026")
            .replace('<', "\\u003c")
            .replace('>', "\\u003e"),
        Enc::Js => s.encode_utf16().map(|u| format!("\\u{u:04x}")).collect(),
        Enc::PctUpper => pct(false, false),
        Enc::PctLower => pct(true, false),
        Enc::Form => pct(false, true),
        Enc::HtmlNamed => s
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
            .replace('\'', "&#039;"),
        Enc::HtmlDec => s.chars().map(|c| format!("&#{};", c as u32)).collect(),
        Enc::HtmlHex => s.chars().map(|c| format!("&#x{:X};", c as u32)).collect(),
        Enc::B64 => base64::engine::general_purpose::STANDARD.encode(s),
        Enc::B64UrlNoPad => base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s),
    }
}

fn json_unescape(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars().peekable();
    let mut pending_hi: Option<u32> = None;
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('u') => {
                let h: String = it.by_ref().take(4).collect();
                let Ok(v) = u32::from_str_radix(&h, 16) else {
                    out.push_str("\\u");
                    out.push_str(&h);
                    continue;
                };
                if (0xd800..0xdc00).contains(&v) {
                    pending_hi = Some(v);
                } else if let (Some(hi), true) = (pending_hi.take(), (0xdc00..0xe000).contains(&v))
                {
                    out.extend(char::from_u32(
                        0x10000 + ((hi - 0xd800) << 10) + (v - 0xdc00),
                    ));
                } else {
                    out.extend(char::from_u32(v));
                }
            }
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('b') => out.push('\u{8}'),
            Some('f') => out.push('\u{c}'),
            Some(o) => out.push(o),
            None => out.push('\\'),
        }
    }
    out
}

fn pct_decode(s: &str, plus: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(v) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if plus && b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn html_unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let Some(end) = rest.find(';').filter(|e| *e <= 12) else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let name = &rest[1..end];
        let c = match name {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            _ => name.strip_prefix('#').and_then(|n| {
                let v = match n.strip_prefix(['x', 'X']) {
                    Some(h) => u32::from_str_radix(h, 16).ok(),
                    None => n.parse().ok(),
                };
                v.and_then(char::from_u32)
            }),
        };
        match c {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn b64_decodings(s: &str) -> Vec<String> {
    let clean: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "+/-_".contains(*c))
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    let mut out = Vec::new();
    for k in 0..4 {
        let part = clean.get(k..).unwrap_or("");
        let part = &part[..part.len() - part.len() % 4];
        if let Ok(d) = base64::engine::general_purpose::STANDARD_NO_PAD.decode(part) {
            out.push(String::from_utf8_lossy(&d).into_owned());
        }
    }
    out
}

/// Every reading of `s` through the inverse of `e`.
fn decode(e: Enc, s: &str) -> Vec<String> {
    match e {
        Enc::Serde | Enc::Php | Enc::Go | Enc::Js => vec![json_unescape(s)],
        Enc::PctUpper | Enc::PctLower | Enc::Form => {
            vec![pct_decode(s, false), pct_decode(s, true)]
        }
        Enc::HtmlNamed | Enc::HtmlDec | Enc::HtmlHex => vec![html_unescape(s)],
        Enc::B64 | Enc::B64UrlNoPad => b64_decodings(s),
    }
}

fn leaks(out: &[u8], chain: &[Enc], secret: &str) -> Option<String> {
    let text = String::from_utf8_lossy(out);
    let needle = secret.to_ascii_lowercase();
    for piece in text.split(REDACTED) {
        let mut readings = vec![piece.to_owned()];
        for e in chain.iter().rev() {
            let mut next = readings.clone();
            for r in &readings {
                next.extend(decode(*e, r));
            }
            readings = next;
        }
        for r in readings {
            if r.to_ascii_lowercase().contains(&needle) {
                return Some(r);
            }
        }
    }
    None
}

fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let n = n.min(data.len());
    let (a, b) = data.split_at(n);
    *data = b;
    a
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    let head = take(&mut data, 6);
    if head.len() < 6 {
        return;
    }
    let secret_len = 8 + usize::from(head[0] % 32);
    let mut chain = vec![ENCS[usize::from(head[1]) % ENCS.len()]];
    if head[2] % 3 != 0 {
        chain.push(ENCS[usize::from(head[2] / 3) % ENCS.len()]);
    }
    let lead = usize::from(head[3] % 8);
    let trail = usize::from(head[4] % 8);
    let chunk = 1 + usize::from(head[5]) * 7;
    let secret: String = take(&mut data, secret_len)
        .iter()
        .map(|b| SECRET_CHARS[usize::from(*b) % SECRET_CHARS.len()])
        .collect();
    if secret.chars().count() < 8 {
        return;
    }
    let text = |bytes: &[u8]| -> String {
        bytes
            .iter()
            .map(|b| TEXT_CHARS[usize::from(*b) % TEXT_CHARS.len()] as char)
            .collect()
    };
    let rest = take(&mut data, 256);
    let (pre, post) = rest.split_at(rest.len() / 2);
    // What the upstream encodes: the secret inside some of its own text.
    let mut encoded = format!("{}{secret}{}", "p".repeat(lead), "s".repeat(trail));
    for e in &chain {
        encoded = encode(*e, &encoded);
    }
    let answer = format!("{}\"{encoded}\"{}", text(pre), text(post));
    let redactor = Redactor::new([secret.as_str()]);
    let whole = redactor.bytes(answer.as_bytes());
    if let Some(r) = leaks(&whole, &chain, &secret) {
        panic!("{chain:?} {secret:?} survived: {r:?}\nanswer {answer:?}");
    }
    let mut stream = redactor.stream();
    let mut streamed = Vec::new();
    for c in answer.as_bytes().chunks(chunk) {
        streamed.extend(stream.push(c));
    }
    streamed.extend(stream.finish());
    if let Some(r) = leaks(&streamed, &chain, &secret) {
        panic!("streamed in {chunk}: {chain:?} {secret:?} survived: {r:?}");
    }
});

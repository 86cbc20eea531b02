//! Credential redaction: what the sidecar returns to the agent and what it
//! writes to its log and the egress log passes through a [`Redactor`] holding
//! the call's credential values.

use secrecy::zeroize::Zeroizing;

/// Credential values shorter than this are not redacted (they would blank
/// out ordinary text); a credential that short is no secret anyway.
pub const MIN_REDACT_LEN: usize = 4;
pub const REDACTED: &str = "[REDACTED]";

/// Percent-encodes everything but RFC 3986 unreserved characters, so a
/// credential value substituted into a URL cannot change its structure.
pub fn percent_encode(v: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if unreserved(b) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        }
    }
    out
}

/// An RFC 3986 unreserved character (kept as it is by [`percent_encode`]).
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

/// Replaces credential values (raw, percent-encoded and JSON-escaped) with
/// `[REDACTED]` in anything returned to the agent or logged.
#[derive(Default)]
pub struct Redactor {
    /// Longest first, each searcher built once (a call's redactor searches
    /// its answer, its errors and its records).
    needles: Vec<memchr::memmem::Finder<'static>>,
}

impl Redactor {
    /// Redacts nothing: for requests that carry no credential of the
    /// sidecar's (the proxy) or carry it only in a header (the model relay).
    pub fn none() -> Self {
        Redactor::default()
    }

    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Self {
        // The forms of each secret are zeroed once the finders hold them
        // (the finders' own copies live as long as the redactor).
        let mut needles: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        let mut add = |v: String| {
            let v = Zeroizing::new(v.into_bytes());
            if v.len() >= MIN_REDACT_LEN && !needles.iter().any(|n| **n == *v) {
                needles.push(v);
            }
        };
        for s in secrets {
            if s.len() < MIN_REDACT_LEN {
                continue;
            }
            add(s.to_owned());
            // Each other form only when it differs from the value (the
            // usual key is all unreserved, lowercase-free of escapes).
            if !s.bytes().all(unreserved) {
                add(percent_encode(s));
            }
            // serde_json escapes `"`, `\` and the C0 controls, nothing else.
            if s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
                let quoted = Zeroizing::new(serde_json::to_string(s).unwrap_or_default());
                add(quoted
                    .get(1..quoted.len().saturating_sub(1))
                    .unwrap_or_default()
                    .to_owned());
            }
            // A value that lands in a host name is lowercased there.
            if s.bytes().any(|b| b.is_ascii_uppercase()) {
                add(s.to_ascii_lowercase());
            }
        }
        needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        Redactor {
            needles: needles
                .iter()
                .map(|n| memchr::memmem::Finder::new(n.as_slice()).into_owned())
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    pub fn bytes(&self, input: &[u8]) -> Vec<u8> {
        // A needle that is not there costs a search, not a copy.
        let mut cur = std::borrow::Cow::Borrowed(input);
        for n in &self.needles {
            if let Some(replaced) = replace_all(&cur, n, REDACTED.as_bytes()) {
                cur = std::borrow::Cow::Owned(replaced);
            }
        }
        cur.into_owned()
    }

    /// [`Redactor::str`] of a string the caller owns: kept as it is (no
    /// copy) when there is nothing to redact.
    pub fn string(&self, input: String) -> String {
        if self.needles.is_empty() {
            return input;
        }
        self.str(&input)
    }

    pub fn str(&self, input: &str) -> String {
        if self.needles.is_empty() {
            return input.to_owned();
        }
        // Replacing whole UTF-8 needles with ASCII keeps the text UTF-8.
        String::from_utf8(self.bytes(input.as_bytes()))
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

/// `hay` with every (non-overlapping, leftmost) `needle` replaced by
/// `with`, or `None` when `needle` is not in it (or is empty).
fn replace_all(hay: &[u8], needle: &memchr::memmem::Finder<'_>, with: &[u8]) -> Option<Vec<u8>> {
    let len = needle.needle().len();
    if len == 0 {
        return None;
    }
    let mut found = needle.find_iter(hay).peekable();
    found.peek()?;
    let mut out = Vec::with_capacity(hay.len());
    let mut from = 0;
    for at in found {
        out.extend_from_slice(hay.get(from..at).unwrap_or_default());
        out.extend_from_slice(with);
        from = at + len;
    }
    out.extend_from_slice(hay.get(from..).unwrap_or_default());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form of every value is searched for: the searchers are those
    /// of all four forms of each value, duplicates and short ones dropped,
    /// and each form is redacted in a text.
    #[test]
    fn every_encoded_form_is_a_needle() {
        let values = [
            "plain-key_1.0~x",
            "UPPER-case",
            "s3cr3t/v\"al",
            "tab\there",
            "spa ce+plus",
            "back\\slash",
            "ünïcode-Wert",
            "ab",
            "abcd",
            "ABC",
            "ctl\u{1}x\u{7f}y",
            "NEW\nLINE\"Q\\",
            "\u{1f}\u{0}zero",
            "%41-already-encoded",
        ];
        let naive = |s: &str| {
            let json = serde_json::to_string(s).unwrap();
            let json = json[1..json.len() - 1].to_owned();
            [
                s.to_owned(),
                percent_encode(s),
                json,
                s.to_ascii_lowercase(),
            ]
        };
        for v in values {
            let mut want: Vec<Vec<u8>> = Vec::new();
            if v.len() >= MIN_REDACT_LEN {
                for f in naive(v) {
                    if f.len() >= MIN_REDACT_LEN && !want.contains(&f.clone().into_bytes()) {
                        want.push(f.into_bytes());
                    }
                }
            }
            let r = Redactor::new([v]);
            let mut got: Vec<Vec<u8>> = r.needles.iter().map(|n| n.needle().to_vec()).collect();
            want.sort();
            got.sort();
            assert_eq!(got, want, "{v:?}");
            for form in &want {
                let text = [b"<".as_slice(), form, b">"].concat();
                assert_eq!(r.bytes(&text), b"<[REDACTED]>", "{v:?}: {form:?}");
            }
        }
    }

    /// Every byte is encoded as `%XX` with upper-case hex digits, but the
    /// unreserved ones.
    #[test]
    fn percent_encoding_of_every_byte() {
        for b in 0..=u8::MAX {
            let s = String::from_utf8_lossy(&[b]).into_owned();
            let want: String = s
                .bytes()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                        (c as char).to_string()
                    } else {
                        format!("%{c:02X}")
                    }
                })
                .collect();
            assert_eq!(percent_encode(&s), want, "byte {b}");
        }
    }

    /// Every occurrence goes, overlapping ones leftmost first, at either
    /// end and back to back; text without a needle comes back unchanged.
    #[test]
    fn every_occurrence_is_replaced_and_nothing_else_changes() {
        let r = Redactor::new(["k3y!"]);
        assert_eq!(r.str("k3y!"), "[REDACTED]");
        assert_eq!(r.str("k3y!k3y!"), "[REDACTED][REDACTED]");
        assert_eq!(r.str("ak3y!bk3y!c"), "a[REDACTED]b[REDACTED]c");
        assert_eq!(r.str("k3yk3y!"), "k3y[REDACTED]");
        assert_eq!(r.str("no secret here"), "no secret here");
        assert_eq!(r.str(""), "");
        let aa = Redactor::new(["aaaa"]);
        assert_eq!(aa.str("aaaaaa"), "[REDACTED]aa");
        let finder = |n: &'static [u8]| memchr::memmem::Finder::new(n);
        assert_eq!(replace_all(b"abc", &finder(b""), b"x"), None);
        assert_eq!(replace_all(b"abc", &finder(b"zz"), b"x"), None);
        // A large answer keeps its bytes around the needle.
        let mut big = vec![b'.'; 100_000];
        big.splice(50_000..50_000, b"k3y!".iter().copied());
        let out = r.bytes(&big);
        assert_eq!(out.len(), 100_000 + REDACTED.len());
        assert_eq!(
            out.get(50_000..50_000 + REDACTED.len()),
            Some(REDACTED.as_bytes())
        );
        assert!(!out.windows(4).any(|w| w == b"k3y!"));
    }
}

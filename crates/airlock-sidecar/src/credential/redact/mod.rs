//! Credential redaction: what the sidecar returns to the agent and what it
//! writes to its log and the egress log passes through a [`Redactor`] holding
//! the credential values of the integration concerned.
//!
//! A redactor is built once per set of values ([`super::Credentials`]) and
//! recognises a value in every form ordinary encoders write it: one
//! Aho-Corasick automaton over the values (ASCII case ignored; a value with
//! a space also with `+` for it) searches the answer and its decoded views
//! ([`view`]): JSON and JavaScript string escapes (serde, PHP's `\/`, Go's
//! `\u0026`, `\uXXXX` of any character), percent-encoding in either case,
//! HTML character references (named, decimal, hex), base64 of either
//! alphabet, padded or not, wherever the value lies inside a longer base64
//! text (so `user:password` in Basic too), and each of these views decoded
//! once more (base64 of a JSON-escaped value, a percent-encoded JSON text).
//! A value's own base64 is searched for as written (a second search, case
//! kept, for its base64 cores: [`forms::base64_cores`]), so a base64 run is
//! decoded whole only where a line break or a nested decoder needs it.
//! A value found in a view is replaced, in the answer, by the span of bytes
//! it was decoded from. A streamed answer goes through a [`StreamRedactor`],
//! which keeps back the longest span a match can take.

#[cfg(test)]
mod differential;
mod forms;
mod stream;
#[cfg(test)]
mod tests;
mod view;

use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind, packed};

pub use forms::MIN_REDACT_LEN;
pub use stream::StreamRedactor;
use view::{Decoder, Reach, View};

pub const REDACTED: &str = "[REDACTED]";

/// Replaces credential values, in every encoded form ([module docs](self)),
/// with `[REDACTED]` in anything returned to the agent or logged. Cheap to
/// clone (the automaton is shared).
#[derive(Clone, Default)]
pub struct Redactor {
    inner: Option<Arc<Searcher>>,
}

struct Searcher {
    /// The needles, ASCII case ignored.
    automaton: AhoCorasick,
    /// The needles' base64 cores ([`forms::base64_cores`]), case kept;
    /// `cores` holds each pattern's lead and trail characters.
    base64: CoreSearch,
    cores: Vec<(usize, usize)>,
    /// The longest needle, in bytes.
    longest: usize,
    /// The shortest base64 run that can hold the shortest needle.
    min_run: usize,
}

impl Searcher {
    /// Pushes onto `found` the answer's span of each match in `bytes` (the
    /// answer, or a view of it: `span` maps the view's bytes to the
    /// answer's), a base64 core's widened by its lead and trail characters
    /// where `bytes` holds base64 there.
    fn search(
        &self,
        bytes: &[u8],
        span: impl Fn(usize, usize) -> Option<(usize, usize)>,
        found: &mut Vec<(usize, usize)>,
    ) {
        for m in self.automaton.find_iter(bytes) {
            found.extend(span(m.start(), m.end()));
        }
        self.base64.for_each(bytes, |m| {
            let (lead, trail) = self
                .cores
                .get(m.pattern().as_usize())
                .copied()
                .unwrap_or_default();
            let b64_at = |k: usize| bytes.get(k).is_some_and(|&b| view::is_b64(b));
            let start = match m.start().checked_sub(lead) {
                Some(s) if b64_at(s) => s,
                _ => m.start(),
            };
            let end = if trail > 0 && b64_at(m.end()) {
                m.end() + trail
            } else {
                m.end()
            };
            found.extend(span(start, end));
        });
    }
}

/// The search for the base64 cores: Teddy (the `packed` searcher, which
/// takes up to 64 patterns) where it builds, or an automaton. The
/// automaton's own prefilter takes Teddy for 16 patterns at most and
/// otherwise a few rare bytes, which a base64 answer holds everywhere.
enum CoreSearch {
    Packed(packed::Searcher),
    Automaton(AhoCorasick),
}

impl CoreSearch {
    fn new(cores: &[forms::Core]) -> Result<CoreSearch, aho_corasick::BuildError> {
        let packed = packed::Config::new()
            .match_kind(packed::MatchKind::LeftmostLongest)
            .builder()
            .extend(cores.iter().map(|c| c.chars.as_slice()))
            .build();
        if let Some(p) = packed {
            return Ok(CoreSearch::Packed(p));
        }
        AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(cores.iter().map(|c| c.chars.as_slice()))
            .map(CoreSearch::Automaton)
    }

    fn for_each(&self, bytes: &[u8], f: impl FnMut(aho_corasick::Match)) {
        match self {
            CoreSearch::Packed(p) => p.find_iter(bytes).for_each(f),
            CoreSearch::Automaton(a) => a.find_iter(bytes).for_each(f),
        }
    }
}

impl Redactor {
    /// Redacts nothing: for requests that carry no credential of the
    /// sidecar's.
    pub fn none() -> Self {
        Redactor::default()
    }

    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Self {
        // The needles are zeroed once the automaton holds them (its own
        // copy lives as long as the redactor).
        let mut needles = Vec::new();
        for s in secrets {
            for n in forms::needles(s) {
                if !needles.contains(&n) {
                    needles.push(n);
                }
            }
        }
        let Some(longest) = needles.iter().map(|n| n.len()).max() else {
            return Redactor::none();
        };
        let shortest = needles.iter().map(|n| n.len()).min().unwrap_or(longest);
        let cores: Vec<forms::Core> = needles
            .iter()
            .flat_map(|n| forms::base64_cores(n))
            .collect();
        let automaton = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::LeftmostLongest)
            .build(needles.iter().map(|n| n.as_slice()));
        let base64 = CoreSearch::new(&cores);
        match automaton.and_then(|a| Ok((a, base64?))) {
            Ok((automaton, base64)) => Redactor {
                inner: Some(Arc::new(Searcher {
                    automaton,
                    base64,
                    cores: cores.iter().map(|c| (c.lead, c.trail)).collect(),
                    longest,
                    min_run: shortest * 4 / 3,
                })),
            },
            Err(e) => {
                // Only a needle set beyond the automaton's size limits
                // fails; a value that long is searched as it is.
                tracing::error!("credential redactor: {e}");
                Redactor::none()
            }
        }
    }

    /// Whether both search with the one automaton (built once).
    #[cfg(test)]
    pub(crate) fn shares_automaton_with(&self, other: &Redactor) -> bool {
        match (&self.inner, &other.inner) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_none()
    }

    /// The most bytes of an answer one match may span: a stream keeps that
    /// much back until it knows what follows.
    pub(crate) fn longest_span(&self) -> usize {
        let per_byte = Decoder::ALL
            .iter()
            .map(|d| d.max_expansion())
            .max()
            .unwrap_or(1);
        self.inner
            .as_ref()
            .map_or(0, |s| s.longest * per_byte * per_byte + 8)
    }

    /// The most bytes of an answer that one escape a decoder reads, in a
    /// view or in a view of a view, spans: what a stream keeps of what it
    /// already let out, so that an escape cut by the stream's cut is read
    /// whole (a match in what follows is read as in the whole answer).
    pub(crate) fn longest_escape(&self) -> usize {
        Decoder::MAX_EXPANSION * Decoder::MAX_EXPANSION
    }

    /// The spans of `input` that hold a credential value in some form,
    /// sorted, merged.
    pub(crate) fn spans(&self, input: &[u8]) -> Vec<(usize, usize)> {
        let Some(s) = &self.inner else {
            return Vec::new();
        };
        let mut found: Vec<(usize, usize)> = Vec::new();
        s.search(input, |start, end| Some((start, end)), &mut found);
        let search = |v: &View, found: &mut Vec<(usize, usize)>| {
            s.search(&v.bytes, |start, end| v.span(start, end), found);
        };
        let reach = Reach {
            longest: s.longest,
            min_run: s.min_run,
        };
        let mut first = Vec::new();
        for d in Decoder::ALL {
            d.views(input, None, reach, &mut first);
        }
        let mut second = Vec::new();
        for v1 in &first {
            search(v1, &mut found);
            second.clear();
            for d in Decoder::ALL {
                d.views(&v1.bytes, Some(v1), reach, &mut second);
            }
            for v2 in &second {
                search(v2, &mut found);
            }
        }
        found.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(found.len());
        for (start, end) in found {
            match merged.last_mut() {
                Some(last) if start < last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }

    pub fn bytes(&self, input: &[u8]) -> Vec<u8> {
        render(input, &self.spans(input))
    }

    /// [`Redactor::str`] of a string the caller owns: kept as it is (no
    /// copy) when there is nothing to redact.
    pub fn string(&self, input: String) -> String {
        if self.is_empty() {
            return input;
        }
        let spans = self.spans(input.as_bytes());
        if spans.is_empty() {
            return input;
        }
        to_string(render(input.as_bytes(), &spans))
    }

    pub fn str(&self, input: &str) -> String {
        if self.is_empty() {
            return input.to_owned();
        }
        to_string(self.bytes(input.as_bytes()))
    }

    /// A redactor of a streamed answer, for one answer.
    pub fn stream(&self) -> StreamRedactor {
        StreamRedactor::new(self.clone())
    }

    /// An answer's `headers` as they may reach the agent: each value
    /// redacted; a value that is not text dropped (it cannot be searched),
    /// and so is the length (a redacted body has another).
    pub fn headers(&self, headers: &http::HeaderMap) -> http::HeaderMap {
        let mut clean = http::HeaderMap::with_capacity(headers.len());
        for (name, value) in headers {
            if name == http::header::CONTENT_LENGTH {
                continue;
            }
            // A value whose redacted text is not a header value is dropped
            // too, never passed as it came.
            if let Ok(Ok(v)) = value
                .to_str()
                .map(|text| http::HeaderValue::from_str(&self.str(text)))
            {
                clean.append(name.clone(), v);
            }
        }
        clean
    }
}

/// The content or transfer coding of an answer that the sidecar cannot read
/// as it is (anything but `identity`, and `chunked`, which hyper decodes).
pub fn unreadable_coding(headers: &http::HeaderMap) -> Option<String> {
    if !headers.contains_key(http::header::CONTENT_ENCODING)
        && !headers.contains_key(http::header::TRANSFER_ENCODING)
    {
        return None;
    }
    let codings = |name| {
        headers
            .get_all(name)
            .iter()
            .flat_map(|v| {
                v.to_str()
                    .unwrap_or("\u{fffd}")
                    .split(',')
                    .map(|c| c.trim().to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .filter(|c| !c.is_empty())
            .collect::<Vec<_>>()
    };
    codings(http::header::CONTENT_ENCODING)
        .into_iter()
        .find(|c| c != "identity")
        .or_else(|| {
            codings(http::header::TRANSFER_ENCODING)
                .into_iter()
                .find(|c| c != "chunked" && c != "identity")
        })
}

fn to_string(bytes: Vec<u8>) -> String {
    // A span may cut a multi-byte character (a decoded view's span ends on
    // its escape, not on the text's characters): lossy, never invalid.
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// `input` with each of `spans` (sorted, disjoint) replaced by
/// [`REDACTED`].
fn render(input: &[u8], spans: &[(usize, usize)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len() + spans.len() * REDACTED.len());
    let mut from = 0;
    for &(start, end) in spans {
        out.extend_from_slice(input.get(from..start).unwrap_or_default());
        out.extend_from_slice(REDACTED.as_bytes());
        from = end;
    }
    out.extend_from_slice(input.get(from..).unwrap_or_default());
    out
}

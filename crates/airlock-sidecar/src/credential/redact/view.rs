//! Decoded views of an answer: the answer's text as each ordinary decoder
//! would read it, with, for each byte of the view, the span of the answer's
//! own bytes it was decoded from. A credential found in a view is redacted
//! in the answer by that span.
//!
//! A decoder makes no view when it would change nothing (no escape, no
//! base64 run long enough to hold a secret), and an escape decoder's view
//! holds only the windows around its escapes: most answers cost one scan
//! per decoder and little or no copy.

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

/// What the decoders need to know of the needles searched in their views.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reach {
    /// The longest needle, in bytes.
    pub(super) longest: usize,
    /// The shortest base64 run that can hold the shortest needle.
    pub(super) min_run: usize,
}

impl Reach {
    /// The characters decoded at each end of a base64 run that is not
    /// decoded whole, a multiple of 4: the longest needle, or the widest
    /// window a nested escape decoder opens around an escape of the
    /// neighbouring run (reach and the escape), in decoded bytes, as base64.
    fn edge(self) -> usize {
        let bytes = self
            .longest
            .saturating_mul(Decoder::MAX_EXPANSION)
            .saturating_add(Decoder::MAX_EXPANSION);
        (bytes / 3 + 1).saturating_mul(4)
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
    /// into the run (a run may begin with text that is not of it): four
    /// views.
    Base64,
}

impl Decoder {
    pub(super) const ALL: [Decoder; 4] = [
        Decoder::Json,
        Decoder::Percent,
        Decoder::Html,
        Decoder::Base64,
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
            Decoder::Base64 => 2,
        }
    }

    /// The largest [`Decoder::max_expansion`].
    pub(super) const MAX_EXPANSION: usize = forms::MAX_ENTITY_LEN;

    /// Pushes onto `out` the views of `input` (itself the view `parent` of
    /// the answer, or the answer when `parent` is `None`); none when it
    /// decodes nothing.
    ///
    /// An escape decoder's view holds only the windows of `input` around
    /// the escapes it decodes, each followed by [`SEPARATOR`]: a match in
    /// the view that takes no decoded byte is the same match in `input`,
    /// found by the search of `input` itself, and a match that takes one
    /// lies within the longest needle's decoded length of it, which the
    /// window holds — for a view of the answer, times the most a view of
    /// that view may expand, since that one is decoded from this one.
    pub(super) fn views(
        self,
        input: &[u8],
        parent: Option<&View>,
        reach: Reach,
        out: &mut Vec<View>,
    ) {
        let span = |start: usize, end: usize| -> (u32, u32) {
            match parent {
                Some(p) => {
                    let (s, e) = p.span(start, end).unwrap_or((0, 0));
                    (to_u32(s), to_u32(e))
                }
                None => (to_u32(start), to_u32(end)),
            }
        };
        let nested = if parent.is_none() {
            Decoder::MAX_EXPANSION
        } else {
            1
        };
        let window = reach
            .longest
            .saturating_mul(self.max_expansion())
            .saturating_mul(nested);
        let view = match self {
            Decoder::Json => decode_escapes(input, b'\\', window, span, json_escape),
            Decoder::Percent => decode_escapes(input, b'%', window, span, percent_escape),
            Decoder::Html => decode_escapes(input, b'&', window, span, html_escape),
            Decoder::Base64 => return base64(input, reach, span, out),
        };
        out.extend(view);
    }
}

/// Ends each window of an escape decoder's view: no needle holds it (a
/// needle is UTF-8, which never has the byte 0xFF), and no decoder reads
/// it as part of an escape or a base64 run.
const SEPARATOR: u8 = 0xff;

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

/// Decodes the escape at `input[i]` (which holds the trigger) onto `view`;
/// the bytes it took, or `None` when it is no escape.
type Escape = fn(&[u8], usize, &mut View, &dyn Fn(usize, usize) -> (u32, u32)) -> Option<usize>;

/// The view of the windows of `input` around each escape `decode`
/// recognises at a position holding `trigger` (`reach` bytes on either
/// side), each window followed by [`SEPARATOR`]; `None` when it recognised
/// none.
fn decode_escapes(
    input: &[u8],
    trigger: u8,
    reach: usize,
    span: impl Fn(usize, usize) -> (u32, u32),
    decode: Escape,
) -> Option<View> {
    let windows = escape_windows(input, trigger, reach, &span, decode);
    if windows.is_empty() {
        return None;
    }
    let covered: usize = windows.iter().map(|(s, e)| e - s + 1).sum();
    let mut view = View::with_capacity(covered);
    // Where decoding resumes: an escape may run past its window's end.
    let mut i = 0;
    for (start, end) in windows {
        i = i.max(start);
        while i < end {
            let Some(&b) = input.get(i) else { break };
            if b == trigger
                && let Some(used) = decode(input, i, &mut view, &span)
            {
                i += used;
                continue;
            }
            view.push(b, span(i, i + 1));
            i += 1;
        }
        view.push(SEPARATOR, (0, 0));
    }
    Some(view)
}

/// The merged windows `reach` bytes around each escape of `input`.
fn escape_windows(
    input: &[u8],
    trigger: u8,
    reach: usize,
    span: &impl Fn(usize, usize) -> (u32, u32),
    decode: Escape,
) -> Vec<(usize, usize)> {
    let mut windows: Vec<(usize, usize)> = Vec::new();
    let mut scratch = View::with_capacity(8);
    for at in memchr::memchr_iter(trigger, input) {
        scratch.bytes.clear();
        scratch.spans.clear();
        let Some(used) = decode(input, at, &mut scratch, span) else {
            continue;
        };
        let start = at.saturating_sub(reach);
        let end = at
            .saturating_add(used)
            .saturating_add(reach)
            .min(input.len());
        match windows.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => windows.push((start, end)),
        }
    }
    windows
}

fn json_escape(
    input: &[u8],
    i: usize,
    view: &mut View,
    span: &dyn Fn(usize, usize) -> (u32, u32),
) -> Option<usize> {
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
}

fn percent_escape(
    input: &[u8],
    i: usize,
    view: &mut View,
    span: &dyn Fn(usize, usize) -> (u32, u32),
) -> Option<usize> {
    let v = hex_at(input, i + 1, 2)?;
    view.push(u8::try_from(v).ok()?, span(i, i + 3));
    Some(3)
}

fn html_escape(
    input: &[u8],
    i: usize,
    view: &mut View,
    span: &dyn Fn(usize, usize) -> (u32, u32),
) -> Option<usize> {
    let (c, used) = forms::entity(input.get(i..)?)?;
    view.push_char(c, span(i, i + used));
    Some(used)
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

/// Whether `b` is a character of either base64 alphabet (one table).
pub(super) fn is_b64(b: u8) -> bool {
    const TABLE: [bool; 256] = {
        let mut t = [false; 256];
        let mut i = 0;
        while i < 256 {
            #[allow(clippy::cast_possible_truncation)] // i < 256
            let b = i as u8;
            t[i] = b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'/' | b'_');
            i += 1;
        }
        t
    };
    TABLE[usize::from(b)]
}

/// The characters of one base64 run: contiguous, or listed (a run with
/// line breaks, which are skipped).
#[derive(Clone, Copy)]
enum Chars<'a> {
    Contiguous { start: usize, len: usize },
    Listed(&'a [usize]),
}

impl Chars<'_> {
    fn len(&self) -> usize {
        match self {
            Chars::Contiguous { len, .. } => *len,
            Chars::Listed(at) => at.len(),
        }
    }

    /// The position in the input of the run's character `k`.
    fn at(&self, k: usize) -> Option<usize> {
        match self {
            Chars::Contiguous { start, len } => (k < *len).then(|| start + k),
            Chars::Listed(at) => at.get(k).copied(),
        }
    }

    /// Characters `from..to` of the run (clamped).
    fn slice(&self, from: usize, to: usize) -> Self {
        let to = to.min(self.len());
        let from = from.min(to);
        match self {
            Chars::Contiguous { start, .. } => Chars::Contiguous {
                start: start + from,
                len: to - from,
            },
            Chars::Listed(at) => Chars::Listed(at.get(from..to).unwrap_or_default()),
        }
    }
}

/// Pushes onto `out` the four views (one per character offset) of the
/// base64 runs of `input` at least `min_run` characters long, each view
/// the runs' decoded bytes one after the other (a value split between two
/// runs, each padded, is found whole; a run that follows bytes that may
/// open an escape also on its own: [`may_open_escape`]); nothing when there
/// is no such run
/// (most answers: one pass, no copy).
///
/// A value's own base64 inside a run is found by the search for its cores
/// ([`forms::base64_cores`]) in the text itself; what only a decoded view
/// shows is a value split by a line break, split between two runs, or
/// written in an encoding the view is decoded from once more. So a run is
/// decoded whole only when it has a line break or [`nested`] says the
/// nested base64 decoder may read a run in it; a run in whose view a nested
/// escape decoder may read an escape, at its ends and around each escape
/// ([`escape_segments`]); any other run only at its two ends, far enough
/// that a match or a nested decoder's window that crosses into it from a
/// neighbouring run is whole ([`Reach::edge`]), the two ends parted by
/// [`SEPARATOR`].
fn base64(
    input: &[u8],
    reach: Reach,
    span: impl Fn(usize, usize) -> (u32, u32),
    out: &mut Vec<View>,
) {
    let min_run = reach.min_run.max(2);
    let edge = reach.edge();
    let mut views: Option<[View; 4]> = None;
    // The characters of a run with line breaks (positions).
    let mut listed: Vec<usize> = Vec::new();
    // A run's decoded bytes, without their spans ([`escape_segments`]).
    let mut plain: Vec<u8> = Vec::new();
    let mut decode = |run: std::ops::Range<usize>, breaks: bool| {
        let chars = if breaks {
            listed.clear();
            listed.extend(
                run.clone()
                    .filter(|&k| input.get(k).is_some_and(|&b| is_b64(b))),
            );
            Chars::Listed(&listed)
        } else {
            Chars::Contiguous {
                start: run.start,
                len: run.len(),
            }
        };
        let holds = if breaks || chars.len() <= 2 * edge + 4 {
            Nested::Run
        } else {
            nested(input.get(run).unwrap_or_default(), min_run)
        };
        let vs = views.get_or_insert_with(|| std::array::from_fn(|_| View::with_capacity(0)));
        for (offset, v) in vs.iter_mut().enumerate() {
            if chars.len() < min_run + offset {
                continue;
            }
            let from = chars.slice(offset, chars.len());
            // A run's bytes follow the previous run's in the view, so that a
            // value split between two runs is read whole. But an escape a
            // nested decoder reads may begin in the previous run's last
            // bytes and take this run's first ones (`\\` its backslash,
            // `\u` or `%` its first hex digits): the value they begin is
            // then not decoded. So the run is also read on its own, past a
            // separator.
            let alone = may_open_escape(&v.bytes);
            for again in [false, true] {
                if again {
                    if !alone {
                        break;
                    }
                    v.push(SEPARATOR, (0, 0));
                }
                match holds {
                    Nested::Run => decode_run(input, from, v, &span),
                    Nested::Nothing => {
                        // Both ends start on a quantum of this offset.
                        decode_run(input, from.slice(0, edge), v, &span);
                        v.push(SEPARATOR, (0, 0));
                        let tail = (from.len() - edge) / 4 * 4;
                        decode_run(input, from.slice(tail, from.len()), v, &span);
                    }
                    Nested::Escapes => {
                        let segments = escape_segments(input, from, reach, edge, &mut plain);
                        for (i, &(start, end)) in segments.iter().enumerate() {
                            if i > 0 {
                                v.push(SEPARATOR, (0, 0));
                            }
                            decode_run(input, from.slice(start, end), v, &span);
                        }
                    }
                }
            }
        }
    };
    // One pass: a run is its characters and the line breaks inside it.
    let (mut start, mut count, mut breaks) = (0, 0, false);
    for (k, &b) in input.iter().enumerate() {
        if is_b64(b) {
            if count == 0 {
                start = k;
                breaks = false;
            }
            count += 1;
        } else if count > 0 && (b == b'\n' || b == b'\r') {
            breaks = true;
        } else {
            if count >= min_run {
                decode(start..k, breaks);
            }
            count = 0;
        }
    }
    if count >= min_run {
        decode(start..input.len(), breaks);
    }
    if let Some(vs) = views {
        out.extend(vs.into_iter().filter(|v| !v.bytes.is_empty()));
    }
}

/// The most bytes one escape of a nested decoder takes: an HTML named
/// reference (`&`, the name, `;`); JSON's longest (a surrogate pair) is 12.
const LONGEST_ESCAPE: usize = forms::MAX_ENTITY_LEN + 2;

/// Whether an escape a nested decoder reads (`\`, `%`, `&`) may begin in
/// the last bytes of `view` (since its last separator) and so take bytes
/// pushed after them.
fn may_open_escape(view: &[u8]) -> bool {
    view.iter()
        .rev()
        .take(LONGEST_ESCAPE - 1)
        .take_while(|&&b| b != SEPARATOR)
        .any(|b| matches!(b, b'\\' | b'%' | b'&'))
}

/// The value of each base64 character (either alphabet; 0 for others).
const VALUES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut v = 0u8;
    while v < 64 {
        let c = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[v as usize];
        t[c as usize] = v;
        v += 1;
    }
    t[b'-' as usize] = 62;
    t[b'_' as usize] = 63;
    t
};

/// Set in [`PAIRS`] when a byte decoded from the pair starts an escape of
/// a nested decoder (`\`, `%`, `&`), whatever its place in the quantum.
const ESCAPE: u8 = 1 << 4;

/// For each place `p` of a pair of characters (the index of its first
/// character, mod 4) and each pair of base64 values `(a, b)`: bit `o` set
/// when, in the view of offset `o`, the pair decodes to no byte (it is
/// characters 3 and 0 of two quanta) or to a byte that is a base64
/// character or a line break (it may lengthen a run the nested base64
/// decoder reads); [`ESCAPE`] as it says.
const PAIRS: [[u8; 64 * 64]; 4] = {
    let mut t = [[0u8; 64 * 64]; 4];
    let mut i = 0;
    while i < 64 * 64 {
        #[allow(clippy::cast_possible_truncation)] // i < 4096
        let (a, b) = ((i / 64) as u8, (i % 64) as u8);
        // The byte the pair decodes to as byte `j` of its quantum.
        let bytes = [(a << 2) | (b >> 4), (a << 4) | (b >> 2), (a << 6) | b];
        let mut p = 0;
        while p < 4 {
            let mut o = 0;
            while o < 4 {
                let j = (p + 4 - o) % 4;
                let lengthens = j == 3 || {
                    let d = bytes[j];
                    d.is_ascii_alphanumeric()
                        || matches!(d, b'+' | b'-' | b'/' | b'_' | b'\n' | b'\r')
                };
                if lengthens {
                    t[p][i] |= 1 << o;
                }
                o += 1;
            }
            let mut j = 0;
            while j < 3 {
                if matches!(bytes[j], b'\\' | b'%' | b'&') {
                    t[p][i] |= ESCAPE;
                }
                j += 1;
            }
            p += 1;
        }
        i += 1;
    }
    t
};

/// The four 16-bit lanes of a `u64` whose bits are set in a 4-bit mask.
const LANES: [u64; 16] = {
    let mut t = [0u64; 16];
    let mut m = 0;
    while m < 16 {
        let mut o = 0;
        while o < 4 {
            if m & (1 << o) != 0 {
                t[m] |= 0xffff << (16 * o);
            }
            o += 1;
        }
        m += 1;
    }
    t
};

/// What a decoded view of a base64 run may hold that a nested decoder reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Nested {
    /// Nothing: the run is decoded at its two ends only.
    Nothing,
    /// A byte a nested escape decoder reads (`\`, `%`, `&`), and no base64
    /// run: the run is decoded at its ends and around each escape a nested
    /// decoder recognises ([`escape_segments`]).
    Escapes,
    /// A base64 run the nested base64 decoder reads: decoded whole.
    Run,
}

/// What a decoded view of `run` (base64 characters only), at any of the
/// four offsets, may hold: a byte a nested escape decoder reads, or a
/// base64 run `min_run` long that the nested base64 decoder reads. Reads
/// pairs of characters, decodes nothing.
///
/// Per offset it counts the pairs in a row that lengthen a decoded run
/// ([`PAIRS`]), the four counts in the lanes of one `u64`: `m` decoded
/// bytes take at least `(4m - 1) / 3` pairs, so a count that reaches that
/// for `m = min_run` is reported (a superset: decoding more is safe).
fn nested(run: &[u8], min_run: usize) -> Nested {
    let pairs = u64::try_from(min_run.saturating_mul(4).saturating_sub(1) / 3).unwrap_or(u64::MAX);
    if pairs >= 0x8000 {
        // More than a lane counts: decoded whole.
        return Nested::Run;
    }
    let pairs = pairs.max(1);
    const ONES: u64 = 0x0001_0001_0001_0001;
    const HIGH: u64 = 0x8000_8000_8000_8000;
    // A lane's count reaches `pairs` when adding this sets its high bit.
    let bias = (0x8000 - pairs) * ONES;
    let mut count = 0u64;
    let mut escapes = false;
    let mut prev = match run.first() {
        Some(&b) => VALUES[usize::from(b)],
        None => return Nested::Nothing,
    };
    for (k, &b) in run.iter().skip(1).enumerate() {
        let v = VALUES[usize::from(b)];
        let class = PAIRS[k & 3][usize::from(prev) * 64 + usize::from(v)];
        prev = v;
        escapes |= class & ESCAPE != 0;
        count = (count + ONES) & LANES[usize::from(class & 0xf)];
        if (count + bias) & HIGH != 0 {
            return Nested::Run;
        }
    }
    if escapes {
        Nested::Escapes
    } else {
        Nested::Nothing
    }
}

/// The characters of `from` (a run without line breaks, from one offset)
/// to decode when its view holds escapes but no run ([`Nested::Escapes`]):
/// sorted, disjoint ranges, each starting on a quantum, that hold its two
/// ends (`edge` characters) and, around each escape a nested escape
/// decoder recognises in its decoded bytes, the window that decoder opens
/// in the view (the longest needle times its expansion, either side of
/// the escape). A nested decoder's view of the whole decoded run and of
/// these ranges, parted by [`SEPARATOR`], then hold the same windows; a
/// match that takes no decoded byte of a nested view is a match in this
/// view, which the search for the cores finds in the text itself.
fn escape_segments(
    input: &[u8],
    from: Chars<'_>,
    reach: Reach,
    edge: usize,
    plain: &mut Vec<u8>,
) -> Vec<(usize, usize)> {
    let len = from.len();
    plain.clear();
    let value = |k: usize| {
        from.at(k)
            .and_then(|p| input.get(p))
            .map_or(0, |&b| VALUES[usize::from(b)])
    };
    let mut k = 0;
    while k + 1 < len {
        let (a, b) = (value(k), value(k + 1));
        plain.push((a << 2) | (b >> 4));
        if k + 2 < len {
            let c = value(k + 2);
            plain.push((b << 4) | (c >> 2));
            if k + 3 < len {
                plain.push((c << 6) | value(k + 3));
            }
        }
        k += 4;
    }
    let tail = len.saturating_sub(edge) / 4 * 4;
    let mut segments = vec![(0, edge.min(len)), (tail, len)];
    let none = |_: usize, _: usize| (0u32, 0u32);
    for (decoder, trigger, decode) in [
        (Decoder::Json, b'\\', json_escape as Escape),
        (Decoder::Percent, b'%', percent_escape),
        (Decoder::Html, b'&', html_escape),
    ] {
        let window = reach.longest.saturating_mul(decoder.max_expansion());
        for (start, end) in escape_windows(plain, trigger, window, &none, decode) {
            // Byte `j` is decoded from characters `4 (j / 3) + j % 3` and
            // the one after: whole quanta hold bytes `start..end`.
            let first = start / 3 * 4;
            let last = end.saturating_sub(1) / 3 * 4 + 4;
            segments.push((first, last.min(len)));
        }
    }
    segments.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(segments.len());
    for (start, end) in segments {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Decodes the characters `at`, each decoded byte spanning the characters
/// its bits came from.
fn decode_run(
    input: &[u8],
    at: Chars<'_>,
    view: &mut View,
    span: &impl Fn(usize, usize) -> (u32, u32),
) {
    let value = |k: usize| -> Option<(u8, usize)> {
        let pos = at.at(k)?;
        Some((b64_value(*input.get(pos)?)?, pos))
    };
    view.bytes.reserve(at.len() / 4 * 3 + 3);
    view.spans.reserve(at.len() / 4 * 3 + 3);
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

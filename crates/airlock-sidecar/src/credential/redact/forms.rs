//! The forms of a secret searched for in each view, and the HTML character
//! references the HTML view decodes.
//!
//! What encoders write is undone by the views ([`super::view`]); what
//! remains is searched for as the secret itself, ASCII case ignored (a
//! value in a host name comes back lower-cased), and, for a secret with a
//! space, with `+` for it (form encoding, which no view undoes, since a `+`
//! is also a `+`). Base64 is searched for as it is written as well
//! ([`base64_cores`]): an answer's base64 runs are then decoded only where
//! a nested form or a line break needs it.

use base64::Engine;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use secrecy::zeroize::Zeroizing;

/// Credential values shorter than this are not redacted (they would blank
/// out ordinary text); a credential that short is no secret anyway.
pub const MIN_REDACT_LEN: usize = 4;

/// The needles of `secret`: itself and its form-encoded variant.
pub(super) fn needles(secret: &str) -> Vec<Zeroizing<Vec<u8>>> {
    if secret.len() < MIN_REDACT_LEN {
        return Vec::new();
    }
    let mut out = vec![Zeroizing::new(secret.as_bytes().to_vec())];
    if secret.contains(' ') {
        out.push(Zeroizing::new(secret.replace(' ', "+").into_bytes()));
    }
    out
}

/// One base64 form of a needle: the characters of its base64 that depend
/// on its bytes alone, wherever it lies in a longer base64 text.
pub(super) struct Core {
    pub(super) chars: Zeroizing<Vec<u8>>,
    /// The characters before and after `chars` that take bits of the
    /// needle and of its neighbours (0 or 1 each): a match's span takes
    /// them too, so that it covers every character the needle's bytes were
    /// encoded into (the span of the decoded bytes in a base64 view).
    pub(super) lead: usize,
    pub(super) trail: usize,
}

/// The base64 cores of `needle`: at each of the three byte alignments a
/// value can take in a longer text, in both alphabets (padding falls
/// outside a core), of the needle as it is and lower- and upper-cased (the
/// raw search ignores ASCII case; a base64 search cannot, so the cases an
/// encoder chain produces, a host name's lower case, are listed).
///
/// At alignment `k` (bytes before the needle in its quantum) the needle's
/// bits start at bit `8k` of the quantum: the first character of its own
/// is `ceil(8k / 6)`, the last `floor(8 (k + n) / 6) - 1`.
pub(super) fn base64_cores(needle: &[u8]) -> Vec<Core> {
    let mut cores: Vec<Core> = Vec::new();
    let variants = [
        Zeroizing::new(needle.to_vec()),
        Zeroizing::new(needle.to_ascii_lowercase()),
        Zeroizing::new(needle.to_ascii_uppercase()),
    ];
    for variant in &variants {
        for k in 0..3 {
            let mut data = Zeroizing::new(vec![0u8; k]);
            data.extend_from_slice(variant);
            let bits = 8 * data.len();
            let (first, end) = ((8 * k).div_ceil(6), bits / 6);
            let lead = usize::from(k > 0);
            let trail = usize::from(data.len() % 3 != 0);
            for engine in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
                let text = Zeroizing::new(engine.encode(&*data).into_bytes());
                let Some(chars) = text.get(first..end) else {
                    continue;
                };
                match cores.iter_mut().find(|c| c.chars.as_slice() == chars) {
                    Some(c) => {
                        c.lead = c.lead.max(lead);
                        c.trail = c.trail.max(trail);
                    }
                    None => cores.push(Core {
                        chars: Zeroizing::new(chars.to_vec()),
                        lead,
                        trail,
                    }),
                }
            }
        }
    }
    cores
}

/// The longest character reference decoded: `&#x` with 8 digits and `;`,
/// or the longest name below with `&` and `;`.
pub(super) const MAX_ENTITY_LEN: usize = 14;

/// The digits of a numeric reference read at most (leading zeros count).
const MAX_DIGITS: usize = 8;

/// Named references of the ASCII characters (HTML5) and the few others
/// encoders write (`&nbsp;`).
const NAMED: &[(&str, char)] = &[
    ("amp", '&'),
    ("AMP", '&'),
    ("lt", '<'),
    ("LT", '<'),
    ("gt", '>'),
    ("GT", '>'),
    ("quot", '"'),
    ("QUOT", '"'),
    ("apos", '\''),
    ("nbsp", '\u{a0}'),
    ("sol", '/'),
    ("bsol", '\\'),
    ("plus", '+'),
    ("equals", '='),
    ("colon", ':'),
    ("semi", ';'),
    ("comma", ','),
    ("period", '.'),
    ("excl", '!'),
    ("quest", '?'),
    ("num", '#'),
    ("dollar", '$'),
    ("percnt", '%'),
    ("lpar", '('),
    ("rpar", ')'),
    ("ast", '*'),
    ("midast", '*'),
    ("commat", '@'),
    ("lsqb", '['),
    ("lbrack", '['),
    ("rsqb", ']'),
    ("rbrack", ']'),
    ("lcub", '{'),
    ("lbrace", '{'),
    ("rcub", '}'),
    ("rbrace", '}'),
    ("verbar", '|'),
    ("vert", '|'),
    ("VerticalLine", '|'),
    ("lowbar", '_'),
    ("UnderBar", '_'),
    ("grave", '`'),
    ("Hat", '^'),
    ("tilde", '~'),
    ("Tab", '\t'),
    ("NewLine", '\n'),
    ("hyphen", '\u{2010}'),
    ("dash", '\u{2010}'),
];

/// The character reference at the start of `s` (which starts with `&`):
/// the character and the bytes it took. Numeric references may lack their
/// `;` (browsers and Python's `html.unescape` accept that); named ones need
/// it, but for the four that HTML lets go without.
pub(super) fn entity(s: &[u8]) -> Option<(char, usize)> {
    let rest = s.get(1..)?;
    if rest.first() == Some(&b'#') {
        let (radix, start) = match rest.get(1) {
            Some(b'x' | b'X') => (16, 2),
            _ => (10, 1),
        };
        let digits = rest
            .get(start..)?
            .iter()
            .take(MAX_DIGITS)
            .take_while(|d| (*d).is_ascii_digit() || (radix == 16 && d.is_ascii_hexdigit()))
            .count();
        if digits == 0 {
            return None;
        }
        let text = std::str::from_utf8(rest.get(start..start + digits)?).ok()?;
        let code = u32::from_str_radix(text, radix).ok()?;
        let c = char::from_u32(code)?;
        let mut used = 1 + start + digits;
        if rest.get(start + digits) == Some(&b';') {
            used += 1;
        }
        return Some((c, used));
    }
    let name_len = rest
        .iter()
        .take(MAX_ENTITY_LEN)
        .take_while(|b| b.is_ascii_alphanumeric())
        .count();
    let name = std::str::from_utf8(rest.get(..name_len)?).ok()?;
    let with_semi = rest.get(name_len) == Some(&b';');
    let (_, c) = NAMED.iter().find(|(n, _)| *n == name)?;
    if with_semi {
        Some((*c, name_len + 2))
    } else if ["amp", "lt", "gt", "quot", "AMP", "LT", "GT", "QUOT"].contains(&name) {
        Some((*c, name_len + 1))
    } else {
        None
    }
}

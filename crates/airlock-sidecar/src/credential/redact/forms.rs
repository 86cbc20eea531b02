//! The forms of a secret searched for in each view, and the HTML character
//! references the HTML view decodes.
//!
//! What encoders write is undone by the views ([`super::view`]); what
//! remains is searched for as the secret itself, ASCII case ignored (a
//! value in a host name comes back lower-cased), and, for a secret with a
//! space, with `+` for it (form encoding, which no view undoes, since a `+`
//! is also a `+`).

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

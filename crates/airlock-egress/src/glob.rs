//! The wildcard matcher behind `authorized_uris` hosts and paths.
//!
//! Hand-written because the semantics are ours (docs/egress.md): in a host, `*`
//! and `**` match one or more characters (one or more labels); in a path, `*`
//! matches within one segment (never `/` or `?`) and `**` matches anything,
//! including `/` and the query. Matching simulates the pattern as an NFA over
//! a bitset of positions, so its cost is linear in the target whatever the
//! pattern: no backtracking blow-up on hostile input.

/// Longest compiled pattern (elements). Longer patterns are rejected at load.
pub const MAX_ELEMENTS: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum El {
    Byte(u8),
    /// Exactly one byte that is not `/` or `?`.
    One,
    /// Zero or more bytes that are not `/` or `?`.
    SegStar,
    /// Zero or more bytes.
    AnyStar,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    els: Vec<El>,
    /// Set when the glob has no wildcard: plain equality.
    literal: Option<String>,
    /// Set when the glob is `literal` followed by one trailing `**`.
    prefix: Option<String>,
    /// Host globs of the form `*` + literal: one or more bytes, then the literal.
    suffix: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Host,
    Path,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLong;

impl Glob {
    pub fn compile(src: &str, kind: Kind) -> Result<Glob, TooLong> {
        let b = src.as_bytes();
        let mut els = Vec::with_capacity(b.len());
        let mut i = 0;
        let mut wild = false;
        while i < b.len() {
            if b[i] == b'*' {
                wild = true;
                let double = b.get(i + 1) == Some(&b'*');
                i += if double { 2 } else { 1 };
                match kind {
                    Kind::Host => {
                        els.push(El::One);
                        els.push(El::SegStar);
                    }
                    Kind::Path if double => els.push(El::AnyStar),
                    Kind::Path => els.push(El::SegStar),
                }
            } else {
                els.push(El::Byte(b[i]));
                i += 1;
            }
        }
        if els.len() > MAX_ELEMENTS {
            return Err(TooLong);
        }
        let literal = (!wild).then(|| src.to_owned());
        let prefix = src
            .strip_suffix("**")
            .filter(|p| !p.contains('*') && kind == Kind::Path)
            .map(str::to_owned);
        let suffix = src
            .strip_prefix("**")
            .or_else(|| src.strip_prefix('*'))
            .filter(|rest| !rest.contains('*') && kind == Kind::Host)
            .map(str::to_owned);
        Ok(Glob {
            els,
            literal,
            prefix,
            suffix,
        })
    }

    pub fn matches(&self, text: &str) -> bool {
        if let Some(l) = &self.literal {
            return l == text;
        }
        if let Some(p) = &self.prefix {
            return text.starts_with(p.as_str());
        }
        if let Some(sfx) = &self.suffix {
            return text.len() > sfx.len() && text.ends_with(sfx.as_str());
        }
        if self.els.len() < 64 {
            return self.simulate_small(text.as_bytes());
        }
        self.simulate(text.as_bytes())
    }

    fn simulate(&self, text: &[u8]) -> bool {
        let n = self.els.len();
        let mut cur = Bits::default();
        let mut next = Bits::default();
        cur.set(0);
        self.close(&mut cur);
        for &c in text {
            next.clear();
            let sep = c == b'/' || c == b'?';
            let mut any = false;
            for i in cur.iter(n) {
                match self.els[i] {
                    El::Byte(b) if b == c => next.set(i + 1),
                    El::One if !sep => next.set(i + 1),
                    El::SegStar if !sep => next.set(i),
                    El::AnyStar => next.set(i),
                    _ => continue,
                }
                any = true;
            }
            if !any {
                return false;
            }
            self.close(&mut next);
            std::mem::swap(&mut cur, &mut next);
        }
        cur.get(n)
    }

    /// The same automaton in one machine word, for patterns under 64 elements.
    fn simulate_small(&self, text: &[u8]) -> bool {
        let n = self.els.len();
        let close = |mut bits: u64| {
            for (i, el) in self.els.iter().enumerate() {
                if bits & (1 << i) != 0 && matches!(el, El::SegStar | El::AnyStar) {
                    bits |= 1 << (i + 1);
                }
            }
            bits
        };
        let mut cur = close(1);
        for &c in text {
            let sep = c == b'/' || c == b'?';
            let mut next = 0u64;
            let mut live = cur & !(1 << n);
            while live != 0 {
                let i = live.trailing_zeros() as usize;
                live &= live - 1;
                next |= match self.els[i] {
                    El::Byte(b) if b == c => 1 << (i + 1),
                    El::One if !sep => 1 << (i + 1),
                    El::SegStar if !sep => 1 << i,
                    El::AnyStar => 1 << i,
                    _ => 0,
                };
            }
            if next == 0 {
                return false;
            }
            cur = close(next);
        }
        cur & (1 << n) != 0
    }

    /// Epsilon closure: a star may match nothing.
    fn close(&self, bits: &mut Bits) {
        for i in 0..self.els.len() {
            if bits.get(i) && matches!(self.els[i], El::SegStar | El::AnyStar) {
                bits.set(i + 1);
            }
        }
    }
}

/// Positions 0..=MAX_ELEMENTS.
#[derive(Default, Clone, Copy)]
struct Bits([u64; MAX_ELEMENTS / 64 + 1]);

impl Bits {
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
    fn get(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn clear(&mut self) {
        self.0 = [0; MAX_ELEMENTS / 64 + 1];
    }
    fn iter(&self, n: usize) -> impl Iterator<Item = usize> + '_ {
        self.0
            .iter()
            .enumerate()
            .flat_map(move |(w, &word)| {
                let mut word = word;
                std::iter::from_fn(move || {
                    if word == 0 {
                        return None;
                    }
                    let bit = word.trailing_zeros() as usize;
                    word &= word - 1;
                    Some(w * 64 + bit)
                })
            })
            .filter(move |&i| i < n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(p: &str, t: &str) -> bool {
        Glob::compile(p, Kind::Host).unwrap().matches(t)
    }
    fn path(p: &str, t: &str) -> bool {
        let g = Glob::compile(p, Kind::Path).unwrap();
        if g.els.len() < 64 {
            let (small, big) = (g.simulate_small(t.as_bytes()), g.simulate(t.as_bytes()));
            assert_eq!(small, big, "{p} vs {t}: the two automata disagree");
        }
        g.matches(t)
    }

    #[test]
    fn host_wildcards_match_one_or_more_labels() {
        assert!(host("*.example.com", "a.example.com"));
        assert!(host("*.example.com", "a.b.example.com"));
        assert!(!host("*.example.com", "example.com"));
        assert!(!host("*.example.com", "evilexample.com"));
        assert!(host("**.example.com", "a.b.example.com"));
        assert!(host("api*.io", "api2.io"));
        assert!(!host("api*.io", "api.io"));
        assert!(host("api.*.example.com", "api.eu.example.com"));
    }

    #[test]
    fn path_wildcards() {
        assert!(path("/repos/*/issues", "/repos/x/issues"));
        assert!(!path("/repos/*/issues", "/repos/x/y/issues"));
        assert!(!path("/repos/*", "/repos/x?page=2"));
        assert!(path("/repos/**", "/repos/x/y?page=2"));
        assert!(path("/**", "/"));
        assert!(path("/a/**/z", "/a/b/c/z"));
        assert!(path("/a/**/z", "/a//z"));
        assert!(!path("/a/**/z", "/a/z"));
        assert!(path("/v1/*.json", "/v1/x.json"));
        assert!(!path("/v1", "/v1/"));
        assert!(path("/x/*/y/**", "/x/1/y/2/3?q"));
    }

    #[test]
    fn hostile_patterns_stay_linear() {
        let p = "/".to_owned() + &"*a".repeat(100);
        let t = "/".to_owned() + &"a".repeat(10_000) + "b";
        assert!(!path(&p, &t));
        let p = "/**a**a**a**a**a**a**a**a**a**a**a**b";
        assert!(!path(p, &("/".to_owned() + &"a".repeat(10_000))));
    }

    #[test]
    fn too_long_is_refused() {
        assert_eq!(
            Glob::compile(&"a".repeat(MAX_ELEMENTS + 1), Kind::Path),
            Err(TooLong)
        );
    }
}

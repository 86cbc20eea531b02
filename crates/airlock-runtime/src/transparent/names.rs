//! The run's synthetic address book: one address of the synthetic range
//! per name asked, fixed for the run.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Mutex;

use airlock_platform_api::transparent::{SYNTHETIC_NET, SYNTHETIC_PREFIX};

/// Why a name got no address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("not a host name")]
    NotAHostName,
    #[error("the run's synthetic addresses are all issued")]
    Exhausted,
}

#[derive(Default)]
struct Book {
    by_name: HashMap<String, Ipv4Addr>,
}

/// Names and their synthetic addresses.
#[derive(Default)]
pub struct Names(Mutex<Book>);

/// How many addresses the range holds, its first and last left out.
fn capacity() -> u32 {
    (1u32 << (32 - u32::from(SYNTHETIC_PREFIX))) - 2
}

/// `name` lowercased without its trailing dot, if it is a host name (the
/// sidecar's guard parses it again; this only keeps the book clean): 1-253
/// characters of letters, digits, `-`, `_` and dots, no empty label, not
/// an address literal.
pub fn canonical(name: &str) -> Option<String> {
    let n = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let ok = !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        && n.parse::<Ipv4Addr>().is_err()
        // `1.2.3` and friends: an all-numeric last label is never a name.
        && !n.rsplit('.').next().is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    ok.then_some(n)
}

impl Names {
    /// The address of `name`, issued now if it has none and fewer than
    /// `limit` names have one; and the canonical name when it is new.
    pub fn issue(&self, name: &str, limit: usize) -> Result<(Ipv4Addr, Option<String>), NameError> {
        let name = canonical(name).ok_or(NameError::NotAHostName)?;
        let mut book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = book.by_name.get(&name) {
            return Ok((*a, None));
        }
        let n = u32::try_from(book.by_name.len()).map_err(|_| NameError::Exhausted)?;
        if n >= capacity() || book.by_name.len() >= limit {
            return Err(NameError::Exhausted);
        }
        let addr = Ipv4Addr::from(u32::from(SYNTHETIC_NET) + 1 + n);
        book.by_name.insert(name.clone(), addr);
        Ok((addr, Some(name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_platform_api::transparent::is_synthetic;

    #[test]
    fn a_name_keeps_its_address_and_names_get_their_own() {
        let n = Names::default();
        let (a, new) = n.issue("API.example.com.", 9).unwrap();
        assert!(is_synthetic(a));
        assert_eq!(new.as_deref(), Some("api.example.com"));
        assert_eq!(n.issue("api.example.com", 9).unwrap(), (a, None));
        let (b, _) = n.issue("other.example", 9).unwrap();
        assert_ne!(a, b);
        assert!(is_synthetic(b));
    }

    #[test]
    fn only_host_names_are_issued() {
        let n = Names::default();
        for bad in [
            "",
            ".",
            "a..b",
            "10.0.0.1",
            "1.2.3",
            "a b",
            "x/y",
            &"a".repeat(64),
        ] {
            assert_eq!(n.issue(bad, 9), Err(NameError::NotAHostName), "{bad:?}");
        }
        assert!(n.issue("_srv.example", 9).is_ok());
        assert_eq!(n.issue("one.more", 1), Err(NameError::Exhausted));
    }
}

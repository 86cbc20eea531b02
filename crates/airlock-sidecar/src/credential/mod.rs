//! The one credential path of the sidecar: every site that uses a
//! connection's credential (`api_call`, remote MCP servers, the
//! intercepting proxy and the local runners' proxies) fetches it through
//! [`fetch`] (one refusal mapping), delivers it through [`deliver`] and
//! redacts what comes back with the integration's [`Redactor`], built once
//! per set of values by the run's [`Credentials`].

pub mod deliver;
pub mod fetch;
pub mod redact;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_platform_api::wire::CredentialFields;
use secrecy::ExposeSecret;
use secrecy::zeroize::Zeroizing;

pub use fetch::{CredentialError, Fetched};
pub use redact::{MIN_REDACT_LEN, REDACTED, Redactor, StreamRedactor, unreadable_coding};

/// The values of one integration's credential the run has seen, kept so
/// that an answer is redacted of an earlier value too (a credential
/// rotated during the run, stored upstream before it was).
pub const MAX_VALUES_KEPT: usize = 32;

/// How long the values of an integration's last fetch alone redact the
/// answers to requests that do not carry its credential ([`Credentials::recent`]):
/// within it such a request costs no fetch. A request that carries the
/// credential always fetches it. What this gives up: a value rotated less
/// than this long ago, and put upstream by something other than this run
/// (whose own injections fetch it), could come back unredacted until the
/// next fetch.
pub const REDACT_HOLD: Duration = Duration::from_secs(5);

/// Each integration's credential values seen by this run (at most
/// [`MAX_VALUES_KEPT`] per integration, the oldest forgotten first; one
/// entry per integration of the run's configuration) and the redactor built
/// from them, rebuilt only when a value not seen before arrives.
#[derive(Default)]
pub struct Credentials {
    seen: Mutex<foldhash::HashMap<String, Seen>>,
}

#[derive(Default)]
struct Seen {
    values: VecDeque<Zeroizing<String>>,
    redactor: Redactor,
    /// When the platform last gave a value of this integration.
    fetched: Option<Instant>,
}

impl Credentials {
    /// The redactor of `namespace` once `fields` are among its values.
    pub fn redactor(&self, namespace: &str, fields: &CredentialFields) -> Redactor {
        // Nothing that holds this lock can panic; a poisoned lock still
        // holds a whole value.
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let entry = match seen.get_mut(namespace) {
            Some(e) => e,
            None => seen.entry(namespace.to_owned()).or_default(),
        };
        entry.fetched = Some(Instant::now());
        let mut changed = false;
        for v in fields.values() {
            let v = v.expose_secret();
            if v.len() < MIN_REDACT_LEN || entry.values.iter().any(|k| k.as_str() == v) {
                continue;
            }
            if entry.values.len() >= MAX_VALUES_KEPT {
                entry.values.pop_front();
            }
            entry.values.push_back(Zeroizing::new(v.to_owned()));
            changed = true;
        }
        if changed {
            entry.redactor = Redactor::new(entry.values.iter().map(|v| v.as_str()));
        }
        entry.redactor.clone()
    }

    /// The redactor of `namespace` from the values seen so far, if the
    /// platform gave one less than `hold` ago ([`REDACT_HOLD`]).
    pub fn recent(&self, namespace: &str, hold: Duration) -> Option<Redactor> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let entry = seen.get(namespace)?;
        (entry.fetched?.elapsed() < hold).then(|| entry.redactor.clone())
    }

    /// The redactor of `namespace` from the values seen so far (none when
    /// it was never fetched).
    pub fn known(&self, namespace: &str) -> Redactor {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(namespace)
            .map(|e| e.redactor.clone())
            .unwrap_or_default()
    }
}

/// A shared handle (the sidecar's state holds one).
pub type SharedCredentials = Arc<Credentials>;

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::SecretString;

    fn fields(v: &str) -> CredentialFields {
        CredentialFields::from([("token".to_owned(), SecretString::from(v.to_owned()))])
    }

    /// One redactor per set of values: the same values give the same
    /// automaton; a rotated value is added (the old one still redacted);
    /// past the bound the oldest is forgotten.
    #[test]
    fn a_redactor_is_built_once_per_set_of_values_and_keeps_a_bounded_history() {
        let c = Credentials::default();
        assert!(c.known("svc").is_empty());
        let a = c.redactor("svc", &fields("first-secret"));
        let again = c.redactor("svc", &fields("first-secret"));
        assert!(a.shares_automaton_with(&again));
        let rotated = c.redactor("svc", &fields("second-secret"));
        assert_eq!(
            rotated.str("first-secret second-secret"),
            "[REDACTED] [REDACTED]"
        );
        assert_eq!(c.known("svc").str("second-secret"), "[REDACTED]");
        // Another integration's values are its own.
        assert_eq!(
            c.redactor("other", &fields("third-secret"))
                .str("first-secret"),
            "first-secret"
        );
        for i in 0..MAX_VALUES_KEPT {
            c.redactor("svc", &fields(&format!("value-{i:04}")));
        }
        let last = c.known("svc");
        assert_eq!(last.str("first-secret"), "first-secret");
        assert_eq!(last.str("value-0000"), "[REDACTED]");
    }

    /// Values redact without a fetch only while the last fetch is recent;
    /// an integration never fetched has none.
    #[test]
    fn a_recent_fetch_redacts_for_the_hold_and_no_longer() {
        let c = Credentials::default();
        assert!(c.recent("svc", REDACT_HOLD).is_none());
        c.redactor("svc", &fields("held-secret"));
        let held = c.recent("svc", REDACT_HOLD).expect("fetched just now");
        assert_eq!(held.str("a held-secret b"), "a [REDACTED] b");
        assert!(c.recent("svc", Duration::ZERO).is_none());
        assert!(c.recent("other", REDACT_HOLD).is_none());
    }
}

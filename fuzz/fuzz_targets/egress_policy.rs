//! Pattern parsing + URL matching + the policy decision, on arbitrary input.
//!
//! Input: up to four `authorized_uris` entries and a target URL, separated
//! by newlines (the last line is the URL). Invariants checked beyond "no
//! panic, no hang":
//! - canonicalisation is idempotent: a parsed target re-parses to itself;
//! - a credentialed call (a request of any method, or a tunnel) is allowed
//!   only through an entry that matches the target and may carry a
//!   credential to its host;
//! - a redirect `Location` resolved against a target parses or fails typed.
#![no_main]

use airlock_egress::{AuthorizedUris, CallRules, EgressPolicy, Intent, Target};
use http::Method;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut lines: Vec<&str> = text.split('\n').collect();
    let Some(url) = lines.pop() else { return };
    lines.truncate(4);
    let list = AuthorizedUris::parse(&lines);
    let policy = EgressPolicy::new();
    let Ok(target) = Target::parse(url) else { return };
    let again = Target::parse(target.url().as_str()).expect("a canonical target re-parses");
    assert_eq!(again.url(), target.url(), "canonicalisation is not idempotent for {url:?}");
    assert_eq!(again.host(), target.host());
    let intents = [Intent::Request(&Method::GET), Intent::Request(&Method::POST), Intent::Tunnel];
    for (credentialed, intent) in [true, false].into_iter().flat_map(|c| intents.map(|i| (c, i))) {
        let rules = CallRules { authorized: &list, allow_all_uris: !credentialed, credentialed };
        if policy.check(&target, intent, &rules).is_ok() && credentialed {
            assert!(
                list.entries().iter().any(|p| p.matches(&target) && p.carries_credential_to(&target)),
                "credentialed call allowed without a carrying entry: {url:?} {lines:?}"
            );
        }
    }
    if let Some(first) = lines.first() {
        let _ = target.join(first);
    }
});

//! A missing peer: a failure under `CI`, a counted skip elsewhere.

use std::fmt::Display;
use std::sync::{Mutex, Once};

/// The skips of this process, one line each (`<test>: <peer>: <why>`).
static SKIPS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// `found` is what looking for `peer` gave. Present: its value. Missing:
/// under `CI` (set to anything) the calling test fails, since CI installs
/// every peer; elsewhere it prints `SKIPPED: <test>: <peer>: <why>`, counts
/// the skip (summed up at process exit) and returns `None`, and the caller
/// returns without asserting anything.
///
/// `<test>` is the calling thread's name, which libtest sets to the test's
/// path (`tokio::test` runs the test body on that thread too).
pub fn require_peer<T, E: Display>(peer: &str, found: Result<T, E>) -> Option<T> {
    let why = match found {
        Ok(v) => return Some(v),
        Err(why) => why,
    };
    if std::env::var_os("CI").is_some() {
        panic!("{peer} is required under CI (.ci/run provides it): {why}");
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed thread)")
        .to_owned();
    let line = format!("{test}: {peer}: {why}");
    eprintln!("\n*** SKIPPED: {line} ***\n");
    SKIPS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(line);
    static SUMMARY: Once = Once::new();
    SUMMARY.call_once(|| crate::sys::at_exit(print_summary));
    None
}

/// The skips of this process, printed once at its exit (to stderr, which
/// libtest does not capture outside a test).
fn print_summary() {
    let skips = SKIPS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if skips.is_empty() {
        return;
    }
    eprintln!(
        "\n*** {} test(s) SKIPPED for a missing peer (a failure under CI): ***",
        skips.len()
    );
    for s in skips.iter() {
        eprintln!("***   SKIPPED: {s}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_present_peer_gives_its_value() {
        assert_eq!(require_peer("x", Ok::<_, String>(7)), Some(7));
    }

    #[test]
    fn a_missing_peer_fails_under_ci_and_is_counted_elsewhere() {
        if std::env::var_os("CI").is_some() {
            let r = std::panic::catch_unwind(|| require_peer::<(), _>("x", Err("gone")));
            assert!(r.is_err(), "a missing peer must fail under CI");
            return;
        }
        assert_eq!(require_peer::<(), _>("a peer", Err("gone")), None);
        let mut skips = SKIPS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let this = |s: &String| {
            s.ends_with("a_missing_peer_fails_under_ci_and_is_counted_elsewhere: a peer: gone")
        };
        assert!(skips.iter().any(this), "{skips:?}");
        // Not a real skip: left out of the summary at exit.
        skips.retain(|s| !this(s));
    }
}

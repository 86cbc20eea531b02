//! The forward proxy's request-head parser on arbitrary bytes.
//!
//! Beyond "no panic, no hang", checks the invariants the proxy relies on:
//! - an accepted head never carries CR, LF or NUL in a header value, never
//!   has both `Content-Length` and `Transfer-Encoding`, and at most one Host;
//! - CONNECT has an authority target and no body, other methods an
//!   absolute http(s) target;
//! - the canonical form (what the proxy hands hyper) re-parses to the same
//!   head: the proxy and hyper cannot disagree on a head the proxy accepted;
//! - the reported head length lies within the input and ends in CRLFCRLF.
#![no_main]

use airlock_sidecar::proxy::head::{BodyFraming, MAX_HEAD_BYTES, RequestTarget, parse_head};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(Some(head)) = parse_head(data) else {
        return;
    };
    assert!(head.len <= data.len());
    assert!(data[..head.len].ends_with(b"\r\n\r\n"));
    for (_, v) in &head.headers {
        assert!(
            !v.as_bytes()
                .iter()
                .any(|&b| b == b'\r' || b == b'\n' || b == 0)
        );
    }
    assert!(
        !(head.headers.contains_key("content-length")
            && head.headers.contains_key("transfer-encoding"))
    );
    assert!(head.headers.get_all("host").iter().count() <= 1);
    match (&head.target, head.method.as_str() == "CONNECT") {
        (RequestTarget::Authority(_), true) => {
            assert!(matches!(
                head.body,
                BodyFraming::None | BodyFraming::Length(0)
            ))
        }
        (RequestTarget::Absolute(t), false) => {
            let l = t.to_ascii_lowercase();
            assert!(l.starts_with("http://") || l.starts_with("https://"));
        }
        other => panic!("target/method mismatch: {other:?}"),
    }
    let canon = head.serialize();
    if canon.len() > MAX_HEAD_BYTES {
        // Canonical spacing can grow a head that was just under the limit.
        return;
    }
    let again = parse_head(&canon)
        .expect("canonical head re-parses")
        .expect("canonical head is complete");
    assert_eq!(again.method, head.method);
    assert_eq!(again.target, head.target);
    assert_eq!(again.http10, head.http10);
    assert_eq!(again.headers, head.headers);
    assert_eq!(again.body, head.body);
    assert_eq!(again.len, canon.len());
});

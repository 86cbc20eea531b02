//! Webhook signing (docs/serve.md), one definition for both ends: the
//! server signs each delivery with [`sign`]; a receiver checks it with
//! [`verify`]. The header is
//! `Airlock-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`,
//! the MAC over the exact bytes of the body.

use hmac::{KeyInit as _, Mac as _};

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "airlock-signature";

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

fn mac(secret: &[u8], t: &str, body: &[u8]) -> HmacSha256 {
    let mut mac = match HmacSha256::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// `t=…,v1=…` for `body` at `t` (Unix seconds) under `secret`.
pub fn sign(secret: &[u8], t: i64, body: &[u8]) -> String {
    let mac = mac(secret, &t.to_string(), body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// The timestamp of `header` when it is a valid signature of `body` under
/// `secret` (compared in constant time); `None` otherwise. How old a
/// timestamp the receiver accepts is its own tolerance.
pub fn verify(secret: &[u8], header: &str, body: &[u8]) -> Option<i64> {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", x)) => t = Some(x),
            Some(("v1", x)) => v1 = Some(x),
            _ => {}
        }
    }
    let (t, want) = (t?, hex::decode(v1?).ok()?);
    mac(secret, t, body).verify_slice(&want).ok()?;
    t.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moved from the server's webhooks: the MAC is over `"<t>.<body>"`.
    #[test]
    fn the_signature_is_over_timestamp_and_body() {
        let s = sign(b"whsec_x", 1700000000, b"{}");
        assert!(s.starts_with("t=1700000000,v1="));
        assert_ne!(s, sign(b"whsec_x", 1700000001, b"{}"));
        assert_ne!(s, sign(b"whsec_x", 1700000000, b"{ }"));
        assert_ne!(s, sign(b"whsec_y", 1700000000, b"{}"));
        // RFC 4231-style known answer: HMAC-SHA256("key", "1.x")
        let known = sign(b"key", 1, b"x");
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"key").unwrap();
        mac.update(b"1.x");
        assert_eq!(
            known,
            format!("t=1,v1={}", hex::encode(mac.finalize().into_bytes()))
        );
    }

    /// What a receiver checks: the signature verifies under its secret and
    /// body only, and a forged timestamp or a malformed header does not.
    #[test]
    fn a_signature_verifies_and_nothing_else_does() {
        let s = sign(b"whsec_x", 1700000000, b"{}");
        assert_eq!(verify(b"whsec_x", &s, b"{}"), Some(1700000000));
        for (secret, header, body) in [
            (&b"whsec_y"[..], s.as_str(), &b"{}"[..]),
            (b"whsec_x", &s, b"{ }"),
            (
                b"whsec_x",
                &s.replace("t=1700000000", "t=1700000001"),
                b"{}",
            ),
            (b"whsec_x", "", b"{}"),
            (b"whsec_x", "t=1", b"{}"),
            (b"whsec_x", "v1=00", b"{}"),
            (b"whsec_x", "t=1,v1=zz", b"{}"),
        ] {
            assert_eq!(verify(secret, header, body), None, "{header}");
        }
    }
}

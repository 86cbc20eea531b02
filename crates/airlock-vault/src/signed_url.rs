//! Short-lived signed URLs (`UPLOAD_SIGNING_SECRET`): whoever holds the URL
//! may read the one resource it names until it expires, without an API key.
//!
//! The signature is the keyring's lowercase hex HMAC-SHA256 of
//! `"<resource>\n<expires>"`, where `expires` is a Unix time in seconds: the
//! resource and its expiry are both signed, so neither can be changed
//! without the signature failing. Verification tries every secret of the
//! keyring, each comparison constant-time ([`SigningKeyring::verify`]).

use crate::SigningKeyring;

/// The longest a signed URL may live (one hour): a URL is short-lived by
/// construction, whatever its caller asks.
pub const MAX_SIGNED_URL_SECONDS: i64 = 3600;

/// Why a signed URL was refused: one variant per check, in the order they run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignedUrlError {
    /// The signature is not 64 lowercase hex characters.
    #[error("the signature is malformed (64 lowercase hex characters expected)")]
    Malformed,
    /// The URL's expiry has passed.
    #[error("the signed URL expired at {expires} (now {now})")]
    Expired { expires: i64, now: i64 },
    /// The expiry is further away than [`MAX_SIGNED_URL_SECONDS`]: no URL
    /// this signer made says so.
    #[error("the signed URL claims to live longer than {MAX_SIGNED_URL_SECONDS} s")]
    TooLong,
    /// The signature is not this resource's and expiry's under any secret.
    #[error("the signature does not match the resource and its expiry")]
    Mismatch,
}

/// Signs and verifies URLs with one keyring.
#[derive(Debug, Clone)]
pub struct UrlSigner {
    keys: SigningKeyring,
}

/// A signed URL's query: its expiry (Unix seconds) and signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlSignature {
    pub expires: i64,
    pub signature: String,
}

fn message(resource: &str, expires: i64) -> Vec<u8> {
    format!("{resource}\n{expires}").into_bytes()
}

impl UrlSigner {
    pub fn new(keys: SigningKeyring) -> Self {
        Self { keys }
    }

    /// The signature of `resource` valid until `now + ttl` seconds (`ttl`
    /// clamped to 1..=[`MAX_SIGNED_URL_SECONDS`]).
    pub fn sign(&self, resource: &str, now: i64, ttl: i64) -> UrlSignature {
        let expires = now.saturating_add(ttl.clamp(1, MAX_SIGNED_URL_SECONDS));
        UrlSignature {
            expires,
            signature: self.keys.sign(&message(resource, expires)),
        }
    }

    /// Whether `sig` lets its holder read `resource` at `now`.
    pub fn verify(
        &self,
        resource: &str,
        sig: &UrlSignature,
        now: i64,
    ) -> Result<(), SignedUrlError> {
        let s = sig.signature.as_bytes();
        if s.len() != 64 || !s.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(SignedUrlError::Malformed);
        }
        if sig.expires <= now {
            return Err(SignedUrlError::Expired {
                expires: sig.expires,
                now,
            });
        }
        if sig.expires - now > MAX_SIGNED_URL_SECONDS {
            return Err(SignedUrlError::TooLong);
        }
        if !self
            .keys
            .verify(&message(resource, sig.expires), &sig.signature)
        {
            return Err(SignedUrlError::Mismatch);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ENV_UPLOAD_SIGNING_SECRET;

    fn signer(v: &str) -> UrlSigner {
        UrlSigner::new(SigningKeyring::parse(ENV_UPLOAD_SIGNING_SECRET, v).unwrap())
    }

    #[test]
    fn a_signed_url_reads_its_resource_until_it_expires() {
        let s = signer("0123456789abcdef-one");
        let sig = s.sign("runs/run_1/artifacts/out.txt", 1000, 60);
        assert_eq!(sig.expires, 1060);
        assert_eq!(s.verify("runs/run_1/artifacts/out.txt", &sig, 1059), Ok(()));
        assert_eq!(
            s.verify("runs/run_1/artifacts/out.txt", &sig, 1060),
            Err(SignedUrlError::Expired {
                expires: 1060,
                now: 1060
            })
        );
    }

    #[test]
    fn another_resource_a_moved_expiry_or_a_changed_signature_is_refused() {
        let s = signer("0123456789abcdef-one");
        let sig = s.sign("runs/run_1/artifacts/a", 1000, 60);
        let other = "runs/run_2/artifacts/a";
        assert_eq!(s.verify(other, &sig, 1001), Err(SignedUrlError::Mismatch));
        let later = UrlSignature {
            expires: sig.expires + 1,
            ..sig.clone()
        };
        assert_eq!(
            s.verify("runs/run_1/artifacts/a", &later, 1001),
            Err(SignedUrlError::Mismatch)
        );
        let mut flipped = sig.signature.clone().into_bytes();
        flipped[0] = if flipped[0] == b'0' { b'1' } else { b'0' };
        let flipped = UrlSignature {
            signature: String::from_utf8(flipped).unwrap(),
            ..sig.clone()
        };
        assert_eq!(
            s.verify("runs/run_1/artifacts/a", &flipped, 1001),
            Err(SignedUrlError::Mismatch)
        );
        let upper = UrlSignature {
            signature: sig.signature.to_uppercase(),
            ..sig.clone()
        };
        assert_eq!(
            s.verify("runs/run_1/artifacts/a", &upper, 1001),
            Err(SignedUrlError::Malformed)
        );
        // Another deployment's secret signs nothing here.
        let theirs = signer("fedcba9876543210-two").sign("runs/run_1/artifacts/a", 1000, 60);
        assert_eq!(
            s.verify("runs/run_1/artifacts/a", &theirs, 1001),
            Err(SignedUrlError::Mismatch)
        );
    }

    #[test]
    fn lifetimes_are_clamped_and_a_far_expiry_is_refused() {
        let s = signer("0123456789abcdef-one");
        assert_eq!(s.sign("r", 0, 1_000_000).expires, MAX_SIGNED_URL_SECONDS);
        assert_eq!(s.sign("r", 0, -5).expires, 1);
        let far = UrlSignature {
            expires: 10 * MAX_SIGNED_URL_SECONDS,
            signature: "0".repeat(64),
        };
        assert_eq!(s.verify("r", &far, 0), Err(SignedUrlError::TooLong));
    }

    #[test]
    fn a_retired_secret_still_verifies() {
        let old = signer("0123456789abcdef-old");
        let sig = old.sign("r", 0, 60);
        let rotated = signer("0123456789abcdef-new,0123456789abcdef-old");
        assert_eq!(rotated.verify("r", &sig, 1), Ok(()));
    }
}

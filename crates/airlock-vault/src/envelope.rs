//! The `v1:<kid>:<base64(iv ‖ tag ‖ ciphertext)>` envelope: parsing and layout only.
//! Encryption and decryption live in [`crate::Keyring`].

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::VaultError;

/// The envelope version prefix, colon included.
pub const ENVELOPE_VERSION: &str = "v1:";
/// AES-GCM IV (nonce) length: 96 bits.
pub const IV_LEN: usize = 12;
/// AES-GCM tag length: 128 bits.
pub const TAG_LEN: usize = 16;
const MAX_KID_LEN: usize = 32;

/// `^[A-Za-z0-9_-]{1,32}$`
pub fn is_valid_kid(kid: &str) -> bool {
    !kid.is_empty()
        && kid.len() <= MAX_KID_LEN
        && kid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A parsed (not yet authenticated) envelope.
#[derive(Clone, PartialEq, Eq)]
pub struct Envelope<'a> {
    kid: &'a str,
    payload: Vec<u8>,
}

impl std::fmt::Debug for Envelope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envelope")
            .field("kid", &self.kid)
            .field("ciphertext_len", &self.ciphertext().len())
            .finish()
    }
}

/// Shortens attacker-supplied text before it goes into an error message.
pub(crate) fn excerpt(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(MAX).collect();
        out.push('…');
        out
    }
}

impl<'a> Envelope<'a> {
    /// Parses `v1:<kid>:<base64>`. Base64 is decoded strictly (standard alphabet, padding
    /// required, no whitespace, no non-zero trailing bits).
    pub fn parse(s: &'a str) -> Result<Self, VaultError> {
        let kid = Self::kid_of(s)?;
        let b64 = &s[ENVELOPE_VERSION.len() + kid.len() + 1..];
        let payload = STANDARD.decode(b64).map_err(|_| VaultError::BadBase64)?;
        if payload.len() < IV_LEN + TAG_LEN {
            return Err(VaultError::TooShort(payload.len()));
        }
        Ok(Self { kid, payload })
    }

    /// The key id of an envelope, checking only the prefix and the kid (no base64 decode).
    pub fn kid_of(s: &'a str) -> Result<&'a str, VaultError> {
        let rest = s
            .strip_prefix(ENVELOPE_VERSION)
            .ok_or(VaultError::MissingPrefix)?;
        let (kid, _) = rest.split_once(':').ok_or(VaultError::Malformed)?;
        if !is_valid_kid(kid) {
            return Err(VaultError::BadKid(excerpt(kid)));
        }
        Ok(kid)
    }

    /// Builds an envelope from its parts (used by the keyring after encrypting).
    pub(crate) fn format(kid: &str, iv: &[u8], tag: &[u8], ciphertext: &[u8]) -> String {
        let mut payload = Vec::with_capacity(iv.len() + tag.len() + ciphertext.len());
        payload.extend_from_slice(iv);
        payload.extend_from_slice(tag);
        payload.extend_from_slice(ciphertext);
        let mut out = String::with_capacity(
            ENVELOPE_VERSION.len() + kid.len() + 1 + payload.len().div_ceil(3) * 4,
        );
        out.push_str(ENVELOPE_VERSION);
        out.push_str(kid);
        out.push(':');
        STANDARD.encode_string(&payload, &mut out);
        out
    }

    /// The key id.
    pub fn kid(&self) -> &'a str {
        self.kid
    }

    /// The 12-byte IV.
    pub fn iv(&self) -> &[u8] {
        &self.payload[..IV_LEN]
    }

    /// The 16-byte GCM tag.
    pub fn tag(&self) -> &[u8] {
        &self.payload[IV_LEN..IV_LEN + TAG_LEN]
    }

    /// The ciphertext (same length as the plaintext).
    pub fn ciphertext(&self) -> &[u8] {
        &self.payload[IV_LEN + TAG_LEN..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kid_rule() {
        assert!(is_valid_kid("k1"));
        assert!(is_valid_kid("A-z_09"));
        assert!(is_valid_kid(&"a".repeat(32)));
        assert!(!is_valid_kid(""));
        assert!(!is_valid_kid(&"a".repeat(33)));
        assert!(!is_valid_kid("k 1"));
        assert!(!is_valid_kid("k.1"));
        assert!(!is_valid_kid("kï"));
    }

    #[test]
    fn parse_errors() {
        assert_eq!(
            Envelope::parse("v2:k1:AAAA"),
            Err(VaultError::MissingPrefix)
        );
        assert_eq!(Envelope::parse(""), Err(VaultError::MissingPrefix));
        assert_eq!(Envelope::parse("k1:AAAA"), Err(VaultError::MissingPrefix));
        assert_eq!(Envelope::parse("v1:k1"), Err(VaultError::Malformed));
        assert!(matches!(
            Envelope::parse("v1::AAAA"),
            Err(VaultError::BadKid(_))
        ));
        assert!(matches!(
            Envelope::parse("v1:k/1:AAAA"),
            Err(VaultError::BadKid(_))
        ));
        let long = format!("v1:{}:AAAA", "a".repeat(33));
        assert!(matches!(Envelope::parse(&long), Err(VaultError::BadKid(_))));
        // not base64 / not padded / whitespace / url-safe alphabet / non-canonical bits
        for bad in [
            "v1:k1:@@@@",
            "v1:k1:AAA",
            "v1:k1:AA AA",
            "v1:k1:AA-_",
            "v1:k1:AB==",
        ] {
            assert_eq!(Envelope::parse(bad), Err(VaultError::BadBase64), "{bad}");
        }
        // 27 bytes decoded: too short
        let short = format!("v1:k1:{}", STANDARD.encode([0u8; 27]));
        assert_eq!(Envelope::parse(&short), Err(VaultError::TooShort(27)));
        let ok = format!("v1:k1:{}", STANDARD.encode([0u8; 28]));
        let env = Envelope::parse(&ok).unwrap();
        assert_eq!(env.kid(), "k1");
        assert!(env.ciphertext().is_empty());
    }

    #[test]
    fn layout() {
        let s = Envelope::format("k9", &[1; 12], &[2; 16], &[3; 5]);
        let env = Envelope::parse(&s).unwrap();
        assert_eq!(env.iv(), &[1; 12]);
        assert_eq!(env.tag(), &[2; 16]);
        assert_eq!(env.ciphertext(), &[3; 5]);
    }
}

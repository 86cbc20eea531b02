//! Run tokens, sidecar tokens, randomness and constant-time comparison.

use rand::TryRng as _;
use secrecy::{ExposeSecret as _, SecretString};
use subtle::ConstantTimeEq as _;
use zeroize::Zeroizing;

use crate::{SigningKeyring, VaultError};

/// `n` bytes from the operating system's CSPRNG.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], VaultError> {
    let mut out = [0u8; N];
    rand::rngs::SysRng
        .try_fill_bytes(&mut out)
        .map_err(|_| VaultError::RandomUnavailable)?;
    Ok(out)
}

/// `N` random bytes as lowercase hex (`2N` characters): run ids, test and
/// demo secrets.
pub fn random_hex<const N: usize>() -> Result<String, VaultError> {
    Ok(hex::encode(random_bytes::<N>()?))
}

/// Constant-time equality of a presented value with an operator's secret
/// whose length is its own choice (`METRICS_TOKEN`): the SHA-256 digests are
/// compared, so neither the time nor an early length mismatch says how long
/// the secret is.
pub fn ct_eq_secret(given: &[u8], secret: &[u8]) -> bool {
    use sha2::Digest as _;
    ct_eq(&sha2::Sha256::digest(given), &sha2::Sha256::digest(secret))
}

/// A per-run sidecar token: 32 bytes from the OS CSPRNG, lowercase hex (64 characters).
pub fn generate_sidecar_token() -> Result<SecretString, VaultError> {
    let raw = Zeroizing::new(random_bytes::<32>()?);
    Ok(SecretString::from(hex::encode(*raw)))
}

pub(crate) fn ct_eq_choice(a: &[u8], b: &[u8]) -> subtle::Choice {
    // `ConstantTimeEq` for slices returns 0 at once for different lengths: the length of a
    // secret is not itself secret here (tokens and signatures have fixed, public lengths).
    a.ct_eq(b)
}

/// Constant-time equality for secrets (tokens, signatures, keys).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    ct_eq_choice(a, b).into()
}

/// Issues and verifies run tokens: `<runId>.<lowercase hex HMAC-SHA256(secret, runId)>`.
#[derive(Debug, Clone)]
pub struct RunTokens {
    keyring: SigningKeyring,
}

impl RunTokens {
    /// Wraps a signing keyring (normally from `RUN_TOKEN_SECRET`).
    pub fn new(keyring: SigningKeyring) -> Self {
        Self { keyring }
    }

    /// The token for `run_id`, signed with the first secret.
    pub fn issue(&self, run_id: &str) -> SecretString {
        let sig = Zeroizing::new(self.keyring.sign(run_id.as_bytes()));
        SecretString::from(format!("{run_id}.{}", sig.as_str()))
    }

    /// The run id a token vouches for, if any secret in the keyring signed it.
    pub fn verify(&self, token: &str) -> Option<String> {
        let (run_id, sig) = token.rsplit_once('.')?;
        if run_id.is_empty() {
            return None;
        }
        self.keyring
            .verify(run_id.as_bytes(), sig)
            .then(|| run_id.to_owned())
    }

    /// Whether `token` is valid and vouches for exactly `run_id`.
    pub fn verify_for(&self, token: &SecretString, run_id: &str) -> bool {
        self.verify(token.expose_secret())
            .is_some_and(|id| ct_eq(id.as_bytes(), run_id.as_bytes()))
    }
}

#[cfg(test)]
mod secret_eq_tests {
    use super::ct_eq_secret;

    #[test]
    fn a_secret_matches_itself_only() {
        assert!(ct_eq_secret(b"operator-token", b"operator-token"));
        assert!(!ct_eq_secret(b"operator-toke", b"operator-token"));
        assert!(!ct_eq_secret(b"", b"operator-token"));
        assert!(!ct_eq_secret(b"operator-tokeN", b"operator-token"));
    }
}

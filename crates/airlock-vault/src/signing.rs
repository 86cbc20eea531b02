//! HMAC-SHA256 signing keyrings: the first secret signs, every secret verifies.

use hmac::{Hmac, KeyInit as _, Mac as _};
use secrecy::{ExposeSecret as _, SecretString};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::SigningError;

/// Signs run tokens (sidecar → platform).
pub const ENV_RUN_TOKEN_SECRET: &str = "RUN_TOKEN_SECRET";
/// Signs upload URLs.
pub const ENV_UPLOAD_SIGNING_SECRET: &str = "UPLOAD_SIGNING_SECRET";
/// Signs connect sessions.
pub const ENV_CONNECT_SESSION_SECRET: &str = "CONNECT_SESSION_SECRET";
/// Each secret in a signing keyring is at least this many characters.
pub const MIN_SIGNING_SECRET_LEN: usize = 16;

type HmacSha256 = Hmac<Sha256>;

/// A comma-separated keyring of HMAC secrets. `Debug` shows only the variable and the count.
#[derive(Clone)]
pub struct SigningKeyring {
    var: &'static str,
    secrets: Vec<SecretString>,
}

impl std::fmt::Debug for SigningKeyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKeyring")
            .field("var", &self.var)
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

impl SigningKeyring {
    /// Parses the value of `var` (named in errors). Entries are separated by commas; spaces
    /// around an entry are ignored; each entry must be at least 16 characters.
    pub fn parse(var: &'static str, value: &str) -> Result<Self, SigningError> {
        if value.trim().is_empty() {
            return Err(SigningError::Missing { var });
        }
        let mut secrets = Vec::new();
        for (i, part) in value.split(',').enumerate() {
            let part = part.trim();
            let index = i + 1;
            if part.is_empty() {
                return Err(SigningError::Empty { var, index });
            }
            let len = part.chars().count();
            if len < MIN_SIGNING_SECRET_LEN {
                return Err(SigningError::TooShort { var, index, len });
            }
            secrets.push(SecretString::from(part));
        }
        Ok(Self { var, secrets })
    }

    /// Reads `var` from the process environment.
    pub fn from_env(var: &'static str) -> Result<Self, SigningError> {
        let value = Zeroizing::new(std::env::var(var).unwrap_or_default());
        Self::parse(var, &value)
    }

    /// The variable this keyring came from.
    pub fn var(&self) -> &'static str {
        self.var
    }

    /// How many secrets verify.
    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    /// Never true for a parsed keyring (kept for API symmetry with `len`).
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    fn mac_hex(secret: &SecretString, message: &[u8]) -> Zeroizing<String> {
        // HMAC accepts keys of any length: new_from_slice cannot fail here.
        let mut mac = match HmacSha256::new_from_slice(secret.expose_secret().as_bytes()) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC takes keys of any length"),
        };
        mac.update(message);
        Zeroizing::new(hex::encode(mac.finalize().into_bytes()))
    }

    /// Lowercase hex HMAC-SHA256 of `message` under the first (signing) secret.
    pub fn sign(&self, message: &[u8]) -> String {
        Self::mac_hex(&self.secrets[0], message).to_string()
    }

    /// Whether `signature` (lowercase hex) is the HMAC of `message` under any secret. Every
    /// secret is tried and every comparison is constant-time; uppercase hex does not verify.
    pub fn verify(&self, message: &[u8], signature: &str) -> bool {
        let mut ok = subtle::Choice::from(0u8);
        for secret in &self.secrets {
            let expected = Self::mac_hex(secret, message);
            ok |= crate::token::ct_eq_choice(expected.as_bytes(), signature.as_bytes());
        }
        ok.into()
    }
}

//! `airlock-vault`: everything Airlock does with secrets.
//!
//! - [`Keyring`]: the connection-encryption keyring (`CONNECTION_ENCRYPTION_KEY`,
//!   `CONNECTION_ENCRYPTION_KEY_ID`, `CONNECTION_ENCRYPTION_KEYS`) and the
//!   `v1:<kid>:<base64(iv ‖ tag ‖ ciphertext)>` AES-256-GCM envelope (docs/security.md).
//! - [`SigningKeyring`]: comma-separated HMAC-SHA256 keyrings (`RUN_TOKEN_SECRET`,
//!   `UPLOAD_SIGNING_SECRET`, `CONNECT_SESSION_SECRET`): the first secret signs, all verify.
//! - [`UrlSigner`]: short-lived signed URLs (`UPLOAD_SIGNING_SECRET`): HMAC of the
//!   resource and its expiry, verified in constant time.
//! - [`RunTokens`]: `<runId>.<lowercase hex HMAC-SHA256(secret, runId)>`.
//! - [`IdentityKeyring`]: the ES256 keys that sign each run's workload identity
//!   token (`IDENTITY_SIGNING_KEYS`): the first signs, all are published.
//! - [`generate_sidecar_token`]: 32 bytes from the OS CSPRNG, hex.
//! - [`ct_eq`]: the one constant-time comparison every secret comparison goes through.
//!
//! Secret values are held in [`secrecy`] / [`zeroize`] types: they are wiped on drop and
//! never print through `Debug` or `Display`.

#![forbid(unsafe_code)]

mod envelope;
mod error;
mod identity;
mod keyring;
mod signed_url;
mod signing;
mod token;

pub use envelope::{ENVELOPE_VERSION, Envelope, IV_LEN, TAG_LEN, is_valid_kid};
pub use error::{KeyError, SigningError, VaultError};
pub use identity::{
    ENV_IDENTITY_SIGNING_KEYS, IDENTITY_ALG, IdentityClaims, IdentityKeyError, IdentityKeyring,
    PublicJwk, generate_identity_key,
};
pub use keyring::{
    DEFAULT_KEY_ID, ENV_KEY, ENV_KEY_ID, ENV_RETIRED_KEYS, KEY_LEN, Keyring, generate_key,
};
pub use secrecy::{ExposeSecret, SecretBox, SecretString};
pub use signed_url::{MAX_SIGNED_URL_SECONDS, SignedUrlError, UrlSignature, UrlSigner};
pub use signing::{
    ENV_CONNECT_SESSION_SECRET, ENV_RUN_TOKEN_SECRET, ENV_UPLOAD_SIGNING_SECRET,
    MIN_SIGNING_SECRET_LEN, SigningKeyring,
};
pub use token::{RunTokens, ct_eq, ct_eq_secret, generate_sidecar_token, random_bytes, random_hex};

/// Decrypted secret bytes: zeroized on drop, redacted in `Debug`, no `Display`.
pub type SecretBytes = SecretBox<[u8]>;

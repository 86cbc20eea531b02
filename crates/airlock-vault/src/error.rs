use thiserror::Error;

/// Why an envelope could not be produced or opened.
///
/// Messages name what is wrong and, where an operator can fix it, which variable to set.
/// They never contain key material or plaintext.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VaultError {
    /// The envelope does not start with `v1:`.
    #[error("not a v1 envelope: it must start with \"v1:\"")]
    MissingPrefix,
    /// No `:` after the key id.
    #[error("malformed envelope: expected v1:<kid>:<base64>")]
    Malformed,
    /// The key id does not match `^[A-Za-z0-9_-]{1,32}$`.
    #[error("malformed envelope: bad key id {0:?} (must match ^[A-Za-z0-9_-]{{1,32}}$)")]
    BadKid(String),
    /// The payload is not strict, padded, standard base64.
    #[error("malformed envelope: payload is not valid standard base64 with padding")]
    BadBase64,
    /// The payload decodes to fewer than 28 bytes (iv 12 + tag 16).
    #[error("malformed envelope: payload is {0} bytes, shorter than iv (12) + tag (16)")]
    TooShort(usize),
    /// The envelope was written under a key id this keyring does not hold.
    #[error(
        "envelope key id {0:?} is not in the keyring: set CONNECTION_ENCRYPTION_KEYS to a JSON \
         object holding it (e.g. {{\"{0}\": \"<base64 key>\"}}), or CONNECTION_ENCRYPTION_KEY_ID \
         if it is the active key"
    )]
    UnknownKid(String),
    /// The tag does not verify: wrong key for this kid, or the envelope was altered.
    #[error(
        "envelope under key id {0:?} failed authentication: wrong key for this key id, or the \
         envelope was altered"
    )]
    AuthenticationFailed(String),
    /// The decrypted value is not UTF-8 (only for string accessors).
    #[error("decrypted value is not valid UTF-8")]
    NotUtf8,
    /// The cipher refused to encrypt (plaintext too long for AES-GCM).
    #[error("encryption failed: plaintext too long")]
    EncryptFailed,
    /// The operating system's random number generator failed.
    #[error("the operating system's random number generator failed")]
    RandomUnavailable,
}

/// Why a connection-encryption keyring could not be built.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// `CONNECTION_ENCRYPTION_KEY` is not set (or empty).
    #[error(
        "CONNECTION_ENCRYPTION_KEY is not set: set it to the base64 of 32 random bytes \
         (`airlock keys generate` makes one)"
    )]
    MissingActiveKey,
    /// A key is not valid standard base64.
    #[error("{var}: key {kid:?} is not valid standard base64 with padding")]
    KeyBase64 { var: &'static str, kid: String },
    /// A key does not decode to exactly 32 bytes.
    #[error("{var}: key {kid:?} decodes to {len} bytes; AES-256 needs exactly 32")]
    KeyLength {
        var: &'static str,
        kid: String,
        len: usize,
    },
    /// A key id does not match `^[A-Za-z0-9_-]{1,32}$`.
    #[error("{var}: bad key id {kid:?} (must match ^[A-Za-z0-9_-]{{1,32}}$)")]
    BadKid { var: &'static str, kid: String },
    /// `CONNECTION_ENCRYPTION_KEYS` is not a JSON object of strings.
    #[error("CONNECTION_ENCRYPTION_KEYS must be a JSON object {{\"kid\": \"<base64 key>\"}}: {0}")]
    RetiredJson(String),
    /// A retired key reuses the active kid with a different key.
    #[error(
        "CONNECTION_ENCRYPTION_KEYS holds key id {0:?}, which is the active \
         CONNECTION_ENCRYPTION_KEY_ID, with a different key"
    )]
    ConflictingKid(String),
}

/// Why a signing keyring could not be built.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SigningError {
    /// The variable is unset or holds no secret.
    #[error(
        "{var} is not set: set it to one or more comma-separated secrets of at least 16 characters"
    )]
    Missing { var: &'static str },
    /// An entry is empty (e.g. `a,,b` or a trailing comma).
    #[error("{var}: secret #{index} is empty (check for stray commas)")]
    Empty { var: &'static str, index: usize },
    /// An entry is shorter than 16 characters.
    #[error("{var}: secret #{index} is {len} characters; each must be at least 16")]
    TooShort {
        var: &'static str,
        index: usize,
        len: usize,
    },
}

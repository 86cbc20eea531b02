//! The connection-encryption keyring: one active key that encrypts and decrypts, any number of
//! retired keys that only decrypt.

use std::collections::BTreeMap;

use aes_gcm::AeadInOut as _;
use aes_gcm::{Aes256Gcm, KeyInit as _, Nonce, Tag};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use secrecy::{ExposeSecret as _, SecretString};
use zeroize::{Zeroize as _, Zeroizing};

use crate::envelope::excerpt;
use crate::{Envelope, IV_LEN, KeyError, SecretBytes, VaultError, is_valid_kid, random_bytes};

/// The active key: base64 of exactly 32 bytes.
pub const ENV_KEY: &str = "CONNECTION_ENCRYPTION_KEY";
/// The active key id (default [`DEFAULT_KEY_ID`]).
pub const ENV_KEY_ID: &str = "CONNECTION_ENCRYPTION_KEY_ID";
/// Retired, decrypt-only keys: JSON `{"kid": "<base64 key>"}`.
pub const ENV_RETIRED_KEYS: &str = "CONNECTION_ENCRYPTION_KEYS";
/// The key id used when `CONNECTION_ENCRYPTION_KEY_ID` is unset.
pub const DEFAULT_KEY_ID: &str = "k1";
/// AES-256 key length.
pub const KEY_LEN: usize = 32;

/// What a key-check value authenticates ([`Keyring::key_check`]).
const KEY_CHECK_LABEL: &[u8] = b"airlock key-check v1";

struct KeyEntry {
    cipher: Aes256Gcm,
    raw: Zeroizing<[u8; KEY_LEN]>,
}

/// Keys by id; the active one encrypts. `Debug` shows key ids only.
pub struct Keyring {
    active: String,
    keys: BTreeMap<String, KeyEntry>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("active_kid", &self.active)
            .field("kids", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A fresh random AES-256 key, base64 (what `CONNECTION_ENCRYPTION_KEY` holds).
pub fn generate_key() -> Result<SecretString, VaultError> {
    let raw = Zeroizing::new(random_bytes::<KEY_LEN>()?);
    Ok(SecretString::from(STANDARD.encode(*raw)))
}

fn decode_key(
    var: &'static str,
    kid: &str,
    b64: &str,
) -> Result<Zeroizing<[u8; KEY_LEN]>, KeyError> {
    let bytes = Zeroizing::new(STANDARD.decode(b64).map_err(|_| KeyError::KeyBase64 {
        var,
        kid: kid.to_owned(),
    })?);
    raw_key(var, kid, &bytes)
}

fn raw_key(
    var: &'static str,
    kid: &str,
    bytes: &[u8],
) -> Result<Zeroizing<[u8; KEY_LEN]>, KeyError> {
    let mut raw = Zeroizing::new([0u8; KEY_LEN]);
    if bytes.len() != KEY_LEN {
        return Err(KeyError::KeyLength {
            var,
            kid: kid.to_owned(),
            len: bytes.len(),
        });
    }
    raw.copy_from_slice(bytes);
    Ok(raw)
}

fn check_kid(var: &'static str, kid: &str) -> Result<(), KeyError> {
    if is_valid_kid(kid) {
        Ok(())
    } else {
        Err(KeyError::BadKid {
            var,
            kid: excerpt(kid),
        })
    }
}

impl Keyring {
    /// A keyring with one active key given as raw bytes (must be 32 bytes).
    pub fn new(active_kid: &str, active_key: &[u8]) -> Result<Self, KeyError> {
        check_kid(ENV_KEY_ID, active_kid)?;
        let raw = raw_key(ENV_KEY, active_kid, active_key)?;
        let mut keys = BTreeMap::new();
        keys.insert(active_kid.to_owned(), KeyEntry::new(raw));
        Ok(Self {
            active: active_kid.to_owned(),
            keys,
        })
    }

    /// Adds a retired (decrypt-only) key given as raw bytes. Adding the active kid again with
    /// the same key is a no-op; with a different key it is an error.
    pub fn with_retired(mut self, kid: &str, key: &[u8]) -> Result<Self, KeyError> {
        check_kid(ENV_RETIRED_KEYS, kid)?;
        let raw = raw_key(ENV_RETIRED_KEYS, kid, key)?;
        self.insert_retired(kid, raw)?;
        Ok(self)
    }

    fn insert_retired(&mut self, kid: &str, raw: Zeroizing<[u8; KEY_LEN]>) -> Result<(), KeyError> {
        if let Some(existing) = self.keys.get(kid) {
            if crate::ct_eq(&existing.raw[..], &raw[..]) {
                return Ok(());
            }
            return Err(KeyError::ConflictingKid(kid.to_owned()));
        }
        self.keys.insert(kid.to_owned(), KeyEntry::new(raw));
        Ok(())
    }

    /// Builds the keyring from the three configuration values (as the variables hold them).
    /// `key_id` unset or empty means [`DEFAULT_KEY_ID`]; `retired_json` unset or empty means
    /// no retired keys.
    pub fn from_values(
        key_b64: Option<&str>,
        key_id: Option<&str>,
        retired_json: Option<&str>,
    ) -> Result<Self, KeyError> {
        let key_b64 = key_b64
            .filter(|v| !v.is_empty())
            .ok_or(KeyError::MissingActiveKey)?;
        let kid = key_id.filter(|v| !v.is_empty()).unwrap_or(DEFAULT_KEY_ID);
        check_kid(ENV_KEY_ID, kid)?;
        let raw = decode_key(ENV_KEY, kid, key_b64)?;
        let mut keys = BTreeMap::new();
        keys.insert(kid.to_owned(), KeyEntry::new(raw));
        let mut ring = Self {
            active: kid.to_owned(),
            keys,
        };
        if let Some(json) = retired_json.filter(|v| !v.trim().is_empty()) {
            let map: BTreeMap<String, String> = serde_json::from_str(json).map_err(|e| {
                // serde_json's message may quote a value: report only the category and place.
                let what = match e.classify() {
                    serde_json::error::Category::Io => "read error",
                    serde_json::error::Category::Syntax => "syntax error",
                    serde_json::error::Category::Data => {
                        "wrong shape (expected an object of strings)"
                    }
                    serde_json::error::Category::Eof => "unexpected end of input",
                };
                KeyError::RetiredJson(format!("{what} at line {} column {}", e.line(), e.column()))
            })?;
            // Move every value into a zeroizing holder before anything can fail.
            let map: Vec<(String, Zeroizing<String>)> = map
                .into_iter()
                .map(|(k, v)| (k, Zeroizing::new(v)))
                .collect();
            for (rkid, rkey) in &map {
                check_kid(ENV_RETIRED_KEYS, rkid)?;
                let raw = decode_key(ENV_RETIRED_KEYS, rkid, rkey)?;
                ring.insert_retired(rkid, raw)?;
            }
        }
        Ok(ring)
    }

    /// Builds the keyring through a variable lookup (tests pass a map; [`Keyring::from_env`]
    /// passes the process environment).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, KeyError> {
        let key = lookup(ENV_KEY).map(Zeroizing::new);
        let kid = lookup(ENV_KEY_ID);
        let retired = lookup(ENV_RETIRED_KEYS).map(Zeroizing::new);
        Self::from_values(
            key.as_ref().map(|k| k.as_str()),
            kid.as_deref(),
            retired.as_ref().map(|r| r.as_str()),
        )
    }

    /// Builds the keyring from the process environment.
    pub fn from_env() -> Result<Self, KeyError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The key id new envelopes are written under.
    pub fn active_kid(&self) -> &str {
        &self.active
    }

    /// The key-check value of `kid`'s key: lowercase hex of
    /// HMAC-SHA256(key, "airlock key-check v1"). A store keeps one per key id
    /// it holds envelopes under, so a different key given under the same id
    /// is recognised before anything is written or run. It reveals nothing
    /// of the key.
    pub fn key_check(&self, kid: &str) -> Option<String> {
        use hmac::{KeyInit as _, Mac as _};
        let entry = self.keys.get(kid)?;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(entry.raw.as_slice()).ok()?;
        mac.update(KEY_CHECK_LABEL);
        Some(hex::encode(mac.finalize().into_bytes()))
    }

    /// Every key id this keyring can decrypt.
    pub fn kids(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Encrypts under the active key with a fresh random IV.
    pub fn encrypt(&self, plaintext: &[u8]) -> Result<String, VaultError> {
        let entry = &self.keys[&self.active];
        let iv = random_bytes::<IV_LEN>()?;
        let nonce = Nonce::from(iv);
        let mut buf = Zeroizing::new(plaintext.to_vec());
        let tag = entry
            .cipher
            .encrypt_inout_detached(&nonce, b"", buf.as_mut_slice().into())
            .map_err(|_| VaultError::EncryptFailed)?;
        Ok(Envelope::format(&self.active, &iv, &tag, &buf))
    }

    /// Decrypts an envelope written under any key in the ring.
    pub fn decrypt(&self, envelope: &str) -> Result<SecretBytes, VaultError> {
        let env = Envelope::parse(envelope)?;
        let entry = self
            .keys
            .get(env.kid())
            .ok_or_else(|| VaultError::UnknownKid(env.kid().to_owned()))?;
        let nonce = Nonce::try_from(env.iv()).map_err(|_| VaultError::Malformed)?;
        let tag = Tag::try_from(env.tag()).map_err(|_| VaultError::Malformed)?;
        let mut buf = env.ciphertext().to_vec();
        if entry
            .cipher
            .decrypt_inout_detached(&nonce, b"", buf.as_mut_slice().into(), &tag)
            .is_err()
        {
            buf.zeroize();
            return Err(VaultError::AuthenticationFailed(env.kid().to_owned()));
        }
        Ok(SecretBytes::from(buf))
    }

    /// Decrypts an envelope whose plaintext is UTF-8 text.
    pub fn decrypt_string(&self, envelope: &str) -> Result<SecretString, VaultError> {
        let bytes = self.decrypt(envelope)?;
        match std::str::from_utf8(secrecy::ExposeSecret::expose_secret(&bytes)) {
            Ok(s) => Ok(SecretString::from(s)),
            Err(_) => Err(VaultError::NotUtf8),
        }
    }

    /// Whether an envelope is already written under the active key id.
    pub fn is_current(&self, envelope: &str) -> bool {
        Envelope::kid_of(envelope).is_ok_and(|kid| kid == self.active)
    }

    /// Decrypts and re-encrypts under the active key. `Ok(None)` when the envelope is already
    /// under the active kid (after checking that it authenticates).
    pub fn reencrypt(&self, envelope: &str) -> Result<Option<String>, VaultError> {
        let plain = self.decrypt(envelope)?;
        if self.is_current(envelope) {
            return Ok(None);
        }
        self.encrypt(plain.expose_secret()).map(Some)
    }
}

impl KeyEntry {
    fn new(raw: Zeroizing<[u8; KEY_LEN]>) -> Self {
        let cipher = Aes256Gcm::new(&aes_gcm::Key::<Aes256Gcm>::from(*raw));
        Self { cipher, raw }
    }
}

#[cfg(test)]
mod key_check_tests {
    use super::*;

    #[test]
    fn a_key_check_tells_keys_apart_and_hides_them() {
        let a = Keyring::new("k1", &[1u8; KEY_LEN]).unwrap();
        let b = Keyring::new("k1", &[2u8; KEY_LEN]).unwrap();
        let ca = a.key_check("k1").unwrap();
        assert_eq!(ca, a.key_check("k1").unwrap(), "stable");
        assert_ne!(ca, b.key_check("k1").unwrap(), "another key, another value");
        assert_eq!(ca.len(), 64);
        assert!(!ca.contains(&hex::encode([1u8; KEY_LEN])));
        assert!(a.key_check("k2").is_none());
    }
}

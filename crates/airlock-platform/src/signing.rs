//! Ed25519 signatures of what the platform trusts: the live model catalog
//! ([`crate::catalog`]) and agent bundles. The file formats are in
//! `docs/signing.md`, written so a third party can verify without Airlock.
//!
//! Contracts:
//! - a key's id is the lowercase hex of the first 8 bytes of SHA-256 over
//!   its raw 32-byte public key: derived, never chosen, so a trust list
//!   whose id and key disagree is refused ([`TrustRoot::parse`]);
//! - what is signed is never the content itself but
//!   `"airlock-<purpose>-v1\n" || SHA-256(content)` ([`Purpose`]): a
//!   signature made for one purpose never verifies for another;
//! - verification is `verify_strict` (no small-order keys, no malleable
//!   signatures).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The version of the key and signature files.
pub const SIGNING_SCHEMA_VERSION: u32 = 1;

/// What a signature is for: its domain separation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A model catalog file.
    Catalog,
    /// An agent bundle's manifest.
    Bundle,
    /// A key endorsed by another (a link of a key chain): the content is
    /// the endorsed raw public key.
    Key,
}

impl Purpose {
    fn context(self) -> &'static [u8] {
        match self {
            Purpose::Catalog => b"airlock-catalog-v1\n",
            Purpose::Bundle => b"airlock-bundle-v1\n",
            Purpose::Key => b"airlock-key-v1\n",
        }
    }

    /// The bytes an Ed25519 signature of `content` for this purpose covers.
    pub fn message(self, content: &[u8]) -> Vec<u8> {
        let mut m = self.context().to_vec();
        m.extend_from_slice(&Sha256::digest(content));
        m
    }
}

/// Why a key, a trust list or a signature is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigningError {
    #[error("not a valid key or signature file: {0}")]
    Malformed(String),
    #[error("schema_version {0} is not supported (this Airlock reads {SIGNING_SCHEMA_VERSION})")]
    SchemaVersion(u32),
    #[error("key_id {given:?} does not match its public key (whose id is {derived:?})")]
    KeyIdMismatch { given: String, derived: String },
    #[error("signed by key {0:?}, which is not trusted")]
    UntrustedKey(String),
    #[error("the key chain does not lead to a trusted key: {0}")]
    ChainUntrusted(String),
    #[error("the signature does not verify")]
    BadSignature,
    #[error("no randomness for a new key")]
    Random,
}

fn malformed(e: impl std::fmt::Display) -> SigningError {
    SigningError::Malformed(e.to_string())
}

fn decode<const N: usize>(what: &str, b64: &str) -> Result<[u8; N], SigningError> {
    let raw = STANDARD
        .decode(b64.trim())
        .map_err(|e| malformed(format!("{what}: not base64: {e}")))?;
    raw.try_into()
        .map_err(|v: Vec<u8>| malformed(format!("{what}: {} bytes, not {N}", v.len())))
}

fn check_schema(v: u32) -> Result<(), SigningError> {
    if v != SIGNING_SCHEMA_VERSION {
        return Err(SigningError::SchemaVersion(v));
    }
    Ok(())
}

/// The id of `key` (see the module docs).
pub fn key_id(key: &VerifyingKey) -> String {
    hex::encode(&Sha256::digest(key.as_bytes())[..8])
}

/// A public key with its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    id: String,
    key: VerifyingKey,
}

impl PublicKey {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The raw key, base64.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.key.as_bytes())
    }

    /// From a raw 32-byte key in base64.
    pub fn from_base64(b64: &str) -> Result<PublicKey, SigningError> {
        let key = VerifyingKey::from_bytes(&decode::<32>("public_key", b64)?).map_err(malformed)?;
        Ok(PublicKey {
            id: key_id(&key),
            key,
        })
    }

    /// The public key file's text.
    pub fn to_file(&self) -> String {
        serde_json::to_string_pretty(&KeyEntry {
            key_id: self.id.clone(),
            public_key: self.to_base64(),
        })
        .unwrap_or_default()
    }

    fn from_entry(e: &KeyEntry) -> Result<PublicKey, SigningError> {
        let k = PublicKey::from_base64(&e.public_key)?;
        if k.id != e.key_id {
            return Err(SigningError::KeyIdMismatch {
                given: e.key_id.clone(),
                derived: k.id,
            });
        }
        Ok(k)
    }

    /// Verifies `sig` of `content` for `purpose` by this key.
    pub fn verify(&self, purpose: Purpose, content: &[u8], sig: &[u8; 64]) -> bool {
        let sig = ed25519_dalek::Signature::from_bytes(sig);
        self.key
            .verify_strict(&purpose.message(content), &sig)
            .is_ok()
    }
}

/// One entry of a trust list, and the public key file: `{"key_id": …,
/// "public_key": <base64 of the raw 32 bytes>}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    key_id: String,
    public_key: String,
}

/// The keys a signature may be made by (`AFPS_TRUST_ROOT`,
/// `MODEL_CATALOG_TRUST_ROOT`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustRoot {
    keys: Vec<PublicKey>,
}

impl TrustRoot {
    /// A JSON list of `{"key_id", "public_key"}` (a single public key
    /// file's object is read as a list of one). Every id must match its key.
    pub fn parse(text: &str) -> Result<TrustRoot, SigningError> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(malformed)?;
        let entries: Vec<KeyEntry> = if v.is_object() {
            vec![serde_json::from_value(v).map_err(malformed)?]
        } else {
            serde_json::from_value(v).map_err(malformed)?
        };
        let keys = entries
            .iter()
            .map(PublicKey::from_entry)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TrustRoot { keys })
    }

    pub fn of(keys: Vec<PublicKey>) -> TrustRoot {
        TrustRoot { keys }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn into_keys(self) -> Vec<PublicKey> {
        self.keys
    }

    pub fn get(&self, id: &str) -> Option<&PublicKey> {
        self.keys.iter().find(|k| k.id == id)
    }

    /// Verifies a detached signature of `content`: the signing key must be
    /// in this list, or be endorsed through the signature's key chain by a
    /// key in it, and the signature must verify. Answers the key's id.
    pub fn verify(
        &self,
        purpose: Purpose,
        content: &[u8],
        sig: &Signature,
    ) -> Result<String, SigningError> {
        let key = match self.get(&sig.key_id) {
            Some(k) => k.clone(),
            None if sig.chain.is_empty() => {
                return Err(SigningError::UntrustedKey(sig.key_id.clone()));
            }
            None => self.through_chain(&sig.key_id, &sig.chain)?,
        };
        if !key.verify(purpose, content, &sig.bytes) {
            return Err(SigningError::BadSignature);
        }
        Ok(key.id.clone())
    }

    /// The key `id`, reached through `chain`: each link is endorsed by a
    /// trusted key or by an earlier link, and its endorsement verifies.
    fn through_chain(&self, id: &str, chain: &[Endorsement]) -> Result<PublicKey, SigningError> {
        let untrusted = |why: String| SigningError::ChainUntrusted(why);
        if chain.len() > MAX_CHAIN {
            return Err(untrusted(format!("more than {MAX_CHAIN} links")));
        }
        let mut trusted = self.keys.clone();
        for (i, link) in chain.iter().enumerate() {
            let key = PublicKey::from_entry(&KeyEntry {
                key_id: link.key_id.clone(),
                public_key: link.public_key.clone(),
            })?;
            let by = trusted
                .iter()
                .find(|k| k.id == link.endorsed_by)
                .ok_or_else(|| {
                    untrusted(format!(
                        "link {i}: endorsed by {:?}, which is neither trusted nor an earlier link",
                        link.endorsed_by
                    ))
                })?;
            let sig = decode::<64>("chain signature", &link.signature)?;
            if !by.verify(Purpose::Key, key.key.as_bytes(), &sig) {
                return Err(untrusted(format!(
                    "link {i}: the endorsement of {:?} does not verify",
                    link.key_id
                )));
            }
            trusted.push(key);
        }
        trusted
            .into_iter()
            .find(|k| k.id == id)
            .ok_or_else(|| untrusted(format!("no link endorses the signing key {id:?}")))
    }
}

/// A secret signing key. Its file is `{"schema_version": 1, "key_id": …,
/// "secret_key": <base64 of the 32-byte seed>}`, written mode 0600.
pub struct SecretKey {
    key: SigningKey,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretKeyFile {
    schema_version: u32,
    key_id: String,
    secret_key: String,
}

impl SecretKey {
    /// A new key from the system's randomness.
    pub fn generate() -> Result<SecretKey, SigningError> {
        let seed = airlock_vault::random_bytes::<32>().map_err(|_| SigningError::Random)?;
        Ok(SecretKey {
            key: SigningKey::from_bytes(&seed),
        })
    }

    pub fn public(&self) -> PublicKey {
        let key = self.key.verifying_key();
        PublicKey {
            id: key_id(&key),
            key,
        }
    }

    pub fn to_file(&self) -> String {
        serde_json::to_string_pretty(&SecretKeyFile {
            schema_version: SIGNING_SCHEMA_VERSION,
            key_id: self.public().id,
            secret_key: STANDARD.encode(self.key.to_bytes()),
        })
        .unwrap_or_default()
    }

    pub fn from_file(text: &str) -> Result<SecretKey, SigningError> {
        let f: SecretKeyFile = serde_json::from_str(text).map_err(malformed)?;
        check_schema(f.schema_version)?;
        let key = SecretKey {
            key: SigningKey::from_bytes(&decode::<32>("secret_key", &f.secret_key)?),
        };
        let derived = key.public().id;
        if derived != f.key_id {
            return Err(SigningError::KeyIdMismatch {
                given: f.key_id,
                derived,
            });
        }
        Ok(key)
    }

    /// The detached signature of `content` for `purpose`.
    pub fn sign(&self, purpose: Purpose, content: &[u8]) -> Signature {
        Signature {
            key_id: self.public().id,
            bytes: self.key.sign(&purpose.message(content)).to_bytes(),
            chain: Vec::new(),
        }
    }

    /// This key's endorsement of `subject`: a link of a key chain.
    pub fn endorse(&self, subject: &PublicKey) -> Endorsement {
        Endorsement {
            key_id: subject.id.clone(),
            public_key: subject.to_base64(),
            endorsed_by: self.public().id,
            signature: STANDARD.encode(
                self.key
                    .sign(&Purpose::Key.message(subject.key.as_bytes()))
                    .to_bytes(),
            ),
        }
    }
}

/// Most links of a key chain.
pub const MAX_CHAIN: usize = 4;

/// One link of a key chain: `endorsed_by` vouches for the key `key_id`
/// (`public_key`) by signing it ([`Purpose::Key`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endorsement {
    pub key_id: String,
    pub public_key: String,
    pub endorsed_by: String,
    pub signature: String,
}

/// A detached signature. Its file is `{"schema_version": 1, "key_id": …,
/// "signature": <base64 of the 64 bytes>, "chain": [<endorsement>…]}`
/// (`chain` optional: from a trusted key down to the signing key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    pub key_id: String,
    pub bytes: [u8; 64],
    pub chain: Vec<Endorsement>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignatureFile {
    schema_version: u32,
    key_id: String,
    signature: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    chain: Vec<Endorsement>,
}

impl Signature {
    pub fn to_file(&self) -> String {
        serde_json::to_string_pretty(&SignatureFile {
            schema_version: SIGNING_SCHEMA_VERSION,
            key_id: self.key_id.clone(),
            signature: STANDARD.encode(self.bytes),
            chain: self.chain.clone(),
        })
        .unwrap_or_default()
    }

    pub fn from_file(text: &[u8]) -> Result<Signature, SigningError> {
        let f: SignatureFile = serde_json::from_slice(text).map_err(malformed)?;
        check_schema(f.schema_version)?;
        Ok(Signature {
            key_id: f.key_id,
            bytes: decode::<64>("signature", &f.signature)?,
            chain: f.chain,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_for_its_purpose_and_key_only() {
        let k = SecretKey::generate().unwrap();
        let other = SecretKey::generate().unwrap();
        let trust = TrustRoot::of(vec![k.public()]);
        let sig =
            Signature::from_file(k.sign(Purpose::Catalog, b"abc").to_file().as_bytes()).unwrap();
        assert_eq!(
            trust.verify(Purpose::Catalog, b"abc", &sig),
            Ok(k.public().id().to_owned())
        );
        assert_eq!(
            trust.verify(Purpose::Catalog, b"abd", &sig),
            Err(SigningError::BadSignature)
        );
        assert_eq!(
            trust.verify(Purpose::Bundle, b"abc", &sig),
            Err(SigningError::BadSignature)
        );
        let by_other = other.sign(Purpose::Catalog, b"abc");
        assert!(matches!(
            trust.verify(Purpose::Catalog, b"abc", &by_other),
            Err(SigningError::UntrustedKey(_))
        ));
        // A forged id naming the trusted key still needs its signature.
        let forged = Signature {
            key_id: k.public().id().to_owned(),
            ..by_other
        };
        assert_eq!(
            trust.verify(Purpose::Catalog, b"abc", &forged),
            Err(SigningError::BadSignature)
        );
    }

    #[test]
    fn a_key_chain_leads_from_a_trusted_key_to_the_signing_key() {
        let root = SecretKey::generate().unwrap();
        let mid = SecretKey::generate().unwrap();
        let leaf = SecretKey::generate().unwrap();
        let stranger = SecretKey::generate().unwrap();
        let trust = TrustRoot::of(vec![root.public()]);
        let mut sig = leaf.sign(Purpose::Bundle, b"m");
        sig.chain = vec![root.endorse(&mid.public()), mid.endorse(&leaf.public())];
        let sig = Signature::from_file(sig.to_file().as_bytes()).unwrap();
        assert_eq!(
            trust.verify(Purpose::Bundle, b"m", &sig),
            Ok(leaf.public().id().to_owned())
        );
        // A chain that starts at an untrusted key.
        let mut bad = leaf.sign(Purpose::Bundle, b"m");
        bad.chain = vec![stranger.endorse(&leaf.public())];
        assert!(matches!(
            trust.verify(Purpose::Bundle, b"m", &bad),
            Err(SigningError::ChainUntrusted(_))
        ));
        // An endorsement that is not the endorser's.
        let mut forged = root.endorse(&leaf.public());
        forged.signature = stranger.endorse(&leaf.public()).signature;
        bad.chain = vec![forged];
        assert!(matches!(
            trust.verify(Purpose::Bundle, b"m", &bad),
            Err(SigningError::ChainUntrusted(_))
        ));
        // A chain that endorses another key than the signer.
        bad.chain = vec![root.endorse(&mid.public())];
        assert!(matches!(
            trust.verify(Purpose::Bundle, b"m", &bad),
            Err(SigningError::ChainUntrusted(_))
        ));
    }

    #[test]
    fn key_files_round_trip_and_ids_are_checked() {
        let k = SecretKey::generate().unwrap();
        let back = SecretKey::from_file(&k.to_file()).unwrap();
        assert_eq!(back.public(), k.public());
        let trust = TrustRoot::parse(&k.public().to_file()).unwrap();
        assert!(trust.get(k.public().id()).is_some());
        let list = format!("[{}]", k.public().to_file());
        assert_eq!(TrustRoot::parse(&list).unwrap(), trust);
        let wrong = format!(
            r#"[{{"key_id": "0000000000000000", "public_key": "{}"}}]"#,
            k.public().to_base64()
        );
        assert!(matches!(
            TrustRoot::parse(&wrong),
            Err(SigningError::KeyIdMismatch { .. })
        ));
        assert!(matches!(
            TrustRoot::parse(r#"[{"key_id": "x", "public_key": "AAAA"}]"#),
            Err(SigningError::Malformed(_))
        ));
        assert!(matches!(
            Signature::from_file(br#"{"schema_version": 2, "key_id": "x", "signature": ""}"#),
            Err(SigningError::SchemaVersion(2))
        ));
    }
}

//! Workload identity: the keyring that signs each run's identity token (a
//! JWT a cloud's STS accepts in exchange for short-lived credentials) and
//! the public keys an issuer publishes as its JWKS.
//!
//! - Algorithm: ES256 (ECDSA P-256, SHA-256). It is what every federation
//!   target verifies (AWS `AssumeRoleWithWebIdentity` and GCP workload
//!   identity take RS256 or ES256; EdDSA is refused by AWS), its keys are
//!   small enough for an environment variable, and ring (already built for
//!   rustls) both makes and uses them; RSA keys cannot be made by ring.
//! - Keys (`IDENTITY_SIGNING_KEYS`): comma-separated, each the standard
//!   base64 of a P-256 private key in PKCS#8 DER
//!   (`airlock keys generate --identity`, or `openssl genpkey -algorithm EC
//!   -pkeyopt ec_paramgen_curve:P-256 | openssl pkcs8 -topk8 -nocrypt -outform DER | base64 -w0`). The first signs; every one is
//!   published, so a token signed before a rotation still verifies until it
//!   expires. A key's id (`kid`) is its RFC 7638 thumbprint: no name to
//!   configure, and one key has the same id on every replica.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use zeroize::Zeroizing;

/// The identity keyring's variable.
pub const ENV_IDENTITY_SIGNING_KEYS: &str = "IDENTITY_SIGNING_KEYS";
/// The JOSE algorithm of every identity token.
pub const IDENTITY_ALG: &str = "ES256";

/// Why an identity keyring could not be built, or a token signed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentityKeyError {
    /// The variable is unset or holds no key.
    #[error(
        "{var} is not set: set it to one or more comma-separated base64 P-256 PKCS#8 keys \
         (`airlock keys generate --identity` makes one)"
    )]
    Missing { var: &'static str },
    /// An entry is empty (`a,,b`, a trailing comma).
    #[error("{var}: key #{index} is empty (check for stray commas)")]
    Empty { var: &'static str, index: usize },
    /// An entry is not standard base64 with padding.
    #[error("{var}: key #{index} is not valid standard base64 with padding")]
    Base64 { var: &'static str, index: usize },
    /// An entry is not a P-256 private key in PKCS#8 DER (with its public key).
    #[error("{var}: key #{index} is not a P-256 private key in PKCS#8 DER: {reason}")]
    NotP256 {
        var: &'static str,
        index: usize,
        reason: String,
    },
    /// The operating system's random number generator failed (a key to make).
    #[error("the operating system's random number generator failed")]
    RandomUnavailable,
    /// The signature could not be made.
    #[error("the identity token could not be signed: {0}")]
    Sign(String),
}

/// One signing key: its PKCS#8 document and its public point.
#[derive(Clone)]
struct IdentityKey {
    pkcs8: Zeroizing<Vec<u8>>,
    public: PublicJwk,
}

/// The public half of an identity key, as a JWK's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicJwk {
    /// The RFC 7638 thumbprint (SHA-256, base64url).
    pub kid: String,
    /// The point's coordinates, base64url without padding.
    pub x: String,
    pub y: String,
}

/// What an identity token says (registered claims and Airlock's own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityClaims {
    /// The issuer: the instance's URL (`/.well-known/openid-configuration` under it).
    pub iss: String,
    /// The subject: the run.
    pub sub: String,
    /// The audience the integration names (the STS that takes the token).
    pub aud: String,
    pub iat: u64,
    pub nbf: u64,
    pub exp: u64,
    /// A random id of this token.
    pub jti: String,
    pub org: String,
    pub agent: String,
    pub run_id: String,
}

/// A keyring of ES256 keys: the first signs, every one is published.
/// `Debug` shows only the key ids.
#[derive(Clone)]
pub struct IdentityKeyring {
    keys: Vec<IdentityKey>,
}

impl std::fmt::Debug for IdentityKeyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityKeyring")
            .field(
                "kids",
                &self.keys.iter().map(|k| &k.public.kid).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl IdentityKeyring {
    /// Parses the value of `var` (named in errors): comma-separated base64
    /// PKCS#8 P-256 keys, spaces around an entry ignored.
    pub fn parse(var: &'static str, value: &str) -> Result<Self, IdentityKeyError> {
        if value.trim().is_empty() {
            return Err(IdentityKeyError::Missing { var });
        }
        let mut keys = Vec::new();
        for (i, part) in value.split(',').enumerate() {
            let (part, index) = (part.trim(), i + 1);
            if part.is_empty() {
                return Err(IdentityKeyError::Empty { var, index });
            }
            let der = Zeroizing::new(
                STANDARD
                    .decode(part)
                    .map_err(|_| IdentityKeyError::Base64 { var, index })?,
            );
            let key = IdentityKey::from_pkcs8(der).map_err(|reason| IdentityKeyError::NotP256 {
                var,
                index,
                reason,
            })?;
            keys.push(key);
        }
        Ok(Self { keys })
    }

    /// Reads `IDENTITY_SIGNING_KEYS` from the process environment.
    pub fn from_env() -> Result<Self, IdentityKeyError> {
        let value = Zeroizing::new(std::env::var(ENV_IDENTITY_SIGNING_KEYS).unwrap_or_default());
        Self::parse(ENV_IDENTITY_SIGNING_KEYS, &value)
    }

    /// A keyring of one fresh key (a process's own when none is configured).
    pub fn generate() -> Result<Self, IdentityKeyError> {
        let der = generate_pkcs8()?;
        let key = IdentityKey::from_pkcs8(der).map_err(IdentityKeyError::Sign)?;
        Ok(Self { keys: vec![key] })
    }

    /// The public keys, the signing one first (the issuer's JWKS).
    pub fn public_keys(&self) -> impl Iterator<Item = &PublicJwk> {
        self.keys.iter().map(|k| &k.public)
    }

    /// The id of the signing key.
    pub fn signing_kid(&self) -> &str {
        &self.keys[0].public.kid
    }

    /// `claims` as a compact JWS signed with the first key, its `kid` in the header.
    pub fn sign(&self, claims: &IdentityClaims) -> Result<String, IdentityKeyError> {
        let key = &self.keys[0];
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some(key.public.kid.clone());
        let encoding = jsonwebtoken::EncodingKey::from_ec_der(&key.pkcs8);
        jsonwebtoken::encode(&header, claims, &encoding)
            .map_err(|e| IdentityKeyError::Sign(e.to_string()))
    }
}

/// A fresh P-256 key, PKCS#8 DER.
fn generate_pkcs8() -> Result<Zeroizing<Vec<u8>>, IdentityKeyError> {
    let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
        .map_err(|_| IdentityKeyError::RandomUnavailable)?;
    Ok(Zeroizing::new(doc.as_ref().to_vec()))
}

/// A fresh identity key as `IDENTITY_SIGNING_KEYS` takes it (standard base64 of PKCS#8 DER).
pub fn generate_identity_key() -> Result<Zeroizing<String>, IdentityKeyError> {
    Ok(Zeroizing::new(
        STANDARD.encode(generate_pkcs8()?.as_slice()),
    ))
}

impl IdentityKey {
    fn from_pkcs8(pkcs8: Zeroizing<Vec<u8>>) -> Result<Self, String> {
        let pair = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            &pkcs8,
            &SystemRandom::new(),
        )
        .map_err(|e| e.to_string())?;
        // An uncompressed SEC1 point: 0x04 ‖ x (32) ‖ y (32).
        let point = pair.public_key().as_ref();
        let (Some(x), Some(y)) = (point.get(1..33), point.get(33..65)) else {
            return Err("the public key is not an uncompressed P-256 point".into());
        };
        let (x, y) = (URL_SAFE_NO_PAD.encode(x), URL_SAFE_NO_PAD.encode(y));
        // RFC 7638: the required members in lexicographic order, no spaces.
        let canonical = format!(r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#);
        let kid = URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(canonical.as_bytes()));
        Ok(Self {
            pkcs8,
            public: PublicJwk { kid, x, y },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(exp: u64) -> IdentityClaims {
        IdentityClaims {
            iss: "https://airlock.example".into(),
            sub: "run-1".into(),
            aud: "sts.amazonaws.com".into(),
            iat: 1_000,
            nbf: 1_000,
            exp,
            jti: "j".into(),
            org: "acme".into(),
            agent: "triage".into(),
            run_id: "run-1".into(),
        }
    }

    fn verify(token: &str, jwk: &PublicJwk) -> Result<IdentityClaims, jsonwebtoken::errors::Error> {
        let key = jsonwebtoken::DecodingKey::from_ec_components(&jwk.x, &jwk.y)?;
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
        v.set_audience(&["sts.amazonaws.com"]);
        v.validate_exp = false;
        jsonwebtoken::decode::<IdentityClaims>(token, &key, &v).map(|d| d.claims)
    }

    /// A token verifies under its key's published point, names its key,
    /// and does not verify under another keyring's key.
    #[test]
    fn a_token_verifies_under_its_own_key_only() {
        let ring = IdentityKeyring::generate().unwrap();
        let other = IdentityKeyring::generate().unwrap();
        let token = ring.sign(&claims(2_000)).unwrap();
        let jwk = ring.public_keys().next().unwrap();
        assert_eq!(verify(&token, jwk).unwrap(), claims(2_000));
        let header = jsonwebtoken::decode_header(&token).unwrap();
        assert_eq!(header.kid.as_deref(), Some(ring.signing_kid()));
        assert_eq!(header.alg, jsonwebtoken::Algorithm::ES256);
        assert!(verify(&token, other.public_keys().next().unwrap()).is_err());
    }

    /// The first key signs, every key is published; a key's id is the same
    /// wherever it is configured.
    #[test]
    fn the_first_key_signs_and_every_key_is_published() {
        let (new, old) = (
            generate_identity_key().unwrap(),
            generate_identity_key().unwrap(),
        );
        let ring = IdentityKeyring::parse("V", &format!("{}, {}", *new, *old)).unwrap();
        let alone = IdentityKeyring::parse("V", &old).unwrap();
        let kids: Vec<_> = ring.public_keys().map(|k| k.kid.clone()).collect();
        assert_eq!(kids.len(), 2);
        assert_eq!(kids[1], alone.signing_kid());
        assert_eq!(kids[0], ring.signing_kid());
        let token = ring.sign(&claims(2_000)).unwrap();
        assert!(verify(&token, ring.public_keys().next().unwrap()).is_ok());
        assert!(!format!("{ring:?}").contains(new.as_str()));
    }

    /// A key as `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256
    /// | openssl pkcs8 -topk8 -nocrypt -outform DER | base64 -w0` writes it
    /// (a key made for this test only).
    #[test]
    fn an_openssl_key_is_taken() {
        const OPENSSL: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgYVF7tJ7jXlwVqwwxHF7ig739cdHJqON/3GzxZKNUxBChRANCAASUfqeTPUBjS3LXNZSGvXdlRNSlWwMn4LtKT8od3B0weSHFhVh/HPTHEu4pgVl5OUGsLNwnRHYIpu8/kqchivDE";
        let ring = IdentityKeyring::parse("V", OPENSSL).unwrap();
        let token = ring.sign(&claims(2_000)).unwrap();
        assert!(verify(&token, ring.public_keys().next().unwrap()).is_ok());
    }

    #[test]
    fn bad_keyrings_name_the_key() {
        use IdentityKeyError::*;
        let var = "V";
        assert_eq!(
            IdentityKeyring::parse(var, " ").unwrap_err(),
            Missing { var }
        );
        let k = generate_identity_key().unwrap();
        assert_eq!(
            IdentityKeyring::parse(var, &format!("{},", *k)).unwrap_err(),
            Empty { var, index: 2 }
        );
        assert_eq!(
            IdentityKeyring::parse(var, "not base64!").unwrap_err(),
            Base64 { var, index: 1 }
        );
        let e = IdentityKeyring::parse(var, &STANDARD.encode([7u8; 40])).unwrap_err();
        assert!(matches!(e, NotP256 { index: 1, .. }), "{e:?}");
    }
}

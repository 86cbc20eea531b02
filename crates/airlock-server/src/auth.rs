//! API keys: `alk_<id>_<secret>`. The id is public (it names the row); the
//! secret is 32 random bytes, shown once at creation and stored only as
//! HMAC-SHA256 under `API_AUTH_SECRET` (its own keyring, independent of every
//! other secret; the first entry hashes new keys, every entry verifies).
//! Verification is constant-time ([`airlock_vault::SigningKeyring::verify`]).

use std::sync::Arc;

use airlock_store::Store;
use airlock_vault::SigningKeyring;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use secrecy::{ExposeSecret, SecretString};

use crate::error::ApiError;

/// Who is calling: an organization, through one of its keys.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub org_id: String,
    pub key_id: String,
}

/// The variable that holds the API auth keyring.
pub const ENV_API_AUTH_SECRET: &str = "API_AUTH_SECRET";
const PREFIX: &str = "alk_";

/// Hashes and checks API keys.
#[derive(Clone, Debug)]
pub struct ApiAuth {
    ring: Arc<SigningKeyring>,
}

/// A freshly made key: `key` is shown once, `hash` is what is stored.
pub struct NewKey {
    pub id: String,
    pub key: SecretString,
    pub hash: String,
}

impl ApiAuth {
    pub fn new(ring: SigningKeyring) -> Self {
        ApiAuth {
            ring: Arc::new(ring),
        }
    }

    pub fn from_env() -> Result<Self, airlock_vault::SigningError> {
        Ok(Self::new(SigningKeyring::from_env(ENV_API_AUTH_SECRET)?))
    }

    pub fn mint(&self) -> Result<NewKey, airlock_vault::VaultError> {
        let id = airlock_vault::random_hex::<8>()?;
        let secret = zeroize::Zeroizing::new(airlock_vault::random_hex::<32>()?);
        let hash = self.ring.sign(secret.as_bytes());
        Ok(NewKey {
            key: SecretString::from(format!("{PREFIX}{id}_{}", secret.as_str())),
            id,
            hash,
        })
    }

    /// Makes a key for `org` and stores its hash, unless `org` already has
    /// `max` live keys (the operator's own commands pass `None`).
    pub async fn create_key(
        &self,
        store: &Store,
        org: &str,
        name: &str,
        max: Option<u64>,
    ) -> Result<(airlock_store::ApiKeyRow, SecretString), ApiError> {
        let k = self.mint().map_err(ApiError::internal)?;
        let row = store.insert_api_key(&k.id, org, name, &k.hash, max).await?;
        Ok((row, k.key))
    }

    /// The tenant a presented key belongs to, if it is a live key.
    pub async fn authenticate(&self, store: &Store, presented: &str) -> Result<Tenant, ApiError> {
        let bad = || ApiError::unauthorized("the API key is not valid (or was revoked)");
        let rest = presented.strip_prefix(PREFIX).ok_or_else(bad)?;
        let (id, secret) = rest.split_once('_').ok_or_else(bad)?;
        if id.len() != 16 || secret.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let Some(row) = store.get_api_key(id).await? else {
            return Err(bad());
        };
        if row.revoked_at.is_some() || !self.ring.verify(secret.as_bytes(), &row.hash) {
            return Err(bad());
        }
        Ok(Tenant {
            org_id: row.org_id,
            key_id: row.id,
        })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Tenant>()
            .cloned()
            .ok_or_else(|| ApiError::unauthorized("no API key"))
    }
}

/// For tests and the CLI: the secret part never leaves as anything but the key.
pub fn expose(key: &SecretString) -> &str {
    key.expose_secret()
}

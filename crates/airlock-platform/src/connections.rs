//! Writing a connection: the one place its fields are checked against the
//! type's schema, encrypted under the active key and stored as an envelope.
//! Every writer (the CLI, the demo, `airlock serve`'s API) goes through here.

use std::collections::BTreeMap;

use airlock_store::{AuthType, NewConnection, Store, StoreError};
use airlock_vault::Keyring;
use zeroize::Zeroizing;

/// A connection's secret fields, held in zeroizing buffers.
pub type Fields = BTreeMap<String, Zeroizing<String>>;

#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The fields do not fit the type's schema (nothing was stored).
    #[error("{0}")]
    Fields(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot encrypt the connection: {0}")]
    Vault(#[from] airlock_vault::VaultError),
}

/// Fields each type needs (others may be given too): the one schema the
/// relay and docs/configuration.md use too.
pub fn required_fields(t: AuthType) -> &'static [&'static str] {
    t.schema().required
}

/// Checks `fields` against `t`'s schema.
pub fn check_fields(t: AuthType, fields: &Fields) -> Result<(), ConnectionError> {
    let bad = |m: String| Err(ConnectionError::Fields(m));
    if fields.is_empty() {
        return bad("no credential fields given".into());
    }
    if fields.len() > 32 {
        return bad("at most 32 credential fields".into());
    }
    for (k, v) in fields {
        if k.is_empty()
            || k.len() > 64
            || !k
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return bad(format!(
                "field name {k:?} must be 1-64 characters of A-Z a-z 0-9 _ -"
            ));
        }
        if v.is_empty() {
            return bad(format!("field {k:?} is empty"));
        }
        if v.len() > 16 * 1024 {
            return bad(format!("field {k:?} is longer than 16 KiB"));
        }
    }
    let missing: Vec<&str> = required_fields(t)
        .iter()
        .copied()
        .filter(|f| !fields.contains_key(*f))
        .collect();
    if !missing.is_empty() {
        return bad(format!(
            "a {t} connection needs the field(s): {}",
            missing.join(", ")
        ));
    }
    Ok(())
}

fn encrypt_fields(ring: &Keyring, fields: &Fields) -> Result<String, ConnectionError> {
    let map: BTreeMap<&str, &str> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let plaintext = Zeroizing::new(
        serde_json::to_string(&map).map_err(|e| ConnectionError::Fields(e.to_string()))?,
    );
    Ok(ring.encrypt(plaintext.as_bytes())?)
}

/// Whose connection it is, and how many that organization may hold
/// (`ORG_MAX_CONNECTIONS`; `None`: no cap, the CLI's local organization).
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub org: &'a str,
    pub max_connections: Option<u64>,
}

/// A new connection of `owner`'s organization, within its cap.
pub async fn store_connection(
    store: &Store,
    ring: &Keyring,
    owner: Owner<'_>,
    name: &str,
    integration: &str,
    auth_type: AuthType,
    fields: &Fields,
) -> Result<(), ConnectionError> {
    check_fields(auth_type, fields)?;
    let envelope = encrypt_fields(ring, fields)?;
    // A different key under an id the store already uses is refused.
    store.record_active_key(ring).await?;
    let c = NewConnection {
        org: owner.org,
        name,
        integration,
        auth_type,
        envelope: &envelope,
    };
    store
        .insert_connection_within(&c, owner.max_connections)
        .await?;
    tracing::info!(connection = %name, integration = %integration, kid = ring.active_kid(), "stored connection");
    Ok(())
}

/// Replaces the secret of one of `org`'s connections (a rotation): its type
/// and integration stay. `false` when there is no such connection.
pub async fn rotate_connection(
    store: &Store,
    ring: &Keyring,
    org: &str,
    name: &str,
    fields: &Fields,
) -> Result<bool, ConnectionError> {
    let Some(rec) = store.get_connection(org, name).await? else {
        return Ok(false);
    };
    check_fields(rec.info.auth_type, fields)?;
    let envelope = encrypt_fields(ring, fields)?;
    store.record_active_key(ring).await?;
    Ok(store
        .replace_connection_envelope(org, name, &envelope)
        .await?)
}

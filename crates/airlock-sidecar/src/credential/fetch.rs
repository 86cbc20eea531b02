//! Fetching a connection's credential from the platform, with the one
//! mapping of a failed fetch to what the caller answers.

use airlock_platform_api::wire::{CredentialFields, CredentialResponse};
use airlock_platform_api::{PlatformClient, PlatformError};

use super::{Credentials, Redactor};

/// A credential fetched for one request, with the integration's redactor
/// (its values and those seen before in the run).
pub struct Fetched {
    pub fields: CredentialFields,
    pub redactor: Redactor,
}

/// The platform did not provide an integration's credential.
#[derive(Debug, thiserror::Error)]
#[error("the platform did not provide the {namespace} credential ({})", .status.map_or("unreachable".into(), |s| s.to_string()))]
pub struct CredentialError {
    pub namespace: String,
    /// The platform's status, `None` when it could not be reached.
    pub status: Option<u16>,
}

impl CredentialError {
    /// The error code every site answers with.
    pub const CODE: &'static str = "credential_unavailable";
    /// The HTTP status every site answers with.
    pub const STATUS: u16 = 502;
}

/// Fetches `namespace`'s credential from the platform now; its values join
/// the run's `credentials`.
pub async fn fetch(
    platform: &PlatformClient,
    credentials: &Credentials,
    namespace: &str,
) -> Result<Fetched, CredentialError> {
    fetched(credentials, namespace, platform.credential(namespace).await)
}

/// The outcome of a fetch of `namespace`'s credential (started earlier, or
/// just now by [`fetch`]).
pub fn fetched(
    credentials: &Credentials,
    namespace: &str,
    outcome: Result<CredentialResponse, PlatformError>,
) -> Result<Fetched, CredentialError> {
    match outcome {
        Ok(c) => {
            let redactor = credentials.redactor(namespace, &c.fields);
            Ok(Fetched {
                fields: c.fields,
                redactor,
            })
        }
        Err(e) => {
            let status = e.status();
            tracing::warn!(
                integration = namespace,
                status = status.unwrap_or(0),
                "credential unavailable"
            );
            Err(CredentialError {
                namespace: namespace.to_owned(),
                status,
            })
        }
    }
}

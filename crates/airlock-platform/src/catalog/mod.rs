//! The signed live model catalog (`docs/model-catalog.md`): read in the
//! background when the platform starts and then every hour, never waited
//! on by boot, kept in memory by the model registry ([`crate::models`]).
//!
//! Contracts:
//! - a read is at most two anonymous GETs, the catalog and then its
//!   detached signature (`<url>.sig`), each through the platform's egress
//!   guard, redirects refused, within [`READ_TIMEOUT`] and
//!   [`MAX_CATALOG_BYTES`];
//! - a file is offered to the registry only once its signature verifies
//!   against the trusted keys ([`CatalogSettings::trust`]) and then its
//!   schema is strict ([`Catalog::parse`]);
//! - any failure is one warning, `model catalog not refreshed`, and the
//!   registry keeps what it had;
//! - `MODEL_CATALOG_URL=off` (and the default, while the project
//!   publishes no catalog) starts no task and sends nothing.

mod format;

use std::sync::Arc;
use std::time::Duration;

use airlock_egress::{
    AuthorizedUris, CallRules, ClientConfig, EgressError, Guard, GuardedClient, OutboundRequest,
};
use bytes::Bytes;

pub use format::{
    CATALOG_SCHEMA_VERSION, Catalog, CatalogModel, FormatError, MAX_CATALOG_BYTES,
    MAX_CATALOG_MODELS,
};

use crate::models::{ModelRegistry, Offer, Rollback};
use crate::settings::SettingsError;
use crate::signing::{Purpose, Signature, SigningError, TrustRoot};

/// Where the catalog is read from: `off`, or an http(s) URL (a mirror).
/// Unset or empty: [`DEFAULT_URL`].
pub const ENV_URL: &str = "MODEL_CATALOG_URL";
/// The keys a catalog must be signed by, replacing [`BUILT_IN_KEYS`]: a
/// JSON list of `{"key_id", "public_key"}` (a mirror's or a test's keys).
pub const ENV_TRUST_ROOT: &str = "MODEL_CATALOG_TRUST_ROOT";
/// The catalog read when `MODEL_CATALOG_URL` is unset or empty. None: the
/// project publishes no catalog yet, so by default nothing is read (an
/// operator who mirrors one sets the URL and its keys).
pub const DEFAULT_URL: Option<&str> = None;
/// The project's catalog signing keys (raw Ed25519, base64). None yet, for
/// the same reason.
pub const BUILT_IN_KEYS: &[&str] = &[];
/// Each GET's bound, from connect to the last byte.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the catalog is read again after the first read.
pub const REFRESH_EVERY: Duration = Duration::from_secs(3600);

/// `MODEL_CATALOG_URL` and the keys a catalog must be signed by.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CatalogSettings {
    /// None: no catalog is read (`off`, or the default while none is
    /// published).
    pub url: Option<String>,
    pub trust: TrustRoot,
}

fn setting(var: &'static str, message: impl Into<String>) -> SettingsError {
    SettingsError {
        var,
        message: message.into(),
    }
}

impl CatalogSettings {
    /// From `MODEL_CATALOG_URL` and `MODEL_CATALOG_TRUST_ROOT` (each None
    /// when unset or empty).
    pub fn from_vars(
        url: Option<&str>,
        trust: Option<&str>,
    ) -> Result<CatalogSettings, SettingsError> {
        let url = match url.map(str::trim) {
            Some("off") => None,
            Some(u) => Some(check_url(u)?),
            None => DEFAULT_URL.map(str::to_owned),
        };
        let trust = match trust {
            Some(t) => TrustRoot::parse(t).map_err(|e| setting(ENV_TRUST_ROOT, e.to_string()))?,
            None => built_in_trust(),
        };
        if url.is_some() && trust.is_empty() {
            return Err(setting(
                ENV_TRUST_ROOT,
                "MODEL_CATALOG_URL names a catalog and no key verifies it: set the \
                 catalog's public keys, or MODEL_CATALOG_URL=off",
            ));
        }
        Ok(CatalogSettings { url, trust })
    }
}

fn built_in_trust() -> TrustRoot {
    TrustRoot::of(
        BUILT_IN_KEYS
            .iter()
            .filter_map(|k| crate::signing::PublicKey::from_base64(k).ok())
            .collect(),
    )
}

/// An anonymous http(s) URL with no query or fragment (its signature is
/// at the same URL with `.sig` appended).
fn check_url(u: &str) -> Result<String, SettingsError> {
    let bad = |why: String| setting(ENV_URL, format!("{u:?}: {why}"));
    let t = airlock_egress::Target::parse(u).map_err(|e| bad(e.operator_message()))?;
    let authority = u
        .split_once("://")
        .map_or("", |(_, rest)| rest.split('/').next().unwrap_or_default());
    if u.contains(['?', '#']) || authority.contains('@') {
        return Err(bad("must have no query, fragment or user info".into()));
    }
    if !matches!(t.scheme(), "http" | "https") {
        return Err(bad("must be http or https, or off".into()));
    }
    Ok(u.to_owned())
}

/// Which of the two files a read failed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum File {
    Catalog,
    Signature,
}

impl std::fmt::Display for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            File::Catalog => "the catalog",
            File::Signature => "its signature",
        })
    }
}

/// Why a read did not replace the catalog: one variant per step.
#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    /// Refused by the guard, a redirect, a timeout, a cap, a connection.
    #[error("reading {file}: {}", source.operator_message())]
    Get { file: File, source: EgressError },
    #[error("reading {file}: answered HTTP {status}")]
    Status { file: File, status: u16 },
    #[error("signature: {0}")]
    Signature(#[from] SigningError),
    #[error("catalog: {0}")]
    Format(#[from] FormatError),
    #[error(transparent)]
    Rollback(#[from] Rollback),
}

/// Reads a catalog and offers it to the registry.
pub struct CatalogReader {
    url: String,
    authorized: AuthorizedUris,
    client: GuardedClient,
    trust: TrustRoot,
    registry: Arc<ModelRegistry>,
}

impl CatalogReader {
    /// A reader of the catalog at `url`, through `guard` and `via` (direct,
    /// or the operator's upstream proxy), each GET within `timeout`.
    pub fn new(
        url: &str,
        trust: TrustRoot,
        guard: Guard,
        via: Arc<dyn airlock_egress::Dial>,
        extra_roots: Vec<rustls_pki_types::CertificateDer<'static>>,
        timeout: Duration,
        registry: Arc<ModelRegistry>,
    ) -> Result<CatalogReader, EgressError> {
        let t = airlock_egress::Target::parse(url)?;
        // The catalog's origin, literally: what lets an operator's
        // `EGRESS_ALLOW_INTERNAL_HOSTS` entry apply to a private mirror.
        let authorized = AuthorizedUris::parse(&[format!("{}://{}/**", t.scheme(), t.authority())]);
        let client = GuardedClient::with_dialer(
            guard,
            ClientConfig {
                connect_timeout: timeout,
                total_timeout: timeout,
                max_response_bytes: MAX_CATALOG_BYTES,
                max_redirects: 0,
                extra_root_certs: extra_roots,
                use_webpki_roots: true,
                max_idle_per_origin: 1,
            },
            via,
        )?;
        Ok(CatalogReader {
            url: url.to_owned(),
            authorized,
            client,
            trust,
            registry,
        })
    }

    async fn get(&self, file: File, url: String) -> Result<Bytes, RefreshError> {
        let rules = CallRules {
            authorized: &self.authorized,
            allow_all_uris: false,
            credentialed: false,
        };
        let resp = self
            .client
            .send(OutboundRequest::get(url), &rules)
            .await
            .map_err(|source| RefreshError::Get { file, source })?;
        if resp.status != http::StatusCode::OK {
            return Err(RefreshError::Status {
                file,
                status: resp.status.as_u16(),
            });
        }
        Ok(resp.body)
    }

    /// One read: the catalog, its signature, verified, parsed, offered.
    pub async fn refresh(&self) -> Result<Offer, RefreshError> {
        let body = self.get(File::Catalog, self.url.clone()).await?;
        let sig = self
            .get(File::Signature, format!("{}.sig", self.url))
            .await?;
        let sig = Signature::from_file(&sig)?;
        self.trust.verify(Purpose::Catalog, &body, &sig)?;
        let catalog = Catalog::parse(&body)?;
        Ok(self.registry.offer(catalog)?)
    }

    /// Reads now and then every `every`, in the background: each failure
    /// is a warning, and the registry keeps serving what it had.
    pub fn spawn(self, every: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match self.refresh().await {
                    Ok(Offer::Accepted { serial }) => {
                        tracing::info!(serial, url = %self.url, "model catalog accepted");
                    }
                    Ok(Offer::Unchanged { serial }) => {
                        tracing::debug!(serial, "model catalog unchanged");
                    }
                    Err(e) => {
                        tracing::warn!(url = %self.url, error = %e, "model catalog not refreshed");
                    }
                }
            }
        })
    }
}

/// Starts the background reads the settings ask for: none (and no task)
/// when no catalog is configured.
pub fn start(
    settings: &crate::settings::Settings,
    registry: &Arc<ModelRegistry>,
) -> Option<tokio::task::JoinHandle<()>> {
    let url = settings.catalog.url.as_deref()?;
    let reader = settings
        .platform_guard(&[])
        .map_err(|e| EgressError::upstream("-", e.to_string()))
        .and_then(|guard| {
            CatalogReader::new(
                url,
                settings.catalog.trust.clone(),
                guard,
                settings.via(),
                settings.extra_roots(),
                READ_TIMEOUT,
                registry.clone(),
            )
        });
    match reader {
        Ok(r) => Some(r.spawn(REFRESH_EVERY)),
        Err(e) => {
            tracing::warn!(%url, error = %e.operator_message(), "model catalog not refreshed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_setting_is_off_a_checked_url_or_the_default() {
        let key = crate::signing::SecretKey::generate().unwrap().public();
        let trust = format!("[{}]", key.to_file());
        let off = CatalogSettings::from_vars(Some("off"), None).unwrap();
        assert_eq!(off.url, None);
        // The default: the project publishes none, so nothing is read.
        assert_eq!(CatalogSettings::from_vars(None, None).unwrap().url, None);
        let m = CatalogSettings::from_vars(Some("http://10.0.0.5/c.json"), Some(&trust)).unwrap();
        assert_eq!(m.url.as_deref(), Some("http://10.0.0.5/c.json"));
        assert!(m.trust.get(key.id()).is_some());
        for bad in [
            "ftp://x/c.json",
            "https://x/c.json?v=1",
            "https://x/c.json#a",
            "https://u:p@x/c.json",
            "not a url",
        ] {
            let e = CatalogSettings::from_vars(Some(bad), Some(&trust)).unwrap_err();
            assert_eq!(e.var, ENV_URL, "{bad}");
        }
        // A URL with no key to verify it could never be accepted.
        let e =
            CatalogSettings::from_vars(Some("https://mirror.example/c.json"), None).unwrap_err();
        assert_eq!(e.var, ENV_TRUST_ROOT);
        let e = CatalogSettings::from_vars(Some("off"), Some("[{}]")).unwrap_err();
        assert_eq!(e.var, ENV_TRUST_ROOT);
    }
}

#[cfg(test)]
mod reader_tests;

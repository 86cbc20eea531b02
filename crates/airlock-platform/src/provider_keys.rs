//! Which key pays for a run's model calls, decided in one place.
//!
//! A run's model key comes, in this order, from:
//!
//! 1. the manifest's own connection (`model.connection`);
//! 2. the organization's key for the run's provider: its stored connection
//!    named [`org_connection`] (`model.openai`, `model.anthropic`), made
//!    through the ordinary connections API;
//! 3. the operator's key for that provider (`SYSTEM_PROVIDER_KEYS`).
//!
//! The order is resolved at each credential fetch of the relay (so a key
//! the organization adds or removes is in use from the relay's next fetch),
//! and checked before the run starts: a manifest without `model.connection`
//! whose provider has neither an organization nor a system key is refused
//! then ([`crate::orchestrator::Refusal::NoModelKey`]).
//!
//! Every source reaches the sidecar the same way (the internal API's
//! credential answer for `@model`), so the relay's redactor covers each and
//! the agent never sees any. Which source paid is recorded by the platform
//! ([`Payer`]), never the key, and never taken from the sidecar's word.

use std::collections::HashMap;

use airlock_platform_api::types::Provider;
use airlock_vault::SecretString;
use serde::Deserialize;

use crate::settings::SettingsError;

/// The operator's model keys.
pub const ENV_SYSTEM_PROVIDER_KEYS: &str = "SYSTEM_PROVIDER_KEYS";

/// The kind of the run event that records which key the platform hands the
/// run's relay (`{"paid_by": "<payer>", "at": …}`), written each time that
/// changes; a cost record's payer is the last one recorded before it.
pub const PAYER_EVENT: &str = "model_key";

/// Largest `SYSTEM_PROVIDER_KEYS` file.
const MAX_FILE_BYTES: u64 = 64 << 10;

/// The name of an organization's own key for `provider`.
pub fn org_connection(provider: Provider) -> String {
    format!("model.{}", provider.as_str())
}

/// `SYSTEM_PROVIDER_KEYS`: a JSON object of provider → key
/// (`{"openai": "sk-…", "anthropic": "sk-ant-…"}`), or the absolute path
/// of a file holding one (so the keys need not sit in the environment).
/// Unset: none. A provider Airlock does not know, an empty key or a
/// malformed value is refused at start, naming the variable and never
/// the value.
#[derive(Clone, Default)]
pub struct SystemProviderKeys(HashMap<Provider, SecretString>);

impl std::fmt::Debug for SystemProviderKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut providers: Vec<&str> = self.0.keys().map(|p| p.as_str()).collect();
        providers.sort_unstable();
        f.debug_tuple("SystemProviderKeys")
            .field(&providers)
            .finish()
    }
}

impl SystemProviderKeys {
    /// Reads the variable's value (`None`: unset or empty).
    pub fn from_var(value: Option<&str>) -> Result<Self, SettingsError> {
        let bad = |message: String| SettingsError {
            var: ENV_SYSTEM_PROVIDER_KEYS,
            message,
        };
        let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(Self::default());
        };
        let text = if value.starts_with('/') {
            let meta =
                std::fs::metadata(value).map_err(|e| bad(format!("cannot read {value}: {e}")))?;
            if meta.len() > MAX_FILE_BYTES {
                return Err(bad(format!("{value} is larger than 64 KiB")));
            }
            std::fs::read_to_string(value).map_err(|e| bad(format!("cannot read {value}: {e}")))?
        } else {
            value.to_owned()
        };
        // An error names the shape, never the text.
        let raw: HashMap<String, String> = serde_json::from_str(&text).map_err(|_| {
            bad("not a JSON object of provider names to keys (or the absolute path of a file holding one)".into())
        })?;
        let mut keys = HashMap::new();
        for (name, key) in raw {
            let provider = Provider::deserialize(serde::de::value::StrDeserializer::<
                serde::de::value::Error,
            >::new(&name))
            .map_err(|_| {
                bad(format!(
                    "{name:?} is not a model provider (openai, anthropic)"
                ))
            })?;
            if key.trim().is_empty() {
                return Err(bad(format!("the key of {name:?} is empty")));
            }
            keys.insert(provider, SecretString::from(key));
        }
        Ok(SystemProviderKeys(keys))
    }

    /// The operator's key for `provider`, if one is set.
    pub fn get(&self, provider: Provider) -> Option<&SecretString> {
        self.0.get(&provider)
    }
}

/// Which key paid for a model call: recorded with the run's cost as
/// [`Payer::label`], never the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payer {
    /// The manifest's `model.connection`.
    Manifest(String),
    /// The organization's connection for the provider.
    Organization(String),
    /// `SYSTEM_PROVIDER_KEYS`' key for the provider.
    System(Provider),
}

impl Payer {
    /// `manifest:<connection>`, `organization:<connection>` or
    /// `system:<provider>`.
    pub fn label(&self) -> String {
        match self {
            Payer::Manifest(c) => format!("manifest:{c}"),
            Payer::Organization(c) => format!("organization:{c}"),
            Payer::System(p) => format!("system:{}", p.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_vault::ExposeSecret;

    #[test]
    fn system_keys_are_a_json_map_or_a_file_and_errors_never_show_a_key() {
        let k = SystemProviderKeys::from_var(Some(r#"{"openai":"sk-sys"}"#)).unwrap();
        assert_eq!(
            k.get(Provider::Openai)
                .map(|s| s.expose_secret().to_owned()),
            Some("sk-sys".into())
        );
        assert!(k.get(Provider::Anthropic).is_none());
        assert!(!format!("{k:?}").contains("sk-sys"));
        assert!(SystemProviderKeys::from_var(None).unwrap().0.is_empty());
        assert!(
            SystemProviderKeys::from_var(Some(" "))
                .unwrap()
                .0
                .is_empty()
        );
        for bad in [
            r#"{"mistral":"sk-secret-1"}"#,
            r#"{"openai":""}"#,
            r#"["sk-secret-1"]"#,
            "sk-secret-1",
        ] {
            let e = SystemProviderKeys::from_var(Some(bad)).unwrap_err();
            assert_eq!(e.var, ENV_SYSTEM_PROVIDER_KEYS);
            assert!(!e.message.contains("sk-secret-1"), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys.json");
        std::fs::write(&file, r#"{"anthropic":"sk-ant-file"}"#).unwrap();
        let k = SystemProviderKeys::from_var(Some(file.to_str().unwrap())).unwrap();
        assert!(k.get(Provider::Anthropic).is_some());
        let missing = dir.path().join("none.json");
        assert!(SystemProviderKeys::from_var(Some(missing.to_str().unwrap())).is_err());
    }

    #[test]
    fn a_payer_is_labelled_by_its_source_never_its_key() {
        assert_eq!(Payer::Manifest("m".into()).label(), "manifest:m");
        assert_eq!(
            Payer::Organization("model.openai".into()).label(),
            "organization:model.openai"
        );
        assert_eq!(
            Payer::System(Provider::Anthropic).label(),
            "system:anthropic"
        );
        assert_eq!(org_connection(Provider::Openai), "model.openai");
    }
}

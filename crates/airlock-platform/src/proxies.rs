//! Which upstream proxy a run's guarded connections go through, decided in
//! one place ([`RunProxy::choose`]).
//!
//! The operator offers named proxies (`SYSTEM_PROXIES`) beside its default
//! (`PROXY_URL`); an organization may choose one of the offered names
//! (`PUT /v1/org/proxy`). A run of an organization that chose a name still
//! offered goes through that proxy; any other run through `PROXY_URL`, or
//! directly when it is unset. A chosen name the operator no longer offers
//! falls back to `PROXY_URL` (with a warning), as a run with no choice.
//!
//! Whichever proxy is used, the egress guard still resolves and judges
//! every target first ([`airlock_egress::upstream`]). A run records the
//! proxy's label ([`RunProxy::label`]: the name, or [`PROXY_URL_LABEL`]),
//! never its URL: a URL may hold credentials, which are never logged,
//! recorded or answered.

use std::collections::BTreeMap;

use secrecy::{ExposeSecret as _, SecretString};

use crate::settings::{ENV_PROXY_URL, SettingsError};

/// The operator's named upstream proxies.
pub const ENV_SYSTEM_PROXIES: &str = "SYSTEM_PROXIES";

/// The label a run records when it went through `PROXY_URL`.
pub const PROXY_URL_LABEL: &str = ENV_PROXY_URL;

/// Longest proxy name.
const MAX_NAME: usize = 64;

/// `SYSTEM_PROXIES`: a JSON object of name → proxy URL
/// (`{"eu": "http://user:pass@proxy-eu:3128", "us": "http://proxy-us:3128"}`),
/// each URL as `PROXY_URL` takes it. Unset or empty: none. A name that is
/// not 1–64 of `[A-Za-z0-9._-]`, the name `PROXY_URL`, or a URL that is
/// not an `http://` proxy is refused at start, naming the variable and the
/// name, never a URL.
#[derive(Clone, Default)]
pub struct SystemProxies(BTreeMap<String, SecretString>);

impl std::fmt::Debug for SystemProxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SystemProxies")
            .field(&self.0.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl SystemProxies {
    /// Reads the variable's value (`None`: unset).
    pub fn from_var(value: Option<&str>) -> Result<Self, SettingsError> {
        let bad = |message: String| SettingsError {
            var: ENV_SYSTEM_PROXIES,
            message,
        };
        let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(Self::default());
        };
        // An error names the shape, never the text (it holds credentials).
        let raw: BTreeMap<String, String> = serde_json::from_str(value)
            .map_err(|_| bad("not a JSON object of proxy names to proxy URLs".into()))?;
        let mut proxies = BTreeMap::new();
        for (name, url) in raw {
            if !valid_name(&name) {
                return Err(bad(format!(
                    "{name:?} is not a proxy name (1-64 of A-Z a-z 0-9 . _ -, not {PROXY_URL_LABEL})"
                )));
            }
            if let Err(e) = airlock_egress::upstream::UpstreamProxy::parse(&url) {
                return Err(bad(format!(
                    "the proxy {name:?} is not usable: {}",
                    why(&e)
                )));
            }
            proxies.insert(name, SecretString::from(url));
        }
        Ok(SystemProxies(proxies))
    }

    /// The names offered, sorted.
    pub fn names(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }

    /// Whether the operator offers a proxy of this name.
    pub fn offers(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

/// The proxy a run's guarded connections go through.
#[derive(Debug, Clone, Default)]
pub struct RunProxy {
    /// What the run records: a `SYSTEM_PROXIES` name, [`PROXY_URL_LABEL`],
    /// or `None` (direct).
    pub label: Option<String>,
    /// The proxy's URL, handed to the run's sidecar only.
    pub url: Option<SecretString>,
}

impl RunProxy {
    /// The proxy of a run of an organization whose choice is `chosen`.
    pub fn choose(
        system: &SystemProxies,
        proxy_url: Option<&SecretString>,
        chosen: Option<&str>,
    ) -> RunProxy {
        if let Some(name) = chosen {
            if let Some(url) = system.0.get(name) {
                return RunProxy {
                    label: Some(name.to_owned()),
                    url: Some(url.clone()),
                };
            }
            tracing::warn!(
                proxy = name,
                "the organization's proxy is no longer offered (SYSTEM_PROXIES); its runs use PROXY_URL"
            );
        }
        match proxy_url.filter(|u| !u.expose_secret().trim().is_empty()) {
            Some(url) => RunProxy {
                label: Some(PROXY_URL_LABEL.to_owned()),
                url: Some(url.clone()),
            },
            None => RunProxy::default(),
        }
    }
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name != PROXY_URL_LABEL
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Why a URL is refused, without repeating it (nor `PROXY_URL`'s name,
/// which the upstream errors assume).
fn why(e: &airlock_egress::upstream::UpstreamError) -> &'static str {
    use airlock_egress::upstream::UpstreamError as E;
    match e {
        E::UrlUnparsable => "its URL does not parse",
        E::UrlNotHttp => "its URL must be an http:// proxy",
        E::UrlNoHost => "its URL has no host",
        _ => "its URL is not a proxy URL",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_proxies_are_read_and_refused_without_their_urls() {
        let p = SystemProxies::from_var(Some(
            r#"{"eu": "http://u:SECRET-PW@proxy-eu:3128", "us": "http://10.0.0.2:3128"}"#,
        ))
        .unwrap();
        assert_eq!(p.names(), ["eu", "us"]);
        assert!(p.offers("eu") && !p.offers("asia"));
        assert!(!format!("{p:?}").contains("SECRET-PW"));
        assert!(SystemProxies::from_var(None).unwrap().names().is_empty());
        assert!(
            SystemProxies::from_var(Some(" "))
                .unwrap()
                .names()
                .is_empty()
        );
        for bad in [
            r#"{"eu": "https://u:SECRET-PW@p:1"}"#,
            r#"{"eu": "not a url SECRET-PW"}"#,
            r#"{"e u": "http://u:SECRET-PW@p:1"}"#,
            r#"{"PROXY_URL": "http://u:SECRET-PW@p:1"}"#,
            r#"{"": "http://u:SECRET-PW@p:1"}"#,
            r#"["http://u:SECRET-PW@p:1"]"#,
            r#"{"eu": "http://u:SECRET-PW@p:1""#,
        ] {
            let e = SystemProxies::from_var(Some(bad)).unwrap_err();
            assert_eq!(e.var, ENV_SYSTEM_PROXIES, "{bad}");
            assert!(!e.to_string().contains("SECRET-PW"), "{e}");
        }
    }

    #[test]
    fn the_organizations_choice_wins_over_proxy_url() {
        let system =
            SystemProxies::from_var(Some(r#"{"eu": "http://u:pw@proxy-eu:3128"}"#)).unwrap();
        let default = SecretString::from("http://proxy:3128".to_owned());
        let chosen = RunProxy::choose(&system, Some(&default), Some("eu"));
        assert_eq!(chosen.label.as_deref(), Some("eu"));
        assert_eq!(
            chosen.url.unwrap().expose_secret(),
            "http://u:pw@proxy-eu:3128"
        );
        for choice in [None, Some("gone")] {
            let run = RunProxy::choose(&system, Some(&default), choice);
            assert_eq!(run.label.as_deref(), Some(PROXY_URL_LABEL));
            assert_eq!(run.url.unwrap().expose_secret(), "http://proxy:3128");
            let direct = RunProxy::choose(&system, None, choice);
            assert!(direct.label.is_none() && direct.url.is_none());
        }
    }
}

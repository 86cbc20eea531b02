//! The run's interception authority, for the intercepting proxy
//! ([`crate::proxy`], `inject = "proxy"` and local runners): the run's CA,
//! the leaf certificates it signed (one per CONNECT host, cached), and the
//! integrations whose credentials a request on each listener may carry.
//! Built once per run from the configuration; what a request then does is
//! the proxy's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use airlock_egress::{
    AuthorizedUris, CallRules, EgressCode, EgressPolicy, Intent, LiveRules, Target,
};
use airlock_platform_api::launch::{Integration, ProxyCa, placeholder};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use secrecy::ExposeSecret;

/// Leaf certificates kept per run (one per CONNECT host); past it the
/// cache starts again.
const MAX_CACHED_CERTS: usize = 256;

/// An integration whose credential the proxy may inject.
pub struct Injectable {
    pub namespace: String,
    /// What the agent (or runner) sends in its place.
    pub placeholder: String,
    pub authorized: AuthorizedUris,
    /// On the agent's listener (`inject = "proxy"`); a local runner's
    /// credential is injected on its own listener only.
    for_agent: bool,
    /// It has a connection and a delivery (a runner may have neither: its
    /// requests are then judged by its `authorized_uris`, and carry nothing).
    pub carries: bool,
}

/// The run's CA and what it signed so far.
pub struct Interceptor {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// One key for every leaf certificate of the run.
    leaf_key: rcgen::KeyPair,
    configs: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    injectable: Vec<Injectable>,
    /// The `[network]` rules: a CONNECT on the agent's listener to a host
    /// one of them must see inside is terminated here.
    network_rules: LiveRules,
}

/// Why the run's interception cannot start (its CA), or cannot present a
/// certificate for a host.
#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    #[error("the run's proxy CA is unusable: {0}")]
    CaKey(#[source] rcgen::Error),
    #[error("the run's proxy CA is unusable: {0}")]
    CaCert(#[source] rcgen::Error),
    #[error("the run's proxy CA is unusable: {0}")]
    LeafKey(#[source] rcgen::Error),
    #[error("certificate for {host}: {source}")]
    Leaf { host: String, source: rcgen::Error },
    #[error("{0}")]
    Tls(#[source] rustls::Error),
}

impl Interceptor {
    /// The interceptor of a run whose configuration has a CA and at least
    /// one integration with `inject = "proxy"` or a local runner, with a
    /// connection and a delivery, or `[network]` rules (one may have to see
    /// inside requests now, or after a live change).
    pub fn new(
        ca: &ProxyCa,
        integrations: &foldhash::HashMap<String, Integration>,
        network_rules: LiveRules,
    ) -> Result<Option<Interceptor>, InterceptError> {
        let mut injectable: Vec<Injectable> = integrations
            .values()
            .filter(|i| {
                let carries = i.has_connection && i.delivery.is_some();
                (i.inject_proxy && carries) || i.runner.is_some()
            })
            .map(|i| Injectable {
                namespace: i.namespace.to_string(),
                placeholder: placeholder(i.namespace.as_str()),
                authorized: i.authorized(),
                for_agent: i.inject_proxy,
                carries: i.has_connection && i.delivery.is_some(),
            })
            .collect();
        if injectable.is_empty() && network_rules.load().is_empty() {
            return Ok(None);
        }
        injectable.sort_by(|a, b| a.namespace.cmp(&b.namespace));
        let key =
            rcgen::KeyPair::from_pem(ca.key_pem.expose_secret()).map_err(InterceptError::CaKey)?;
        let issuer =
            rcgen::Issuer::from_ca_cert_pem(&ca.cert_pem, key).map_err(InterceptError::CaCert)?;
        Ok(Some(Interceptor {
            issuer,
            leaf_key: rcgen::KeyPair::generate().map_err(InterceptError::LeafKey)?,
            configs: Mutex::default(),
            injectable,
            network_rules,
        }))
    }

    /// The TLS configuration presenting a certificate for `host`.
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, InterceptError> {
        if let Some(c) = self.configs.lock().ok().and_then(|c| c.get(host).cloned()) {
            return Ok(c);
        }
        let leaf_error = |source| InterceptError::Leaf {
            host: host.to_owned(),
            source,
        };
        let mut params =
            rcgen::CertificateParams::new(vec![host.to_owned()]).map_err(leaf_error)?;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(2);
        let leaf = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(leaf_error)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(InterceptError::Tls)?
            .with_no_client_auth()
            .with_single_cert(vec![CertificateDer::from(leaf.der().to_vec())], key)
            .map_err(InterceptError::Tls)?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        if let Ok(mut c) = self.configs.lock() {
            if c.len() >= MAX_CACHED_CERTS {
                c.clear();
            }
            c.insert(host.to_owned(), cfg.clone());
        }
        Ok(cfg)
    }

    /// The integrations whose credentials requests on a listener may
    /// carry: the agent's (`runner` is `None`), or a local runner's own.
    fn candidates<'a>(
        &'a self,
        runner: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Injectable> + 'a {
        self.injectable.iter().filter(move |i| match runner {
            None => i.for_agent,
            Some(ns) => i.namespace == ns,
        })
    }

    /// Whether a CONNECT to `target` on a listener is terminated here:
    /// every CONNECT of a listener with [`Interceptor::candidates`], and on
    /// the agent's, one to a host a `[network]` rule must see inside (any
    /// other keeps its plain tunnel).
    pub fn serves(&self, runner: Option<&str>, target: &Target) -> bool {
        self.candidates(runner).next().is_some()
            || (runner.is_none() && self.network_rules.load().sees_inside(target))
    }

    /// The integration whose credential a request to `target` on a
    /// listener may carry: the first whose `authorized_uris` cover it under
    /// `policy`. An integration whose L7 rules refuse the request still
    /// covers it: the request is then refused naming its rule, never sent
    /// under the network policy instead.
    pub fn injectable_for<'a>(
        &'a self,
        policy: &EgressPolicy,
        runner: Option<&'a str>,
        target: &Target,
        method: &http::Method,
    ) -> Option<&'a Injectable> {
        self.candidates(runner).find(|i| {
            let rules = CallRules {
                authorized: &i.authorized,
                allow_all_uris: false,
                credentialed: i.carries,
            };
            match policy.check(target, Intent::Request(method), &rules) {
                Ok(_) => true,
                Err(e) => e.code == EgressCode::RuleRefused,
            }
        })
    }
}

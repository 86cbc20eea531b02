//! The sidecar configurations tests and benches start sidecars with, built
//! from the launch contract's own types ([`SidecarConfig`] and its parts):
//! a namespace, header or listener the contract would refuse cannot be
//! written, and [`SidecarConfigBuilder::build`] reads the document back as
//! the sidecar will, so a test fails where its configuration is made, not
//! where a sidecar refuses to start. A test of the sidecar's own refusal
//! writes its document with [`refused_document`], which insists the contract
//! refuses it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a panic is the calling test's failure

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

pub use airlock_platform_api::budget::RunBudget;
pub use airlock_platform_api::launch::{
    Delivery, EgressSettings, HeaderName, HeaderText, Integration, Limits, Listen, Model,
    Namespace, Network, NetworkEgress, Provider, ProxyCa, Runner, SidecarConfig,
};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

/// What the agent side presents to a [`SidecarConfigBuilder::detached`] sidecar.
pub const DETACHED_SIDECAR_TOKEN: &str =
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Any free port on loopback.
fn loopback_any() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A [`SidecarConfig`] under construction: the run's identity first, then
/// what the test needs; [`SidecarConfigBuilder::build`] checks it.
#[must_use]
pub struct SidecarConfigBuilder {
    cfg: SidecarConfig,
}

impl SidecarConfigBuilder {
    /// The run's identity and where its platform listens; no listener yet,
    /// no journal.
    pub fn new(
        run_id: &str,
        sidecar_token: &SecretString,
        run_token: &SecretString,
        platform_socket: &Path,
    ) -> SidecarConfigBuilder {
        let secret = |s: &SecretString| SecretString::from(s.expose_secret().to_owned());
        SidecarConfigBuilder {
            cfg: SidecarConfig {
                run_id: run_id.to_owned(),
                sidecar_token: secret(sidecar_token),
                run_token: secret(run_token),
                platform_socket: platform_socket.to_owned(),
                listen: Listen::default(),
                integrations: vec![],
                model: None,
                network: Network::default(),
                egress: EgressSettings::default(),
                limits: Limits::default(),
                proxy_url: None,
                egress_journal: None,
                proxy_ca: None,
                budget: RunBudget::default(),
                trace_steps: false,
            },
        }
    }

    /// A sidecar built in-process by a test of the sidecar crate: run
    /// `run_id`, whose agent presents [`DETACHED_SIDECAR_TOKEN`], whose run
    /// token no platform checks, its platform at `platform`, its API on a
    /// free loopback port.
    pub fn detached(run_id: &str, platform: &Path) -> SidecarConfigBuilder {
        SidecarConfigBuilder::new(
            run_id,
            &SecretString::from(DETACHED_SIDECAR_TOKEN.to_owned()),
            &SecretString::from(format!("{run_id}.00")),
            platform,
        )
        .tcp()
    }

    /// The API on a free loopback port.
    pub fn tcp(self) -> Self {
        self.tcp_at(loopback_any())
    }

    /// The API on `addr`.
    pub fn tcp_at(mut self, addr: SocketAddr) -> Self {
        self.cfg.listen.tcp = Some(addr);
        self
    }

    /// The forward proxy on a free loopback port.
    pub fn proxy_tcp(mut self) -> Self {
        self.cfg.listen.proxy_tcp = Some(loopback_any());
        self
    }

    /// The API on a unix socket.
    pub fn unix(mut self, path: impl Into<PathBuf>) -> Self {
        self.cfg.listen.unix = Some(path.into());
        self
    }

    /// Another platform socket (a stand-in platform of the test's own).
    pub fn platform_socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.cfg.platform_socket = path.into();
        self
    }

    /// The run's egress journal (a sidecar refuses to start without one).
    pub fn journal(mut self, path: impl Into<PathBuf>) -> Self {
        self.cfg.egress_journal = Some(path.into());
        self
    }

    /// No egress journal: a configuration the contract reads and the
    /// sidecar refuses to start with.
    pub fn without_journal(mut self) -> Self {
        self.cfg.egress_journal = None;
        self
    }

    /// One more integration.
    pub fn integration(mut self, i: impl Into<Integration>) -> Self {
        self.cfg.integrations.push(i.into());
        self
    }

    /// The run's model at `base_url`, without prices or provider tools.
    pub fn model(mut self, provider: Provider, base_url: &str) -> Self {
        self.cfg.model = Some(Model {
            provider,
            base_url: base_url.to_owned(),
            price_in_per_mtok_usd: None,
            price_out_per_mtok_usd: None,
            provider_tools: vec![],
            provider_fetch_uris: vec![],
            known_prices: vec![],
        });
        self
    }

    /// Changes the model set by [`SidecarConfigBuilder::model`].
    pub fn model_with(mut self, f: impl FnOnce(&mut Model)) -> Self {
        f(self.cfg.model.as_mut().expect("model_with before model"));
        self
    }

    /// The forward proxy's network policy.
    pub fn network(mut self, egress: NetworkEgress) -> Self {
        self.cfg.network.egress = egress;
        self
    }

    /// L7 rules narrowing the network policy (each `RuleSpec` as JSON).
    pub fn network_rules(mut self, rules: serde_json::Value) -> Self {
        self.cfg.network.rules = serde_json::from_value(rules).expect("rules that load");
        self
    }

    /// The forward proxy may reach only `patterns`.
    pub fn network_allow<S: ToString>(self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.network(NetworkEgress::Allow(
            patterns.into_iter().map(|p| p.to_string()).collect(),
        ))
    }

    /// Hosts the egress guard lets through although they are internal.
    pub fn allow_internal_hosts<S: ToString>(mut self, hosts: impl IntoIterator<Item = S>) -> Self {
        self.cfg
            .egress
            .allow_internal_hosts
            .extend(hosts.into_iter().map(|h| h.to_string()));
        self
    }

    /// A static answer for `host` (beside those set already).
    pub fn resolve(mut self, host: &str, ip: &str) -> Self {
        let ip: IpAddr = ip.parse().expect("an IP address");
        self.cfg
            .egress
            .resolve
            .entry(host.to_owned())
            .or_default()
            .push(ip);
        self
    }

    /// `host` is internal, let through and resolved to 127.0.0.1: the test's
    /// own server on loopback under a name.
    pub fn loopback_host(self, host: &str) -> Self {
        self.allow_internal_hosts([host]).resolve(host, "127.0.0.1")
    }

    /// Changes the operator's egress settings.
    pub fn egress_with(mut self, f: impl FnOnce(&mut EgressSettings)) -> Self {
        f(&mut self.cfg.egress);
        self
    }

    /// Changes the limits.
    pub fn limits(mut self, f: impl FnOnce(&mut Limits)) -> Self {
        f(&mut self.cfg.limits);
        self
    }

    /// The forward proxy's upstream proxy (`http://user:pass@host:port`).
    pub fn proxy_url(mut self, url: &str) -> Self {
        self.cfg.proxy_url = Some(SecretString::from(url.to_owned()));
        self
    }

    /// The run's CA, for `inject = "proxy"` integrations.
    pub fn proxy_ca(mut self, cert_pem: &str, key_pem: &SecretString) -> Self {
        self.cfg.proxy_ca = Some(ProxyCa {
            cert_pem: cert_pem.to_owned(),
            key_pem: SecretString::from(key_pem.expose_secret().to_owned()),
        });
        self
    }

    /// The model budgets the relay keeps.
    pub fn budget(mut self, f: impl FnOnce(&mut RunBudget)) -> Self {
        f(&mut self.cfg.budget);
        self
    }

    /// The configuration, read back as the sidecar reads it: panics with
    /// the contract's reason where it would refuse it.
    pub fn build(self) -> SidecarConfig {
        SidecarConfig::from_json(&self.cfg.to_json())
            .unwrap_or_else(|e| panic!("a sidecar configuration the contract refuses: {e}"))
    }
}

/// `open`: any URL on `host`:`port`, no stored connection (what the sidecar
/// crate's in-process tests and benches call through).
pub fn open_to(host: &str, port: u16) -> IntegrationBuilder {
    integration("open")
        .authorized([format!("http://{host}:{port}/**")])
        .without_connection()
}

/// An integration under construction (a namespace the contract accepts).
#[must_use]
pub struct IntegrationBuilder(Integration);

/// An integration `namespace` with a stored connection, no URI yet.
pub fn integration(namespace: &str) -> IntegrationBuilder {
    IntegrationBuilder(Integration {
        namespace: Namespace::parse(namespace).expect("a namespace the manifest accepts"),
        authorized_uris: vec![],
        allow_all_uris: false,
        rules: Default::default(),
        live_rules: None,
        tools: None,
        delivery: None,
        has_connection: true,
        mcp_url: None,
        inject_proxy: false,
        runner: None,
    })
}

impl IntegrationBuilder {
    /// URIs the integration may call.
    pub fn authorized<S: ToString>(mut self, uris: impl IntoIterator<Item = S>) -> Self {
        self.0
            .authorized_uris
            .extend(uris.into_iter().map(|u| u.to_string()));
        self
    }

    /// L7 rules narrowing the URIs (each `RuleSpec` as JSON).
    pub fn rules(mut self, rules: serde_json::Value) -> Self {
        self.0.rules = serde_json::from_value(rules).expect("rules that load");
        self
    }

    /// Only these of its tools are seen and called (`tools`).
    pub fn tools(mut self, tools: &[&str]) -> Self {
        let names = tools.iter().map(|t| (*t).to_owned()).collect();
        self.0.tools =
            Some(airlock_platform_api::launch::ToolAllowlist::new(names).expect("tool names"));
        self
    }

    /// Any URI (`allow_all_uris`).
    pub fn allow_all_uris(mut self) -> Self {
        self.0.allow_all_uris = true;
        self
    }

    /// The credential's `field` travels as `header: prefix<value>`.
    pub fn delivery(mut self, header: &str, prefix: &str, field: &str) -> Self {
        self.0.delivery = Some(Delivery {
            header: HeaderName::parse(header).expect("a header name"),
            prefix: HeaderText::parse(prefix).expect("a header value"),
            field: field.to_owned(),
            audience: None,
        });
        self
    }

    /// The credential's `field` travels as `Authorization: Bearer <value>`.
    pub fn bearer(self, field: &str) -> Self {
        self.delivery("Authorization", "Bearer ", field)
    }

    /// No stored connection: calls carry no credential.
    pub fn without_connection(mut self) -> Self {
        self.0.has_connection = false;
        self
    }

    /// A remote MCP server at `url`.
    pub fn mcp_url(mut self, url: &str) -> Self {
        self.0.mcp_url = Some(url.to_owned());
        self
    }

    /// `inject = "proxy"`.
    pub fn inject_proxy(self) -> Self {
        self.inject_proxy_if(true)
    }

    /// `inject = "proxy"` when `inject`.
    pub fn inject_proxy_if(mut self, inject: bool) -> Self {
        self.0.inject_proxy = inject;
        self
    }
}

impl From<IntegrationBuilder> for Integration {
    fn from(b: IntegrationBuilder) -> Integration {
        b.0
    }
}

/// The document written to the sidecar's stdin: the contract's
/// serialisation, less every key whose absence reads back the same (the
/// contract's defaults). It names what the test set and nothing else, as
/// the hand-written documents did, so an older build
/// (`AIRLOCK_BENCH_BASELINE`) that lacks a newer key's field reads it too.
pub fn document(cfg: &SidecarConfig) -> Vec<u8> {
    let full: Value = serde_json::from_slice(&cfg.to_json()).expect("the contract writes JSON");
    let mut doc = full.clone();
    prune(&mut doc, "", &full);
    serde_json::to_vec(&doc).expect("JSON")
}

/// Removes, below `pointer`, each key the contract reads back to `full`
/// without; recurses into the others.
fn prune(doc: &mut Value, pointer: &str, full: &Value) {
    let keys: Vec<String> = match doc.pointer(pointer) {
        Some(Value::Object(o)) => o.keys().cloned().collect(),
        Some(Value::Array(a)) => (0..a.len()).map(|i| i.to_string()).collect(),
        _ => return,
    };
    let is_object = doc.pointer(pointer).is_some_and(Value::is_object);
    for key in keys {
        let child = format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"));
        if is_object {
            let taken = doc
                .pointer_mut(pointer)
                .and_then(Value::as_object_mut)
                .and_then(|o| o.remove(&key));
            if reads_back(doc, full) {
                continue;
            }
            if let (Some(v), Some(Value::Object(o))) = (taken, doc.pointer_mut(pointer)) {
                o.insert(key, v);
            }
        }
        prune(doc, &child, full);
    }
}

/// Whether the contract reads `doc` as the configuration `full` spells.
fn reads_back(doc: &Value, full: &Value) -> bool {
    SidecarConfig::from_json(doc.to_string().as_bytes())
        .ok()
        .and_then(|c| serde_json::from_slice::<Value>(&c.to_json()).ok())
        .is_some_and(|v| v == *full)
}

/// `cfg`'s document changed by `edit` into one the contract refuses (what
/// a test of the sidecar's own refusal feeds it). Panics if the contract
/// reads the edited document: such a configuration is written with
/// [`SidecarConfigBuilder`].
pub fn refused_document(cfg: &SidecarConfig, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&document(cfg)).expect("JSON");
    edit(&mut v);
    let bytes = serde_json::to_vec(&v).expect("JSON");
    assert!(
        SidecarConfig::from_json(&bytes).is_err(),
        "the contract reads this document: build it with SidecarConfigBuilder"
    );
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> SidecarConfigBuilder {
        SidecarConfigBuilder::new(
            "run_1",
            &SecretString::from("s".repeat(64)),
            &SecretString::from("run_1.mac".to_owned()),
            Path::new("/run/p.sock"),
        )
    }

    #[test]
    fn the_document_names_only_what_was_set_and_reads_back_whole() {
        let cfg = base()
            .tcp()
            .journal("/run/egress.journal")
            .integration(
                integration("open")
                    .authorized(["http://a.test/**"])
                    .without_connection(),
            )
            .loopback_host("a.test")
            .limits(|l| l.max_request_bytes = 4096)
            .build();
        let doc = document(&cfg);
        let v: Value = serde_json::from_slice(&doc).unwrap();
        assert_eq!(
            v["integrations"][0],
            serde_json::json!({"namespace": "open", "authorized_uris": ["http://a.test/**"], "has_connection": false})
        );
        assert_eq!(v["limits"], serde_json::json!({"max_request_bytes": 4096}));
        assert!(
            v.get("network").is_none() && v.get("model").is_none(),
            "{v}"
        );
        assert_eq!(
            SidecarConfig::from_json(&doc).unwrap().to_json(),
            cfg.to_json()
        );
    }

    #[test]
    #[should_panic(expected = "listen needs unix or tcp")]
    fn a_configuration_the_contract_refuses_is_not_built() {
        let _ = base().build();
    }

    #[test]
    fn a_refused_document_must_be_refused() {
        let cfg = base().tcp().integration(integration("rm")).build();
        refused_document(&cfg, |v| v["integrations"][0]["namespace"] = "rm_".into());
        let accepted = std::panic::catch_unwind(|| {
            refused_document(&cfg, |v| v["integrations"][0]["namespace"] = "rm-x".into())
        });
        assert!(accepted.is_err());
    }
}

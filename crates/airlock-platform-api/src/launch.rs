//! What the platform hands the two processes of a run on their stdin: the
//! sidecar its configuration ([`SidecarConfig`]) and the runtime in the
//! sandbox its secrets ([`RuntimeSecrets`]). One typed definition for both
//! ends: the platform serialises these structs and the sidecar and the
//! runtime parse them (`deny_unknown_fields`), so a key one side spells
//! differently is a compile error, not a run that fails at start. Secrets
//! are [`SecretString`]s: `Debug` never prints them, and they are exposed
//! only when the document is written to the child's stdin.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use airlock_egress::{AuthorizedUris, RuleList};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize, Serializer};

pub use crate::types::{HeaderName, HeaderText, Namespace, NetworkEgress, Provider};

/// Largest configuration document the sidecar accepts on stdin.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;
/// Largest secrets document the runtime accepts on stdin.
pub const MAX_SECRETS_BYTES: usize = 64 * 1024;

fn expose<S: Serializer>(s: &SecretString, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s.expose_secret())
}

fn expose_opt<S: Serializer>(s: &Option<SecretString>, ser: S) -> Result<S::Ok, S::Error> {
    match s {
        Some(s) => ser.serialize_some(s.expose_secret()),
        None => ser.serialize_none(),
    }
}

/// `host:port`: a name or an address the other end resolves, and a port.
/// Checked when made, so a typo never reaches a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostPort {
    host: String,
    port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadHostPort(String);

impl HostPort {
    pub fn new(host: &str, port: u16) -> Result<HostPort, BadHostPort> {
        let name_ok = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
        if port == 0 || !(name_ok || host.parse::<std::net::IpAddr>().is_ok()) {
            return Err(BadHostPort(format!(
                "{host:?}:{port} is not a host name or address and a port"
            )));
        }
        Ok(HostPort {
            host: host.to_owned(),
            port,
        })
    }

    /// Every address of the host, `port` (a listener's bind address).
    pub fn any(port: u16) -> HostPort {
        HostPort {
            host: "0.0.0.0".into(),
            port,
        }
    }

    /// A name fixed in the code (a container's network alias): no check.
    pub fn fixed(host: &'static str, port: u16) -> HostPort {
        HostPort {
            host: host.to_owned(),
            port,
        }
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl TryFrom<String> for HostPort {
    type Error = BadHostPort;
    fn try_from(s: String) -> Result<HostPort, BadHostPort> {
        let bad = || BadHostPort(format!("{s:?} is not host:port"));
        let (host, port) = match s.strip_prefix('[') {
            // [v6]:port
            Some(rest) => rest.split_once("]:").ok_or_else(bad)?,
            None => s.rsplit_once(':').ok_or_else(bad)?,
        };
        HostPort::new(host, port.parse().map_err(|_| bad())?)
    }
}

impl From<HostPort> for String {
    fn from(h: HostPort) -> String {
        h.to_string()
    }
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// One of the sidecar's two listeners (its API, its forward proxy): where it
/// listens, or how the sandbox's runtime reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Endpoint {
    /// A unix socket (process and namespace backends: the run's sockets directory).
    Unix(PathBuf),
    /// TCP (the docker backend: `sidecar:8080` on the run's own network).
    Tcp(HostPort),
}

impl Endpoint {
    /// The socket's path, for a unix endpoint.
    pub fn unix_path(&self) -> Option<&Path> {
        match self {
            Endpoint::Unix(p) => Some(p),
            Endpoint::Tcp(_) => None,
        }
    }
}

/// What the orchestrator hands the runtime on stdin.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSecrets {
    pub run_id: String,
    /// The sidecar's API (`/mcp`, `/llm`, `/events`): `{"unix": path}` or
    /// `{"tcp": "host:port"}`.
    pub sidecar: Endpoint,
    /// The sidecar's forward proxy.
    #[serde(default)]
    pub proxy: Option<Endpoint>,
    #[serde(serialize_with = "expose")]
    pub sidecar_token: SecretString,
    #[serde(default = "default_heartbeat")]
    pub heartbeat_interval_secs: u64,
    /// The agent's working directory.
    pub workspace: PathBuf,
    /// The agent's working directory (default: the workspace).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The prompt, written to `$AIRLOCK_WORKSPACE/.airlock/prompt.txt`.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Extra non-secret environment for the agent.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// The certificate (PEM) of the run's CA, when the sidecar intercepts
    /// TLS: the runtime makes the agent's tools trust it.
    #[serde(default)]
    pub proxy_ca_pem: Option<String>,
    /// A directory the sandbox sees read-only, holding the run's input
    /// files: copied into the workspace (same relative paths) before the
    /// agent starts.
    #[serde(default)]
    pub inputs: Option<PathBuf>,
    /// The agent's output directory, relative to the workspace: what it
    /// leaves there is handed to the sidecar as the run's artifacts once it
    /// has exited ([`crate::files`]).
    #[serde(default)]
    pub outputs: Option<String>,
    /// The transparent plane, where the sandbox has one
    /// ([`crate::transparent`]): the runtime serves its resolver and
    /// carries its connections to `proxy`.
    #[serde(default)]
    pub transparent: Option<crate::transparent::TransparentPlane>,
}

fn default_heartbeat() -> u64 {
    15
}

#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("runtime secrets: larger than {MAX_SECRETS_BYTES} bytes")]
    TooLarge,
    #[error("runtime secrets: {0}")]
    Parse(String),
}

impl RuntimeSecrets {
    pub fn from_json(bytes: &[u8]) -> Result<Self, SecretsError> {
        if bytes.len() > MAX_SECRETS_BYTES {
            return Err(SecretsError::TooLarge);
        }
        serde_json::from_slice(bytes).map_err(|e| SecretsError::Parse(e.to_string()))
    }

    /// The document written to the runtime's stdin (secrets exposed here only).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SidecarConfig {
    pub run_id: String,
    /// What the agent side presents (hex, 32 random bytes).
    #[serde(serialize_with = "expose")]
    pub sidecar_token: SecretString,
    /// What the sidecar presents to the platform (`<runId>.<hmac>`).
    #[serde(serialize_with = "expose")]
    pub run_token: SecretString,
    /// The platform's internal API socket.
    pub platform_socket: PathBuf,
    pub listen: Listen,
    #[serde(default)]
    pub integrations: Vec<Integration>,
    #[serde(default)]
    pub model: Option<Model>,
    #[serde(default)]
    pub network: Network,
    #[serde(default)]
    pub egress: EgressSettings,
    #[serde(default)]
    pub limits: Limits,
    /// Upstream HTTP proxy for the forward proxy (`http://user:pass@host:port`).
    #[serde(default, serialize_with = "expose_opt")]
    pub proxy_url: Option<SecretString>,
    /// The run's egress journal, created by the platform (a regular file,
    /// 0600, in the run's directory): every egress record is appended to it
    /// before the request leaves. A sidecar refuses to start without one.
    #[serde(default)]
    pub egress_journal: Option<PathBuf>,
    /// The run's CA, when an integration has `inject = "proxy"`.
    #[serde(default)]
    pub proxy_ca: Option<ProxyCa>,
    /// The model budgets the relay enforces.
    #[serde(default)]
    pub budget: crate::budget::RunBudget,
    /// The run is traced: each egress record carries the sidecar's own
    /// steps of its request (`wire::Steps`), which the platform exports as
    /// spans. Off: no step is timed.
    #[serde(default)]
    pub trace_steps: bool,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Listen {
    /// `/mcp`, `/llm`, `/events`, `/health` on a unix socket.
    #[serde(default)]
    pub unix: Option<PathBuf>,
    /// The same on TCP (the docker backend: `:8080`).
    #[serde(default)]
    pub tcp: Option<SocketAddr>,
    /// The forward proxy on a unix socket.
    #[serde(default)]
    pub proxy_unix: Option<PathBuf>,
    /// The forward proxy on TCP (the docker backend: `:8081`).
    #[serde(default)]
    pub proxy_tcp: Option<SocketAddr>,
}

impl Listen {
    /// The `listen` object of a backend's placement (API, proxy): a TCP
    /// listener must be an address.
    pub fn from_endpoints(api: &Endpoint, proxy: &Endpoint) -> Result<Listen, BadHostPort> {
        let addr = |h: &HostPort| {
            h.to_string()
                .parse::<SocketAddr>()
                .map_err(|_| BadHostPort(format!("{h} is not an address to listen on")))
        };
        let mut l = Listen::default();
        match api {
            Endpoint::Unix(p) => l.unix = Some(p.clone()),
            Endpoint::Tcp(h) => l.tcp = Some(addr(h)?),
        }
        match proxy {
            Endpoint::Unix(p) => l.proxy_unix = Some(p.clone()),
            Endpoint::Tcp(h) => l.proxy_tcp = Some(addr(h)?),
        }
        Ok(l)
    }
}

/// The delivery field that names the run's workload identity token (a JWT
/// the platform signs for the run) instead of a field of a connection's
/// credential: `${…}` marks a value Airlock makes.
pub const IDENTITY_FIELD: &str = "${airlock.identity}";

/// The credential field that holds the identity token: the platform adds
/// it to the fields it hands for an integration whose delivery names
/// [`IDENTITY_FIELD`], so every step of the credential path (the delivery
/// header, a `{{airlock.identity}}` placeholder, the proxy's placeholder,
/// the redactor) treats it as one more field.
pub const IDENTITY_CREDENTIAL_FIELD: &str = "airlock.identity";

/// The audience of an identity token when the delivery names none.
pub const DEFAULT_IDENTITY_AUDIENCE: &str = "sts.amazonaws.com";

/// How the credential travels in the outbound request (the manifest's
/// `delivery`, as it is): a header name and a prefix that can only make
/// a valid header, checked where the manifest is read and again where the
/// configuration is.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Delivery {
    /// Header name, e.g. `Authorization`.
    pub header: HeaderName,
    #[serde(default)]
    pub prefix: HeaderText,
    /// The credential field whose value is delivered ([`IDENTITY_FIELD`]:
    /// the run's identity token).
    pub field: String,
    /// The identity token's `aud` (only with [`IDENTITY_FIELD`]; default
    /// [`DEFAULT_IDENTITY_AUDIENCE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}

impl Delivery {
    /// The delivery names the run's identity token.
    pub fn names_identity(&self) -> bool {
        self.field == IDENTITY_FIELD
    }

    /// The credential field whose value is delivered.
    pub fn credential_field(&self) -> &str {
        if self.names_identity() {
            IDENTITY_CREDENTIAL_FIELD
        } else {
            &self.field
        }
    }

    /// The audience of the identity token it delivers.
    pub fn identity_audience(&self) -> &str {
        self.audience
            .as_deref()
            .unwrap_or(DEFAULT_IDENTITY_AUDIENCE)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Integration {
    pub namespace: Namespace,
    #[serde(default)]
    pub authorized_uris: Vec<String>,
    #[serde(default)]
    pub allow_all_uris: bool,
    /// The L7 rules narrowing `authorized_uris` (methods, paths, query),
    /// compiled when the configuration is read.
    #[serde(default, skip_serializing_if = "RuleList::is_empty")]
    pub rules: RuleList,
    /// The sidecar's live list of these rules, once it follows the run's
    /// live policy (docs/egress.md, "Live policy"): then every egress site
    /// of the integration judges by it, read at each decision. Never on
    /// the wire.
    #[serde(skip)]
    pub live_rules: Option<airlock_egress::LiveRules>,
    /// Which of the integration's MCP tools the agent may see and call
    /// (its `api_call` and its server's, by the server's own name); `None`:
    /// every tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<ToolAllowlist>,
    #[serde(default)]
    pub delivery: Option<Delivery>,
    /// The integration's calls carry a credential (a stored connection,
    /// almost always, or the run's identity token): the credential rules
    /// apply and the sidecar fetches the credential from the platform.
    #[serde(default = "yes")]
    pub has_connection: bool,
    /// A remote MCP server (the manifest's `source = { kind = "remote", url }`):
    /// the sidecar is its MCP client, through the egress guard under this
    /// integration's rules and credential, and serves its tools on `/mcp`
    /// as `{namespace}__{tool}`.
    #[serde(default)]
    pub mcp_url: Option<String>,
    /// `inject = "proxy"`: the sidecar's intercepting proxy replaces this
    /// integration's placeholder ([`placeholder`]) with the credential's
    /// delivery field in a request that `authorized_uris` covers.
    #[serde(default)]
    pub inject_proxy: bool,
    /// A local MCP runner (the manifest's `source = { kind = "local", command }`):
    /// started by the platform in a sandbox of its own, it speaks MCP to the
    /// sidecar over [`Runner::mcp`] and reaches the outside only through
    /// [`Runner::proxy`], bounded by this integration's `authorized_uris`,
    /// where its placeholder becomes the credential.
    #[serde(default)]
    pub runner: Option<Runner>,
}

/// An integration's `tools`: the names (as its server spells them, or
/// `api_call`) the agent may see and call. Exact and case-sensitive; `*`
/// matches any run of characters. `[]` allows none. Every tool not allowed
/// is left out of `tools/list` and refused on `tools/call`, by this one
/// decision ([`ToolAllowlist::allows`]).
#[derive(Debug, Clone)]
pub struct ToolAllowlist {
    entries: Vec<String>,
    globs: Vec<airlock_egress::glob::Glob>,
}

/// Why a `tools` entry cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tools entry {0:?} is not 1-64 of A-Z a-z 0-9 _ . - and *")]
pub struct BadToolName(pub String);

impl ToolAllowlist {
    pub fn new(entries: Vec<String>) -> Result<ToolAllowlist, BadToolName> {
        let mut globs = Vec::with_capacity(entries.len());
        for e in &entries {
            let ok = !e.is_empty()
                && e.len() <= 64
                && e.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-*".contains(&b));
            let glob = airlock_egress::glob::Glob::compile(e, airlock_egress::glob::Kind::Path)
                .ok()
                .filter(|_| ok)
                .ok_or_else(|| BadToolName(e.clone()))?;
            globs.push(glob);
        }
        Ok(ToolAllowlist { entries, globs })
    }

    /// The decision: may the agent see and call the tool the server (or the
    /// sidecar, for `api_call`) names `tool`?
    pub fn allows(&self, tool: &str) -> bool {
        self.globs.iter().any(|g| g.matches(tool))
    }

    pub fn entries(&self) -> &[String] {
        &self.entries
    }

    /// Whether an entry holds a wildcard.
    pub fn has_wildcards(&self) -> bool {
        self.entries.iter().any(|e| e.contains('*'))
    }
}

impl Serialize for ToolAllowlist {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.entries.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ToolAllowlist {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ToolAllowlist, D::Error> {
        ToolAllowlist::new(Vec::<String>::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl Integration {
    /// Whether the agent may see and call the integration's tool `tool`
    /// (its server's name, or `api_call`): its `tools` allowlist, or every
    /// tool without one.
    pub fn allows_tool(&self, tool: &str) -> bool {
        self.tools.as_ref().is_none_or(|t| t.allows(tool))
    }

    /// What the integration's requests may reach: its `authorized_uris`
    /// narrowed by its rules. Every egress site of the integration judges
    /// with this list (or [`Integration::authorized_with`]'s).
    pub fn authorized(&self) -> AuthorizedUris {
        AuthorizedUris::parse(&self.authorized_uris).with_rules(self.rules_in_force())
    }

    /// [`Integration::authorized`] with `{$credential.field}` templates
    /// rendered from a connection's fields.
    pub fn authorized_with(&self, fields: &BTreeMap<String, SecretString>) -> AuthorizedUris {
        AuthorizedUris::render(&self.authorized_uris, fields).with_rules(self.rules_in_force())
    }

    /// Whether a request of the integration may be held for a person now:
    /// some rule in force is an `ask` rule.
    pub fn may_hold(&self) -> bool {
        self.rules_in_force().load().any_asks()
    }

    /// The live list when the sidecar follows one, else the rules as read.
    fn rules_in_force(&self) -> airlock_egress::RulesSource {
        match &self.live_rules {
            Some(live) => live.clone().into(),
            None => self.rules.compiled().into(),
        }
    }
}

/// Where the sidecar listens for one local MCP runner (as the sidecar sees it).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Runner {
    /// The runner's MCP stream: its bridge connects here once and relays
    /// the server's stdio (newline-delimited JSON-RPC).
    pub mcp: Endpoint,
    /// The runner's forward proxy, its only way out.
    pub proxy: Endpoint,
    /// What the runner's bridge presents to [`Runner::proxy`] (the
    /// runner's own, not the agent's sidecar token).
    #[serde(serialize_with = "expose")]
    pub token: SecretString,
}

/// The non-secret stand-in an agent's unmodified tools send where the
/// credential of integration `namespace` would go (`inject = "proxy"`):
/// `AIRLOCK_PLACEHOLDER_<NAMESPACE>`, upper case, `-` as `_`.
pub fn placeholder(namespace: &str) -> String {
    format!(
        "AIRLOCK_PLACEHOLDER_{}",
        namespace.to_ascii_uppercase().replace('-', "_")
    )
}

/// Two namespaces of one run that one [`placeholder`] names (`a-b` and
/// `a_b`: an environment variable's name holds no `-`), so that it would
/// stand for either credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "namespace {first:?} and namespace {second:?} share the placeholder {placeholder}: rename one"
)]
pub struct SharedPlaceholder {
    pub first: String,
    pub second: String,
    pub placeholder: String,
}

/// Refuses a run's namespaces two of which share a [`placeholder`] (the
/// manifest's check and the sidecar's configuration's alike). The same
/// namespace twice is not this decision's: each caller refuses it as a
/// duplicate.
///
/// Decided: the spelling stays readable (`AIRLOCK_PLACEHOLDER_MY_SVC` for
/// `my-svc`, what the docs and the agents' environments hold) and the
/// rare pair it cannot tell apart is refused; an injective spelling would
/// need an escape for `-` and would rename every placeholder of a
/// namespace with a `-`.
pub fn distinct_placeholders<'a>(
    namespaces: impl IntoIterator<Item = &'a str>,
) -> Result<(), SharedPlaceholder> {
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for ns in namespaces {
        let placeholder = placeholder(ns);
        match seen.get(&placeholder) {
            Some(first) if *first != ns => {
                return Err(SharedPlaceholder {
                    first: (*first).to_owned(),
                    second: ns.to_owned(),
                    placeholder,
                });
            }
            Some(_) => {}
            None => {
                seen.insert(placeholder, ns);
            }
        }
    }
    Ok(())
}

/// The run's own certificate authority, made for this run only by the
/// platform: the sidecar's intercepting proxy signs its certificates with
/// it; the sandbox trusts its certificate (never holds its key).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyCa {
    pub cert_pem: String,
    #[serde(serialize_with = "expose")]
    pub key_pem: SecretString,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    pub provider: Provider,
    /// e.g. `https://api.openai.com/v1`, `https://api.anthropic.com`.
    pub base_url: String,
    /// Prices per million tokens, for the cost events (optional).
    #[serde(default)]
    pub price_in_per_mtok_usd: Option<f64>,
    #[serde(default)]
    pub price_out_per_mtok_usd: Option<f64>,
    /// Provider-side tools model requests may ask for (the manifest's
    /// `model.provider_tools`).
    #[serde(default)]
    pub provider_tools: Vec<String>,
    /// URLs model requests may ask the provider to fetch (`authorized_uris`
    /// patterns; the manifest's `model.provider_fetch_uris`).
    #[serde(default)]
    pub provider_fetch_uris: Vec<String>,
    /// The model registry's prices for this provider's models (the bundled
    /// registry and the live catalog): a call whose model is listed here is
    /// priced at its entry unless the manifest names a price, which wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub known_prices: Vec<ModelPrice>,
}

/// One model's prices per million tokens (USD), by its id.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    pub model: String,
    #[serde(default)]
    pub price_in_per_mtok_usd: Option<f64>,
    #[serde(default)]
    pub price_out_per_mtok_usd: Option<f64>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub egress: NetworkEgress,
    /// The L7 rules narrowing `egress` on the agent's proxy.
    #[serde(default, skip_serializing_if = "RuleList::is_empty")]
    pub rules: RuleList,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            egress: NetworkEgress::None,
            rules: RuleList::default(),
        }
    }
}

/// Operator egress settings that travel with the run.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSettings {
    /// `EGRESS_ALLOW_INTERNAL_HOSTS`.
    #[serde(default)]
    pub allow_internal_hosts: Vec<String>,
    /// `AIRLOCK_DNS_SERVER` (`ip` or `ip:port`).
    #[serde(default)]
    pub dns_server: Option<String>,
    /// Static answers (`host -> [ip]`), consulted before any resolver.
    #[serde(default)]
    pub resolve: BTreeMap<String, Vec<std::net::IpAddr>>,
    /// Extra trust anchors (PEM), beside the Mozilla roots.
    #[serde(default)]
    pub extra_ca_pem: Option<String>,
    /// Names refused on every call (the run's own containers).
    #[serde(default)]
    pub blocked_names: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest result returned inline to the agent (256 KiB).
    pub inline_result_bytes: usize,
    /// Total stored results per run (64 MiB).
    pub run_result_bytes: u64,
    /// Concurrent `api_call`s per run (16).
    pub max_concurrent_calls: usize,
    /// Largest request body the sidecar accepts from the agent (10 MiB).
    pub max_request_bytes: usize,
    /// Largest upstream response (32 MiB).
    pub max_response_bytes: usize,
    /// Whole outbound exchange (60 s).
    pub upstream_timeout_secs: u64,
    /// A forward-proxy tunnel with no bytes either way for this long is closed (120 s).
    pub proxy_idle_timeout_secs: u64,
    /// Open forward-proxy connections per run (256); more wait to be accepted.
    pub max_proxy_connections: usize,
    /// Open MCP sessions (2025-11-25 mode) per run (32): opening one more
    /// closes the oldest. Stateless calls open none.
    pub max_mcp_sessions: usize,
    /// Largest egress journal (64 MiB): past it, no further request is sent.
    pub egress_journal_bytes: u64,
    /// Open connections on each of the sidecar's API listeners (256): past
    /// it, an idle one (of the client process holding the most) gives way to
    /// a newcomer, or the newcomer is closed ([`crate::listener_guard`]).
    pub max_api_connections: usize,
    /// Time an API connection has to send a request head, from its opening
    /// or its previous answer's end (10 s).
    pub api_header_read_timeout_secs: u64,
    /// An API connection with no byte either way for this long is closed,
    /// a request in progress included (300 s).
    pub api_idle_timeout_secs: u64,
}

impl Limits {
    /// The rules of the sidecar's API listeners.
    pub fn api_listener(&self) -> crate::listener_guard::Settings {
        crate::listener_guard::Settings {
            max_connections: self.max_api_connections.max(1),
            // Per client process; the runtime's own connections come from
            // another process than the agent's, but all the agent's may too.
            max_connections_per_peer: self.max_api_connections.max(1),
            header_read_timeout: std::time::Duration::from_secs(
                self.api_header_read_timeout_secs.max(1),
            ),
            idle_timeout: std::time::Duration::from_secs(self.api_idle_timeout_secs.max(1)),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            inline_result_bytes: 256 * 1024,
            run_result_bytes: 64 * 1024 * 1024,
            max_concurrent_calls: 16,
            max_request_bytes: 10 * 1024 * 1024,
            max_response_bytes: 32 * 1024 * 1024,
            upstream_timeout_secs: 60,
            proxy_idle_timeout_secs: 120,
            max_proxy_connections: 256,
            max_mcp_sessions: 32,
            egress_journal_bytes: crate::wire::EGRESS_JOURNAL_MAX_BYTES,
            max_api_connections: 256,
            api_header_read_timeout_secs: 10,
            api_idle_timeout_secs: 300,
        }
    }
}

/// The sidecar's first line on stdout, written once every listener is
/// bound (`{"ready":true,"run_id":…,"listen":{…}}`): the platform starts
/// the sandbox only after reading it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SidecarReady {
    /// Always `true`: a line with anything else is not readiness.
    pub ready: bool,
    pub run_id: String,
    pub listen: ReadyListen,
}

/// Where the sidecar listens, as bound (a TCP port 0 is resolved here).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct ReadyListen {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<SocketAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_unix: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_tcp: Option<SocketAddr>,
    /// Each local runner's two sockets (its MCP stream, its proxy), under
    /// `runner_<namespace>`.
    #[serde(flatten)]
    pub runners: BTreeMap<String, [PathBuf; 2]>,
}

/// Why a line is not the sidecar's readiness.
#[derive(Debug, thiserror::Error)]
pub enum NotReadyLine {
    #[error("not a readiness line: {0}")]
    Parse(#[source] serde_json::Error),
    #[error("the readiness line says it is not ready")]
    NotReady,
}

impl SidecarReady {
    pub fn new(run_id: &str, listen: ReadyListen) -> SidecarReady {
        SidecarReady {
            ready: true,
            run_id: run_id.to_owned(),
            listen,
        }
    }

    /// The line the sidecar prints (no newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The sidecar's line, parsed: ready, or why not.
    pub fn from_line(line: &str) -> Result<SidecarReady, NotReadyLine> {
        let r: SidecarReady = serde_json::from_str(line.trim()).map_err(NotReadyLine::Parse)?;
        match r.ready {
            true => Ok(r),
            false => Err(NotReadyLine::NotReady),
        }
    }
}

/// The sidecar's last line on stdout (`{"flushed":true}`), written once it
/// has stopped and nothing of it runs any more: every request it let out
/// has ended and is in its journal (or was refused and recorded), every
/// event it took is handed on. Nothing is recorded after it, so the
/// platform records the run's end once it has read it (or seen the
/// sidecar exit), before the sidecar's sandbox is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SidecarFlushed {
    /// Always `true`.
    pub flushed: bool,
}

impl SidecarFlushed {
    /// The line the sidecar prints (no newline).
    pub fn line() -> String {
        serde_json::to_string(&SidecarFlushed { flushed: true }).unwrap_or_default()
    }

    /// Whether `line` is the sidecar's flushed line.
    pub fn is(line: &str) -> bool {
        serde_json::from_str::<SidecarFlushed>(line.trim()).is_ok_and(|f| f.flushed)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("sidecar configuration is larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge,
    #[error("sidecar configuration is not valid JSON for this version: {0}")]
    Parse(String),
    #[error("sidecar configuration is invalid: {0}")]
    Invalid(String),
    #[error("sidecar configuration is invalid: {0}")]
    SharedPlaceholder(#[from] SharedPlaceholder),
}

impl SidecarConfig {
    /// The document written to the sidecar's stdin (secrets exposed here only).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        if bytes.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge);
        }
        let cfg: SidecarConfig =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Parse(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.sidecar_token.expose_secret().len() < 32 {
            return Err(ConfigError::Invalid(
                "sidecar_token is shorter than 32 characters".into(),
            ));
        }
        if self.listen.unix.is_none() && self.listen.tcp.is_none() {
            return Err(ConfigError::Invalid("listen needs unix or tcp".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for i in &self.integrations {
            // Every tool name must name one integration (each namespace is
            // checked as it is read).
            if !seen.insert(&i.namespace) {
                return Err(ConfigError::Invalid(format!(
                    "integration {:?} is listed twice",
                    i.namespace
                )));
            }
        }
        distinct_placeholders(self.integrations.iter().map(|i| i.namespace.as_str()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flushed line round-trips; a readiness line, a `false` or a
    /// line with more in it is not it.
    #[test]
    fn the_flushed_line_is_only_itself() {
        assert!(SidecarFlushed::is(&SidecarFlushed::line()));
        assert!(SidecarFlushed::is("{\"flushed\":true}\n"));
        assert!(!SidecarFlushed::is("{\"flushed\":false}"));
        assert!(!SidecarFlushed::is("{\"flushed\":true,\"more\":1}"));
        assert!(!SidecarFlushed::is(
            &SidecarReady::new("run_1", ReadyListen::default()).to_line()
        ));
    }

    fn secret(s: &str) -> SecretString {
        SecretString::from(s.to_owned())
    }

    fn sidecar() -> SidecarConfig {
        SidecarConfig {
            run_id: "run_1".into(),
            sidecar_token: secret(&"s".repeat(64)),
            run_token: secret("run_1.RUN-TOKEN-MAC"),
            platform_socket: "/run/p.sock".into(),
            listen: Listen::from_endpoints(
                &Endpoint::Tcp(HostPort::any(8080)),
                &Endpoint::Unix("/run/proxy.sock".into()),
            )
            .unwrap(),
            integrations: vec![Integration {
                namespace: Namespace::parse("github").unwrap(),
                authorized_uris: vec!["https://api.github.com/**".into()],
                allow_all_uris: false,
                live_rules: None,
                rules: serde_json::from_str(
                    r#"[{"id":"gh-read","host":"https://api.github.com","access":"read-only","paths":["/repos/**"],"query":["page"]}]"#,
                )
                .unwrap(),
                tools: Some(ToolAllowlist::new(vec!["api_call".into(), "search_*".into()]).unwrap()),
                delivery: Some(Delivery {
                    header: HeaderName::parse("Authorization").unwrap(),
                    prefix: HeaderText::parse("Bearer ").unwrap(),
                    field: "token".into(),
                    audience: None,
                }),
                has_connection: true,
                mcp_url: Some("https://mcp.github.test/mcp".into()),
                inject_proxy: true,
                runner: Some(Runner {
                    mcp: Endpoint::Unix("/run/r0/mcp.sock".into()),
                    proxy: Endpoint::Unix("/run/r0/proxy.sock".into()),
                    token: secret("RUNNER-TOKEN"),
                }),
            }],
            model: Some(Model {
                provider: Provider::Anthropic,
                base_url: "https://api.anthropic.com".into(),
                price_in_per_mtok_usd: Some(3.0),
                provider_tools: vec![],
                provider_fetch_uris: vec![],
                known_prices: vec![],
                price_out_per_mtok_usd: None,
            }),
            network: Network {
                egress: NetworkEgress::Allow(vec!["https://pypi.org/**".into()]),
                rules: serde_json::from_str(r#"[{"host":"https://pypi.org","methods":["GET"]}]"#)
                    .unwrap(),
            },
            egress: EgressSettings {
                allow_internal_hosts: vec!["db.internal".into()],
                dns_server: Some("127.0.0.1:5353".into()),
                blocked_names: vec!["sidecar".into()],
                ..Default::default()
            },
            limits: Limits::default(),
            proxy_url: Some(secret("http://u:PROXY-PASS@proxy:3128")),
            egress_journal: Some("/var/lib/airlock/runs/r1/egress.journal".into()),
            proxy_ca: Some(ProxyCa {
                cert_pem: "-----BEGIN CERTIFICATE-----".into(),
                key_pem: secret("CA-PRIVATE-KEY"),
            }),
            budget: crate::budget::RunBudget {
                run: crate::budget::Limits {
                    tokens: Some(1000),
                    cost_microusd: None,
                    requests: Some(3),
                },
                org: true,
                default_max_output_tokens: 0,
            },
            trace_steps: true,
        }
    }

    #[test]
    fn what_the_platform_writes_the_sidecar_reads_back_whole() {
        let cfg = sidecar();
        let bytes = cfg.to_json();
        let back = SidecarConfig::from_json(&bytes).unwrap();
        assert_eq!(back.run_token.expose_secret(), "run_1.RUN-TOKEN-MAC");
        assert_eq!(back.sidecar_token.expose_secret(), "s".repeat(64));
        assert_eq!(
            back.proxy_url
                .as_ref()
                .map(|s| s.expose_secret().to_owned()),
            Some("http://u:PROXY-PASS@proxy:3128".into())
        );
        assert_eq!(back.listen.tcp, Some("0.0.0.0:8080".parse().unwrap()));
        assert_eq!(back.listen.proxy_unix, Some("/run/proxy.sock".into()));
        assert_eq!(
            back.integrations[0]
                .delivery
                .as_ref()
                .unwrap()
                .prefix
                .as_str(),
            "Bearer "
        );
        assert_eq!(back.model.as_ref().unwrap().provider, Provider::Anthropic);
        assert_eq!(back.network.egress, cfg.network.egress);
        assert_eq!(back.network.rules, cfg.network.rules);
        assert_eq!(back.integrations[0].rules, cfg.integrations[0].rules);
        let tools = back.integrations[0].tools.as_ref().unwrap();
        assert_eq!(tools.entries(), ["api_call", "search_*"]);
        assert!(
            tools.allows("search_code") && !tools.allows("Search_code") && !tools.allows("delete")
        );
        assert_eq!(
            back.integrations[0].rules.specs()[0].id.as_deref(),
            Some("gh-read")
        );
        assert_eq!(back.egress.blocked_names, ["sidecar"]);
        assert_eq!(
            back.proxy_ca.as_ref().unwrap().key_pem.expose_secret(),
            "CA-PRIVATE-KEY"
        );
        let runner = back.integrations[0].runner.as_ref().unwrap();
        assert_eq!(runner.token.expose_secret(), "RUNNER-TOKEN");
        assert_eq!(runner.proxy, Endpoint::Unix("/run/r0/proxy.sock".into()));
        // Written again, the same document: nothing dropped on the way.
        assert_eq!(back.to_json(), bytes);
    }

    #[test]
    fn secrets_never_appear_in_debug_output() {
        let text = format!("{:?}", sidecar());
        for s in [
            "RUN-TOKEN-MAC",
            "PROXY-PASS",
            "CA-PRIVATE-KEY",
            "RUNNER-TOKEN",
            &"s".repeat(64),
        ] {
            assert!(!text.contains(s), "{s} in {text}");
        }
        let r = RuntimeSecrets {
            run_id: "run_1".into(),
            sidecar: Endpoint::Tcp(HostPort::fixed("sidecar", 8080)),
            proxy: None,
            sidecar_token: secret("SIDECAR-TOKEN-VALUE"),
            heartbeat_interval_secs: 15,
            workspace: "/workspace".into(),
            cwd: None,
            prompt: None,
            env: vec![],
            proxy_ca_pem: None,
            inputs: None,
            outputs: None,
            transparent: None,
        };
        let bytes = r.to_json();
        let back = RuntimeSecrets::from_json(&bytes).unwrap();
        assert_eq!(back.sidecar_token.expose_secret(), "SIDECAR-TOKEN-VALUE");
        assert_eq!(back.sidecar, r.sidecar);
        assert_eq!(back.to_json(), bytes);
    }

    #[test]
    fn a_key_either_side_does_not_know_is_refused() {
        let mut v: serde_json::Value = serde_json::from_slice(&sidecar().to_json()).unwrap();
        v["listen"]["tpc"] = "0.0.0.0:1".into();
        let e = SidecarConfig::from_json(v.to_string().as_bytes())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("unknown field `tpc`"), "{e}");
        let e = RuntimeSecrets::from_json(br#"{"run_id":"r","sidecar":{"unix":"/s"},"sidecar_token":"t","workspace":"/w","heartbeat":1}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with("runtime secrets: unknown field `heartbeat`"),
            "{e}"
        );
        assert!(RuntimeSecrets::from_json(&vec![b' '; MAX_SECRETS_BYTES + 1]).is_err());
        assert!(matches!(
            SidecarConfig::from_json(&vec![b' '; MAX_CONFIG_BYTES + 1]),
            Err(ConfigError::TooLarge)
        ));
    }

    /// A namespace, header name or header text the manifest would refuse
    /// is refused where the configuration is read, naming the value.
    #[test]
    fn a_value_the_manifest_refuses_is_refused_at_the_boundary() {
        let cfg = serde_json::to_value(sidecar()).unwrap();
        for (key, bad, named) in [
            ("namespace", "rm_", "namespace \"rm_\""),
            ("header", "X-A\r\nInjected", "header name"),
            ("prefix", "Bearer\r\nEvil: 1", "header value"),
        ] {
            let mut v = cfg.clone();
            match key {
                "namespace" => v["integrations"][0][key] = bad.into(),
                _ => v["integrations"][0]["delivery"][key] = bad.into(),
            }
            let e = SidecarConfig::from_json(v.to_string().as_bytes()).unwrap_err();
            assert!(matches!(e, ConfigError::Parse(_)), "{key}: {e}");
            assert!(e.to_string().contains(named), "{key}: {e}");
        }
    }

    /// Two namespaces one placeholder names are refused where the
    /// configuration is read, both named; the same spelling apart passes.
    #[test]
    fn namespaces_that_share_a_placeholder_are_refused_at_the_boundary() {
        let cfg = serde_json::to_value(sidecar()).unwrap();
        let mut v = cfg.clone();
        let twin = {
            let mut t = v["integrations"][0].clone();
            t["namespace"] = "a_b".into();
            t
        };
        v["integrations"][0]["namespace"] = "a-b".into();
        v["integrations"].as_array_mut().unwrap().push(twin);
        let e = SidecarConfig::from_json(v.to_string().as_bytes()).unwrap_err();
        assert!(
            matches!(&e, ConfigError::SharedPlaceholder(s)
                if (s.first.as_str(), s.second.as_str(), s.placeholder.as_str())
                    == ("a-b", "a_b", "AIRLOCK_PLACEHOLDER_A_B")),
            "{e}"
        );
        assert_eq!(
            distinct_placeholders(["a-b", "a-c", "ab"]),
            Ok(()),
            "distinct placeholders pass"
        );
    }

    #[test]
    fn the_readiness_line_reads_back_whole() {
        let mut listen = ReadyListen {
            tcp: Some("127.0.0.1:41000".parse().unwrap()),
            proxy_unix: Some("/run/proxy.sock".into()),
            ..Default::default()
        };
        listen.runners.insert(
            "runner_local".into(),
            ["/run/r0/mcp.sock".into(), "/run/r0/proxy.sock".into()],
        );
        let line = SidecarReady::new("run_1", listen).to_line();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ready"], true);
        assert_eq!(v["listen"]["tcp"], "127.0.0.1:41000");
        assert_eq!(v["listen"]["runner_local"][1], "/run/r0/proxy.sock");
        assert!(v["listen"].get("unix").is_none());
        let back = SidecarReady::from_line(&line).unwrap();
        assert_eq!(back.to_line(), line);
        for bad in [
            "",
            "ready",
            r#"{"ready":false,"run_id":"r","listen":{}}"#,
            r#"{"ready":true,"listen":{}}"#,
        ] {
            assert!(SidecarReady::from_line(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_listener_must_be_an_address() {
        let e = Listen::from_endpoints(
            &Endpoint::Tcp(HostPort::fixed("sidecar", 8080)),
            &Endpoint::Unix("/p".into()),
        )
        .unwrap_err();
        assert!(e.to_string().contains("not an address to listen on"), "{e}");
    }
}

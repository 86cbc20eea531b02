//! The sidecar's configuration: one JSON document on stdin, never argv or
//! the environment (both are readable by other processes of the same user).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use secrecy::SecretString;
use serde::Deserialize;

/// The credential the model relay asks the platform for.
pub const MODEL_CREDENTIAL: &str = "@model";

/// Largest configuration document accepted on stdin.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SidecarConfig {
    pub run_id: String,
    /// What the agent side presents (hex, 32 random bytes).
    pub sidecar_token: SecretString,
    /// What the sidecar presents to the platform (`<runId>.<hmac>`).
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
    #[serde(default)]
    pub proxy_url: Option<SecretString>,
}

#[derive(Debug, Default, Deserialize)]
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

/// How the credential travels in the outbound request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delivery {
    /// Header name, e.g. `Authorization`.
    pub header: String,
    #[serde(default)]
    pub prefix: String,
    /// The credential field whose value is delivered.
    pub field: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Integration {
    pub namespace: String,
    #[serde(default)]
    pub authorized_uris: Vec<String>,
    #[serde(default)]
    pub allow_all_uris: bool,
    #[serde(default)]
    pub delivery: Option<Delivery>,
    /// The integration has a stored connection (almost always): the call
    /// carries a credential and the credential rules apply.
    #[serde(default = "yes")]
    pub has_connection: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Openai,
    Anthropic,
}

#[derive(Debug, Clone, Deserialize)]
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
}

/// The run's network policy for the forward proxy.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum NetworkEgress {
    /// `"public"` or `"none"`.
    Mode(String),
    /// A list of `authorized_uris`-style patterns.
    Patterns(Vec<String>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub egress: NetworkEgress,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            egress: NetworkEgress::Mode("none".into()),
        }
    }
}

/// Operator egress settings that travel with the run.
#[derive(Debug, Clone, Default, Deserialize)]
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

#[derive(Debug, Clone, Deserialize)]
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
        }
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
}

impl SidecarConfig {
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
        use secrecy::ExposeSecret;
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
            let ok = !i.namespace.is_empty()
                && i.namespace.len() <= 64
                && i.namespace.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            if !ok {
                return Err(ConfigError::Invalid(format!(
                    "integration namespace {:?} must be [a-z0-9_-]{{1,64}}",
                    i.namespace
                )));
            }
            if !seen.insert(&i.namespace) {
                return Err(ConfigError::Invalid(format!(
                    "integration {:?} is listed twice",
                    i.namespace
                )));
            }
        }
        match &self.network.egress {
            NetworkEgress::Mode(m) if m != "public" && m != "none" => {
                return Err(ConfigError::Invalid(format!(
                    "network.egress {m:?} is not \"public\", \"none\" or a list"
                )));
            }
            _ => {}
        }
        Ok(())
    }
}

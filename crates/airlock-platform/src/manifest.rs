//! The agent manifest (`airlock.toml`; every key is in `docs/manifest.md`).
//!
//! Parsed into validated types ([`airlock_platform_api::types`]) and then
//! checked as a whole ([`Manifest::validate`]): a bad value is refused with
//! the key and the reason before anything starts.

use std::collections::BTreeSet;
use std::path::Path;

use airlock_egress::RuleList;
use airlock_platform_api::types::{AgentName, ConnectionName, Namespace, NetworkEgress, Provider};
use serde::Deserialize;

/// Smallest memory a run may ask for (MiB): below it nothing starts.
pub const MIN_MEMORY_MB: u64 = 16;
/// Most CPUs a manifest may ask for (a typo, not a machine).
pub const MAX_CPUS: f64 = 1024.0;
/// A run's memory or CPUs out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    #[error("{0} is below the minimum of {MIN_MEMORY_MB} MiB (0 is not \"unlimited\")")]
    MemoryBelowMinimum(u64),
    #[error("{0} must be a number of CPUs above 0 and at most {MAX_CPUS} (0 is not \"unlimited\")")]
    Cpus(f64),
}

/// The one check of a run's memory in MiB, wherever it is asked for (a
/// manifest's `agent.memory_mb`, an API run's `limits.memory_mb`).
pub fn check_memory_mb(m: u64) -> Result<(), LimitError> {
    if m < MIN_MEMORY_MB {
        return Err(LimitError::MemoryBelowMinimum(m));
    }
    Ok(())
}

/// The one check of a number of CPUs, wherever it is given (a manifest's
/// `agent.cpus`, an API run's `limits.cpus`, the operator's
/// `agent_cpu_ceiling`).
pub fn check_cpus(c: f64) -> Result<(), LimitError> {
    if !(c.is_finite() && c > 0.0 && c <= MAX_CPUS) {
        return Err(LimitError::Cpus(c));
    }
    Ok(())
}

/// Largest manifest file read.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub agent: Agent,
    #[serde(default)]
    pub model: Option<ModelSection>,
    #[serde(default)]
    pub network: Option<NetworkSection>,
    #[serde(default)]
    pub integrations: Vec<IntegrationSection>,
    /// The run's model budget, within the operator's ceilings.
    #[serde(default)]
    pub budget: Option<BudgetSection>,
}

/// `[budget]`: what the run's model calls may spend, all together. Each
/// call is reserved before it leaves and settled against its usage
/// (docs/budgets.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSection {
    /// Tokens, input and output together.
    #[serde(default)]
    pub tokens: Option<u64>,
    /// US dollars, at the model's prices (`model.price_*_per_mtok_usd`).
    #[serde(default)]
    pub cost_usd: Option<f64>,
    /// Model requests.
    #[serde(default)]
    pub requests: Option<u64>,
    /// Output tokens reserved for a request that names no `max_tokens`
    /// (default 4096).
    #[serde(default)]
    pub default_max_tokens: Option<u64>,
}

impl BudgetSection {
    fn validate(&self, model: Option<&ModelSection>) -> Result<(), ManifestError> {
        for (key, v) in [
            ("budget.tokens", self.tokens),
            ("budget.requests", self.requests),
            ("budget.default_max_tokens", self.default_max_tokens),
        ] {
            if v == Some(0) {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if let Some(c) = self.cost_usd {
            if !(c.is_finite() && c > 0.0 && c <= 1e6) {
                return Err(invalid(
                    "budget.cost_usd",
                    "must be above 0 and at most 1000000",
                ));
            }
            let priced = model.is_some_and(|m| {
                m.price_in_per_mtok_usd.is_some() || m.price_out_per_mtok_usd.is_some()
            });
            if !priced {
                return Err(invalid(
                    "budget.cost_usd",
                    "needs the model's prices (model.price_in_per_mtok_usd, \
                     model.price_out_per_mtok_usd): without them a call's cost is unknown",
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    pub name: AgentName,
    pub command: Vec<String>,
    /// Seconds.
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub memory_mb: Option<u64>,
    #[serde(default)]
    pub cpus: Option<f64>,
    /// The agent's output directory, relative to its workspace: the regular
    /// files it leaves there are stored with the run as its artifacts
    /// (`$AIRLOCK_OUTPUT_DIR` names it for the agent). None: nothing is kept.
    #[serde(default)]
    pub outputs: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub provider: Provider,
    pub base_url: String,
    /// The stored connection holding the model key. Optional: without it
    /// the organization's key for the provider, else the operator's, pays
    /// ([`crate::provider_keys`]); a run with neither is refused before it
    /// starts.
    #[serde(default)]
    pub connection: Option<ConnectionName>,
    #[serde(default)]
    pub price_in_per_mtok_usd: Option<f64>,
    #[serde(default)]
    pub price_out_per_mtok_usd: Option<f64>,
    /// Provider-side tools a model request may ask for (`web_search`,
    /// `mcp`, `web_fetch`, …; a name also covers its dated versions, e.g.
    /// `web_search_20250305`). None by default: the provider reaching hosts
    /// on the agent's behalf is egress no policy of the run's would see.
    #[serde(default)]
    pub provider_tools: Vec<String>,
    /// URLs a model request may ask the provider to fetch (an image by URL,
    /// an MCP server), as `authorized_uris` patterns; each is also judged
    /// by the guard (blocked names and addresses). `data:` URLs need none.
    #[serde(default)]
    pub provider_fetch_uris: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    pub egress: NetworkEgress,
    /// L7 rules narrowing `egress` (docs/egress.md, "L7 rules").
    #[serde(default)]
    pub rules: RuleList,
}

/// An integration's `delivery`: the launch contract's type, handed to the
/// sidecar as it is.
pub use airlock_platform_api::launch::{Delivery, IDENTITY_FIELD};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntegrationSection {
    pub namespace: Namespace,
    #[serde(default)]
    pub connection: Option<ConnectionName>,
    #[serde(default)]
    pub authorized_uris: Vec<String>,
    #[serde(default)]
    pub allow_all_uris: bool,
    /// L7 rules narrowing `authorized_uris` (docs/egress.md, "L7 rules").
    #[serde(default)]
    pub rules: RuleList,
    /// Which of its MCP tools the agent may see and call (absent: all).
    #[serde(default)]
    pub tools: Option<airlock_platform_api::launch::ToolAllowlist>,
    #[serde(default)]
    pub delivery: Option<Delivery>,
    /// Where the integration's MCP tools come from, besides its `api_call`.
    #[serde(default)]
    pub source: Option<IntegrationSource>,
    /// `inject = "proxy"`: the agent's own tools may use the credential
    /// through the sidecar's intercepting proxy, by its placeholder.
    #[serde(default)]
    pub inject: Option<Inject>,
}

impl IntegrationSection {
    /// The integration's delivery names the run's identity token.
    pub fn names_identity(&self) -> bool {
        self.delivery.as_ref().is_some_and(Delivery::names_identity)
    }

    /// Its calls carry a credential: a stored connection's, or the run's
    /// identity token (the credential rules apply to both).
    pub fn carries_credential(&self) -> bool {
        self.connection.is_some() || self.names_identity()
    }
}

/// How else than `api_call` the agent may use an integration's credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Inject {
    /// Through the intercepting forward proxy: `AIRLOCK_PLACEHOLDER_<NS>`
    /// in a request that `authorized_uris` covers becomes the credential.
    Proxy,
}

/// `source = { kind = "remote", url = "https://…/mcp" }` or
/// `source = { kind = "local", command = [...] }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum IntegrationSource {
    /// A remote MCP server (Streamable HTTP), reached through the egress guard.
    Remote { url: String },
    /// A local MCP server started for the run in a sandbox of its own (a
    /// runner), speaking MCP on its stdio; its only way out is a proxy
    /// bounded by the integration's `authorized_uris`.
    Local { command: Vec<String> },
}

impl IntegrationSection {
    /// The URL of the integration's remote MCP server, if it has one.
    pub fn remote_mcp_url(&self) -> Option<&str> {
        match &self.source {
            Some(IntegrationSource::Remote { url }) => Some(url),
            _ => None,
        }
    }

    /// The command of the integration's local runner, if it has one.
    pub fn local_command(&self) -> Option<&[String]> {
        match &self.source {
            Some(IntegrationSource::Local { command }) => Some(command),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge { path: String },
    #[error("{path} is not a valid manifest: {message}")]
    Parse { path: String, message: String },
    #[error("{key}: {message}")]
    Invalid { key: String, message: String },
    #[error("{key}: {source}")]
    SharedPlaceholder {
        key: String,
        source: airlock_platform_api::launch::SharedPlaceholder,
    },
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ManifestError {
    ManifestError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

impl Manifest {
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        use std::io::Read;
        let name = || path.display().to_string();
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_MANIFEST_BYTES + 1).read_to_string(&mut text))
            .map_err(|source| ManifestError::Read {
                path: name(),
                source,
            })?;
        if text.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge { path: name() });
        }
        let m = Self::parse(&text).map_err(|e| match e {
            ManifestError::Parse { message, .. } => ManifestError::Parse {
                path: name(),
                message,
            },
            ManifestError::Invalid { key, message } => ManifestError::Parse {
                path: name(),
                message: format!("{key}: {message}"),
            },
            ManifestError::SharedPlaceholder { key, source } => ManifestError::SharedPlaceholder {
                key: format!("{}: {key}", name()),
                source,
            },
            other => other,
        })?;
        Ok(m)
    }

    /// Parses and validates manifest text.
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let m: Manifest = toml::from_str(text).map_err(|e| ManifestError::Parse {
            path: "airlock.toml".into(),
            message: e.to_string(),
        })?;
        m.validate()?;
        Ok(m)
    }

    /// The checks no single type can make.
    pub fn validate(&self) -> Result<(), ManifestError> {
        let a = &self.agent;
        check_command("agent.command", &a.command)?;
        if a.timeout == Some(0) {
            return Err(invalid("agent.timeout", "must be at least 1 second"));
        }
        if let Some(m) = a.memory_mb {
            check_memory_mb(m).map_err(|e| invalid("agent.memory_mb", e.to_string()))?;
        }
        if let Some(c) = a.cpus {
            check_cpus(c).map_err(|e| invalid("agent.cpus", e.to_string()))?;
        }
        if let Some(o) = &a.outputs {
            airlock_platform_api::files::check_relative_path(o)
                .map_err(|e| invalid("agent.outputs", format!("{o:?} {e}")))?;
            if o == ".airlock" || o.starts_with(".airlock/") {
                return Err(invalid(
                    "agent.outputs",
                    "the workspace's .airlock directory is the runtime's",
                ));
            }
        }
        if let Some(model) = &self.model {
            model.validate()?;
        }
        if let Some(b) = &self.budget {
            b.validate(self.model.as_ref())?;
        }
        if let Some(NetworkSection {
            egress: NetworkEgress::Allow(patterns),
            ..
        }) = &self.network
        {
            check_patterns("network.egress", patterns)?;
        }
        let mut seen = BTreeSet::new();
        for (i, integ) in self.integrations.iter().enumerate() {
            let key = format!("integrations[{i}] ({})", integ.namespace);
            if !seen.insert(&integ.namespace) {
                return Err(invalid(
                    key,
                    format!("namespace {:?} is declared twice", integ.namespace.as_str()),
                ));
            }
            check_integration(&key, integ)?;
        }
        let namespaces = self.integrations.iter().map(|i| i.namespace.as_str());
        airlock_platform_api::launch::distinct_placeholders(namespaces).map_err(|source| {
            let i = self
                .integrations
                .iter()
                .position(|i| i.namespace.as_str() == source.second)
                .unwrap_or_default();
            ManifestError::SharedPlaceholder {
                key: format!("integrations[{i}] ({})", source.second),
                source,
            }
        })?;
        Ok(())
    }

    /// Every stored connection the run needs: `(what needs it, name)`.
    pub fn connections(&self) -> Vec<(String, &ConnectionName)> {
        let mut v: Vec<(String, &ConnectionName)> = self
            .integrations
            .iter()
            .filter_map(|i| {
                i.connection
                    .as_ref()
                    .map(|c| (format!("integration {}", i.namespace), c))
            })
            .collect();
        if let Some(c) = self.model.as_ref().and_then(|m| m.connection.as_ref()) {
            v.push(("model".into(), c));
        }
        v
    }
}

impl ModelSection {
    /// The `[model]` section's own checks.
    fn validate(&self) -> Result<(), ManifestError> {
        check_http_url("model.base_url", &self.base_url)?;
        check_patterns("model.provider_fetch_uris", &self.provider_fetch_uris)?;
        for t in &self.provider_tools {
            if t.is_empty()
                || t.len() > 64
                || !t
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                return Err(invalid(
                    "model.provider_tools",
                    format!("{t:?} is not a tool type name (lower-case letters, digits and _)"),
                ));
            }
        }
        for (k, v) in [
            ("model.price_in_per_mtok_usd", self.price_in_per_mtok_usd),
            ("model.price_out_per_mtok_usd", self.price_out_per_mtok_usd),
        ] {
            if let Some(p) = v
                && !(p.is_finite() && p >= 0.0)
            {
                return Err(invalid(k, format!("{p} must be a price of 0 or more")));
            }
        }
        Ok(())
    }
}

/// A command line (`agent.command`, a runner's `source.command`): a
/// program, and no NUL byte anywhere.
/// The checks of one integration (`key` names it) no single type can make.
fn check_integration(key: &str, integ: &IntegrationSection) -> Result<(), ManifestError> {
    check_patterns(&format!("{key}.authorized_uris"), &integ.authorized_uris)?;
    // Wildcards only where the server decides the tool set; an
    // integration without a source has one tool, `api_call`.
    if integ.source.is_none() && integ.tools.as_ref().is_some_and(|t| t.has_wildcards()) {
        return Err(invalid(
            format!("{key}.tools"),
            "wildcards are for an integration with a source (its server names its tools);              this one has only api_call",
        ));
    }
    match &integ.source {
        None => {}
        Some(IntegrationSource::Remote { url }) => {
            check_remote_url(&format!("{key}.source.url"), url, integ)?;
        }
        Some(IntegrationSource::Local { command }) => {
            check_command(&format!("{key}.source.command"), command)?;
            if integ.connection.is_some() && integ.delivery.is_none() {
                return Err(invalid(
                    format!("{key}.delivery"),
                    "a local runner uses its connection by its placeholder, which the \
                     sidecar replaces with the credential's delivery field: the \
                     integration needs a delivery",
                ));
            }
            if airlock_egress::AuthorizedUris::has_templates(&integ.authorized_uris) {
                return Err(invalid(
                    format!("{key}.authorized_uris"),
                    "a local runner's proxy needs authorized_uris without \
                     {$credential.…} templates (it decides before it has a credential)",
                ));
            }
        }
    }
    if integ.inject == Some(Inject::Proxy) {
        if !integ.carries_credential() || integ.delivery.is_none() {
            return Err(invalid(
                format!("{key}.inject"),
                "\"proxy\" replaces the placeholder with the credential's delivery field: \
                 the integration needs a connection and a delivery",
            ));
        }
        if airlock_egress::AuthorizedUris::has_templates(&integ.authorized_uris) {
            return Err(invalid(
                format!("{key}.inject"),
                "\"proxy\" needs authorized_uris without {$credential.…} templates (the \
                 proxy decides before it has a credential)",
            ));
        }
    }
    if let Some(d) = &integ.delivery {
        check_delivery(key, integ, d)?;
    }
    Ok(())
}

/// An integration's `delivery`: a field of its connection's credential,
/// or the run's identity token (`${airlock.identity}`, with an audience).
fn check_delivery(
    key: &str,
    integ: &IntegrationSection,
    d: &Delivery,
) -> Result<(), ManifestError> {
    if let Some(a) = &d.audience {
        if !d.names_identity() {
            return Err(invalid(
                format!("{key}.delivery.audience"),
                format!("is the identity token's audience: it needs field = \"{IDENTITY_FIELD}\""),
            ));
        }
        if a.is_empty() || a.len() > MAX_AUDIENCE || a.chars().any(char::is_control) {
            return Err(invalid(
                format!("{key}.delivery.audience"),
                format!("must be 1 to {MAX_AUDIENCE} characters without control characters"),
            ));
        }
    }
    if !d.names_identity() && integ.connection.is_none() {
        return Err(invalid(
            format!("{key}.delivery"),
            format!(
                "delivers a credential, but the integration has no connection (or name \
                 the run's identity token: field = \"{IDENTITY_FIELD}\")"
            ),
        ));
    }
    if d.field.is_empty() || d.field.chars().any(char::is_control) {
        return Err(invalid(
            format!("{key}.delivery.field"),
            "must name a field of the connection's credential",
        ));
    }
    Ok(())
}

/// The longest identity token audience a delivery may name.
const MAX_AUDIENCE: usize = 256;

fn check_command(key: &str, command: &[String]) -> Result<(), ManifestError> {
    if command.first().is_none_or(|p| p.is_empty()) {
        return Err(invalid(key, "is empty: name the program to run"));
    }
    for (i, arg) in command.iter().enumerate() {
        if let Some(at) = arg.find('\0') {
            return Err(invalid(
                format!("{key}[{i}]"),
                format!("holds a NUL byte at byte {at}: a command line cannot carry one"),
            ));
        }
    }
    Ok(())
}

fn check_http_url(key: &str, url: &str) -> Result<(), ManifestError> {
    match airlock_egress::Target::parse(url) {
        Ok(_) => Ok(()),
        Err(e) => Err(invalid(
            key,
            format!("{url:?} is not a usable http(s) URL: {e}"),
        )),
    }
}

/// A remote MCP server's URL: an http(s) URL that the integration's own
/// `authorized_uris` covers (the sidecar reaches it under the same rules as
/// an `api_call`, so a URL they do not cover could never be reached).
fn check_remote_url(key: &str, url: &str, integ: &IntegrationSection) -> Result<(), ManifestError> {
    let target = airlock_egress::Target::parse(url)
        .map_err(|e| invalid(key, format!("{url:?} is not a usable http(s) URL: {e}")))?;
    if airlock_egress::AuthorizedUris::has_templates(&integ.authorized_uris) {
        // Rendered per connection: checked when the sidecar connects.
        return Ok(());
    }
    let authorized = airlock_egress::AuthorizedUris::parse(&integ.authorized_uris);
    if !authorized.entries().iter().any(|p| p.matches(&target)) {
        return Err(invalid(
            key,
            format!(
                "{url:?} is not covered by the integration's authorized_uris, so the sidecar \
                 could never reach it: add an entry such as \"{}\"",
                target.url().as_str()
            ),
        ));
    }
    Ok(())
}

/// Every entry must mean something: one that matches nothing (a typo such as
/// `http://[::1/**`, `https://127.1/**`, `https://a@b.com/**`) is refused here,
/// with the egress guard's own reason, rather than silently never matching.
/// Entries with `{$credential.…}` templates are rendered per call and checked then.
fn check_patterns(key: &str, entries: &[String]) -> Result<(), ManifestError> {
    let plain: Vec<&String> = entries
        .iter()
        .filter(|e| !airlock_egress::AuthorizedUris::has_templates(&[e.as_str()]))
        .collect();
    let parsed = airlock_egress::AuthorizedUris::parse(&plain);
    if let Some(d) = parsed.diagnostics().iter().find(|d| d.matches_nothing) {
        return Err(invalid(
            key,
            format!("entry {:?} matches nothing: {}", d.entry, d.reason),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(extra: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(&format!(
            "[agent]\nname = \"t\"\ncommand = [\"/bin/true\"]\n{extra}"
        ))
    }

    fn err(text: &str) -> String {
        match Manifest::parse(text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_good_manifest_loads_with_typed_values() {
        let m = with(
            "timeout = 60\nmemory_mb = 256\ncpus = 0.5\n[model]\nprovider = \"anthropic\"\nbase_url = \"https://api.anthropic.com\"\nconnection = \"claude\"\n[network]\negress = [\"https://pypi.org/**\"]\n[[integrations]]\nnamespace = \"github\"\nconnection = \"gh\"\nauthorized_uris = [\"https://api.github.com/**\", \"https://a.com/v1/{id}\"]\ndelivery = { header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }\n",
        )
        .unwrap();
        assert_eq!(m.model.as_ref().unwrap().provider, Provider::Anthropic);
        assert_eq!(
            m.network.as_ref().unwrap().egress,
            NetworkEgress::Allow(vec!["https://pypi.org/**".into()])
        );
        assert_eq!(m.integrations[0].namespace.as_str(), "github");
        assert_eq!(m.connections().len(), 2);
    }

    #[test]
    fn a_model_may_leave_its_connection_to_the_organization_or_the_operator() {
        let m = with("[model]\nprovider = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\n")
            .unwrap();
        let model = m.model.as_ref().unwrap();
        assert!(model.connection.is_none());
        assert!(
            m.connections().is_empty(),
            "no stored connection is needed by name"
        );
    }

    #[test]
    fn a_budget_is_positive_and_a_cost_budget_needs_prices() {
        let model = "[model]\nprovider = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\nconnection = \"o\"\n";
        let priced = format!("{model}price_out_per_mtok_usd = 10.0\n");
        let m = with(&format!(
            "{priced}[budget]\ntokens = 1000\ncost_usd = 0.5\nrequests = 3\ndefault_max_tokens = 64\n"
        ))
        .unwrap();
        let b = m.budget.unwrap();
        assert_eq!(
            (b.tokens, b.requests, b.default_max_tokens),
            (Some(1000), Some(3), Some(64))
        );
        for (text, must) in [
            (format!("{priced}[budget]\ntokens = 0\n"), "budget.tokens"),
            (
                format!("{priced}[budget]\nrequests = 0\n"),
                "budget.requests",
            ),
            (
                format!("{priced}[budget]\ncost_usd = 0.0\n"),
                "budget.cost_usd",
            ),
            (
                format!("{priced}[budget]\ncost_usd = -1.0\n"),
                "budget.cost_usd",
            ),
            (
                format!("{priced}[budget]\ncost_usd = 1e300\n"),
                "budget.cost_usd",
            ),
            (
                format!("{model}[budget]\ncost_usd = 1.0\n"),
                "model's prices",
            ),
            ("[budget]\ncost_usd = 1.0\n".to_owned(), "model's prices"),
            (format!("{priced}[budget]\ntoken = 5\n"), "unknown field"),
        ] {
            let e = with(&text).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(must), "{text}: {e}");
        }
    }

    /// `${airlock.identity}` needs no connection and takes an audience;
    /// an audience without it, or an empty one, is refused.
    #[test]
    fn a_delivery_may_name_the_runs_identity_with_an_audience() {
        let base = "[[integrations]]\nnamespace = \"aws\"\nauthorized_uris = [\"https://sts.amazonaws.com/**\"]\n";
        let m = with(&format!(
            "{base}delivery = {{ header = \"Authorization\", prefix = \"Bearer \", field = \"${{airlock.identity}}\" }}\n"
        ))
        .unwrap();
        let i = &m.integrations[0];
        assert!(i.names_identity() && i.carries_credential());
        let d = i.delivery.as_ref().unwrap();
        assert_eq!(d.identity_audience(), "sts.amazonaws.com");
        assert_eq!(d.credential_field(), "airlock.identity");
        let m = with(&format!(
            "{base}delivery = {{ header = \"X-Token\", field = \"${{airlock.identity}}\", audience = \"api://AzureADTokenExchange\" }}\ninject = \"proxy\"\n"
        ))
        .unwrap();
        let d = m.integrations[0].delivery.as_ref().unwrap();
        assert_eq!(d.identity_audience(), "api://AzureADTokenExchange");
        for (delivery, want) in [
            (
                "{ header = \"A\", field = \"token\", audience = \"x\" }",
                "delivery.audience: is the identity token's audience",
            ),
            (
                "{ header = \"A\", field = \"${airlock.identity}\", audience = \"\" }",
                "delivery.audience: must be 1 to 256 characters",
            ),
            (
                "{ header = \"A\", field = \"token\" }",
                "delivers a credential, but the integration has no connection",
            ),
        ] {
            let e = with(&format!("{base}delivery = {delivery}\n")).unwrap_err();
            assert!(e.to_string().contains(want), "{delivery}: {e}");
        }
    }

    #[test]
    fn inject_proxy_needs_a_connection_a_delivery_and_plain_uris() {
        let base = "[[integrations]]\nnamespace = \"gh\"\nauthorized_uris = [\"https://api.github.com/**\"]\ninject = \"proxy\"\n";
        let delivery =
            "delivery = { header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }\n";
        let m = with(&format!("{base}connection = \"gh\"\n{delivery}")).unwrap();
        assert_eq!(m.integrations[0].inject, Some(Inject::Proxy));
        for (extra, must) in [
            (
                "connection = \"gh\"\n".to_owned(),
                "needs a connection and a delivery",
            ),
            (
                delivery.replace("delivery", "x").replace("x =", "# x ="),
                "needs a connection and a delivery",
            ),
        ] {
            let e = with(&format!("{base}{extra}"))
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(e.contains(must), "{must:?} not in {e:?}");
        }
        let e = with("[[integrations]]\nnamespace = \"gh\"\nconnection = \"gh\"\nauthorized_uris = [\"https://{$credential.host}/**\"]\ninject = \"proxy\"\ndelivery = { header = \"A\", field = \"t\" }\n")
            .map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("without {$credential"), "{e}");
        let e = with(
            &format!("{base}connection = \"gh\"\n{delivery}").replace("\"proxy\"", "\"header\""),
        )
        .map(|_| ())
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown variant `header`"), "{e}");
    }

    #[test]
    fn tool_allowlists_take_wildcards_only_with_a_source() {
        let base = "[[integrations]]\nnamespace = \"r\"\nauthorized_uris = [\"https://mcp.example.com/**\"]\n";
        let remote = "source = { kind = \"remote\", url = \"https://mcp.example.com/mcp\" }\n";
        let m = with(&format!(
            "{base}{remote}tools = [\"search_*\", \"api_call\"]\n"
        ))
        .unwrap();
        let tools = m.integrations[0].tools.as_ref().unwrap();
        assert!(tools.allows("search_code") && tools.allows("api_call") && !tools.allows("delete"));
        assert!(
            with(&format!("{base}tools = []\n")).unwrap().integrations[0]
                .tools
                .is_some()
        );
        let e = with(&format!("{base}tools = [\"*\"]\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("wildcards are for an integration with a source"),
            "{e}"
        );
        for bad in ["", "a b", "x/y", "é"] {
            assert!(
                with(&format!("{base}{remote}tools = [\"{bad}\"]\n")).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_remote_mcp_source_must_be_reachable_under_its_own_authorized_uris() {
        let integ = |uris: &str, source: &str| {
            with(&format!(
                "[[integrations]]\nnamespace = \"r\"\nconnection = \"c\"\nauthorized_uris = [{uris}]\nsource = {source}\n"
            ))
        };
        let m = integ(
            "\"https://mcp.example.com/**\"",
            "{ kind = \"remote\", url = \"https://MCP.example.com:443/mcp\" }",
        )
        .unwrap();
        assert_eq!(
            m.integrations[0].remote_mcp_url(),
            Some("https://MCP.example.com:443/mcp")
        );
        for (uris, source, must) in [
            (
                "\"https://api.example.com/**\"",
                "{ kind = \"remote\", url = \"https://mcp.example.com/mcp\" }",
                "integrations[0] (r).source.url: \"https://mcp.example.com/mcp\" is not covered by the integration's authorized_uris",
            ),
            (
                "",
                "{ kind = \"remote\", url = \"https://mcp.example.com/mcp\" }",
                "is not covered",
            ),
            (
                "\"https://mcp.example.com/**\"",
                "{ kind = \"remote\", url = \"ftp://mcp.example.com/mcp\" }",
                "source.url: \"ftp://mcp.example.com/mcp\" is not a usable http(s) URL",
            ),
            (
                "\"https://mcp.example.com/**\"",
                "{ kind = \"remote\", uri = \"https://mcp.example.com/mcp\" }",
                "unknown field `uri`",
            ),
            (
                "\"https://mcp.example.com/**\"",
                "{ kind = \"remtoe\", url = \"https://mcp.example.com/mcp\" }",
                "unknown variant `remtoe`",
            ),
            (
                "\"https://mcp.example.com/**\"",
                "{ kind = \"local\", command = [] }",
                "integrations[0] (r).source.command: is empty",
            ),
            (
                "\"https://mcp.example.com/**\"",
                "{ kind = \"local\", command = [\"node\", \"a\\u0000b\"] }",
                "integrations[0] (r).source.command[1]: holds a NUL byte",
            ),
            (
                "\"https://mcp.example.com/**\"",
                "{ kind = \"local\", command = [\"node\"], url = \"x\" }",
                "unknown field `url`",
            ),
            (
                "\"https://mcp.example.com/**\"",
                "{ kind = \"local\", command = [\"node\", \"server.js\"] }",
                "integrations[0] (r).delivery: a local runner uses its connection by its placeholder",
            ),
            (
                "\"https://{$credential.host}/**\"",
                "{ kind = \"local\", command = [\"node\", \"server.js\"] }",
                "delivery",
            ),
        ] {
            let e = integ(uris, source).map(|_| ()).unwrap_err().to_string();
            assert!(e.contains(must), "{must:?} not in {e:?}");
        }
        // A local runner with its delivery; one without a connection needs none.
        let m = with(
            "[[integrations]]\nnamespace = \"gh\"\nconnection = \"c\"\nauthorized_uris = [\"https://api.github.com/**\"]\n\
             delivery = { header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }\n\
             source = { kind = \"local\", command = [\"/usr/bin/python3\", \"server.py\"] }\n\
             [[integrations]]\nnamespace = \"open\"\nsource = { kind = \"local\", command = [\"srv\"] }\n",
        )
        .unwrap();
        assert_eq!(
            m.integrations[0].local_command(),
            Some(&["/usr/bin/python3".to_owned(), "server.py".to_owned()][..])
        );
        assert!(m.integrations[1].local_command().is_some());
    }

    #[test]
    fn every_bad_value_is_refused_with_its_key() {
        let agent = |name: &str| format!("[agent]\nname = {name:?}\ncommand = [\"/bin/true\"]\n");
        for (text, must) in [
            (agent(""), "agent.name"),
            (agent("two\nlines"), "agent.name"),
            (agent(&"n".repeat(200_000)), "agent.name"),
            (
                "[agent]\nname = \"t\"\ncommand = [\"/bin/sh\", \"a\\u0000b\"]\n".into(),
                "agent.command[1]: holds a NUL byte at byte 1",
            ),
            (
                "[agent]\nname = \"t\"\ncommand = []\n".into(),
                "agent.command",
            ),
            (agent("t") + "memory_mb = 0\n", "agent.memory_mb"),
            (agent("t") + "cpus = 0\n", "agent.cpus"),
            (agent("t") + "cpus = -1\n", "agent.cpus"),
            (agent("t") + "cpus = nan\n", "agent.cpus"),
            (agent("t") + "timeout = 0\n", "agent.timeout"),
            (
                agent("t") + "[network]\negress = 42\n",
                "\"public\", \"none\" or a list",
            ),
            (
                agent("t") + "[network]\negress = \"sometimes\"\n",
                "\"sometimes\" is not",
            ),
            (
                agent("t") + "[network]\negress = [\"http://[::1/**\"]\n",
                "network.egress: entry \"http://[::1/**\" matches nothing",
            ),
            (
                agent("t")
                    + "[model]\nprovider = \"ollama\"\nbase_url = \"http://x\"\nconnection = \"c\"\n",
                "unknown variant",
            ),
            (
                agent("t")
                    + "[model]\nprovider = \"openai\"\nbase_url = \"ftp://x/\"\nconnection = \"c\"\n",
                "model.base_url",
            ),
            (
                agent("t")
                    + "[model]\nprovider = \"openai\"\nbase_url = \"https://x/\"\nconnection = \"c\"\nprovider_tools = [\"Web Search\"]\n",
                "model.provider_tools: \"Web Search\" is not a tool type name",
            ),
            (
                agent("t")
                    + "[model]\nprovider = \"openai\"\nbase_url = \"https://x/\"\nconnection = \"c\"\nprovider_fetch_uris = [\"http://[::1/**\"]\n",
                "model.provider_fetch_uris",
            ),
        ] {
            let e = err(&text);
            assert!(e.contains(must), "{must:?} not in {e:?}");
        }
        let integ = |body: &str| format!("{}[[integrations]]\n{body}\n", agent("t"));
        for (body, must) in [
            ("namespace = \"\"", "namespace \"\""),
            ("namespace = \"a b/../c\"", "namespace \"a b/../c\""),
            (
                "namespace = \"x\"\nauthorized_uris = [\"https://127.1/**\"]",
                "matches nothing",
            ),
            (
                "namespace = \"x\"\nauthorized_uris = [\"https://a@b.com/**\"]",
                "matches nothing",
            ),
            (
                "namespace = \"x\"\nauthorized_uris = [\"http://[::1/**\"]",
                "matches nothing",
            ),
            (
                "namespace = \"x\"\nconnection = \"c\"\ndelivery = { header = \"X-Key\\r\\nEvil: 1\", field = \"k\" }",
                "header name",
            ),
            (
                "namespace = \"x\"\nconnection = \"c\"\ndelivery = { header = \"X-Key\", prefix = \"a\\r\\nb\", field = \"k\" }",
                "header value",
            ),
            (
                "namespace = \"x\"\ndelivery = { header = \"X-Key\", field = \"k\" }",
                "has no connection",
            ),
            ("namespace = \"x\"\nconnection = \"\"", "connection \"\""),
        ] {
            let e = err(&integ(body));
            assert!(e.contains(must), "{must:?} not in {e:?}");
        }
        let dup = format!(
            "{}[[integrations]]\nnamespace = \"x\"\n[[integrations]]\nnamespace = \"x\"\n",
            agent("t")
        );
        assert!(err(&dup).contains("declared twice"));
        let twins = format!(
            "{}[[integrations]]\nnamespace = \"a-b\"\n[[integrations]]\nnamespace = \"a_b\"\n",
            agent("t")
        );
        assert!(
            err(&twins).contains("share the placeholder AIRLOCK_PLACEHOLDER_A_B"),
            "{}",
            err(&twins)
        );
        assert!(
            matches!(Manifest::parse(&twins),
                Err(ManifestError::SharedPlaceholder { source, .. })
                    if (source.first.as_str(), source.second.as_str()) == ("a-b", "a_b")),
            "the refusal is typed and names both"
        );
        assert!(err(&(agent("t") + "colour = \"red\"\n")).contains("unknown field"));
    }
}

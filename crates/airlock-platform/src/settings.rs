//! Operator settings read from the environment, checked at start: a bad
//! value stops the platform with a message naming the variable.

use std::collections::HashMap;

use serde::Deserialize;

/// `PLATFORM_RUN_LIMITS` (strict JSON: unknown keys are refused).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunLimits {
    pub agent_memory_ceiling_mb: u64,
    pub agent_cpu_ceiling: f64,
    pub timeout_ceiling_seconds: u64,
    pub max_concurrent_runs: Option<u32>,
    /// The most a run's model calls may spend, whatever its manifest says
    /// (and what a run whose manifest says nothing may spend).
    pub run_tokens_ceiling: Option<u64>,
    pub run_cost_ceiling_usd: Option<f64>,
    pub run_requests_ceiling: Option<u64>,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            agent_memory_ceiling_mb: 1536,
            agent_cpu_ceiling: 2.0,
            timeout_ceiling_seconds: 1800,
            max_concurrent_runs: None,
            run_tokens_ceiling: None,
            run_cost_ceiling_usd: None,
            run_requests_ceiling: None,
        }
    }
}

/// Why `PLATFORM_RUN_LIMITS` is refused.
#[derive(Debug, thiserror::Error)]
pub enum RunLimitsError {
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("must be a JSON object such as {{\"agent_memory_ceiling_mb\": 1536}}, not {0}")]
    NotAnObject(serde_json::Value),
    #[error("agent_memory_ceiling_mb {0} is below the minimum of {min} MiB", min = crate::manifest::MIN_MEMORY_MB)]
    MemoryCeiling(u64),
    #[error("agent_cpu_ceiling {0}")]
    CpuCeiling(crate::manifest::LimitError),
    #[error("timeout_ceiling_seconds must be at least 1")]
    TimeoutCeiling,
    #[error("max_concurrent_runs must be at least 1 (leave it out for no limit)")]
    MaxConcurrentRuns,
    #[error("{0} must be above 0 (leave it out for no ceiling)")]
    BudgetCeiling(&'static str),
}

impl RunLimits {
    /// Strict JSON: an object, no unknown key, every ceiling above 0 (a 0
    /// is refused: it does not mean "no limit").
    pub fn parse(v: &str) -> Result<RunLimits, RunLimitsError> {
        let raw: serde_json::Value = serde_json::from_str(v)?;
        if !raw.is_object() {
            return Err(RunLimitsError::NotAnObject(raw));
        }
        // From the text, not the parsed value: a key given twice is refused
        // ("duplicate field"), where a parsed object keeps the last silently.
        let l: RunLimits = serde_json::from_str(v)?;
        if l.agent_memory_ceiling_mb < crate::manifest::MIN_MEMORY_MB {
            return Err(RunLimitsError::MemoryCeiling(l.agent_memory_ceiling_mb));
        }
        crate::manifest::check_cpus(l.agent_cpu_ceiling).map_err(RunLimitsError::CpuCeiling)?;
        if l.timeout_ceiling_seconds == 0 {
            return Err(RunLimitsError::TimeoutCeiling);
        }
        if l.max_concurrent_runs == Some(0) {
            return Err(RunLimitsError::MaxConcurrentRuns);
        }
        if l.run_tokens_ceiling == Some(0) {
            return Err(RunLimitsError::BudgetCeiling("run_tokens_ceiling"));
        }
        if l.run_requests_ceiling == Some(0) {
            return Err(RunLimitsError::BudgetCeiling("run_requests_ceiling"));
        }
        if l.run_cost_ceiling_usd
            .is_some_and(|c| !(c.is_finite() && c > 0.0))
        {
            return Err(RunLimitsError::BudgetCeiling("run_cost_ceiling_usd"));
        }
        Ok(l)
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub run_adapter: String,
    pub limits: RunLimits,
    pub boot_deadline_secs: u64,
    pub heartbeat_interval_secs: u64,
    pub stall_threshold_secs: u64,
    pub watchdog_interval_secs: u64,
    pub workspace_tmpfs_mb: u64,
    pub allow_internal_hosts: Vec<String>,
    pub dns_server: Option<String>,
    /// `EGRESS_RESOLVE`: fixed answers (`host=ip[,ip…]`, `;`-separated)
    /// the sidecars' guards consult before any resolver, as `airlock egress
    /// check --resolve` does (a test's names, an air-gapped host's). The
    /// answers are judged like any other (an internal address still needs
    /// `EGRESS_ALLOW_INTERNAL_HOSTS`).
    pub resolve: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    /// `EGRESS_EXTRA_CA_FILE`: trust anchors (PEM) the sidecars accept for
    /// upstream TLS beside the Mozilla roots (a private CA), read at start.
    pub extra_ca_pem: Option<String>,
    /// What a run's artifacts may take in the store: `RUN_MAX_ARTIFACT_BYTES`
    /// (16 MiB) per run, `ORG_MAX_ARTIFACT_BYTES` (1 GiB, `0`: no cap) per
    /// organization.
    pub artifacts: airlock_store::ArtifactCaps,
    /// Where the live model catalog is read from, and the keys it must be
    /// signed by (`MODEL_CATALOG_URL`, `MODEL_CATALOG_TRUST_ROOT`).
    pub catalog: crate::catalog::CatalogSettings,
    /// How agent bundles' signatures are enforced before a run starts
    /// (`AFPS_SIGNATURE_POLICY`, `AFPS_TRUST_ROOT`).
    pub bundles: crate::bundle::BundleSettings,
    /// The operator's model keys (`SYSTEM_PROVIDER_KEYS`): the last source
    /// of a run's model key ([`crate::provider_keys`]).
    pub system_provider_keys: crate::provider_keys::SystemProviderKeys,
    /// `PROXY_URL`: the operator's upstream proxy ([`ENV_PROXY_URL`]).
    pub proxy_url: Option<secrecy::SecretString>,
    /// `SYSTEM_PROXIES`: the named proxies an organization may choose
    /// instead of `PROXY_URL` ([`crate::proxies`]).
    pub system_proxies: crate::proxies::SystemProxies,
}

#[derive(Debug, thiserror::Error)]
#[error("{var}: {message}")]
pub struct SettingsError {
    pub var: &'static str,
    pub message: String,
}

pub const DEFAULT_MEMORY_MB: u64 = 1536;
/// Bytes of artifacts one run may store.
/// The operator's upstream proxy for every guarded connection (the
/// sidecars' api_call, `/llm`, forward proxy and remote MCP; the
/// platform's webhooks and model catalog): `http://[user:pass@]host:port`.
pub const ENV_PROXY_URL: &str = "PROXY_URL";
pub const ENV_RUN_MAX_ARTIFACT_BYTES: &str = "RUN_MAX_ARTIFACT_BYTES";
/// Bytes of artifacts an organization's runs may store together (`0`: no cap).
pub const ENV_ORG_MAX_ARTIFACT_BYTES: &str = "ORG_MAX_ARTIFACT_BYTES";
/// `RUN_MAX_ARTIFACT_BYTES`'s default.
pub const DEFAULT_RUN_ARTIFACT_BYTES: u64 = 16 << 20;
/// `ORG_MAX_ARTIFACT_BYTES`'s default.
pub const DEFAULT_ORG_ARTIFACT_BYTES: u64 = 1 << 30;
/// Largest workspace tmpfs (1 TiB: a typo, not a size).
pub const MAX_WORKSPACE_TMPFS_MB: u64 = 1 << 20;
pub const DEFAULT_CPUS: f64 = 2.0;
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// Reads a PEM file of CA certificates: at least one, every block valid.
/// `EGRESS_RESOLVE`'s answers: `host=ip[,ip…]` entries separated by `;`.
fn fixed_answers(
    v: &str,
) -> Result<std::collections::BTreeMap<String, Vec<std::net::IpAddr>>, SettingsError> {
    let bad = |message: String| SettingsError {
        var: "EGRESS_RESOLVE",
        message,
    };
    let mut out = std::collections::BTreeMap::new();
    for entry in v.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (host, ips) = entry
            .split_once('=')
            .ok_or_else(|| bad(format!("{entry:?} is not host=ip[,ip…]")))?;
        let ips = ips
            .split(',')
            .map(|ip| ip.trim().parse::<std::net::IpAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(format!("{entry:?}: {e}")))?;
        out.insert(host.trim().to_ascii_lowercase(), ips);
    }
    Ok(out)
}

fn read_ca_file(path: &str) -> Result<String, SettingsError> {
    let bad = |message: String| SettingsError {
        var: "EGRESS_EXTRA_CA_FILE",
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(format!("cannot read {path}: {e}")))?;
    if meta.len() > 1 << 20 {
        return Err(bad(format!("{path} is larger than 1 MiB")));
    }
    let pem = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read {path}: {e}")))?;
    use rustls_pki_types::pem::PemObject;
    let mut n = 0;
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
        cert.map_err(|e| bad(format!("{path}: not a PEM certificate: {e}")))?;
        n += 1;
    }
    if n == 0 {
        return Err(bad(format!("{path} holds no PEM certificate")));
    }
    Ok(pem)
}

impl Settings {
    pub fn from_env() -> Result<Settings, SettingsError> {
        let vars: HashMap<String, String> = std::env::vars().collect();
        Self::from_vars(&vars)
    }

    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Settings, SettingsError> {
        let get = |k: &str| vars.get(k).map(String::as_str).filter(|v| !v.is_empty());
        let num = |var: &'static str, default: u64| -> Result<u64, SettingsError> {
            match get(var) {
                None => Ok(default),
                Some(v) => v.parse::<u64>().map_err(|_| SettingsError {
                    var,
                    message: format!("{v:?} is not a whole number of seconds"),
                }),
            }
        };
        let bytes = |var: &'static str, default: u64| -> Result<u64, SettingsError> {
            match get(var) {
                None => Ok(default),
                Some(v) => v.parse::<u64>().map_err(|_| SettingsError {
                    var,
                    message: format!("{v:?} is not a whole number of bytes"),
                }),
            }
        };
        let limits = match get("PLATFORM_RUN_LIMITS") {
            None => RunLimits::default(),
            Some(v) => RunLimits::parse(v).map_err(|e| SettingsError {
                var: "PLATFORM_RUN_LIMITS",
                message: e.to_string(),
            })?,
        };
        let s = Settings {
            run_adapter: get("RUN_ADAPTER").unwrap_or("auto").to_owned(),
            limits,
            boot_deadline_secs: num("RUN_BOOT_DEADLINE_SECONDS", 300)?,
            heartbeat_interval_secs: num("RUN_HEARTBEAT_INTERVAL_SECONDS", 15)?,
            stall_threshold_secs: num("RUN_STALL_THRESHOLD_SECONDS", 60)?,
            watchdog_interval_secs: num("RUN_WATCHDOG_INTERVAL_SECONDS", 15)?,
            workspace_tmpfs_mb: num("WORKSPACE_TMPFS_SIZE_MB", 512)?,
            allow_internal_hosts: get("EGRESS_ALLOW_INTERNAL_HOSTS")
                .map(|v| {
                    v.split(',')
                        .map(|h| h.trim().to_owned())
                        .filter(|h| !h.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            dns_server: get("AIRLOCK_DNS_SERVER").map(str::to_owned),
            resolve: match get("EGRESS_RESOLVE") {
                None => Default::default(),
                Some(v) => fixed_answers(v)?,
            },
            extra_ca_pem: match get("EGRESS_EXTRA_CA_FILE") {
                None => None,
                Some(path) => Some(read_ca_file(path)?),
            },
            artifacts: airlock_store::ArtifactCaps {
                run_bytes: bytes(ENV_RUN_MAX_ARTIFACT_BYTES, DEFAULT_RUN_ARTIFACT_BYTES)?,
                org_bytes: Some(bytes(
                    ENV_ORG_MAX_ARTIFACT_BYTES,
                    DEFAULT_ORG_ARTIFACT_BYTES,
                )?)
                .filter(|n| *n > 0),
            },
            catalog: crate::catalog::CatalogSettings::from_vars(
                get(crate::catalog::ENV_URL),
                get(crate::catalog::ENV_TRUST_ROOT),
            )?,
            bundles: crate::bundle::BundleSettings::from_vars(
                get(crate::bundle::ENV_POLICY),
                get(crate::bundle::ENV_TRUST_ROOT),
            )?,
            system_provider_keys: crate::provider_keys::SystemProviderKeys::from_var(get(
                crate::provider_keys::ENV_SYSTEM_PROVIDER_KEYS,
            ))?,
            proxy_url: get(ENV_PROXY_URL).map(|v| secrecy::SecretString::from(v.to_owned())),
            system_proxies: crate::proxies::SystemProxies::from_var(get(
                crate::proxies::ENV_SYSTEM_PROXIES,
            ))?,
        };
        s.check()?;
        Ok(s)
    }

    /// The checks of settings read: each bad one is refused naming its variable.
    fn check(&self) -> Result<(), SettingsError> {
        if let Some(d) = &self.dns_server
            && d.parse::<std::net::SocketAddr>().is_err()
            && d.parse::<std::net::IpAddr>().is_err()
        {
            return Err(SettingsError {
                var: "AIRLOCK_DNS_SERVER",
                message: format!("{d:?} is not a nameserver address (an IP, or IP:port)"),
            });
        }
        for h in &self.allow_internal_hosts {
            if let Err(e) = airlock_egress::Target::parse(&format!("http://{h}/")) {
                return Err(SettingsError {
                    var: "EGRESS_ALLOW_INTERNAL_HOSTS",
                    message: format!("{h:?} is not a host name or address: {e}"),
                });
            }
            if h.contains(['/', '@', ':', '?', '#']) && h.parse::<std::net::IpAddr>().is_err() {
                return Err(SettingsError {
                    var: "EGRESS_ALLOW_INTERNAL_HOSTS",
                    message: format!("{h:?} must be a bare host name (no scheme, port or path)"),
                });
            }
        }
        if self.workspace_tmpfs_mb == 0 || self.workspace_tmpfs_mb > MAX_WORKSPACE_TMPFS_MB {
            return Err(SettingsError {
                var: "WORKSPACE_TMPFS_SIZE_MB",
                message: format!(
                    "{} must be between 1 and {MAX_WORKSPACE_TMPFS_MB}",
                    self.workspace_tmpfs_mb
                ),
            });
        }
        if self.heartbeat_interval_secs == 0 {
            return Err(SettingsError {
                var: "RUN_HEARTBEAT_INTERVAL_SECONDS",
                message: "must be at least 1".into(),
            });
        }
        if self.stall_threshold_secs < 3 * self.heartbeat_interval_secs {
            return Err(SettingsError {
                var: "RUN_STALL_THRESHOLD_SECONDS",
                message: format!(
                    "{} is under three heartbeats ({} s each): a healthy run would be stopped",
                    self.stall_threshold_secs, self.heartbeat_interval_secs
                ),
            });
        }
        if ![
            "auto",
            "process",
            "namespace",
            "docker",
            "microvm",
            "firecracker",
        ]
        .contains(&self.run_adapter.as_str())
        {
            return Err(SettingsError {
                var: "RUN_ADAPTER",
                message: format!(
                    "{:?} is not auto, process, namespace, docker, microvm or firecracker",
                    self.run_adapter
                ),
            });
        }
        if self.watchdog_interval_secs == 0 {
            return Err(SettingsError {
                var: "RUN_WATCHDOG_INTERVAL_SECONDS",
                message: "must be at least 1".into(),
            });
        }
        Ok(())
    }

    /// The egress guard of the platform process's own outbound calls
    /// (webhooks, the model catalog): the operator's internal hosts, the
    /// sidecars' resolver (`AIRLOCK_DNS_SERVER`, else the system's), and
    /// never one of `own_listeners`.
    pub fn platform_guard(
        &self,
        own_listeners: &[std::net::SocketAddr],
    ) -> Result<airlock_egress::Guard, airlock_egress::ResolveError> {
        let mut policy = airlock_egress::EgressPolicy::new();
        policy.allow_internal_hosts(self.allow_internal_hosts.iter().map(String::as_str));
        policy.refuse_own_listeners(own_listeners.iter().copied());
        let resolver: std::sync::Arc<dyn airlock_egress::Resolve> = match &self.dns_server {
            Some(d) => std::sync::Arc::new(airlock_egress::DnsServerResolver::new(
                airlock_egress::DnsServerResolver::parse_addr(d)?,
            )?),
            None => std::sync::Arc::new(airlock_egress::SystemResolver),
        };
        Ok(airlock_egress::Guard::new(policy, resolver))
    }

    /// How the platform's own guarded connections leave (webhooks, the
    /// model catalog): directly, or through `PROXY_URL`, as the sidecars'
    /// do ([`airlock_egress::upstream::Via`]).
    pub fn via(&self) -> std::sync::Arc<airlock_egress::upstream::Via> {
        use secrecy::ExposeSecret as _;
        std::sync::Arc::new(airlock_egress::upstream::Via::from_url(
            self.proxy_url.as_ref().map(|u| u.expose_secret()),
        ))
    }

    /// `EGRESS_EXTRA_CA_FILE`'s certificates, as trust anchors.
    pub fn extra_roots(&self) -> Vec<rustls_pki_types::CertificateDer<'static>> {
        use rustls_pki_types::pem::PemObject;
        self.extra_ca_pem
            .as_deref()
            .map(|pem| {
                rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
                    .filter_map(Result::ok)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A run's model budget: the manifest's `[budget]` within the
    /// operator's ceilings (a measure the manifest leaves open is the
    /// ceiling's).
    pub fn run_budget(
        &self,
        b: Option<&crate::manifest::BudgetSection>,
    ) -> airlock_platform_api::budget::Limits {
        let within = |v: Option<u64>, ceiling: Option<u64>| match (v, ceiling) {
            (Some(v), Some(c)) => Some(v.min(c)),
            (v, c) => v.or(c),
        };
        let usd = |v: f64| {
            // µUSD, rounded down; at most 10^12 (a manifest's 10^6 USD).
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = (v * 1e6).clamp(0.0, 1e12) as u64;
            n
        };
        let l = &self.limits;
        airlock_platform_api::budget::Limits {
            tokens: within(b.and_then(|b| b.tokens), l.run_tokens_ceiling),
            cost_microusd: within(
                b.and_then(|b| b.cost_usd).map(usd),
                l.run_cost_ceiling_usd.map(usd),
            ),
            requests: within(b.and_then(|b| b.requests), l.run_requests_ceiling),
        }
    }

    /// A manifest hint within the operator's ceilings.
    pub fn effective(
        &self,
        memory_mb: Option<u64>,
        cpus: Option<f64>,
        timeout: Option<u64>,
    ) -> (u64, f64, u64) {
        let mem = memory_mb
            .unwrap_or(DEFAULT_MEMORY_MB)
            .min(self.limits.agent_memory_ceiling_mb);
        let cpu = cpus
            .unwrap_or(DEFAULT_CPUS)
            .min(self.limits.agent_cpu_ceiling);
        let t = timeout
            .unwrap_or(DEFAULT_TIMEOUT_SECS)
            .min(self.limits.timeout_ceiling_seconds);
        (mem, cpu, t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_and_ceilings() {
        let s = Settings::from_vars(&vars(&[])).unwrap();
        assert_eq!(s.effective(None, None, None), (1536, 2.0, 300));
        let s = Settings::from_vars(&vars(&[(
            "PLATFORM_RUN_LIMITS",
            r#"{"agent_memory_ceiling_mb": 512, "timeout_ceiling_seconds": 60}"#,
        )]))
        .unwrap();
        assert_eq!(
            s.effective(Some(4096), Some(8.0), Some(3600)),
            (512, 2.0, 60)
        );
    }

    #[test]
    fn a_runs_budget_is_its_manifests_within_the_ceilings() {
        use crate::manifest::BudgetSection;
        let s = Settings::from_vars(&vars(&[])).unwrap();
        assert!(
            !s.run_budget(None).any(),
            "no ceiling, no [budget]: no budget"
        );
        let s = Settings::from_vars(&vars(&[(
            "PLATFORM_RUN_LIMITS",
            r#"{"run_tokens_ceiling": 5000, "run_cost_ceiling_usd": 1.5}"#,
        )]))
        .unwrap();
        let b = s.run_budget(None);
        assert_eq!(
            (b.tokens, b.cost_microusd, b.requests),
            (Some(5000), Some(1_500_000), None)
        );
        let asked = BudgetSection {
            tokens: Some(9000),
            cost_usd: Some(0.25),
            requests: Some(7),
            default_max_tokens: None,
        };
        let b = s.run_budget(Some(&asked));
        assert_eq!(
            (b.tokens, b.cost_microusd, b.requests),
            (Some(5000), Some(250_000), Some(7))
        );
    }

    #[test]
    fn fixed_answers_are_host_equals_addresses() {
        let s = Settings::from_vars(&vars(&[(
            "EGRESS_RESOLVE",
            "API.test=127.0.0.2; b.test=127.0.0.3, ::1;",
        )]))
        .unwrap();
        assert_eq!(
            s.resolve["api.test"],
            ["127.0.0.2".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(s.resolve["b.test"].len(), 2);
    }

    #[test]
    fn strict_limits_and_watchdog_checks() {
        let e = Settings::from_vars(&vars(&[(
            "PLATFORM_RUN_LIMITS",
            r#"{"agent_memory_ceilling_mb": 1}"#,
        )]))
        .unwrap_err();
        assert_eq!(e.var, "PLATFORM_RUN_LIMITS");
        assert!(e.message.contains("unknown field"), "{e}");
        assert!(Settings::from_vars(&vars(&[("PLATFORM_RUN_LIMITS", "not json")])).is_err());
        for bad in [
            "[1024]",
            "1024",
            r#"{"agent_memory_ceiling_mb": 0}"#,
            r#"{"agent_cpu_ceiling": 0}"#,
            r#"{"agent_cpu_ceiling": -1}"#,
            // Bounded as a manifest's `cpus` is (issue 45, item 13).
            r#"{"agent_cpu_ceiling": 1e308}"#,
            r#"{"agent_cpu_ceiling": 1025}"#,
            // Strict: a key given twice is refused, not the last one kept.
            r#"{"agent_memory_ceiling_mb": 512, "agent_memory_ceiling_mb": 4096}"#,
            r#"{"timeout_ceiling_seconds": 0}"#,
            r#"{"max_concurrent_runs": 0}"#,
            r#"{"run_tokens_ceiling": 0}"#,
            r#"{"run_requests_ceiling": 0}"#,
            r#"{"run_cost_ceiling_usd": 0}"#,
            r#"{"run_cost_ceiling_usd": -1}"#,
        ] {
            let e = Settings::from_vars(&vars(&[("PLATFORM_RUN_LIMITS", bad)])).unwrap_err();
            assert_eq!(e.var, "PLATFORM_RUN_LIMITS", "{bad}");
        }
        for (var, bad) in [
            ("AIRLOCK_DNS_SERVER", "not-an-address"),
            ("AIRLOCK_DNS_SERVER", "10.0.0.1:99999"),
            ("EGRESS_ALLOW_INTERNAL_HOSTS", "http://db.internal/"),
            ("EGRESS_ALLOW_INTERNAL_HOSTS", "a b"),
            ("EGRESS_RESOLVE", "api.test"),
            ("EGRESS_RESOLVE", "api.test=not-an-ip"),
            ("WORKSPACE_TMPFS_SIZE_MB", "0"),
        ] {
            let e = Settings::from_vars(&vars(&[(var, bad)])).unwrap_err();
            assert_eq!(e.var, var, "{bad}: {e}");
        }
        let ok = Settings::from_vars(&vars(&[
            ("AIRLOCK_DNS_SERVER", "127.0.0.1:5353"),
            (
                "EGRESS_ALLOW_INTERNAL_HOSTS",
                "db.internal, llm_svc,10.0.0.7",
            ),
        ]))
        .unwrap();
        assert_eq!(
            ok.allow_internal_hosts,
            ["db.internal", "llm_svc", "10.0.0.7"]
        );
        let e = Settings::from_vars(&vars(&[
            ("RUN_STALL_THRESHOLD_SECONDS", "20"),
            ("RUN_HEARTBEAT_INTERVAL_SECONDS", "10"),
        ]))
        .unwrap_err();
        assert_eq!(e.var, "RUN_STALL_THRESHOLD_SECONDS");
        assert!(
            Settings::from_vars(&vars(&[
                ("RUN_STALL_THRESHOLD_SECONDS", "30"),
                ("RUN_HEARTBEAT_INTERVAL_SECONDS", "10")
            ]))
            .is_ok()
        );
        assert_eq!(
            Settings::from_vars(&vars(&[("RUN_ADAPTER", "vm")]))
                .unwrap_err()
                .var,
            "RUN_ADAPTER"
        );
        assert_eq!(
            Settings::from_vars(&vars(&[("RUN_BOOT_DEADLINE_SECONDS", "-1")]))
                .unwrap_err()
                .var,
            "RUN_BOOT_DEADLINE_SECONDS"
        );
    }
}

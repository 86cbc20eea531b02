//! The sidecar's shared state, one per run: its configuration, the guarded
//! client, the platform client, and the run's recorders (the event sink,
//! the egress recorder, the keeper of what must never be shed), built here
//! from the configuration. Every site reads it; it imports none of them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use airlock_egress::{
    AuthorizedUris, ClientConfig, DnsServerResolver, EgressError, EgressPolicy, Guard,
    GuardedClient, Resolve, StaticResolver, SystemResolver,
};
use airlock_platform_api::PlatformClient;
use secrecy::{ExposeSecret as _, SecretString};
use tokio::sync::Semaphore;

use crate::config::{Integration, Limits, Model, NetworkEgress, SidecarConfig};
use crate::credential::Credentials;
use crate::egress::Recorder;
use crate::event_sink::EventSink;
use crate::interception::Interceptor;
use crate::journal::Journal;
use crate::keep::Keeper;

pub struct Sidecar {
    pub run_id: String,
    pub(crate) token: SecretString,
    pub platform: PlatformClient,
    pub client: GuardedClient,
    pub integrations: foldhash::HashMap<String, Integration>,
    pub model: Option<Model>,
    /// The forward proxy's network policy: `(patterns, allow_all)`.
    pub network: (AuthorizedUris, bool),
    pub limits: Limits,
    /// The model budgets the relay keeps.
    pub budget: airlock_platform_api::budget::RunBudget,
    /// How guarded connections leave: directly or through `PROXY_URL`;
    /// the guarded client's dialer and the forward proxy's, one decision.
    pub via: Arc<airlock_egress::upstream::Via>,
    /// Bounds concurrent `api_call`s of the run.
    pub api_calls: Semaphore,
    /// Bounds the credential fetches started ahead of their call (from a
    /// request's headers, before its body is read), as `api_calls` bounds
    /// calls: an agent that opens requests and never finishes their bodies
    /// holds at most this many fetches open; a request beyond it fetches
    /// when its call runs. Separate from `api_calls`, which a call takes
    /// after its early fetch started.
    pub fetches_ahead: Arc<Semaphore>,
    pub events: EventSink,
    /// What must never be shed, and the log lines within the run's cap.
    pub keep: Keeper,
    /// The egress log: every outbound request of every site.
    pub egress: Recorder,
    /// The intercepting proxy, when an integration has `inject = "proxy"`
    /// or a local runner.
    pub interceptor: Option<Interceptor>,
    /// What each local runner's proxy lets out without a credential: its
    /// integration's `authorized_uris` (and `allow_all_uris`).
    pub runner_network: HashMap<String, (AuthorizedUris, bool)>,
    /// The local runners' MCP listeners, bound by [`crate::server::run`]
    /// and taken by the MCP service when it starts.
    pub runner_mcp: std::sync::Mutex<HashMap<String, tokio::net::UnixListener>>,
    /// Each integration's credential values seen by the run and their
    /// redactor ([`crate::credential`]).
    pub credentials: Credentials,
    /// The run is traced: each request's steps are timed into its egress
    /// record (`SidecarConfig::trace_steps`); off, no clock is read for it.
    pub traced: bool,
    /// The tools hidden by an allowlist, kept once each for the audit.
    pub exclusions: crate::exclusions::Exclusions,
    /// The run's L7 rule lists, live: every site judges by them.
    pub policy: crate::policy::LivePolicy,
    /// The requests held for a person's answer, and what was allowed for
    /// the whole run ([`crate::approval`]).
    pub approvals: crate::approval::Approvals,
}

impl Sidecar {
    /// Builds the state (the guard, its resolver and TLS roots) from the
    /// configuration. `own_listeners` are the TCP addresses this sidecar
    /// serves on: the guard refuses them to every egress site.
    pub fn new(
        mut cfg: SidecarConfig,
        own_listeners: &[SocketAddr],
        journal: Journal,
    ) -> Result<Arc<Sidecar>, EgressError> {
        let mut policy = EgressPolicy::new();
        policy.allow_internal_hosts(cfg.egress.allow_internal_hosts.iter().map(String::as_str));
        policy.block_names(cfg.egress.blocked_names.iter().map(String::as_str));
        policy.refuse_own_listeners(own_listeners.iter().copied());
        let fallback: Arc<dyn Resolve> = match &cfg.egress.dns_server {
            Some(s) => Arc::new(
                DnsServerResolver::parse_addr(s)
                    .and_then(DnsServerResolver::new)
                    .map_err(|e| EgressError::upstream("-", format!("dns_server: {e}")))?,
            ),
            None => Arc::new(SystemResolver),
        };
        let mut resolver = StaticResolver::new().with_fallback(fallback);
        for (host, ips) in &cfg.egress.resolve {
            resolver.insert(host, ips.iter().copied());
        }
        let mut extra_root_certs = Vec::new();
        if let Some(pem) = &cfg.egress.extra_ca_pem {
            use rustls_pki_types::pem::PemObject;
            for cert in rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
                extra_root_certs.push(
                    cert.map_err(|e| EgressError::upstream("-", format!("extra_ca_pem: {e}")))?,
                );
            }
        }
        let client_cfg = ClientConfig {
            max_response_bytes: cfg.limits.max_response_bytes,
            total_timeout: Duration::from_secs(cfg.limits.upstream_timeout_secs),
            extra_root_certs,
            ..ClientConfig::default()
        };
        let via = Arc::new(airlock_egress::upstream::Via::from_url(
            cfg.proxy_url.as_ref().map(|u| u.expose_secret()),
        ));
        if let Some(p) = via.redacted() {
            tracing::info!(proxy = %p, "guarded connections go through the upstream proxy");
        }
        let client = GuardedClient::with_dialer(
            Guard::new(policy, Arc::new(resolver)),
            client_cfg,
            via.clone(),
        )?;
        let policy = crate::policy::LivePolicy::new(&cfg.network, &cfg.integrations);
        for i in &mut cfg.integrations {
            i.live_rules = Some(policy.integration(i.namespace.as_str()));
        }
        let network_rules = policy.network();
        let network = match &cfg.network.egress {
            NetworkEgress::Public => (AuthorizedUris::default(), true),
            NetworkEgress::None => (AuthorizedUris::default(), false),
            NetworkEgress::Allow(p) => {
                let list = AuthorizedUris::parse(p);
                for d in list.diagnostics().iter().filter(|d| d.matches_nothing) {
                    tracing::warn!(entry = %d.entry, "network.egress entry matches nothing: {}", d.reason);
                }
                (list, false)
            }
        };
        let network = (network.0.with_rules(network_rules.clone()), network.1);
        let integrations: foldhash::HashMap<String, Integration> = cfg
            .integrations
            .into_iter()
            .map(|i| (i.namespace.to_string(), i))
            .collect();
        let interceptor = match &cfg.proxy_ca {
            Some(ca) => Interceptor::new(ca, &integrations, network_rules)
                .map_err(|e| EgressError::upstream("-", e.to_string()))?,
            None => None,
        };
        let runner_network = integrations
            .values()
            .filter(|i| i.runner.is_some())
            .map(|i| (i.namespace.to_string(), (i.authorized(), i.allow_all_uris)))
            .collect();
        let platform = PlatformClient::new(&cfg.platform_socket, cfg.run_token);
        let events = EventSink::start(platform.clone());
        let journal = Arc::new(journal);
        Ok(Arc::new(Sidecar {
            run_id: cfg.run_id,
            token: cfg.sidecar_token,
            client,
            integrations,
            model: cfg.model,
            network,
            api_calls: Semaphore::new(cfg.limits.max_concurrent_calls.max(1)),
            fetches_ahead: Arc::new(Semaphore::new(cfg.limits.max_concurrent_calls.max(1))),
            limits: cfg.limits,
            budget: cfg.budget,
            via,
            egress: Recorder::new(events.clone(), journal.clone()),
            keep: Keeper::new(journal),
            events,
            platform,
            interceptor,
            runner_network,
            runner_mcp: Default::default(),
            credentials: Default::default(),
            traced: cfg.trace_steps,
            exclusions: Default::default(),
            policy,
            approvals: Default::default(),
        }))
    }
}

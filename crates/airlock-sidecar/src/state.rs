//! The sidecar's shared state: configuration, the guarded client, the
//! platform client and the event sink. One per run.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use airlock_egress::{
    AuthorizedUris, ClientConfig, DnsServerResolver, EgressError, EgressPolicy, Guard,
    GuardedClient, Resolve, StaticResolver, SystemResolver,
};
use airlock_platform_api::PlatformClient;
use airlock_platform_api::wire::RunEvent;
use secrecy::SecretString;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::config::{Integration, Limits, Model, NetworkEgress, SidecarConfig};
use crate::egress::Recorder;
use crate::journal::Journal;

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

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
    pub proxy_url: Option<SecretString>,
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
    pub keep: crate::keep::Keeper,
    /// The egress log: every outbound request of every site.
    pub egress: Recorder,
    /// The intercepting proxy, when an integration has `inject = "proxy"`
    /// or a local runner.
    pub interceptor: Option<crate::proxy::Interceptor>,
    /// What each local runner's proxy lets out without a credential: its
    /// integration's `authorized_uris` (and `allow_all_uris`).
    pub runner_network: HashMap<String, (AuthorizedUris, bool)>,
    /// The local runners' MCP listeners, bound by [`crate::server::run`]
    /// and taken by the MCP service when it starts.
    pub runner_mcp: std::sync::Mutex<HashMap<String, tokio::net::UnixListener>>,
    /// Each integration's credential values seen by the run and their
    /// redactor ([`crate::credential`]).
    pub credentials: crate::credential::Credentials,
}

impl Sidecar {
    /// Builds the state (the guard, its resolver and TLS roots) from the
    /// configuration. `own_listeners` are the TCP addresses this sidecar
    /// serves on: the guard refuses them to every egress site.
    pub fn new(
        cfg: SidecarConfig,
        own_listeners: &[SocketAddr],
        journal: Option<Journal>,
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
        let client = GuardedClient::new(Guard::new(policy, Arc::new(resolver)), client_cfg)?;
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
        let integrations: foldhash::HashMap<String, Integration> = cfg
            .integrations
            .into_iter()
            .map(|i| (i.namespace.clone(), i))
            .collect();
        let interceptor = match &cfg.proxy_ca {
            Some(ca) => crate::proxy::Interceptor::new(ca, &integrations)
                .map_err(|e| EgressError::upstream("-", e.to_string()))?,
            None => None,
        };
        let runner_network = integrations
            .values()
            .filter(|i| i.runner.is_some())
            .map(|i| {
                (
                    i.namespace.clone(),
                    (AuthorizedUris::parse(&i.authorized_uris), i.allow_all_uris),
                )
            })
            .collect();
        let platform = PlatformClient::new(&cfg.platform_socket, cfg.run_token);
        let events = EventSink::start(platform.clone());
        let journal = journal.map(Arc::new);
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
            proxy_url: cfg.proxy_url,
            egress: Recorder::new(events.clone(), journal.clone()),
            keep: crate::keep::Keeper::new(journal, events.clone()),
            events,
            platform,
            interceptor,
            runner_network,
            runner_mcp: Default::default(),
            credentials: Default::default(),
        }))
    }
}

enum SinkMsg {
    /// An event, and who waits to learn whether the platform stored it.
    Event(Box<RunEvent>, Option<oneshot::Sender<bool>>),
    Flush(oneshot::Sender<bool>),
}

/// Forwards events to the platform in batches, off the request path.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<SinkMsg>,
}

const SINK_CAPACITY: usize = 16 * 1024;
const BATCH: usize = 256;
/// How long the sink waits for more events before sending a batch (not
/// when someone waits for it: a flush, or an egress record whose request
/// is held until the platform has it).
const LINGER: Duration = Duration::from_millis(5);

/// Sends `events`, retrying a refusal a few times; `false` if they were dropped.
async fn deliver(platform: &PlatformClient, events: Vec<RunEvent>) -> bool {
    let n = events.len();
    let mut attempt = 0;
    loop {
        match platform.events(events.clone()).await {
            Ok(_) => return true,
            Err(e) if attempt < 3 => {
                attempt += 1;
                tracing::warn!("event sink: platform refused {n} events (attempt {attempt}): {e}");
                tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
            }
            Err(e) => {
                tracing::error!("event sink: dropped {n} events: {e}");
                return false;
            }
        }
    }
}

impl EventSink {
    /// Events are gathered for up to [`LINGER`] (or [`BATCH`] of them), so a
    /// busy run costs the platform one request per batch, not per event. A
    /// flush sends at once. So does an egress record the sidecar waits for
    /// (its request is held until the platform has it): it takes along the
    /// egress records queued before it (one write for all), while the other
    /// events keep lingering.
    pub fn start(platform: PlatformClient) -> Self {
        let (tx, mut rx) = mpsc::channel::<SinkMsg>(SINK_CAPACITY);
        tokio::spawn(async move {
            let mut pending: Vec<RunEvent> = Vec::new();
            let mut due_at: Option<tokio::time::Instant> = None;
            let mut closed = false;
            while !(closed && pending.is_empty()) {
                let mut acks: Vec<oneshot::Sender<bool>> = Vec::new();
                let mut flushes: Vec<oneshot::Sender<bool>> = Vec::new();
                let next = match due_at {
                    _ if closed => None,
                    Some(at) => tokio::time::timeout_at(at, rx.recv()).await.ok(),
                    None => Some(rx.recv().await),
                };
                let mut take = |m: SinkMsg, pending: &mut Vec<RunEvent>| match m {
                    SinkMsg::Event(e, ack) => {
                        pending.push(*e);
                        acks.extend(ack);
                    }
                    SinkMsg::Flush(w) => flushes.push(w),
                };
                match next {
                    Some(Some(m)) => {
                        take(m, &mut pending);
                        while let Ok(m) = rx.try_recv() {
                            take(m, &mut pending);
                        }
                    }
                    Some(None) => closed = true,
                    None => {}
                }
                let now = tokio::time::Instant::now();
                if due_at.is_none() && !pending.is_empty() {
                    due_at = Some(now + LINGER);
                }
                let due = closed
                    || !flushes.is_empty()
                    || pending.len() >= BATCH
                    || due_at.is_some_and(|at| at <= now);
                if due {
                    let delivered = pending.is_empty()
                        || deliver(&platform, std::mem::take(&mut pending)).await;
                    due_at = None;
                    for w in acks.into_iter().chain(flushes) {
                        let _ = w.send(delivered);
                    }
                } else if !acks.is_empty() {
                    let (egress, rest): (Vec<RunEvent>, Vec<RunEvent>) =
                        std::mem::take(&mut pending)
                            .into_iter()
                            .partition(|e| matches!(e, RunEvent::Egress(_)));
                    pending = rest;
                    if pending.is_empty() {
                        due_at = None;
                    }
                    let delivered = deliver(&platform, egress).await;
                    for w in acks {
                        let _ = w.send(delivered);
                    }
                }
            }
        });
        EventSink { tx }
    }

    /// Queues an event; never blocks the request path.
    pub fn send(&self, event: RunEvent) {
        if self
            .tx
            .try_send(SinkMsg::Event(Box::new(event), None))
            .is_err()
        {
            tracing::error!("event sink is full or closed: an event was dropped");
        }
    }

    /// Sends `event` now, with whatever is queued before it, and waits until
    /// the platform has stored them: `false` if it did not.
    pub async fn send_acked(&self, event: RunEvent) -> bool {
        let (tx, rx) = oneshot::channel();
        if self
            .tx
            .send(SinkMsg::Event(Box::new(event), Some(tx)))
            .await
            .is_err()
        {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// Waits until every event queued before this call was handed to the
    /// platform; `false` if some of them could not be.
    pub async fn flush(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(SinkMsg::Flush(tx)).await.is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

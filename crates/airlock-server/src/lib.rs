//! `airlock serve`: the platform as a long-lived, multi-tenant HTTP service
//! (docs/serve.md).
//!
//! - [`routes`]: the `/v1` API; [`openapi`] holds the one table the router
//!   and the OpenAPI document are both built from.
//! - [`auth`]: organizations' API keys; every row a route reads or changes is
//!   looked up under the caller's organization.
//! - [`scheduler`]: this replica's share of the work: it registers itself,
//!   heartbeats, claims queued runs in order within the limits, runs them,
//!   stops those asked to stop; the replica holding the leader lease fails
//!   the runs of replicas that died.
//! - [`webhooks`]: signed deliveries of run events, judged by the egress
//!   guard at creation and at every delivery, retried with backoff.

#![forbid(unsafe_code)]

pub mod auth;
pub mod error;
pub mod extract;
pub mod openapi;
pub mod ratelimit;
pub mod routes;
pub mod scheduler;
pub mod webhooks;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_egress::{ClientConfig, EgressPolicy, GuardedClient};
use airlock_platform::orchestrator::Orchestrator;
use airlock_store::Store;
use tokio::sync::{Notify, watch};

pub use auth::{ApiAuth, Tenant};
pub use error::ApiError;

/// What `airlock serve` is configured with (beside the platform's settings).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// A replica silent this long is dead: the leader fails its runs, and a
    /// leader silent this long loses the lease (`AIRLOCK_REPLICA_LEASE_SECONDS`, 15).
    pub replica_lease: Duration,
    pub rate: ratelimit::RateLimit,
    /// Failed authentications per client address (`API_AUTH_FAILURE_BURST`,
    /// 20, then one every two seconds).
    pub auth_failures: ratelimit::RateLimit,
    /// Open event streams per organization on this replica
    /// (`API_MAX_STREAMS`, 64): each polls the store.
    pub max_streams: usize,
    /// At most this many runs at once on this replica
    /// (`AIRLOCK_REPLICA_MAX_RUNS`; unset: only the store-wide limits).
    pub replica_max_runs: Option<usize>,
    /// `WEBHOOK_MAX_ATTEMPTS` (8).
    pub webhook_max_attempts: u32,
    /// `WEBHOOK_RETRY_BASE_MS` (1000): the n-th retry waits base × 2^(n-1), at most an hour.
    pub webhook_retry_base: Duration,
    /// `WEBHOOK_TIMEOUT_SECONDS` (10): one delivery attempt, connect to last byte.
    pub webhook_timeout: Duration,
}

/// The default `--listen` address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8420";

#[derive(Debug, thiserror::Error)]
#[error("{var}: {message}")]
pub struct ConfigError {
    pub var: &'static str,
    pub message: String,
}

impl ServeConfig {
    /// From the environment; `listen` from the command line or `AIRLOCK_LISTEN`.
    pub fn from_env(listen: Option<&str>) -> Result<Self, ConfigError> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let listen_s = listen
            .map(str::to_owned)
            .or_else(|| get("AIRLOCK_LISTEN"))
            .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen = listen_s.parse().map_err(|_| ConfigError {
            var: "AIRLOCK_LISTEN",
            message: format!("{listen_s:?} is not an address and port, e.g. 127.0.0.1:8420"),
        })?;
        fn num(
            var: &'static str,
            v: Option<String>,
            default: f64,
            min: f64,
            max: f64,
        ) -> Result<f64, ConfigError> {
            let Some(v) = v else { return Ok(default) };
            match v.trim().parse::<f64>() {
                Ok(n) if n.is_finite() && (min..=max).contains(&n) => Ok(n),
                _ => Err(ConfigError {
                    var,
                    message: format!("{v:?} is not a number from {min} to {max}"),
                }),
            }
        }
        let replica_max_runs = get("AIRLOCK_REPLICA_MAX_RUNS")
            .map(|v| {
                num("AIRLOCK_REPLICA_MAX_RUNS", Some(v), 0.0, 1.0, 100_000.0).map(|n| n as usize)
            })
            .transpose()?;
        let lease = num(
            "AIRLOCK_REPLICA_LEASE_SECONDS",
            get("AIRLOCK_REPLICA_LEASE_SECONDS"),
            15.0,
            1.0,
            3600.0,
        )?;
        Ok(ServeConfig {
            listen,
            replica_lease: Duration::from_secs_f64(lease),
            replica_max_runs,
            max_streams: num(
                "API_MAX_STREAMS",
                get("API_MAX_STREAMS"),
                64.0,
                1.0,
                100_000.0,
            )? as usize,
            auth_failures: ratelimit::RateLimit {
                burst: num(
                    "API_AUTH_FAILURE_BURST",
                    get("API_AUTH_FAILURE_BURST"),
                    20.0,
                    1.0,
                    1e6,
                )?,
                ..ratelimit::AUTH_FAILURES
            },
            rate: ratelimit::RateLimit {
                per_second: num(
                    "API_RATE_PER_SECOND",
                    get("API_RATE_PER_SECOND"),
                    100.0,
                    0.01,
                    1e6,
                )?,
                burst: num("API_RATE_BURST", get("API_RATE_BURST"), 200.0, 1.0, 1e6)?,
            },
            webhook_max_attempts: num(
                "WEBHOOK_MAX_ATTEMPTS",
                get("WEBHOOK_MAX_ATTEMPTS"),
                8.0,
                1.0,
                100.0,
            )? as u32,
            webhook_retry_base: Duration::from_millis(num(
                "WEBHOOK_RETRY_BASE_MS",
                get("WEBHOOK_RETRY_BASE_MS"),
                1000.0,
                1.0,
                3_600_000.0,
            )? as u64),
            webhook_timeout: Duration::from_secs_f64(num(
                "WEBHOOK_TIMEOUT_SECONDS",
                get("WEBHOOK_TIMEOUT_SECONDS"),
                10.0,
                0.1,
                300.0,
            )?),
        })
    }
}

/// The server's state. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    orch: Arc<Orchestrator>,
    auth: ApiAuth,
    limiter: ratelimit::Limiter,
    /// Failed authentications per client address.
    auth_failures: ratelimit::Limiter,
    cfg: ServeConfig,
    replica: String,
    /// Wakes the scheduler (a run was queued or ended).
    kick: Notify,
    /// Wakes the webhook deliverer.
    deliveries: Notify,
    webhook_client: GuardedClient,
    /// Open event streams, per organization.
    streams: Arc<Mutex<HashMap<String, usize>>>,
    /// This replica's running runs: their cancel switches.
    running: Mutex<HashMap<String, watch::Sender<bool>>>,
    ready: AtomicBool,
    stopping: AtomicBool,
}

impl AppState {
    pub fn new(orch: Arc<Orchestrator>, auth: ApiAuth, cfg: ServeConfig) -> Result<Self, ApiError> {
        let replica = format!(
            "rep_{}",
            airlock_vault::random_hex::<6>().map_err(ApiError::internal)?
        );
        // Webhook URLs meet the same guard as a sandbox's requests: the
        // operator's internal hosts, and never this server itself.
        let mut policy = EgressPolicy::new();
        policy.allow_internal_hosts(
            orch.settings
                .allow_internal_hosts
                .iter()
                .map(String::as_str),
        );
        policy.refuse_own_listeners([cfg.listen]);
        // Resolved as the sidecars resolve (`AIRLOCK_DNS_SERVER`, else the system's).
        let resolver: Arc<dyn airlock_egress::Resolve> = match &orch.settings.dns_server {
            Some(d) => Arc::new(
                airlock_egress::DnsServerResolver::parse_addr(d)
                    .and_then(airlock_egress::DnsServerResolver::new)
                    .map_err(|e| ApiError::internal(format!("AIRLOCK_DNS_SERVER: {e}")))?,
            ),
            None => Arc::new(airlock_egress::SystemResolver),
        };
        let guard = airlock_egress::Guard::new(policy, resolver);
        let webhook_client = GuardedClient::new(
            guard,
            ClientConfig {
                total_timeout: cfg.webhook_timeout,
                connect_timeout: cfg.webhook_timeout,
                max_redirects: 0,
                max_response_bytes: 64 * 1024,
                ..Default::default()
            },
        )
        .map_err(ApiError::internal)?;
        Ok(AppState {
            inner: Arc::new(Inner {
                limiter: ratelimit::Limiter::new(cfg.rate),
                auth_failures: ratelimit::Limiter::new(cfg.auth_failures),
                orch,
                auth,
                cfg,
                replica,
                kick: Notify::new(),
                deliveries: Notify::new(),
                webhook_client,
                running: Mutex::default(),
                streams: Arc::default(),
                ready: AtomicBool::new(false),
                stopping: AtomicBool::new(false),
            }),
        })
    }

    pub fn store(&self) -> &Store {
        &self.inner.orch.store
    }
    pub fn orch(&self) -> &Arc<Orchestrator> {
        &self.inner.orch
    }
    pub fn auth(&self) -> &ApiAuth {
        &self.inner.auth
    }
    pub fn limiter(&self) -> &ratelimit::Limiter {
        &self.inner.limiter
    }
    pub fn auth_failures(&self) -> &ratelimit::Limiter {
        &self.inner.auth_failures
    }
    pub fn cfg(&self) -> &ServeConfig {
        &self.inner.cfg
    }
    pub fn keyring(&self) -> &airlock_vault::Keyring {
        self.inner.orch.api.keyring()
    }
    /// This replica's id (runs it starts are recorded as its).
    pub fn replica(&self) -> &str {
        &self.inner.replica
    }
    pub fn webhook_client(&self) -> &GuardedClient {
        &self.inner.webhook_client
    }
    pub fn kick_scheduler(&self) {
        self.inner.kick.notify_one();
    }
    pub fn kick_deliveries(&self) {
        self.inner.deliveries.notify_one();
    }
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::Acquire)
    }
    /// Stops this replica from taking work and cancels its runs.
    pub fn stop(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.kick.notify_waiters();
        if let Ok(r) = self.inner.running.lock() {
            for tx in r.values() {
                let _ = tx.send(true);
            }
        }
    }
    /// Cancels one of this replica's runs; `false` if it runs elsewhere (or not at all).
    pub fn cancel_local(&self, run_id: &str) -> bool {
        self.inner
            .running
            .lock()
            .ok()
            .and_then(|r| r.get(run_id).map(|tx| tx.send(true).is_ok()))
            .unwrap_or(false)
    }
    /// A slot for one more event stream of `org`, held until dropped;
    /// `None` when the organization has `max_streams` open here.
    pub fn open_stream(&self, org: &str) -> Option<StreamSlot> {
        let mut m = self.inner.streams.lock().ok()?;
        let n = m.entry(org.to_owned()).or_insert(0);
        if *n >= self.inner.cfg.max_streams {
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            streams: self.inner.streams.clone(),
            org: org.to_owned(),
        })
    }

    pub fn running_count(&self) -> usize {
        self.inner.running.lock().map(|r| r.len()).unwrap_or(0)
    }
}

/// One open event stream, counted until it is dropped.
pub struct StreamSlot {
    streams: Arc<Mutex<HashMap<String, usize>>>,
    org: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Ok(mut m) = self.streams.lock()
            && let Some(n) = m.get_mut(&self.org)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.org);
            }
        }
    }
}

/// The whole router: `/healthz`, `/readyz`, `/v1/openapi.json` and the `/v1` API.
pub fn router(app: AppState) -> axum::Router {
    openapi::router(app)
}

/// Serves until `shutdown` resolves (then stops taking work, cancels this
/// replica's runs, waits for them to end, and leaves the replica set).
pub async fn serve(
    app: AppState,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let work = scheduler::start(app.clone()).await?;
    app.inner.ready.store(true, Ordering::Release);
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let dead = work.dead.clone();
    let server = axum::serve(
        listener,
        router(app.clone()).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        tokio::select! {
            () = shutdown => {}
            () = dead.notified() => {}
        }
        let _ = stop_tx.send(true);
    });
    let served = server.await;
    let _ = stop_rx.changed().await;
    app.inner.ready.store(false, Ordering::Release);
    let judged_dead = work.judged_dead();
    work.finish(&app).await;
    served.map_err(ServeError::Io)?;
    if judged_dead {
        return Err(ServeError::JudgedDead);
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Io(std::io::Error),
    #[error(transparent)]
    Store(#[from] airlock_store::StoreError),
    #[error(
        "this replica's heartbeat stopped reaching the store for longer than the replica lease: another replica has failed its runs; it stopped"
    )]
    JudgedDead,
}

//! `airlock serve`: the platform as a long-lived, multi-tenant HTTP service
//! (docs/serve.md).
//!
//! - [`routes`]: the `/v1` API, answering the types of [`airlock_api::v1`];
//!   [`openapi`] holds the one table of routes the router is built from,
//!   and the OpenAPI document derived from the handlers and those types.
//! - [`auth`]: organizations' API keys; every row a route reads or changes is
//!   looked up under the caller's organization.
//! - [`scheduler`]: this replica's share of the work: it registers itself,
//!   heartbeats, claims queued runs in order within the limits, runs them,
//!   stops those asked to stop; the replica holding the leader lease fails
//!   the runs of replicas that died.
//! - [`webhooks`]: signed deliveries of run events, judged by the egress
//!   guard at creation and at every delivery, retried with backoff.
//! - [`serve`]: the listener answers from the first moment: `/healthz`
//!   (the process is alive) at once, `/readyz` 503 with the cause while
//!   the platform boots (the store may not answer yet), the API once it
//!   has; on the first SIGTERM the replica drains ([`scheduler::drain`]).

#![forbid(unsafe_code)]

pub mod auth;
pub mod bundle;
pub mod error;
pub mod extract;
pub mod failpoint;
pub mod openapi;
pub mod outage;
pub mod ratelimit;
pub mod routes;
pub mod scheduler;
pub mod webhooks;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use airlock_egress::{ClientConfig, EgressPolicy, GuardedClient};
use airlock_platform::orchestrator::Orchestrator;
use airlock_platform_api::listener_guard;
use airlock_store::Store;
use axum::extract::Request;
use axum::response::{IntoResponse as _, Response};
use tokio::sync::{Notify, watch};
use tower::ServiceExt as _;

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
    /// `WEBHOOK_SLOTS_PER_ORG` (4): of a replica's 16 delivery slots, how
    /// many one organization may hold at once.
    pub webhook_slots_per_org: usize,
    /// `SHUTDOWN_GRACE_SECONDS` (30): on SIGTERM, how long running runs
    /// may go on to their end before they are cancelled ("this replica
    /// shut down").
    pub shutdown_grace: Duration,
    /// What the store keeps and for how long (`RETENTION_*`), swept by the
    /// leader every `retention_sweep`.
    pub retention: airlock_store::Retention,
    /// `RETENTION_SWEEP_SECONDS` (3600).
    pub retention_sweep: Duration,
    /// What one organization may hold (`ORG_MAX_*`).
    pub quotas: airlock_store::OrgQuotas,
    /// The API listener's timeouts and connection caps
    /// (`API_MAX_CONNECTIONS` 1024, `API_MAX_CONNECTIONS_PER_ADDRESS` 256,
    /// `API_HEADER_READ_TIMEOUT_SECONDS` 10, `API_IDLE_TIMEOUT_SECONDS` 60):
    /// [`listener_guard`].
    pub listener: listener_guard::Settings,
    /// `AIRLOCK_TEST_FAIL_POINT`: test-only ([`failpoint`]).
    pub fail_point: Option<failpoint::FailPoint>,
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
        /// The whole part of a count `num` read: finite and within bounds
        /// of at most 3,600,000, so it fits a u32.
        fn whole(n: f64) -> u32 {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let w = n.trunc().clamp(0.0, f64::from(u32::MAX)) as u32;
            w
        }
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
        let setting = |e: airlock_store::SettingError| ConfigError {
            var: e.var,
            message: format!("{:?} is not {}", e.value, e.expected),
        };
        let replica_max_runs = get("AIRLOCK_REPLICA_MAX_RUNS")
            .map(|v| {
                num("AIRLOCK_REPLICA_MAX_RUNS", Some(v), 0.0, 1.0, 100_000.0)
                    .map(|n| usize::try_from(whole(n)).unwrap_or(usize::MAX))
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
            max_streams: usize::try_from(whole(num(
                "API_MAX_STREAMS",
                get("API_MAX_STREAMS"),
                64.0,
                1.0,
                100_000.0,
            )?))
            .unwrap_or(usize::MAX),
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
            webhook_max_attempts: whole(num(
                "WEBHOOK_MAX_ATTEMPTS",
                get("WEBHOOK_MAX_ATTEMPTS"),
                8.0,
                1.0,
                100.0,
            )?),
            webhook_retry_base: Duration::from_millis(u64::from(whole(num(
                "WEBHOOK_RETRY_BASE_MS",
                get("WEBHOOK_RETRY_BASE_MS"),
                1000.0,
                1.0,
                3_600_000.0,
            )?))),
            webhook_slots_per_org: usize::try_from(whole(num(
                "WEBHOOK_SLOTS_PER_ORG",
                get("WEBHOOK_SLOTS_PER_ORG"),
                4.0,
                1.0,
                16.0,
            )?))
            .unwrap_or(16),
            webhook_timeout: Duration::from_secs_f64(num(
                "WEBHOOK_TIMEOUT_SECONDS",
                get("WEBHOOK_TIMEOUT_SECONDS"),
                10.0,
                0.1,
                300.0,
            )?),
            shutdown_grace: Duration::from_secs_f64(num(
                "SHUTDOWN_GRACE_SECONDS",
                get("SHUTDOWN_GRACE_SECONDS"),
                30.0,
                0.0,
                86_400.0,
            )?),
            retention: airlock_store::Retention::from_lookup(get).map_err(setting)?,
            retention_sweep: Duration::from_secs_f64(num(
                "RETENTION_SWEEP_SECONDS",
                get("RETENTION_SWEEP_SECONDS"),
                airlock_store::DEFAULT_SWEEP_INTERVAL.as_secs_f64(),
                1.0,
                86_400.0,
            )?),
            quotas: airlock_store::OrgQuotas::from_lookup(get).map_err(setting)?,
            listener: {
                let d = listener_guard::Settings::API;
                listener_guard::Settings {
                    max_connections: usize::try_from(whole(num(
                        "API_MAX_CONNECTIONS",
                        get("API_MAX_CONNECTIONS"),
                        d.max_connections as f64,
                        1.0,
                        1_000_000.0,
                    )?))
                        .unwrap_or(usize::MAX),
                    max_connections_per_peer: usize::try_from(whole(num(
                        "API_MAX_CONNECTIONS_PER_ADDRESS",
                        get("API_MAX_CONNECTIONS_PER_ADDRESS"),
                        d.max_connections_per_peer as f64,
                        1.0,
                        1_000_000.0,
                    )?))
                        .unwrap_or(usize::MAX),
                    header_read_timeout: Duration::from_secs_f64(num(
                        "API_HEADER_READ_TIMEOUT_SECONDS",
                        get("API_HEADER_READ_TIMEOUT_SECONDS"),
                        d.header_read_timeout.as_secs_f64(),
                        0.1,
                        3600.0,
                    )?),
                    idle_timeout: Duration::from_secs_f64(num(
                        "API_IDLE_TIMEOUT_SECONDS",
                        get("API_IDLE_TIMEOUT_SECONDS"),
                        d.idle_timeout.as_secs_f64(),
                        0.1,
                        86_400.0,
                    )?),
                }
            },
            fail_point: get(failpoint::ENV_FAIL_POINT)
                .map(|v| {
                    failpoint::FailPoint::parse(v.trim()).ok_or_else(|| ConfigError {
                        var: failpoint::ENV_FAIL_POINT,
                        message: format!(
                            "{v:?} is not after-run-end or after-delivery-claim (a test-only setting)"
                        ),
                    })
                })
                .transpose()?,
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
    /// The store over a small pool of its own, for the replica's heartbeat,
    /// the leader lease and the sweep: they never queue behind requests.
    fleet_store: Store,
    /// What this replica knows of the store's availability.
    store_watch: outage::StoreWatch,
    /// Wakes the scheduler (a run was queued or ended).
    kick: Notify,
    /// Notified whenever one of this replica's runs is over (its end
    /// recorded): a drain waits on it.
    run_over: Notify,
    webhook_client: GuardedClient,
    /// Open event streams, per organization.
    streams: Arc<Mutex<HashMap<String, usize>>>,
    /// This replica's running runs: their cancel switches (set: the reason
    /// their end records).
    running: Mutex<HashMap<String, watch::Sender<Option<String>>>>,
    /// Held while a claim is made and its run entered in `running`, and
    /// while the two are compared with the store (a claim is never seen
    /// half made).
    claiming: tokio::sync::Mutex<()>,
    ready: AtomicBool,
    /// Draining: no new claim; `/readyz` 503.
    stopping: AtomicBool,
    /// The HTTP side is closing: open event streams end.
    closing: AtomicBool,
    /// Moves whenever a key is revoked through this replica: its open
    /// event streams check their key at once.
    revocations: std::sync::atomic::AtomicU64,
}

/// A fresh replica id (`rep_` and 12 hex digits).
pub fn new_replica_id() -> Result<String, airlock_vault::VaultError> {
    Ok(format!("rep_{}", airlock_vault::random_hex::<6>()?))
}

impl AppState {
    pub fn new(orch: Arc<Orchestrator>, auth: ApiAuth, cfg: ServeConfig) -> Result<Self, ApiError> {
        let replica = new_replica_id().map_err(ApiError::internal)?;
        Self::with_replica(orch, auth, cfg, replica)
    }

    /// As [`AppState::new`], under the replica id `replica` (named before
    /// the platform booted, in the first log line).
    pub fn with_replica(
        orch: Arc<Orchestrator>,
        auth: ApiAuth,
        cfg: ServeConfig,
        replica: String,
    ) -> Result<Self, ApiError> {
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
        // Each call waits at most a heartbeat's interval (at least a
        // second) for a connection: a heartbeat that cannot be made in
        // time counts as missed, and the next one tries afresh.
        let fleet_store = orch
            .store
            .apart(2, (cfg.replica_lease / 5).max(Duration::from_secs(1)));
        Ok(AppState {
            inner: Arc::new(Inner {
                limiter: ratelimit::Limiter::new(cfg.rate),
                auth_failures: ratelimit::Limiter::new(cfg.auth_failures),
                orch,
                auth,
                cfg,
                replica,
                fleet_store,
                store_watch: outage::StoreWatch::default(),
                kick: Notify::new(),
                run_over: Notify::new(),
                webhook_client,
                running: Mutex::default(),
                claiming: tokio::sync::Mutex::new(()),
                streams: Arc::default(),
                ready: AtomicBool::new(false),
                stopping: AtomicBool::new(false),
                closing: AtomicBool::new(false),
                revocations: Default::default(),
            }),
        })
    }

    /// The store over the fleet's own pool (heartbeat, lease, sweep).
    pub fn fleet_store(&self) -> &Store {
        &self.inner.fleet_store
    }
    pub fn store_watch(&self) -> &outage::StoreWatch {
        &self.inner.store_watch
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
    /// Wakes the webhook deliverer (the platform's
    /// [`Orchestrator::ends`](airlock_platform::orchestrator::Orchestrator::ends)
    /// wakes it too, whenever it stores a run's end).
    pub fn kick_deliveries(&self) {
        self.inner.orch.ends.notify_one();
    }
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::Acquire)
    }
    /// A key was revoked through this replica.
    pub fn key_revoked(&self) {
        self.inner.revocations.fetch_add(1, Ordering::AcqRel);
    }
    /// How many keys were revoked through this replica (a stream that sees
    /// it move checks its key).
    pub fn revocations(&self) -> u64 {
        self.inner.revocations.load(Ordering::Acquire)
    }
    /// Whether the HTTP side is closing (open event streams end).
    pub fn is_closing(&self) -> bool {
        self.inner.closing.load(Ordering::Acquire)
    }
    /// Stops this replica from claiming work (its running runs go on).
    pub fn stop_claiming(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.kick.notify_waiters();
    }
    /// Cancels every run of this replica, each ending with `reason`.
    pub fn cancel_all(&self, reason: &str) {
        if let Ok(r) = self.inner.running.lock() {
            for tx in r.values() {
                tx.send_if_modified(|v| {
                    let first = v.is_none();
                    if first {
                        *v = Some(reason.to_owned());
                    }
                    first
                });
            }
        }
    }
    /// Cancels one of this replica's runs, its end recording `reason`;
    /// `false` if it runs elsewhere (or not at all). A run already being
    /// cancelled keeps its first reason.
    pub fn cancel_local(&self, run_id: &str, reason: &str) -> bool {
        self.inner
            .running
            .lock()
            .ok()
            .and_then(|r| {
                r.get(run_id).map(|tx| {
                    tx.send_if_modified(|v| {
                        let first = v.is_none();
                        if first {
                            *v = Some(reason.to_owned());
                        }
                        first
                    });
                })
            })
            .is_some()
    }
    /// The ids of this replica's running runs.
    pub fn running_ids(&self) -> Vec<String> {
        self.inner
            .running
            .lock()
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default()
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

/// Reports how the boot goes while the platform is not up yet: what
/// `/readyz` answers meanwhile. Cheap to clone.
#[derive(Clone, Default)]
pub struct Booting {
    status: Arc<Mutex<String>>,
}

impl Booting {
    /// What the replica is waiting for, in a few words naming no database,
    /// host or file (an unauthenticated `/readyz` shows it).
    pub fn set(&self, status: impl Into<String>) {
        if let Ok(mut s) = self.status.lock() {
            *s = status.into();
        }
    }
    fn get(&self) -> String {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// What answers on the listener: the boot answers until the platform is up,
/// then the API's router.
#[derive(Clone)]
struct Gate {
    api: Arc<OnceLock<axum::Router>>,
    booting: Booting,
}

impl Gate {
    async fn answer(self, req: Request) -> Response {
        if let Some(api) = self.api.get() {
            return match api.clone().oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
        }
        let status = self.booting.get();
        match req.uri().path() {
            "/healthz" => axum::Json(airlock_api::v1::Health::ok()).into_response(),
            "/readyz" => {
                ApiError::unavailable(format!("this replica is starting: {status}")).into_response()
            }
            _ => ApiError::unavailable(format!(
                "this replica is starting ({status}); try again, or another replica"
            ))
            .into_response(),
        }
    }
}

/// How long the HTTP side may take to close once the replica has stopped
/// (open event streams are told to end; a client that holds on is cut).
const HTTP_CLOSE: Duration = Duration::from_secs(5);

/// Serves on `listener` from now: `/healthz` answers at once, `/readyz`
/// 503 with `boot`'s status until `boot` has built the platform, then the
/// API. The listener admits connections by `guard`'s rules (header-read
/// and idle timeouts, a connection cap shared fairly between client
/// addresses: [`listener_guard`]). Runs until the first signal on `signals` (a count of SIGTERM and
/// SIGINT received): then it drains (stops claiming, lets its running runs
/// end within `SHUTDOWN_GRACE_SECONDS`, a second signal cutting the grace
/// short, cancels the rest with "this replica shut down"; queued runs stay
/// queued for other replicas), and leaves the replica set. A signal during
/// the boot ends it at once.
pub async fn serve<F>(
    listener: tokio::net::TcpListener,
    guard: listener_guard::Settings,
    booting: Booting,
    boot: F,
    mut signals: watch::Receiver<u32>,
) -> Result<(), ServeError>
where
    F: std::future::Future<Output = Result<AppState, BootError>>,
{
    let gate = Gate {
        api: Arc::default(),
        booting,
    };
    let (close_tx, mut close_rx) = watch::channel(false);
    let outer = {
        let gate = gate.clone();
        axum::Router::new().fallback(move |req: Request| gate.clone().answer(req))
    };
    let mut http = tokio::spawn(async move {
        listener_guard::serve(
            listener,
            listener_guard::Guard::new(guard),
            outer,
            async move {
                let _ = close_rx.wait_for(|c| *c).await;
            },
        )
        .await;
        Ok::<(), std::io::Error>(())
    });
    let close_http = |http: tokio::task::JoinHandle<std::io::Result<()>>| async move {
        let _ = close_tx.send(true);
        let mut http = http;
        match tokio::time::timeout(HTTP_CLOSE, &mut http).await {
            Ok(Ok(r)) => r.map_err(ServeError::Io),
            Ok(Err(_)) => Ok(()),
            Err(_) => {
                http.abort();
                Ok(())
            }
        }
    };
    let seen = *signals.borrow_and_update();
    let app = tokio::select! {
        app = boot => match app {
            Ok(app) => app,
            Err(e) => {
                let _ = close_http(http).await;
                return Err(ServeError::Boot(e));
            }
        },
        _ = signals.wait_for(|n| *n > seen) => {
            tracing::warn!("stopped while starting");
            return close_http(http).await;
        }
        r = &mut http => {
            return match r {
                Ok(r) => r.map_err(ServeError::Io),
                Err(e) => Err(ServeError::Io(std::io::Error::other(e))),
            };
        }
    };
    let _ = gate.api.set(router(app.clone()));
    let work = tokio::select! {
        w = scheduler::start(app.clone()) => w,
        _ = signals.wait_for(|n| *n > seen) => return close_http(http).await,
    };
    app.inner.ready.store(true, Ordering::Release);
    tracing::info!(replica = app.replica(), "ready: taking work");
    let first = tokio::select! {
        n = signals.wait_for(|n| *n > seen) => n.map(|n| *n).unwrap_or(u32::MAX),
        r = &mut http => {
            // The listener failed: stop as on a signal, without a grace.
            tracing::error!("the API listener stopped: {r:?}");
            u32::MAX
        }
    };
    app.inner.ready.store(false, Ordering::Release);
    scheduler::drain(&app, &mut signals, first).await;
    app.inner.closing.store(true, Ordering::Release);
    let served = if http.is_finished() {
        Ok(())
    } else {
        close_http(http).await
    };
    work.finish(&app).await;
    served
}

/// Why the boot failed for good (a store that does not answer is waited
/// for; this is what no wait fixes: a bad setting, a damaged store …).
pub type BootError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Io(std::io::Error),
    #[error(transparent)]
    Store(#[from] airlock_store::StoreError),
    #[error(transparent)]
    Boot(BootError),
}

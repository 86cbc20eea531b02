//! The server's state, shared by the routes, the scheduler and the
//! webhook deliverer: the platform, the API keys, the limits, and what
//! this replica runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_egress::{ClientConfig, GuardedClient};
use airlock_platform::orchestrator::Orchestrator;
use airlock_store::Store;
use tokio::sync::{Notify, watch};

use crate::auth::ApiAuth;
use crate::config::ServeConfig;
use crate::error::ApiError;
use crate::{outage, ratelimit};

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
        let guard = orch
            .settings
            .platform_guard(&[cfg.listen])
            .map_err(|e| ApiError::internal(format!("AIRLOCK_DNS_SERVER: {e}")))?;
        let webhook_client = GuardedClient::with_dialer(
            guard,
            ClientConfig {
                total_timeout: cfg.webhook_timeout,
                connect_timeout: cfg.webhook_timeout,
                max_redirects: 0,
                max_response_bytes: 64 * 1024,
                ..Default::default()
            },
            orch.settings.via(),
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

    /// Held while a claim is made and its run entered as running here, and
    /// while the two are compared with the store.
    pub(crate) fn claiming(&self) -> &tokio::sync::Mutex<()> {
        &self.inner.claiming
    }
    /// Notified when the scheduler should look at the queue again.
    pub(crate) fn scheduler_kicked(&self) -> &Notify {
        &self.inner.kick
    }
    /// Enters a run as running here, with its cancel switch.
    pub(crate) fn enter_running(&self, run_id: &str, cancel: watch::Sender<Option<String>>) {
        if let Ok(mut r) = self.inner.running.lock() {
            r.insert(run_id.to_owned(), cancel);
        }
    }
    /// A run of this replica is over (its end recorded): it leaves the
    /// running runs, and a drain waiting on [`AppState::run_over`] looks again.
    pub(crate) fn leave_running(&self, run_id: &str) {
        if let Ok(mut r) = self.inner.running.lock() {
            r.remove(run_id);
        }
        self.inner.run_over.notify_waiters();
    }
    /// Notified whenever one of this replica's runs is over.
    pub(crate) fn run_over(&self) -> &Notify {
        &self.inner.run_over
    }
    pub(crate) fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Release);
    }
    /// The HTTP side is closing: open event streams end.
    pub(crate) fn set_closing(&self) {
        self.inner.closing.store(true, Ordering::Release);
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

//! Run networks made ahead (`DOCKER_NETWORK_POOL`): a cold run's start
//! takes an empty internal network the backend created before the run,
//! instead of creating its own first (the daemon's network creation is
//! the longest step of a cold start that `docker run --network none`
//! does not have).
//!
//! A prepared network is made exactly as a run's own
//! ([`super::create_run_network`]: internal, no IPv4 address on the
//! host's side), named `airlock-exec-net_<id>` and labelled with that id
//! (labels cannot change once a network exists), the owner's label and
//! [`super::pool::LABEL_POOL`]. It holds nothing of any run until one
//! takes it: no container is on it before the run's, and it serves that
//! one run only (removed with the run's containers, never given back). A
//! network is idle here only once the daemon has created it; the one a
//! run took is replaced once that run's first container has started, so
//! the daemon's work for the next one is off the run's start.
//!
//! Idle networks go when the platform stops ([`DockerBackend::drain_networks`]);
//! a killed platform's go at the next boot's reclaim (their owner label).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::{DockerBackend, RunNet};
use crate::SandboxError;

/// The prefix of a prepared network's id (its name is
/// `airlock-exec-net_<12 hex digits>`).
pub const NET_PREFIX: &str = "net_";
/// The largest `DOCKER_NETWORK_POOL`.
pub const MAX_NETWORK_POOL: usize = 16;

/// The backend's prepared networks.
#[derive(Default)]
pub(crate) struct NetShelf {
    state: Mutex<NetState>,
    /// Told whenever a network's creation is over (either way).
    settled: tokio::sync::Notify,
}

#[derive(Default)]
struct NetState {
    /// Created, empty, oldest first.
    idle: VecDeque<Arc<RunNet>>,
    /// Being created.
    making: usize,
    /// The platform stops: nothing more is made or taken.
    closing: bool,
}

impl NetShelf {
    fn lock(&self) -> std::sync::MutexGuard<'_, NetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle network, out of the shelf.
    pub(crate) fn take(&self) -> Option<Arc<RunNet>> {
        let mut st = self.lock();
        if st.closing {
            return None;
        }
        st.idle.pop_front()
    }

    /// How many to make now to hold `size`; counted as being made.
    fn to_make(&self, size: usize) -> usize {
        let mut st = self.lock();
        if st.closing {
            return 0;
        }
        let need = size.saturating_sub(st.idle.len() + st.making);
        st.making += need;
        need
    }

    /// A network whose creation is over: idle (`Some`), or not made.
    /// Returns it when the shelf is closing (its caller removes it).
    fn settle(&self, net: Option<Arc<RunNet>>) -> Option<Arc<RunNet>> {
        let left = {
            let mut st = self.lock();
            st.making = st.making.saturating_sub(1);
            match net {
                Some(n) if !st.closing => {
                    st.idle.push_back(n);
                    None
                }
                other => other,
            }
        };
        self.settled.notify_waiters();
        left
    }

    /// (idle, being made).
    pub(crate) fn counts(&self) -> (usize, usize) {
        let st = self.lock();
        (st.idle.len(), st.making)
    }
}

/// A fresh prepared network id (`net_` and 12 hex digits).
fn net_id() -> String {
    use sha2::Digest;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let h = sha2::Sha256::digest(format!("net:{}:{t}:{n}", std::process::id()));
    format!("{NET_PREFIX}{}", hex::encode(&h[..6]))
}

/// What makes prepared networks, apart from the backend (a run's start
/// task refills the shelf with it).
#[derive(Clone)]
pub(crate) struct NetMaker {
    shelf: Arc<NetShelf>,
    /// `DOCKER_NETWORK_POOL`.
    size: usize,
    host: String,
    daemon: super::Daemon,
    owner: String,
}

impl NetMaker {
    /// Starts making the networks the shelf lacks, in the background of
    /// the current runtime.
    pub(crate) fn refill(&self) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for _ in 0..self.shelf.to_make(self.size) {
            handle.spawn(self.clone().make());
        }
    }

    /// Makes one network and shelves it (counted as being made by the
    /// caller); the daemon's refusal is returned.
    async fn make(self) -> Result<(), SandboxError> {
        let id = net_id();
        let net = Arc::new(RunNet::new(super::network_name(&id)));
        let labels = HashMap::from([
            (super::LABEL_MANAGED.into(), "true".into()),
            (super::LABEL_RUN.into(), id.clone()),
            (super::LABEL_ROLE.into(), "network".into()),
            (super::LABEL_OWNER.into(), self.owner.clone()),
            (super::pool::LABEL_POOL.into(), "true".into()),
        ]);
        let d = match super::client_of(&self.daemon, &self.host).await {
            Ok(d) => d,
            Err(e) => {
                self.shelf.settle(None);
                return Err(e.into());
            }
        };
        match super::create_run_network(&d, &net.name, labels).await {
            Ok(()) => {
                let _ = net.created.set(Ok(()));
                if let Some(left) = self.shelf.settle(Some(net)) {
                    super::remove_network(&d, &left.name).await;
                }
                Ok(())
            }
            Err(e) => {
                tracing::warn!("a network made ahead for the runs: {e}");
                self.shelf.settle(None);
                Err(e.into())
            }
        }
    }
}

impl DockerBackend {
    pub(crate) fn net_maker(&self) -> NetMaker {
        NetMaker {
            shelf: self.nets_shelf.clone(),
            size: self.cfg.network_pool,
            host: self.cfg.host.clone(),
            daemon: self.docker.clone(),
            owner: self.owner.clone(),
        }
    }

    /// Makes the networks the shelf lacks and waits until it holds
    /// `DOCKER_NETWORK_POOL` of them (or none is being made any more);
    /// the first refusal to make one is returned.
    pub async fn fill_networks(&self) -> Result<(), SandboxError> {
        let size = self.cfg.network_pool;
        let maker = self.net_maker();
        let mine: Vec<_> = (0..self.nets_shelf.to_make(size))
            .map(|_| maker.clone().make())
            .collect();
        let made = futures_util::future::join_all(mine).await;
        if let Some(Err(e)) = made.into_iter().find(Result::is_err) {
            return Err(e);
        }
        loop {
            let settled = self.nets_shelf.settled.notified();
            let (idle, making) = self.nets_shelf.counts();
            if idle >= size || making == 0 {
                return Ok(());
            }
            settled.await;
        }
    }

    /// The prepared networks, idle and being made.
    pub fn network_pool_status(&self) -> (usize, usize) {
        self.nets_shelf.counts()
    }

    /// Removes every idle network now (the platform stops), with a client
    /// of its own: the caller's runtime may be about to end. One still
    /// being made is removed by its maker.
    pub(crate) fn drain_networks(&self) {
        let idle: Vec<String> = {
            let mut st = self.nets_shelf.lock();
            st.closing = true;
            st.idle.drain(..).map(|n| n.name.clone()).collect()
        };
        if idle.is_empty() {
            return;
        }
        let host = self.cfg.host.clone();
        super::block_on(async move {
            let Ok(d) = super::connect(&host).await else {
                return;
            };
            futures_util::future::join_all(idle.iter().map(|n| super::remove_network(&d, n))).await;
        });
    }
}

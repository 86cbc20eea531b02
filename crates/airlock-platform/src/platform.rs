//! A platform put together: its store, keys and backend, the boot reclaim
//! of what a platform that is gone left, the internal API on this
//! process's socket, and the backend's boot. `airlock run`, `airlock serve`
//! and `airlock demo` each start one ([`Platform::start`]) and stop it
//! ([`Platform::stop`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use airlock_sandbox::{Backend, SandboxError};
use airlock_store::{Retention, Store, StoreError};
use airlock_vault::{Keyring, RunTokens, SigningKeyring};
use tokio::sync::Notify;

use crate::identity::Issuer;
use crate::internal_api::InternalApi;
use crate::orchestrator::{EPHEMERAL_KID, Orchestrator, own_platform_socket, reclaim};
use crate::settings::{Settings, SettingsError};

/// Why a platform did not start: one variant per step.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error(transparent)]
    Retention(#[from] airlock_store::SettingError),
    /// `AIRLOCK_HOME` (or `HOME`) names no usable directory.
    #[error(transparent)]
    Home(StoreError),
    #[error("creating {}", path.display())]
    CreateHome {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("opening the store")]
    StoreTask(#[source] tokio::task::JoinError),
    #[error(transparent)]
    OpenStore(StoreError),
    #[error(transparent)]
    Backend(SandboxError),
    /// `CONNECTION_ENCRYPTION_KEY` is set, and wrong.
    #[error("CONNECTION_ENCRYPTION_KEY")]
    Keyring(#[source] airlock_vault::KeyError),
    /// The throwaway key of a platform without `CONNECTION_ENCRYPTION_KEY`.
    #[error(transparent)]
    EphemeralKey(airlock_vault::KeyError),
    #[error(transparent)]
    Random(#[from] airlock_vault::VaultError),
    /// The key is not the one the store's envelopes were written with.
    #[error(transparent)]
    KeyCheck(StoreError),
    #[error(transparent)]
    RunTokens(#[from] airlock_vault::SigningError),
    #[error("locating the airlock binary")]
    Exe(#[source] std::io::Error),
    #[error(transparent)]
    Reclaim(StoreError),
    #[error(transparent)]
    SocketsDir(std::io::Error),
    #[error("binding {}", path.display())]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    BackendBoot(SandboxError),
    /// Boxed: an egress error is large, and a boot error is returned
    /// through every step of the boot.
    #[error(transparent)]
    Traces(Box<crate::traces::TracesError>),
}

impl From<crate::traces::TracesError> for BootError {
    fn from(e: crate::traces::TracesError) -> Self {
        BootError::Traces(Box::new(e))
    }
}

/// A started platform: its orchestrator, and the internal API serving
/// sidecars on [`Orchestrator::api_socket`].
pub struct Platform {
    pub orch: Orchestrator,
    api_server: tokio::task::JoinHandle<()>,
    /// The live model catalog's background reads, when configured.
    catalog: Option<tokio::task::JoinHandle<()>>,
}

/// What a platform is started from.
pub struct Parts {
    pub home: PathBuf,
    pub store: Store,
    pub keyring: Arc<Keyring>,
    pub tokens: RunTokens,
    pub settings: Settings,
    pub backend: Box<dyn Backend>,
    /// The build fingerprint an `airlock-sidecar` beside the binary must
    /// answer to be run instead of `airlock sidecar`.
    pub sidecar_build: &'static str,
    /// The workload identity issuer (`airlock serve`'s): without one, a run
    /// whose integration names `${airlock.identity}` is refused before it starts.
    pub issuer: Option<Arc<Issuer>>,
}

impl Platform {
    /// The embedded platform of one `airlock` process, configured from the
    /// environment, on the backend `backend` names (default: `RUN_ADAPTER`).
    pub async fn from_env(
        backend: Option<&str>,
        sidecar_build: &'static str,
    ) -> Result<Platform, BootError> {
        let settings = Settings::from_env()?;
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let retention = Retention::from_lookup(env)?;
        let home = airlock_store::airlock_home().map_err(BootError::Home)?;
        std::fs::create_dir_all(&home).map_err(|source| BootError::CreateHome {
            path: home.clone(),
            source,
        })?;
        // The store opens (on its own threads) while the backend is checked
        // and gets ready for the run (the namespace backend starts its init).
        let store = tokio::spawn(Store::open_default());
        let backend = select_backend(backend, &settings);
        let store = store
            .await
            .map_err(BootError::StoreTask)?
            .map_err(BootError::OpenStore)?;
        let backend = backend?;
        // One run: nothing is started ahead for runs to come (a warm pool
        // would start pairs no run of this process takes).
        backend.drop_prepared();
        tracing::debug!(target: "airlock::phase", "store opened");
        sweep_local_store(&home, &store, retention);
        Platform::on_store(home, store, settings, backend, sidecar_build, None).await
    }

    /// The platform on a store already open, with its backend already
    /// chosen, its keys from the environment (`airlock serve` waits for its
    /// store before this), issuing workload identity as `issuer` if given.
    pub async fn on_store(
        home: PathBuf,
        store: Store,
        settings: Settings,
        backend: Box<dyn Backend>,
        sidecar_build: &'static str,
        issuer: Option<Arc<Issuer>>,
    ) -> Result<Platform, BootError> {
        let keyring = keyring_from_env()?;
        // A key that is not the one the store's envelopes were written with is
        // refused here, not found out by a sidecar mid-run.
        store
            .check_keyring(&keyring)
            .await
            .map_err(BootError::KeyCheck)?;
        tracing::debug!(target: "airlock::phase", "keyring checked");
        let tokens = match std::env::var("RUN_TOKEN_SECRET")
            .ok()
            .filter(|v| !v.is_empty())
        {
            Some(_) => RunTokens::new(SigningKeyring::from_env("RUN_TOKEN_SECRET")?),
            None => ephemeral_tokens()?,
        };
        Platform::start(Parts {
            home,
            store,
            keyring: Arc::new(keyring),
            tokens,
            settings,
            backend,
            sidecar_build,
            issuer,
        })
        .await
    }

    /// Starts a platform from its parts: the boot reclaim, the internal API
    /// on this process's socket, the backend's boot.
    pub async fn start(p: Parts) -> Result<Platform, BootError> {
        let exe = std::env::current_exe().map_err(BootError::Exe)?;
        // Asked beside the reclaim and the backend's boot (it starts a process).
        let sidecar_exe = {
            let (exe, build) = (exe.clone(), p.sidecar_build);
            std::thread::spawn(move || airlock_sandbox::own_sidecar_binary(&exe, build))
        };
        let ends = Arc::new(Notify::new());
        let reclaimed = reclaim(&p.home, &p.store, &ends)
            .await
            .map_err(BootError::Reclaim)?;
        tracing::debug!(target: "airlock::phase", "reclaimed");
        if !reclaimed.is_empty() {
            crate::operator::say(format_args!(
                "airlock: reclaimed {} leftover run(s) of a previous platform: {}",
                reclaimed.len(),
                reclaimed.join(", ")
            ));
        }
        let traces = crate::traces::Traces::from_env(&p.settings).await?;
        let (api, api_socket, api_server) = serve_internal_api(&p)?;
        p.backend
            .boot(&|s| crate::operator::say(format_args!("airlock: {s}")))
            .map_err(BootError::BackendBoot)?;
        tracing::debug!(target: "airlock::phase", "backend booted");
        let sidecar_exe = sidecar_exe.join().unwrap_or(None);
        // Read in the background: boot never waits on it.
        let models = Arc::new(crate::models::ModelRegistry::new());
        let catalog = crate::catalog::start(&p.settings, &models);
        Ok(Platform {
            orch: Orchestrator {
                home: p.home,
                store: p.store,
                api,
                api_socket,
                tokens: p.tokens,
                settings: p.settings,
                backend: p.backend,
                exe,
                sidecar_exe,
                ends,
                models,
                metrics: Arc::default(),
                traces,
                removals: Default::default(),
            },
            api_server,
            catalog,
        })
    }

    /// The orchestrator alone: the internal API serves it until the process
    /// ends (`airlock serve` removes the socket at its stop).
    pub fn into_orchestrator(self) -> Orchestrator {
        self.orch
    }

    /// Exports the traces still pending ([`Orchestrator::finish_traces`]).
    pub async fn finish_traces(&self) {
        self.orch.finish_traces().await;
    }

    /// Waits for the removals of its runs' sandboxes still going
    /// ([`Orchestrator::finish_removals`]).
    pub async fn finish_removals(&self) {
        self.orch.finish_removals().await;
    }

    /// Stops serving the internal API and removes its socket; what the
    /// backend prepared ahead for runs to come goes too.
    pub fn stop(&self) {
        self.orch.backend.drop_prepared();
        self.api_server.abort();
        if let Some(c) = &self.catalog {
            c.abort();
        }
        let _ = std::fs::remove_file(&self.orch.api_socket);
    }
}

/// The internal API on this process's socket in `home/sockets`.
fn serve_internal_api(
    p: &Parts,
) -> Result<(InternalApi, PathBuf, tokio::task::JoinHandle<()>), BootError> {
    std::fs::create_dir_all(p.home.join("sockets")).map_err(BootError::SocketsDir)?;
    let api_socket = own_platform_socket(&p.home);
    let _ = std::fs::remove_file(&api_socket);
    let listener =
        tokio::net::UnixListener::bind(&api_socket).map_err(|source| BootError::Bind {
            path: api_socket.clone(),
            source,
        })?;
    let api = InternalApi::new(
        p.store.clone(),
        p.keyring.clone(),
        p.tokens.clone(),
        p.settings.artifacts,
        p.issuer.clone(),
    );
    let server = tokio::spawn(api.clone().serve_forever(listener));
    tracing::debug!(target: "airlock::phase", "internal API listening");
    Ok((api, api_socket, server))
}

/// The connection keyring `CONNECTION_ENCRYPTION_KEY` names; when it is
/// not set, a throwaway one ([`EPHEMERAL_KID`]): no stored connection can
/// be decrypted, runs that need none still work, and a run that needs one
/// is refused before it starts, saying so.
fn keyring_from_env() -> Result<Keyring, BootError> {
    if std::env::var_os("CONNECTION_ENCRYPTION_KEY").is_some_and(|v| !v.is_empty()) {
        // Set: it must be right (a typo never falls back to another key).
        return Keyring::from_env().map_err(BootError::Keyring);
    }
    Keyring::new(EPHEMERAL_KID, &airlock_vault::random_bytes::<32>()?)
        .map_err(BootError::EphemeralKey)
}

/// The backend `backend` names (default: the settings' `RUN_ADAPTER`),
/// checked, and getting ready for a run ([`Backend::prepare`]).
pub fn select_backend(
    backend: Option<&str>,
    settings: &Settings,
) -> Result<Box<dyn Backend>, BootError> {
    let adapter = backend.unwrap_or(&settings.run_adapter);
    let backend = airlock_sandbox::select(adapter).map_err(BootError::Backend)?;
    backend.prepare();
    tracing::debug!(target: "airlock::phase", "backend checked");
    Ok(backend)
}

/// Run tokens for an embedded platform that verifies only what it issued itself.
pub fn ephemeral_tokens() -> Result<RunTokens, BootError> {
    Ok(RunTokens::new(SigningKeyring::parse(
        "RUN_TOKEN_SECRET",
        &airlock_vault::random_hex::<32>()?,
    )?))
}

/// How often a local store is swept.
const LOCAL_SWEEP_EVERY: Duration = Duration::from_secs(86_400);

/// A local store is swept by the process that uses it, at most once a day
/// (`retention-swept` in the home records when), in the background: each
/// batch is its own transaction, so a process that exits mid-sweep loses
/// only the sweep's progress.
fn sweep_local_store(home: &Path, store: &Store, retention: Retention) {
    let marker = home.join("retention-swept");
    let fresh = std::fs::metadata(&marker)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t.elapsed().is_ok_and(|e| e < LOCAL_SWEEP_EVERY));
    if fresh {
        return;
    }
    let store = store.clone();
    tokio::spawn(async move {
        match store
            .sweep_retention(&retention, airlock_store::now_ms())
            .await
        {
            Ok(r) => {
                if !r.is_empty() {
                    tracing::info!(
                        runs = r.runs,
                        egress = r.egress,
                        results = r.results,
                        spend = r.spend,
                        crossings = r.crossings,
                        freed_pages = r.freed_pages,
                        "retention sweep of the local store"
                    );
                }
                if let Err(e) = std::fs::write(&marker, b"") {
                    tracing::debug!("{}: {e}", marker.display());
                }
            }
            Err(e) => tracing::warn!("retention sweep of the local store: {}", e.chain()),
        }
    });
}

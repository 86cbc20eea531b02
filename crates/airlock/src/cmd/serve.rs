//! `airlock serve`: the platform as a long-lived API server
//! ([`airlock_server`]), on the store `DATABASE_URL` names (SQLite under
//! `AIRLOCK_HOME` by default). Several may share one PostgreSQL.
//!
//! Every setting is checked before anything starts (a bad one exits with
//! status 2's message). Then the listener answers at once: `/healthz` 200,
//! `/readyz` 503 with the cause while the store is waited for (retried with
//! backoff, each failure logged with its cause: refused, authentication,
//! name resolution …), the API once the platform is up. SIGTERM or Ctrl-C
//! drains (docs/serve.md); a second one cuts the grace short.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use airlock_server::{ApiAuth, AppState, Booting, ServeConfig};
use airlock_store::Store;
use anyhow::{Context as _, Result, bail};
use clap::Args;

#[derive(Args)]
pub struct ServeArgs {
    /// Address and port to listen on (default: AIRLOCK_LISTEN, else 127.0.0.1:8420).
    #[arg(long)]
    pub listen: Option<String>,
    /// process | namespace | docker | auto (default: RUN_ADAPTER, else auto).
    #[arg(long)]
    pub backend: Option<String>,
}

/// The longest wait between two attempts to reach the store at boot.
const STORE_RETRY_MAX: Duration = Duration::from_secs(30);

pub fn run(args: ServeArgs) -> ExitCode {
    crate::logging::init();
    let rt = match super::multi_thread_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", super::out::error_line(&e));
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    // Everything the server needs is checked before anything starts.
    let auth = ApiAuth::from_env().context(
        "airlock serve authenticates API keys with API_AUTH_SECRET (at least 16 characters; comma-separated to rotate), independent of every other secret",
    )?;
    if std::env::var_os("CONNECTION_ENCRYPTION_KEY").is_none_or(|v| v.is_empty()) {
        bail!(
            "airlock serve stores its tenants' connections and webhook secrets encrypted: set CONNECTION_ENCRYPTION_KEY (base64 of 32 bytes)"
        );
    }
    let mut cfg = ServeConfig::from_env(args.listen.as_deref())?;
    let settings =
        airlock_platform::settings::Settings::from_env().map_err(|e| anyhow::anyhow!("{e}"))?;
    let home = airlock_store::airlock_home()?;
    std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
    let store_name = airlock_store::default_store_name()?;
    let backend = airlock_platform::platform::select_backend(args.backend.as_deref(), &settings)?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("listening on {}", cfg.listen))?;
    // The address bound (a port 0 becomes the real one): what the webhook
    // guard refuses as this server itself.
    cfg.listen = listener.local_addr()?;
    // `/metrics` on its own listener, bound now so a bad address stops the
    // boot; it answers once the platform is up.
    let metrics = match cfg.metrics.clone() {
        Some(m) => {
            let l = tokio::net::TcpListener::bind(m.listen)
                .await
                .with_context(|| format!("METRICS_LISTEN: listening on {}", m.listen))?;
            eprintln!(
                "airlock serve: metrics on http://{}/metrics",
                l.local_addr()?
            );
            Some((l, m.token))
        }
        None => None,
    };
    // The previews' own origin, bound now as the metrics' listener is.
    let usercontent = match cfg.console.usercontent.clone() {
        Some(u) => {
            let l = tokio::net::TcpListener::bind(u.listen)
                .await
                .with_context(|| format!("USERCONTENT_LISTEN: listening on {}", u.listen))?;
            eprintln!(
                "airlock serve: previews on http://{} ({})",
                l.local_addr()?,
                u.origin
            );
            Some(l)
        }
        None => None,
    };
    let replica = airlock_server::new_replica_id()?;
    eprintln!(
        "airlock serve: listening on http://{} (replica {replica}, {} backend, store {store_name})",
        cfg.listen,
        backend.name(),
    );
    let guard = cfg.listener;
    let issuer = Arc::new(airlock_platform::identity::Issuer::new(
        &cfg.identity.issuer_url(cfg.listen),
        cfg.identity.keys.clone(),
        cfg.identity.lifetime,
    ));
    let home_of_socket = home.clone();
    let booting = Booting::default();
    booting.set("reaching the store");
    let boot = {
        let booting = booting.clone();
        async move {
            let store = open_store(&booting).await?;
            booting.set("booting the platform");
            let platform = airlock_platform::Platform::on_store(
                home,
                store,
                settings,
                backend,
                airlock_sidecar::BUILD,
                Some(issuer),
            )
            .await?;
            // The internal API serves as long as the process lives; its
            // socket is removed below.
            let orch = Arc::new(platform.into_orchestrator());
            if let Some((listener, token)) = metrics {
                tokio::spawn(airlock_server::metrics::serve(
                    listener,
                    orch.clone(),
                    token,
                ));
            }
            let app = AppState::with_replica(orch, auth, cfg, replica)?;
            if let Some(listener) = usercontent {
                tokio::spawn(airlock_server::console::preview::serve(
                    listener,
                    app.clone(),
                ));
            }
            eprintln!("airlock serve: ready");
            Ok(app)
        }
    };
    let own_socket = airlock_platform::orchestrator::own_platform_socket(&home_of_socket);
    let served = airlock_server::serve(listener, guard, booting, boot, signals()).await;
    // Its own internal-API socket goes with it (a crash's is reclaimed by
    // the next boot on this home).
    let _ = std::fs::remove_file(&own_socket);
    served?;
    eprintln!("airlock serve: stopped");
    Ok(())
}

/// Opens the store, waiting for it while it does not answer: each failure
/// is logged with its cause, `/readyz` says it, and the next attempt comes
/// after a backoff (0.5 s, doubling, at most [`STORE_RETRY_MAX`]). What no
/// wait fixes (a bad URL, a damaged or newer store) ends the boot.
async fn open_store(booting: &Booting) -> Result<Store, airlock_server::BootError> {
    let mut wait = Duration::from_millis(500);
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        match Store::open_default().await {
            Ok(s) => {
                if attempt > 1 {
                    tracing::warn!("the store answers (attempt {attempt})");
                }
                return Ok(s);
            }
            Err(e) if e.is_transient() => {
                booting.set(format!(
                    "waiting for the store: {} (attempt {attempt}; next in {:.1} s)",
                    airlock_server::outage::public_cause(&e),
                    wait.as_secs_f64()
                ));
                tracing::warn!(
                    "the store does not answer: {}; trying again in {:.1} s (attempt {attempt}); /readyz answers 503 meanwhile",
                    e.chain(),
                    wait.as_secs_f64()
                );
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(STORE_RETRY_MAX);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The count of SIGTERM and SIGINT received: the first drains, a second
/// cuts the drain's grace short.
fn signals() -> tokio::sync::watch::Receiver<u32> {
    let (tx, rx) = tokio::sync::watch::channel(0u32);
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!("SIGTERM cannot be caught: {e}");
                    None
                }
            };
        loop {
            let term_recv = async {
                match term.as_mut() {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = term_recv => {}
            }
            let n = *tx.borrow() + 1;
            if n == 1 {
                eprintln!(
                    "airlock serve: stopping: no new run is claimed here; running runs may end within SHUTDOWN_GRACE_SECONDS, then are cancelled (a second signal cuts the grace short)…"
                );
            } else {
                eprintln!("airlock serve: stopping now: the grace is cut short…");
            }
            if tx.send(n).is_err() {
                return;
            }
        }
    });
    rx
}

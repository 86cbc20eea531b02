//! `airlock serve`: the platform as a long-lived API server
//! ([`airlock_server`]), on the store `DATABASE_URL` names (SQLite under
//! `AIRLOCK_HOME` by default). Several may share one PostgreSQL.

use std::process::ExitCode;
use std::sync::Arc;

use airlock_server::{ApiAuth, AppState, ServeConfig};
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
            eprintln!("error: {e:#}");
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
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("listening on {}", cfg.listen))?;
    // The address bound (a port 0 becomes the real one): what the webhook
    // guard refuses as this server itself.
    cfg.listen = listener.local_addr()?;
    let (orch, _internal_api) = super::run::platform(args.backend.as_deref()).await?;
    let store = orch.store.display_name().to_owned();
    let backend = orch.backend.name();
    let app =
        AppState::new(Arc::new(orch), auth, cfg.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!(
        "airlock serve: listening on http://{} (replica {}, {backend} backend, store {store})",
        listener.local_addr()?,
        app.replica()
    );
    airlock_server::serve(app, listener, shutdown_signal()).await?;
    eprintln!("airlock serve: stopped");
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    eprintln!("airlock serve: stopping (its runs are cancelled)…");
}

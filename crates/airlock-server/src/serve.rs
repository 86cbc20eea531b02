//! The listener: it answers from the first moment (`/healthz` at once,
//! `/readyz` 503 with the cause while the platform boots, the API once it
//! has), and on the first signal the replica drains.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use airlock_platform_api::listener_guard;
use axum::extract::Request;
use axum::response::{IntoResponse as _, Response};
use tokio::sync::watch;
use tower::ServiceExt as _;

use crate::error::ApiError;
use crate::state::AppState;
use crate::{openapi, scheduler};

/// The whole router: `/healthz`, `/readyz`, `/v1/openapi.json` and the `/v1` API.
pub fn router(app: AppState) -> axum::Router {
    openapi::router(app)
}

/// Serves `router` on a listener of the operator's own beside the API's
/// (`/metrics`, the previews' origin), under the API's connection caps and
/// timeouts, until the process ends.
pub async fn serve_apart(listener: tokio::net::TcpListener, router: axum::Router) {
    listener_guard::serve(
        listener,
        listener_guard::Guard::new(listener_guard::Settings::API),
        router,
        std::future::pending(),
    )
    .await;
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
    app.set_ready(true);
    tracing::info!(replica = app.replica(), "ready: taking work");
    let first = tokio::select! {
        n = signals.wait_for(|n| *n > seen) => n.map(|n| *n).unwrap_or(u32::MAX),
        r = &mut http => {
            // The listener failed: stop as on a signal, without a grace.
            tracing::error!("the API listener stopped: {r:?}");
            u32::MAX
        }
    };
    app.set_ready(false);
    scheduler::drain(&app, &mut signals, first).await;
    // Idle warm sandboxes go with the replica (a killed one leaves them to
    // the next boot's reclaim).
    app.orch().backend.drop_prepared();
    // So do the sandboxes of its ended runs still being removed.
    app.orch().finish_removals().await;
    app.set_closing();
    let served = if http.is_finished() {
        Ok(())
    } else {
        close_http(http).await
    };
    work.finish(&app).await;
    app.orch().finish_traces().await;
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

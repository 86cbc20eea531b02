//! `/metrics`: the platform's metrics ([`airlock_platform::metrics`]) in
//! Prometheus's text format, on a listener of its own (`METRICS_LISTEN`),
//! never on the tenants' API listener.
//!
//! Who may read them is decided here: whoever reaches `METRICS_LISTEN`
//! (meant for loopback or the operator's internal network), and, when
//! `METRICS_TOKEN` is set, only with `Authorization: Bearer <token>`
//! (compared in constant time, its length included). With `METRICS_LISTEN` unset there is no
//! `/metrics` at all. No organization's API key opens it.

use std::net::SocketAddr;
use std::sync::Arc;

use airlock_platform::orchestrator::Orchestrator;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use secrecy::{ExposeSecret as _, SecretString};

/// The content type of the text [`airlock_platform::metrics::Metrics::encode`] writes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Where `/metrics` is served and who may read it (`METRICS_LISTEN`,
/// `METRICS_TOKEN`).
#[derive(Debug, Clone)]
pub struct MetricsAccess {
    pub listen: SocketAddr,
    pub token: Option<SecretString>,
}

#[derive(Clone)]
struct Served {
    orch: Arc<Orchestrator>,
    token: Option<Arc<SecretString>>,
}

/// Serves `/metrics` of `orch` on `listener` until the process ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    orch: Arc<Orchestrator>,
    token: Option<SecretString>,
) {
    let served = Served {
        orch,
        token: token.map(Arc::new),
    };
    let router = axum::Router::new()
        .route("/metrics", axum::routing::get(answer))
        .with_state(served);
    crate::serve::serve_apart(listener, router).await;
}

async fn answer(State(s): State<Served>, headers: HeaderMap) -> Response {
    if let Some(token) = &s.token {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !airlock_vault::ct_eq_secret(given.as_bytes(), token.expose_secret().as_bytes()) {
            return (StatusCode::UNAUTHORIZED, "unauthorized\n").into_response();
        }
    }
    let metrics = &s.orch.metrics;
    match s.orch.store.queue_depth().await {
        Ok(depth) => metrics.set_queue_depth(depth),
        Err(e) => tracing::warn!("metrics: the queue's depth cannot be read: {e}"),
    }
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], metrics.encode()).into_response()
}

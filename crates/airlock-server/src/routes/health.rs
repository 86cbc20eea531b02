//! `/healthz`: the process is alive (200 as long as it answers at all,
//! also while it starts or drains). `/readyz`: 200 when the store answers
//! and this replica takes work; 503 while it starts (the store not reached
//! yet, with the cause), while the store does not answer (with the cause,
//! naming no database), and while it drains on SIGTERM.

use std::time::Duration;

use airlock_api::v1;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

/// How long `/readyz` waits for the store.
const STORE_CHECK: Duration = Duration::from_secs(2);

/// The process answers.
///
/// 200 as long as it answers at all, also while it starts or drains.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "health",
    responses((status = 200, description = "the process answers", body = v1::Health)),
)]
pub async fn healthz() -> axum::Json<v1::Health> {
    axum::Json(v1::Health::ok())
}

/// The store answers and this replica takes work (503 otherwise).
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "health",
    responses(
        (status = 200, description = "ready: the store answers and this replica takes work", body = v1::Ready),
        (status = 503, description = "unavailable: the replica starts or stops, or the store does not answer (the cause, naming no database)", body = v1::Error),
    ),
)]
pub async fn readyz(State(app): State<AppState>) -> Response {
    if app.is_stopping() {
        return ApiError::unavailable(format!(
            "this replica is stopping: it takes no new run ({} still running)",
            app.running_count()
        ))
        .into_response();
    }
    if !app.is_ready() {
        return ApiError::unavailable("this replica is starting").into_response();
    }
    let answered = tokio::time::timeout(STORE_CHECK, app.store().schema_version()).await;
    let failed = match answered {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(airlock_store::StoreError::Unavailable {
            database: app.store().display_name().to_owned(),
            detail: format!("no answer within {} s", STORE_CHECK.as_secs()),
            source: None,
        }),
    };
    let Some(e) = failed else {
        return (
            StatusCode::OK,
            axum::Json(v1::Ready {
                backend: app.orch().backend.name().to_owned(),
                replica: app.replica().to_owned(),
                running: app.running_count(),
                status: "ready".to_owned(),
            }),
        )
            .into_response();
    };
    // The pool says only that it timed out: a fresh connection says why.
    let e = match &e {
        airlock_store::StoreError::Unavailable { .. } => {
            app.store().probe(STORE_CHECK).await.err().unwrap_or(e)
        }
        _ => e,
    };
    app.store_watch().failed("readyz", &e);
    ApiError::unavailable(crate::outage::public_cause(&e)).into_response()
}

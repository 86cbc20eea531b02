//! `/console/data`: the `/v1` handlers the pages' scripts read (the runs
//! list, a run, its logs and events live over SSE, its egress, cost and
//! approvals),
//! the very same functions, behind the session cookie instead of a bearer
//! key. Only reads: a browser's cookie is sent with cross-site requests of
//! no kind (`SameSite=Strict`), and every change is a form with a CSRF
//! token ([`super::pages`]).

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;

use super::operator::Operator;
use crate::error::ApiError;
use crate::routes::{approvals, connections, runs};
use crate::state::AppState;

pub fn router(app: &AppState) -> axum::Router<AppState> {
    axum::Router::new()
        .route("/runs", get(runs::list))
        .route("/runs/{id}", get(runs::get))
        .route("/runs/{id}/events", get(runs::events))
        .route("/runs/{id}/logs", get(runs::logs))
        .route("/runs/{id}/egress", get(runs::egress))
        .route("/runs/{id}/cost", get(runs::cost))
        .route("/runs/{id}/approvals", get(approvals::list))
        .route("/connections", get(connections::list))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            require_session,
        ))
}

/// Admits a request with a live session, as the tenant the handlers take.
async fn require_session(State(app): State<AppState>, mut req: Request, next: Next) -> Response {
    match Operator::of(&app, req.headers()).await {
        Ok(Some(op)) => {
            req.extensions_mut().insert(op.tenant);
            next.run(req).await
        }
        Ok(None) => ApiError::unauthorized("sign in to the console").into_response(),
        Err(e) => e.into_response(),
    }
}

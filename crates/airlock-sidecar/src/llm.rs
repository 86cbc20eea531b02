//! `/llm/…`: the model relay.
// Placeholder router until the relay lands.

use std::sync::Arc;

use axum::Router;

use crate::state::Sidecar;

pub fn router(_sidecar: Arc<Sidecar>) -> Router {
    Router::new()
}

//! `/mcp`: the agent's tools over MCP (Streamable HTTP).
// Placeholder router until the MCP service lands.

use std::sync::Arc;

use axum::Router;

use crate::state::Sidecar;

pub fn router(_sidecar: Arc<Sidecar>) -> Router {
    Router::new()
}

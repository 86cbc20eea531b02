//! The forward proxy (absolute-form HTTP and CONNECT).
// Placeholder until the proxy lands.

use std::sync::Arc;

use crate::state::Sidecar;

/// Serves the proxy on an accepted stream.
pub async fn serve_connection<S>(_stream: S, _sidecar: Arc<Sidecar>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
}

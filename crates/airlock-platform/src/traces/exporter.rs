//! The OTLP exporter's HTTP client: the egress guard's
//! ([`airlock_egress::GuardedClient`]). The collector's endpoint is an
//! egress site like any other: every export is judged (parse, policy,
//! blocked names, resolution, every answer against the block table) and
//! sent to the validated address only; a collector on a private address is
//! reached only when `EGRESS_ALLOW_INTERNAL_HOSTS` lists its host.
//!
//! The SDK's batch processor exports from a thread of its own, outside any
//! tokio runtime: each export runs on the platform's runtime ([`Handle`])
//! and is awaited through a channel.

use std::sync::Arc;

use airlock_egress::{
    AuthorizedUris, CallRules, ClientConfig, EgressError, GuardedClient, OutboundRequest,
};
use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use tokio::runtime::Handle;

/// The guarded client of one collector endpoint.
pub(crate) struct GuardedExport {
    client: Arc<GuardedClient>,
    /// The endpoint's origin, named literally (what lets an
    /// `EGRESS_ALLOW_INTERNAL_HOSTS` entry apply).
    authorized: Arc<AuthorizedUris>,
    runtime: Handle,
}

impl std::fmt::Debug for GuardedExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GuardedExport")
    }
}

/// Why an export was not sent or not answered.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("OTLP export refused by the egress guard: {0}")]
    Egress(#[from] EgressError),
    #[error("OTLP export: the platform's runtime dropped the request")]
    Dropped,
    #[error("OTLP export: the answer could not be built: {0}")]
    Answer(#[from] http::Error),
}

impl GuardedExport {
    pub(crate) fn new(
        client: GuardedClient,
        endpoint: &airlock_egress::Target,
        runtime: Handle,
    ) -> GuardedExport {
        let authorized = AuthorizedUris::parse(&[format!(
            "{}://{}/**",
            endpoint.scheme(),
            endpoint.authority()
        )]);
        GuardedExport {
            client: Arc::new(client),
            authorized: Arc::new(authorized),
            runtime,
        }
    }

    fn rules(authorized: &AuthorizedUris) -> CallRules<'_> {
        CallRules {
            authorized,
            allow_all_uris: false,
            credentialed: false,
        }
    }

    /// The guard's decision on `url` (no request is sent).
    pub(crate) async fn judge(&self, url: &str) -> Result<(), EgressError> {
        self.client
            .admit(url, &http::Method::POST, &Self::rules(&self.authorized))
            .await
            .map(|_| ())
    }
}

/// The limits of an export: at most `timeout` from the first connect to
/// the answer's last byte, no redirect, a small answer.
pub(crate) fn client_config(timeout: std::time::Duration) -> ClientConfig {
    ClientConfig {
        max_redirects: 0,
        max_response_bytes: 64 * 1024,
        total_timeout: timeout,
        connect_timeout: timeout,
        ..ClientConfig::default()
    }
}

#[async_trait::async_trait]
impl HttpClient for GuardedExport {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let req = OutboundRequest {
            method: parts.method,
            url: parts.uri.to_string(),
            headers: parts.headers,
            body,
            credential_headers: Vec::new(),
        };
        let (client, authorized) = (self.client.clone(), self.authorized.clone());
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.runtime.spawn(async move {
            let r = client.send(req, &GuardedExport::rules(&authorized)).await;
            let _ = tx.send(r);
        });
        let resp = rx
            .await
            .map_err(|_| ExportError::Dropped)?
            .map_err(ExportError::Egress)?;
        let mut out = Response::builder().status(resp.status);
        if let Some(h) = out.headers_mut() {
            *h = resp.headers;
        }
        Ok(out.body(resp.body).map_err(ExportError::Answer)?)
    }
}

//! `airlock serve`: the platform as a long-lived, multi-tenant HTTP service
//! (docs/serve.md).
//!
//! - [`routes`]: the `/v1` API, answering the types of [`airlock_api::v1`];
//!   [`openapi`] holds the one table of routes the router is built from,
//!   and the OpenAPI document derived from the handlers and those types.
//! - [`auth`]: organizations' API keys; every row a route reads or changes is
//!   looked up under the caller's organization.
//! - [`scheduler`]: this replica's share of the work: it registers itself,
//!   heartbeats, claims queued runs in order within the limits, runs them,
//!   stops those asked to stop; the replica holding the leader lease fails
//!   the runs of replicas that died.
//! - [`metrics`]: `/metrics` for the operator, on a listener of its own
//!   (`METRICS_LISTEN`), never on the tenants' one.
//! - [`console`]: the operator's console under `/console` (pages read
//!   through the `/v1` handlers, a session cookie made from an API key)
//!   and agents' HTML previews, sandboxed on an origin of their own.
//! - [`webhooks`]: signed deliveries of run events, judged by the egress
//!   guard at creation and at every delivery, retried with backoff.
//! - [`serve()`]: the listener answers from the first moment: `/healthz`
//!   (the process is alive) at once, `/readyz` 503 with the cause while
//!   the platform boots (the store may not answer yet), the API once it
//!   has; on the first SIGTERM the replica drains ([`scheduler::drain`]).

#![forbid(unsafe_code)]

pub mod access;
pub mod auth;
pub mod bundle;
pub mod config;
pub mod console;
pub mod error;
pub mod extract;
pub mod failpoint;
pub mod metrics;
pub mod openapi;
pub mod outage;
pub mod ratelimit;
pub mod routes;
pub mod scheduler;
pub mod serve;
pub mod state;
pub mod webhooks;

pub use auth::{ApiAuth, Tenant};
pub use config::{ConfigError, DEFAULT_LISTEN, ServeConfig};
pub use error::ApiError;
pub use serve::{BootError, Booting, ServeError, router, serve};
pub use state::{AppState, StreamSlot, new_replica_id};

//! The per-run sidecar: the only way out of a sandbox.
//!
//! One process per run. It receives its configuration and secrets as one JSON
//! document on stdin ([`SidecarConfig`]), makes itself non-dumpable, and
//! serves, behind the run's sidecar token:
//!
//! - `/mcp`: the agent's tools (`{namespace}__api_call`, `run_history`,
//!   `recall_memory`), with credentials injected here and never returned;
//! - `/llm/…`: the model relay, metered here where the agent cannot forge it;
//! - `/events`: heartbeats, logs and the result from the runtime;
//! - the forward proxy, on its own listener;
//!
//! and `GET /health` without a token. Every outbound request goes through
//! the egress guard and is written to the run's egress log by one recorder
//! ([`egress`]) before it is sent (ahead, to the run's [`journal`]).

#![forbid(unsafe_code)]

pub mod approval;
pub mod artifacts;
pub mod auth;
/// The clock of every record the sidecar writes: the contract crate's.
pub use airlock_platform_api::clock;
pub mod config;
pub mod credential;
pub mod egress;
pub mod event_sink;
pub mod events;
pub mod exclusions;
pub mod interception;
pub mod journal;
pub mod keep;
pub mod llm;
pub mod mcp;
pub mod policy;
pub mod proxy;
pub mod server;
pub mod state;
mod sys;

pub use config::SidecarConfig;
/// The sidecar binary's global allocator: mimalloc, by way of its crate,
/// built without transparent huge pages (`no_thp`).
pub use mimalloc::MiMalloc;

/// This build of the sidecar (a fingerprint of its sources, `build.rs`):
/// what `airlock-sidecar --build` prints, and what the platform expects of
/// an `airlock-sidecar` binary before it starts one.
pub const BUILD: &str = env!("AIRLOCK_SIDECAR_BUILD");
pub use server::{SidecarError, run};
pub use state::Sidecar;

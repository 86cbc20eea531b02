//! The internal API a sidecar calls with its run token (credentials at
//! request time, run history, memories, the event, cost and egress-log sink,
//! stored results): [`wire`] fixes the protocol, [`client::PlatformClient`]
//! is what a sidecar uses. The server side lives in `airlock-platform`; this
//! crate stays small so the sidecar does not link the store.

#![deny(unsafe_code)]

pub mod approval;
pub mod budget;
pub mod channel;
pub mod client;
pub mod clock;
pub mod connection_types;
pub mod files;
mod get;
pub mod launch;
pub mod listener_guard;
pub mod policy;
pub mod read_interest;
pub mod sidecar_auth;
#[allow(unsafe_code)] // the one module that needs it: registering a descriptor with tokio
mod sys;
pub mod transparent;
pub mod types;
pub mod wire;

pub use client::{PlatformClient, PlatformError};

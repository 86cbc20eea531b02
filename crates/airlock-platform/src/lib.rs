//! The platform side of a run: the internal API a sidecar calls with its run
//! token (credentials at request time, run history, memories, the event, cost
//! and egress-log sink, stored results).
//!
//! [`wire`] fixes the protocol, [`client::PlatformClient`] is what a sidecar
//! uses, and the server hosts it over a unix socket for `airlock run`,
//! `airlock serve` and the tests.

pub mod client;
pub mod wire;

pub use client::{PlatformClient, PlatformError};

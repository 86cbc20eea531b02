//! Airlock's platform: owns state (the store), decrypts credentials only when
//! a sidecar asks, and serves the internal API that sidecars call with their
//! run token.

pub mod internal_api;

#[cfg(feature = "testing")]
pub mod testing;

pub use internal_api::{Grant, InternalApi};

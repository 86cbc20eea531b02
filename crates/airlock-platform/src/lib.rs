//! Airlock's platform: owns state (the store), decrypts credentials only when
//! a sidecar asks, and serves the internal API that sidecars call with their
//! run token.

#![forbid(unsafe_code)]

pub mod approvals;
pub mod background;
pub mod budget;
pub mod bundle;
pub mod catalog;
pub mod connections;
pub mod identity;
pub mod internal_api;
pub mod journal;
pub mod manifest;
pub mod metrics;
pub mod models;
pub mod operator;
pub mod orchestrator;
pub mod platform;
pub mod provider_keys;
pub mod proxies;
pub mod proxy_ca;
pub mod settings;
pub mod signing;
pub mod traces;

#[cfg(feature = "testing")]
pub mod testing;

pub use internal_api::{Grant, InternalApi};
pub use platform::{BootError, Platform};

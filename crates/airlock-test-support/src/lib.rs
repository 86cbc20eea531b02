//! What Airlock's tests and benches share (a dev-dependency only).
//!
//! [`require_peer`] is the one policy for a peer a test needs (docker,
//! PostgreSQL, python modules, go, node, root, cgroups, …) that is missing
//! here: under `CI` the test fails, elsewhere it is skipped, loudly, and
//! counted; the skips are summed up when the test process exits.
//! [`store_bytes`] (feature `store`) is what a home's store weighs; [`tls`]
//! (feature `tls`) and [`fake_provider`] (feature `fake-provider`) are the
//! peers on loopback the suite and the benches start; [`sidecar_config`]
//! (feature `sidecar-config`) builds sidecar configurations from the launch
//! contract's types and [`sidecar`] (feature `sidecar`) starts a real
//! sidecar with one. [`otlp_receiver`] (feature `otlp`) receives OTLP/HTTP
//! traces on loopback. [`serve`] (feature `serve`) starts `airlock serve`
//! for the suite and the benches. [`firecracker_api`] (feature `firecracker-api`) is a
//! scripted Firecracker API server and a stand-in jailer.

#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "fake-provider")]
pub mod fake_provider;
#[cfg(feature = "firecracker-api")]
pub mod firecracker_api;
#[cfg(feature = "otlp")]
pub mod otlp_receiver;
mod peer;
#[cfg(feature = "serve")]
pub mod serve;
#[cfg(feature = "sidecar")]
pub mod sidecar;
#[cfg(feature = "sidecar-config")]
pub mod sidecar_config;
#[cfg(feature = "store")]
mod store;
mod sys;
#[cfg(feature = "tls")]
pub mod tls;

pub use peer::require_peer;
#[cfg(feature = "store")]
pub use store::store_bytes;

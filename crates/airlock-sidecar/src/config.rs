//! The sidecar's configuration: one JSON document on stdin, never argv or
//! the environment (both are readable by other processes of the same user).
//! Its types are the platform's launch contract
//! ([`airlock_platform_api::launch`]), shared with the side that writes it.

pub use airlock_platform_api::launch::{
    ConfigError, Delivery, EgressSettings, Integration, Limits, Listen, MAX_CONFIG_BYTES, Model,
    Network, NetworkEgress, Provider, SidecarConfig,
};

/// The credential the model relay asks the platform for.
pub use airlock_platform_api::wire::MODEL_CREDENTIAL;

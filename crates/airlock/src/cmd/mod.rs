//! One module per subcommand family.

pub mod connections;
pub mod egress;
pub mod sidecar;
pub mod keys;

//! One module per subcommand family.

pub mod connections;
pub mod demo;
pub mod doctor;
pub mod egress;
pub mod keys;
pub mod probe;
pub mod run;
pub mod runs;
pub mod runtime;
pub mod sandbox_init;
pub mod sidecar;

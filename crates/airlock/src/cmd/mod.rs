//! One module per subcommand family.

pub mod bundle;
pub mod catalog;
pub mod connections;
pub mod demo;
pub mod doctor;
pub mod egress;
pub mod exit;
pub mod images;
pub mod internal_hosts;
pub mod keys;
pub mod openapi;
pub mod org;
pub mod orgs;
pub mod out;
pub mod remote;
pub mod report;
pub mod run;
pub mod runs;
pub mod runtime;
pub mod sandbox_init;
pub mod serve;
pub mod sidecar;

/// The runtime of a command that hosts a platform or a runtime: two workers
/// (the machines Airlock targets start at two cores).
pub fn multi_thread_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
}

/// The runtime of a command that does one thing at a time (and of the sidecar).
pub fn current_thread_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

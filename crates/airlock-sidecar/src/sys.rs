//! Every system call the sidecar makes directly (rustix wraps them).

use std::io;

/// Makes this process non-dumpable: no core dumps, and other processes of the
/// same user (the agent, in the process backend) cannot ptrace it or read its
/// `/proc/PID/{mem,environ,…}`.
pub fn make_non_dumpable() -> io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(io::Error::from)
}

/// Raises the soft limit on open files to the hard limit: a spliced tunnel
/// holds six descriptors (two sockets, two pipes).
pub fn raise_open_files_limit() {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if limit.current < limit.maximum {
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        );
    }
}

//! Process hardening. No `unsafe` needed: rustix wraps the prctl.

/// Makes this process non-dumpable: no core dumps, and other processes of the
/// same user (the agent, in the process backend) cannot ptrace it or read its
/// `/proc/PID/{mem,environ,…}`.
pub fn make_non_dumpable() -> std::io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(std::io::Error::from)
}

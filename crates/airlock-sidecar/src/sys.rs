//! Every system call the sidecar makes directly. No `unsafe` needed: rustix
//! wraps them.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::pipe::{PipeFlags, SpliceFlags};

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

/// A non-blocking pipe, the kernel-side buffer of a spliced tunnel direction.
pub struct Pipe {
    pub read: OwnedFd,
    pub write: OwnedFd,
}

/// Opens a pipe and asks for `size` bytes of capacity (best effort: the
/// default 64 KiB remains if the system refuses more).
pub fn pipe(size: usize) -> io::Result<Pipe> {
    let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
    let _ = rustix::pipe::fcntl_setpipe_size(&write, size);
    Ok(Pipe { read, write })
}

/// Moves up to `len` bytes from `from` to `to` inside the kernel (one of
/// them is a pipe), never blocking: `WouldBlock` when nothing can move now.
pub fn splice(from: impl AsFd, to: impl AsFd, len: usize) -> io::Result<usize> {
    rustix::pipe::splice(
        from,
        None,
        to,
        None,
        len,
        SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
    )
    .map_err(io::Error::from)
}

/// Half-closes a socket: the peer reads end-of-stream, reading goes on.
pub fn shutdown_write(socket: impl AsFd) -> io::Result<()> {
    rustix::net::shutdown(socket, rustix::net::Shutdown::Write).map_err(io::Error::from)
}

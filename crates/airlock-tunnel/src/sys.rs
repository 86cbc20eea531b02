//! The system calls of a spliced tunnel. No `unsafe` needed: rustix wraps
//! them.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::pipe::{PipeFlags, SpliceFlags};

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

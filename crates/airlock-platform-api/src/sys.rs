//! The crate's one `unsafe`: registering a descriptor with tokio for one
//! direction only ([`register`], used by [`crate::read_interest`]).

use std::io;
use std::os::unix::net::UnixStream;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Registers `stream` with the current runtime for `interest` alone.
pub(crate) fn register(stream: UnixStream, interest: Interest) -> io::Result<AsyncFd<UnixStream>> {
    // SAFETY: a `UnixStream` owns its descriptor: it stays open and the same
    // for as long as the `AsyncFd` owns the stream, which it gives out only
    // by reference (`get_ref`); nothing here replaces or closes it.
    unsafe { AsyncFd::register_with_interest(stream, interest) }.map_err(io::Error::from)
}

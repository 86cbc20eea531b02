//! The probe's attack attempts that need raw system calls (the one module
//! with `unsafe` in this crate). Each is expected to FAIL inside a sandbox.

use std::io;

/// `ptrace(PTRACE_ATTACH, pid)`; detaches again if it worked.
pub fn try_ptrace_attach(pid: i32) -> io::Result<()> {
    // SAFETY: PTRACE_ATTACH with null addr/data touches no memory of ours.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_ATTACH,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    if r == 0 {
        // SAFETY: as above.
        unsafe {
            libc::ptrace(
                libc::PTRACE_DETACH,
                pid,
                std::ptr::null_mut::<libc::c_void>(),
                std::ptr::null_mut::<libc::c_void>(),
            )
        };
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `process_vm_readv` of 8 bytes at `addr` of `pid` into a local buffer.
pub fn try_process_vm_readv(pid: i32, addr: usize) -> io::Result<usize> {
    let mut buf = [0u8; 8];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes our own live 8-byte buffer; `remote` is only
    // interpreted in the other process by the kernel, never dereferenced here.
    let r = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    // Negative is the error; any other count fits a usize.
    usize::try_from(r).map_err(|_| io::Error::last_os_error())
}

/// Tries to create a new user namespace (seccomp must deny it).
pub fn try_unshare_user() -> io::Result<()> {
    // SAFETY: CLONE_NEWUSER only (no CLONE_FILES): nothing this process
    // holds is invalidated by a new user namespace.
    Ok(unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER) }?)
}

/// What became of one system call made in a child of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It returned this value.
    Returned(i64),
    /// It failed with this errno.
    Errno(i32),
    /// The child was killed by this signal (a filter's kill, or the call's
    /// own doing).
    Signal(i32),
    /// The child ended without a report (the call ended it).
    Exited(i32),
}

/// Makes system call `nr` with `args` in a forked child (so whatever it
/// does, or a filter's kill, stays there; an alarm ends one that blocks)
/// and reports what became of it. Call from a single-threaded process.
pub fn syscall_in_child(nr: i64, args: [u64; 6]) -> io::Result<Outcome> {
    let (r, w) = rustix::pipe::pipe()?;
    // SAFETY: the probe is single-threaded (no thread is ever spawned), so
    // the child owns a consistent copy of the address space and takes no
    // lock another thread holds.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: the child calls only async-signal-safe functions (alarm,
        // syscall, write, _exit) on values it owns; `syscall` is given the
        // caller's numbers and arguments, which is the point of the probe:
        // whatever it does happens in this child only.
        unsafe {
            libc::alarm(2);
            let v = libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]);
            let errno = *libc::__errno_location();
            let report: [i64; 2] = if v == -1 {
                [1, i64::from(errno)]
            } else {
                [0, v]
            };
            libc::write(
                std::os::fd::AsRawFd::as_raw_fd(&w),
                report.as_ptr().cast(),
                std::mem::size_of_val(&report),
            );
            libc::_exit(0);
        }
    }
    drop(w);
    let mut buf = [0u8; 16];
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::read(&r, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a live local.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
    if got == buf.len() {
        let kind = i64::from_ne_bytes(buf[..8].try_into().unwrap_or_default());
        let value = i64::from_ne_bytes(buf[8..].try_into().unwrap_or_default());
        return Ok(if kind == 1 {
            Outcome::Errno(i32::try_from(value).unwrap_or(-1))
        } else {
            Outcome::Returned(value)
        });
    }
    Ok(if libc::WIFSIGNALED(status) {
        Outcome::Signal(libc::WTERMSIG(status))
    } else {
        Outcome::Exited(libc::WEXITSTATUS(status))
    })
}

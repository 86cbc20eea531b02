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
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Tries to create a new user namespace (seccomp must deny it).
pub fn try_unshare_user() -> io::Result<()> {
    // SAFETY: CLONE_NEWUSER only (no CLONE_FILES): nothing this process
    // holds is invalidated by a new user namespace.
    Ok(unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER) }?)
}

//! Every system call the sidecar makes directly (rustix wraps them), and
//! the crate's one `unsafe`: the sidecar binary's allocator ([`MiMalloc`]),
//! each block with its `// SAFETY:`.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::io;

use libmimalloc_sys as mi;

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

/// The alignment every mimalloc block has.
const WORD: usize = std::mem::size_of::<usize>();

/// The sidecar binary's global allocator: mimalloc through its C API,
/// called the way that API is fastest. Every mimalloc block is aligned to
/// a word at least (its size classes are word multiples, laid out from
/// 16-byte aligned page starts), so a request whose alignment is a word or
/// less (nearly all of them) goes to `mi_malloc`, `mi_zalloc` and
/// `mi_realloc`, whose checks are fewer than the aligned functions'; the
/// rest to the aligned functions.
pub struct MiMalloc;

// SAFETY: every method returns what mimalloc returns for the request
// (null when it cannot serve it), aligned to `layout.align()`: by any
// block's word alignment when that is a word or less, else by the
// aligned functions; memory is freed and reallocated by the mimalloc
// functions that allocated it (`mi_free` and `mi_realloc` take blocks of
// either kind).
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD {
            // SAFETY: `mi_malloc` takes any size and returns a
            // word-aligned block of at least that size, or null.
            unsafe { mi::mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: `layout.align()` is a power of two (a `Layout`).
            unsafe { mi::mi_malloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD {
            // SAFETY: as `alloc`, zeroed.
            unsafe { mi::mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: as `alloc`, zeroed.
            unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract),
        // so from mimalloc.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= WORD {
            // SAFETY: `ptr` came from mimalloc (the caller's contract);
            // the new block is word-aligned like every block.
            unsafe { mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast() }
        } else {
            // SAFETY: as above, keeping the alignment it was allocated with.
            unsafe { mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast() }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block has the alignment asked for, whatever the size class
    /// (word multiples that are not multiples of 16, blocks above the
    /// small sizes); a grown or shrunk block keeps its bytes and its
    /// alignment; a zeroed one is zero.
    #[test]
    fn blocks_are_aligned_kept_and_zeroed() {
        let a = MiMalloc;
        for align in [1usize, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [1usize, 7, 8, 24, 40, 100, 1000, 1025, 5000, 70_000] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: `layout` has a non-zero size; every block is
                // freed below with the layout it has.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "alloc {size} aligned {align}");
                    std::ptr::write_bytes(p, 0xA5, size);
                    let grown = a.realloc(p, layout, size * 3);
                    assert!(!grown.is_null());
                    assert_eq!(grown as usize % align, 0, "realloc {size} aligned {align}");
                    assert!((0..size).all(|i| *grown.add(i) == 0xA5), "contents kept");
                    let grown_layout = Layout::from_size_align(size * 3, align).unwrap();
                    a.dealloc(grown, grown_layout);
                    let z = a.alloc_zeroed(layout);
                    assert!(!z.is_null());
                    assert_eq!(z as usize % align, 0, "zeroed {size} aligned {align}");
                    assert!((0..size).all(|i| *z.add(i) == 0), "zeroed");
                    a.dealloc(z, layout);
                }
            }
        }
    }
}

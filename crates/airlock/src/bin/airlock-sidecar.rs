//! `airlock-sidecar`: the sidecar alone, the same as `airlock sidecar`
//! (configuration as one JSON document on stdin, readiness line on stdout,
//! logs on stderr), in a binary that holds nothing else: a run's sidecar
//! maps and faults in only its own code, so its resident memory is about
//! two thirds of what the whole `airlock` binary costs. The platform starts
//! it when it sits next to `airlock` and says it is of the same build
//! (`--build`), else `airlock sidecar`.

use std::process::ExitCode;

/// mimalloc rather than the C library's allocator: a call on the sidecar's
/// hot paths makes many short-lived allocations, which glibc's malloc and
/// free served in 18 % of the sidecar's instructions (callgrind of
/// `mcp_api_call`'s sidecar, 8,400 calls: 1,291M instructions with glibc,
/// 1,139M with mimalloc). Only this binary:
/// `airlock` is also the in-sandbox runtime, whose seccomp filter and
/// memory are left as they are.
#[global_allocator]
static ALLOC: alloc::MiMalloc = alloc::MiMalloc;

/// mimalloc through its C API, called the way that API is fastest.
///
/// The `mimalloc` crate hands every request to `mi_malloc_aligned`, whose
/// checks (and, above 1 KiB, its generic aligned path) cost about three
/// times `mi_malloc` on the sidecar's hot path (callgrind, 137 allocations
/// per `api_call`: 60 instructions each on average, 275 on the aligned
/// generic path). Every mimalloc block is aligned to a word at least (its
/// size classes are word multiples, laid out from 16-byte aligned page
/// starts), so a request whose alignment is a word or less — nearly all of
/// them — goes to `mi_malloc`, `mi_zalloc` and `mi_realloc`; the rest to the
/// aligned functions, as before.
mod alloc {
    use std::alloc::{GlobalAlloc, Layout};
    use std::ffi::c_void;

    use libmimalloc_sys as mi;

    /// The alignment every mimalloc block has.
    const WORD: usize = std::mem::size_of::<usize>();

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
                unsafe {
                    mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
                }
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
}

fn main() -> ExitCode {
    // What the platform asks before it starts this binary: which build.
    if std::env::args_os().nth(1).is_some_and(|a| a == "--build") {
        println!("{}", airlock_sidecar::BUILD);
        return ExitCode::SUCCESS;
    }
    // `AIRLOCK_LOG` as `target=level` directives (`info`, `warn`,
    // `airlock::egress=debug,info`): the sidecar needs no span-field
    // filters, and the plain parser keeps a regex engine out of its memory.
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = std::env::var("AIRLOCK_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing_subscriber::filter::Targets>().ok())
        .unwrap_or_else(|| {
            tracing_subscriber::filter::Targets::new()
                .with_default(tracing::level_filters::LevelFilter::INFO)
        });
    // Colours only on a terminal, as `airlock`'s own logs: a run's sidecar
    // writes to its platform's pipe.
    let ansi = {
        use std::io::IsTerminal;
        std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
    };
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(ansi),
        )
        .with(filter)
        .try_init();
    tracing::debug!(target: "airlock::phase", "sidecar: main");
    airlock_sidecar::server::main_from_stdin()
}

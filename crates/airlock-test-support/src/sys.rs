//! The one place this crate calls into libc.

/// Runs `f` when the process exits normally (main returns, or
/// `std::process::exit`, which is how libtest ends a failed run), after
/// every test: libtest's generated `main` holds no guard a `Drop` could use.
pub(crate) fn at_exit(f: fn()) {
    static HOOK: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();
    extern "C" fn run() {
        if let Some(f) = HOOK.get() {
            // A panic must not unwind into libc.
            let _ = std::panic::catch_unwind(f);
        }
    }
    if HOOK.set(f).is_ok() {
        // SAFETY: `run` is an `extern "C" fn()` with no arguments, as
        // atexit(3) requires; it reads a static set before registration and
        // never unwinds (catch_unwind). A failed registration (ENOMEM) only
        // loses the summary.
        unsafe {
            libc::atexit(run);
        }
    }
}

//! A command's output on stdout. A reader that went away (`airlock runs
//! list | head`) ends a command that only reads quietly, as a closed pipe
//! ends `cat`: never a panic. `airlock run` writes its report with
//! [`try_line`] and ends its run before it goes.

use std::io::Write as _;

/// Writes one line; a closed pipe ends the process (status 0), another
/// write error ends it with [`super::exit::FAILED`].
pub fn line(args: std::fmt::Arguments<'_>) {
    if let Err(e) = try_line(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing the output: {e}");
        std::process::exit(i32::from(super::exit::FAILED));
    }
}

/// Writes bytes as they are (whole lines) and flushes them, ending the
/// process as [`line`] does when the reader went away.
pub fn bytes(b: &[u8]) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(b).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing the output: {e}");
        std::process::exit(i32::from(super::exit::FAILED));
    }
}

/// Writes one line and flushes it.
pub fn try_line(args: std::fmt::Arguments<'_>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// `println!` through [`line`].
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::cmd::out::line(format_args!($($t)*))
    };
}
pub(crate) use outln;

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

/// An error and its causes in one line, each said once: a cause whose
/// words its error already carries (a library error that names its source
/// in its own message and also returns it as its `source()`) is not said
/// again, where `{:#}` said it twice ("setup failed: X: X").
pub fn error_line(e: &anyhow::Error) -> String {
    let mut said = e.to_string();
    for cause in e.chain().skip(1) {
        let words = cause.to_string();
        if !said.contains(&words) {
            said.push_str(": ");
            said.push_str(&words);
        }
    }
    said
}

#[cfg(test)]
mod tests {
    use super::error_line;

    #[derive(Debug, thiserror::Error)]
    #[error("the daemon is gone")]
    struct Gone;

    /// Names its source in its message, and returns it as its source.
    #[derive(Debug, thiserror::Error)]
    #[error("sandbox setup failed: {0}")]
    struct Setup(#[source] Gone);

    /// Names no source in its message.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot start the run")]
    struct Start(#[source] Setup);

    #[test]
    fn each_cause_is_said_once() {
        let e = anyhow::Error::new(Setup(Gone));
        assert_eq!(
            format!("{e:#}"),
            "sandbox setup failed: the daemon is gone: the daemon is gone"
        );
        assert_eq!(error_line(&e), "sandbox setup failed: the daemon is gone");
        let e = anyhow::Error::new(Start(Setup(Gone))).context("airlock run");
        assert_eq!(
            error_line(&e),
            "airlock run: cannot start the run: sandbox setup failed: the daemon is gone"
        );
        let e = anyhow::anyhow!("plain");
        assert_eq!(error_line(&e), "plain");
    }
}

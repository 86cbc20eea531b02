//! What the operator is shown on stderr (the live view, the run's
//! milestones, what a platform's start did): one line at a time. A stderr
//! that cannot be written (a pipe nobody reads any more, a full or failing
//! file) loses the line, never the run: `eprintln!` would panic there.

use std::io::Write;

/// Writes `line` and a newline to stderr; a failed write is dropped.
pub fn say(line: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    // The operator's view is best-effort: the run's record is the store's.
    let _ = writeln!(err, "{line}");
}

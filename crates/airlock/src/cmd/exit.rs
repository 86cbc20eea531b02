//! `airlock`'s exit statuses, one table (docs/cli.md, "Exit status"), as
//! `docker run` does: a run's command passes the agent's own exit code
//! through, and Airlock's own outcomes have codes of their own.

use std::process::ExitCode;

use airlock_store::RunStatus;

/// A command other than a run failed: no such run, the server refused, a
/// store or network error.
pub const FAILED: u8 = 1;
/// Nothing was started: bad arguments, a bad setting or manifest (clap's
/// own usage errors are 2 too).
pub const USAGE: u8 = 2;
/// The run reached its timeout (as `timeout(1)`).
pub const TIMED_OUT: u8 = 124;
/// The run failed on Airlock's side, before the agent gave an exit code
/// (as `docker run`'s 125).
pub const RUN_FAILED: u8 = 125;
/// The run was cancelled (Ctrl-C, or `DELETE /v1/runs/{id}`), as a shell
/// reports an interrupted command.
pub const CANCELLED: u8 = 130;

/// The exit status of a command that ran a run to its end: 0 when it
/// succeeded, the agent's own exit code when the agent failed with one,
/// else Airlock's code for how it ended.
pub fn of_run(status: &str, exit_code: Option<i64>) -> u8 {
    match RunStatus::parse(status) {
        Some(RunStatus::Succeeded) => 0,
        Some(RunStatus::TimedOut) => TIMED_OUT,
        Some(RunStatus::Cancelled) => CANCELLED,
        _ => match exit_code.and_then(|c| u8::try_from(c).ok()) {
            Some(c) if c != 0 => c,
            _ => RUN_FAILED,
        },
    }
}

/// [`of_run`] as the process's exit.
pub fn run_exit(status: &str, exit_code: Option<i64>) -> ExitCode {
    ExitCode::from(of_run(status, exit_code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_code_passes_through_and_airlocks_own_are_distinct() {
        assert_eq!(of_run("succeeded", Some(0)), 0);
        assert_eq!(of_run("failed", Some(3)), 3);
        assert_eq!(of_run("failed", Some(137)), 137);
        assert_eq!(of_run("failed", None), RUN_FAILED);
        assert_eq!(of_run("failed", Some(0)), RUN_FAILED);
        assert_eq!(of_run("failed", Some(-1)), RUN_FAILED);
        assert_eq!(of_run("timed_out", Some(143)), TIMED_OUT);
        assert_eq!(of_run("cancelled", None), CANCELLED);
    }
}

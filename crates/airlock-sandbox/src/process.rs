//! The `process` backend: the command runs as a plain host process. It
//! isolates NOTHING (network, files, other processes): credentials still stay
//! in the sidecar, but the agent can reach anything the host can. For solo
//! development and trusted evaluation only; every run says so loudly.

use std::process::Stdio;

use std::path::Path;

use crate::{Backend, RunPaths, Sandbox, SandboxError, SandboxSpec, Unavailable};

pub struct ProcessBackend;

pub const WARNING: &str = "the process backend isolates NOTHING: the agent runs as a host process and can reach the network, the files and the processes of this user; credentials still stay in the sidecar";

impl Backend for ProcessBackend {
    fn name(&self) -> &'static str {
        "process"
    }

    fn check(&self) -> Result<(), Unavailable> {
        Ok(())
    }

    fn paths(&self, run_dir: &Path) -> RunPaths {
        // The host's own paths: this backend has no view of its own.
        let sockets = run_dir.join("sock");
        RunPaths {
            sockets_host: sockets.clone(),
            sockets,
            workspace: run_dir.join("workspace"),
        }
    }

    fn spawn(&self, spec: &SandboxSpec) -> Result<Sandbox, SandboxError> {
        tracing::warn!("{WARNING}");
        let (program, args) = spec
            .command
            .split_first()
            .ok_or(SandboxError::EmptyCommand)?;
        std::fs::create_dir_all(&spec.workspace)?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&spec.workspace)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Its own session (so its own process group, and the whole tree can be
        // killed) without a controlling terminal: `/dev/tty` does not reach
        // the operator's terminal. (This backend isolates nothing else.)
        crate::namespace::sys::new_session_on_spawn(&mut cmd);
        let child = cmd.spawn()?;
        let pid = child.id().ok_or(SandboxError::CommandExited)?;
        // The group is killed by its number only while its leader has not
        // been reaped (a zombie keeps the number its own): a number freed
        // can be reused by another process group, which must not be hit.
        let leader = crate::pid_fd(Some(pid));
        let killer = Box::new(move || {
            let Some(fd) = &leader else { return };
            let alive =
                rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL).is_ok();
            if alive
                && let Some(pgid) = i32::try_from(pid)
                    .ok()
                    .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
            }
        });
        let mut sb = Sandbox::new(child, killer, None)?;
        sb.feed_stdin(vec![], spec.stdin.clone(), spec.hold_stdin);
        Ok(sb)
    }
}

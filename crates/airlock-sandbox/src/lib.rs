//! Sandboxes for runs: one [`Backend`] trait, several backends.
//!
//! A backend starts one command (normally `airlock runtime -- AGENT…`) in an
//! isolated environment and hands back a [`Sandbox`] to wait on or kill.
//! Everything the sandbox needs from outside is in [`SandboxSpec`]: the
//! sidecar is reached through the unix sockets in `sockets_dir`, which the
//! sandbox sees read-only (`connect(2)` works on a read-only mount, nothing
//! else does); the sandbox writes nowhere on the host disk: every write
//! lands on a capped tmpfs. [`Backend::paths`] says where the sandbox sees
//! the sockets and its workspace.
#![deny(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitStatus;

/// What to start, and within which limits.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub run_id: String,
    /// argv[0] must be an absolute path visible inside the sandbox.
    pub command: Vec<String>,
    /// The complete environment of the command (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Written to the command's stdin, then stdin is closed (the runtime's secrets).
    pub stdin: Vec<u8>,
    /// Host directory holding the sidecar's sockets (and nothing else). The
    /// sandbox sees it read-only at [`RunPaths::sockets`].
    pub sockets_dir: PathBuf,
    /// Extra host paths visible read-only at the same path (the airlock
    /// binary, the agent's directory).
    pub ro_paths: Vec<PathBuf>,
    /// The agent's working directory inside the sandbox ([`RunPaths::workspace`]:
    /// a tmpfs in the namespace backend, a host directory in the process backend).
    pub workspace: PathBuf,
    pub workspace_size_mb: u64,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids_max: u64,
}

/// Where a sandbox sees what the platform prepares for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPaths {
    /// Host directory the platform creates for the sidecar's sockets.
    pub sockets_host: PathBuf,
    /// The same directory as the sandbox sees it (read-only there).
    pub sockets: PathBuf,
    /// The agent's working directory as the sandbox sees it.
    pub workspace: PathBuf,
}

/// What a backend guarantees, as a program can read it (the run report
/// carries it, not only a warning on stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Isolation {
    /// Whether the agent is isolated from the host at all.
    pub isolates: bool,
    /// What the operator must know, when it does not.
    pub warning: Option<&'static str>,
}

/// The isolation of the backend named `name` (as stored with a run).
pub fn isolation_of(name: &str) -> Isolation {
    match name {
        "process" => Isolation {
            isolates: false,
            warning: Some(process::WARNING),
        },
        _ => Isolation {
            isolates: true,
            warning: None,
        },
    }
}

/// Why a backend cannot run here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("the {backend} backend is not available here: {reason}")]
    Unavailable {
        backend: &'static str,
        reason: String,
    },
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    #[error("sandbox I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// A started sandbox: the host-side handle of its first process.
pub struct Sandbox {
    child: tokio::process::Child,
    /// Host PID of the sandbox's first process.
    pub pid: u32,
    /// Kills everything the sandbox started (not only the first process).
    killer: Box<dyn Fn() + Send + Sync>,
    /// Removes what the backend created on the host (cgroups, mounts, …).
    cleaner: Option<Box<dyn FnOnce() + Send>>,
}

impl Sandbox {
    /// Wraps a started child. `killer` must kill every process of the
    /// sandbox; `cleaner` runs once, after the sandbox is gone.
    pub fn new(
        child: tokio::process::Child,
        killer: Box<dyn Fn() + Send + Sync>,
        cleaner: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<Sandbox, SandboxError> {
        let pid = child
            .id()
            .ok_or_else(|| SandboxError::Setup("the sandbox exited before it started".into()))?;
        Ok(Sandbox {
            child,
            pid,
            killer,
            cleaner,
        })
    }

    /// The command's stdout and stderr (the runtime's own diagnostics).
    pub fn take_output(
        &mut self,
    ) -> (
        Option<tokio::process::ChildStdout>,
        Option<tokio::process::ChildStderr>,
    ) {
        (self.child.stdout.take(), self.child.stderr.take())
    }

    /// Waits for the first process to exit.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Kills every process of the sandbox. Safe to call more than once.
    pub fn kill(&self) {
        (self.killer)();
    }

    /// Kills what is left and removes what the backend created on the host.
    pub async fn cleanup(mut self) {
        self.kill();
        let _ = self.child.wait().await;
        if let Some(clean) = self.cleaner.take() {
            clean();
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        (self.killer)();
        if let Some(clean) = self.cleaner.take() {
            clean();
        }
    }
}

/// A way to build sandboxes.
pub trait Backend: Send + Sync {
    /// `process`, `namespace`, …
    fn name(&self) -> &'static str;
    /// Whether the backend works on this host, and why not.
    fn check(&self) -> Result<(), Unavailable>;
    /// Whether the backend isolates anything at all.
    fn isolates(&self) -> bool {
        isolation_of(self.name()).isolates
    }
    /// Where the sandbox of the run whose host directory is `run_dir` sees
    /// the sidecar's sockets and its workspace.
    fn paths(&self, run_dir: &Path) -> RunPaths;
    /// Starts `spec.command`. Must not block for long.
    fn spawn(&self, spec: &SandboxSpec) -> Result<Sandbox, SandboxError>;
}

pub mod diagnose;
pub mod namespace;
pub mod process;
pub mod terminal;
pub mod untrusted;

pub use diagnose::{Diagnosis, diagnose};

/// The backend for a `RUN_ADAPTER` value: `process`, `namespace`, or `auto`
/// (`namespace` where it works here, else `process` with a loud warning).
/// `namespace` uses the running executable (the `airlock` binary) as the
/// sandbox init; see [`namespace::NamespaceBackend::with_exe`] for another.
pub fn select(name: &str) -> Result<Box<dyn Backend>, SandboxError> {
    match name {
        "process" => Ok(Box::new(process::ProcessBackend)),
        "namespace" => {
            let ns = namespace::NamespaceBackend::current()?;
            ns.check().map_err(|u| SandboxError::Unavailable {
                backend: "namespace",
                reason: u.0,
            })?;
            Ok(Box::new(ns))
        }
        "auto" => {
            let ns = namespace::NamespaceBackend::current()?;
            match ns.check() {
                Ok(()) => Ok(Box::new(ns)),
                Err(Unavailable(why)) => {
                    tracing::warn!(
                        "the namespace sandbox is not available here ({why}); falling back to the process backend: {}",
                        process::WARNING
                    );
                    Ok(Box::new(process::ProcessBackend))
                }
            }
        }
        other => Err(SandboxError::Unavailable {
            backend: "unknown",
            reason: format!("no backend named {other:?} (process, namespace, auto)"),
        }),
    }
}

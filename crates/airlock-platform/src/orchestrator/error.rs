//! Why a run could not be run: one variant per step that can fail. The
//! text of each is what a failed run's end records (`error`), so it names
//! the step and keeps its cause.

use std::path::PathBuf;

use airlock_sandbox::SandboxError;
use airlock_store::StoreError;
use airlock_vault::VaultError;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Found before anything started: nothing was recorded.
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("cancelled while waiting for a free run slot")]
    CancelledWhileQueued,
    /// The run's id could not be drawn.
    #[error(transparent)]
    RunId(VaultError),
    #[error("run directory {}: {error}", path.display())]
    RunDir {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("sockets directory {}: {error}", path.display())]
    SocketsDir {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("egress journal in {}: {error}", dir.display())]
    EgressJournal { dir: PathBuf, error: std::io::Error },
    /// A sidecar or runner token could not be drawn.
    #[error(transparent)]
    Token(VaultError),
    #[error(transparent)]
    ProxyCa(#[from] crate::proxy_ca::CaError),
    /// The backend placed the sidecar where its configuration cannot say.
    #[error(transparent)]
    Listen(#[from] airlock_platform_api::launch::BadHostPort),
    #[error("runner sockets directory {}: {error}", path.display())]
    RunnerDir {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    SandboxSpawn(SandboxError),
    #[error("the local runner of integration {namespace}: {error}")]
    RunnerSpawn {
        namespace: String,
        error: SandboxError,
    },
    #[error(transparent)]
    SidecarSpawn(SandboxError),
    /// Its own last words, or else what its readiness line was
    /// ([`NotReady`]).
    #[error("the sidecar did not start: {0}")]
    SidecarNotReady(String),
    /// No readiness line within this wait.
    #[error("the sidecar did not start within {} s", .0.as_secs())]
    SidecarReadyTimeout(std::time::Duration),
}

/// Why the sidecar's first line was not its readiness.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("no stdout")]
    NoStdout,
    #[error("unexpected output {line:?} ({why})")]
    Unexpected {
        line: String,
        #[source]
        why: airlock_platform_api::launch::NotReadyLine,
    },
    #[error("it exited")]
    Exited,
    #[error(transparent)]
    Read(std::io::Error),
}

/// What a run is refused for before anything of it starts, and what to fix.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{who}: connection {name:?} is not stored (store it with `airlock connections add {name} …`)"
    )]
    NotStored { who: String, name: String },
    #[error("{who}: connection {name:?}: {error}")]
    Envelope {
        who: String,
        name: String,
        error: VaultError,
    },
    #[error(
        "{who}: connection {name:?} is encrypted under key id {kid:?}, which is not configured ({hint})"
    )]
    KeyNotConfigured {
        who: String,
        name: String,
        kid: String,
        hint: String,
    },
    #[error(
        "integration {namespace}: a local MCP runner (source.kind = \"local\") cannot start on the {backend} backend: {why}"
    )]
    RunnerUnsupported {
        namespace: String,
        backend: &'static str,
        why: airlock_sandbox::NoLocalRunners,
    },
    #[error(
        "integration {namespace}: source.command[0] {program:?} is not an executable file (looked for {looked}); a relative path is taken in the agent's directory, a bare name on /usr/local/bin:/usr/bin:/bin"
    )]
    RunnerProgram {
        namespace: String,
        program: String,
        looked: String,
    },
    /// The agent's directory is not a bundle the signature policy accepts
    /// (`AFPS_SIGNATURE_POLICY`).
    #[error("agent bundle refused ({code}): {0}", code = .0.code())]
    Bundle(crate::bundle::BundleRefusal),
    #[error(
        "integration {namespace}: delivery.field = \"${{airlock.identity}}\" needs a platform that issues workload identity: run the agent through `airlock serve`, which publishes the issuer's keys (`airlock run` has no issuer anyone could verify a token against)"
    )]
    NoIdentityIssuer { namespace: String },
    /// The manifest names no model connection, and neither the organization
    /// nor the operator has a key for its provider
    /// ([`crate::provider_keys`]).
    #[error(
        "model: no key for the provider {provider}: name one in model.connection, store the organization's connection {org_connection:?}, or give the operator's in SYSTEM_PROVIDER_KEYS"
    )]
    NoModelKey {
        provider: &'static str,
        org_connection: String,
    },
    /// Airlock's home lies inside the agent's directory (an operator's
    /// `AIRLOCK_HOME` or working directory typo): the sandbox, which sees
    /// the agent's directory, would see the platform's store files and
    /// sockets, and a microVM's copy of the directory would copy itself.
    #[error(
        "the agent's directory {agent} contains Airlock's home {home}: the sandbox would see the platform's store and sockets; set AIRLOCK_HOME outside the agent's directory"
    )]
    HomeInAgentDir { agent: String, home: String },
}

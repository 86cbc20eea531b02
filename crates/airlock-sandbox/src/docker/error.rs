//! Why the docker backend failed: one variant per failing step. An Engine
//! API refusal keeps the daemon's own words ([`ApiError`]).

use std::path::PathBuf;

use super::egress::{ENV_EGRESS_SUBNET, HOST_ROUTES, MAX_EGRESS_PREFIX};
use super::{EGRESS_NETWORK, MIN_API_VERSION};

/// A call of the Engine API that failed, and what it was for.
#[derive(Debug, thiserror::Error)]
#[error("{}", describe(.what, .source))]
pub struct ApiError {
    what: String,
    source: bollard::errors::Error,
}

impl ApiError {
    pub fn new(what: impl Into<String>, source: bollard::errors::Error) -> ApiError {
        ApiError {
            what: what.into(),
            source,
        }
    }
}

/// `what: the daemon answered 409: …` (the daemon's message), or the
/// client's own error.
fn describe(what: &str, e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        } => format!("{what}: the daemon answered {status_code}: {message}"),
        other => format!("{what}: {other}"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("docker at {host}: {source}")]
    Client {
        host: String,
        source: bollard::errors::Error,
    },
    #[error("the docker daemon at {host} does not answer: {source}")]
    NoAnswer {
        host: String,
        source: bollard::errors::Error,
    },
    #[error(
        "the docker daemon at {host} speaks API {major}.{minor}; Airlock needs {MIN_API_VERSION} (Docker 20.10) or later"
    )]
    OldApi {
        host: String,
        major: usize,
        minor: usize,
    },
    #[error("ping: {0}")]
    Ping(#[source] bollard::errors::Error),
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("the docker backend needs a tokio runtime")]
    NoRuntime,
    #[error("cannot start a thread to reach the daemon")]
    NoThread,
    /// `DOCKER_RUNTIME` is gVisor registered without `--host-uds=open`:
    /// its agents could not connect to their sidecar's unix sockets.
    #[error(
        "DOCKER_RUNTIME={runtime} is gVisor ({path}) registered without --host-uds=open: an agent \
         reaches its sidecar only through unix sockets bound into its container, which gVisor \
         refuses by default. Add \"--host-uds=open\" to its \"runtimeArgs\" in \
         /etc/docker/daemon.json and reload dockerd (SIGHUP), or unset DOCKER_RUNTIME (runc)"
    )]
    GvisorWithoutHostSockets { runtime: String, path: String },
    #[error(
        "{EGRESS_NETWORK}'s range {subnet} ({ENV_EGRESS_SUBNET}) overlaps {taken} of {by}: set \
         {ENV_EGRESS_SUBNET} to a free IPv4 range of prefix /{MAX_EGRESS_PREFIX} or wider"
    )]
    EgressSubnetTaken {
        subnet: ipnet::Ipv4Net,
        by: String,
        taken: ipnet::Ipv4Net,
    },
    #[error(
        "{EGRESS_NETWORK} has range {found}, not {want} ({ENV_EGRESS_SUBNET}), and {containers} \
         container(s) attached: it is replaced only once none is (or set {ENV_EGRESS_SUBNET} to \
         {found})"
    )]
    EgressNetworkInUse {
        found: String,
        want: ipnet::Ipv4Net,
        containers: usize,
    },
    #[error("reading the host's routes ({HOST_ROUTES}): {0}")]
    HostRoutes(#[source] std::io::Error),
    #[error("{EGRESS_NETWORK} has no IPv4 gateway")]
    NoGateway,
    #[error("the platform socket cannot be bound")]
    PlatformSocketPath,
    #[error("the egress journal cannot be bound")]
    JournalPath,
    #[error("{} cannot be bound into a container", .0.display())]
    NotBindable(PathBuf),
    /// The container was killed or removed before its start.
    #[error("stopped before it started")]
    Stopped,
    #[error("no docker client")]
    NoClient,
    #[error("stdout taken twice")]
    StdoutTaken,
    #[error("writing the sandbox's resolver file {}: {source}", .path.display())]
    ResolverFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing to {name}'s stdin: {source}")]
    Stdin {
        name: String,
        source: std::io::Error,
    },
}

//! The docker sandbox's part of the transparent plane (the design:
//! `airlock-runtime`'s `transparent` module): the two things the runtime
//! cannot do for itself in a container without a capability.
//!
//! - `/etc/resolv.conf` names the runtime's responder (`127.0.0.53`, on the
//!   container's own loopback) first: a file of the sandbox's host
//!   directory bound read-only over the one Docker writes. Not `--dns`: on
//!   a user-defined network Docker keeps its embedded resolver
//!   (`127.0.0.11`) in the file and only forwards to `--dns` servers, which
//!   an `--internal` network never does. The agent's file names that
//!   embedded resolver second, for the runtime's one name lookup (its
//!   sidecar, `sidecar`), made before the responder listens; a runner's
//!   container has no network and no name to look up: the responder alone.
//! - `net.ipv4.ip_unprivileged_port_start=0`, a sysctl of the container's
//!   own network namespace (Docker allows it on any network but the
//!   host's), so the runtime's unprivileged uid can listen on 53, 80, 443.
//!
//! Only under runc: gVisor's network stack is its own, untried here; there
//! the sandbox stays without the plane, as before.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use airlock_platform_api::transparent::{resolv_conf, resolv_conf_then};

use super::DockerError;

/// Docker's embedded resolver in a container on a user-defined network.
pub const EMBEDDED_RESOLVER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 11);
/// The sysctl that lets an unprivileged uid listen on low ports.
const UNPRIVILEGED_PORT_START: &str = "net.ipv4.ip_unprivileged_port_start";
/// The resolver file's name in the sandbox's host directory.
const RESOLVER_FILE: &str = "resolv.conf";

/// Whether containers under `runtime` (`DOCKER_RUNTIME`) get the plane.
pub fn available(runtime: Option<&str>) -> bool {
    matches!(runtime, None | Some("runc"))
}

/// Who the container's resolver file is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peers {
    /// The agent: its runtime finds its sidecar through Docker's resolver.
    ByName,
    /// A runner: its sidecar is behind unix sockets, nothing to resolve.
    None,
}

/// Writes the resolver file into `dir` (a host directory of the sandbox's
/// own, created if missing) and returns the bind that puts it at
/// `/etc/resolv.conf`.
pub fn resolver_bind(dir: &Path, peers: Peers) -> Result<String, DockerError> {
    let path = resolver_file(dir);
    std::fs::create_dir_all(dir).map_err(|source| DockerError::ResolverFile {
        path: path.clone(),
        source,
    })?;
    let text = match peers {
        Peers::ByName => resolv_conf_then(EMBEDDED_RESOLVER),
        Peers::None => resolv_conf(),
    };
    std::fs::write(&path, text).map_err(|source| DockerError::ResolverFile {
        path: path.clone(),
        source,
    })?;
    Ok(format!("{}:/etc/resolv.conf:ro", super::bindable(&path)?))
}

/// The container's sysctls.
pub fn sysctls() -> HashMap<String, String> {
    HashMap::from([(UNPRIVILEGED_PORT_START.to_owned(), "0".to_owned())])
}

/// The resolver file of a sandbox whose host directory is `dir`.
pub fn resolver_file(dir: &Path) -> PathBuf {
    dir.join(RESOLVER_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_asks_the_responder_first_and_a_runner_only_the_responder() {
        let d = tempfile::tempdir().unwrap();
        let bind = resolver_bind(d.path(), Peers::ByName).unwrap();
        assert!(bind.ends_with(":/etc/resolv.conf:ro"), "{bind}");
        let text = std::fs::read_to_string(resolver_file(d.path())).unwrap();
        let servers: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("nameserver "))
            .collect();
        assert_eq!(servers, ["127.0.0.53", "127.0.0.11"]);
        resolver_bind(d.path(), Peers::None).unwrap();
        let text = std::fs::read_to_string(resolver_file(d.path())).unwrap();
        assert_eq!(text.matches("nameserver ").count(), 1, "{text}");
    }

    #[test]
    fn only_runc_containers_get_the_plane() {
        assert!(available(None));
        assert!(available(Some("runc")));
        assert!(!available(Some("runsc")));
    }
}

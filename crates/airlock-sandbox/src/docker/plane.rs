//! The docker sandbox's part of the transparent plane (the design:
//! `airlock-runtime`'s `transparent` module): the two things the runtime
//! cannot do for itself in a container without a capability.
//!
//! - `/etc/resolv.conf` names the runtime's responder (`127.0.0.53`, on the
//!   container's own loopback) alone: a file beside the sandbox's sockets'
//!   directory (never in it), bound read-only over the one Docker writes.
//!   The container has no network (`--network none`) and its runtime
//!   reaches its sidecar by unix socket: it has no name to look up.
//! - `net.ipv4.ip_unprivileged_port_start=0`, a sysctl of the container's
//!   own network namespace (Docker allows it on any network but the
//!   host's), so the runtime's unprivileged uid can listen on 53, 80, 443.
//!
//! Only under runc: gVisor's network stack is its own, untried here; there
//! the sandbox stays without the plane, as before.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use airlock_platform_api::transparent::resolv_conf;

use super::DockerError;

/// The sysctl that lets an unprivileged uid listen on low ports.
const UNPRIVILEGED_PORT_START: &str = "net.ipv4.ip_unprivileged_port_start";
/// The resolver file's name in the sandbox's host directory.
const RESOLVER_FILE: &str = "resolv.conf";

/// Whether containers under `runtime` (`DOCKER_RUNTIME`) get the plane.
pub fn available(runtime: Option<&str>) -> bool {
    matches!(runtime, None | Some("runc"))
}

/// Writes the resolver file of the sandbox whose sockets' directory is
/// `sockets_dir` ([`resolver_file`]) and returns the bind that puts it at
/// `/etc/resolv.conf`.
pub fn resolver_bind(sockets_dir: &Path) -> Result<String, DockerError> {
    let path = resolver_file(sockets_dir);
    std::fs::write(&path, resolv_conf()).map_err(|source| DockerError::ResolverFile {
        path: path.clone(),
        source,
    })?;
    Ok(format!("{}:/etc/resolv.conf:ro", super::bindable(&path)?))
}

/// The container's sysctls.
pub fn sysctls() -> HashMap<String, String> {
    HashMap::from([(UNPRIVILEGED_PORT_START.to_owned(), "0".to_owned())])
}

/// The resolver file of the sandbox whose sockets' directory is
/// `sockets_dir`: beside it, named for it (`runs/<id>/sock.resolv.conf`),
/// so that the directory the sandbox sees holds its sidecar's two sockets
/// and nothing else.
pub fn resolver_file(sockets_dir: &Path) -> PathBuf {
    let name = sockets_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    sockets_dir.with_file_name(format!("{name}.{RESOLVER_FILE}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_asks_only_the_responder_from_a_file_beside_its_sockets() {
        let d = tempfile::tempdir().unwrap();
        let sockets = d.path().join("sock");
        std::fs::create_dir(&sockets).unwrap();
        let bind = resolver_bind(&sockets).unwrap();
        assert!(bind.ends_with(":/etc/resolv.conf:ro"), "{bind}");
        assert_eq!(resolver_file(&sockets), d.path().join("sock.resolv.conf"));
        let text = std::fs::read_to_string(resolver_file(&sockets)).unwrap();
        let servers: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("nameserver "))
            .collect();
        assert_eq!(servers, ["127.0.0.53"]);
        assert_eq!(std::fs::read_dir(&sockets).unwrap().count(), 0);
    }

    #[test]
    fn only_runc_containers_get_the_plane() {
        assert!(available(None));
        assert!(available(Some("runc")));
        assert!(!available(Some("runsc")));
    }
}

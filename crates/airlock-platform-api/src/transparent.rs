//! The transparent plane's contract between the runtime in a sandbox and
//! the sidecar (the design: `airlock-runtime`'s `transparent` module).
//!
//! - Synthetic addresses come from [`SYNTHETIC_NET`] (`127.18.0.0/16`): inside
//!   loopback's `127.0.0.0/8`, which every Linux network namespace routes to
//!   itself with no privileged step (no address to add, no route, no
//!   iptables), in the namespace backend as in a container. The egress
//!   guard refuses every `127/8` address as a destination, so a synthetic
//!   answer can never be mistaken for a real one upstream.
//! - The responder listens on [`RESPONDER`] (`127.0.0.53:53`, where
//!   systemd-resolved's stub listens, which tools expect of a local stub).
//! - The runtime carries a connection to the sidecar's forward proxy as a
//!   `CONNECT name:port` carrying [`PLANE_HEADER`]`: transparent`: the
//!   sidecar then checks the TLS SNI or HTTP `Host` the client sends against
//!   that name before anything else.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use serde::{Deserialize, Serialize};

/// The first address of the synthetic range (its network address).
pub const SYNTHETIC_NET: Ipv4Addr = Ipv4Addr::new(127, 18, 0, 0);
/// The synthetic range's prefix length.
pub const SYNTHETIC_PREFIX: u8 = 16;
/// The sandbox's DNS responder (`/etc/resolv.conf`'s one nameserver).
pub const RESPONDER: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 53), 53));
/// The header that marks a CONNECT as the transparent plane's.
pub const PLANE_HEADER: &str = "airlock-plane";
/// Its one value.
pub const PLANE_TRANSPARENT: &str = "transparent";
/// The ports a sandbox listens on without a rule naming them.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// Whether `ip` is in the synthetic range.
pub fn is_synthetic(ip: Ipv4Addr) -> bool {
    let mask = u32::MAX << (32 - u32::from(SYNTHETIC_PREFIX));
    u32::from(ip) & mask == u32::from(SYNTHETIC_NET)
}

/// The `/etc/resolv.conf` of a sandbox that has the plane.
pub fn resolv_conf() -> String {
    format!("nameserver {}\noptions ndots:1\n", RESPONDER.ip())
}

/// The plane as the runtime is told of it: the ports it carries (a
/// connection to another port of a synthetic address is refused by the
/// sandbox's kernel, as any closed port).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransparentPlane {
    pub ports: Vec<u16>,
}

impl TransparentPlane {
    /// [`DEFAULT_PORTS`] and each of `named` (the rules' explicit ports),
    /// sorted, once each.
    pub fn with_ports(named: impl IntoIterator<Item = u16>) -> TransparentPlane {
        let mut ports: Vec<u16> = DEFAULT_PORTS.into_iter().chain(named).collect();
        ports.sort_unstable();
        ports.dedup();
        TransparentPlane { ports }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_is_inside_loopback_and_nothing_else() {
        assert!(is_synthetic(Ipv4Addr::new(127, 18, 0, 1)));
        assert!(is_synthetic(Ipv4Addr::new(127, 18, 255, 254)));
        assert!(!is_synthetic(Ipv4Addr::new(127, 0, 0, 1)));
        assert!(!is_synthetic(Ipv4Addr::new(127, 19, 0, 1)));
        assert!(!is_synthetic(Ipv4Addr::new(198, 18, 0, 1)));
        assert!(!is_synthetic(Ipv4Addr::new(127, 0, 0, 53)));
    }

    #[test]
    fn ports_are_the_defaults_and_the_named_once_each() {
        let p = TransparentPlane::with_ports([8443, 443, 8443]);
        assert_eq!(p.ports, vec![80, 443, 8443]);
    }
}

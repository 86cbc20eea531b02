//! The shared egress network's address range (`DOCKER_EGRESS_SUBNET`).
//! Explicit, so that how many sidecars fit on [`EGRESS_NETWORK`] does not
//! follow the daemon's default address pools (which may be /28s: 13
//! sidecars); checked, before the network is created with it, against what
//! this host routes and the daemon's other networks hold.
//!
//! [`EGRESS_NETWORK`]: super::EGRESS_NETWORK

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// The operator's setting of the range.
pub const ENV_EGRESS_SUBNET: &str = "DOCKER_EGRESS_SUBNET";
/// The default: 4,094 addresses, outside Docker's default pools
/// (172.17.0.0/12, 192.168.0.0/16) and the 10.200.0.0/16 of `.ci/docker.sh`.
pub const DEFAULT_EGRESS_SUBNET: &str = "10.213.0.0/20";
/// The narrowest range accepted (254 addresses: the gateway and 253
/// sidecars at once).
pub const MAX_EGRESS_PREFIX: u8 = 24;
/// The widest range accepted.
pub const MIN_EGRESS_PREFIX: u8 = 8;
/// Where the host's IPv4 routes are read (the connected ones cover the
/// host's own addresses).
pub const HOST_ROUTES: &str = "/proc/net/route";

/// The range `v` names: an IPv4 network address with a prefix from
/// [`MIN_EGRESS_PREFIX`] to [`MAX_EGRESS_PREFIX`]; why not, otherwise.
pub fn parse_subnet(v: &str) -> Result<Ipv4Net, String> {
    let net: Ipv4Net = v
        .parse()
        .map_err(|_| format!("{v:?} is not an IPv4 range (e.g. {DEFAULT_EGRESS_SUBNET})"))?;
    if net.trunc() != net {
        return Err(format!(
            "{v:?} is not a network address (its network is {})",
            net.trunc()
        ));
    }
    if !(MIN_EGRESS_PREFIX..=MAX_EGRESS_PREFIX).contains(&net.prefix_len()) {
        return Err(format!(
            "{v:?} has prefix /{}; from /{MIN_EGRESS_PREFIX} to /{MAX_EGRESS_PREFIX} are accepted",
            net.prefix_len()
        ));
    }
    Ok(net)
}

/// A range already in use: whose, and which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub by: String,
    pub net: Ipv4Net,
}

/// The first of `taken` that shares an address with `subnet`.
pub fn first_overlap(subnet: Ipv4Net, taken: &[Taken]) -> Option<&Taken> {
    taken
        .iter()
        .find(|t| t.net.contains(&subnet.network()) || subnet.contains(&t.net.network()))
}

/// The routes of `table` (the text of [`HOST_ROUTES`]), default routes
/// aside (they overlap every range); lines that do not parse are skipped.
pub fn host_routes(table: &str) -> Vec<Taken> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Iface Destination Gateway Flags RefCnt Use Metric Mask …
            let (iface, dest, mask) = (f.first()?, f.get(1)?, f.get(7)?);
            // The kernel prints each address as its in-memory u32.
            let addr = |h: &str| {
                u32::from_str_radix(h, 16)
                    .ok()
                    .map(|n| Ipv4Addr::from(n.to_ne_bytes()))
            };
            let mask = addr(mask)?;
            if mask.is_unspecified() {
                return None;
            }
            let net = Ipv4Net::with_netmask(addr(dest)?, mask).ok()?;
            Some(Taken {
                by: format!("the host's route via {iface}"),
                net: net.trunc(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn taken(by: &str, s: &str) -> Taken {
        Taken {
            by: by.into(),
            net: net(s),
        }
    }

    #[test]
    fn the_default_parses_and_is_a_20() {
        assert_eq!(
            parse_subnet(DEFAULT_EGRESS_SUBNET).unwrap().prefix_len(),
            20
        );
    }

    #[test]
    fn ranges_too_narrow_too_wide_or_not_aligned_are_refused() {
        assert!(parse_subnet("10.1.0.0/24").is_ok());
        assert!(parse_subnet("10.0.0.0/8").is_ok());
        for bad in [
            "10.1.0.0/28",
            "10.0.0.0/7",
            "10.1.0.1/20",
            "fd00::/64",
            "10.1.0.0",
            "x",
        ] {
            assert!(parse_subnet(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_overlap_either_way_is_found_and_neighbours_are_not() {
        let s = net("10.213.0.0/20");
        let within = [taken("a", "10.213.4.0/28")];
        assert_eq!(first_overlap(s, &within), Some(&within[0]));
        let around = [taken("b", "10.0.0.0/8")];
        assert_eq!(first_overlap(s, &around), Some(&around[0]));
        let equal = [taken("c", "10.213.0.0/20")];
        assert_eq!(first_overlap(s, &equal), Some(&equal[0]));
        let beside = [
            taken("d", "10.212.240.0/20"),
            taken("e", "10.213.16.0/20"),
            taken("f", "192.168.0.0/16"),
        ];
        assert_eq!(first_overlap(s, &beside), None);
    }

    #[test]
    fn host_routes_skip_the_default_route() {
        // Written as a little-endian kernel prints it.
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
             eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
             docker0\t0000C80A\t00000000\t0001\t0\t0\t0\tF0FFFFFF\t0\t0\t0\n\
             eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
             garbage\n";
        let routes = host_routes(table);
        if cfg!(target_endian = "little") {
            assert_eq!(
                routes,
                vec![
                    taken("the host's route via docker0", "10.200.0.0/28"),
                    taken("the host's route via eth0", "192.0.2.0/24"),
                ]
            );
        } else {
            assert_eq!(routes.len(), 2);
        }
    }
}

//! The address block table (DESIGN.md §3).
//!
//! Written by hand on purpose: `std`'s `is_global` is unstable and is not an
//! SSRF policy, and no crate carries exactly this table. Every IPv4 spelling
//! (`2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1`) reaches this module already
//! normalised to an `Ipv4Addr` by the WHATWG parser, so the table only ever
//! judges numbers, never text.
//!
//! IPv6 forms that embed an IPv4 address are handled as follows: mapped
//! (`::ffff:a.b.c.d`) is unwrapped and judged by the IPv4 table, because a
//! dual-stack socket really connects to the embedded IPv4 address; every
//! other embedding (IPv4-compatible `::/96`, NAT64 `64:ff9b::/96` and
//! `64:ff9b:1::/48`, 6to4 `2002::/16`, Teredo inside `2001::/23`) is refused
//! outright, whatever it embeds, since the guard cannot know which gateway
//! would translate it to where.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IPv4 ranges, as (network, prefix length, reason).
const V4_BLOCKED: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8, "\"this network\" (0/8)"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private (10/8)"),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        "carrier-grade NAT (100.64/10)",
    ),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback (127/8)"),
    (
        Ipv4Addr::new(169, 254, 0, 0),
        16,
        "link-local / cloud metadata (169.254/16)",
    ),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private (172.16/12)"),
    (
        Ipv4Addr::new(192, 0, 0, 0),
        24,
        "IETF protocol assignments (192.0.0/24)",
    ),
    (
        Ipv4Addr::new(192, 0, 2, 0),
        24,
        "documentation (192.0.2/24)",
    ),
    (Ipv4Addr::new(192, 31, 196, 0), 24, "AS112 (192.31.196/24)"),
    (Ipv4Addr::new(192, 52, 193, 0), 24, "AMT (192.52.193/24)"),
    (
        Ipv4Addr::new(192, 88, 99, 0),
        24,
        "6to4 relay anycast (192.88.99/24)",
    ),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "private (192.168/16)"),
    (
        Ipv4Addr::new(192, 175, 48, 0),
        24,
        "AS112 direct delegation (192.175.48/24)",
    ),
    (Ipv4Addr::new(198, 18, 0, 0), 15, "benchmarking (198.18/15)"),
    (
        Ipv4Addr::new(198, 51, 100, 0),
        24,
        "documentation (198.51.100/24)",
    ),
    (
        Ipv4Addr::new(203, 0, 113, 0),
        24,
        "documentation (203.0.113/24)",
    ),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast (224/4)"),
    (
        Ipv4Addr::new(240, 0, 0, 0),
        4,
        "reserved / broadcast (240/4)",
    ),
    (
        Ipv4Addr::new(168, 63, 129, 16),
        32,
        "Azure WireServer (168.63.129.16)",
    ),
];

/// IPv6 ranges, as (network, prefix length, reason). `::ffff:0:0/96` is not
/// here: mapped addresses are unwrapped first.
const V6_BLOCKED: &[(Ipv6Addr, u8, &str)] = &[
    (Ipv6Addr::UNSPECIFIED, 128, "unspecified (::)"),
    (Ipv6Addr::LOCALHOST, 128, "loopback (::1)"),
    (Ipv6Addr::UNSPECIFIED, 96, "IPv4-compatible (::/96)"),
    (
        Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0),
        96,
        "NAT64 (64:ff9b::/96)",
    ),
    (
        Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0),
        48,
        "local NAT64 (64:ff9b:1::/48)",
    ),
    (
        Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0),
        64,
        "discard-only (100::/64)",
    ),
    (
        Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0),
        23,
        "IETF protocol assignments incl. Teredo, benchmarking, ORCHID (2001::/23)",
    ),
    (
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
        32,
        "documentation (2001:db8::/32)",
    ),
    (
        Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0),
        16,
        "6to4 (2002::/16)",
    ),
    (
        Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0),
        20,
        "documentation (3fff::/20)",
    ),
    (
        Ipv6Addr::new(0x5f00, 0, 0, 0, 0, 0, 0, 0),
        16,
        "SRv6 SIDs (5f00::/16)",
    ),
    (
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
        "unique-local (fc00::/7)",
    ),
    (
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
        10,
        "link-local (fe80::/10)",
    ),
    (
        Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0),
        10,
        "site-local (fec0::/10)",
    ),
    (
        Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0),
        8,
        "multicast (ff00::/8)",
    ),
];

fn v4_in(ip: Ipv4Addr, net: Ipv4Addr, len: u8) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    u32::from(ip) & mask == u32::from(net) & mask
}

fn v6_in(ip: Ipv6Addr, net: Ipv6Addr, len: u8) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    };
    u128::from(ip) & mask == u128::from(net) & mask
}

/// Why `ip` may not be dialled, or `None` when it may.
pub fn blocked_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => blocked_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return blocked_v4(v4).map(|_| "IPv4-mapped address of a blocked IPv4 range");
            }
            V6_BLOCKED
                .iter()
                .find(|(net, len, _)| v6_in(v6, *net, *len))
                .map(|(_, _, why)| *why)
        }
    }
}

fn blocked_v4(ip: Ipv4Addr) -> Option<&'static str> {
    V4_BLOCKED
        .iter()
        .find(|(net, len, _)| v4_in(ip, *net, *len))
        .map(|(_, _, why)| *why)
}

/// True when `ip` may not be dialled.
pub fn is_blocked(ip: IpAddr) -> bool {
    blocked_reason(ip).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_listed_ipv4_range_is_blocked_at_both_ends() {
        for (net, len, _) in V4_BLOCKED {
            let first = u32::from(*net);
            let last = first | if *len == 32 { 0 } else { u32::MAX >> len };
            assert!(is_blocked(IpAddr::V4(first.into())), "{net}/{len} first");
            assert!(is_blocked(IpAddr::V4(last.into())), "{net}/{len} last");
        }
    }

    #[test]
    fn every_listed_ipv6_range_is_blocked_at_both_ends() {
        for (net, len, _) in V6_BLOCKED {
            let first = u128::from(*net);
            let last = first | if *len == 128 { 0 } else { u128::MAX >> len };
            assert!(is_blocked(IpAddr::V6(first.into())), "{net}/{len} first");
            assert!(is_blocked(IpAddr::V6(last.into())), "{net}/{len} last");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for s in [
            "93.184.216.34",
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "198.20.0.1",
            "168.63.129.17",
            "2606:4700:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:93.184.216.34",
        ] {
            assert!(!is_blocked(ip(s)), "{s} should pass");
        }
    }

    #[test]
    fn edges_of_neighbouring_ranges() {
        assert!(is_blocked(ip("172.31.255.255")));
        assert!(!is_blocked(ip("172.32.0.0")));
        assert!(!is_blocked(ip("172.15.255.255")));
        assert!(is_blocked(ip("100.127.255.255")));
        assert!(!is_blocked(ip("100.63.255.255")));
        assert!(is_blocked(ip("198.19.255.255")));
        assert!(!is_blocked(ip("198.17.255.255")));
        assert!(is_blocked(ip("255.255.255.255")));
        assert!(is_blocked(ip("2001:1ff:ffff::1")));
        assert!(!is_blocked(ip("2001:200::1")));
    }

    #[test]
    fn embedded_ipv4_forms() {
        assert!(is_blocked(ip("::ffff:127.0.0.1")));
        assert!(is_blocked(ip("::ffff:169.254.169.254")));
        assert!(is_blocked(ip("::127.0.0.1")));
        assert!(
            is_blocked(ip("::8.8.8.8")),
            "IPv4-compatible is refused whatever it embeds"
        );
        assert!(
            is_blocked(ip("64:ff9b::8.8.8.8")),
            "NAT64 is refused whatever it embeds"
        );
        assert!(is_blocked(ip("2002:7f00:1::")), "6to4 of 127.0.0.1");
        assert!(
            is_blocked(ip("2001:0:4136:e378:8000:63bf:80ff:fffe")),
            "Teredo"
        );
    }
}

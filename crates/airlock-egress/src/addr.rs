//! The address block table (docs/egress.md).
//!
//! Written by hand on purpose: `std`'s `is_global` is unstable and is not an
//! SSRF policy, and no crate carries exactly this table. Every IPv4 spelling
//! (`2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1`) reaches this module already
//! normalised to an `Ipv4Addr` by the WHATWG parser, so the table only ever
//! judges numbers, never text.
//!
//! [`blocked_ranges`] is the table itself, row by row with the RFC or IANA
//! registry each range comes from, so documentation can be generated from it
//! or checked against it. The first row that contains an address decides.
//!
//! IPv6 forms that embed an IPv4 address are handled as follows: mapped
//! (`::ffff:a.b.c.d`) is unwrapped and judged by the IPv4 rows, because a
//! dual-stack socket really connects to the embedded IPv4 address; every
//! other embedding (IPv4-compatible `::/96`, SIIT `::ffff:0:a.b.c.d`, NAT64
//! `64:ff9b::/96` and `64:ff9b:1::/48`, 6to4 `2002::/16`, Teredo inside
//! `2001::/23`) is refused outright, whatever it embeds, since the guard
//! cannot know which gateway would translate it to where. Last come the rows
//! that refuse every IPv6 address outside global unicast `2000::/3`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// What the guard does with an address inside a [`BlockedRange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// Never dialled.
    Block,
    /// Unwrapped: the embedded IPv4 address is judged by the IPv4 rows
    /// (IPv4-mapped IPv6 addresses only).
    JudgeEmbeddedIpv4,
}

/// One row of the block table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockedRange {
    pub net: IpNet,
    /// Where the range is defined: the RFC (and section) or registry.
    pub source: &'static str,
    /// What the range is, as shown in refusal messages.
    pub why: &'static str,
    pub treatment: Treatment,
}

const fn v4(
    [a, b, c, d]: [u8; 4],
    len: u8,
    source: &'static str,
    why: &'static str,
) -> BlockedRange {
    BlockedRange {
        net: IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)),
        source,
        why,
        treatment: Treatment::Block,
    }
}

const fn v6(
    [a, b, c, d, e, f, g, h]: [u16; 8],
    len: u8,
    source: &'static str,
    why: &'static str,
) -> BlockedRange {
    BlockedRange {
        net: IpNet::V6(Ipv6Net::new_assert(
            Ipv6Addr::new(a, b, c, d, e, f, g, h),
            len,
        )),
        source,
        why,
        treatment: Treatment::Block,
    }
}

const OUTSIDE_GLOBAL_UNICAST: &str = "outside global unicast 2000::/3";
const IPV6_ADDRESS_SPACE: &str = "RFC 4291 §2.4; IANA Internet Protocol Version 6 Address Space \
     (only 2000::/3 is allocated as global unicast)";

/// The table: IPv4 rows, then IPv6 rows, in the design's order (docs/egress.md
/// is generated from it), the catch-all rows for IPv6 outside `2000::/3` last.
const TABLE: &[BlockedRange] = &[
    v4(
        [0, 0, 0, 0],
        8,
        "RFC 1122 §3.2.1.3; RFC 6890",
        "\"this network\" (0/8)",
    ),
    v4([10, 0, 0, 0], 8, "RFC 1918", "private (10/8)"),
    v4(
        [100, 64, 0, 0],
        10,
        "RFC 6598",
        "carrier-grade NAT (100.64/10)",
    ),
    v4([127, 0, 0, 0], 8, "RFC 1122 §3.2.1.3", "loopback (127/8)"),
    v4(
        [169, 254, 0, 0],
        16,
        "RFC 3927",
        "link-local / cloud metadata (169.254/16)",
    ),
    v4([172, 16, 0, 0], 12, "RFC 1918", "private (172.16/12)"),
    v4(
        [192, 0, 0, 0],
        24,
        "RFC 6890 §2.1",
        "IETF protocol assignments (192.0.0/24)",
    ),
    v4(
        [192, 0, 2, 0],
        24,
        "RFC 5737 (TEST-NET-1)",
        "documentation (192.0.2/24)",
    ),
    v4([192, 31, 196, 0], 24, "RFC 7535", "AS112 (192.31.196/24)"),
    v4([192, 52, 193, 0], 24, "RFC 7450", "AMT (192.52.193/24)"),
    v4(
        [192, 88, 99, 0],
        24,
        "RFC 3068; RFC 7526",
        "6to4 relay anycast (192.88.99/24)",
    ),
    v4([192, 168, 0, 0], 16, "RFC 1918", "private (192.168/16)"),
    v4(
        [192, 175, 48, 0],
        24,
        "RFC 7534",
        "AS112 direct delegation (192.175.48/24)",
    ),
    v4([198, 18, 0, 0], 15, "RFC 2544", "benchmarking (198.18/15)"),
    v4(
        [198, 51, 100, 0],
        24,
        "RFC 5737 (TEST-NET-2)",
        "documentation (198.51.100/24)",
    ),
    v4(
        [203, 0, 113, 0],
        24,
        "RFC 5737 (TEST-NET-3)",
        "documentation (203.0.113/24)",
    ),
    v4([224, 0, 0, 0], 4, "RFC 5771", "multicast (224/4)"),
    v4(
        [240, 0, 0, 0],
        4,
        "RFC 1112 §4; RFC 919 / RFC 8190 (255.255.255.255 limited broadcast)",
        "reserved / broadcast (240/4)",
    ),
    v4(
        [168, 63, 129, 16],
        32,
        "Microsoft Azure: \"What is IP address 168.63.129.16?\" \
         (learn.microsoft.com/azure/virtual-network/what-is-ip-address-168-63-129-16)",
        "Azure WireServer (168.63.129.16)",
    ),
    v6(
        [0, 0, 0, 0, 0, 0, 0, 0],
        128,
        "RFC 4291 §2.5.2",
        "unspecified (::)",
    ),
    v6(
        [0, 0, 0, 0, 0, 0, 0, 1],
        128,
        "RFC 4291 §2.5.3",
        "loopback (::1)",
    ),
    v6(
        [0, 0, 0, 0, 0, 0, 0, 0],
        96,
        "RFC 4291 §2.5.5.1 (deprecated)",
        "IPv4-compatible (::/96)",
    ),
    BlockedRange {
        net: IpNet::V6(Ipv6Net::new_assert(
            Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0),
            96,
        )),
        source: "RFC 4291 §2.5.5.2",
        why: "IPv4-mapped (::ffff:0:0/96), judged by the IPv4 rows",
        treatment: Treatment::JudgeEmbeddedIpv4,
    },
    v6(
        [0, 0, 0, 0, 0xffff, 0, 0, 0],
        96,
        "RFC 2765 §2.1 (SIIT; obsoleted by RFC 6145, RFC 7915)",
        "SIIT IPv4-translated (::ffff:0:0:0/96)",
    ),
    v6(
        [0x64, 0xff9b, 0, 0, 0, 0, 0, 0],
        96,
        "RFC 6052",
        "NAT64 (64:ff9b::/96)",
    ),
    v6(
        [0x64, 0xff9b, 1, 0, 0, 0, 0, 0],
        48,
        "RFC 8215",
        "local NAT64 (64:ff9b:1::/48)",
    ),
    v6(
        [0x100, 0, 0, 0, 0, 0, 0, 0],
        64,
        "RFC 6666",
        "discard-only (100::/64)",
    ),
    v6(
        [0x100, 0, 0, 1, 0, 0, 0, 0],
        64,
        "RFC 9780; IANA IPv6 Special-Purpose Address Registry",
        "dummy prefix (100:0:0:1::/64)",
    ),
    v6(
        [0x2001, 0, 0, 0, 0, 0, 0, 0],
        23,
        "RFC 2928; Teredo RFC 4380, benchmarking RFC 5180, ORCHIDv2 RFC 7343",
        "IETF protocol assignments incl. Teredo, benchmarking, ORCHID (2001::/23)",
    ),
    v6(
        [0x2001, 0xdb8, 0, 0, 0, 0, 0, 0],
        32,
        "RFC 3849",
        "documentation (2001:db8::/32)",
    ),
    v6(
        [0x2002, 0, 0, 0, 0, 0, 0, 0],
        16,
        "RFC 3056",
        "6to4 (2002::/16)",
    ),
    v6(
        [0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0],
        48,
        "RFC 7534",
        "AS112 direct delegation (2620:4f:8000::/48)",
    ),
    v6(
        [0x3fff, 0, 0, 0, 0, 0, 0, 0],
        20,
        "RFC 9637",
        "documentation (3fff::/20)",
    ),
    v6(
        [0x5f00, 0, 0, 0, 0, 0, 0, 0],
        16,
        "RFC 9602",
        "SRv6 SIDs (5f00::/16)",
    ),
    v6(
        [0xfc00, 0, 0, 0, 0, 0, 0, 0],
        7,
        "RFC 4193",
        "unique-local (fc00::/7)",
    ),
    v6(
        [0xfe80, 0, 0, 0, 0, 0, 0, 0],
        10,
        "RFC 4291 §2.5.6",
        "link-local (fe80::/10)",
    ),
    v6(
        [0xfec0, 0, 0, 0, 0, 0, 0, 0],
        10,
        "RFC 3879 (deprecated)",
        "site-local (fec0::/10)",
    ),
    v6(
        [0xff00, 0, 0, 0, 0, 0, 0, 0],
        8,
        "RFC 4291 §2.7",
        "multicast (ff00::/8)",
    ),
    // `2000::/3` is the only global unicast space; these three rows are its
    // complement (the mapped row above is reached first).
    v6(
        [0, 0, 0, 0, 0, 0, 0, 0],
        3,
        IPV6_ADDRESS_SPACE,
        OUTSIDE_GLOBAL_UNICAST,
    ),
    v6(
        [0x4000, 0, 0, 0, 0, 0, 0, 0],
        2,
        IPV6_ADDRESS_SPACE,
        OUTSIDE_GLOBAL_UNICAST,
    ),
    v6(
        [0x8000, 0, 0, 0, 0, 0, 0, 0],
        1,
        IPV6_ADDRESS_SPACE,
        OUTSIDE_GLOBAL_UNICAST,
    ),
];

/// The number of IPv4 rows at the head of [`TABLE`] (all later rows are
/// IPv6; building [`V6_KEYS`] fails to compile otherwise).
const V4_ROWS: usize = {
    let mut i = 0;
    while i < TABLE.len() && matches!(TABLE[i].net, IpNet::V4(_)) {
        i += 1;
    }
    i
};

const V6_ROWS: usize = TABLE.len() - V4_ROWS;

/// Each IPv4 row as (network bits, mask), computed at compile time so the
/// per-answer scan is one mask-and-compare per row.
const V4_KEYS: [(u32, u32); V4_ROWS] = {
    let mut keys = [(0, 0); V4_ROWS];
    let mut i = 0;
    while i < V4_ROWS {
        let IpNet::V4(n) = TABLE[i].net else {
            panic!("the IPv4 rows come first");
        };
        let len = n.prefix_len() as u32;
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        keys[i] = (n.addr().to_bits() & mask, mask);
        i += 1;
    }
    keys
};

/// Each IPv6 row as (network bits, mask), likewise.
const V6_KEYS: [(u128, u128); V6_ROWS] = {
    let mut keys = [(0, 0); V6_ROWS];
    let mut i = 0;
    while i < V6_ROWS {
        let IpNet::V6(n) = TABLE[V4_ROWS + i].net else {
            panic!("the IPv6 rows come last");
        };
        let len = n.prefix_len() as u32;
        let mask = if len == 0 {
            0
        } else {
            u128::MAX << (128 - len)
        };
        keys[i] = (n.addr().to_bits() & mask, mask);
        i += 1;
    }
    keys
};

/// The block table, row by row, in the order the guard applies it (the
/// first row that contains an address decides).
pub fn blocked_ranges() -> &'static [BlockedRange] {
    TABLE
}

/// The row that refuses `ip` (for a mapped address, the IPv4 row that
/// refuses the embedded address), or `None` when `ip` may be dialled.
pub fn blocking_range(ip: IpAddr) -> Option<&'static BlockedRange> {
    match ip {
        IpAddr::V4(v4) => blocking_v4(v4),
        IpAddr::V6(v6) => {
            let bits = v6.to_bits();
            let i = V6_KEYS.iter().position(|&(net, mask)| bits & mask == net)?;
            let row = TABLE.get(V4_ROWS + i)?;
            match row.treatment {
                Treatment::Block => Some(row),
                // The embedded IPv4 address is the low 32 bits.
                Treatment::JudgeEmbeddedIpv4 => {
                    let [.., a, b, c, d] = v6.octets();
                    blocking_v4(Ipv4Addr::new(a, b, c, d))
                }
            }
        }
    }
}

fn blocking_v4(ip: Ipv4Addr) -> Option<&'static BlockedRange> {
    let bits = ip.to_bits();
    let i = V4_KEYS.iter().position(|&(net, mask)| bits & mask == net)?;
    TABLE.get(i)
}

/// Why `ip` may not be dialled, or `None` when it may.
pub fn blocked_reason(ip: IpAddr) -> Option<&'static str> {
    blocking_range(ip).map(|r| r.why)
}

/// True when `ip` may not be dialled.
pub fn is_blocked(ip: IpAddr) -> bool {
    blocking_range(ip).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn first_and_last(net: IpNet) -> (IpAddr, IpAddr) {
        (net.network(), net.broadcast())
    }

    #[test]
    fn every_blocking_row_is_blocked_at_both_ends() {
        for r in blocked_ranges()
            .iter()
            .filter(|r| r.treatment == Treatment::Block)
        {
            let (first, last) = first_and_last(r.net);
            assert!(is_blocked(first), "{} first", r.net);
            assert!(is_blocked(last), "{} last", r.net);
        }
    }

    #[test]
    fn every_row_is_a_network_with_a_source() {
        for r in blocked_ranges() {
            assert_eq!(r.net, r.net.trunc(), "{} is not a network address", r.net);
            assert!(
                r.source.contains("RFC")
                    || r.source.contains("IANA")
                    || r.source.contains("learn.microsoft.com"),
                "{}: source {:?}",
                r.net,
                r.source
            );
            assert!(!r.why.is_empty());
        }
    }

    /// The design's list of blocked destinations, transcribed: the table holds
    /// exactly these ranges, no more, no fewer. `outside 2000::/3` is the
    /// complement of global unicast: `::/3`, `4000::/2`, `8000::/1`.
    #[test]
    fn table_is_exactly_design_section_3() {
        let design_v4 = "0/8, 10/8, 100.64/10, 127/8, 169.254/16, 172.16/12, 192.0.0/24, \
            192.0.2/24, 192.31.196/24, 192.52.193/24, 192.88.99/24, 192.168/16, 192.175.48/24, \
            198.18/15, 198.51.100/24, 203.0.113/24, 224/4, 240/4, 168.63.129.16";
        let design_v6 = "::, ::1, ::/96, ::ffff:0:0/96, ::ffff:0:0:0/96, 64:ff9b::/96, \
            64:ff9b:1::/48, 100::/64, 100:0:0:1::/64, 2001::/23, 2001:db8::/32, 2002::/16, \
            2620:4f:8000::/48, 3fff::/20, 5f00::/16, fc00::/7, fe80::/10, fec0::/10, ff00::/8, \
            ::/3, 4000::/2, 8000::/1";
        let mut want: Vec<IpNet> = Vec::new();
        for item in design_v4.split(", ") {
            let (a, len) = item.split_once('/').unwrap_or((item, "32"));
            let mut octets: Vec<&str> = a.split('.').collect();
            octets.resize(4, "0");
            want.push(format!("{}/{len}", octets.join(".")).parse().unwrap());
        }
        for item in design_v6.split(", ") {
            let net = if item.contains('/') {
                item.to_owned()
            } else {
                format!("{item}/128")
            };
            want.push(net.parse().unwrap());
        }
        let got: Vec<IpNet> = blocked_ranges().iter().map(|r| r.net).collect();
        assert_eq!(got, want);
        let mapped: Vec<IpNet> = blocked_ranges()
            .iter()
            .filter(|r| r.treatment == Treatment::JudgeEmbeddedIpv4)
            .map(|r| r.net)
            .collect();
        assert_eq!(mapped, vec!["::ffff:0:0/96".parse::<IpNet>().unwrap()]);
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

    /// Issue 10, item 16: ranges of the design that peers block.
    #[test]
    fn siit_dummy_as112_and_non_global_ipv6_are_blocked() {
        for s in [
            "::ffff:0:169.254.169.254", // SIIT IPv4-translated (metadata)
            "::ffff:0:8.8.8.8",         // SIIT, whatever it embeds
            "::ffff:0:0:0",
            "::ffff:0:ffff:ffff",
            "100:0:0:1::",
            "100:0:0:1:ffff:ffff:ffff:ffff",
            "2620:4f:8000::",
            "2620:4f:8000:ffff:ffff:ffff:ffff:ffff",
            "4000::1",
            "fe00::1",
            "1fff:ffff::1",
            "c000::1",
            "8000::",
            "::ffff:1:0:0", // between mapped and SIIT: outside 2000::/3
        ] {
            assert!(is_blocked(ip(s)), "{s} should be blocked");
        }
        // Neighbours inside global unicast stay reachable.
        for s in [
            "2620:4f:7fff:ffff:ffff:ffff:ffff:ffff",
            "2620:4f:8001::1",
            "2000::1",
            "3ffe:ffff::1",
        ] {
            assert!(!is_blocked(ip(s)), "{s} should pass");
        }
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

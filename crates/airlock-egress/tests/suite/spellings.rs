//! Property tests: a blocked address is never allowed, however it is spelled
//! (decimal, octal, hex, short forms, IPv4-mapped, -compatible, NAT64, 6to4,
//! Teredo, SIIT, anything outside global unicast), and a public address in the same spellings is allowed and pinned
//! to exactly that address. The ranges here are written out from docs/egress.md
//! independently of the crate's own table.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use airlock_egress::{
    AuthorizedUris, CallRules, EgressCode, EgressPolicy, Guard, Intent, StaticResolver,
};
use proptest::prelude::*;

const GET: Intent<'static> = Intent::Request(&http::Method::GET);

const V4_RANGES: &[(u32, u8)] = &[
    (0x0000_0000, 8),
    (0x0A00_0000, 8),
    (0x6440_0000, 10),
    (0x7F00_0000, 8),
    (0xA9FE_0000, 16),
    (0xAC10_0000, 12),
    (0xC000_0000, 24),
    (0xC000_0200, 24),
    (0xC01F_C400, 24),
    (0xC034_C100, 24),
    (0xC058_6300, 24),
    (0xC0A8_0000, 16),
    (0xC0AF_3000, 24),
    (0xC612_0000, 15),
    (0xC633_6400, 24),
    (0xCB00_7100, 24),
    (0xE000_0000, 4),
    (0xF000_0000, 4),
    (0xA83F_8110, 32),
];

/// The docs/egress.md IPv6 ranges inside global unicast `2000::/3`.
const V6_GLOBAL_BLOCKED: &[(u128, u8)] = &[
    (0x2001_0000 << 96, 23),
    (0x2001_0db8 << 96, 32),
    (0x2002 << 112, 16),
    (0x2620_004f_8000 << 80, 48),
    (0x3fff << 112, 20),
];

fn in_table(ip: u32) -> bool {
    V4_RANGES.iter().any(|&(net, len)| {
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        ip & mask == net & mask
    })
}

fn blocked_v4() -> impl Strategy<Value = u32> {
    (0..V4_RANGES.len(), any::<u32>()).prop_map(|(i, r)| {
        let (net, len) = V4_RANGES[i];
        let host_bits = if len == 32 { 0 } else { u32::MAX >> len };
        net | (r & host_bits)
    })
}

fn public_v4() -> impl Strategy<Value = u32> {
    any::<u32>().prop_filter("public", |ip| !in_table(*ip))
}

/// Every IPv4 spelling the WHATWG parser accepts for `ip`, plus IPv6 forms.
fn spellings(ip: u32, style: u8) -> String {
    let [a, b, c, d] = ip.to_be_bytes();
    let lo16 = ip & 0xffff;
    let lo24 = ip & 0xff_ffff;
    match style % 12 {
        0 => format!("{a}.{b}.{c}.{d}"),
        1 => format!("{ip}"),
        2 => format!("0{a:o}.0{b:o}.0{c:o}.0{d:o}"),
        3 => format!("0x{a:x}.0x{b:x}.0x{c:x}.0x{d:x}"),
        4 => format!("{a}.{b}.{lo16}"),
        5 => format!("0x{a:X}.{lo24}"),
        6 => format!("0x{ip:08x}"),
        7 => format!("0{ip:o}"),
        8 => format!("[::ffff:{a}.{b}.{c}.{d}]"),
        9 => format!("[::ffff:{:x}:{:x}]", ip >> 16, ip & 0xffff),
        10 => format!("{a}.{b}.{c}.{d}."),
        _ => format!("0x{a:02x}.{b}.0{c:o}.{d}"),
    }
}

fn guard() -> Guard {
    Guard::new(EgressPolicy::new(), Arc::new(StaticResolver::new()))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn blocked_ipv4_is_refused_in_every_spelling(ip in blocked_v4(), style in any::<u8>()) {
        let host = spellings(ip, style);
        let url = format!("http://{host}/x");
        let empty = AuthorizedUris::default();
        let rules = CallRules { authorized: &empty, allow_all_uris: true, credentialed: false };
        let r = runtime().block_on(guard().admit_url(&url, GET, &rules));
        let e = r.expect_err(&url);
        prop_assert!(matches!(e.code, EgressCode::BlockedAddress | EgressCode::InvalidUrl), "{url}: {e}");
        // Every spelling must parse: an allowed outcome is impossible, and a
        // refusal must be for the address, not a parse accident.
        prop_assert_eq!(e.code, EgressCode::BlockedAddress, "{}: {}", url, e);
    }

    #[test]
    fn public_ipv4_is_allowed_and_pinned_in_every_spelling(ip in public_v4(), style in any::<u8>()) {
        let host = spellings(ip, style);
        let url = format!("http://{host}/x");
        let empty = AuthorizedUris::default();
        let rules = CallRules { authorized: &empty, allow_all_uris: true, credentialed: false };
        let a = runtime().block_on(guard().admit_url(&url, GET, &rules)).map_err(|e| TestCaseError::fail(format!("{url}: {e}")))?;
        let want = if style % 12 == 8 || style % 12 == 9 {
            IpAddr::V6(Ipv4Addr::from(ip).to_ipv6_mapped())
        } else {
            IpAddr::V4(Ipv4Addr::from(ip))
        };
        prop_assert_eq!(a.addrs, vec![want]);
    }

    #[test]
    fn ipv6_embeddings_are_refused_whatever_they_embed(ip in any::<u32>(), which in 0u8..6, salt in any::<u16>()) {
        let [a, b, c, d] = ip.to_be_bytes();
        let hi = ip >> 16;
        let lo = ip & 0xffff;
        let host = match which {
            0 => format!("[::{a}.{b}.{c}.{d}]"),                      // IPv4-compatible
            1 => format!("[64:ff9b::{a}.{b}.{c}.{d}]"),              // NAT64
            2 => format!("[64:ff9b:1:{salt:x}::{hi:x}:{lo:x}]"),      // local-use NAT64
            3 => format!("[2002:{hi:x}:{lo:x}:{salt:x}::1]"),          // 6to4
            4 => format!("[::ffff:0:{a}.{b}.{c}.{d}]"),               // SIIT IPv4-translated
            _ => format!("[2001:0:{salt:x}:0:8000:{salt:x}:{:x}:{:x}]", !hi & 0xffff, !lo & 0xffff), // Teredo
        };
        let url = format!("https://{host}/");
        let empty = AuthorizedUris::default();
        let rules = CallRules { authorized: &empty, allow_all_uris: true, credentialed: false };
        let e = runtime().block_on(guard().admit_url(&url, GET, &rules)).expect_err(&url);
        prop_assert_eq!(e.code, EgressCode::BlockedAddress, "{}: {}", url, e);
    }

    /// Only global unicast `2000::/3` may be dialled (mapped addresses are
    /// judged by the IPv4 table, see above).
    #[test]
    fn ipv6_outside_global_unicast_is_refused(bits in any::<u128>()) {
        let top3 = (bits >> 125) as u8;
        prop_assume!(top3 != 0b001);
        let v6 = std::net::Ipv6Addr::from(bits);
        prop_assume!(v6.to_ipv4_mapped().is_none());
        let url = format!("https://[{v6}]/");
        let empty = AuthorizedUris::default();
        let rules = CallRules { authorized: &empty, allow_all_uris: true, credentialed: false };
        let e = runtime().block_on(guard().admit_url(&url, GET, &rules)).expect_err(&url);
        prop_assert_eq!(e.code, EgressCode::BlockedAddress, "{}: {}", url, e);
    }

    /// A global unicast IPv6 address outside every listed range is allowed
    /// and pinned to exactly itself.
    #[test]
    fn public_ipv6_is_allowed_and_pinned(bits in any::<u128>()) {
        let v6 = std::net::Ipv6Addr::from((bits & (u128::MAX >> 3)) | (1u128 << 125));
        prop_assume!(!V6_GLOBAL_BLOCKED.iter().any(|&(net, len)| (u128::from(v6) ^ net) >> (128 - len) == 0));
        let url = format!("https://[{v6}]/");
        let empty = AuthorizedUris::default();
        let rules = CallRules { authorized: &empty, allow_all_uris: true, credentialed: false };
        let a = runtime().block_on(guard().admit_url(&url, GET, &rules)).map_err(|e| TestCaseError::fail(format!("{url}: {e}")))?;
        prop_assert_eq!(a.addrs, vec![IpAddr::V6(v6)]);
    }

    /// The URL policy never panics and never lets a credential through a
    /// caller-chosen host, whatever the pattern and URL.
    #[test]
    fn arbitrary_patterns_and_urls_never_panic(pattern in "\\PC{0,60}", url in "\\PC{0,80}") {
        let list = AuthorizedUris::parse(&[pattern.as_str(), "https://**"]);
        let rules = CallRules { authorized: &list, allow_all_uris: true, credentialed: true };
        let g = Guard::new(EgressPolicy::new(), Arc::new(StaticResolver::new()));
        if let Ok(a) = runtime().block_on(g.admit_url(&url, GET, &rules)) {
            // Only a literal or registrable-domain entry may have allowed it.
            prop_assert!(list.entries().iter().any(|p| p.matches(&a.target) && p.carries_credential_to(&a.target)));
        }
    }
}

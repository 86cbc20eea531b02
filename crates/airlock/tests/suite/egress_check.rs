//! `airlock egress check` driven as an operator or an external suite would:
//! the real binary, its JSON and its exit codes. DNS comes from `--resolve`
//! or from a nameserver this test runs on loopback.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::net::UdpSocket;
use std::process::Command;

use serde_json::Value;

fn airlock(args: &[&str]) -> (i32, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .args(["egress", "check", "--json"])
        .args(args)
        .output()
        .expect("run airlock");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let json = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), json, stderr)
}

fn code_of(args: &[&str]) -> (i32, String) {
    let (exit, json, stderr) = airlock(args);
    let code = json["code"].as_str().unwrap_or("").to_owned();
    assert!(exit == 0 || exit == 1, "exit {exit}: {stderr}");
    (exit, code)
}

#[test]
fn allow_prints_the_pinned_addresses() {
    let (exit, json, _) = airlock(&[
        "--authorized-uri",
        "https://api.github.com/**",
        "--resolve",
        "api.github.com=140.82.112.6,2606:50c0:8000::154",
        "https://API.github.com./repos/x",
    ]);
    assert_eq!(exit, 0, "{json}");
    assert_eq!(json["decision"], "allow");
    assert_eq!(json["code"], Value::Null);
    assert_eq!(
        json["addresses"],
        serde_json::json!(["140.82.112.6", "2606:50c0:8000::154"])
    );
    let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
    assert_eq!(
        keys.len(),
        4,
        "exactly decision, code, message, addresses: {keys:?}"
    );
}

#[test]
fn every_refusal_code_and_its_exit_status() {
    let gh = ["--authorized-uri", "https://api.github.com/**"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["https://exa%6dple.com/"], "invalid_url"),
        (
            vec!["--uncredentialed", "--allow-all-uris", "ftp://example.com/"],
            "invalid_url",
        ),
        ([&gh[..], &["https://evil.com/"]].concat(), "not_authorized"),
        (vec!["https://api.github.com/"], "not_authorized"),
        (
            vec![
                "--authorized-uri",
                "https://*.com/**",
                "--resolve",
                "evil.com=93.184.216.34",
                "https://evil.com/",
            ],
            "credential_exfiltration_refused",
        ),
        (
            vec!["--allow-all-uris", "https://evil.com/"],
            "credential_exfiltration_refused",
        ),
        (
            vec![
                "--authorized-uri",
                "https://*.amazonaws.com/**",
                "https://dynamodb.us-east-1.amazonaws.com/",
            ],
            "credential_exfiltration_refused",
        ),
        (
            vec![
                "--uncredentialed",
                "--allow-all-uris",
                "--allow-internal-host",
                "localhost",
                "http://localhost:8080/",
            ],
            "blocked_host",
        ),
        (
            vec![
                "--uncredentialed",
                "--allow-all-uris",
                "http://metadata.google.internal/",
            ],
            "blocked_host",
        ),
        (
            vec![
                "--uncredentialed",
                "--allow-all-uris",
                "http://169.254.169.254/latest/",
            ],
            "blocked_address",
        ),
        (
            vec!["--uncredentialed", "--allow-all-uris", "http://2130706433/"],
            "blocked_address",
        ),
        (
            vec![
                "--uncredentialed",
                "--allow-all-uris",
                "http://[::ffff:10.0.0.1]/",
            ],
            "blocked_address",
        ),
        (
            vec![
                "--uncredentialed",
                "--allow-all-uris",
                "--resolve",
                "rebind.test=93.184.216.34,10.1.2.3",
                "http://rebind.test/",
            ],
            "blocked_address",
        ),
    ];
    for (args, want) in cases {
        let (exit, code) = code_of(&args);
        assert_eq!(exit, 1, "{args:?}");
        assert_eq!(code, want, "{args:?}");
    }
}

#[test]
fn internal_hosts_need_the_flag_and_a_literal_entry() {
    let base = ["--resolve", "db.internal=10.0.0.7"];
    let (exit, code) = code_of(
        &[
            &base[..],
            &[
                "--authorized-uri",
                "http://db.internal:5000/**",
                "http://db.internal:5000/x",
            ],
        ]
        .concat(),
    );
    assert_eq!((exit, code.as_str()), (1, "blocked_address"), "entry alone");
    let (exit, code) = code_of(
        &[
            &base[..],
            &[
                "--allow-internal-host",
                "db.internal",
                "--authorized-uri",
                "http://*.internal:5000/**",
                "--uncredentialed",
                "http://db.internal:5000/x",
            ],
        ]
        .concat(),
    );
    assert_eq!(
        (exit, code.as_str()),
        (1, "blocked_address"),
        "operator flag with a wildcard entry"
    );
    let (exit, json, _) = airlock(
        &[
            &base[..],
            &[
                "--allow-internal-host",
                "db.internal",
                "--authorized-uri",
                "http://db.internal:5000/**",
                "http://db.internal:5000/x",
            ],
        ]
        .concat(),
    );
    assert_eq!(exit, 0, "{json}");
    assert_eq!(json["addresses"], serde_json::json!(["10.0.0.7"]));
}

#[test]
fn usage_errors_exit_two() {
    for args in [
        vec![],
        vec!["--resolve", "nonsense", "https://a.com/"],
        vec!["--resolve", "a.com=not-an-ip", "https://a.com/"],
        vec!["--dns-server", "x", "https://a.com/"],
        vec!["--credentialed", "--uncredentialed", "https://a.com/"],
    ] {
        let (exit, _, _) = airlock(&args);
        assert_eq!(exit, 2, "{args:?}");
    }
}

#[test]
fn entries_that_match_nothing_are_reported() {
    let (_, _, stderr) = airlock(&[
        "--authorized-uri",
        "https://0x7f.1/**",
        "--authorized-uri",
        "https://a.com\\@b.com/",
        "https://a.com/",
    ]);
    assert!(
        stderr.contains("0x7f.1") && stderr.contains("matches nothing"),
        "{stderr}"
    );
    assert!(
        stderr.contains("a.com\\\\@b.com") || stderr.contains("a.com\\@b.com"),
        "{stderr}"
    );
}

/// A nameserver on loopback: `name` answers `ip`, every other name NXDOMAIN.
pub(crate) fn nameserver(name: &'static str, ip: std::net::IpAddr) -> std::net::SocketAddr {
    nameserver_answering(move |q| (q == name).then_some(ip))
}

/// A nameserver on loopback answering each question (a lowercase name
/// without its trailing dot) with `answer`'s address, `None`: NXDOMAIN.
pub(crate) fn nameserver_answering(
    answer: impl Fn(&str) -> Option<std::net::IpAddr> + Send + 'static,
) -> std::net::SocketAddr {
    use hickory_proto::op::{Message, ResponseCode};
    use hickory_proto::rr::{RData, Record, RecordType};
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, peer)) = sock.recv_from(&mut buf) {
            let Ok(req) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
            resp.metadata.recursion_available = true;
            for q in &req.queries {
                resp.add_query(q.clone());
                let qname = q
                    .name()
                    .to_ascii()
                    .trim_end_matches('.')
                    .to_ascii_lowercase();
                let Some(ip) = answer(&qname) else {
                    resp.metadata.response_code = ResponseCode::NXDomain;
                    continue;
                };
                let fits = matches!(
                    (q.query_type(), ip),
                    (RecordType::A, std::net::IpAddr::V4(_))
                        | (RecordType::AAAA, std::net::IpAddr::V6(_))
                );
                if fits {
                    resp.add_answer(Record::from_rdata(q.name().clone(), 0, RData::from(ip)));
                }
            }
            let _ = sock.send_to(&resp.to_vec().unwrap(), peer);
        }
    });
    addr
}

#[test]
fn nameserver_answers_are_judged() {
    let good = nameserver("api.example.com", "93.184.216.34".parse().unwrap());
    let bad = nameserver("api.example.com", "192.168.1.1".parse().unwrap());
    let args = |ns: &std::net::SocketAddr| {
        vec![
            "--authorized-uri".to_owned(),
            "https://api.example.com/**".to_owned(),
            "--dns-server".to_owned(),
            ns.to_string(),
            "https://api.example.com/v1".to_owned(),
        ]
    };
    let a = args(&good);
    let (exit, json, _) = airlock(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(exit, 0, "{json}");
    assert_eq!(json["addresses"], serde_json::json!(["93.184.216.34"]));
    let b = args(&bad);
    let (exit, code) = code_of(&b.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!((exit, code.as_str()), (1, "blocked_address"));
    let (exit, code) = code_of(&[
        "--authorized-uri",
        "https://nope.example.com/**",
        "--dns-server",
        &good.to_string(),
        "https://nope.example.com/",
    ]);
    assert_eq!((exit, code.as_str()), (1, "unresolvable"));
    // --resolve wins over the nameserver for its host: no lookup is made.
    let (exit, json, _) = airlock(&[
        "--authorized-uri",
        "https://api.example.com/**",
        "--dns-server",
        &bad.to_string(),
        "--resolve",
        "api.example.com=93.184.216.35",
        "https://api.example.com/",
    ]);
    assert_eq!(exit, 0, "{json}");
    assert_eq!(json["addresses"], serde_json::json!(["93.184.216.35"]));
}

/// Issue 10, item 16: SIIT, the dummy prefix, AS112 and IPv6 outside global
/// unicast are refused before any lookup or connection; a global unicast
/// neighbour is still allowed.
#[test]
fn siit_and_non_global_ipv6_are_refused() {
    for url in [
        "http://[::ffff:0:169.254.169.254]/latest/meta-data/",
        "http://[::ffff:0:a9fe:a9fe]/",
        "http://[100:0:0:1::1]/",
        "http://[2620:4f:8000::1]/",
        "http://[4000::1]/",
        "http://[fe00::1]/",
    ] {
        let (exit, code) = code_of(&["--uncredentialed", "--allow-all-uris", url]);
        assert_eq!((exit, code.as_str()), (1, "blocked_address"), "{url}");
    }
    let (exit, json, _) = airlock(&[
        "--uncredentialed",
        "--allow-all-uris",
        "http://[2620:4f:8001::1]/",
    ]);
    assert_eq!(exit, 0, "{json}");
    assert_eq!(json["addresses"], serde_json::json!(["2620:4f:8001::1"]));
}

/// Issue 10, item 17: a name with `_` in a label is asked of the nameserver
/// and its answers judged like any other.
#[test]
fn nameserver_resolves_names_with_underscores() {
    for name in ["llm_svc", "foo_bar.example.com"] {
        let good = nameserver(name, "93.184.216.34".parse().unwrap());
        let url = format!("https://{name}/v1");
        let entry = format!("https://{name}/**");
        let (exit, json, _) = airlock(&[
            "--authorized-uri",
            &entry,
            "--dns-server",
            &good.to_string(),
            &url,
        ]);
        assert_eq!(exit, 0, "{name}: {json}");
        assert_eq!(json["addresses"], serde_json::json!(["93.184.216.34"]));
        let bad = nameserver(name, "169.254.169.254".parse().unwrap());
        let (exit, code) = code_of(&[
            "--authorized-uri",
            &entry,
            "--dns-server",
            &bad.to_string(),
            &url,
        ]);
        assert_eq!((exit, code.as_str()), (1, "blocked_address"), "{name}");
    }
}

/// The machine's own host name, when `/etc/hosts` lists it: the system
/// resolver then answers it from that file, without any network.
fn hostname_in_etc_hosts() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_ascii_lowercase();
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap();
    let listed = hosts.lines().any(|l| {
        let l = l.split('#').next().unwrap_or("");
        l.split_whitespace()
            .skip(1)
            .any(|n| n.eq_ignore_ascii_case(&name))
    });
    assert!(
        listed && !name.is_empty() && name != "localhost",
        "this test needs the machine's host name ({name:?}) in /etc/hosts, so that the \
         system resolver answers it without the network"
    );
    name
}

/// Issue 10, item 18: an operator-trusted internal host is resolved by the
/// system resolver (here: /etc/hosts) even with --dns-server, its addresses
/// are not judged, and they are the ones pinned; without the operator's
/// opt-in the same name goes to the nameserver and is judged.
#[test]
fn trusted_internal_host_uses_the_system_resolver() {
    use std::net::ToSocketAddrs;
    let host = hostname_in_etc_hosts();
    let mut want: Vec<String> = (host.as_str(), 0)
        .to_socket_addrs()
        .unwrap()
        .map(|a| a.ip().to_string())
        .collect();
    want.sort();
    want.dedup();
    assert!(!want.is_empty());
    // The nameserver knows only another name: it answers NXDOMAIN for host.
    let ns = nameserver("other.example.com", "93.184.216.34".parse().unwrap());
    let entry = format!("http://{host}:5000/**");
    let url = format!("http://{host}:5000/x");
    let (exit, json, _) = airlock(&[
        "--allow-internal-host",
        &host,
        "--authorized-uri",
        &entry,
        "--dns-server",
        &ns.to_string(),
        &url,
    ]);
    assert_eq!(exit, 0, "{json}");
    let mut got: Vec<String> = json["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    got.sort();
    assert_eq!(got, want);
    // Without the opt-in: the guard's own resolver, which does not know it.
    let (exit, code) = code_of(&[
        "--authorized-uri",
        &entry,
        "--dns-server",
        &ns.to_string(),
        &url,
    ]);
    assert_eq!((exit, code.as_str()), (1, "unresolvable"));
    // Opt-in, but the entry does not name the host literally.
    let (exit, code) = code_of(&[
        "--allow-internal-host",
        &host,
        "--authorized-uri",
        "http://*:5000/**",
        "--uncredentialed",
        "--dns-server",
        &ns.to_string(),
        &url,
    ]);
    assert_eq!((exit, code.as_str()), (1, "unresolvable"));
}

/// Issue 10, item 19: literal path parts of a pattern are canonicalised the
/// way the parser canonicalises a target's path.
#[test]
fn pattern_paths_are_canonicalised_like_targets() {
    let resolve = ["--resolve", "a.com=93.184.216.34"];
    for (entry, url) in [
        ("https://a.com/v1/{id}", "https://a.com/v1/%7Bid%7D"),
        ("https://a.com/v1/{id}", "https://a.com/v1/{id}"),
        ("https://a.com/v1/a b", "https://a.com/v1/a%20b"),
        ("https://a.com/v1/a b/*/**", "https://a.com/v1/a%20b/x/y?z"),
    ] {
        let (exit, json, stderr) =
            airlock(&[&resolve[..], &["--authorized-uri", entry, url]].concat());
        assert_eq!(exit, 0, "{entry} vs {url}: {json} {stderr}");
    }
    for (entry, url) in [
        ("https://a.com/v1/{id}", "https://a.com/v1/id"),
        ("https://a.com/v1/a b", "https://a.com/v1/a+b"),
        ("https://a.com/v1/a b", "https://a.com/v1/a%2520b"),
    ] {
        let (exit, code) = code_of(&[&resolve[..], &["--authorized-uri", entry, url]].concat());
        assert_eq!(
            (exit, code.as_str()),
            (1, "not_authorized"),
            "{entry} vs {url}"
        );
    }
}

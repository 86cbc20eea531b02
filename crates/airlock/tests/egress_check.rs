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
fn nameserver(name: &'static str, ip: std::net::IpAddr) -> std::net::SocketAddr {
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
                if qname != name {
                    resp.metadata.response_code = ResponseCode::NXDomain;
                    continue;
                }
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

//! Operator proxies through a real `airlock serve`: an organization that
//! chose one of `SYSTEM_PROXIES` gets its run's `api_call` through that
//! proxy, another organization's through `PROXY_URL`; each run records
//! which (by name, never a URL); a name not offered is refused; a proxy's
//! credentials reach the proxy and nowhere else (the server's log, the
//! API's answers). Every proxy and upstream is this test's, on 127.0.0.1.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::serve::{Recorder, Server, base_env, create_org, mcp_agent, run_agent_once};

/// The agent: one `api_call` of the integration `up` to the prompt's URL.
const AGENT_REST: &str = r#"
out = mcp("tools/call", {"name": "up__api_call", "arguments": {"target": UPSTREAM + "/hello"}})
print("ANSWER " + json.dumps(out), flush=True)
"#;

const PASSWORD: &str = "PROXY-A-SECRET-PW";

/// A loopback `CONNECT` proxy: records each request line and its
/// `Proxy-Authorization`, then tunnels to the address asked.
fn connect_proxy() -> Recorder {
    Recorder::start("proxy-authorization", tunnel)
}

fn tunnel(mut c: TcpStream, first: &str, _: &str) {
    let Some(target) = first.split(' ').nth(1) else {
        return;
    };
    let Ok(mut up) = TcpStream::connect(target) else {
        let _ = c.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
        return;
    };
    let _ = c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
    c.set_read_timeout(None).ok();
    let (mut c2, mut up2) = (c.try_clone().unwrap(), up.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut c2, &mut up2);
        let _ = up2.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut up, &mut c);
    let _ = c.shutdown(std::net::Shutdown::Write);
}

/// A loopback upstream answering every request with `hello`.
fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            c.set_read_timeout(Some(Duration::from_secs(10))).ok();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && c.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = c.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
            );
        }
    });
    addr
}

/// Runs the agent once for the key's organization; the run, and its logs.
fn run_once(s: &Server, key: &str, upstream: SocketAddr) -> (Value, String) {
    let manifest = format!(
        "[agent]\nname = \"prox\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 60\n\n\
         [network]\negress = \"none\"\n\n[[integrations]]\nnamespace = \"up\"\n\
         authorized_uris = [\"http://{upstream}/**\"]\n"
    );
    let prompt = format!("http://{upstream}");
    run_agent_once(s, key, ("prox", &manifest), &mcp_agent(AGENT_REST), &prompt)
}

#[test]
fn an_organizations_proxy_carries_its_runs_and_another_goes_through_proxy_url() {
    let home = tempfile::Builder::new()
        .prefix("airlock-proxies-")
        .tempdir()
        .unwrap();
    let (a, b, default) = (connect_proxy(), connect_proxy(), connect_proxy());
    let up = upstream();
    let mut env = base_env(home.path(), None);
    env.push(("PROXY_URL".into(), format!("http://{}", default.addr)));
    env.push((
        "SYSTEM_PROXIES".into(),
        json!({
            "a": format!("http://user:{PASSWORD}@{}", a.addr),
            "b": format!("http://{}", b.addr),
        })
        .to_string(),
    ));
    // The proxy is the sidecar's, the same under every backend: the
    // process backend keeps the test independent of the host's sandboxes.
    let s = Server::start(&env, "process", home.path().join("serve.log"));
    let (_, acme) = create_org(&env, "Acme", &[]);
    let (_, other) = create_org(&env, "Other", &[]);

    // The names offered; a name not offered is refused, the choice kept.
    let (st, v) = s.call("GET", "/v1/org/proxy", Some(&acme), None);
    assert_eq!(
        (st, v.clone()),
        (200, json!({"offered": ["a", "b"], "proxy": null}))
    );
    let (st, v) = s.call(
        "PUT",
        "/v1/org/proxy",
        Some(&acme),
        Some(&json!({"proxy": "nope"})),
    );
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (422, Some("invalid")),
        "{v}"
    );
    assert!(!v.to_string().contains(PASSWORD), "{v}");
    let (st, v) = s.call(
        "PUT",
        "/v1/org/proxy",
        Some(&acme),
        Some(&json!({"proxy": "a"})),
    );
    assert_eq!((st, v["proxy"].as_str()), (200, Some("a")), "{v}");
    assert!(!v.to_string().contains(PASSWORD), "{v}");

    // Acme's run goes through a, with a's credentials, to the pinned address.
    let (run, logs) = run_once(&s, &acme, up);
    assert!(logs.contains("hello"), "{logs}");
    assert_eq!(run["proxy"], "a", "{run}");
    let seen = a.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, format!("CONNECT {up} HTTP/1.1"));
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{PASSWORD}"));
    assert_eq!(seen[0].1, format!("Basic {basic}"));
    assert!(default.seen().is_empty() && b.seen().is_empty());

    // Another organization's run goes through PROXY_URL.
    let (run, logs) = run_once(&s, &other, up);
    assert!(logs.contains("hello"), "{logs}");
    assert_eq!(run["proxy"], "PROXY_URL", "{run}");
    assert_eq!(default.seen().len(), 1);
    assert_eq!(a.seen().len(), 1, "the other organization's run used a");

    // The credentials are nowhere but on the wire to a.
    let log = s.log_text();
    assert!(!log.contains(PASSWORD), "a proxy's password was logged");
    assert!(!log.contains(&basic), "a proxy's credentials were logged");
    for key in [&acme, &other] {
        let (_, runs) = s.call("GET", "/v1/runs", Some(key), None);
        assert!(!runs.to_string().contains(PASSWORD), "{runs}");
    }
}

//! The transparent plane in a real namespace run: tools that ignore the
//! proxy variables (a Go program, a Node program, `git clone` over https)
//! reach what the run's rules allow through the sandbox's resolver and the
//! sidecar's one guard, and nothing else; every success and refusal is in
//! the egress log. Also: the sandbox's answers never change (no DNS
//! rebinding), a name the guard's resolver (the test's own, on loopback)
//! answers with a blocked address is refused, literal addresses and UDP
//! reach nothing, and a TLS SNI that is not the name its address was
//! issued for is refused before any upstream is dialled. Plain HTTP named
//! by its `Host` is judged as the proxy judges plain HTTP (its method and
//! URL), allowed and refused. A local MCP runner that ignores its proxy
//! reaches its own allowlist through its sandbox's plane, and only that.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::tls::{TestCa, acceptor_for, serve_https, test_ca};
use crate::support::*;

/// The upstream's address (an operator-allowed internal host).
const UPSTREAM_IP: &str = "127.0.0.2";

/// An HTTPS upstream for `names` on [`UPSTREAM_IP`]: `/repo.git/…` are the
/// files of the bare repository `repo` (git's dumb protocol), every other
/// path is echoed; each request's path is logged.
async fn upstream(names: &[&str], ca: &TestCa, repo: PathBuf) -> (u16, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind(format!("{UPSTREAM_IP}:0")).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = log.clone();
    serve_https(l, acceptor_for(names, ca), move |req| {
        let path = req.uri().path().to_owned();
        seen.lock().unwrap().push(path.clone());
        let (status, body) = match path.strip_prefix("/repo.git/") {
            Some(rel) if !rel.split('/').any(|c| c == ".." || c.is_empty()) => {
                match std::fs::read(repo.join(rel)) {
                    Ok(b) => (200, b),
                    Err(_) => (404, vec![]),
                }
            }
            Some(_) => (404, vec![]),
            None => (200, json!({"path": path}).to_string().into_bytes()),
        };
        Response::builder()
            .status(status)
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    });
    (port, log)
}

/// A plain-HTTP upstream on [`UPSTREAM_IP`]: every request is answered
/// `plain:<path>` and its path logged in `log`.
async fn plain_upstream(log: Arc<Mutex<Vec<String>>>) -> u16 {
    let l = TcpListener::bind(format!("{UPSTREAM_IP}:0")).await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let path = req.uri().path().to_owned();
                    log.lock().unwrap().push(path.clone());
                    let body = Full::new(Bytes::from(format!("plain:{path}")));
                    async move { Ok::<_, std::convert::Infallible>(Response::new(body)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    port
}

/// A bare repository with one commit (README: `hello transparent`),
/// ready for git's dumb http protocol.
fn bare_repo(dir: &Path) -> PathBuf {
    let git = |args: &[&str], cwd: &Path| {
        let o = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(cwd)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&["init", "-q", "-b", "main"], &work);
    std::fs::write(work.join("README"), "hello transparent\n").unwrap();
    git(&["add", "README"], &work);
    git(&["commit", "-q", "-m", "one"], &work);
    git(&["clone", "-q", "--bare", "work", "repo.git"], dir);
    let bare = dir.join("repo.git");
    git(&["update-server-info"], &bare);
    bare
}

/// A UDP peer on the host's loopback counting what reaches it.
fn udp_peer() -> (u16, Arc<AtomicUsize>) {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sock.local_addr().unwrap().port();
    let got = Arc::new(AtomicUsize::new(0));
    let count = got.clone();
    std::thread::spawn(move || {
        let mut b = [0u8; 512];
        while sock.recv_from(&mut b).is_ok() {
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, got)
}

/// The lines of a client's output, by URL.
fn lines(out: &Value) -> Vec<String> {
    out["out"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn tools_that_ignore_the_proxy_reach_what_the_rules_allow_and_only_that() {
    if !namespace_available() {
        return;
    }
    let Some(node) = crate::sandbox_host::node() else {
        return;
    };
    let ca = test_ca();
    let scratch = tempfile::tempdir().unwrap();
    let repo = bare_repo(scratch.path());
    let (port, seen) = upstream(&["api.test", "git.test"], &ca, repo).await;
    let plain_seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let plain_port = plain_upstream(plain_seen.clone()).await;
    let (udp_port, udp_got) = udp_peer();
    // The guard's own resolver: the test's, on loopback. `rebind.test`
    // answers differently each time; every answer is a blocked address.
    let asked = Arc::new(AtomicUsize::new(0));
    let dns = crate::egress_check::nameserver_answering(move |q| match q {
        "rebind.test" => Some(match asked.fetch_add(1, Ordering::SeqCst) % 2 {
            0 => UPSTREAM_IP.parse().unwrap(),
            _ => "10.0.0.1".parse().unwrap(),
        }),
        "blocked.test" => Some("169.254.169.254".parse().unwrap()),
        _ => None,
    });
    let url = |host: &str, path: &str| format!("https://{host}:{port}{path}");
    let plain = |host: &str, path: &str| format!("http://{host}:{plain_port}{path}");
    let rules: Vec<String> = ["api.test", "git.test", "rebind.test", "blocked.test"]
        .iter()
        .map(|h| format!("\"{}\"", url(h, "/**")))
        .chain([format!("\"{}\"", plain("api.test", "/plain/**"))])
        .collect();
    let run = RealRun::with_manifest(
        include_str!("../agents/transparent.py"),
        &format!(
            "[agent]\nname = \"transparent\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 240\n\n\
             [network]\negress = [{}]\n",
            rules.join(", ")
        ),
    )
    .env("EGRESS_RESOLVE", &format!("api.test={UPSTREAM_IP};git.test={UPSTREAM_IP}"))
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", "api.test,git.test")
    .env("AIRLOCK_DNS_SERVER", &dns.to_string());
    std::fs::write(run.agent_dir.join("test-ca.pem"), ca.issuer.pem()).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/transparent.js"),
        run.agent_dir.join("transparent.js"),
    )
    .unwrap();
    if !crate::sandbox_host::go_build("transparent.go", &run.agent_dir.join("probe-go")) {
        return;
    }
    let targets = |tool: &str| -> Vec<String> {
        ["api.test", "other.test", "blocked.test", "rebind.test"]
            .iter()
            .map(|h| url(h, &format!("/{tool}")))
            .collect()
    };
    // Plain HTTP: a covered path, another path of the same host, another host.
    let plain_targets = |tool: &str| -> Vec<String> {
        vec![
            plain("api.test", &format!("/plain/{tool}")),
            plain("api.test", &format!("/elsewhere/{tool}")),
            plain("other.test", &format!("/plain/{tool}")),
        ]
    };
    let args = json!({
        "urls": {
            "go": targets("go"),
            "node": targets("node"),
            "go_plain": plain_targets("go"),
            "node_plain": plain_targets("node"),
        },
        "node": node,
        "repo": url("git.test", "/repo.git"),
        "port": port,
        "upstream_ip": UPSTREAM_IP,
        "udp_port": udp_port,
    });
    std::fs::write(run.agent_dir.join("args.json"), args.to_string()).unwrap();

    let (out, report) = tokio::task::spawn_blocking(move || {
        let r = run.run("namespace");
        drop(run);
        r
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(report["status"], "succeeded", "{report}\n{stderr}");
    let r = &report["result"];
    assert!(
        r["resolv"]
            .as_str()
            .unwrap()
            .contains("nameserver 127.0.0.53"),
        "{r}"
    );

    // Go and Node: the allowed name answers; the others are refused.
    for tool in ["go", "node"] {
        let got = lines(&r[tool]);
        assert_eq!(got.len(), 4, "{tool}: {}", r[tool]);
        assert!(
            got[0].starts_with(&format!("{} 200 ", url("api.test", &format!("/{tool}")))),
            "{tool}: {got:?}"
        );
        assert!(
            got[0].contains(&format!("\"path\":\"/{tool}\"")),
            "{tool}: {got:?}"
        );
        for refused in &got[1..] {
            assert!(refused.contains(" ERR "), "{tool}: {refused}");
        }
    }
    // Plain HTTP: the covered path answers; the others are the proxy's 403.
    for tool in ["go_plain", "node_plain"] {
        let got = lines(&r[tool]);
        let short = tool.trim_end_matches("_plain");
        assert_eq!(got.len(), 3, "{tool}: {}", r[tool]);
        assert_eq!(
            got[0],
            format!(
                "{} 200 plain:/plain/{short}",
                plain("api.test", &format!("/plain/{short}"))
            ),
            "{tool}: {got:?}"
        );
        for refused in &got[1..] {
            assert!(refused.contains(" 403 "), "{tool}: {refused}");
            assert!(refused.contains("not_authorized"), "{tool}: {refused}");
        }
    }
    assert_eq!(
        plain_seen.lock().unwrap().clone(),
        ["/plain/go", "/plain/node"]
    );
    // git clone over https, dumb protocol: the repository arrived.
    assert_eq!(r["git"]["code"], 0, "{}", r["git"]);
    assert_eq!(r["git"]["readme"], "hello transparent\n");

    // The sandbox's answers are synthetic and never change.
    let addrs = r["rebind_addrs"].as_array().unwrap();
    assert!(addrs.iter().all(|a| a == &addrs[0]), "{addrs:?}");
    assert!(
        addrs[0].as_str().unwrap().starts_with("127.18."),
        "{addrs:?}"
    );
    assert!(
        r["api_addr"].as_str().unwrap().starts_with("127.18."),
        "{r}"
    );

    // SNI: the issued name passes, another name on its address is refused.
    assert!(
        r["sni_match"]["ok"]
            .as_str()
            .unwrap_or_default()
            .starts_with("HTTP/1.1 200"),
        "{r}"
    );
    assert!(r["sni_mismatch"]["error"].is_string(), "{r}");
    // Literal addresses reach nothing: an unissued synthetic one is closed,
    // the upstream's own is the sandbox's loopback, a public one has no route.
    assert!(r["literal_synthetic"]["error"].is_string(), "{r}");
    assert!(r["literal_upstream"]["error"].is_string(), "{r}");
    assert_ne!(r["literal_public"], "connected", "{r}");
    // UDP: nothing arrived at the host's peer.
    assert_eq!(udp_got.load(Ordering::SeqCst), 0, "{}", r["udp"]);

    // The upstream saw exactly the allowed requests.
    let seen = seen.lock().unwrap().clone();
    for path in ["/go", "/node", "/sni"] {
        assert_eq!(
            seen.iter().filter(|p| *p == path).count(),
            1,
            "{path}: {seen:?}"
        );
    }
    assert!(seen.iter().any(|p| p.starts_with("/repo.git/")), "{seen:?}");

    // One egress log: each success and refusal, as the proxy records them.
    let entries = report["egress"]["entries"].as_array().unwrap();
    let of = |host: &str, decision: &str| -> Vec<&Value> {
        egress_to(&report, host, port)
            .into_iter()
            .filter(|e| e["decision"] == decision)
            .collect()
    };
    // Go, Node and the matching SNI; git's own connections.
    assert_eq!(of("api.test", "allowed").len(), 3, "{entries:#?}");
    assert!(!of("git.test", "allowed").is_empty(), "{entries:#?}");
    for e in entries {
        assert_eq!(e["source"], "proxy", "{e}");
        assert_eq!(e["plane"], "transparent", "{e}");
    }
    let plain_of = |host: &str, decision: &str| -> Vec<String> {
        egress_to(&report, host, plain_port)
            .into_iter()
            .filter(|e| e["decision"] == decision)
            .map(|e| {
                format!(
                    "{} {}",
                    e["method"].as_str().unwrap(),
                    e["url"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(
        plain_of("api.test", "allowed"),
        [
            format!("GET {}", plain("api.test", "/plain/go")),
            format!("GET {}", plain("api.test", "/plain/node")),
        ],
        "{entries:#?}"
    );
    assert_eq!(
        plain_of("api.test", "refused"),
        [
            format!("GET {}", plain("api.test", "/elsewhere/go")),
            format!("GET {}", plain("api.test", "/elsewhere/node")),
        ],
        "{entries:#?}"
    );
    assert_eq!(plain_of("other.test", "refused").len(), 2, "{entries:#?}");
    let code = |host: &str| -> Vec<String> {
        of(host, "refused")
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(
        code("other.test"),
        ["not_authorized", "not_authorized"],
        "{entries:#?}"
    );
    assert_eq!(
        code("blocked.test"),
        ["blocked_address", "blocked_address"],
        "{entries:#?}"
    );
    assert_eq!(
        code("rebind.test"),
        ["blocked_address", "blocked_address"],
        "{entries:#?}"
    );
    // The SNI mismatch: refused under the name its address was issued for.
    assert_eq!(code("api.test"), ["not_authorized"], "{entries:#?}");
}

/// A local MCP runner that ignores proxy settings: its `fetch` opens its
/// own connections (urllib with no proxy handler), so only its sandbox's
/// resolver and the plane can carry them.
const PLANE_RUNNER: &str = r#"
import json, os, sys, urllib.error, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
from mcp.server.mcpserver import MCPServer

server = MCPServer("plane-runner")
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

@server.tool()
def fetch(url: str) -> str:
    """GET url on a connection of its own (no proxy)."""
    try:
        with direct.open(url, timeout=20) as r:
            return json.dumps({"status": r.status, "body": r.read().decode()})
    except urllib.error.HTTPError as e:
        return json.dumps({"status": e.code})
    except Exception as e:
        return json.dumps({"error": repr(e)[:300]})

server.run("stdio")
"#;

/// The agent: asks the runner's `fetch` for each URL of its prompt.
const PLANE_RUNNER_AGENT: &str = r#"
import asyncio, json, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

urls = open(os.path.join(os.environ["AIRLOCK_WORKSPACE"], ".airlock", "prompt.txt")).read().split()

async def main_():
    out = []
    async with Client(streamable_http_client(os.environ["AIRLOCK_MCP_URL"]), mode="2026-07-28") as c:
        for u in urls:
            res = await c.call_tool("svc__fetch", {"url": u})
            out.append(json.loads(res.content[0].text))
    json.dump(out, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))

asyncio.run(main_())
"#;

/// A runner's own sandbox has the plane too: a runner that ignores proxy
/// variables reaches what its integration's `authorized_uris` cover, by
/// name, through the same guard, and nothing else; each request is in the
/// egress log as the runner's, carried by the transparent plane.
#[tokio::test(flavor = "multi_thread")]
async fn a_runner_that_ignores_its_proxy_reaches_only_its_allowlist_through_the_plane() {
    if !python_has(&["mcp", "httpx2", "uvicorn"]) || !namespace_available() {
        return;
    }
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let port = plain_upstream(seen.clone()).await;
    let url = |host: &str, path: &str| format!("http://{host}:{port}{path}");
    let run = RealRun::with_manifest(
        PLANE_RUNNER_AGENT,
        &format!(
            "[agent]\nname = \"plane-runner\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 120\n\n\
             [[integrations]]\nnamespace = \"svc\"\n\
             authorized_uris = [\"{}\"]\n\
             source = {{ kind = \"local\", command = [\"/usr/bin/python3\", \"runner.py\"] }}\n",
            url("api.test", "/api/**")
        ),
    )
    .env("EGRESS_RESOLVE", &format!("api.test={UPSTREAM_IP}"))
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", "api.test");
    std::fs::write(run.agent_dir.join("runner.py"), PLANE_RUNNER).unwrap();
    run.vendor("mcp");
    // The covered path; a path the allowlist does not cover; another name;
    // a literal address (never the plane's).
    let urls = [
        url("api.test", "/api/echo"),
        url("api.test", "/private/echo"),
        url("other.test", "/api/echo"),
        url(UPSTREAM_IP, "/api/echo"),
    ];
    let (_run, _out, report) = run.run_prompted("namespace", urls.join(" ")).await;
    let r = &report["result"];
    // The legitimate path: by name, with no proxy, through the plane.
    assert_eq!(r[0]["status"], 200, "{r}");
    assert_eq!(r[0]["body"], "plain:/api/echo", "{r}");
    // The rest: refused by the guard (403) or unroutable (a literal
    // address is the sandbox's own loopback, where nothing listens).
    assert_eq!(r[1]["status"], 403, "{r}");
    assert_eq!(r[2]["status"], 403, "{r}");
    assert!(r[3]["error"].is_string(), "{r}");
    assert_eq!(seen.lock().unwrap().clone(), ["/api/echo"]);

    let entries = report["egress"]["entries"].as_array().unwrap();
    let runner: Vec<&Value> = entries.iter().filter(|e| e["source"] == "runner").collect();
    let decided: Vec<(&str, &str, &str)> = runner
        .iter()
        .map(|e| {
            (
                e["decision"].as_str().unwrap_or_default(),
                e["plane"].as_str().unwrap_or_default(),
                e["url"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    let at = |host: &str, path: &str| format!("api.test:{port}{path}").replace("api.test", host);
    assert!(
        decided.iter().any(|(d, p, u)| *d == "allowed"
            && *p == "transparent"
            && u.contains(&at("api.test", "/api/echo"))),
        "{decided:?}"
    );
    for path in [
        at("api.test", "/private/echo"),
        at("other.test", "/api/echo"),
    ] {
        assert!(
            decided
                .iter()
                .any(|(d, p, u)| *d == "refused" && *p == "transparent" && u.contains(&path)),
            "{path}: {decided:?}"
        );
    }
    assert_eq!(
        decided.iter().filter(|(d, ..)| *d == "allowed").count(),
        1,
        "{decided:?}"
    );
}

//! Local MCP runners (`source = { kind = "local", command }`) in a real run:
//! each runner is a small MCP server (the official Python SDK's, on stdio)
//! started by the platform in a namespace sandbox of its own beside the
//! agent's; the sidecar is its MCP client and serves its tools to the
//! agent (the official Python client). Checked from the attacker's side —
//! the runner's:
//! - its only way out is its own proxy: the upstream its integration's
//!   `authorized_uris` cover gets the credential for its placeholder;
//!   another host (which the agent's network policy allows), the host's
//!   loopback and the metadata address are refused, and nothing reached
//!   them;
//! - it never holds the credential (environment, files) nor the run CA's key;
//! - it sees neither the agent's nor the other runner's processes, sockets
//!   or files, so it cannot read the sidecar's memory or theirs.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::support::tls::{TwoHosts, test_ca, two_hosts};
use crate::support::*;
use serde_json::{Value, json};
use tokio::net::TcpListener;

const CANARY: &str = "canary-runner-Qw3Zx8Lp5Vn2";

/// The runner: an MCP server on stdio with `fetch` (an HTTPS GET through
/// `HTTPS_PROXY`, with the placeholder as its bearer token) and `probe`
/// (what it can see and reach).
const RUNNER: &str = r#"
import json, os, socket, ssl, sys, urllib.error, urllib.parse, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
from mcp.server.mcpserver import MCPServer

ROLE = sys.argv[1]
server = MCPServer("runner-" + ROLE)
sys.stderr.write("runner %s up\n" % ROLE)
sys.stderr.flush()
PH = os.environ.get("AIRLOCK_PLACEHOLDER_SVC", "")

@server.tool()
def fetch(url: str) -> str:
    """GET url through the proxy with the placeholder as the bearer token."""
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + PH})
    try:
        with urllib.request.urlopen(req, timeout=20, context=ssl.create_default_context()) as r:
            return json.dumps({"status": r.status, "body": r.read().decode()})
    except urllib.error.HTTPError as e:
        return json.dumps({"status": e.code, "body": e.read().decode()[:300]})
    except Exception as e:
        return json.dumps({"error": repr(e)[:300]})

def connect(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as e:
        return type(e).__name__

def via_proxy(authority):
    """A CONNECT through the runner's proxy: the proxy's status line."""
    p = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
    try:
        s = socket.create_connection((p.hostname, p.port), timeout=10)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (authority, authority)).encode())
        line = s.recv(200).split(b"\r\n")[0].decode()
        s.close()
        return line
    except OSError as e:
        return type(e).__name__

def ip_port(authority):
    ip, port = authority.rsplit(":", 1)
    return ip, int(port)

@server.tool()
def probe(host: str, main: str, other: str) -> str:
    """What this runner can see and reach (host: a listener of the test's on
    the host; main: its integration's upstream; other: a host the agent may
    reach; each ip:port)."""
    r = {"role": ROLE, "placeholder": PH, "kernel": os.uname().release}
    # Its network interfaces (its network namespace's, as /proc says).
    r["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])
    from find_secrets import holders
    r["files_with_secrets"], r["env_secrets"] = holders([b"canary-" + b"runner", b"PRIVATE" + b" KEY"])
    # Processes: only this sandbox's own (its pid namespace).
    procs = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                procs.append(open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode().strip())
            except OSError:
                procs.append("?")
    r["processes"] = procs
    # The memory of every other process it sees (its sandbox's init, its
    # launcher, which holds the runner's token): which can be read.
    readable = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open("/proc/%s/mem" % pid, "rb") as f:
                    f.read(1)
                readable.append(open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode().strip())
            except OSError:
                pass
    r["readable_memory"] = readable
    r["sockets"] = {n: os.path.exists("/run/airlock/" + n) for n in ["mcp.sock", "proxy.sock", "sidecar.sock"]}
    # Direct: its loopback is its own; nothing else is routed.
    r["direct_host"] = connect(*ip_port(host))
    r["direct_main"] = connect(*ip_port(main))
    r["direct_metadata"] = connect("169.254.169.254", 80)
    # Through its proxy: only what its integration covers.
    r["proxy_host"] = via_proxy(host)
    r["proxy_other"] = via_proxy(other)
    r["proxy_metadata"] = via_proxy("169.254.169.254:80")
    # Its proxy without the token its launcher adds: refused.
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect("/run/airlock/proxy.sock")
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n" % main).encode())
        r["proxy_without_token"] = s.recv(200).split(b"\r\n")[0].decode()
        s.close()
    except OSError as e:
        r["proxy_without_token"] = type(e).__name__
    return json.dumps(r)

server.run("stdio")
"#;

/// A hostile runner, hand-written on raw stdio: a line larger than the
/// sidecar takes and garbage before its answers, 10,001 tools (one with a
/// path for a name), and a 3 MiB result.
const WILD: &str = r#"
import json, sys
# Its stderr without end (the run's log keeps a bounded part).
for k in range(10050):
    sys.stderr.write("wild noise %d\n" % k)
sys.stderr.flush()
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    m, i = msg.get("method"), msg.get("id")
    if i is None:
        continue
    sys.stdout.write("x" * (6 << 20) + "\n")
    sys.stdout.write("not json at all\n")
    if m == "initialize":
        send({"jsonrpc": "2.0", "id": i, "result": {"protocolVersion": "2025-11-25",
              "capabilities": {"tools": {"listChanged": True}}, "serverInfo": {"name": "wild", "version": "0"}}})
    elif m == "tools/list":
        tools = [{"name": "t%d" % k, "inputSchema": {"type": "object"}} for k in range(10000)]
        tools.append({"name": "../../etc", "inputSchema": {"type": "object"}})
        send({"jsonrpc": "2.0", "id": i, "result": {"tools": tools}})
    elif m == "tools/call":
        send({"jsonrpc": "2.0", "id": i, "result": {"content": [{"type": "text", "text": "y" * (3 << 20)}]}})
    else:
        send({"jsonrpc": "2.0", "id": i, "error": {"code": -32601, "message": "no " + str(m)}})
"#;

const AGENT: &str = r#"
import asyncio, json, os, socket, ssl, sys, urllib.error, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

# host: ip:port of the test's host listener; main, other: https base URLs.
host, main, other = open(os.path.join(os.environ["AIRLOCK_WORKSPACE"], ".airlock", "prompt.txt")).read().split()

def agent_get(url):
    """The agent's own request, through its proxy (HTTPS_PROXY)."""
    try:
        with urllib.request.urlopen(url, timeout=20, context=ssl._create_unverified_context()) as resp:
            return {"code": resp.status}
    except urllib.error.HTTPError as e:
        return {"code": e.code}
    except Exception as e:
        return {"error": repr(e)[:300]}

async def main_():
    r = {}
    async with Client(streamable_http_client(os.environ["AIRLOCK_MCP_URL"]), mode="2026-07-28") as c:
        r["tools"] = sorted(t.name for t in (await c.list_tools()).tools)
        text = lambda res: res.content[0].text
        r["fetch_main"] = json.loads(text(await c.call_tool("svc__fetch", {"url": main + "/api/echo"})))
        r["fetch_other"] = json.loads(text(await c.call_tool("svc__fetch", {"url": other + "/api/echo"})))
        r["fetch_uncovered"] = json.loads(text(await c.call_tool("svc__fetch", {"url": main + "/private/echo"})))
        args = {"host": host, "main": main.split("//", 1)[1], "other": other.split("//", 1)[1]}
        r["svc"] = json.loads(text(await c.call_tool("svc__probe", args)))
        r["peer"] = json.loads(text(await c.call_tool("peer__probe", args)))
        r["peer_fetch_main"] = json.loads(text(await c.call_tool("peer__fetch", {"url": main + "/api/echo"})))
        r["wild_count"] = len([t for t in r["tools"] if t.startswith("wild__") and t != "wild__api_call"])
        r["wild_call"] = [b.type for b in (await c.call_tool("wild__t1", {})).content]
        # The good runner after the hostile one had its way.
        r["after"] = json.loads(text(await c.call_tool("svc__fetch", {"url": main + "/api/echo"})))
    # The agent cannot reach a runner either: none of their sockets is in its view.
    r["agent_sockets"] = {n: os.path.exists("/run/airlock/" + n) for n in ["mcp.sock", "proxy.sock", "sidecar.sock"]}
    r["agent_other"] = agent_get(other + "/api/agent")
    json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))

asyncio.run(main_())
"#;

/// A TCP listener on the host's `ip` counting connections (what "the
/// host" is to a runner that tries to reach it).
async fn host_listener(ip: &str) -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    tokio::spawn(async move {
        while let Ok((_s, _)) = l.accept().await {
            n2.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, n)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_local_runner_reaches_only_its_allowlist_and_never_holds_the_credential() {
    if !python_has(&["mcp", "httpx2", "uvicorn"]) || !namespace_available() {
        return;
    }
    let ca = test_ca();
    let hosts = two_hosts(&ca).await;
    runners_attacked("namespace", None, "127.0.0.1", hosts, &ca).await;
}

/// The same run on the docker backend: each runner is a container with no
/// network at all (only loopback), its sockets bound from the host; the
/// hosts are this test's own, on this host's address on the egress network.
#[tokio::test(flavor = "multi_thread")]
async fn a_docker_runner_has_no_network_and_reaches_only_its_allowlist() {
    docker_runners_attacked(None).await;
}

/// The same under gVisor (`runsc-host`, registered with `--host-uds=open`
/// by `.ci/docker.sh`): each runner's container, like the agent's, reaches
/// its sidecar through the sockets bound into it and nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn a_docker_runner_under_gvisor_has_no_network_and_reaches_only_its_allowlist() {
    docker_runners_attacked(Some("runsc-host")).await;
}

/// [`runners_attacked`] on the docker backend under `runtime` (the
/// daemon's default if none), its hosts on this host's egress address.
async fn docker_runners_attacked(runtime: Option<&str>) {
    if !python_has(&["mcp", "httpx2", "uvicorn"]) || !docker_available() {
        return;
    }
    let gw = tokio::task::spawn_blocking(docker_egress_gateway)
        .await
        .unwrap()
        .to_string();
    let ca = test_ca();
    let hosts = crate::support::tls::two_hosts_on(&gw, &gw, &ca).await;
    runners_attacked("docker", runtime, &gw, hosts, &ca).await;
}

/// One run with three runners (`svc` with a connection, `peer` without,
/// the hostile `wild`) on `backend` (with `DOCKER_RUNTIME=runtime`, if
/// one), attacked from each runner's side; the host listener is on
/// `host_ip`.
async fn runners_attacked(
    backend: &'static str,
    runtime: Option<&str>,
    host_ip: &str,
    hosts: TwoHosts,
    ca: &crate::support::tls::TestCa,
) {
    let TwoHosts {
        main,
        main_log,
        other,
        other_log,
        ..
    } = hosts;
    let docker = backend == "docker";
    let (host_port, host_conns) = host_listener(host_ip).await;
    let internal: Vec<&str> = [&main, &other]
        .iter()
        .map(|u| u.trim_start_matches("https://").rsplit_once(':').unwrap().0)
        .collect();
    let key = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [0x3cu8; 32]);
    // The agent may reach `other`; the runners may not (theirs is their
    // integration's allowlist, not the run's network policy).
    let run = RealRun::with_manifest(
        AGENT,
        &format!(
            "[agent]\nname = \"runners\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 150\n\n\
             [network]\negress = [\"{other}/**\"]\n\n\
             [[integrations]]\nnamespace = \"svc\"\nconnection = \"svc\"\n\
             authorized_uris = [\"{main}/api/**\"]\n\
             delivery = {{ header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }}\n\
             source = {{ kind = \"local\", command = [\"/usr/bin/python3\", \"runner.py\", \"svc\"] }}\n\n\
             [[integrations]]\nnamespace = \"peer\"\n\
             source = {{ kind = \"local\", command = [\"/usr/bin/python3\", \"runner.py\", \"peer\"] }}\n\n\
             [[integrations]]\nnamespace = \"wild\"\n\
             source = {{ kind = \"local\", command = [\"/usr/bin/python3\", \"wild.py\"] }}\n"
        ),
    )
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", &internal.join(","))
    .env("CONNECTION_ENCRYPTION_KEY", &key);
    std::fs::write(run.agent_dir.join("runner.py"), RUNNER).unwrap();
    std::fs::write(run.agent_dir.join("wild.py"), WILD).unwrap();
    let ca_file = run.home.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, ca.issuer.pem()).unwrap();
    let mut run = run.env("EGRESS_EXTRA_CA_FILE", ca_file.to_str().unwrap());
    if let Some(r) = runtime {
        run = run.env("DOCKER_RUNTIME", r);
    }
    run.vendor("mcp");
    // (`pyjwt[crypto]`, an extra vendor.py leaves out: the host's /usr has
    // Debian's, the docker agent image does not.)
    run.vendor("cryptography");
    run.helper("find_secrets.py");
    run.add_bearer_connection("svc", &json!({"token": CANARY}), &key);

    let prompt = format!("{host_ip}:{host_port} {main} {other}");
    let (run, out, report) = run.run_prompted(backend, prompt).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let r = &report["result"];
    // The runners ran under the runtime asked for: gVisor's kernel is not
    // the host's.
    let host_release = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    for role in ["svc", "peer"] {
        let kernel = r[role]["kernel"].as_str().unwrap_or_default();
        assert_eq!(
            kernel == host_release,
            runtime.is_none(),
            "{role}'s kernel {kernel:?} (host's {host_release:?}, DOCKER_RUNTIME {runtime:?}): {stdout}{stderr}"
        );
    }

    // Both runners' tools are on /mcp beside the api_calls.
    let tools = strings(&r["tools"]);
    for want in [
        "wild__t0",
        "svc__fetch",
        "svc__probe",
        "svc__api_call",
        "peer__fetch",
        "peer__probe",
    ] {
        assert!(tools.contains(&want), "{want}: {tools:?}");
    }

    // The legitimate path: the covered upstream got the credential for the
    // placeholder, and the runner got the reflection redacted.
    assert_eq!(r["fetch_main"]["status"], 200, "{}", r["fetch_main"]);
    assert_eq!(
        r["fetch_main"]["body"],
        json!({"auth": "Bearer [REDACTED]", "path": "/api/echo"}).to_string()
    );
    let main_seen = main_log.lock().unwrap().clone();
    let echo: Vec<_> = main_seen.iter().filter(|(p, _)| p == "/api/echo").collect();
    assert_eq!(echo.len(), 2, "{main_seen:?}");
    for e in &echo {
        assert_eq!(e.1.as_deref(), Some(format!("Bearer {CANARY}").as_str()));
    }
    // The hostile runner: its oversized and garbage lines are dropped, its
    // list is capped, its large result is a link; the good runner still works.
    assert_eq!(r["wild_count"], 256, "{}", r["tools"]);
    assert!(!r["tools"].to_string().contains("../"));
    assert_eq!(r["wild_call"], json!(["text", "resource_link"]));
    assert_eq!(r["after"]["status"], 200, "{}", r["after"]);

    // Another host (that the agent may reach) and an uncovered path are
    // refused at the runner's proxy; nothing arrived there.
    // (A CONNECT to an authority the allowlist cannot cover is refused
    // before the tunnel opens; urllib reports its 403 as a tunnel error.)
    let tunnel_refused = |v: &Value| {
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("Tunnel connection failed: 403"))
    };
    assert!(tunnel_refused(&r["fetch_other"]), "{}", r["fetch_other"]);
    assert_eq!(
        r["fetch_uncovered"]["status"], 403,
        "{}",
        r["fetch_uncovered"]
    );
    assert!(!main_seen.iter().any(|(p, _)| p.starts_with("/private")));
    // The agent itself reaches `other` under its network policy: the
    // refusal above is the runner's bound, not a dead upstream.
    assert_eq!(r["agent_other"]["code"], 200, "{}", r["agent_other"]);
    let other_seen = other_log.lock().unwrap().clone();
    assert_eq!(
        other_seen
            .iter()
            .map(|(p, _)| p.as_str())
            .collect::<Vec<_>>(),
        ["/api/agent"],
        "only the agent's request reached the other host"
    );

    for who in ["svc", "peer"] {
        let p = &r[who];
        assert_eq!(p["role"], who);
        // Its loopback is its own, nothing else is routed, and its proxy
        // refuses the host, another host and the metadata address. (In the
        // namespace sandbox the 127/8 addresses are its own loopback's,
        // where nothing listens; a docker runner has no route at all.)
        assert_eq!(p["interfaces"], json!(["lo"]), "{who}: {p}");
        let unrouted = if docker {
            "OSError"
        } else {
            "ConnectionRefusedError"
        };
        assert_eq!(p["direct_host"], unrouted, "{who}: {p}");
        assert_eq!(p["direct_main"], unrouted, "{who}: {p}");
        assert_ne!(p["direct_metadata"], "connected", "{who}: {p}");
        for k in ["proxy_host", "proxy_other", "proxy_metadata"] {
            let line = p[k].as_str().unwrap_or_default();
            assert!(line.starts_with("HTTP/1.1 403"), "{who} {k}: {line}");
        }
        assert!(
            p["proxy_without_token"]
                .as_str()
                .is_some_and(|l| l.starts_with("HTTP/1.1 407")),
            "{who}: {p}"
        );
        // No credential and no CA key anywhere it can read.
        assert_eq!(p["env_secrets"], json!([]), "{who}: {p}");
        assert_eq!(p["files_with_secrets"], json!([]), "{who}: {p}");
        // Only its own sockets and processes: no sidecar, no agent, no other runner.
        assert_eq!(
            p["sockets"],
            json!({"mcp.sock": true, "proxy.sock": true, "sidecar.sock": false}),
            "{who}"
        );
        let procs = strings(&p["processes"]);
        let other_runner = if who == "svc" {
            "runner.py peer"
        } else {
            "runner.py svc"
        };
        assert!(
            procs
                .iter()
                .any(|c| c.contains(&format!("runner.py {who}"))),
            "{who}: {procs:?}"
        );
        assert!(
            procs.iter().all(|c| !c.contains("sidecar")
                && !c.contains("agent.py")
                && !c.contains(" runtime ")
                && !c.contains(other_runner)),
            "{who}: {procs:?}"
        );
        // Its launcher (which holds its token) is not readable; a docker
        // runner's init (tini, holding nothing) is its own uid's.
        let readable = strings(&p["readable_memory"]);
        if docker {
            assert!(
                readable.iter().all(|c| c.contains("docker-init")),
                "{who}: {readable:?}"
            );
        } else {
            assert!(readable.is_empty(), "{who}: {readable:?}");
        }
    }
    // The placeholder is in the credentialed runner's environment only.
    assert_eq!(r["svc"]["placeholder"], "AIRLOCK_PLACEHOLDER_SVC");
    assert_eq!(r["peer"]["placeholder"], "");
    // A runner without a connection reaches nothing (its allowlist is empty).
    assert!(
        tunnel_refused(&r["peer_fetch_main"]),
        "{}",
        r["peer_fetch_main"]
    );
    // The agent sees its own sidecar's two sockets and none of the
    // runners' (on every backend).
    assert_eq!(
        r["agent_sockets"],
        json!({"mcp.sock": false, "proxy.sock": true, "sidecar.sock": true})
    );
    assert_eq!(host_conns.load(Ordering::SeqCst), 0, "the host was reached");
    assert!(!stdout.contains(CANARY) && !stderr.contains(CANARY));

    // The egress log: each of the runners' requests, allowed or refused.
    let entries = report["egress"]["entries"].as_array().unwrap();
    let runner: Vec<&Value> = entries.iter().filter(|e| e["source"] == "runner").collect();
    let allowed: Vec<&&Value> = runner
        .iter()
        .filter(|e| e["decision"] == "allowed")
        .collect();
    assert_eq!(allowed.len(), 2, "{runner:?}");
    assert!(allowed.iter().all(|e| e["integration"] == "svc"));
    assert!(
        allowed[0]["url"]
            .as_str()
            .unwrap()
            .contains(&format!("{}/api/echo", main.trim_start_matches("https://")))
    );
    let refused = runner.iter().filter(|e| e["decision"] == "refused").count();
    // fetch other + uncovered, 3 CONNECTs of each runner, the peer's fetch.
    assert!(refused >= 9, "{runner:?}");
    let id = report["id"].as_str().unwrap();
    if docker {
        let left = docker_leftovers(id);
        assert!(left.is_empty(), "left on the daemon: {left:?}");
    }

    // Each runner's output is in the run's log, under its own stream; the
    // hostile one's flood is cut at the cap, with a line saying so.
    let logs = run.airlock(&["runs", "logs", id, "--json"]);
    let lines: Vec<Value> = String::from_utf8_lossy(&logs.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let of = |stream: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["stream"] == stream)
            .map(|l| l["line"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert!(
        of("runner:svc").contains(&"runner svc up".to_owned()),
        "{:?}",
        of("runner:svc")
    );
    assert!(of("runner:peer").contains(&"runner peer up".to_owned()));
    let wild = of("runner:wild");
    assert_eq!(wild.len(), 10_001, "{:?}", wild.last());
    assert_eq!(wild[0], "wild noise 0");
    assert_eq!(wild[9_999], "wild noise 9999");
    assert!(
        wild[10_000].contains("not kept in the run's log"),
        "{}",
        wild[10_000]
    );
    // (More than a page of events: `runs logs` reads them all.)
    assert!(lines.len() > 10_001, "{}", lines.len());
    let text = run.airlock(&["runs", "logs", id]);
    assert!(
        String::from_utf8_lossy(&text.stderr).contains("[runner svc] runner svc up"),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
}

#[test]
fn a_local_runner_is_refused_before_anything_starts_where_it_cannot_be_isolated() {
    let run = RealRun::with_manifest(
        "print('never')",
        "[agent]\nname = \"runner-process\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\n\n\
         [[integrations]]\nnamespace = \"svc\"\n\
         source = { kind = \"local\", command = [\"/usr/bin/python3\", \"runner.py\"] }\n",
    );
    let (out, report) = run.run("process");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let said = format!("{report}{stderr}");
    assert!(
        said.contains("integration svc: a local MCP runner (source.kind = \"local\") cannot start on the process backend")
            && said.contains("RUN_ADAPTER=namespace"),
        "{said}"
    );
    assert!(!said.contains("never"), "the agent ran: {said}");
}

#[test]
fn a_runner_program_that_is_not_there_is_refused_before_anything_starts() {
    if !namespace_available() {
        return;
    }
    for (program, must) in [
        (
            "/usr/bin/pyhton3",
            "source.command[0] \"/usr/bin/pyhton3\" is not an executable file",
        ),
        ("nosuchserver", "looked for /usr/local/bin/nosuchserver"),
        ("./server.py", "agent/./server.py"),
    ] {
        let run = RealRun::with_manifest(
            "print('never')",
            &format!(
                "[agent]\nname = \"runner-typo\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\n\n\
                 [[integrations]]\nnamespace = \"svc\"\n\
                 source = {{ kind = \"local\", command = [{program:?}] }}\n"
            ),
        );
        let (out, report) = run.run("namespace");
        let said = format!("{report}{}", String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{said}");
        assert!(
            said.contains("integration svc: ") && said.contains(must),
            "{program}: {said}"
        );
        assert!(!said.contains("never"), "the agent ran: {said}");
    }
}

/// An agent that lists the tools and calls `svc__hello`: what it got.
const CALLS_A_DEAD_RUNNER: &str = r#"
import asyncio, json, os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
async def main():
    t = time.time()
    async with Client(streamable_http_client(os.environ["AIRLOCK_MCP_URL"]), mode="2026-07-28") as c:
        r = {"tools": sorted(x.name for x in (await c.list_tools()).tools), "list_s": time.time() - t}
        r["call"] = (await c.call_tool("svc__hello", {})).content[0].text
    json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
asyncio.run(main())
"#;

/// A runner whose server cannot start (its interpreter is not there: the
/// program passes the check before start, its exec fails): the run goes
/// on, the agent's list answers at once without the runner's tools, a call
/// to one gets a typed error in plain words, and the launcher's own line is
/// in the run's log.
#[test]
fn a_runner_whose_server_cannot_start_fails_its_tools_and_nothing_else() {
    if !python_has(&["mcp", "httpx2", "uvicorn"]) || !namespace_available() {
        return;
    }
    let run = RealRun::with_manifest(
        CALLS_A_DEAD_RUNNER,
        "[agent]\nname = \"dead-runner\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 60\n\n\
         [[integrations]]\nnamespace = \"svc\"\n\
         source = { kind = \"local\", command = [\"./server.sh\"] }\n",
    );
    let server = run.agent_dir.join("server.sh");
    std::fs::write(&server, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&server, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    run.vendor("mcp");
    run.vendor("cryptography");
    let (out, report) = run.run("namespace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(report["status"], "succeeded", "{report}\n{stderr}");
    let r = &report["result"];
    let tools = strings(&r["tools"]);
    assert!(tools.contains(&"svc__api_call"), "{tools:?}");
    assert!(!tools.contains(&"svc__hello"), "{tools:?}");
    assert!(r["list_s"].as_f64().unwrap() < 5.0, "{r}");
    let call: Value = serde_json::from_str(r["call"].as_str().unwrap()).unwrap();
    assert_eq!(call["error"], "mcp_server_unavailable", "{call}");
    let message = call["message"].as_str().unwrap();
    assert!(
        message.starts_with("the svc MCP server is unavailable: ") && !message.contains("rmcp::"),
        "{message}"
    );
    let id = report["id"].as_str().unwrap();
    let logs = String::from_utf8_lossy(&run.airlock(&["runs", "logs", id]).stderr).into_owned();
    assert!(
        logs.contains("[runner svc] airlock runner: cannot start the runner's server"),
        "{logs}"
    );
}

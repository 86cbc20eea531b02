//! `inject = "proxy"` in a real run: the agent's unmodified `curl` and
//! Python `requests` send the integration's placeholder through the
//! sidecar's intercepting proxy (trusting the run's own CA), and the
//! upstream the integration covers receives the credential. Checked from
//! the attacker's side: the placeholder sent to another host arrives as the
//! placeholder, a path the integration does not cover is refused, an
//! upstream that reflects the credential is redacted, and the sandbox holds
//! no CA key and no credential anywhere it can read.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::process::Command;

use std::sync::Arc;

use crate::support::tls::{TwoHosts, test_ca, two_hosts, upstream_named};
use crate::support::*;
use serde_json::json;
use tokio::net::TcpListener;

const CANARY: &str = "canary-inject-Vb7Kq2Xz9Lm4";
const PLACEHOLDER: &str = "AIRLOCK_PLACEHOLDER_SVC";

const AGENT: &str = r#"
import json, os, subprocess, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
import requests

main, other = open(os.path.join(os.environ["AIRLOCK_WORKSPACE"], ".airlock", "prompt.txt")).read().split()
ph = os.environ["AIRLOCK_PLACEHOLDER_SVC"]
r = {"placeholder": ph}

def curl(url, *extra):
    p = subprocess.run(["curl", "-sS", "--max-time", "20", "-H", "Authorization: Bearer " + ph,
                        "-D", "-", *extra, url], capture_output=True, text=True)
    return {"code": p.returncode, "out": p.stdout, "err": p.stderr[-300:]}

r["curl_main"] = curl(main + "/api/echo")
r["curl_other"] = curl(other + "/api/echo")
r["curl_uncovered"] = curl(main + "/private/echo")
# A path under /api/ as written that many servers decode to /private/echo.
r["curl_escape"] = curl(main + "/api/..%2fprivate/echo", "--path-as-is")
# Fronting: a tunnel to the other host whose request names the covered one.
r["curl_fronted"] = curl(other + "/api/echo", "-H", "Host: " + main.split("//")[1])
try:
    resp = requests.get(main + "/api/py", headers={"Authorization": "Bearer " + ph}, timeout=20)
    r["requests_main"] = {"status": resp.status_code, "body": resp.text, "echo": resp.headers.get("x-echo-auth")}
except Exception as e:
    r["requests_main"] = {"error": repr(e)}
try:
    resp = requests.get(main + "/api/basic", auth=("x-access-token", ph), timeout=20)
    r["requests_basic"] = {"status": resp.status_code, "body": resp.text}
except Exception as e:
    r["requests_basic"] = {"error": repr(e)}

# The CA: its certificate is here; its key must be nowhere the agent can read.
ws = os.environ["AIRLOCK_WORKSPACE"]
r["ca_cert_present"] = os.path.exists(os.path.join(ws, ".airlock", "ca.pem"))
from find_secrets import holders
r["secrets_found"], r["env_secrets"] = holders([b"PRIVATE" + b" KEY", b"canary-" + b"inject"])
json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn unmodified_tools_use_the_credential_by_its_placeholder_and_only_where_it_is_authorized() {
    if !python_has(&["requests"]) || !namespace_available() {
        return;
    }
    let ca = test_ca();
    let TwoHosts {
        main,
        main_port,
        main_log,
        other,
        other_port,
        other_log,
    } = two_hosts(&ca).await;
    let key = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [0x6bu8; 32]);
    let run = RealRun::with_manifest(
        AGENT,
        &format!(
            "[agent]\nname = \"inject\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 120\n\n\
             [network]\negress = [\"{other}/**\"]\n\n\
             [[integrations]]\nnamespace = \"svc\"\nconnection = \"svc\"\n\
             authorized_uris = [\"{main}/api/**\"]\n\
             delivery = {{ header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }}\n\
             inject = \"proxy\"\n"
        ),
    )
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", "127.0.0.2,127.0.0.3")
    .env("CONNECTION_ENCRYPTION_KEY", &key);
    let ca_file = run.home.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, ca.issuer.pem()).unwrap();
    let run = run.env("EGRESS_EXTRA_CA_FILE", ca_file.to_str().unwrap());
    run.vendor("requests");
    run.helper("find_secrets.py");
    run.add_bearer_connection("svc", &json!({"token": CANARY}), &key);

    let prompt = format!("{main} {other}");
    let (_run, out, report) = run.run_prompted("namespace", prompt).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let r = &report["result"];
    assert_eq!(r["placeholder"], PLACEHOLDER);

    // curl and requests: the covered upstream got the credential...
    let main_seen = main_log.lock().unwrap().clone();
    let bearer = format!("Bearer {CANARY}");
    for path in ["/api/echo", "/api/py"] {
        let got: Vec<_> = main_seen.iter().filter(|(p, _)| p == path).collect();
        assert_eq!(got.len(), 1, "{path}: {main_seen:?}");
        assert_eq!(got[0].1.as_deref(), Some(bearer.as_str()), "{path}");
    }
    // ...also inside Basic credentials (git's and requests' auth=)...
    let basic = main_seen.iter().find(|(p, _)| p == "/api/basic").unwrap();
    let b64 = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("x-access-token:{CANARY}"),
    );
    assert_eq!(basic.1.as_deref(), Some(format!("Basic {b64}").as_str()));
    // ...and the agent saw it come back redacted, body and header.
    let curl_main = r["curl_main"]["out"].as_str().unwrap();
    assert!(
        curl_main.contains("\"auth\":\"Bearer [REDACTED]\""),
        "{}",
        r["curl_main"]
    );
    assert!(
        curl_main
            .to_ascii_lowercase()
            .contains("x-echo-auth: bearer [redacted]"),
        "{curl_main}"
    );
    assert_eq!(
        r["requests_main"]["echo"], "Bearer [REDACTED]",
        "{}",
        r["requests_main"]
    );
    assert_eq!(
        r["requests_basic"]["status"], 200,
        "{}",
        r["requests_basic"]
    );
    // Reflected in base64 (the Basic value the sidecar made), still redacted:
    // the characters that carried the credential go, the user name's stay.
    let user = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        "x-access-token:",
    );
    assert_eq!(
        r["requests_basic"]["body"],
        json!({"auth": format!("Basic {user}[REDACTED]="), "path": "/api/basic"}).to_string(),
        "{}",
        r["requests_basic"]
    );

    // The placeholder sent to another host arrives as the placeholder.
    // So does a request in a tunnel to another host whose Host header names
    // the covered one: the tunnel's host decides, not the header.
    let other_seen = other_log.lock().unwrap().clone();
    assert_eq!(other_seen.len(), 2, "{other_seen:?}");
    for s in &other_seen {
        assert_eq!(
            s.1.as_deref(),
            Some(format!("Bearer {PLACEHOLDER}").as_str())
        );
    }
    assert!(
        r["curl_other"]["out"]
            .as_str()
            .unwrap()
            .contains(PLACEHOLDER)
    );
    // A path the integration does not cover (and the network policy does
    // not allow) is refused, and the upstream saw nothing of it.
    assert!(
        r["curl_uncovered"]["out"].as_str().unwrap().contains("403"),
        "{}",
        r["curl_uncovered"]
    );
    assert!(!main_seen.iter().any(|(p, _)| p.starts_with("/private")));
    // Nor one that escapes `/api/**` once decoded (issue 44.3): the
    // integration does not cover it, so it is judged (and refused) by the
    // network policy, and the credential never went with it.
    assert!(
        r["curl_escape"]["out"].as_str().unwrap().contains("403"),
        "{}",
        r["curl_escape"]
    );
    assert!(
        !main_seen
            .iter()
            .any(|(p, auth)| p.contains("private") && auth.as_deref() == Some(bearer.as_str())),
        "{main_seen:?}"
    );

    // The sandbox has the CA's certificate, never its key, nor the credential.
    assert_eq!(r["ca_cert_present"], true);
    assert_eq!(r["secrets_found"], json!([]), "{r}");
    assert_eq!(r["env_secrets"], json!([]), "{r}");
    assert!(!stdout.contains(CANARY) && !stderr.contains(CANARY));

    // The egress log: each request, with the integration whose credential it carried.
    let entries = report["egress"]["entries"].as_array().unwrap();
    let of = |path: &str| {
        entries
            .iter()
            .filter(|e| e["url"].as_str().is_some_and(|u| u.contains(path)))
            .collect::<Vec<_>>()
    };
    for path in ["/api/echo", "/api/py", "/api/basic"] {
        let e = of(&format!("127.0.0.2:{main_port}{path}"));
        assert_eq!(e.len(), 1, "{path}: {entries:?}");
        assert_eq!(e[0]["integration"], "svc", "{path}");
        assert_eq!(e[0]["source"], "proxy");
        assert_eq!(e[0]["decision"], "allowed");
    }
    let e = of(&format!("127.0.0.3:{other_port}/api/echo"));
    assert_eq!(e.len(), 2, "{entries:?}");
    assert!(e.iter().all(|e| e["integration"].is_null()), "{e:?}");
    let e = of("/api/..%2fprivate/echo");
    assert_eq!(e.len(), 1, "{entries:?}");
    assert_eq!(e[0]["decision"], "refused");
    let e = of("/private/echo");
    assert_eq!(e.len(), 1, "{entries:?}");
    assert_eq!(e[0]["decision"], "refused");
}

/// An echo server on 127.0.0.1 counting its connections.
async fn echo_server() -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let conns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c2 = conns.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (port, conns)
}

/// A CONNECT through `proxy`, then `bytes`; what came back within 5 s.
async fn tunnel_bytes(
    proxy: std::net::SocketAddr,
    token: &str,
    port: u16,
    bytes: &[u8],
) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    s.write_all(
        format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: Bearer {token}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    s.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => {
                got.extend_from_slice(&buf[..n]);
                if got.ends_with(bytes) {
                    break;
                }
            }
        }
    }
    got
}

/// Under an intercepting sidecar, a tunnel whose client does not speak TLS
/// is the plain tunnel, judged by the network policy: to an allowed
/// destination its bytes are relayed; to another the connection is closed,
/// the refusal recorded, and the destination never dialled. A client that
/// does not trust the run's CA gets no answer and sends nothing upstream.
#[tokio::test(flavor = "multi_thread")]
async fn under_interception_a_tunnel_that_is_not_tls_keeps_the_network_policy() {
    use airlock_vault::ExposeSecret;
    let (allowed_port, allowed_conns) = echo_server().await;
    let (other_port, other_conns) = echo_server().await;
    let p = airlock_platform::testing::TestPlatform::start("inject-plain").await;
    p.add_connection("svc", airlock_store::AuthType::Bearer, &[("token", CANARY)])
        .await;
    let ca = airlock_platform::proxy_ca::generate(&p.run_id).unwrap();
    let cfg = p
        .sidecar_config()
        .tcp()
        .proxy_tcp()
        .integration(
            integration("svc")
                .authorized(["https://api.inject.test/**"])
                .bearer("token")
                .inject_proxy(),
        )
        .network_allow([format!("https://127.0.0.1:{allowed_port}/**")])
        .allow_internal_hosts(["127.0.0.1"])
        .proxy_ca(&ca.cert_pem, &ca.key_pem)
        .build();
    let sc = spawn_sidecar(&cfg);
    let token = p.sidecar_token.expose_secret().to_owned();

    let got = tunnel_bytes(sc.proxy_tcp(), &token, allowed_port, b"plain bytes\n").await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("plain bytes\n"), "relayed: {text:?}");
    assert_eq!(allowed_conns.load(std::sync::atomic::Ordering::SeqCst), 1);

    let got = tunnel_bytes(sc.proxy_tcp(), &token, other_port, b"plain bytes\n").await;
    assert!(
        !String::from_utf8_lossy(&got).contains("plain bytes"),
        "{got:?}"
    );
    assert_eq!(other_conns.load(std::sync::atomic::Ordering::SeqCst), 0);

    // curl speaks TLS but does not trust the run's CA: the handshake fails.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--noproxy", "", "-x"])
        .arg(format!("http://{}", sc.proxy_tcp()))
        .args([
            "--proxy-header",
            &format!("Proxy-Authorization: Bearer {token}"),
        ])
        .arg(format!("https://127.0.0.1:{other_port}/x"))
        .output()
        .expect("curl must be installed (.ci/run installs it)");
    assert!(!out.status.success());
    assert_eq!(other_conns.load(std::sync::atomic::Ordering::SeqCst), 0);

    let refused = eventually(10, || async {
        p.stored_egress_log()
            .await
            .into_iter()
            .find(|e| e.url.contains(&format!("127.0.0.1:{other_port}")) && e.reason.is_some())
    })
    .await
    .expect("the refused tunnel is in the egress log");
    assert_eq!(refused.reason.map(|r| r.as_str()), Some("not_authorized"));
    drop(sc);
}

/// The placeholder sent to look-alike hosts (the real host's name as a
/// prefix, a suffix, with a dash, another port), which the network policy
/// allows, arrives there as the placeholder; only the covered host gets the
/// credential. A real sidecar with the run's CA, curl through its proxy.
#[tokio::test(flavor = "multi_thread")]
async fn the_placeholder_sent_to_a_look_alike_host_stays_a_placeholder() {
    let ca = test_ca();
    const REAL: &str = "api.svc.test";
    let looks = [
        "api.svc.test.evil.test",
        "evil.api.svc.test",
        "api-svc.test",
        "api.svc.tes",
    ];
    let mut names = vec![REAL];
    names.extend(looks);
    let (port, log) = upstream_named("127.0.0.2", &names, &ca).await;
    let p = airlock_platform::testing::TestPlatform::start("lookalike").await;
    p.add_connection("svc", airlock_store::AuthType::Bearer, &[("token", CANARY)])
        .await;
    let run_ca = airlock_platform::proxy_ca::generate(&p.run_id).unwrap();
    let mut cfg = p
        .sidecar_config()
        .tcp()
        .proxy_tcp()
        .integration(
            integration("svc")
                .authorized([format!("https://{REAL}:{port}/**")])
                .bearer("token")
                .inject_proxy(),
        )
        .network_allow(names.iter().map(|n| format!("https://{n}:*/**")))
        .allow_internal_hosts(&names)
        .egress_with(|e| e.extra_ca_pem = Some(ca.issuer.pem()))
        .proxy_ca(&run_ca.cert_pem, &run_ca.key_pem);
    for n in &names {
        cfg = cfg.resolve(n, "127.0.0.2");
    }
    let cfg = cfg.build();
    let mut sc = spawn_sidecar(&cfg);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("run-ca.pem");
    std::fs::write(&ca_file, &run_ca.cert_pem).unwrap();
    let proxy = format!("http://{}", sc.proxy_tcp());
    let user = format!(
        "run:{}",
        airlock_vault::ExposeSecret::expose_secret(&p.sidecar_token)
    );
    let get = |url: String| {
        let (proxy, user, ca_file) = (proxy.clone(), user.clone(), ca_file.clone());
        tokio::task::spawn_blocking(move || {
            let out = Command::new("curl")
                .args([
                    "-sS",
                    "--max-time",
                    "20",
                    "--noproxy",
                    "",
                    "-x",
                    &proxy,
                    "--proxy-user",
                    &user,
                ])
                .arg("--cacert")
                .arg(&ca_file)
                .args(["-H", &format!("Authorization: Bearer {PLACEHOLDER}"), &url])
                .output()
                .expect("curl");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    };
    let real = get(format!("https://{REAL}:{port}/real")).await.unwrap();
    assert!(real.contains("Bearer [REDACTED]"), "{real}");
    for (i, host) in looks.iter().enumerate() {
        let body = get(format!("https://{host}:{port}/look{i}")).await.unwrap();
        assert!(body.contains(PLACEHOLDER), "{host}: {body}");
    }
    // Another port of the real host is another authority, not covered either.
    let (other_port, other_log) = upstream_named("127.0.0.2", &[REAL], &ca).await;
    let body = get(format!("https://{REAL}:{other_port}/port"))
        .await
        .unwrap();
    assert!(body.contains(PLACEHOLDER), "{body}");
    assert_eq!(
        other_log.lock().unwrap().clone(),
        [("/port".to_owned(), Some(format!("Bearer {PLACEHOLDER}")))]
    );

    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 1 + looks.len(), "{seen:?}");
    for (path, auth) in &seen {
        let want = if path == "/real" {
            format!("Bearer {CANARY}")
        } else {
            format!("Bearer {PLACEHOLDER}")
        };
        assert_eq!(auth.as_deref(), Some(want.as_str()), "{path}");
    }
    sc.stop();
    let entries = p.egress_log().await;
    let carried: Vec<_> = entries
        .iter()
        .filter(|e| e.integration.as_deref() == Some("svc"))
        .map(|e| e.url.clone())
        .collect();
    assert_eq!(
        carried,
        [format!("https://{REAL}:{port}/real")],
        "{entries:?}"
    );
}

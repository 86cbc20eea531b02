//! A covered upstream that reflects the credential through the encoders
//! ordinary servers use — PHP's `json_encode`, `htmlspecialchars`,
//! `rawurlencode` and `base64_encode`, Go's `encoding/json`, Python's
//! `json`, `html`, `urllib.parse` and `base64` — run for real by the
//! upstream for each answer. Attacked from the agent's side in a real run:
//! `api_call` with the credential in a header, the query, the path and the
//! body (`{{token}}`), `inject = "proxy"` with the placeholder, a local
//! runner's own proxy with its placeholder, and a
//! stored reflection (a `POST` stores the credential, a later `GET` without
//! the placeholder reads it back). The agent decodes every answer every way
//! it can; the credential is in none of them, and every call still works
//! (status, the non-secret part of the body intact).
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::convert::Infallible;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use crate::support::tls::{TestCa, test_ca};
use crate::support::*;

/// An AWS-style secret with the characters encoders treat differently.
const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfi&CY<EX>AMPLEKEY'q\"z";
/// The local runner: an MCP server whose `fetch` GETs a URL through its own
/// proxy with its placeholder as the bearer token.
const RUNNER: &str = r#"
import json, os, ssl, sys, urllib.error, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
from mcp.server.mcpserver import MCPServer

server = MCPServer("reflect-runner")
PH = os.environ.get("AIRLOCK_PLACEHOLDER_RUN", "")

@server.tool()
def fetch(url: str) -> str:
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + PH})
    try:
        with urllib.request.urlopen(req, timeout=30, context=ssl.create_default_context()) as r:
            return json.dumps({"code": str(r.status), "body": r.read().decode()})
    except urllib.error.HTTPError as e:
        return json.dumps({"code": str(e.code), "body": e.read().decode()[:300]})
    except Exception as e:
        return json.dumps({"error": repr(e)[:300]})

server.run("stdio")
"#;

/// Pieces of it that no decoding of a redacted answer may hold.
const PIECES: [&str; 3] = ["XUtnFEMI", "MDENG", "AMPLEKEY"];

/// Each encoder: its name and the command that encodes stdin to stdout.
const ENCODERS: &[(&str, &[&str])] = &[
    (
        "php_json",
        &[
            "php",
            "-r",
            "echo json_encode(file_get_contents('php://stdin'));",
        ],
    ),
    (
        "php_html",
        &[
            "php",
            "-r",
            "echo htmlspecialchars(file_get_contents('php://stdin'), ENT_QUOTES);",
        ],
    ),
    (
        "php_url",
        &[
            "php",
            "-r",
            "echo rawurlencode(file_get_contents('php://stdin'));",
        ],
    ),
    (
        "php_b64",
        &[
            "php",
            "-r",
            "echo base64_encode(file_get_contents('php://stdin'));",
        ],
    ),
    ("go_json", &["GO_JSON"]),
    (
        "py_json",
        &[
            "python3",
            "-c",
            "import json,sys; sys.stdout.write(json.dumps(sys.stdin.read()))",
        ],
    ),
    (
        "py_html",
        &[
            "python3",
            "-c",
            "import html,sys; sys.stdout.write(html.escape(sys.stdin.read()))",
        ],
    ),
    (
        "py_quote",
        &[
            "python3",
            "-c",
            "import urllib.parse,sys; sys.stdout.write(urllib.parse.quote(sys.stdin.read(), safe=''))",
        ],
    ),
    (
        "py_quote_plus",
        &[
            "python3",
            "-c",
            "import urllib.parse,sys; sys.stdout.write(urllib.parse.quote_plus(sys.stdin.read()))",
        ],
    ),
    (
        // .NET's lower-case percent-encoding.
        "py_quote_lower",
        &[
            "python3",
            "-c",
            "import re,urllib.parse,sys; sys.stdout.write(re.sub('%[0-9A-F]{2}', lambda m: m.group(0).lower(), urllib.parse.quote(sys.stdin.read(), safe='')))",
        ],
    ),
    (
        "py_b64",
        &[
            "python3",
            "-c",
            "import base64,sys; sys.stdout.write(base64.b64encode(sys.stdin.buffer.read()).decode())",
        ],
    ),
    (
        "py_b64url",
        &[
            "python3",
            "-c",
            "import base64,sys; sys.stdout.write(base64.urlsafe_b64encode(sys.stdin.buffer.read()).decode().rstrip('='))",
        ],
    ),
    (
        "py_b64_mime",
        &[
            "python3",
            "-c",
            "import base64,sys; sys.stdout.write(base64.encodebytes(b'x' * 7 + sys.stdin.buffer.read()).decode())",
        ],
    ),
];

const GO_JSON: &str = r#"package main

import (
	"encoding/json"
	"io"
	"os"
)

func main() {
	in, _ := io.ReadAll(os.Stdin)
	out, _ := json.Marshal(string(in))
	os.Stdout.Write(out)
}
"#;

/// Go's `encoding/json` encoder, built once per test process in cargo's
/// temporary directory for tests (not the system's: nothing is left behind
/// in `/tmp`), its build directory removed once the binary is moved out.
fn go_json() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| {
        let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tmp.join(format!("go-json-build-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("main.go"), GO_JSON).unwrap();
        let bin = dir.join("gojson");
        let out = std::process::Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg("main.go")
            .current_dir(&dir)
            .env("GOCACHE", dir.join("cache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local")
            .env("GOPROXY", "off")
            .output()
            .expect("go (golang-go) is needed: the upstream's Go encoder");
        assert!(
            out.status.success(),
            "go build: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Processes of one `cargo test` run may race here: a rename is
        // atomic and every build is the same program.
        let kept = tmp.join("gojson");
        std::fs::rename(&bin, &kept).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        kept.to_string_lossy().into_owned()
    })
}

/// Runs encoder `name` on `input`.
async fn encode(name: &str, input: &str) -> String {
    let (_, cmd) = ENCODERS.iter().find(|(n, _)| *n == name).unwrap();
    let argv: Vec<String> = if cmd[0] == "GO_JSON" {
        vec![go_json().to_owned()]
    } else {
        cmd.iter().map(|s| s.to_string()).collect()
    };
    let mut child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{name}: {} is needed: {e}", argv[0]));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(h) = s.get(i + 1..i + 3)
            && let Ok(v) = u8::from_str_radix(h, 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The reflecting upstream: HTTPS on `ip` with a certificate from `ca`.
///
/// `…/enc/{encoder}/{place}…` answers `BEGIN{encoded}END tail-ok`, where
/// what is encoded is `place=… ` and the value the request carried there
/// as a server reads it (the Authorization header, the decoded path or
/// query, or the body). `POST /api/note` stores its Authorization header;
/// `GET /api/note` answers it raw and in PHP's and Go's JSON.
async fn reflector(ip: &str, ca: &TestCa) -> u16 {
    let acceptor = crate::support::tls::acceptor_for(&[ip], ca);
    let l = TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let note: Arc<Mutex<String>> = Arc::default();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            let note = note.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let note = note.clone();
                    async move { Ok::<_, Infallible>(reflect(req, &note).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    port
}

async fn reflect(
    req: Request<hyper::body::Incoming>,
    note: &Mutex<String>,
) -> Response<Full<Bytes>> {
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let method = req.method().clone();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let text = |s: String| {
        Response::builder()
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from(s)))
            .unwrap()
    };
    if path == "/api/note" {
        if method == "POST" {
            *note.lock().unwrap() = auth;
            return text("stored".into());
        }
        let stored = note.lock().unwrap().clone();
        let php = encode("php_json", &stored).await;
        let go = encode("go_json", &stored).await;
        return text(format!("raw={stored} php={php} go={go} tail-ok"));
    }
    let parts: Vec<&str> = path.split('/').collect();
    let Some(at) = parts.iter().position(|p| *p == "enc") else {
        return text("no encoder".into());
    };
    let encoder = parts.get(at + 1).copied().unwrap_or_default();
    let place = parts.get(at + 2).copied().unwrap_or("header");
    let value = match place {
        "query" => percent_decode(&query),
        "path" => percent_decode(&parts[at + 3..].join("/")),
        "body" => String::from_utf8_lossy(&body).into_owned(),
        _ => auth,
    };
    let encoded = encode(encoder, &format!("place={place} value={value} end")).await;
    text(format!("BEGIN{encoded}END tail-ok"))
}

/// The agent: every call, each answer decoded every way it can (Python's
/// json, html, urllib.parse, base64 at each offset, two in a row).
const AGENT: &str = r#"
import asyncio, base64, binascii, html, json, os, re, subprocess, sys, urllib.parse
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor"))
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

base, encoders = open(os.path.join(os.environ["AIRLOCK_WORKSPACE"], ".airlock", "prompt.txt")).read().split(" ", 1)
encoders = encoders.split()

def b64(s):
    out = []
    runs = re.findall(r"[A-Za-z0-9+/_\-\r\n]{4,}", s)
    for run in runs:
        run = run.replace("\r", "").replace("\n", "").replace("-", "+").replace("_", "/")
        for k in range(4):
            part = run[k:]
            part = part[: len(part) - len(part) % 4]
            try:
                out.append(base64.b64decode(part).decode("latin-1"))
            except (binascii.Error, ValueError):
                pass
    return out

def jsonish(s):
    out = []
    for m in re.findall(r'"(?:[^"\\]|\\.)*"', s):
        try:
            out.append(json.loads(m))
        except ValueError:
            pass
    try:
        out.append(json.loads('"' + s.replace('"', '\\"') + '"'))
    except ValueError:
        pass
    return out

def once(s):
    return [s, html.unescape(s), urllib.parse.unquote(s), urllib.parse.unquote_plus(s)] + jsonish(s) + b64(s)

def decodings(s):
    out = []
    for a in once(s):
        out.extend(once(a))
    return out

async def main_():
    r = {"api": {}, "proxy": {}}
    async with Client(streamable_http_client(os.environ["AIRLOCK_MCP_URL"]), mode="2026-07-28") as c:
        for e in encoders:
            calls = {
                "header": {"target": base + "/a/enc/" + e + "/header"},
                "query": {"target": base + "/a/enc/" + e + "/query?k={{token}}"},
                "path": {"target": base + "/a/enc/" + e + "/path/{{token}}"},
                "body": {"target": base + "/a/enc/" + e + "/body", "method": "POST",
                         "body": "{{token}}", "substituteBody": True},
            }
            for place, args in calls.items():
                res = await c.call_tool("api__api_call", args)
                d = res.model_dump(by_alias=True, mode="json")
                body = res.content[0].text if res.content else ""
                r["api"][e + "/" + place] = {"result": d, "body": body, "decoded": decodings(body)}
        r["runner"] = {}
        for e in encoders:
            res = await c.call_tool("run__fetch", {"url": base + "/r/enc/" + e + "/header"})
            got = json.loads(res.content[0].text)
            got["decoded"] = decodings(got.get("body", ""))
            r["runner"][e] = got
    ph = os.environ["AIRLOCK_PLACEHOLDER_PRX"]
    def curl(url, *extra):
        p = subprocess.run(["curl", "-sS", "--max-time", "30", "-w", "\n%{http_code}", *extra, url],
                           capture_output=True, text=True)
        body, _, code = p.stdout.rpartition("\n")
        return {"code": code, "body": body, "err": p.stderr[-300:], "decoded": decodings(body)}
    for e in encoders:
        r["proxy"][e] = curl(base + "/api/enc/" + e + "/header", "-H", "Authorization: Bearer " + ph)
    # The stored reflection: stored with the placeholder, read without it.
    r["stored"] = curl(base + "/api/note", "-X", "POST", "-H", "Authorization: Bearer " + ph)
    r["read_back"] = curl(base + "/api/note")
    json.dump(r, open(os.environ["AIRLOCK_RESULT_FILE"], "w"))

asyncio.run(main_())
"#;

/// Every string in `v`, lower-cased too: `what` goes into `leaks` if one
/// holds a piece of the secret.
fn check_no_piece(v: &Value, what: &str, leaks: &mut Vec<String>) {
    let text = v.to_string();
    // (`to_string` escapes; the strings themselves are checked too.)
    let mut strings = vec![text];
    fn collect(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
            Value::Object(o) => o.values().for_each(|x| collect(x, out)),
            _ => {}
        }
    }
    collect(v, &mut strings);
    for s in strings {
        let lower = s.to_ascii_lowercase();
        if PIECES
            .iter()
            .any(|p| lower.contains(&p.to_ascii_lowercase()))
        {
            leaks.push(format!(
                "{what}: {}",
                s.chars().take(300).collect::<String>()
            ));
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn no_encoder_carries_the_credential_past_the_sidecar() {
    // The Python MCP SDK and the namespace backend are needed: a failure
    // under CI, a counted skip elsewhere.
    if !python_has(&["mcp", "httpx2"]) || !namespace_available() {
        return;
    }
    // Each encoder works here, before the run (a missing one fails now).
    tokio::task::spawn_blocking(go_json).await.unwrap();
    for (name, _) in ENCODERS {
        assert!(!encode(name, "a/b").await.is_empty(), "{name}");
    }
    let ca = test_ca();
    let ip = "127.0.0.2";
    let port = reflector(ip, &ca).await;
    let base = format!("https://{ip}:{port}");
    let key = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [0x5au8; 32]);
    let run = RealRun::with_manifest(
        AGENT,
        &format!(
            "[agent]\nname = \"encodings\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 300\n\n\
             [[integrations]]\nnamespace = \"api\"\nconnection = \"api\"\n\
             authorized_uris = [\"{base}/a/**\"]\n\
             delivery = {{ header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }}\n\n\
             [[integrations]]\nnamespace = \"prx\"\nconnection = \"prx\"\n\
             authorized_uris = [\"{base}/api/**\"]\n\
             delivery = {{ header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }}\n\
             inject = \"proxy\"\n\n\
             [[integrations]]\nnamespace = \"run\"\nconnection = \"run\"\n\
             authorized_uris = [\"{base}/r/**\"]\n\
             delivery = {{ header = \"Authorization\", prefix = \"Bearer \", field = \"token\" }}\n\
             source = {{ kind = \"local\", command = [\"/usr/bin/python3\", \"runner.py\"] }}\n"
        ),
    )
    .env("EGRESS_ALLOW_INTERNAL_HOSTS", ip)
    .env("CONNECTION_ENCRYPTION_KEY", &key);
    let ca_file = run.home.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, ca.issuer.pem()).unwrap();
    let run = run.env("EGRESS_EXTRA_CA_FILE", ca_file.to_str().unwrap());
    run.vendor("mcp");
    run.add_bearer_connection("api", &json!({"token": SECRET}), &key);
    run.add_bearer_connection("prx", &json!({"token": SECRET}), &key);
    run.add_bearer_connection("run", &json!({"token": SECRET}), &key);
    std::fs::write(run.agent_dir.join("runner.py"), RUNNER).unwrap();

    let names: Vec<&str> = ENCODERS.iter().map(|(n, _)| *n).collect();
    let prompt = format!("{base} {}", names.join(" "));
    let (_run, _out, report) = run.run_prompted("namespace", prompt).await;
    let r = &report["result"];
    // Every leak, so that a failure names each encoder and place that leaked.
    let mut leaks = Vec::new();

    // api_call: each place, each encoder.
    for name in &names {
        for place in ["header", "query", "path", "body"] {
            let key = format!("{name}/{place}");
            let got = &r["api"][&key];
            check_no_piece(got, &format!("api_call {key}"), &mut leaks);
            // The legitimate call: answered, the non-secret part intact.
            let result = &got["result"];
            assert_eq!(result["isError"], json!(false), "{key}: {result}");
            assert_eq!(result["_meta"]["status"], json!(200), "{key}: {result}");
            let body = got["body"].as_str().unwrap();
            assert!(
                body.starts_with("BEGIN") && body.ends_with("END tail-ok"),
                "{key}: {body}"
            );
            if !body.contains("[REDACTED]") {
                leaks.push(format!("api_call {key}: nothing redacted"));
            }
            let decoded = got["decoded"].to_string();
            assert!(
                decoded.contains(&format!("place={place}")),
                "{key}: {decoded}"
            );
        }
    }
    // inject = "proxy": each encoder.
    for name in &names {
        let got = &r["proxy"][*name];
        check_no_piece(got, &format!("proxy {name}"), &mut leaks);
        assert_eq!(got["code"], "200", "{name}: {got}");
        let body = got["body"].as_str().unwrap();
        assert!(
            body.starts_with("BEGIN") && body.ends_with("END tail-ok"),
            "{name}: {body}"
        );
        if !body.contains("[REDACTED]") {
            leaks.push(format!("proxy {name}: nothing redacted"));
        }
    }
    // A local runner's own proxy: each encoder.
    for name in &names {
        let got = &r["runner"][*name];
        check_no_piece(got, &format!("runner {name}"), &mut leaks);
        assert_eq!(got["code"], "200", "{name}: {got}");
        let body = got["body"].as_str().unwrap();
        assert!(
            body.starts_with("BEGIN") && body.ends_with("END tail-ok"),
            "{name}: {body}"
        );
        if !body.contains("[REDACTED]") {
            leaks.push(format!("runner {name}: nothing redacted"));
        }
    }
    // The stored reflection: read back without the placeholder, redacted.
    assert_eq!(r["stored"]["code"], "200", "{}", r["stored"]);
    let back = &r["read_back"];
    check_no_piece(back, "stored reflection", &mut leaks);
    assert_eq!(back["code"], "200", "{back}");
    let body = back["body"].as_str().unwrap();
    assert!(
        body.starts_with("raw=Bearer ") && body.ends_with(" tail-ok"),
        "{body}"
    );
    if !body.starts_with("raw=Bearer [REDACTED] php=") {
        leaks.push("stored reflection: not redacted".into());
    }
    // Nothing of it in the run's report either.
    check_no_piece(&report, "report", &mut leaks);
    assert!(
        leaks.is_empty(),
        "the credential reached the agent {} times:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
}

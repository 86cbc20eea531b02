//! A remote MCP server's tool called through the real `airlock sidecar`
//! (the sidecar as the server's rmcp client: credential fetched from the
//! platform, guard, egress record, redaction) beside the same call made
//! straight to the server, in the same run: alternating call by call, three
//! repetitions, a fresh sidecar for each. The server is the official MCP
//! Python SDK's (`tests/python/mcp_server.py`, uvicorn) on loopback; both
//! calls are stateless 2026-07-28 `tools/call`s on one keep-alive connection.
//!
//! Prints p50/p99 of each path and what the sidecar adds. The platform runs
//! on a runtime of its own, as a deployed platform is a process of its own
//! (`peers::Platform`).
//!
//! Run: `cargo bench -p airlock --bench remote_mcp` (`REMOTE_MCP_BENCH_N`
//! sets the sample count, default 500; `REMOTE_MCP_BENCH_REPS`, default 3).
//! Loopback traffic only.
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure

mod peers;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Instant;

use airlock_store::AuthType;
use airlock_vault::ExposeSecret;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use serde_json::json;

use peers::{client, p50_99};

const HOST: &str = "mcp.internal.test";
const TOKEN: &str = "bench-remote-credential";

/// One stateless `tools/call` of `tool`; panics unless it succeeded.
async fn call(c: &mut SendRequest<Full<Bytes>>, bearer: &str, tool: &str, id: u64) {
    let body = json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {
            "name": tool, "arguments": {"text": "bench"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}
            }
        }
    })
    .to_string();
    let req = hyper::Request::post("/mcp")
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {bearer}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    c.ready().await.expect("connection");
    let resp = c.send_request(req).await.expect("request");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let ok = bytes.windows(5).any(|w| w == b"bench")
        && !bytes.windows(13).any(|w| w == b"\"isError\":tru");
    if status != 200 || !ok {
        panic!(
            "{tool} failed: {status} {}",
            String::from_utf8_lossy(&bytes)
        );
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let p = peers::Platform::start(
        &rt,
        "bench-agent",
        "remote",
        AuthType::Bearer,
        &[("token", TOKEN)],
    );
    rt.block_on(run(&p));
}

async fn run(p: &peers::Platform) {
    let n: usize = std::env::var("REMOTE_MCP_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let reps: usize = std::env::var("REMOTE_MCP_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/mcp_server.py");
    let mut server = match Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            println!("*** MISSING PEER: python3 with the mcp SDK ({e}): no figure ***");
            return;
        }
    };
    server
        .stdin
        .take()
        .unwrap()
        .write_all(
            json!({"mode": "good", "token": TOKEN})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let Ok(port) = line.trim().parse::<u16>() else {
        println!(
            "*** MISSING PEER: the MCP Python SDK server did not start (pip install -r .ci/requirements.txt) ***"
        );
        let _ = server.kill();
        return;
    };
    let up = SocketAddr::from(([127, 0, 0, 1], port));

    println!(
        "remote MCP tools/call, {n} sequential calls per figure, {reps} repetitions, alternating (the MCP Python SDK's server on loopback, keep-alive, 2026-07-28 stateless); load {}",
        peers::load()
    );
    println!("  {}; {}", peers::describe(), p.describe());
    let token = p.sidecar_token.expose_secret().to_owned();
    let mut added_p50 = Vec::new();
    let mut added_p99 = Vec::new();
    for rep in 0..reps {
        let cfg = p
            .sidecar_config()
            .tcp()
            .integration(
                peers::integration("remote")
                    .authorized([format!("http://{HOST}:{port}/**")])
                    .bearer("token")
                    .mcp_url(&format!("http://{HOST}:{port}/mcp")),
            )
            .loopback_host(HOST)
            .build();
        let sc = peers::spawn_sidecar(cfg);
        let sc_addr = sc.tcp();
        let mut d = client(up).await;
        let mut s = client(sc_addr).await;
        for i in 0..50 {
            call(&mut d, TOKEN, "echo", i).await;
            call(&mut s, &token, "remote__echo", i).await;
        }
        let (mut t_direct, mut t_side) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n as u64 {
            let t = Instant::now();
            call(&mut d, TOKEN, "echo", i).await;
            t_direct.push(t.elapsed());
            let t = Instant::now();
            call(&mut s, &token, "remote__echo", i).await;
            t_side.push(t.elapsed());
        }
        let direct = p50_99(t_direct);
        let side = p50_99(t_side);
        let a = (side.0 - direct.0, side.1 - direct.1);
        println!("  rep {rep}:");
        println!(
            "    {:<36} p50 {:>8.1} µs  p99 {:>8.1} µs",
            "direct to the server", direct.0, direct.1
        );
        println!(
            "    {:<36} p50 {:>8.1} µs  p99 {:>8.1} µs  added p50 {:>7.1} p99 {:>7.1}",
            "through the sidecar", side.0, side.1, a.0, a.1
        );
        added_p50.push(a.0);
        added_p99.push(a.1);
        drop(sc);
    }
    println!("summary (median [min–max] of {reps} repetitions):");
    println!(
        "  {:<36} {}",
        "added by the sidecar, p50 µs",
        peers::spread(&added_p50, 1)
    );
    println!(
        "  {:<36} {}",
        "added by the sidecar, p99 µs",
        peers::spread(&added_p99, 1)
    );
    let _ = server.kill();
    let _ = server.wait();
}

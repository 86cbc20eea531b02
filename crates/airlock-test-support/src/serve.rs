//! `airlock serve` as the suite and the benches start it: a process of the
//! build under test on `127.0.0.1:0`, its address read from its log; the
//! CLI that makes its organizations; an agent's registration body.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// `exe` (the `airlock` under test) with `env`, and none of the variables
/// of the caller's that would point it at another store, adapter or limits.
pub fn command(exe: &Path, env: &[(String, String)]) -> Command {
    let mut c = Command::new(exe);
    c.env_remove("DATABASE_URL")
        .env_remove("RUN_ADAPTER")
        .env_remove("PLATFORM_RUN_LIMITS");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// A started `airlock serve`: its process, its address, its replica's name.
pub struct Started {
    pub child: Child,
    pub addr: std::net::SocketAddr,
    pub replica: String,
}

/// Starts `exe serve --listen 127.0.0.1:0 --backend BACKEND` with `env`, its
/// log (stderr) in `log`, and returns once it listens, or, with `ready`,
/// once it has also said it takes work (`airlock serve: ready`). Panics
/// with the log if it exits first or takes over a minute.
pub fn spawn(
    exe: &Path,
    env: &[(String, String)],
    backend: &str,
    log: &Path,
    ready: bool,
) -> Started {
    let file = std::fs::File::create(log).expect("the server's log file");
    let mut child = command(exe, env)
        .args(["serve", "--listen", "127.0.0.1:0", "--backend", backend])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("airlock serve");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        // Only whole lines: the server may be writing one as it is read.
        let mut lines = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(str::trim_end);
        let listening = lines.clone().find(|l| l.contains("listening on http://"));
        let said_ready = !ready || lines.any(|l| l == "airlock serve: ready");
        if let (Some(line), true) = (listening, said_ready) {
            let addr = line
                .split("http://")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|a| a.parse().ok())
                .expect("address in the listening line");
            let replica = line
                .split("(replica ")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .unwrap_or_default()
                .to_owned();
            return Started {
                child,
                addr,
                replica,
            };
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("airlock serve exited ({st}) before listening:\n{text}");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("airlock serve did not start:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `exe orgs create NAME …` with `env`: the org id and its first API key.
pub fn create_org(
    exe: &Path,
    env: &[(String, String)],
    name: &str,
    extra: &[&str],
) -> (String, String) {
    let out = command(exe, env)
        .args(["orgs", "create", name])
        .args(extra)
        .output()
        .expect("airlock orgs create");
    assert!(
        out.status.success(),
        "airlock orgs create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON from airlock orgs create");
    (
        v["org"].as_str().unwrap_or_default().to_owned(),
        v["api_key"]
            .as_str()
            .expect("an API key from airlock orgs create")
            .to_owned(),
    )
}

/// A registered agent: `script` as `agent.py`, run by Debian's python3,
/// no egress.
pub fn agent_body(name: &str, script: &str, timeout: u64) -> Value {
    json!({
        "manifest": format!("[agent]\nname = \"{name}\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = {timeout}\n\n[network]\negress = \"none\"\n"),
        "files": { "agent.py": script },
    })
}

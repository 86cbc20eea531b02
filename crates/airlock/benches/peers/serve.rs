//! `airlock serve` for the benches: started on a home of its own, reached
//! over keep-alive HTTP/1.1 on loopback; an organization, a trivial agent,
//! runs posted and waited for.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
pub const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");
pub const SECRET: &str = "bench-api-auth-secret-0123456789";
pub const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
pub const TRIVIAL: &str =
    "import os\nprint('ran', open(os.environ['AIRLOCK_PROMPT_FILE']).read(), flush=True)\n";

/// One keep-alive HTTP/1.1 connection.
pub struct Conn {
    r: BufReader<TcpStream>,
    host: String,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            r: BufReader::new(s),
            host: addr.to_string(),
        }
    }

    pub fn req(
        &mut self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Vec<u8>) {
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.host);
        if let Some(k) = key {
            head.push_str(&format!("authorization: Bearer {k}\r\n"));
        }
        let body = body.unwrap_or("");
        if !body.is_empty() {
            head.push_str(&format!(
                "content-type: application/json\r\ncontent-length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        let s = self.r.get_mut();
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body.as_bytes()).unwrap();
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut len = 0usize;
        loop {
            line.clear();
            self.r.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap();
            }
        }
        let mut b = vec![0; len];
        self.r.read_exact(&mut b).unwrap();
        (status, b)
    }

    pub fn json(
        &mut self,
        method: &str,
        path: &str,
        key: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let (st, b) = self.req(
            method,
            path,
            Some(key),
            body.map(|b| b.to_string()).as_deref(),
        );
        (st, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }
}

pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub env: Vec<(String, String)>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn base_env(home: &Path, limits: Option<&str>) -> Vec<(String, String)> {
    let mut e = vec![
        ("AIRLOCK_HOME".to_owned(), home.display().to_string()),
        ("API_AUTH_SECRET".to_owned(), SECRET.to_owned()),
        ("CONNECTION_ENCRYPTION_KEY".to_owned(), KEY.to_owned()),
        ("API_RATE_PER_SECOND".to_owned(), "1000000".to_owned()),
        ("API_RATE_BURST".to_owned(), "1000000".to_owned()),
    ];
    if let Some(l) = limits {
        e.push(("PLATFORM_RUN_LIMITS".to_owned(), l.to_owned()));
    }
    e
}

pub fn cmd(env: &[(String, String)]) -> Command {
    let mut c = Command::new(AIRLOCK);
    c.env_remove("DATABASE_URL")
        .env_remove("RUN_ADAPTER")
        .env_remove("PLATFORM_RUN_LIMITS");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

pub fn start(home: &Path, backend: &str, limits: Option<&str>) -> Server {
    start_env(home, backend, base_env(home, limits))
}

/// `airlock serve` on `home` with `env` (its [`base_env`] and more).
#[allow(clippy::zombie_processes)] // the Server's Drop kills it and waits for it
pub fn start_env(home: &Path, backend: &str, env: Vec<(String, String)>) -> Server {
    let log = home.join("serve.log");
    let mut child = cmd(&env)
        .args(["serve", "--listen", "127.0.0.1:0", "--backend", backend])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // The address is printed when the listener is bound, before the replica takes work
        // (it answers 503 until then): wait for the ready line too.
        let ready = text.lines().any(|l| l == "airlock serve: ready");
        if let Some(a) = ready
            .then(|| text.lines())
            .into_iter()
            .flatten()
            .find_map(|l| l.split("listening on http://").nth(1))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|a| a.parse().ok())
        {
            return Server {
                child,
                addr: a,
                env,
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("airlock serve did not start:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn org(s: &Server) -> String {
    let out = cmd(&s.env)
        .args(["orgs", "create", "bench"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["api_key"].as_str().unwrap().to_owned()
}

pub fn agent(name: &str) -> Value {
    json!({
        "manifest": format!("[agent]\nname = \"{name}\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 60\n\n[network]\negress = \"none\"\n"),
        "files": { "agent.py": TRIVIAL },
    })
}

pub fn wait_all_ended(c: &mut Conn, key: &str, ids: &[String], secs: u64) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut done = vec![Value::Null; ids.len()];
    loop {
        let mut left = 0;
        for (i, id) in ids.iter().enumerate() {
            if !done[i].is_null() {
                continue;
            }
            let (_, v) = c.json("GET", &format!("/v1/runs/{id}"), key, None);
            if v["status"]
                .as_str()
                .is_some_and(|s| s != "queued" && s != "running")
            {
                done[i] = v;
            } else {
                left += 1;
            }
        }
        if left == 0 {
            return done;
        }
        assert!(
            Instant::now() < deadline,
            "{left} runs did not end within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn post_runs(c: &mut Conn, key: &str, agent: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let (st, v) = c.json(
                "POST",
                "/v1/runs",
                key,
                Some(&json!({"agent": agent, "prompt": format!("p{i}")})),
            );
            assert_eq!(st, 202, "{v}");
            v["id"].as_str().unwrap().to_owned()
        })
        .collect()
}

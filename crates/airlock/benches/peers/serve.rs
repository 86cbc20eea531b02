//! `airlock serve` for the benches: started on a home of its own (as the
//! suite starts it, test-support's [`airlock_test_support::serve`]),
//! reached over keep-alive HTTP/1.1 on loopback; an organization, a trivial
//! agent, runs posted and waited for; a cold server beside a warm one.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command};
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
    airlock_test_support::serve::command(Path::new(AIRLOCK), env)
}

pub fn start(home: &Path, backend: &str, limits: Option<&str>) -> Server {
    start_env(home, backend, base_env(home, limits))
}

/// `airlock serve` on `home` with `env` (its [`base_env`] and more), once
/// it has said it takes work (it answers 503 until then).
pub fn start_env(home: &Path, backend: &str, env: Vec<(String, String)>) -> Server {
    let log = home.join("serve.log");
    let started = airlock_test_support::serve::spawn(Path::new(AIRLOCK), &env, backend, &log, true);
    Server {
        child: started.child,
        addr: started.addr,
        env,
    }
}

pub fn org(s: &Server) -> String {
    airlock_test_support::serve::create_org(Path::new(AIRLOCK), &s.env, "bench", &[]).1
}

/// The agent `name`: [`TRIVIAL`], its timeout 60 s.
pub fn agent(name: &str) -> Value {
    airlock_test_support::serve::agent_body(name, TRIVIAL, 60)
}

/// Two servers of this build on `backend`, each on a home of its own
/// (prefixed `prefix`), `limits` their run limits: the first without a
/// warm pool (the baseline), the second with `pool` (its variable and
/// size); on each an organization and the agent `trivial`, and a
/// connection with its key.
pub struct ColdAndWarm {
    pub homes: Vec<tempfile::TempDir>,
    pub servers: [Server; 2],
    pub sides: Vec<(Conn, String)>,
}

impl ColdAndWarm {
    pub fn start(backend: &str, prefix: &str, limits: Option<&str>, pool: (&str, usize)) -> Self {
        let homes: Vec<tempfile::TempDir> = (0..2)
            .map(|_| tempfile::Builder::new().prefix(prefix).tempdir().unwrap())
            .collect();
        let mut warm_env = base_env(homes[1].path(), limits);
        warm_env.push((pool.0.into(), pool.1.to_string()));
        let servers = [
            start_env(homes[0].path(), backend, base_env(homes[0].path(), limits)),
            start_env(homes[1].path(), backend, warm_env),
        ];
        let sides = servers
            .iter()
            .map(|s| {
                let key = org(s);
                let mut c = Conn::open(s.addr);
                assert_eq!(
                    c.json("POST", "/v1/agents", &key, Some(&agent("trivial")))
                        .0,
                    201
                );
                (c, key)
            })
            .collect();
        ColdAndWarm {
            homes,
            servers,
            sides,
        }
    }

    /// Stops both as an operator stops them (SIGTERM): the idle warm
    /// sandboxes go with their server.
    pub fn stop(self) {
        for mut s in self.servers {
            terminate(&mut s);
        }
    }
}

/// SIGTERM to `s`, then waits for it to exit.
pub fn terminate(s: &mut Server) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(s.child.id()).unwrap()).unwrap();
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let _ = s.child.wait();
}

/// One run of `trivial` (prompt `p<round>`) to its success, polled every
/// `poll` for up to `within`: its span as the server records it
/// (`ended_at - created_at`), and from the POST until the client saw it
/// ended.
pub fn timed_run(
    c: &mut Conn,
    key: &str,
    round: usize,
    within: Duration,
    poll: Duration,
) -> (Duration, Duration) {
    let t = Instant::now();
    let (st, v) = c.json(
        "POST",
        "/v1/runs",
        key,
        Some(&json!({"agent": "trivial", "prompt": format!("p{round}")})),
    );
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    loop {
        let (_, r) = c.json("GET", &format!("/v1/runs/{id}"), key, None);
        if let Some(end) = r["ended_at"].as_u64() {
            let seen = t.elapsed();
            assert_eq!(r["status"], "succeeded", "{r}");
            let start = r["created_at"].as_u64().unwrap();
            return (Duration::from_millis(end - start), seen);
        }
        assert!(t.elapsed() < within, "run {id} never ended");
        std::thread::sleep(poll);
    }
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

//! The benches' sidecar and platform under test (the `airlock` of this
//! build, or `AIRLOCK_BENCH_BASELINE`'s); the peers (`nginx`, `squid`) and
//! the statistics every bench prints are test-support's `bench` module,
//! re-exported here.
#![allow(dead_code)] // each bench uses part of it

pub use airlock_test_support::bench::*;
use airlock_test_support::sidecar::SidecarReady;
#[allow(unused_imports)] // each bench uses part of it
pub use airlock_test_support::sidecar_config::{Provider, SidecarConfigBuilder, integration};
use airlock_test_support::sidecar_config::{SidecarConfig, document};

pub mod runs;
pub mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `AIRLOCK_BENCH_BASELINE=/path/to/older/airlock`: measure that build
/// instead (a change's "before", beside the same peer), with what it had:
/// no egress journal in the sidecar's configuration, no connection cache in
/// the platform.
pub fn baseline() -> Option<PathBuf> {
    std::env::var_os("AIRLOCK_BENCH_BASELINE").map(PathBuf::from)
}

/// The `airlock` binary under test.
pub fn airlock_exe() -> PathBuf {
    baseline().unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_airlock")))
}

/// The sidecar under test, as the platform starts it (`airlock-sidecar`
/// where the build has it, else `airlock sidecar`).
pub fn sidecar_command() -> (PathBuf, &'static [&'static str]) {
    match airlock_sandbox::own_sidecar_binary(&airlock_exe(), airlock_sidecar::BUILD) {
        Some(own) => (own, &[]),
        None => (airlock_exe(), &["sidecar"]),
    }
}

/// Whether the sidecar under test gets an egress journal.
pub fn with_journal() -> bool {
    baseline().is_none()
}

/// The test platform as the build under test had it.
pub fn platform_like_the_build(p: &airlock_platform::testing::TestPlatform) {
    p.api.set_connection_cache(baseline().is_none());
}

/// The bench's platform (the test platform: store, keyring, internal API,
/// journal follower), as the build under test has it.
///
/// It runs on a runtime of its own shaped like the `airlock` binary's (two
/// workers, `cmd::multi_thread_runtime`): a deployed platform is a process
/// of its own, and on the runtime that also drives the bench's clients and
/// upstream every answer it gives would wait behind the bench's own work.
/// `AIRLOCK_BENCH_SHARED_PLATFORM=1` puts it on the bench's runtime instead
/// (the arrangement before, for comparison).
pub struct Platform {
    // Declared first: dropped (its tasks stopped) before its runtime.
    p: airlock_platform::testing::TestPlatform,
    own: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl Platform {
    /// Starts the platform with one run of `agent` and the connection
    /// `integration` (one `fields` credential), from outside any runtime;
    /// `bench` is the bench's runtime.
    pub fn start(
        bench: &tokio::runtime::Runtime,
        agent: &str,
        integration: &str,
        auth: airlock_store::AuthType,
        fields: &[(&str, &str)],
    ) -> Platform {
        let own = if std::env::var_os("AIRLOCK_BENCH_SHARED_PLATFORM").is_some() {
            None
        } else {
            Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("bench-platform")
                    .enable_all()
                    .build()
                    .expect("platform runtime"),
            )
        };
        let handle = own
            .as_ref()
            .map_or_else(|| bench.handle().clone(), |rt| rt.handle().clone());
        let p = handle.block_on(async {
            let p = airlock_platform::testing::TestPlatform::start(agent).await;
            platform_like_the_build(&p);
            p.add_connection(integration, auth, fields).await;
            p
        });
        Platform { p, own, handle }
    }

    /// Where the platform's runtime is: one of its own, or the bench's.
    pub fn describe(&self) -> &'static str {
        if self.own.is_some() {
            "platform on a runtime of its own (2 workers, as the airlock binary's)"
        } else {
            "platform on the bench's runtime (AIRLOCK_BENCH_SHARED_PLATFORM)"
        }
    }

    /// The platform's runtime, to serve something else as the platform.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl std::ops::Deref for Platform {
    type Target = airlock_platform::testing::TestPlatform;
    fn deref(&self) -> &Self::Target {
        &self.p
    }
}

/// The sidecar under test ([`airlock_exe`]), stopped when dropped.
pub struct Sidecar {
    pub child: Child,
    pub ready: SidecarReady,
}

impl Sidecar {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The API's TCP address.
    pub fn tcp(&self) -> SocketAddr {
        self.ready
            .listen
            .tcp
            .expect("the sidecar has no tcp listener")
    }

    /// The forward proxy's TCP address.
    pub fn proxy_tcp(&self) -> SocketAddr {
        self.ready
            .listen
            .proxy_tcp
            .expect("the sidecar has no proxy listener")
    }

    /// The API's unix socket.
    pub fn unix(&self) -> PathBuf {
        self.ready
            .listen
            .unix
            .clone()
            .expect("the sidecar has no unix listener")
    }
}

impl Drop for Sidecar {
    /// SIGTERM (a profiler around it writes its profile), then SIGKILL.
    fn drop(&mut self) {
        if let Some(pid) = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the sidecar with `cfg` on stdin (the journal left out when
/// [`with_journal`] says so) and waits for its readiness line.
pub fn spawn_sidecar(mut cfg: SidecarConfig) -> Sidecar {
    use std::io::{BufRead, BufReader, Read, Write};
    if !with_journal() {
        cfg.egress_journal = None;
    }
    // `AIRLOCK_BENCH_WRAP="valgrind --tool=callgrind …"`: the sidecar runs
    // under that command (for its instruction profile).
    let wrap: Vec<String> = std::env::var("AIRLOCK_BENCH_WRAP")
        .map(|w| w.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    let (program, args) = sidecar_command();
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(program);
            c
        }
        None => Command::new(program),
    };
    let mut child = cmd
        .args(args)
        .env("AIRLOCK_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start airlock sidecar");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&document(&cfg))
        .expect("config");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("readiness line");
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = out.read_to_end(&mut rest);
    });
    let ready = SidecarReady::from_line(&line)
        .unwrap_or_else(|why| panic!("the sidecar did not start ({why}): {line:?}"));
    Sidecar { child, ready }
}

/// What is measured: the sidecar's command line.
pub fn describe() -> String {
    let (program, args) = sidecar_command();
    format!(
        "sidecar under test: {} {}",
        program.display(),
        args.join(" ")
    )
}

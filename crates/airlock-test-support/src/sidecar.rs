//! A real sidecar process (`airlock sidecar` of the binary the caller names)
//! fed a configuration of the launch contract ([`crate::sidecar_config`]),
//! ready when its typed readiness line ([`SidecarReady`]) says so.
#![allow(clippy::unwrap_used)] // test support: a panic is the calling test's failure

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use airlock_platform_api::launch::SidecarReady;

use crate::sidecar_config::{SidecarConfig, document};

/// A running `airlock sidecar`. SIGTERM then SIGKILL on drop.
pub struct SidecarProcess {
    pub child: Child,
    /// The readiness line.
    pub ready: SidecarReady,
    stderr: Arc<Mutex<String>>,
    /// Told when the log pipe reaches its end (the sidecar has exited).
    stderr_done: std::sync::mpsc::Receiver<()>,
    /// The log was read to its end (by an earlier stop).
    stderr_complete: bool,
}

impl SidecarProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    pub fn tcp(&self) -> SocketAddr {
        self.ready.listen.tcp.expect("sidecar has no tcp listener")
    }
    pub fn proxy_tcp(&self) -> SocketAddr {
        self.ready
            .listen
            .proxy_tcp
            .expect("sidecar has no proxy listener")
    }
    pub fn unix(&self) -> PathBuf {
        self.ready
            .listen
            .unix
            .clone()
            .expect("sidecar has no unix listener")
    }
    /// Everything the sidecar logged so far: all of it once
    /// [`SidecarProcess::stop`] has returned (what a check that a secret is
    /// *not* in the log must read).
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
    /// Stops it with SIGTERM (so it flushes its events), waits for it to
    /// exit (SIGKILL after 5 s) and for its log to be read to the end.
    pub fn stop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !matches!(self.child.try_wait(), Ok(Some(_))) {
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !self.stderr_complete {
            self.stderr_complete = self
                .stderr_done
                .recv_timeout(Duration::from_secs(10))
                .is_ok();
            assert!(
                self.stderr_complete || std::thread::panicking(),
                "the sidecar's log pipe stayed open after it exited"
            );
        }
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

impl SidecarProcess {
    /// Starts `exe sidecar` with `config` on stdin and waits for readiness.
    /// `log` sets `AIRLOCK_LOG` (e.g. `trace` for the canary tests).
    pub fn spawn(exe: &Path, config: &SidecarConfig, log: &str) -> SidecarProcess {
        let mut child = piped_sidecar(exe)
            .env("AIRLOCK_LOG", log)
            .spawn()
            .expect("start airlock sidecar");
        {
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(&document(config)).expect("write config");
        }
        let stderr = Arc::new(Mutex::new(String::new()));
        let err_pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        let (done, stderr_done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(err_pipe);
            let mut line = String::new();
            while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
            let _ = done.send(());
        });
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so the sidecar never blocks on a full pipe.
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest);
        });
        let line = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
        let ready = match SidecarReady::from_line(&line) {
            Ok(ready) => ready,
            Err(why) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = stderr_done.recv_timeout(Duration::from_secs(10));
                panic!(
                    "sidecar did not become ready ({why}): stdout {line:?}, stderr:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        SidecarProcess {
            child,
            ready,
            stderr,
            stderr_done,
            stderr_complete: false,
        }
    }
}

/// `exe sidecar`, its three streams pipes.
fn piped_sidecar(exe: &Path) -> Command {
    let mut c = Command::new(exe);
    c.arg("sidecar")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Starts `exe sidecar` with `document` on stdin (then closed) for a
/// sidecar that must refuse it, and returns what it printed and how it
/// ended. Panics if it has not exited within 20 s (it took the document).
pub fn refused(exe: &Path, document: &[u8]) -> std::process::Output {
    let mut child = piped_sidecar(exe).spawn().expect("start airlock sidecar");
    let pid = child.id();
    let written = child.stdin.take().expect("stdin").write_all(document);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(out) => {
            // A sidecar that exits before reading all of it closes the pipe:
            // the refusal is what its exit says, not the write's error.
            drop(written);
            out.expect("wait for airlock sidecar")
        }
        Err(_) => {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .status();
            let out = rx.recv().ok().and_then(Result::ok);
            panic!(
                "the sidecar did not exit within 20 s of its document: it started. stderr:\n{}",
                out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                    .unwrap_or_default()
            );
        }
    }
}

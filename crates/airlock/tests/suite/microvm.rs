//! `airlock run` on the microvm backend, with a real QEMU (TCG here): the
//! lifecycle (a trivial run, a failing run with its true reason, a timeout
//! that kills the VM), the canary (no secret on the kernel command line, in
//! the guest's environment or image), escapes from inside the guest (no
//! network device, the host's and other runs' files, the channel's device
//! and framing abused by an agent posing as the runtime), and boot reclaim
//! after SIGKILL of the platform. Needs the guest: `airlock images build
//! --microvm` (`.ci/run` builds it into MICROVM_IMAGES_DIR).
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub(crate) const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");

/// The guest of this build, or why the tests cannot run.
pub(crate) fn guest() -> Option<()> {
    let found = (|| -> Result<(), String> {
        let dir = airlock_sandbox::microvm::image::images_dir().map_err(|e| e.to_string())?;
        // A guest of any build: the platform's boot builds this build's root.
        let kernel = std::fs::read_dir(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("kernel-"));
        if !kernel {
            return Err(format!(
                "no guest in {}: airlock images build --microvm",
                dir.display()
            ));
        }
        Command::new("qemu-system-x86_64")
            .arg("--version")
            .output()
            .map_err(|e| format!("qemu-system-x86_64: {e}"))?;
        this_builds_guest()
    })();
    airlock_test_support::require_peer("the microVM guest and QEMU", found)
}

/// The guest of this test binary's `airlock` (its root image is per build),
/// made once for every test here before any is timed: a platform's boot
/// would otherwise build it, in each test at once, inside their deadlines.
fn this_builds_guest() -> Result<(), String> {
    static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = Command::new(AIRLOCK)
                .args(["images", "build", "--microvm"])
                .env_remove("DATABASE_URL")
                .output()
                .map_err(|e| format!("{AIRLOCK} images build --microvm: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "airlock images build --microvm: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(())
        })
        .clone()
}

fn manifest(dir: &Path, command: &str, timeout: u64) -> PathBuf {
    let p = dir.join("airlock.toml");
    std::fs::write(
        &p,
        format!("[agent]\nname = \"t\"\ncommand = [\"/bin/sh\", \"-c\", {command:?}]\ntimeout = {timeout}\nmemory_mb = 512\ncpus = 1\n\n[network]\negress = \"none\"\n"),
    )
    .unwrap();
    p
}

fn command(home: &Path, manifest: &Path) -> Command {
    let mut cmd = Command::new(AIRLOCK);
    cmd.args(["run", "--backend", "microvm", "--json", "-f"])
        .arg(manifest)
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL");
    cmd
}

fn run(home: &Path, manifest: &Path) -> (Output, Value) {
    let out = command(home, manifest).output().unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, json)
}

/// PIDs of the VMMs of run `id` (QEMU's `-name airlock-<id>`).
/// The session and controlling terminal (`tty_nr`, 0 for none) of `pid`.
fn session_and_tty(pid: u32) -> (i64, i64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After "(comm) ": state, ppid, pgrp, session, tty_nr.
    let f: Vec<i64> = stat
        .rsplit_once(") ")
        .unwrap()
        .1
        .split(' ')
        .skip(1)
        .take(4)
        .map(|v| v.parse().unwrap())
        .collect();
    (f[2], f[3])
}

fn vmms(id: &str) -> Vec<u32> {
    let name = format!("airlock-{id}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == name.as_bytes()))
        })
        .collect()
}

/// What `uname -r` says in a guest booting `MICROVM_KERNEL=choice` (unset:
/// the default, the minimal kernel where it is built): the minimal kernel's
/// local version, or Debian's cloud flavour.
fn guest_release(choice: Option<&str>) -> &'static str {
    use airlock_sandbox::microvm::{image, kernel};
    let choice = choice.map_or(kernel::KernelChoice::Default, |c| {
        kernel::KernelChoice::parse(c).unwrap()
    });
    let dir = image::images_dir().unwrap();
    match image::GuestImage::find_with(&dir, Path::new(AIRLOCK), choice)
        .unwrap()
        .kind
    {
        kernel::KernelKind::Minimal => "-airlock",
        kernel::KernelKind::Debian => "cloud-amd64",
    }
}

fn no_leftovers(home: &Path, id: &str) {
    let runs: Vec<_> = std::fs::read_dir(home.join("runs"))
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        runs.is_empty(),
        "run directories (disk images) left behind: {runs:?}"
    );
    assert!(vmms(id).is_empty(), "a VMM of {id} is still running");
}

fn stdout_of(home: &Path, id: &str) -> String {
    let logs = Command::new(AIRLOCK)
        .args(["runs", "logs", id])
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    String::from_utf8_lossy(&logs.stdout).into_owned()
}

/// A trivial run succeeds inside the guest, with its result; a failing one
/// fails with its own exit code; one past its timeout is timed out and its
/// VM is gone; nothing of any is left.
#[test]
fn lifecycle_success_failure_and_timeout() {
    if guest().is_none() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let agent = tempfile::tempdir().unwrap();
    let m = manifest(
        agent.path(),
        "echo hello from the guest; uname -r; echo '{\"ok\":true}' > \"$AIRLOCK_RESULT_FILE\"",
        240,
    );
    let (out, json) = run(home.path(), &m);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(json["status"], "succeeded", "{json}");
    assert_eq!(json["backend"], "microvm");
    assert_eq!(json["result"]["ok"], true, "{json}");
    let id = json["id"].as_str().unwrap().to_owned();
    let logs = stdout_of(home.path(), &id);
    assert!(logs.contains("hello from the guest"), "{logs}");
    let release = guest_release(None);
    assert!(logs.contains(release), "not the guest's kernel: {logs}");
    assert!(stderr.contains("TCG") || stderr.contains("kvm"), "{stderr}");
    no_leftovers(home.path(), &id);

    // A failing run: the agent's own code; a command that does not exist:
    // the runtime's true reason.
    let m = manifest(agent.path(), "echo failing >&2; exit 3", 240);
    let (out, json) = run(home.path(), &m);
    assert_eq!(out.status.code(), Some(3), "{json}");
    assert_eq!(json["exit_code"], 3);
    let p = agent.path().join("airlock.toml");
    std::fs::write(
        &p,
        "[agent]\nname = \"t\"\ncommand = [\"/no/such/agent\"]\ntimeout = 240\nmemory_mb = 512\n",
    )
    .unwrap();
    let (_, json) = run(home.path(), &p);
    assert_eq!(json["status"], "failed", "{json}");
    let error = json["error"].as_str().unwrap_or_default();
    assert!(error.contains("/no/such/agent"), "{error}");

    // The timeout kills the VM.
    let m = manifest(agent.path(), "sleep 600", 20);
    let started = std::time::Instant::now();
    let (_, json) = run(home.path(), &m);
    assert_eq!(json["status"], "timed_out", "{json}");
    assert!(started.elapsed().as_secs() < 60);
    no_leftovers(home.path(), json["id"].as_str().unwrap());
}

/// The canary and the escapes, from inside one guest: the sidecar token is
/// on no kernel command line and in no environment; the guest has no
/// network interface but loopback and reaches no host address; a file on
/// the host (another run's, say) is not in the guest; the channel's device
/// cannot be opened by the agent; bytes shaped as the channel's frames
/// (a forged end with a made-up nonce) written to the sidecar's socket and
/// to the agent's output are data, and the run ends with its true code.
#[test]
fn the_guest_holds_no_secret_and_reaches_nothing_but_its_sidecar() {
    if guest().is_none() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let secret_dir = tempfile::tempdir().unwrap();
    let host_file = secret_dir.path().join("other-run-secret.txt");
    std::fs::write(&host_file, "HOST-CANARY-0f1e2d3c").unwrap();
    // The exit frame: kind 7, stream 0, 20 bytes (a nonce of zeros, code 0).
    let forged = r"\007\000\000\000\000\000\000\000\024\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000";
    let script = format!(
        "echo CMDLINE $(cat /proc/cmdline); env | sed 's/^/ENV /'; \
         echo NETDEVS $(sed -n '3,$p' /proc/net/dev | cut -d: -f1); \
         cat {host} 2>&1 | sed 's/^/HOSTFILE /'; \
         ls /dev/vport* 2>&1 | sed 's/^/PORTS /'; \
         for p in /dev/vport*; do (echo x > $p) 2>&1 | sed 's/^/PORTWRITE /'; done; \
         python3 -c 'import socket; s=socket.create_connection((\"10.0.2.2\", 80), 3)' 2>&1 | tail -1 | sed 's/^/DIAL /'; \
         printf '{forged}' | python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(\"/run/airlock/sidecar.sock\"); s.sendall(sys.stdin.buffer.read()); s.settimeout(5); print(\"SIDECAR\", s.recv(200)[:12])' 2>&1; \
         printf '{forged}'; echo; exit 7",
        host = host_file.display(),
    );
    let agent = tempfile::tempdir().unwrap();
    let m = manifest(agent.path(), &script, 240);
    let (out, json) = run(home.path(), &m);
    assert_eq!(json["exit_code"], 7, "the forged end was taken: {json}");
    assert_eq!(out.status.code(), Some(7));
    let id = json["id"].as_str().unwrap().to_owned();
    let logs = stdout_of(home.path(), &id);
    let cmdline = logs.lines().find(|l| l.starts_with("CMDLINE")).unwrap();
    assert!(cmdline.contains("rdinit=/init"), "{cmdline}");
    let hexrun = |s: &str| {
        s.split(|c: char| !c.is_ascii_hexdigit())
            .any(|w| w.len() >= 64)
    };
    assert!(
        !hexrun(cmdline),
        "a token on the kernel command line: {cmdline}"
    );
    let env: Vec<&str> = logs.lines().filter(|l| l.starts_with("ENV ")).collect();
    assert!(env.iter().any(|l| l.contains("AIRLOCK_MCP_URL")), "{logs}");
    assert!(
        !env.iter().any(|l| hexrun(l)),
        "a token in the agent's environment"
    );
    assert!(logs.contains("NETDEVS lo"), "{logs}");
    assert!(!logs.contains("eth0"), "{logs}");
    assert!(
        !logs.contains("HOST-CANARY"),
        "a host file reached the guest"
    );
    assert!(logs.contains("No such file"), "{logs}");
    let writes: Vec<&str> = logs
        .lines()
        .filter(|l| l.starts_with("PORTWRITE"))
        .collect();
    assert!(
        writes
            .iter()
            .all(|l| l.contains("Permission denied") || l.contains("Device or resource busy")),
        "the agent could write to the channel's device: {logs}"
    );
    let dial = logs.lines().find(|l| l.starts_with("DIAL")).unwrap();
    assert!(dial.contains("unreachable"), "{dial}");
    let sidecar = logs.lines().find(|l| l.starts_with("SIDECAR")).unwrap();
    assert!(sidecar.contains("HTTP/1.1 4"), "{sidecar}");
    // The guest's root image on the host holds no secret either.
    let dir = airlock_sandbox::microvm::image::images_dir().unwrap();
    let image =
        airlock_sandbox::microvm::image::GuestImage::find(&dir, Path::new(AIRLOCK)).unwrap();
    let initrd = std::fs::read(&image.initrd).unwrap();
    assert!(!initrd.windows(12).any(|w| w == b"sidecar_toke"));
    no_leftovers(home.path(), &id);
}

/// A platform killed with SIGKILL mid-run takes its VM with it (the VMM
/// dies with its helper, the helper with the platform), and the next boot
/// reclaims the run: no VMM, no run directory (the agent's disk image, the
/// sockets) is left.
#[test]
fn a_killed_platform_leaves_no_vm_behind() {
    if guest().is_none() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let agent = tempfile::tempdir().unwrap();
    let m = manifest(agent.path(), "sleep 600", 600);
    let mut child = command(home.path(), &m)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The run's VMM appears once the run has started.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let id = loop {
        let ids: Vec<String> = std::fs::read_dir(home.path().join("runs"))
            .map(|r| {
                r.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        if let Some(id) = ids.into_iter().find(|id| !vmms(id).is_empty()) {
            break id;
        }
        assert!(std::time::Instant::now() < deadline, "no VMM started");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    // The VMM is out of the platform's session (an operator's, with its
    // terminal: a Ctrl-C there reached QEMU itself, and a VMM the guest
    // took over could have typed into it): its helper leads its own.
    let (platform_session, _) = session_and_tty(child.id());
    for vmm in vmms(&id) {
        let (session, tty) = session_and_tty(vmm);
        assert_ne!(
            session, platform_session,
            "the VMM {vmm} is in the platform's session"
        );
        assert_eq!(tty, 0, "the VMM {vmm} has a controlling terminal");
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !vmms(&id).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the VMM outlived its platform"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The next platform's boot reclaims the run's directory.
    let m = manifest(agent.path(), "true", 240);
    let (_, json) = run(home.path(), &m);
    assert_eq!(json["status"], "succeeded", "{json}");
    no_leftovers(home.path(), &id);
}

/// Debian's cloud kernel stays the fallback: `MICROVM_KERNEL=debian` boots
/// it (where it is built) and the run succeeds in it; a kernel the backend
/// does not know is refused, naming the variable, before any VM starts.
#[test]
fn the_debian_kernel_is_the_fallback_and_an_unknown_one_is_refused() {
    if guest().is_none() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let agent = tempfile::tempdir().unwrap();
    let m = manifest(agent.path(), "uname -r", 240);
    let out = command(home.path(), &m)
        .env("MICROVM_KERNEL", "tiny")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("MICROVM_KERNEL"), "{stderr}");
    let dir = airlock_sandbox::microvm::image::images_dir().unwrap();
    let debian = std::fs::read_dir(&dir).unwrap().flatten().any(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        n.starts_with("kernel-") && !n.starts_with("kernel-min-")
    });
    if !debian {
        eprintln!("no Debian kernel in {}: its boot not tried", dir.display());
        return;
    }
    let out = command(home.path(), &m)
        .env("MICROVM_KERNEL", "debian")
        .output()
        .unwrap();
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        json["status"],
        "succeeded",
        "{json} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = json["id"].as_str().unwrap().to_owned();
    let logs = stdout_of(home.path(), &id);
    assert!(logs.contains(guest_release(Some("debian"))), "{logs}");
    no_leftovers(home.path(), &id);
}

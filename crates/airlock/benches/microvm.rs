//! The microvm backend's boot, beside its floor, measured in the same run
//! and the same loop (alternating, so all see the same load), for each
//! kernel that is built (the minimal one, the default, and Debian's
//! cloud kernel, the fallback):
//!
//! - **boot to agent**: the backend's `spawn` of a guest whose command
//!   prints one line, until that line reaches the host over the channel
//!   (QEMU started by the helper, the kernel, the initramfs's modules, the
//!   root mounted, `vm-init`'s view built, the header over the channel, the
//!   command started), and until the sandbox has exited;
//! - **QEMU with `/bin/true` as init**: the same QEMU machine and kernel,
//!   an initramfs whose `/init` powers the guest off at once, until QEMU exits.
//!
//! The image's load into the page cache is not measured: one untimed boot
//! of each kernel comes first.
//!
//! Then **a trivial run end to end through `airlock serve`, cold and warm**
//! ([`cold_and_warm_pool`]): a python agent that prints one line, on two
//! servers of this build on the microvm backend, one without a warm pool
//! (the baseline) and one with `MICROVM_WARM_POOL=1`, a run on each in turn
//! (the warm one posted once its guest has booted again): from the POST to
//! the run's end as the server records them (`ended_at - created_at`).
//!
//! `cargo bench -p airlock --bench microvm`; `AIRLOCK_BENCH_N` samples per
//! side (default 5). Needs QEMU and the guest (`airlock images build --microvm`).
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure

mod peers;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use airlock_sandbox::microvm::{MicrovmBackend, image, kernel, qemu};
use airlock_sandbox::{Backend, SandboxSpec};
use peers::{ms, pcts};
use tokio::io::AsyncBufReadExt;

/// Each figure's p50 and p90, the floor's last.
fn report(rows: &[(&str, &[Duration])]) {
    for (name, v) in rows {
        let [p50, p90, _] = pcts(v);
        println!(
            "  {name:<52} p50 {:8.1} ms  p90 {:8.1} ms  (n={})",
            ms(p50),
            ms(p90),
            v.len()
        );
    }
}

fn spec(dir: &Path, i: usize) -> SandboxSpec {
    let sockets = dir.join(format!("run{i}/sock"));
    std::fs::create_dir_all(&sockets).unwrap();
    SandboxSpec {
        run_id: format!("bench{}-{i}", std::process::id()),
        command: vec!["/bin/echo".into(), "AGENT-UP".into()],
        env: vec![],
        stdin: vec![],
        hold_stdin: false,
        sockets_dir: sockets,
        ro_paths: vec![],
        workspace: PathBuf::from("/workspace"),
        workspace_size_mb: 16,
        memory_mb: 512,
        cpus: 1.0,
        pids_max: 64,
        kind: airlock_sandbox::SandboxKind::Agent,
    }
}

/// Boot to agent, and to the sandbox's end.
async fn boot(backend: &MicrovmBackend, spec: &SandboxSpec) -> (Duration, Duration) {
    let t = Instant::now();
    let mut sb = backend.spawn(spec).unwrap();
    let (out, _) = sb.take_output();
    let mut lines = tokio::io::BufReader::new(out.unwrap()).lines();
    let mut up = None;
    while let Some(l) = lines.next_line().await.unwrap() {
        if l.contains("AGENT-UP") {
            up = Some(t.elapsed());
            break;
        }
    }
    let st = sb.wait().await.unwrap();
    assert!(st.success(), "{st}");
    let end = t.elapsed();
    sb.cleanup().await;
    (up.expect("the agent's line never came"), end)
}

/// The floor: the same machine and kernel, `/init` powering off at once.
fn qemu_true(q: &Path, image: &image::GuestImage, initrd: &Path) -> Duration {
    let t = Instant::now();
    let st = Command::new(q)
        .args([
            "-M",
            &qemu::machine(image.kind),
            "-accel",
            match qemu::accel() {
                qemu::Accel::Kvm => "kvm",
                qemu::Accel::Tcg => "tcg",
            },
            "-cpu",
            "max",
            "-m",
            "512M",
            "-nodefaults",
            "-no-user-config",
            "-nographic",
            "-nic",
            "none",
            "-no-reboot",
            "-kernel",
        ])
        .arg(&image.kernel)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 rdinit=/init quiet reboot=t panic=-1 tsc_early_khz={}",
            qemu::tsc_khz()
        ))
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "{st}");
    t.elapsed()
}

/// One kernel's figures.
#[derive(Default)]
struct Figures {
    to_agent: Vec<Duration>,
    to_end: Vec<Duration>,
    floor: Vec<Duration>,
}

/// A trivial run through `airlock serve` on the microvm backend, `n` times
/// each on a server without a pool and one with `MICROVM_WARM_POOL=1`,
/// alternating: POST → ended as recorded.
fn cold_and_warm_pool(n: usize) {
    use peers::serve::{Conn, agent, base_env, org, start_env};
    println!("microvm: a trivial run end to end through airlock serve, cold and warm pool");
    let homes: Vec<tempfile::TempDir> = (0..2)
        .map(|_| {
            tempfile::Builder::new()
                .prefix("airlock-bench-vmpool-")
                .tempdir()
                .unwrap()
        })
        .collect();
    // 512 MiB guests, as above.
    let limits = r#"{"agent_memory_ceiling_mb":512}"#;
    let mut warm_env = base_env(homes[1].path(), Some(limits));
    warm_env.push(("MICROVM_WARM_POOL".into(), "1".into()));
    let servers = [
        start_env(
            homes[0].path(),
            "microvm",
            base_env(homes[0].path(), Some(limits)),
        ),
        start_env(homes[1].path(), "microvm", warm_env),
    ];
    let mut sides: Vec<(Conn, String)> = servers
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
    // One run each first: the warm server's pool learns what this agent's
    // runs need (that run starts cold), not counted.
    for (c, key) in &mut sides {
        run_through(c, key, 0);
    }
    let mut recorded = [vec![], vec![]];
    for round in 1..=n {
        for (i, (c, key)) in sides.iter_mut().enumerate() {
            if i == 1 {
                wait_guest_idle(homes[1].path(), servers[1].child.id());
            }
            recorded[i].push(run_through(c, key, round));
        }
    }
    report(&[
        (
            "cold (no pool): POST → ended, recorded (baseline)",
            &recorded[0],
        ),
        (
            "warm (MICROVM_WARM_POOL=1): POST → ended, recorded",
            &recorded[1],
        ),
    ]);
    println!(
        "  ratio p50 warm/cold: {:.2}×",
        ms(pcts(&recorded[1])[0]) / ms(pcts(&recorded[0])[0])
    );
    for mut s in servers {
        let pid = rustix::process::Pid::from_raw(i32::try_from(s.child.id()).unwrap()).unwrap();
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let _ = s.child.wait();
    }
}

/// One run of `trivial` to its end: its span as the server records it.
fn run_through(c: &mut peers::serve::Conn, key: &str, round: usize) -> Duration {
    let (st, v) = c.json(
        "POST",
        "/v1/runs",
        key,
        Some(&serde_json::json!({"agent": "trivial", "prompt": format!("p{round}")})),
    );
    assert_eq!(st, 202, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    let t = Instant::now();
    loop {
        let (_, r) = c.json("GET", &format!("/v1/runs/{id}"), key, None);
        if let Some(end) = r["ended_at"].as_u64() {
            assert_eq!(r["status"], "succeeded", "{r}");
            let start = r["created_at"].as_u64().unwrap();
            return Duration::from_millis(end - start);
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "run {id} never ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Until the pool of the platform `pid` on `home` has a booted guest idle
/// and none booting (its pool file, as `airlock doctor` reads it).
fn wait_guest_idle(home: &Path, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let idle = std::fs::read_dir(home.join("pool"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().split('_').nth(1) == Some(&pid.to_string()))
            .filter_map(|e| std::fs::read(e.path().join("microvm.json")).ok())
            .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .any(|v| {
                v["filling"] == 0
                    && v["idle"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|k| k[1].as_u64() >= Some(1)))
            });
        if idle {
            return;
        }
        assert!(Instant::now() < deadline, "the warm pool never filled");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn main() {
    let n: usize = std::env::var("AIRLOCK_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    // The guest's root is this build's `airlock`'s, which also runs the
    // helper (`microvm-host`): not the bench's own executable.
    let airlock = PathBuf::from(env!("CARGO_BIN_EXE_airlock"));
    let mut base = MicrovmBackend::from_env("microvm").unwrap();
    base.exe = airlock.clone();
    base.check().unwrap();
    // Each kernel that is built, the default first.
    let backends: Vec<(MicrovmBackend, image::GuestImage)> =
        [kernel::KernelKind::Minimal, kernel::KernelKind::Debian]
            .into_iter()
            .filter_map(|kind| {
                let choice = kernel::KernelChoice::Only(kind);
                let image = image::GuestImage::find_with(&base.images, &base.exe, choice).ok()?;
                let mut b = MicrovmBackend::from_env("microvm").unwrap();
                b.exe = airlock.clone();
                b.kernel = choice;
                Some((b, image))
            })
            .collect();
    assert!(
        !backends.is_empty(),
        "no guest: airlock images build --microvm"
    );
    let dir = tempfile::tempdir().unwrap();
    let q = Path::new(qemu::DEFAULT_QEMU);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut figures: Vec<Figures> = backends.iter().map(|_| Figures::default()).collect();
    for i in 0..=n {
        for (k, (backend, image)) in backends.iter().enumerate() {
            let s = spec(dir.path(), i * backends.len() + k);
            let (up, end) = rt.block_on(boot(backend, &s));
            // `/init` = busybox's `reboot -f`: the guest's `/bin/true`.
            let floor = qemu_true(q, image, &image.floor_initrd());
            if i > 0 {
                figures[k].to_agent.push(up);
                figures[k].to_end.push(end);
                figures[k].floor.push(floor);
            }
        }
    }
    for ((backend, image), f) in backends.iter().zip(&figures) {
        println!(
            "microvm ({:?}, {:?} kernel {})",
            backend.accel,
            image.kind,
            image.kernel.display()
        );
        report(&[
            (
                "boot to agent (spawn → its first line on the host)",
                &f.to_agent,
            ),
            ("boot to the sandbox's end", &f.to_end),
            ("QEMU, same kernel, /bin/true as init (floor)", &f.floor),
        ]);
    }
    cold_and_warm_pool(n);
}

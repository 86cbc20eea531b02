//! The microvm backend (QEMU's driver), each figure beside its floor or peer
//! measured in the same run and the same loop (alternating, so all see the
//! same load):
//!
//! 1. **boot**, for each kernel that is built (the minimal one, the
//!    default, and Debian's cloud kernel, the fallback):
//!    - *boot to agent*: the backend's `spawn` of a guest whose command
//!      prints one line, until that line reaches the host over the channel
//!      (the helper started in the run's cgroups, QEMU started confined by
//!      it, the kernel, the initramfs's stage 1, the root mounted,
//!      `vm-init`'s view built, the header over the channel, the command
//!      started), and until the sandbox has exited;
//!    - *QEMU → vm-init ready*: the same QEMU command line (the plan's own
//!      `argv`: machine, devices, disks, channel, kernel command line),
//!      confined the same way, spawned here, until `vm-init`'s first frame
//!      (`Ready`) arrives on the channel: the kernel, stage 1 and `vm-init`'s
//!      start, without the helper, the header, the view or the command;
//!    - *the floor*: the same command line with the floor's initramfs, whose
//!      `/init` powers the guest off at once (busybox's `reboot -f`: the
//!      guest's `/bin/true`), until QEMU exits.
//! 2. **a trivial run end to end, cold**: `airlock run --backend microvm`
//!    of a python agent that prints one line (the platform, the sidecar,
//!    the guest, the runtime, python) — beside the same run on the
//!    namespace backend.
//! 3. **cold and warm through `airlock serve`** ([`cold_and_warm_pool`]):
//!    a python agent that prints one line, on two servers of this build on
//!    the microvm backend, one without a warm pool (the baseline) and one
//!    with `MICROVM_WARM_POOL=1`, a run on each in turn (the warm one posted
//!    once its guest has booted again): from the POST to the run's end as
//!    the server records them (`ended_at - created_at`).
//! 4. **20 concurrent runs** on microvm, each in a home (store) of its own:
//!    all must succeed and leave no VMM and no run directory — beside 20
//!    concurrent namespace runs, and 20 concurrent floors (part 1's
//!    `/bin/true` guests).
//!
//! The image's load into the page cache is not measured: one untimed boot
//! of each kernel and one untimed run of each backend come first.
//!
//! `cargo bench -p airlock --bench microvm`; `AIRLOCK_BENCH_N` samples per
//! side in part 1 (default 10), part 2 uses half; `AIRLOCK_BENCH_PARTS`
//! (`1,2,3,4`, the default all) picks the parts; `MICROVM_KERNEL` (`minimal`
//! or `debian`) boots only that kernel in part 1. Needs QEMU and the guest
//! (`airlock images build --microvm`, which is run first: it builds only
//! this build's root when the kernels are there).
#![allow(clippy::unwrap_used)] // a bench may unwrap: a panic is its failure

mod peers;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_platform_api::channel::{Decoder, Frame};
use airlock_sandbox::microvm::{MicrovmBackend, image, kernel, qemu};
use airlock_sandbox::namespace::{cgroup, config::HostIds, sys};
use airlock_sandbox::{Backend, SandboxSpec};
use peers::runs::{Trivial, concurrent, line, namespace_available};
use peers::{ms, pcts};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");
/// Guest memory in part 1 (the suite's runs', and part 2's manifest's).
const MEMORY_MB: u64 = 512;

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
        memory_mb: MEMORY_MB,
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

/// The machine of part 1's guests with `initrd` as its initramfs: the
/// plan the backend makes for [`spec`] (same memory, one vCPU, no agent
/// disk), so its `argv` is the real guest's but for the initramfs.
fn plan(backend: &MicrovmBackend, image: &image::GuestImage, initrd: PathBuf) -> qemu::QemuPlan {
    qemu::QemuPlan {
        name: format!("airlock-bench{}-floor", std::process::id()),
        qemu: on_path(&backend.qemu),
        accel: backend.accel,
        tsc_khz: qemu::tsc_khz(),
        image: image::GuestImage {
            initrd,
            ..image.clone()
        },
        memory_mb: MEMORY_MB,
        vcpus: 1,
        disks: vec![],
    }
}

/// `bin` on `PATH` (the VMM's environment is empty), as the backend finds it.
fn on_path(bin: &Path) -> PathBuf {
    if bin.components().count() > 1 {
        return bin.to_owned();
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{} is not on PATH", bin.display()))
}

/// A QEMU of the bench's own, in cgroups of its own as a run's VMM is.
struct Vmm {
    child: tokio::process::Child,
    /// Ours of the channel's socket pair.
    chan: tokio::net::UnixStream,
    cgroups: Option<cgroup::RunCgroups>,
}

impl Vmm {
    /// QEMU with `plan`, confined as the helper confines it (the run's uid,
    /// its own namespaces, no new privileges) and in cgroups made as the
    /// backend makes a run's (same limits: under load the scheduler shares
    /// the CPU between cgroups first, so a floor outside them would see
    /// another machine), the channel one end of a socket pair; its console
    /// discarded.
    fn spawn(plan: &qemu::QemuPlan) -> Vmm {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let i = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("bench{}-vmm{i}", std::process::id());
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty()).unwrap();
        let argv = plan.argv(qemu::Fds {
            channel: theirs.as_raw_fd(),
            disks: &[],
        });
        let ids = HostIds::for_run(&id);
        let cgroups = cgroup::layout().and_then(|layout| {
            let limits = cgroup::Limits {
                memory_mb: MEMORY_MB + airlock_sandbox::microvm::VMM_OVERHEAD_MB,
                cpus: 1.0,
                pids_max: 256,
            };
            cgroup::RunCgroups::create(&layout, &id, limits).ok()
        });
        assert!(
            cgroups.is_some() || !rustix::process::geteuid().is_root(),
            "no cgroups for the bench's VMM (the backend's runs have theirs)"
        );
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        sys::confine_vmm_on_spawn(
            &mut cmd,
            sys::VmmConfinement {
                switch: ids.switch,
                uid: ids.uid,
                gid: ids.gid,
                parent: rustix::process::getpid().as_raw_nonzero().get(),
            },
        );
        let child = cmd.spawn().unwrap();
        if let (Some(c), Some(pid)) = (&cgroups, child.id()) {
            c.enter(pid).unwrap();
        }
        drop(theirs);
        ours.set_nonblocking(true).unwrap();
        Vmm {
            child,
            chan: tokio::net::UnixStream::from_std(ours).unwrap(),
            cgroups,
        }
    }

    fn remove_cgroups(&self) {
        if let Some(c) = &self.cgroups {
            c.remove(Duration::from_secs(5));
        }
    }
}

/// The floor: QEMU spawned until it exits (the guest powered itself off).
async fn floor(plan: &qemu::QemuPlan) -> Duration {
    let t = Instant::now();
    let mut vmm = Vmm::spawn(plan);
    let st = vmm.child.wait().await.unwrap();
    let took = t.elapsed();
    vmm.remove_cgroups();
    assert!(st.success(), "the floor's QEMU: {st}");
    took
}

/// QEMU spawned until the guest's `vm-init` says `Ready` on the channel;
/// the guest is killed after.
async fn to_ready(plan: &qemu::QemuPlan) -> Duration {
    let t = Instant::now();
    let mut vmm = Vmm::spawn(plan);
    let mut decoder = Decoder::default();
    let mut buf = vec![0u8; 4096];
    let ready = loop {
        if let Some(f) = decoder.next_frame().unwrap() {
            assert!(matches!(f, Frame::Ready), "vm-init's first frame: {f:?}");
            break t.elapsed();
        }
        let n = vmm.chan.read(&mut buf).await.unwrap();
        assert!(n > 0, "the guest closed its channel before it was ready");
        decoder.push(&buf[..n]);
    };
    vmm.child.kill().await.unwrap();
    vmm.remove_cgroups();
    ready
}

/// One kernel's figures.
#[derive(Default)]
struct Figures {
    to_agent: Vec<Duration>,
    to_end: Vec<Duration>,
    to_ready: Vec<Duration>,
    floor: Vec<Duration>,
}

/// A trivial run through `airlock serve` on the microvm backend, `n` times
/// each on a server without a pool and one with `MICROVM_WARM_POOL=1`,
/// alternating: POST → ended as recorded.
fn cold_and_warm_pool(n: usize) {
    println!("microvm: a trivial run end to end through airlock serve, cold and warm pool");
    // 512 MiB guests, as above.
    let limits = r#"{"agent_memory_ceiling_mb":512}"#;
    let mut cw = peers::serve::ColdAndWarm::start(
        "microvm",
        "airlock-bench-vmpool-",
        Some(limits),
        ("MICROVM_WARM_POOL", 1),
    );
    // One run each first: the warm server's pool learns what this agent's
    // runs need (that run starts cold), not counted.
    for (c, key) in &mut cw.sides {
        run_through(c, key, 0);
    }
    let mut recorded = [vec![], vec![]];
    for round in 1..=n {
        for (i, (c, key)) in cw.sides.iter_mut().enumerate() {
            if i == 1 {
                wait_guest_idle(cw.homes[1].path(), cw.servers[1].child.id());
            }
            recorded[i].push(run_through(c, key, round));
        }
    }
    line(
        "cold (no pool): POST → ended, recorded (baseline)",
        &recorded[0],
    );
    line(
        "warm (MICROVM_WARM_POOL=1): POST → ended, recorded",
        &recorded[1],
    );
    println!(
        "  ratio p50 warm/cold: {:.2}×",
        ms(pcts(&recorded[1])[0]) / ms(pcts(&recorded[0])[0])
    );
    cw.stop();
}

/// One run of `trivial` to its end: its span as the server records it.
fn run_through(c: &mut peers::serve::Conn, key: &str, round: usize) -> Duration {
    peers::serve::timed_run(
        c,
        key,
        round,
        Duration::from_secs(300),
        Duration::from_millis(20),
    )
    .0
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

fn env_usize(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn part(n: u8) -> bool {
    std::env::var("AIRLOCK_BENCH_PARTS")
        .map_or(true, |p| p.split(',').any(|x| x.trim() == n.to_string()))
}

fn main() {
    let n = env_usize("AIRLOCK_BENCH_N", 10);
    println!("load before: {}", peers::load());
    // This build's guest: its root is made from the cached base if missing.
    let built = Command::new(AIRLOCK)
        .args(["images", "build", "--microvm"])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "airlock images build --microvm: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    if part(1) {
        boots(&rt, n);
    }
    let agent = Trivial::new(600, &format!("memory_mb = {MEMORY_MB}\ncpus = 1\n"));
    let ns = namespace_available();
    if !ns {
        // Under CI a missing peer fails the bench; elsewhere it is said.
        assert!(
            std::env::var_os("CI").is_none(),
            "the namespace backend (the runs' peer) is not available here"
        );
        println!("  (peer: the namespace backend is not available here: NOT MEASURED)");
    }
    if part(2) {
        cold(&agent, n.div_ceil(2), ns);
    }
    if part(3) {
        cold_and_warm_pool(n.div_ceil(2));
    }
    if part(4) {
        twenty(&rt, ns);
    }
    println!("load after: {}", peers::load());
}

/// Part 1, for each built kernel.
fn boots(rt: &tokio::runtime::Runtime, n: usize) {
    // The guest's root is this build's `airlock`'s, which also runs the
    // helper (`microvm-host`): not the bench's own executable.
    let airlock = PathBuf::from(AIRLOCK);
    let mut base = MicrovmBackend::from_env("microvm").unwrap();
    base.exe = airlock.clone();
    base.check().unwrap();
    // Each kernel that is built, the default first (only the one
    // `MICROVM_KERNEL` names, when it names one).
    let kinds = match kernel::KernelChoice::from_env().unwrap() {
        kernel::KernelChoice::Only(kind) => vec![kind],
        kernel::KernelChoice::Default => {
            vec![kernel::KernelKind::Minimal, kernel::KernelKind::Debian]
        }
    };
    let backends: Vec<(MicrovmBackend, image::GuestImage)> = kinds
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
    let plans: Vec<[qemu::QemuPlan; 2]> = backends
        .iter()
        .map(|(b, image)| {
            [
                plan(b, image, image.initrd.clone()),
                plan(b, image, image.floor_initrd()),
            ]
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut figures: Vec<Figures> = backends.iter().map(|_| Figures::default()).collect();
    for i in 0..=n {
        for (k, (backend, _)) in backends.iter().enumerate() {
            let s = spec(dir.path(), i * backends.len() + k);
            let (up, end) = rt.block_on(boot(backend, &s));
            let ready = rt.block_on(to_ready(&plans[k][0]));
            let fl = rt.block_on(floor(&plans[k][1]));
            if i > 0 {
                let f = &mut figures[k];
                f.to_agent.push(up);
                f.to_end.push(end);
                f.to_ready.push(ready);
                f.floor.push(fl);
            }
        }
    }
    for ((backend, image), f) in backends.iter().zip(&figures) {
        println!(
            "microvm: boot ({:?}, {:?} kernel {})",
            backend.accel,
            image.kind,
            image.kernel.display()
        );
        line(
            "boot to agent (spawn → its first line on the host)",
            &f.to_agent,
        );
        line("boot to the sandbox's end", &f.to_end);
        line(
            "same QEMU line → vm-init's Ready on the channel",
            &f.to_ready,
        );
        line("floor: same QEMU line, /bin/true as init", &f.floor);
        let p50 = |v: &[Duration]| ms(pcts(v)[0]);
        let spread = |v: &[Duration]| ms(pcts(v)[1]) / ms(pcts(v)[0]);
        println!(
            "  boot to agent ÷ floor, p50: {:.2}× (+{:.0} ms; to Ready +{:.0} ms); the floor's p90/p50: {:.2}",
            p50(&f.to_agent) / p50(&f.floor),
            p50(&f.to_agent) - p50(&f.floor),
            p50(&f.to_ready) - p50(&f.floor),
            spread(&f.floor)
        );
    }
    cold_and_warm_pool(n);
}

/// Part 2: `n` trivial runs on microvm, each followed by one on namespace.
fn cold(agent: &Trivial, n: usize, ns: bool) {
    println!("microvm: a trivial run end to end, cold (`airlock run`, one line of python)");
    assert!(agent.run("microvm").1, "the untimed first run failed");
    if ns {
        assert!(agent.run("namespace").1);
    }
    let (mut vm, mut nsv) = (vec![], vec![]);
    for _ in 0..n {
        let (d, ok) = agent.run("microvm");
        assert!(ok);
        vm.push(d);
        if ns {
            let (d, ok) = agent.run("namespace");
            assert!(ok);
            nsv.push(d);
        }
    }
    line("airlock run --backend microvm", &vm);
    if ns {
        line("peer: airlock run --backend namespace", &nsv);
    }
}

/// Part 4: 20 microvm runs at once, then 20 namespace runs at once, then 20
/// floors at once. Each run has a home of its own (its own store): 20
/// `airlock run`s on one SQLite store refuse each other's writes past its
/// busy bound ("database is locked"), which is the store's limit, not the
/// backend's (`airlock serve` on one store queues its runs instead).
fn twenty(rt: &tokio::runtime::Runtime, ns: bool) {
    println!("microvm: 20 concurrent runs (a home each)");
    let agents: Arc<Vec<Trivial>> = Arc::new(
        (0..20)
            .map(|_| Trivial::new(600, &format!("memory_mb = {MEMORY_MB}\ncpus = 1\n")))
            .collect(),
    );
    let runs = {
        let agents = agents.clone();
        concurrent(20, move |i| agents[i].run("microvm"))
    };
    let vmms: usize = agents.iter().map(|a| vmm_count(a.home.path())).sum();
    let left: usize = agents
        .iter()
        .map(|a| {
            std::fs::read_dir(a.home.path().join("runs"))
                .map(|r| r.count())
                .unwrap_or(0)
        })
        .sum();
    runs.print("20 × airlock run --backend microvm", 20);
    println!("  VMMs left: {vmms}; run directories left: {left}");
    if ns {
        let agents = agents.clone();
        concurrent(20, move |i| agents[i].run("namespace"))
            .print("peer: 20 × airlock run --backend namespace", 20);
    }
    // The floor at the same scale: 20 guests that power off at once.
    let backend = {
        let mut b = MicrovmBackend::from_env("microvm").unwrap();
        b.exe = PathBuf::from(AIRLOCK);
        b
    };
    let image =
        image::GuestImage::find_with(&backend.images, &backend.exe, backend.kernel).unwrap();
    let p = plan(&backend, &image, image.floor_initrd());
    let t = Instant::now();
    let each: Vec<Duration> = rt.block_on(async {
        let all = (0..20).map(|_| floor(&p));
        futures_util::future::join_all(all).await
    });
    peers::runs::Concurrent {
        ok: each.len(),
        wall: t.elapsed(),
        each,
    }
    .print("floor: 20 × QEMU with /bin/true as init", 20);
    assert_eq!(runs.ok, 20, "microvm runs failed under load");
    assert_eq!(vmms, 0, "VMMs outlived their runs");
    assert_eq!(left, 0, "run directories outlived their runs");
}

/// The VMMs (QEMU's `-name airlock-<run id>`) of the runs in `home`'s
/// store still alive.
fn vmm_count(home: &Path) -> usize {
    let out = Command::new(AIRLOCK)
        .args(["runs", "list", "--limit", "100", "--json"])
        .env("AIRLOCK_HOME", home)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<String> = list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| format!("airlock-{}", r["id"].as_str().unwrap()))
        .collect();
    assert!(!names.is_empty(), "no runs in the store");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0)
                    .any(|a| names.iter().any(|n| a == n.as_bytes()))
            })
        })
        .count()
}

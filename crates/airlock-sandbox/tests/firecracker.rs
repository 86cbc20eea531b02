//! The firecracker driver against a scripted Firecracker (its API as the
//! published definition says, `airlock_test_support::firecracker_api`) and
//! a stand-in jailer: the whole configure-start-stop sequence of a run
//! (with a guest speaking the channel over the vsock's socket), each step's
//! refusal surfaced as a typed error naming it with nothing started and
//! nothing left, and a hung API, a missing API socket and a jailer that
//! exits each bounded. No Firecracker binary runs here.
#![allow(clippy::unwrap_used)] // a test may unwrap: a panic is its failure

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_platform_api::channel::{Decoder, Frame};
use airlock_sandbox::microvm::config::{GuestHeader, HostConfig, VmmPlan};
use airlock_sandbox::microvm::firecracker::api::{ApiError, Step};
use airlock_sandbox::microvm::firecracker::vm::Vm;
use airlock_sandbox::microvm::firecracker::{FirecrackerError, FirecrackerPlan, jail_id};
use airlock_sandbox::microvm::host::{HostError, serve_firecracker};
use airlock_sandbox::microvm::image::GuestImage;
use airlock_sandbox::microvm::kernel::KernelKind;
use airlock_test_support::firecracker_api::{ApiServer, FakeJailer, Script, jail_root, started};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The run's files: the guest's images, one agent disk, and where the
/// jail goes (the run's directory).
struct Run {
    dir: tempfile::TempDir,
    jailer: FakeJailer,
}

impl Run {
    fn new() -> Run {
        let dir = tempfile::tempdir().unwrap();
        for (name, body) in [
            ("kernel", "vmlinux"),
            ("initrd", "cpio"),
            ("root.ext4", "root"),
        ] {
            std::fs::write(dir.path().join(name), body).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("run/vm")).unwrap();
        std::fs::write(dir.path().join("run/vm/agent0.ext4"), "agent").unwrap();
        let jailer = FakeJailer::new(dir.path()).unwrap();
        Run { dir, jailer }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn plan(&self, api_timeout_ms: u64) -> FirecrackerPlan {
        FirecrackerPlan {
            id: jail_id("run_1"),
            firecracker: "/usr/bin/firecracker".into(),
            jailer: self.jailer.script.clone(),
            chroot_base: self.path("run/vm/jail"),
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            image: GuestImage {
                kind: KernelKind::Debian,
                kernel: self.path("kernel"),
                initrd: self.path("initrd"),
                root: self.path("root.ext4"),
            },
            memory_mb: 512,
            vcpus: 2,
            disks: vec![self.path("run/vm/agent0.ext4")],
            api_timeout_ms,
            guest_timeout_ms: 10_000,
            stop_grace_ms: 200,
        }
    }

    /// Boots `plan` with a scripted Firecracker: once the jailer started,
    /// the server listens where Firecracker's API socket would be.
    async fn boot(
        &self,
        plan: FirecrackerPlan,
        script: Script,
    ) -> (Result<Vm, FirecrackerError>, ApiServer, PathBuf) {
        let mut rx = self.jailer.listen().unwrap();
        let boot = tokio::spawn(async move { Vm::boot(&plan).await });
        let argv = started(&mut rx).await.unwrap();
        let root = jail_root(&argv).unwrap();
        let listener = tokio::net::UnixListener::bind(root.join("api.socket")).unwrap();
        let server = ApiServer::start(listener, script);
        (boot.await.unwrap(), server, root)
    }
}

const SEQUENCE: [&str; 6] = [
    "PUT /boot-source",
    "PUT /drives/root",
    "PUT /drives/agent0",
    "PUT /machine-config",
    "PUT /vsock",
    "PUT /actions InstanceStart",
];

fn gone(pid: Option<u32>) -> bool {
    pid.is_none_or(|p| !Path::new(&format!("/proc/{p}")).exists())
}

/// The jail is made before the jailer starts, with the images as hard
/// links and the agent's disk the VMM's, read-only; the machine is
/// configured in the documented order with the run's limits, read-only
/// drives, the vsock and no network interface, then started; the guest's
/// connection is the channel; the stop asks the guest to end, kills the
/// VMM and removes the jail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_configures_starts_and_stops_its_guest() {
    let run = Run::new();
    let (vm, server, root) = run.boot(run.plan(5000), Script::default()).await;
    let mut vm = vm.unwrap();
    assert_eq!(vm.jail_root(), root);
    assert!(server.violations().is_empty(), "{:?}", server.violations());
    assert_eq!(server.requests(), SEQUENCE);
    let seen = server.seen();
    let body = |i: usize| &seen[i].body;
    assert_eq!(body(0)["kernel_image_path"], "/kernel");
    assert_eq!(body(0)["initrd_path"], "/initrd");
    assert!(
        body(0)["boot_args"]
            .as_str()
            .unwrap()
            .contains("console=ttyS0")
    );
    assert_eq!(body(1)["path_on_host"], "/root.ext4");
    assert_eq!(body(2)["path_on_host"], "/agent0.ext4");
    for d in [body(1), body(2)] {
        assert_eq!(d["is_read_only"], true);
        assert_eq!(d["is_root_device"], false);
    }
    assert_eq!(body(3)["vcpu_count"], 2);
    assert_eq!(body(3)["mem_size_mib"], 512);
    assert_eq!(body(4)["guest_cid"], 3);
    assert_eq!(body(4)["uds_path"], "/v.sock");
    // The images are the shared ones, linked; the agent's disk is the VMM's alone.
    for (img, name) in [("kernel", "kernel"), ("root.ext4", "root.ext4")] {
        let a = std::fs::metadata(run.path(img)).unwrap();
        let b = std::fs::metadata(root.join(name)).unwrap();
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "{name}");
    }
    let agent = std::fs::metadata(root.join("agent0.ext4")).unwrap();
    assert_eq!(agent.mode() & 0o777, 0o400);
    // The guest's connection to the host's port is the channel.
    let mut guest = tokio::net::UnixStream::connect(root.join("v.sock_52"))
        .await
        .unwrap();
    let mut chan = vm.channel().await.unwrap();
    guest.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 4];
    chan.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping");
    let pid = vm.pid();
    vm.stop().await;
    assert_eq!(
        server.requests().last().map(String::as_str),
        Some("PUT /actions SendCtrlAltDel")
    );
    assert!(server.violations().is_empty(), "{:?}", server.violations());
    assert!(gone(pid), "the VMM is still running");
    assert!(!root.parent().unwrap().exists(), "the jail is left behind");
    assert!(run.path("kernel").exists(), "a shared image was removed");
}

/// A refusal at any step is the boot's error, typed, naming the step and
/// carrying Firecracker's fault message; nothing after it is asked (the
/// machine is never started, so never stopped through the API either); the
/// VMM is killed and the jail removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_is_a_typed_error_naming_its_step_and_leaves_nothing() {
    for (i, at) in SEQUENCE.iter().enumerate() {
        let run = Run::new();
        let status = if i == 3 { 500 } else { 400 };
        let script = Script {
            refuse: Some((at.to_string(), status, format!("scripted refusal of {at}"))),
            hang: None,
        };
        let (vm, server, root) = run.boot(run.plan(5000), script).await;
        let e = vm.unwrap_err();
        let FirecrackerError::Api {
            step,
            source:
                ApiError::Refused {
                    status: s,
                    fault_message,
                },
        } = &e
        else {
            panic!("{at}: {e:?}");
        };
        assert_eq!(step.to_string(), *at);
        assert_eq!(*s, status);
        assert_eq!(*fault_message, format!("scripted refusal of {at}"));
        assert!(e.to_string().contains(at), "{e}");
        assert_eq!(server.requests(), SEQUENCE[..=i], "{at}");
        assert!(server.violations().is_empty(), "{:?}", server.violations());
        assert!(
            !root.parent().unwrap().exists(),
            "{at}: the jail is left behind"
        );
    }
}

/// A step the API never answers fails within the API's bound, as that
/// step's timeout; a jailer whose Firecracker never listens, or that exits,
/// fails the boot as such, and so does an image that cannot be put in
/// the jail; each leaves no jail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_api_a_missing_socket_and_an_exited_jailer_are_bounded() {
    let run = Run::new();
    let script = Script {
        refuse: None,
        hang: Some("PUT /machine-config".into()),
    };
    let t0 = Instant::now();
    let (vm, server, root) = run.boot(run.plan(300), script).await;
    let e = vm.unwrap_err();
    assert!(
        matches!(
            &e,
            FirecrackerError::Api {
                step: Step::MachineConfig,
                source: ApiError::Timeout(_)
            }
        ),
        "{e:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(
        !server
            .requests()
            .iter()
            .any(|r| r.contains("InstanceStart"))
    );
    assert!(!root.parent().unwrap().exists());

    // No API socket ever.
    let run = Run::new();
    let mut rx = run.jailer.listen().unwrap();
    let plan = run.plan(300);
    let jail = plan.jail_root();
    let t0 = Instant::now();
    let boot = tokio::spawn(async move { Vm::boot(&plan).await });
    started(&mut rx).await.unwrap();
    let e = boot.await.unwrap().unwrap_err();
    assert!(matches!(e, FirecrackerError::NoApiSocket(_)), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(!jail.parent().unwrap().exists());

    // A jailer that exits at once.
    let run = Run::new();
    let mut plan = run.plan(5000);
    plan.jailer = "/bin/false".into();
    let jail = plan.jail_root();
    let e = Vm::boot(&plan).await.unwrap_err();
    assert!(matches!(e, FirecrackerError::Exited(_)), "{e:?}");
    assert!(!jail.parent().unwrap().exists());

    // An image that cannot be put in the jail: nothing is started.
    let run = Run::new();
    let mut plan = run.plan(5000);
    plan.image.initrd = run.path("missing");
    let jail = plan.jail_root();
    let e = Vm::boot(&plan).await.unwrap_err();
    assert!(matches!(e, FirecrackerError::Place { .. }), "{e:?}");
    assert!(!jail.parent().unwrap().exists());
}

fn host_config(plan: FirecrackerPlan, sockets: &Path) -> HostConfig {
    HostConfig {
        plan: VmmPlan::Firecracker(plan),
        vmm_uid: 0,
        vmm_gid: 0,
        vmm_switch: false,
        sockets_dir: sockets.to_path_buf(),
        guest: GuestHeader {
            nonce: [7; 16],
            command: vec!["true".into()],
            env: vec![],
            workspace: "/workspace".into(),
            workspace_mb: 64,
            disks: vec![],
            uid: 65_534,
            view: None,
        },
    }
}

/// The helper's run of `run`'s plan, with a scripted Firecracker.
async fn start_helper(
    run: &Run,
    script: Script,
) -> (
    tokio::task::JoinHandle<Result<i32, HostError>>,
    ApiServer,
    PathBuf,
) {
    let plan = run.plan(5000);
    let cfg = host_config(plan.clone(), &run.path("run"));
    let mut rx = run.jailer.listen().unwrap();
    let helper = tokio::spawn(async move { serve_firecracker(&cfg, &plan).await });
    let root = jail_root(&started(&mut rx).await.unwrap()).unwrap();
    let listener = tokio::net::UnixListener::bind(root.join("api.socket")).unwrap();
    (helper, ApiServer::start(listener, script), root)
}

/// The helper's whole run under Firecracker: the guest says it booted,
/// gets its header, ends with the run's nonce and its exit code, which is
/// the run's; the guest is stopped and its jail removed. A refused step
/// fails the run with that step and Firecracker's message as its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helpers_run_ends_with_the_guests_code_or_the_refusal() {
    let run = Run::new();
    let (helper, server, root) = start_helper(&run, Script::default()).await;
    // The guest: its connection waits for the helper's accept (the socket
    // listens from before the jailer starts); it says it is ready and
    // reads its header.
    let mut guest = tokio::net::UnixStream::connect(root.join("v.sock_52"))
        .await
        .unwrap();
    guest.write_all(&Frame::Ready.to_bytes()).await.unwrap();
    let mut decoder = Decoder::default();
    let header = loop {
        if let Some(f) = decoder.next_frame().unwrap() {
            break f;
        }
        let mut buf = [0u8; 4096];
        let n = guest.read(&mut buf).await.unwrap();
        assert!(n > 0, "the channel closed before the header");
        decoder.push(&buf[..n]);
    };
    let Frame::Header(h) = header else {
        panic!("{header:?}")
    };
    let h: GuestHeader = serde_json::from_slice(&h).unwrap();
    let exit = Frame::Exit {
        nonce: h.nonce,
        code: 7,
    };
    guest.write_all(&exit.to_bytes()).await.unwrap();
    assert_eq!(helper.await.unwrap().unwrap(), 7);
    assert_eq!(
        server.requests().last().map(String::as_str),
        Some("PUT /actions SendCtrlAltDel")
    );
    assert!(server.violations().is_empty(), "{:?}", server.violations());
    assert!(!root.parent().unwrap().exists());

    // A refusal is the run's failure, saying which step and why.
    let run = Run::new();
    let script = Script {
        refuse: Some((
            "PUT /vsock".into(),
            400,
            "Cannot create backend for vsock device".into(),
        )),
        hang: None,
    };
    let (helper, _server, root) = start_helper(&run, script).await;
    let e = helper.await.unwrap().unwrap_err();
    assert!(matches!(
        e,
        HostError::Firecracker(FirecrackerError::Api {
            step: Step::Vsock,
            ..
        })
    ));
    let said = e.to_string();
    assert!(
        said.contains("PUT /vsock") && said.contains("Cannot create backend for vsock device"),
        "{said}"
    );
    assert!(!root.parent().unwrap().exists());
}

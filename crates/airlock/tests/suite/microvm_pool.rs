//! The microVM backend's warm pool (`MICROVM_WARM_POOL`), with a real QEMU
//! (TCG here): through `airlock serve`, a warm run succeeds and its agent
//! sees its files (copied over the channel at the claim) and its
//! workspace; a pooled guest holds nothing of any run before its claim (a
//! run on one searches it from inside for the previous run's file, id and
//! prompt, and finds none); each guest serves one run (two runs never
//! share a VMM, nor a guest's boot); a guest that dies while idle is
//! replaced; SIGKILL of the platform with an idle guest leaves no VMM,
//! helper, cgroup or pool file after the next boot.
//! Through the backend itself: an agent directory beyond the pool's bound
//! starts cold and still runs, while a small one runs warm.
//!
//! Needs the guest (`airlock images build --microvm`) and QEMU: under `CI`
//! their absence fails loudly, elsewhere the tests print SKIPPED.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_platform::orchestrator::REMOVAL_WITHIN;
use serde_json::{Value, json};

use crate::microvm::guest;
use crate::support::serve::{Server, holds_within, pooled_server, run_to_end};

/// The agent: prints its guest's boot id, its data file, a workspace write
/// read back, whether its own directory is writable; and, given a prompt
/// `probe:<base64 of marks, one a line>`, searches the guest for them.
const AGENT: &str = r#"import base64, json, os
here = os.path.dirname(os.path.abspath(__file__))
print('bootid', open('/proc/sys/kernel/random/boot_id').read().strip(), flush=True)
print('data', open(os.path.join(here, 'data', 'note.txt')).read().strip(), flush=True)
ws = os.environ['AIRLOCK_WORKSPACE']
with open(os.path.join(ws, 'out.txt'), 'w') as f:
    f.write('written-in-the-workspace')
print('workspace', open(os.path.join(ws, 'out.txt')).read(), flush=True)
try:
    open(os.path.join(here, 'planted.txt'), 'w')
    print('view writable', flush=True)
except OSError as e:
    print('view refused', e.errno, flush=True)
prompt = open(os.environ['AIRLOCK_PROMPT_FILE']).read().strip()
if prompt.startswith('probe:'):
    marks = [m.encode() for m in base64.b64decode(prompt[6:]).decode().split('\n') if m]
    found, read = [], 0
    image = ('/usr', '/lib', '/lib32', '/lib64', '/bin', '/sbin', '/.airlock', '/proc', '/sys', '/dev')
    for root, dirs, files in os.walk('/'):
        if root.startswith(image) and root != '/':
            dirs[:] = []
            continue
        for f in files:
            p = os.path.join(root, f)
            try:
                if os.path.islink(p) or os.path.getsize(p) > (4 << 20):
                    continue
                b = open(p, 'rb').read()
            except OSError:
                continue
            read += 1
            found += [p + ': ' + m.decode() for m in marks if m in b]
    procs = ['/proc/cmdline']
    for pid in os.listdir('/proc'):
        if pid.isdigit() and int(pid) != os.getpid():
            procs += ['/proc/%s/cmdline' % pid, '/proc/%s/environ' % pid]
    for p in procs:
        try:
            b = open(p, 'rb').read()
        except OSError:
            continue
        read += 1
        found += [p + ': ' + m.decode() for m in marks if m in b]
    for k, v in os.environ.items():
        found += ['env ' + k + ': ' + m.decode() for m in marks if m in v.encode()]
    print('probed', read, 'traces', json.dumps(found), flush=True)
"#;

/// A registered agent: [`AGENT`] and its data file holding `note`.
fn agent(name: &str, note: &str) -> Value {
    json!({
        "manifest": format!("[agent]\nname = \"{name}\"\ncommand = [\"/usr/bin/python3\", \"agent.py\"]\ntimeout = 180\nmemory_mb = 512\ncpus = 1\n\n[network]\negress = \"none\"\n"),
        "files": { "agent.py": AGENT, "data/note.txt": note },
    })
}

/// `airlock serve` on the microvm backend with a pool of `size`, and the
/// agents `warm-a` (its note `note_a`) and `warm-b`.
fn pooled(size: usize, note_a: &str) -> (tempfile::TempDir, Vec<(String, String)>, Server, String) {
    let agents = [agent("warm-a", note_a), agent("warm-b", "plain")];
    pooled_server("microvm", ("MICROVM_WARM_POOL", size), &agents)
}

/// Runs `agent` with `prompt` to its success; its id and its output lines.
fn run_once(s: &Server, key: &str, agent: &str, prompt: &str) -> (String, Vec<String>) {
    run_to_end(s, key, agent, prompt, 240)
}

/// The value after `tag ` on the line that starts with it.
fn said<'a>(lines: &'a [String], tag: &str) -> &'a str {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(&format!("{tag} ")))
        .unwrap_or_else(|| panic!("no {tag:?} line: {lines:?}"))
        .trim()
}

/// Processes whose command line holds `arg` exactly, or an argument that
/// starts with `prefix`: (pid, parent pid, command line).
fn processes(prefix: &str) -> Vec<(u32, u32, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let c = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            c.split(|b| *b == 0)
                .any(|a| a.starts_with(prefix.as_bytes()))
                .then_some(())?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid, String::from_utf8_lossy(&c).replace('\0', " ")))
        })
        .collect()
}

/// The VMMs of the pooled guests of the platform `pid` (QEMU's `-name
/// airlock-standby-<pid>-vm<n>`), claimed or not.
fn pooled_vmms(pid: u32) -> Vec<(u32, u32, String)> {
    processes(&format!("airlock-standby-{pid}-vm"))
}

/// What the pool file of the platform `pid` on `home` says: idle guests
/// (all keys) and those booting.
fn pool_file(home: &Path, pid: u32) -> Option<(usize, usize)> {
    let dir = std::fs::read_dir(home.join("pool"))
        .ok()?
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .split('_')
                .nth(1)
                .is_some_and(|p| p == pid.to_string())
        })?;
    let v: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("microvm.json")).ok()?).ok()?;
    let idle = v["idle"]
        .as_array()?
        .iter()
        .filter_map(|k| k[1].as_u64())
        .sum::<u64>();
    Some((
        usize::try_from(idle).ok()?,
        usize::try_from(v["filling"].as_u64()?).ok()?,
    ))
}

/// The pooled VMMs of `s` once its pool holds `n` idle booted guests and
/// none booting (never more than `n`: the pool's bound), within 4 minutes.
fn wait_idle(s: &Server, home: &Path, n: usize) -> Vec<u32> {
    let pid = s.child.id();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let vmms = pooled_vmms(pid);
        assert!(vmms.len() <= n + 1, "more guests than the pool: {vmms:?}");
        if let Some((idle, 0)) = pool_file(home, pid) {
            assert!(idle <= n, "more idle guests than the pool's size");
            if idle == n && vmms.len() == n {
                return vmms.iter().map(|v| v.0).collect();
            }
        }
        assert!(
            Instant::now() < deadline,
            "the pool never filled ({vmms:?}, {:?}):\n{}",
            pool_file(home, pid),
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether every process of `pids` is gone within `bound`.
fn gone_within(pids: &[u32], bound: Duration) -> bool {
    holds_within(bound, || {
        pids.iter()
            .all(|p| !Path::new(&format!("/proc/{p}")).exists())
    })
}

/// An idle guest seen from the host holds nothing of any run: neither its
/// VMM's nor its helper's command line or environment names a run or
/// anything a run brought (`marks`).
fn holds_nothing(vmm: u32, marks: &[String]) {
    let (_, helper, _) = processes("")
        .into_iter()
        .find(|p| p.0 == vmm)
        .expect("the pooled VMM");
    for pid in [vmm, helper] {
        for part in ["cmdline", "environ"] {
            let text = String::from_utf8_lossy(
                &std::fs::read(format!("/proc/{pid}/{part}")).unwrap_or_default(),
            )
            .into_owned();
            assert!(!text.contains("run_"), "{pid}'s {part} names a run: {text}");
            for m in marks {
                assert!(!text.contains(m.as_str()), "{pid}'s {part} holds {m}");
            }
        }
    }
}

#[test]
fn a_warm_run_sees_its_files_and_a_pooled_guest_holds_nothing_of_any_run() {
    if guest().is_none() {
        return;
    }
    let mark = format!("pooled-file-marker-{}", std::process::id());
    let (home, _env, mut s, key) = pooled(1, &mark);
    // The first run starts cold: the pool learns what its runs need.
    let (first, lines) = run_once(&s, &key, "warm-a", "learn");
    assert_eq!(said(&lines, "data"), mark);
    let mut boots = vec![said(&lines, "bootid").to_owned()];
    let [idle] = wait_idle(&s, home.path(), 1).try_into().unwrap();
    holds_nothing(idle, &[first.clone(), mark.clone()]);

    // A warm run: its files (a subdirectory's included) and its workspace,
    // its directory read-only as a cold start's disk is.
    let prompt = format!("files-prompt-{}", std::process::id());
    let (second, lines) = run_once(&s, &key, "warm-a", &prompt);
    assert_eq!(said(&lines, "data"), mark, "{lines:?}");
    assert_eq!(said(&lines, "workspace"), "written-in-the-workspace");
    assert!(said(&lines, "view").starts_with("refused"), "{lines:?}");
    boots.push(said(&lines, "bootid").to_owned());
    // The idle guest served it, and goes with it (within the removal's
    // bound): a guest serves one run.
    assert!(
        gone_within(&[idle], REMOVAL_WITHIN),
        "the pooled VMM {idle} outlived run {second}"
    );
    let [next] = wait_idle(&s, home.path(), 1).try_into().unwrap();
    assert_ne!(next, idle, "a VMM served twice");
    let marks = vec![first.clone(), second.clone(), mark.clone(), prompt.clone()];
    holds_nothing(next, &marks);

    // From inside, a run on the next guest looks for the previous runs'
    // ids, file and prompt (given encoded: the marks themselves are in no
    // file of its own) and finds none.
    let probe = {
        use base64::Engine;
        let joined = marks.join("\n");
        format!(
            "probe:{}",
            base64::engine::general_purpose::STANDARD.encode(joined)
        )
    };
    let (third, lines) = run_once(&s, &key, "warm-b", &probe);
    let probed = said(&lines, "probed");
    let (count, traces) = probed.split_once(" traces ").unwrap();
    assert!(
        count.parse::<usize>().unwrap() > 10,
        "the search read almost nothing: {probed}"
    );
    assert_eq!(traces, "[]", "traces of earlier runs in a pooled guest");
    assert_eq!(said(&lines, "data"), "plain");
    boots.push(said(&lines, "bootid").to_owned());
    assert!(
        gone_within(&[next], REMOVAL_WITHIN),
        "{next} outlived {third}"
    );
    let mut unique = boots.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 3, "two runs shared a guest's boot: {boots:?}");

    // Stopped as an operator stops it: its idle guest goes with it.
    let pid = s.child.id();
    let idle = wait_idle(&s, home.path(), 1);
    assert!(s.terminate().success());
    assert!(
        gone_within(&idle, Duration::from_secs(10)),
        "guests outlived their platform: {:?}",
        pooled_vmms(pid)
    );
}

/// The cgroup directories named for the pooled guests of platform `pid`.
fn pooled_cgroups(pid: u32) -> Vec<PathBuf> {
    let Some(layout) = airlock_sandbox::namespace::cgroup::layout() else {
        return vec![];
    };
    let prefix = format!("airlock-standby-{pid}-vm");
    layout
        .parents()
        .iter()
        .filter_map(|p| std::fs::read_dir(p).ok())
        .flat_map(|r| r.flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

#[test]
fn after_a_sigkill_the_next_boot_leaves_no_pooled_guest() {
    if guest().is_none() {
        return;
    }
    let (home, env, mut s, key) = pooled(1, "note");
    run_once(&s, &key, "warm-a", "learn");
    let pid = s.child.id();
    // A guest that dies while idle (its VMM killed from outside) is
    // replaced by another.
    let [dying] = wait_idle(&s, home.path(), 1).try_into().unwrap();
    let p = rustix::process::Pid::from_raw(i32::try_from(dying).unwrap()).unwrap();
    rustix::process::kill_process(p, rustix::process::Signal::KILL).unwrap();
    assert!(gone_within(&[dying], Duration::from_secs(10)));
    let [vmm] = wait_idle(&s, home.path(), 1).try_into().unwrap();
    assert_ne!(vmm, dying, "the dead guest was not replaced");
    let helpers: Vec<u32> = pooled_vmms(pid).iter().map(|v| v.1).collect();
    // `airlock doctor` shows it.
    let doctor = |env: &[(String, String)]| -> Value {
        let out = crate::support::serve::command(env)
            .args(["doctor", "--backend", "microvm", "--json"])
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        report["microvm"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["feature"] == "microVM warm pool")
            .unwrap_or_else(|| panic!("no microVM warm pool line: {report}"))
            .clone()
    };
    let line = doctor(&env);
    assert!(line.to_string().contains("1 idle guest(s)"), "{line}");
    let cgroups = pooled_cgroups(pid);
    s.kill();
    // Its helper and VMM die with it (no file of theirs: a socket pair,
    // the shared read-only root).
    let mut all = helpers.clone();
    all.push(vmm);
    assert!(
        gone_within(&all, Duration::from_secs(30)),
        "a pooled guest outlived its platform"
    );
    let line = doctor(&env);
    assert_eq!(line["works"], false, "a dead platform's pool: {line}");
    let mut env = env;
    env.retain(|(k, _)| k != "MICROVM_WARM_POOL");
    let _next = Server::start(&env, "microvm", home.path().join("serve2.log"));
    assert!(pooled_vmms(pid).is_empty());
    let left: Vec<&PathBuf> = cgroups.iter().filter(|c| c.exists()).collect();
    assert!(
        left.is_empty(),
        "cgroups left after the next boot: {left:?}"
    );
    let line = doctor(&env);
    assert_eq!(line["works"], true, "{line}");
    assert!(line.to_string().contains("no idle guest"), "{line}");
}

/// Through the backend: a run whose agent directory is beyond the pool's
/// bound (64 MiB) starts cold (a VMM of its own name) and runs; one whose
/// directory is small is served by a booted guest (no VMM of its name) and
/// sees its files.
#[test]
fn a_too_large_agent_directory_starts_cold_and_still_runs() {
    if guest().is_none() {
        return;
    }
    use airlock_sandbox::{Backend, SandboxKind, SandboxSpec, SidecarSpec};
    // Under a fresh directory in /var/tmp, a directory the guest's image
    // has (read-only): the agent's directory is seen at its path there,
    // cold (a disk) and warm (the view unpacked at the claim) alike.
    let home = tempfile::Builder::new()
        .prefix("airlock-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let big = home.path().join("bundles/big");
    std::fs::create_dir_all(&big).unwrap();
    let f = std::fs::File::create(big.join("blob")).unwrap();
    f.set_len((64 << 20) + 1).unwrap();
    let small = home.path().join("bundles/small");
    std::fs::create_dir_all(small.join("sub")).unwrap();
    std::fs::write(small.join("sub/note.txt"), "small-note").unwrap();
    let mut b = airlock_sandbox::microvm::MicrovmBackend::from_env("microvm")
        .unwrap()
        .with_warm_pool(1);
    b.exe = PathBuf::from(crate::microvm::AIRLOCK);
    let specs = |id: &str, dir: &Path, script: &str| {
        let sock = home.path().join("runs").join(id).join("sock");
        std::fs::create_dir_all(&sock).unwrap();
        // The command says it started, then waits for its stdin (held
        // until the test has looked at the VMMs) before its work.
        let script = format!("echo started; head -c 1 >/dev/null; {script}");
        let sandbox = SandboxSpec {
            run_id: id.into(),
            command: vec!["/bin/sh".into(), "-c".into(), script],
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            stdin: b"x".to_vec(),
            hold_stdin: true,
            sockets_dir: sock,
            ro_paths: vec![dir.to_owned()],
            workspace: "/workspace".into(),
            workspace_size_mb: 16,
            memory_mb: 256,
            cpus: 1.0,
            pids_max: 64,
            kind: SandboxKind::Agent,
        };
        let sidecar = SidecarSpec {
            run_id: id.into(),
            exe: PathBuf::from(crate::microvm::AIRLOCK),
            own_binary: None,
            log: "warn".into(),
            config: vec![],
            platform_socket: home.path().join("sockets/p.sock"),
            egress_journal: home.path().join("runs").join(id).join("egress.journal"),
            sockets_dir: home.path().join("runs").join(id).join("sock"),
            runner_dirs: vec![],
        };
        (sandbox, sidecar)
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Runs `id` to its end: whether it was claimed warm, its output, its code.
    let run = |id: &str, dir: &Path, script: &str| {
        let (sandbox, sidecar) = specs(id, dir, script);
        eprintln!("run {id}");
        rt.block_on(async {
            let warm = b.claim_prepared("org_a", &sandbox, &sidecar);
            let mut sb = b.spawn(&sandbox).unwrap();
            let (out, err) = sb.take_output();
            let err = tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut e = String::new();
                if let Some(mut err) = err {
                    let _ = err.read_to_string(&mut e).await;
                }
                e
            });
            // Whether a VMM of the run's own name serves it, looked at
            // while its guest's command waits for its stdin.
            let mut own_vmm = false;
            let mut text = String::new();
            if let Some(o) = out {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(o).lines();
                let mut first = true;
                while let Some(l) = lines.next_line().await.unwrap() {
                    if first {
                        own_vmm = !processes(&format!("airlock-{id}")).is_empty();
                        first = false;
                        sb.release_stdin();
                        continue;
                    }
                    text.push_str(&l);
                    text.push('\n');
                }
            }
            let code = sb.wait().await.unwrap().code();
            let err = err.await.unwrap();
            if code != Some(0) {
                eprintln!("{id}: exit {code:?}, stderr: {err}");
            }
            sb.cleanup().await;
            (warm, own_vmm, text, code)
        })
    };
    let stat = format!("stat -c %s {}/blob", big.display());
    let (warm, own_vmm, text, code) = run("run_big1", &big, &stat);
    assert!(!warm, "a directory beyond the bound was claimed warm");
    assert!(own_vmm, "the cold start has a VMM of its own name");
    assert!(text.contains("67108865"), "{text}");
    assert_eq!(code, Some(0), "{text}");
    let script = format!("cat {}/sub/note.txt", small.display());
    let (warm, ..) = run("run_small1", &small, &script);
    assert!(
        !warm,
        "the first run of a key starts cold (the pool learns it)"
    );
    let deadline = Instant::now() + Duration::from_secs(240);
    while b.pool_status().idle < 1 {
        assert!(Instant::now() < deadline, "the pool never filled");
        // (The sleep is made inside the runtime: made outside, it panics.)
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    }
    let (warm, own_vmm, text, code) = run("run_small2", &small, &script);
    assert!(warm, "a booted guest was idle");
    assert!(!own_vmm, "a warm run started a VMM of its own");
    assert_eq!(text.trim(), "small-note");
    assert_eq!(code, Some(0));
    // A too-large directory still starts cold with a guest idle.
    let (warm, own_vmm, text, _) = run("run_big2", &big, "echo ok");
    assert!(!warm && own_vmm, "{text}");
    b.drop_prepared();
}

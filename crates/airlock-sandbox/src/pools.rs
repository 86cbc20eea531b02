//! The pools the host's kernel keeps for every process at once, and what a
//! sandbox (an agent's, a runner's; namespace or docker) may take of each:
//! one decision per pool, in one place. `airlock doctor` prints
//! [`decisions`]; `tests/suite/sandbox_host.rs` attacks each from inside a
//! real run.

/// Open files a sandbox's process may hold (`RLIMIT_NOFILE`, soft and
/// hard: a process cannot raise it). With the pids limit (256) it bounds
/// the sandbox's share of `fs.file-max` (256 × 1024 = 262,144 files).
pub const OPEN_FILES: u64 = 1024;

/// Socket buffer memory a sandbox may pin (cgroup v1's
/// `memory.kmem.tcp.limit_in_bytes`). On cgroup v1 socket buffers are not
/// in the memory limit, and `net.ipv4.tcp_mem` is one pool for the whole
/// host: an agent that writes to its own loopback connections and never
/// reads held 258 MiB of it with 17 connections, and would take all of it
/// with more. On cgroup v2 they count in the memory limit.
pub const SOCKET_BUFFER_BYTES: u64 = 64 << 20;

/// One pool and what a sandbox may take of it.
#[derive(Debug, Clone)]
pub struct Decision {
    pub pool: &'static str,
    pub decision: String,
}

/// Every pool's decision, as `airlock doctor` prints them.
pub fn decisions() -> Vec<Decision> {
    let d = |pool, decision: String| Decision { pool, decision };
    vec![
        d(
            "native AIO (fs.aio-max-nr)",
            "none: io_setup, io_submit, io_getevents, io_pgetevents, io_cancel, io_destroy refused \
             (EPERM) by every sandbox's filter; POSIX AIO in libc uses threads"
                .into(),
        ),
        d(
            "io_uring",
            "none: io_uring_setup, io_uring_enter, io_uring_register refused (EPERM)".into(),
        ),
        d(
            "pseudo-terminals (kernel.pty.max)",
            "none: no /dev/ptmx in a namespace sandbox, an empty read-only /dev/pts in a docker \
             sandbox (Docker's devpts instance draws on the host's pool)"
                .into(),
        ),
        d(
            "keyrings (kernel.keys)",
            "none: add_key, keyctl, request_key refused (EPERM)".into(),
        ),
        d(
            "System V IPC, POSIX message queues",
            "the sandbox's own IPC namespace (namespace: CLONE_NEWIPC; docker: --ipc none), \
             gone with it"
                .into(),
        ),
        d(
            "open files (fs.file-max)",
            format!(
                "RLIMIT_NOFILE {OPEN_FILES} (soft and hard) in every sandbox, times its pids limit"
            ),
        ),
        d(
            "socket buffers (net.ipv4.tcp_mem, udp_mem)",
            format!(
                "cgroup v1: {} MiB a sandbox (memory.kmem.tcp.limit_in_bytes); cgroup v2: in its \
                 memory limit",
                SOCKET_BUFFER_BYTES >> 20
            ),
        ),
        d(
            "per-user quotas (inotify, epoll, pipes, signals, processes)",
            "each sandbox its own host uid when the platform is root (namespace) and always \
             (docker); a rootless platform's runs share its uid"
                .into(),
        ),
        d(
            "memory (memfd, tmpfs, page cache), pids, CPU",
            "the sandbox's cgroup limits".into(),
        ),
    ]
}

//! Which system calls a sandbox may make: ONE allow list for every backend
//! (the namespace sandbox, the agent's and the runners' docker containers),
//! compiled into seccomp filters by [`crate::seccomp`] and rendered as a
//! Docker profile by [`crate::docker::profile`].
//!
//! The reference is Docker's default profile (moby
//! `profiles/seccomp/default.json`): the calls it allows to a container
//! without capabilities, with its argument checks (`clone` without
//! namespace flags, `personality` with the values it lists, `socket`
//! families), made stricter where a sandbox has no use for a call or where
//! it reaches a pool every process on the host shares (see [`REFUSED`]).
//! Every other call is refused with `EPERM`; `clone3` and the numbers the
//! kernel does not know with `ENOSYS`, so a libc falls back (to `clone`,
//! whose flags the filter can read) as it does on an older kernel. A call
//! a kernel adds later is refused until it is named here.

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use aarch64::TABLE;
#[cfg(target_arch = "x86_64")]
pub use x86_64::TABLE;

/// Calls allowed whatever their arguments (a name this architecture does
/// not have is skipped, as libseccomp does). Docker's unconditional list,
/// without [`REFUSED`], plus `fchmodat2`, `map_shadow_stack` and `mseal`
/// (a new libc calls them; each acts on the caller's own files or memory).
#[rustfmt::skip]
pub const ALLOWED: &[&str] = &[
    // files and descriptors
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2",
    "pwritev2", "open", "openat", "openat2", "creat", "close", "close_range", "lseek", "dup",
    "dup2", "dup3", "fcntl", "flock", "fsync", "fdatasync", "sync", "syncfs", "sync_file_range",
    "truncate", "ftruncate", "fallocate", "fadvise64", "readahead", "sendfile", "splice", "tee",
    "vmsplice", "copy_file_range", "stat", "fstat", "lstat", "newfstatat", "statx", "statfs",
    "fstatfs", "access", "faccessat", "faccessat2", "getdents", "getdents64", "getcwd", "chdir",
    "fchdir", "rename", "renameat", "renameat2", "mkdir", "mkdirat", "rmdir", "link", "linkat",
    "unlink", "unlinkat", "symlink", "symlinkat", "readlink", "readlinkat", "chmod", "fchmod",
    "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "umask", "utime", "utimes",
    "utimensat", "futimesat", "mknod", "mknodat", "getxattr", "lgetxattr", "fgetxattr",
    "setxattr", "lsetxattr", "fsetxattr", "listxattr", "llistxattr", "flistxattr", "removexattr",
    "lremovexattr", "fremovexattr", "inotify_init", "inotify_init1", "inotify_add_watch",
    "inotify_rm_watch",
    // memory
    "pipe", "pipe2", "brk", "mmap", "munmap", "mprotect", "mremap", "madvise", "mincore", "msync",
    "mlock", "mlock2", "mlockall", "munlock", "munlockall", "membarrier", "memfd_create",
    "remap_file_pages", "pkey_alloc", "pkey_free", "pkey_mprotect", "map_shadow_stack", "mseal",
    // processes
    "execve", "execveat", "exit", "exit_group", "fork", "vfork", "wait4", "waitid", "kill",
    "tkill", "tgkill", "getpid", "getppid", "gettid", "getpgid", "setpgid", "getpgrp", "getsid",
    "setsid", "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups",
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid",
    "setgroups", "capget", "capset", "prctl", "arch_prctl", "getpriority", "setpriority",
    "sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam", "sched_setparam",
    "sched_getscheduler", "sched_setscheduler", "sched_get_priority_max",
    "sched_get_priority_min", "sched_rr_get_interval", "sched_getattr", "sched_setattr",
    "ioprio_get", "ioprio_set", "getrlimit", "setrlimit", "prlimit64", "getrusage", "times",
    "uname", "sysinfo", "getcpu", "getrandom", "set_tid_address", "set_robust_list",
    "get_robust_list", "rseq", "restart_syscall", "seccomp", "landlock_create_ruleset",
    "landlock_add_rule", "landlock_restrict_self", "pidfd_open", "pidfd_send_signal",
    "process_mrelease",
    // signals and time
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigsuspend",
    "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "signalfd",
    "signalfd4", "pause", "alarm", "nanosleep", "clock_nanosleep", "clock_gettime",
    "clock_getres", "gettimeofday", "time", "getitimer", "setitimer", "timer_create",
    "timer_settime", "timer_gettime", "timer_getoverrun", "timer_delete", "timerfd_create",
    "timerfd_settime", "timerfd_gettime", "futex", "futex_waitv",
    // waiting on descriptors
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2",
    "eventfd", "eventfd2", "poll", "ppoll", "select", "pselect6",
    // sockets ([`ArgCheck::Socket`] decides which may be created)
    "bind", "listen", "accept", "accept4", "connect", "getsockname", "getpeername", "sendto",
    "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "shutdown", "setsockopt",
    "getsockopt",
    // System V and POSIX IPC: the sandbox's own IPC namespace
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl", "msgget",
    "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr",
];

/// Calls Docker's default profile allows a container without capabilities
/// that a sandbox is refused, and why.
pub const REFUSED: &[(&str, &str)] = &[
    (
        "io_setup",
        "native AIO: the host's one pool (fs.aio-max-nr); POSIX AIO in libc uses threads",
    ),
    ("io_destroy", "native AIO"),
    ("io_submit", "native AIO"),
    ("io_cancel", "native AIO"),
    ("io_getevents", "native AIO"),
    ("io_pgetevents", "native AIO"),
    (
        "io_uring_setup",
        "io_uring: a second kernel interface to every call, beyond seccomp",
    ),
    ("io_uring_enter", "io_uring"),
    ("io_uring_register", "io_uring"),
    ("ptrace", "another process's memory and registers"),
    ("process_vm_readv", "another process's memory"),
    ("process_vm_writev", "another process's memory"),
    (
        "adjtimex",
        "the host's clock (reading it needs no capability; nothing in a sandbox does)",
    ),
    ("clock_adjtime", "the host's clock"),
    (
        "memfd_secret",
        "takes pages out of the kernel's direct map: no use in a sandbox",
    ),
    ("fanotify_mark", "fanotify_init is refused"),
    (
        "modify_ldt",
        "x86 segment descriptors: no use in a sandbox, a history of kernel bugs",
    ),
    (
        "name_to_handle_at",
        "file handles (Docker's newer profile needs CAP_SYS_ADMIN for it)",
    ),
];

/// Calls the kernel lets through every seccomp filter (Linux 6.11 on,
/// x86_64): they act only when made from the kernel's own uprobe
/// trampoline, and anywhere else the kernel refuses them itself
/// (`uretprobe`: `SIGILL`; `uprobe`: `ENXIO`). Not on [`ALLOWED`]: the
/// filters refuse them where the kernel asks them.
pub const SECCOMP_PASSTHROUGH: &[&str] = &["uretprobe", "uprobe"];

/// Calls allowed only with the arguments their [`ArgCheck`] admits.
pub const CHECKED: &[(&str, ArgCheck)] = &[
    ("clone", ArgCheck::CloneWithoutNamespaces),
    ("socket", ArgCheck::Socket),
    ("socketpair", ArgCheck::Socket),
    ("ioctl", ArgCheck::Ioctl),
    ("personality", ArgCheck::Personality),
];

/// Refused with `ENOSYS` (a libc falls back, as on a kernel without them):
/// `clone3`'s flags sit behind a pointer no filter can read, so libc's
/// fallback to `clone` is what lets [`ArgCheck::CloneWithoutNamespaces`] see them.
pub const NOSYS: &[&str] = &["clone3"];

/// The argument checks (Docker's, and the terminal ioctls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgCheck {
    /// `flags` (argument 0) has none of [`NAMESPACE_FLAGS`].
    CloneWithoutNamespaces,
    /// The family (argument 0) is one of [`SOCKET_FAMILIES`] and the type
    /// (argument 1, flags masked off) one of [`SOCKET_TYPES`]: vsock reaches
    /// the host whatever the network namespace, netlink the kernel, raw and
    /// packet sockets forge traffic.
    Socket,
    /// The request (argument 1, an `unsigned int` to the kernel) is none of
    /// [`DENIED_IOCTLS`].
    Ioctl,
    /// The persona (argument 0) is one of [`PERSONALITIES`].
    Personality,
}

/// The socket families a sandbox may create: unix sockets and TCP/UDP on
/// its own network.
pub const SOCKET_FAMILIES: &[(&str, u32)] = &[("AF_UNIX", 1), ("AF_INET", 2), ("AF_INET6", 10)];
/// The socket types a sandbox may create (`SOCK_STREAM`, `SOCK_DGRAM`,
/// `SOCK_SEQPACKET`), compared under [`SOCKET_TYPE_MASK`].
pub const SOCKET_TYPES: &[(&str, u32)] =
    &[("SOCK_STREAM", 1), ("SOCK_DGRAM", 2), ("SOCK_SEQPACKET", 5)];
/// The bits of a socket's type argument that are its type (the rest are
/// `SOCK_NONBLOCK`, `SOCK_CLOEXEC`).
pub const SOCKET_TYPE_MASK: u32 = 0xf;
/// `ioctl` requests refused whatever the file: `TIOCSTI` pushes input into
/// a terminal (CVE-2017-5226's class), `TIOCLINUX` reaches the console.
pub const DENIED_IOCTLS: &[(&str, u32)] = &[("TIOCSTI", 0x5412), ("TIOCLINUX", 0x541C)];
/// `personality(2)` values allowed (Docker's): `PER_LINUX`, `PER_LINUX32`,
/// `UNAME26`, both, and the query `0xffffffff`.
pub const PERSONALITIES: &[u32] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];
/// `clone(2)` flags that make a namespace (`CLONE_NEWTIME` is 0x80, which
/// `clone` reads as part of the exit signal; refused too).
pub const NAMESPACE_FLAGS: &[(&str, u32)] = &[
    ("CLONE_NEWNS", 0x0002_0000),
    ("CLONE_NEWCGROUP", 0x0200_0000),
    ("CLONE_NEWUTS", 0x0400_0000),
    ("CLONE_NEWIPC", 0x0800_0000),
    ("CLONE_NEWUSER", 0x1000_0000),
    ("CLONE_NEWPID", 0x2000_0000),
    ("CLONE_NEWNET", 0x4000_0000),
    ("CLONE_NEWTIME", 0x0000_0080),
];

/// Every namespace flag, as one mask.
pub fn namespace_mask() -> u32 {
    NAMESPACE_FLAGS.iter().fold(0, |m, (_, f)| m | f)
}

/// What the filter does with a call, by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed, whatever its arguments.
    Allow,
    /// Allowed if its arguments pass the check.
    Checked(ArgCheck),
    /// Refused with `EPERM`.
    Refuse,
    /// Refused with `ENOSYS` ([`NOSYS`]).
    NoSys,
    /// A number this kernel's table does not have: `ENOSYS`.
    Unknown,
}

/// The number of `name` on this architecture.
pub fn number(name: &str) -> Option<u32> {
    TABLE.iter().find(|(n, _)| *n == name).map(|(_, nr)| *nr)
}

/// The name of `nr` on this architecture.
pub fn name(nr: u32) -> Option<&'static str> {
    TABLE
        .binary_search_by_key(&nr, |(_, n)| *n)
        .ok()
        .map(|i| TABLE[i].0)
}

/// The highest number this kernel's table has.
pub fn max_known() -> u32 {
    TABLE.last().map_or(0, |(_, nr)| *nr)
}

/// The verdict on `nr` (a native number: the filters refuse other
/// architectures and the x32 range before they look at it).
pub fn verdict(nr: u32) -> Verdict {
    let Some(name) = name(nr) else {
        return Verdict::Unknown;
    };
    if ALLOWED.contains(&name) {
        Verdict::Allow
    } else if let Some((_, check)) = CHECKED.iter().find(|(n, _)| *n == name) {
        Verdict::Checked(*check)
    } else if NOSYS.contains(&name) {
        Verdict::NoSys
    } else {
        Verdict::Refuse
    }
}

/// The calls of this architecture a sandbox may make (allowed or checked), by number.
pub fn allowed_numbers() -> Vec<u32> {
    TABLE
        .iter()
        .map(|(_, nr)| *nr)
        .filter(|nr| matches!(verdict(*nr), Verdict::Allow | Verdict::Checked(_)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_and_every_listed_name_is_a_call_of_this_architecture_or_skipped_knowingly()
     {
        assert!(TABLE.windows(2).all(|w| w[0].1 < w[1].1), "sorted, unique");
        // Names absent here exist on the other 64-bit architecture only.
        let absent: Vec<&str> = ALLOWED
            .iter()
            .chain(CHECKED.iter().map(|(n, _)| n))
            .chain(REFUSED.iter().map(|(n, _)| n))
            .chain(NOSYS)
            .copied()
            .filter(|n| number(n).is_none())
            .collect();
        let x86_only = [
            "open",
            "creat",
            "dup2",
            "stat",
            "lstat",
            "access",
            "getdents",
            "rename",
            "mkdir",
            "rmdir",
            "link",
            "unlink",
            "symlink",
            "readlink",
            "chmod",
            "chown",
            "lchown",
            "utime",
            "utimes",
            "futimesat",
            "mknod",
            "inotify_init",
            "fork",
            "vfork",
            "arch_prctl",
            "pause",
            "alarm",
            "time",
            "epoll_create",
            "epoll_wait",
            "eventfd",
            "poll",
            "select",
            "signalfd",
            "modify_ldt",
        ];
        if cfg!(target_arch = "x86_64") {
            assert!(absent.is_empty(), "not x86_64 calls: {absent:?}");
        } else {
            assert!(absent.iter().all(|n| x86_only.contains(n)), "{absent:?}");
        }
        // Each name is in one list only.
        let mut all: Vec<&str> = ALLOWED
            .iter()
            .chain(CHECKED.iter().map(|(n, _)| n))
            .chain(REFUSED.iter().map(|(n, _)| n))
            .chain(NOSYS)
            .copied()
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a name in two lists");
    }

    /// The calls Docker's default profile (moby `profiles/seccomp/default.json`)
    /// allows a container without capabilities, on amd64 (its 32-bit names
    /// included: they are skipped here as there).
    #[rustfmt::skip]
    const DOCKER_DEFAULT: &[&str] = &[
        "accept", "accept4", "access", "adjtimex", "alarm", "bind", "brk", "capget", "capset",
        "chdir", "chmod", "chown", "chown32", "clock_adjtime", "clock_adjtime64", "clock_getres",
        "clock_getres_time64", "clock_gettime", "clock_gettime64", "clock_nanosleep",
        "clock_nanosleep_time64", "close", "close_range", "connect", "copy_file_range", "creat",
        "dup", "dup2", "dup3", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old",
        "epoll_pwait", "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2",
        "execve", "execveat", "exit", "exit_group", "faccessat", "faccessat2", "fadvise64",
        "fadvise64_64", "fallocate", "fanotify_mark", "fchdir", "fchmod", "fchmodat", "fchown",
        "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync", "fgetxattr", "flistxattr",
        "flock", "fork", "fremovexattr", "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs",
        "fstatfs64", "fsync", "ftruncate", "ftruncate64", "futex", "futex_time64", "futex_waitv",
        "futimesat", "getcpu", "getcwd", "getdents", "getdents64", "getegid", "getegid32",
        "geteuid", "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32", "getitimer",
        "getpeername", "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom",
        "getresgid", "getresgid32", "getresuid", "getresuid32", "getrlimit", "get_robust_list",
        "getrusage", "getsid", "getsockname", "getsockopt", "get_thread_area", "gettid",
        "gettimeofday", "getuid", "getuid32", "getxattr", "inotify_add_watch", "inotify_init",
        "inotify_init1", "inotify_rm_watch", "io_cancel", "ioctl", "io_destroy", "io_getevents",
        "io_pgetevents", "io_pgetevents_time64", "ioprio_get", "ioprio_set", "io_setup",
        "io_submit", "io_uring_enter", "io_uring_register", "io_uring_setup", "ipc", "kill",
        "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "lchown",
        "lchown32", "lgetxattr", "link", "linkat", "listen", "listxattr", "llistxattr", "_llseek",
        "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64", "madvise", "membarrier",
        "memfd_create", "memfd_secret", "mincore", "mkdir", "mkdirat", "mknod", "mknodat",
        "mlock", "mlock2", "mlockall", "mmap", "mmap2", "mprotect", "mq_getsetattr", "mq_notify",
        "mq_open", "mq_timedreceive", "mq_timedreceive_time64", "mq_timedsend",
        "mq_timedsend_time64", "mq_unlink", "mremap", "msgctl", "msgget", "msgrcv", "msgsnd",
        "msync", "munlock", "munlockall", "munmap", "name_to_handle_at", "nanosleep",
        "newfstatat", "_newselect", "open", "openat", "openat2", "pause", "pidfd_open",
        "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free", "pkey_mprotect", "poll",
        "ppoll", "ppoll_time64", "prctl", "pread64", "preadv", "preadv2", "prlimit64",
        "process_mrelease", "pselect6", "pselect6_time64", "pwrite64", "pwritev", "pwritev2",
        "read", "readahead", "readlink", "readlinkat", "readv", "recv", "recvfrom", "recvmmsg",
        "recvmmsg_time64", "recvmsg", "remap_file_pages", "removexattr", "rename", "renameat",
        "renameat2", "restart_syscall", "rmdir", "rseq", "rt_sigaction", "rt_sigpending",
        "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait",
        "rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr",
        "sched_getparam", "sched_get_priority_max", "sched_get_priority_min",
        "sched_getscheduler", "sched_rr_get_interval", "sched_rr_get_interval_time64",
        "sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler",
        "sched_yield", "seccomp", "select", "semctl", "semget", "semop", "semtimedop",
        "semtimedop_time64", "send", "sendfile", "sendfile64", "sendmmsg", "sendmsg", "sendto",
        "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32", "setgroups",
        "setgroups32", "setitimer", "setpgid", "setpriority", "setregid", "setregid32",
        "setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid", "setreuid32",
        "setrlimit", "set_robust_list", "setsid", "setsockopt", "set_thread_area",
        "set_tid_address", "setuid", "setuid32", "setxattr", "shmat", "shmctl", "shmdt", "shmget",
        "shutdown", "sigaltstack", "signalfd", "signalfd4", "sigprocmask", "sigreturn",
        "socketcall", "socketpair", "splice", "stat", "stat64", "statfs", "statfs64", "statx",
        "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "sysinfo", "tee", "tgkill",
        "time", "timer_create", "timer_delete", "timer_getoverrun", "timer_gettime",
        "timer_gettime64", "timer_settime", "timer_settime64", "timerfd_create",
        "timerfd_gettime", "timerfd_gettime64", "timerfd_settime", "timerfd_settime64", "times",
        "tkill", "truncate", "truncate64", "ugetrlimit", "umask", "uname", "unlink", "unlinkat",
        "utime", "utimensat", "utimensat_time64", "utimes", "vfork", "vmsplice", "wait4",
        "waitid", "waitpid", "write", "writev", "arch_prctl", "modify_ldt",
];

    #[test]
    fn every_call_dockers_profile_allows_is_allowed_or_refused_with_a_reason() {
        let checked: Vec<&str> = CHECKED.iter().map(|(n, _)| *n).collect();
        let undecided: Vec<&str> = DOCKER_DEFAULT
            .iter()
            .copied()
            .filter(|n| number(n).is_some())
            .filter(|n| {
                !ALLOWED.contains(n) && !checked.contains(n) && !REFUSED.iter().any(|(r, _)| r == n)
            })
            .collect();
        assert!(undecided.is_empty(), "decide: {undecided:?}");
        let beyond: Vec<&str> = ALLOWED
            .iter()
            .copied()
            .filter(|n| !DOCKER_DEFAULT.contains(n))
            .collect();
        assert_eq!(beyond, ["fchmodat2", "map_shadow_stack", "mseal"]);
    }

    #[test]
    fn what_must_be_refused_is_and_what_runtimes_need_is_not() {
        for refused in [
            "io_setup",
            "io_submit",
            "io_getevents",
            "io_pgetevents",
            "io_cancel",
            "io_destroy",
            "io_uring_setup",
            "ptrace",
            "process_vm_readv",
            "mount",
            "umount2",
            "unshare",
            "setns",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "kexec_load",
            "init_module",
            "open_by_handle_at",
            "name_to_handle_at",
            "pivot_root",
            "chroot",
            "swapon",
            "reboot",
            "syslog",
            "fsopen",
            "move_mount",
            "open_tree",
            "pidfd_getfd",
            "kcmp",
            "fanotify_init",
            "quotactl",
            "sethostname",
            "vhangup",
            "acct",
            "settimeofday",
            "lookup_dcookie",
            "uselib",
            "cachestat",
            "statmount",
            "listmount",
        ] {
            if let Some(nr) = number(refused) {
                assert!(
                    matches!(verdict(nr), Verdict::Refuse | Verdict::Unknown),
                    "{refused}: {:?}",
                    verdict(nr)
                );
            }
        }
        assert_eq!(verdict(number("clone3").unwrap()), Verdict::NoSys);
        assert_eq!(
            verdict(number("clone").unwrap()),
            Verdict::Checked(ArgCheck::CloneWithoutNamespaces)
        );
        for allowed in [
            "read",
            "execve",
            "futex",
            "rseq",
            "getrandom",
            "epoll_pwait",
            "exit_group",
        ] {
            assert_eq!(
                verdict(number(allowed).unwrap()),
                Verdict::Allow,
                "{allowed}"
            );
        }
        assert_eq!(verdict(max_known() + 1), Verdict::Unknown);
        assert!(allowed_numbers().len() > 200);
    }
}

//! The seccomp filters of the sandbox: a deny list on top of what the missing
//! capabilities already forbid (defence in depth, and the calls that need no
//! capability at all: ptrace of a sibling, userfaultfd, new namespaces, …).
//!
//! Three filters are stacked (the kernel takes the strictest verdict, and the
//! errno of the most recent filter among equals):
//! 1. deny list → `EPERM`, foreign architectures (i386 via `int 0x80`) → kill;
//!    with argument checks: `clone` with namespace flags, `socket` and
//!    `socketpair` of any family but [`ALLOWED_FAMILIES`] (vsock reaches the
//!    host whatever the network namespace) and raw/packet sockets, and the
//!    terminal ioctls that inject input or talk to the console
//!    ([`DENIED_IOCTLS`]: refused whatever the kernel's `legacy_tiocsti`);
//! 2. `clone3` → `ENOSYS`: its flags sit behind a pointer seccomp cannot
//!    read, and libc falls back to `clone`, whose flags filter 1 checks;
//! 3. the x32 syscall range (`nr ≥ 0x4000_0000`) → `ENOSYS`.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

#[derive(Debug, thiserror::Error)]
#[error("seccomp: {0}")]
pub struct SeccompError(String);

/// Denied outright, whatever the arguments.
pub const DENIED: &[(&str, i64)] = &[
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("kcmp", libc::SYS_kcmp),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("syslog", libc::SYS_syslog),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("personality", libc::SYS_personality),
    ("uselib", libc::SYS_uselib),
    ("vhangup", libc::SYS_vhangup),
    ("nfsservctl", libc::SYS_nfsservctl),
];

/// The only socket families a sandboxed agent gets: unix sockets and TCP/UDP
/// on its own loopback-only network namespace.
pub const ALLOWED_FAMILIES: &[(&str, i32)] = &[
    ("AF_UNIX", libc::AF_UNIX),
    ("AF_INET", libc::AF_INET),
    ("AF_INET6", libc::AF_INET6),
];

/// `ioctl` requests refused whatever the file: `TIOCSTI` pushes input into a
/// terminal (CVE-2017-5226's class), `TIOCLINUX` reaches the console.
#[allow(clippy::unnecessary_cast)] // the request's type differs between targets (c_ulong, c_int)
pub const DENIED_IOCTLS: &[(&str, u64)] = &[
    ("TIOCSTI", libc::TIOCSTI as u64),
    ("TIOCLINUX", libc::TIOCLINUX as u64),
];

pub const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SeccompError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
        .map_err(|e| SeccompError(e.to_string()))
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    SeccompRule::new(conds).map_err(|e| SeccompError(e.to_string()))
}

fn arch() -> Result<TargetArch, SeccompError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| SeccompError(e.to_string()))
}

/// Filter 1: the deny list, with argument checks for `clone` (namespace
/// flags), `socket`/`socketpair` (families, raw sockets) and `ioctl`.
pub fn deny_filter() -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|(_, nr)| (*nr, vec![])).collect();
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|f| rule(vec![cond(0, SeccompCmpOp::MaskedEq(*f), *f)?]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, clone_rules);
    // Any family but the allowed ones (all conditions of a rule must hold).
    let foreign_family = || -> Result<SeccompRule, SeccompError> {
        rule(
            ALLOWED_FAMILIES
                .iter()
                .map(|(_, f)| cond(0, SeccompCmpOp::Ne, *f as u64))
                .collect::<Result<Vec<_>, _>>()?,
        )
    };
    rules.insert(
        libc::SYS_socket,
        vec![
            foreign_family()?,
            rule(vec![cond(
                1,
                SeccompCmpOp::MaskedEq(0xf),
                libc::SOCK_RAW as u64,
            )?])?,
            rule(vec![cond(1, SeccompCmpOp::MaskedEq(0xf), 10)?])?, // SOCK_PACKET (obsolete packet socket type)
        ],
    );
    rules.insert(libc::SYS_socketpair, vec![foreign_family()?]);
    // The request is an `unsigned int`: the kernel ignores the upper half,
    // and so does the comparison (a 32-bit argument check).
    rules.insert(
        libc::SYS_ioctl,
        DENIED_IOCTLS
            .iter()
            .map(|(_, req)| rule(vec![cond(1, SeccompCmpOp::Eq, *req)?]))
            .collect::<Result<Vec<_>, _>>()?,
    );
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(|e| SeccompError(e.to_string()))?;
    f.try_into()
        .map_err(|e: seccompiler::BackendError| SeccompError(e.to_string()))
}

/// Filter 2: `clone3` fails with ENOSYS so libc falls back to `clone`.
pub fn clone3_filter() -> Result<BpfProgram, SeccompError> {
    let rules = BTreeMap::from([(libc::SYS_clone3, vec![])]);
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )
    .map_err(|e| SeccompError(e.to_string()))?;
    f.try_into()
        .map_err(|e: seccompiler::BackendError| SeccompError(e.to_string()))
}

/// Filter 3 (x86_64 only): no x32 system calls.
pub fn x32_filter() -> Option<BpfProgram> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    Some(vec![
        sock_filter {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        }, // seccomp_data.nr
        sock_filter {
            code: JGE_K,
            jt: 0,
            jf: 1,
            k: 0x4000_0000,
        },
        sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
        sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ])
}

/// The three filters, compiled (they depend on no run: init compiles them
/// before its header comes, and installs them last).
pub struct Filters(Vec<BpfProgram>);

impl Filters {
    pub fn compile() -> Result<Filters, SeccompError> {
        let mut progs = vec![deny_filter()?, clone3_filter()?];
        progs.extend(x32_filter());
        Ok(Filters(progs))
    }

    /// Installs them on the calling thread. Needs `no_new_privs`.
    pub fn install(&self) -> Result<(), SeccompError> {
        for p in &self.0 {
            seccompiler::apply_filter(p).map_err(|e| SeccompError(e.to_string()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        assert!(deny_filter().unwrap().len() > DENIED.len());
        assert!(!clone3_filter().unwrap().is_empty());
        let names: Vec<_> = DENIED.iter().map(|(n, _)| *n).collect();
        for must in [
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "mount",
            "umount2",
            "pivot_root",
            "unshare",
            "setns",
            "keyctl",
            "add_key",
            "bpf",
            "perf_event_open",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "open_by_handle_at",
            "userfaultfd",
        ] {
            assert!(names.contains(&must), "{must}");
        }
    }
}

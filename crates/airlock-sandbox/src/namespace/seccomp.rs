//! The seccomp filters of the sandbox: a deny list on top of what the missing
//! capabilities already forbid (defence in depth, and the calls that need no
//! capability at all: ptrace of a sibling, userfaultfd, new namespaces, …).
//!
//! Two filters are stacked (the kernel takes the strictest verdict, and the
//! errno of the most recent filter among equals):
//! 1. by number alone ([`number_filter`], a binary search): foreign
//!    architectures (i386 via `int 0x80`) → kill, the x32 syscall range
//!    (`nr ≥ 0x4000_0000`) → `ENOSYS`, `clone3` → `ENOSYS` (its flags sit
//!    behind a pointer seccomp cannot read, and libc falls back to `clone`,
//!    whose flags filter 2 checks), the deny list ([`DENIED`]) → `EPERM`;
//! 2. argument checks ([`argument_filter`]) → `EPERM`: `clone` with
//!    namespace flags, `socket` and `socketpair` of any family but
//!    [`ALLOWED_FAMILIES`] (vsock reaches the host whatever the network
//!    namespace) and raw/packet sockets, and the terminal ioctls that inject
//!    input or talk to the console ([`DENIED_IOCTLS`]: refused whatever the
//!    kernel's `legacy_tiocsti`).
//!
//! Installing a filter costs the kernel one emulation of it per system
//! call number (its action cache): a linear chain of the ~50 denied numbers
//! cost ~150 µs of every sandbox start here, a search of depth 6 a few µs.
//! So the deny list is a search, and seccompiler's linear dispatch is left
//! the four calls whose arguments matter.

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

/// Filter 2: the argument checks of `clone` (namespace flags),
/// `socket`/`socketpair` (families, raw sockets) and `ioctl`.
pub fn argument_filter() -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
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

const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K
/// `offsetof(struct seccomp_data, arch)`; `nr` is at 0.
const ARCH_OFFSET: u32 = 4;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// Where a jump of [`number_filter`] goes.
#[derive(Clone, Copy)]
enum To {
    /// `n` instructions ahead.
    Skip(usize),
    Allow,
    Denied,
    NoSys,
}

struct Insn {
    code: u16,
    k: u32,
    jt: To,
    jf: To,
}

/// Appends a search for `a` (the number) among `nrs` (sorted, not empty): every path
/// ends in a jump to [`To::Denied`] (found) or [`To::Allow`].
fn search(nrs: &[u32], out: &mut Vec<Insn>) {
    if nrs.len() <= 3 {
        for (i, nr) in nrs.iter().enumerate() {
            out.push(Insn {
                code: JEQ_K,
                k: *nr,
                jt: To::Denied,
                jf: if i + 1 == nrs.len() {
                    To::Allow
                } else {
                    To::Skip(0)
                },
            });
        }
        return;
    }
    let (low, high) = nrs.split_at(nrs.len() / 2);
    let at = out.len();
    out.push(Insn {
        code: JGE_K,
        k: high[0],
        jt: To::Skip(0), // set below, once the low half is laid out
        jf: To::Skip(0),
    });
    search(low, out);
    out[at].jt = To::Skip(out.len() - at - 1);
    search(high, out);
}

/// Filter 1: by number alone (see the module's account).
pub fn number_filter() -> Result<BpfProgram, SeccompError> {
    let mut denied: Vec<u32> = DENIED.iter().map(|(_, nr)| *nr as u32).collect();
    denied.sort_unstable();
    denied.dedup();
    if denied.is_empty() {
        return Err(SeccompError("an empty deny list".into()));
    }
    let ld = |k| Insn {
        code: LD_W_ABS,
        k,
        jt: To::Skip(0),
        jf: To::Skip(0),
    };
    let mut p = vec![
        ld(ARCH_OFFSET),
        Insn {
            code: JEQ_K,
            k: AUDIT_ARCH,
            jt: To::Skip(1),
            jf: To::Skip(0),
        },
        Insn {
            code: RET_K,
            k: libc::SECCOMP_RET_KILL_PROCESS,
            jt: To::Skip(0),
            jf: To::Skip(0),
        },
        ld(0),
    ];
    if cfg!(target_arch = "x86_64") {
        p.push(Insn {
            code: JGE_K,
            k: X32_SYSCALL_BIT,
            jt: To::NoSys,
            jf: To::Skip(0),
        });
    }
    p.push(Insn {
        code: JEQ_K,
        k: libc::SYS_clone3 as u32,
        jt: To::NoSys,
        jf: To::Skip(0),
    });
    search(&denied, &mut p);
    // The three verdicts, last.
    let allow = p.len();
    let (denied_at, nosys) = (allow + 1, allow + 2);
    let mut prog: BpfProgram = Vec::with_capacity(p.len() + 3);
    for (i, insn) in p.iter().enumerate() {
        let off = |to: To| -> Result<u8, SeccompError> {
            let n = match to {
                To::Skip(n) => n,
                To::Allow => allow - i - 1,
                To::Denied => denied_at - i - 1,
                To::NoSys => nosys - i - 1,
            };
            u8::try_from(n).map_err(|_| SeccompError(format!("a jump of {n} at {i}")))
        };
        prog.push(sock_filter {
            code: insn.code,
            jt: off(insn.jt)?,
            jf: off(insn.jf)?,
            k: insn.k,
        });
    }
    for k in [
        libc::SECCOMP_RET_ALLOW,
        libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    ] {
        prog.push(sock_filter {
            code: RET_K,
            jt: 0,
            jf: 0,
            k,
        });
    }
    Ok(prog)
}

/// The two filters, compiled (they depend on no run: init compiles them
/// before its header comes, and installs them last).
pub struct Filters(Vec<BpfProgram>);

impl Filters {
    pub fn compile() -> Result<Filters, SeccompError> {
        Ok(Filters(vec![number_filter()?, argument_filter()?]))
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

    /// The kernel's classic BPF, for the instructions the filters use.
    fn verdict(prog: &[sock_filter], arch: u32, nr: u32) -> (u32, usize) {
        let (mut pc, mut a, mut steps) = (0usize, 0u32, 0usize);
        loop {
            let i = &prog[pc];
            steps += 1;
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    a = match i.k {
                        0 => nr,
                        ARCH_OFFSET => arch,
                        k => panic!("load of {k}"),
                    }
                }
                JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                JGE_K => pc += usize::from(if a >= i.k { i.jt } else { i.jf }),
                RET_K => return (i.k, steps),
                c => panic!("instruction {c:#x}"),
            }
        }
    }

    #[test]
    fn the_number_filter_decides_every_number_as_the_lists_say_in_few_steps() {
        let p = number_filter().unwrap();
        let denied: Vec<u32> = DENIED.iter().map(|(_, nr)| *nr as u32).collect();
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        let mut numbers: Vec<u32> = (0..2048).collect();
        numbers.extend([X32_SYSCALL_BIT, X32_SYSCALL_BIT + 1, u32::MAX]);
        numbers.extend(denied.iter().map(|n| n | X32_SYSCALL_BIT));
        let mut longest = 0;
        for nr in numbers {
            let (v, steps) = verdict(&p, AUDIT_ARCH, nr);
            longest = longest.max(steps);
            let x32 = cfg!(target_arch = "x86_64") && nr >= X32_SYSCALL_BIT;
            let want = if x32 || nr == libc::SYS_clone3 as u32 {
                enosys
            } else if denied.contains(&nr) {
                eperm
            } else {
                libc::SECCOMP_RET_ALLOW
            };
            assert_eq!(v, want, "nr {nr:#x}");
            // Any other architecture (i386's numbers mean other calls): killed.
            assert_eq!(
                verdict(&p, 0x4000_0003, nr).0,
                libc::SECCOMP_RET_KILL_PROCESS
            );
        }
        // 5 to load and check, a search of depth log2(n/3), up to 3 comparisons, the verdict.
        assert!(longest <= 16, "a search, not a chain: {longest} steps");
        for nr in ["ptrace", "mount", "unshare", "bpf", "io_uring_setup"] {
            let n = DENIED.iter().find(|(d, _)| *d == nr).unwrap().1 as u32;
            assert_eq!(verdict(&p, AUDIT_ARCH, n).0, eperm, "{nr}");
        }
        for allowed in [
            libc::SYS_read,
            libc::SYS_clone,
            libc::SYS_socket,
            libc::SYS_execve,
        ] {
            assert_eq!(
                verdict(&p, AUDIT_ARCH, allowed as u32).0,
                libc::SECCOMP_RET_ALLOW,
                "{allowed}"
            );
        }
    }

    #[test]
    fn filters_compile() {
        assert!(!argument_filter().unwrap().is_empty());
        assert_eq!(Filters::compile().unwrap().0.len(), 2);
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

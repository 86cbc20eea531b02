//! The seccomp filters of every sandbox, compiled from the one allow list
//! ([`crate::syscalls`]). The namespace sandbox's init installs them before
//! it starts the command; the docker backend's container init does the
//! same inside each container (the daemon's profile, from the same list,
//! is the outer layer: [`crate::docker::profile`]).
//!
//! Two filters are stacked (the kernel takes the strictest verdict, and
//! the errno of the most recent filter among equals):
//! 1. by number alone ([`number_filter`], a binary search over the runs
//!    of equal verdicts): foreign architectures (i386 via `int 0x80`) →
//!    kill; the x32 range (`nr ≥ 0x4000_0000`) → `ENOSYS`; a call on the
//!    allow list, or one whose arguments filter 2 checks → allowed; `clone3`
//!    and numbers the kernel does not know → `ENOSYS`; every other call →
//!    `EPERM`;
//! 2. the argument checks ([`argument_filter`]) → `EPERM`: `clone` with a
//!    namespace flag, `socket`/`socketpair` of a family or type outside
//!    the allowed ones, the terminal ioctls, a `personality` Docker does
//!    not allow.
//!
//! Installing a filter costs the kernel one emulation of it per system
//! call number (its action cache): a linear chain of every allowed number
//! would cost a sandbox start a millisecond or more, a search of depth 8
//! a few µs. So filter 1 is a search, and seccompiler's linear dispatch is
//! left the five calls whose arguments matter.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

use crate::syscalls::{self, ArgCheck, Verdict};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A rule or a filter the compiler refused.
    #[error("seccomp: {0}")]
    Compile(#[from] seccompiler::BackendError),
    /// The kernel refused a filter.
    #[error("seccomp: {0}")]
    Install(#[from] seccompiler::Error),
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SeccompError> {
    Ok(SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        op,
        value,
    )?)
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, SeccompError> {
    Ok(SeccompRule::new(conds)?)
}

fn arch() -> Result<TargetArch, SeccompError> {
    Ok(TargetArch::try_from(std::env::consts::ARCH)?)
}

/// The refusals of `check`, as rules (any rule that matches refuses).
fn refusals(check: ArgCheck) -> Result<Vec<SeccompRule>, SeccompError> {
    match check {
        ArgCheck::CloneWithoutNamespaces => syscalls::NAMESPACE_FLAGS
            .iter()
            .map(|(_, f)| {
                rule(vec![cond(
                    0,
                    SeccompCmpOp::MaskedEq(u64::from(*f)),
                    u64::from(*f),
                )?])
            })
            .collect(),
        ArgCheck::Socket => {
            // A family outside the allowed ones (every condition of a rule must hold)…
            let mut v = vec![rule(
                syscalls::SOCKET_FAMILIES
                    .iter()
                    .map(|(_, f)| cond(0, SeccompCmpOp::Ne, u64::from(*f)))
                    .collect::<Result<Vec<_>, _>>()?,
            )?];
            // …or a type outside the allowed ones.
            let mask = u64::from(syscalls::SOCKET_TYPE_MASK);
            for t in 0..=mask {
                if !syscalls::SOCKET_TYPES
                    .iter()
                    .any(|(_, a)| u64::from(*a) == t)
                {
                    v.push(rule(vec![cond(1, SeccompCmpOp::MaskedEq(mask), t)?])?);
                }
            }
            Ok(v)
        }
        // The request is an `unsigned int`: the kernel ignores the upper
        // half, and so does the comparison (a 32-bit argument check).
        ArgCheck::Ioctl => syscalls::DENIED_IOCTLS
            .iter()
            .map(|(_, req)| rule(vec![cond(1, SeccompCmpOp::Eq, u64::from(*req))?]))
            .collect(),
        ArgCheck::Personality => Ok(vec![rule(
            syscalls::PERSONALITIES
                .iter()
                .map(|p| cond(0, SeccompCmpOp::Ne, u64::from(*p)))
                .collect::<Result<Vec<_>, _>>()?,
        )?]),
    }
}

/// Filter 2: the argument checks of [`syscalls::CHECKED`].
pub fn argument_filter() -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (name, check) in syscalls::CHECKED {
        let Some(nr) = syscalls::number(name) else {
            continue;
        };
        rules.insert(i64::from(nr), refusals(*check)?);
    }
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )?;
    let program: Result<BpfProgram, seccompiler::BackendError> = f.try_into();
    Ok(program?)
}

const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const JA: u16 = 0x05; // BPF_JMP | BPF_JA
const RET_K: u16 = 0x06; // BPF_RET | BPF_K
/// `offsetof(struct seccomp_data, arch)`; `nr` is at 0.
const ARCH_OFFSET: u32 = 4;
/// The x32 ABI's numbers (x86_64 only): `nr | 0x4000_0000`.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// What filter 1 does with a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Eperm,
    Enosys,
}

impl Action {
    fn of(v: Verdict) -> Action {
        match v {
            Verdict::Allow | Verdict::Checked(_) => Action::Allow,
            Verdict::Refuse => Action::Eperm,
            Verdict::NoSys | Verdict::Unknown => Action::Enosys,
        }
    }

    fn ret(self) -> u32 {
        match self {
            Action::Allow => libc::SECCOMP_RET_ALLOW,
            Action::Eperm => libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
            Action::Enosys => libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        }
    }
}

/// The numbers `0..` as runs of one action: `(first number, action)`,
/// the last run open-ended (numbers past the table: `ENOSYS`).
pub fn runs() -> Vec<(u32, Action)> {
    let mut v: Vec<(u32, Action)> = Vec::new();
    for nr in 0..=syscalls::max_known() + 1 {
        let a = Action::of(syscalls::verdict(nr));
        if v.last().is_none_or(|(_, last)| *last != a) {
            v.push((nr, a));
        }
    }
    v
}

struct Insn {
    code: u16,
    k: u32,
    jt: u8,
    jf: u8,
}

fn ret(k: u32) -> Insn {
    Insn {
        code: RET_K,
        k,
        jt: 0,
        jf: 0,
    }
}

/// Appends a search for `a` (the number) among `runs` (not empty): each
/// leaf returns its run's action. A branch over more than 255
/// instructions jumps with `JA` (32-bit offset).
fn search(runs: &[(u32, Action)], out: &mut Vec<Insn>) {
    if let [(_, a)] = runs {
        out.push(ret(a.ret()));
        return;
    }
    let (low, high) = runs.split_at(runs.len() / 2);
    let at = out.len();
    // if a >= high[0] goto high (patched below, once low is laid out)
    out.push(Insn {
        code: JGE_K,
        k: high[0].0,
        jt: 0,
        jf: 1,
    });
    out.push(Insn {
        code: JA,
        k: 0,
        jt: 0,
        jf: 0,
    });
    search(low, out);
    // The JA at `at + 1` is taken on the high side: it skips the low half.
    let low_len = out.len() - at - 2;
    out[at + 1].k = u32::try_from(low_len).unwrap_or(u32::MAX);
    search(high, out);
}

/// Filter 1: by number alone (see the module's account).
pub fn number_filter() -> BpfProgram {
    let ld = |k| Insn {
        code: LD_W_ABS,
        k,
        jt: 0,
        jf: 0,
    };
    let mut p = vec![
        ld(ARCH_OFFSET),
        Insn {
            code: JEQ_K,
            k: AUDIT_ARCH,
            jt: 1,
            jf: 0,
        },
        ret(libc::SECCOMP_RET_KILL_PROCESS),
        ld(0),
    ];
    if cfg!(target_arch = "x86_64") {
        p.push(Insn {
            code: JGE_K,
            k: X32_SYSCALL_BIT,
            jt: 0,
            jf: 1,
        });
        p.push(ret(Action::Enosys.ret()));
    }
    search(&runs(), &mut p);
    p.into_iter()
        .map(|i| sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect()
}

/// The two filters, compiled (they depend on no run: an init compiles them
/// before its run is known, and installs them last).
pub struct Filters(Vec<BpfProgram>);

impl Filters {
    pub fn compile() -> Result<Filters, SeccompError> {
        Ok(Filters(vec![number_filter(), argument_filter()?]))
    }

    /// Installs them on the calling thread. Needs `no_new_privs`.
    pub fn install(&self) -> Result<(), SeccompError> {
        for p in &self.0 {
            seccompiler::apply_filter(p)?;
        }
        Ok(())
    }
}

/// How `airlock doctor` describes the filters.
pub fn summary() -> String {
    let allowed = syscalls::allowed_numbers().len();
    format!(
        "allow list: {allowed} of the {} calls Linux 6.18 has on {} ({} with argument checks), everything else refused (EPERM; ENOSYS for clone3 and unknown numbers)",
        syscalls::TABLE.len(),
        std::env::consts::ARCH,
        syscalls::CHECKED.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's classic BPF, for the instructions filter 1 uses.
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
                JA => pc += i.k as usize,
                RET_K => return (i.k, steps),
                c => panic!("instruction {c:#x}"),
            }
        }
    }

    #[test]
    fn the_number_filter_decides_every_number_as_the_allow_list_says_in_few_steps() {
        let p = number_filter();
        assert!(p.len() < 4096, "BPF_MAXINSNS");
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        let mut numbers: Vec<u32> = (0..2048).collect();
        numbers.extend([X32_SYSCALL_BIT, X32_SYSCALL_BIT + 1, u32::MAX]);
        numbers.extend(
            syscalls::allowed_numbers()
                .iter()
                .map(|n| n | X32_SYSCALL_BIT),
        );
        let mut longest = 0;
        for nr in numbers {
            let (v, steps) = verdict(&p, AUDIT_ARCH, nr);
            longest = longest.max(steps);
            let x32 = cfg!(target_arch = "x86_64") && nr >= X32_SYSCALL_BIT;
            let want = if x32 {
                enosys
            } else {
                match syscalls::verdict(nr) {
                    Verdict::Allow | Verdict::Checked(_) => libc::SECCOMP_RET_ALLOW,
                    Verdict::Refuse => eperm,
                    Verdict::NoSys | Verdict::Unknown => enosys,
                }
            };
            assert_eq!(v, want, "nr {nr:#x} ({:?})", syscalls::name(nr));
            // Any other architecture (i386's numbers mean other calls): killed.
            assert_eq!(
                verdict(&p, 0x4000_0003, nr).0,
                libc::SECCOMP_RET_KILL_PROCESS
            );
        }
        // 5 to load and check, a search of depth log2(runs) (two
        // instructions a level at most), the verdict.
        let depth = usize::BITS - runs().len().leading_zeros();
        assert!(
            longest <= 7 + 2 * depth as usize,
            "a search, not a chain: {longest} steps for {} runs",
            runs().len()
        );
        for (nr, want) in [
            ("io_setup", eperm),
            ("ptrace", eperm),
            ("mount", eperm),
            ("unshare", eperm),
            ("keyctl", eperm),
            ("io_uring_setup", eperm),
            ("clone3", enosys),
            ("read", libc::SECCOMP_RET_ALLOW),
            ("clone", libc::SECCOMP_RET_ALLOW),
            ("socket", libc::SECCOMP_RET_ALLOW),
            ("execve", libc::SECCOMP_RET_ALLOW),
        ] {
            let n = syscalls::number(nr).unwrap();
            assert_eq!(verdict(&p, AUDIT_ARCH, n).0, want, "{nr}");
        }
    }

    #[test]
    fn filters_compile() {
        assert!(!argument_filter().unwrap().is_empty());
        assert_eq!(Filters::compile().unwrap().0.len(), 2);
        assert!(summary().starts_with("allow list: "));
    }
}

//! The containers' confinement, derived from the tables every backend
//! shares: the seccomp allow list ([`crate::syscalls`]) as a Docker profile
//! (the daemon's layer; the container's init installs the same filters as
//! the namespace sandbox inside, [`crate::seccomp`]), and the namespace
//! backend's masked and read-only `/proc` entries.

use serde_json::{Value, json};

use crate::namespace::plan;
use crate::syscalls::{self, ArgCheck};

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

/// One comparison of an argument's low 32 bits (the checked arguments are
/// `int`s and `unsigned int`s to the kernel, which ignores the upper half):
/// `(arg & mask) == value`.
fn low32(index: u32, mask: u32, value: u32) -> Value {
    json!({"index": index, "value": u64::from(mask), "valueTwo": u64::from(value), "op": "SCMP_CMP_MASKED_EQ"})
}

fn allow(names: &[&str], args: Vec<Value>) -> Value {
    let mut v = json!({"names": names, "action": "SCMP_ACT_ALLOW"});
    if !args.is_empty() {
        v["args"] = Value::Array(args);
    }
    v
}

/// `(mask, value)` patterns of 32-bit values, one of which matches every
/// value but those of `denied` (and none of those): libseccomp joins the
/// rules of a call with OR and has no masked "not equal". Where every
/// denied value has the same bit, a value with the other bit is none of
/// them (one pattern per such bit); the values that agree with them on all
/// those bits are listed one by one, but the denied.
pub fn patterns_but(denied: &[u32]) -> Vec<(u32, u32)> {
    let Some(first) = denied.first() else {
        return vec![(0, 0)];
    };
    let differing = denied.iter().fold(0u32, |m, d| m | (d ^ first));
    let mut v: Vec<(u32, u32)> = (0..32)
        .map(|i| 1u32 << i)
        .filter(|bit| differing & bit == 0)
        .map(|bit| (bit, !first & bit))
        .collect();
    let bits: Vec<u32> = (0..32)
        .map(|i| 1u32 << i)
        .filter(|b| differing & b != 0)
        .collect();
    for combo in 0u32..(1 << bits.len()) {
        let x = bits
            .iter()
            .enumerate()
            .filter(|(i, _)| combo & (1 << i) != 0)
            .fold(first & !differing, |x, (_, b)| x | b);
        if !denied.contains(&x) {
            v.push((u32::MAX, x));
        }
    }
    v
}

/// The allow rules of a call whose arguments [`ArgCheck`] checks.
fn checked(name: &str, check: ArgCheck) -> Vec<Value> {
    match check {
        ArgCheck::CloneWithoutNamespaces => {
            vec![allow(
                &[name],
                vec![low32(0, syscalls::namespace_mask(), 0)],
            )]
        }
        ArgCheck::Socket => syscalls::SOCKET_FAMILIES
            .iter()
            .flat_map(|(_, f)| {
                syscalls::SOCKET_TYPES.iter().map(move |(_, t)| {
                    allow(
                        &[name],
                        vec![
                            low32(0, u32::MAX, *f),
                            low32(1, syscalls::SOCKET_TYPE_MASK, *t),
                        ],
                    )
                })
            })
            .collect(),
        ArgCheck::Ioctl => {
            let denied: Vec<u32> = syscalls::DENIED_IOCTLS.iter().map(|(_, r)| *r).collect();
            patterns_but(&denied)
                .into_iter()
                .map(|(mask, value)| allow(&[name], vec![low32(1, mask, value)]))
                .collect()
        }
        ArgCheck::Personality => syscalls::PERSONALITIES
            .iter()
            .map(|p| allow(&[name], vec![low32(0, u32::MAX, *p)]))
            .collect(),
    }
}

/// The Docker seccomp profile of a sandbox's container: the allow list
/// ([`syscalls::ALLOWED`]), the argument checks as allow rules (a call
/// with any rule that has no condition would be allowed whatever its
/// arguments: libseccomp lets an unconditional rule supersede the rest),
/// `clone3` as `ENOSYS`, everything else `EPERM`. Names the daemon's
/// libseccomp does not know are skipped by runc, and numbers above the
/// highest it resolves get `ENOSYS` (runc's stub), as in the namespace
/// filter.
pub fn seccomp_profile() -> String {
    let allowed: Vec<&str> = syscalls::ALLOWED
        .iter()
        .copied()
        .filter(|n| syscalls::number(n).is_some())
        .collect();
    let mut rules = vec![allow(&allowed, vec![])];
    for (name, check) in syscalls::CHECKED {
        if syscalls::number(name).is_some() {
            rules.extend(checked(name, *check));
        }
    }
    rules.push(json!({"names": syscalls::NOSYS, "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS}));
    let arch = match std::env::consts::ARCH {
        "aarch64" => "SCMP_ARCH_AARCH64",
        _ => "SCMP_ARCH_X86_64",
    };
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": EPERM,
        "architectures": [arch],
        "syscalls": rules,
    })
    .to_string()
}

/// `/proc` entries masked in the agent container: Docker's defaults and the
/// namespace backend's list (it replaces Docker's list: the API takes one).
pub fn masked_paths() -> Vec<String> {
    let mut v: Vec<String> = plan::PROC_MASKED_FILES
        .iter()
        .chain(plan::PROC_MASKED_DIRS)
        .map(|s| s.to_string())
        .collect();
    // Docker's own, beside /proc.
    v.push("/sys/firmware".into());
    v.push("/sys/devices/virtual/powercap".into());
    v.sort();
    v.dedup();
    v
}

/// `/proc` entries read-only in the agent container.
pub fn readonly_paths() -> Vec<String> {
    plan::PROC_READONLY.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_patterns_match_every_request_but_the_denied() {
        let denied: Vec<u32> = syscalls::DENIED_IOCTLS.iter().map(|(_, r)| *r).collect();
        let p = patterns_but(&denied);
        let admitted = |x: u32| p.iter().any(|(m, v)| x & m == *v);
        for d in &denied {
            assert!(!admitted(*d), "{d:#x}");
        }
        let mut n = 0u32;
        for x in (0..0x1_0000u32).chain([0x5412 | 0x1_0000, u32::MAX, 0x8000_5412, 0x4004_5413]) {
            if !denied.contains(&x) {
                assert!(admitted(x), "{x:#x}");
                n += 1;
            }
        }
        assert!(n > 60_000);
        // A handful of rules, not one per value.
        assert!(p.len() < 40, "{}", p.len());
        assert_eq!(patterns_but(&[5]).len(), 32);
    }

    #[test]
    fn the_profile_is_the_allow_list() {
        let p: Value = serde_json::from_str(&seccomp_profile()).unwrap();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(p["defaultErrnoRet"], EPERM);
        let rules = p["syscalls"].as_array().unwrap();
        let unconditional: Vec<&str> = rules
            .iter()
            .filter(|r| r["args"].is_null() && r["action"] == "SCMP_ACT_ALLOW")
            .flat_map(|r| r["names"].as_array().unwrap())
            .map(|n| n.as_str().unwrap())
            .collect();
        for must in ["read", "execve", "futex", "epoll_pwait", "exit_group"] {
            assert!(unconditional.contains(&must), "{must}");
        }
        for never in [
            "io_setup",
            "io_submit",
            "io_uring_setup",
            "ptrace",
            "mount",
            "unshare",
            "bpf",
            "keyctl",
            "add_key",
            "clone",
            "clone3",
            "socket",
            "ioctl",
            "personality",
        ] {
            assert!(!unconditional.contains(&never), "{never}");
        }
        // The checked calls: only with conditions, each on the low 32 bits.
        for r in rules.iter().filter(|r| !r["args"].is_null()) {
            assert_eq!(r["action"], "SCMP_ACT_ALLOW", "{r}");
            for a in r["args"].as_array().unwrap() {
                assert_eq!(a["op"], "SCMP_CMP_MASKED_EQ", "{r}");
            }
        }
        let socket_rules = rules.iter().filter(|r| r["names"][0] == "socket").count();
        assert_eq!(socket_rules, 9, "3 families x 3 types");
        let enosys = rules.iter().find(|r| r["errnoRet"] == ENOSYS).unwrap();
        assert_eq!(enosys["names"][0], "clone3");
        assert!(masked_paths().contains(&"/proc/kcore".to_string()));
        assert!(masked_paths().contains(&"/proc/kallsyms".to_string()));
    }
}

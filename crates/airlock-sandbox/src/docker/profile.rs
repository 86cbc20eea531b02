//! The agent container's confinement, derived from the namespace backend's
//! own tables so both backends refuse the same things: the seccomp deny
//! list (as a Docker seccomp profile) and the masked and read-only `/proc`
//! entries.

use serde_json::{Value, json};

use crate::namespace::{plan, seccomp};

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

fn errno(names: &[&str], errno: u32, args: Value) -> Value {
    let mut v = json!({"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": errno});
    if !args.is_null() {
        v["args"] = args;
    }
    v
}

fn arg(index: u32, op: &str, value: u64, value_two: u64) -> Value {
    json!({"index": index, "value": value, "valueTwo": value_two, "op": op})
}

/// The Docker seccomp profile of the agent container: everything allowed but
/// what [`seccomp`] denies the namespace sandbox — the same calls, the same
/// socket families, the same terminal ioctls, namespace flags on `clone`,
/// `clone3` as `ENOSYS` (its flags are behind a pointer). Each rule holds
/// one comparison (libseccomp joins the rules of a call with OR).
pub fn seccomp_profile() -> String {
    let denied: Vec<&str> = seccomp::DENIED.iter().map(|(n, _)| *n).collect();
    let mut rules = vec![errno(&denied, EPERM, Value::Null)];
    rules.push(errno(&["clone3"], ENOSYS, Value::Null));
    // `socket`/`socketpair` of a family outside the allowed ones: every
    // other value below the highest allowed one, and everything above it.
    let allowed: Vec<u64> = seccomp::ALLOWED_FAMILIES
        .iter()
        .map(|(_, f)| *f as u64)
        .collect();
    let top = allowed.iter().copied().max().unwrap_or(0);
    for family in (0..top).filter(|f| !allowed.contains(f)) {
        rules.push(errno(
            &["socket", "socketpair"],
            EPERM,
            json!([arg(0, "SCMP_CMP_EQ", family, 0)]),
        ));
    }
    rules.push(errno(
        &["socket", "socketpair"],
        EPERM,
        json!([arg(0, "SCMP_CMP_GT", top, 0)]),
    ));
    // The terminal ioctls, on the low 32 bits (the kernel ignores the rest).
    for (_, req) in seccomp::DENIED_IOCTLS {
        rules.push(errno(
            &["ioctl"],
            EPERM,
            json!([arg(1, "SCMP_CMP_MASKED_EQ", 0xffff_ffff, *req)]),
        ));
    }
    // New namespaces through clone(2).
    for flag in seccomp::NAMESPACE_FLAGS {
        rules.push(errno(
            &["clone"],
            EPERM,
            json!([arg(0, "SCMP_CMP_MASKED_EQ", *flag, *flag)]),
        ));
    }
    let arch = match std::env::consts::ARCH {
        "aarch64" => "SCMP_ARCH_AARCH64",
        _ => "SCMP_ARCH_X86_64",
    };
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
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
    fn the_profile_refuses_what_the_namespace_filter_refuses() {
        let p: Value = serde_json::from_str(&seccomp_profile()).unwrap();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ALLOW");
        let rules = p["syscalls"].as_array().unwrap();
        let names: Vec<&str> = rules[0]["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        for must in [
            "ptrace",
            "mount",
            "unshare",
            "bpf",
            "io_uring_setup",
            "keyctl",
        ] {
            assert!(names.contains(&must), "{must}");
        }
        // AF_VSOCK (40), AF_NETLINK (16), AF_PACKET (17), AF_UNSPEC (0) and
        // AF_AX25 (3) are refused, AF_UNIX/INET/INET6 are not.
        let refused = |f: u64| {
            rules.iter().any(|r| {
                r["names"][0] == "socket"
                    && ((r["args"][0]["op"] == "SCMP_CMP_EQ" && r["args"][0]["value"] == f)
                        || (r["args"][0]["op"] == "SCMP_CMP_GT"
                            && r["args"][0]["value"].as_u64().unwrap() < f))
            })
        };
        for f in [0, 3, 9, 16, 17, 38, 40] {
            assert!(refused(f), "family {f}");
        }
        for f in [1, 2, 10] {
            assert!(!refused(f), "family {f}");
        }
        // Every rule compares one argument once (libseccomp refuses more).
        for r in rules {
            assert!(r["args"].as_array().is_none_or(|a| a.len() == 1), "{r}");
        }
        assert!(masked_paths().contains(&"/proc/kcore".to_string()));
        assert!(masked_paths().contains(&"/proc/kallsyms".to_string()));
    }
}

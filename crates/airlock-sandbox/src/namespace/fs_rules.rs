//! Landlock, best effort: on top of the read-only mounts, the sandbox may
//! write only under the workspace, `/tmp`, `/dev/shm` (the three views of
//! the one capped tmpfs) and to the writable devices; it may not reach abstract unix sockets or signal
//! processes outside its Landlock domain (ABI 6). On kernels without
//! Landlock this is a no-op and [`apply`] says so.

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope, path_beneath_rules,
};

#[derive(Debug, thiserror::Error)]
#[error("landlock: {0}")]
pub struct LandlockError(#[from] landlock::RulesetError);

/// What the kernel enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforced {
    Full,
    Partial,
    None,
}

pub fn apply(workspace: PathBuf) -> Result<Enforced, LandlockError> {
    let abi = ABI::V6;
    let rw_dirs = [workspace, PathBuf::from("/tmp"), PathBuf::from("/dev/shm")];
    let devices = ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"];
    let dev_rw = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)?
        .create()?
        .add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(
            rw_dirs.iter().filter(|p| p.exists()),
            AccessFs::from_all(abi),
        ))?
        .add_rules(path_beneath_rules(
            devices.iter().filter(|p| std::path::Path::new(p).exists()),
            dev_rw,
        ))?
        .restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforced::Full,
        RulesetStatus::PartiallyEnforced => Enforced::Partial,
        RulesetStatus::NotEnforced => Enforced::None,
    })
}

//! What the host side hands `airlock sandbox-init`: the non-secret part of
//! the [`SandboxSpec`], as a length-prefixed JSON header on the init's stdin.
//! The bytes after the header are the command's stdin (the run's secrets):
//! they are never parsed, only passed through on the same file descriptor.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::SandboxSpec;

/// Upper bound of the header, so a garbled stream cannot make init allocate much.
pub const MAX_HEADER: usize = 1 << 20;
/// Largest workspace tmpfs (1 TiB: a typo, not a size).
pub const MAX_WORKSPACE_MB: u64 = 1 << 20;
pub const HOSTNAME: &str = "airlock";
/// Where the sandbox sees the sidecar's sockets (read-only).
pub const SOCKETS_INSIDE: &str = "/run/airlock";
/// The agent's workspace inside the sandbox.
pub const WORKSPACE_INSIDE: &str = "/workspace";
/// Where the sandbox sees the `airlock` binary (read-only; it runs
/// `airlock runtime`): the file alone, at a path that says nothing of
/// where it is on the host. Nothing else of its directory is bound.
pub const EXE_INSIDE: &str = "/.airlock/airlock";
/// Paths init builds itself: nothing the spec names may be at or under them.
const RESERVED: &[&str] = &[
    "/proc",
    "/dev",
    "/oldroot",
    "/run/airlock",
    "/.rw",
    "/.airlock",
];
/// The uid and gid the agent has inside the sandbox (never 0: nothing in
/// the sandbox looks or acts like root).
pub const SANDBOX_UID: u32 = 1000;
pub const SANDBOX_GID: u32 = 1000;
/// When the platform is root, each run's sandbox is a dedicated unprivileged
/// host uid/gid in `[HOST_ID_BASE, HOST_ID_BASE + HOST_ID_SPAN)`, picked from
/// the run id. Far above the ranges distributions give users and
/// `/etc/subuid` (100000+), below 2^31.
pub const HOST_ID_BASE: u32 = 0x5A00_0000;
pub const HOST_ID_SPAN: u32 = 0x0100_0000;

/// Who the sandbox is on the host.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostIds {
    pub uid: u32,
    pub gid: u32,
    /// Init must switch to `uid`/`gid` before creating the namespaces (the
    /// platform is root); otherwise they are the platform's own.
    pub switch: bool,
}

impl HostIds {
    /// The host ids of `run_id`'s sandbox: a dedicated unprivileged uid/gid
    /// when the platform is root, else the platform's own (rootless).
    pub fn for_run(run_id: &str) -> HostIds {
        if rustix::process::geteuid().is_root() {
            // FNV-1a of the run id: stable for a run, spread over the span.
            let h = run_id.bytes().fold(0x811c_9dc5u32, |h, b| {
                (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
            });
            let id = HOST_ID_BASE + h % HOST_ID_SPAN;
            HostIds {
                uid: id,
                gid: id,
                switch: true,
            }
        } else {
            HostIds {
                uid: rustix::process::getuid().as_raw(),
                gid: rustix::process::getgid().as_raw(),
                switch: false,
            }
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InitConfig {
    /// Host PID of the process that spawned init: init stops if it is gone.
    pub parent_pid: i32,
    /// The run's cgroups, which init joins before unsharing
    /// ([`super::cgroup::join_self`]).
    pub cgroups: Vec<super::cgroup::Join>,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Host directory of the sidecar's sockets, bound read-only at
    /// [`SOCKETS_INSIDE`].
    pub sockets_dir: PathBuf,
    /// Host path of the `airlock` binary, bound read-only at [`EXE_INSIDE`].
    pub exe: PathBuf,
    pub ro_paths: Vec<PathBuf>,
    pub workspace: PathBuf,
    /// The one tmpfs that takes every write of the sandbox (workspace,
    /// `/tmp`, `/dev/shm`).
    pub workspace_size_mb: u64,
    pub ids: HostIds,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "{what} {path:?} must be an absolute, normalised path outside /proc, /dev, /oldroot, /.rw, /.airlock and /run/airlock"
    )]
    BadPath { what: &'static str, path: PathBuf },
    #[error("the command is empty or its program {0:?} is not an absolute path")]
    BadCommand(String),
    #[error("the workspace size must be between 1 and {MAX_WORKSPACE_MB} MiB")]
    BadSize,
    #[error("the run id {0:?} must be 1-64 characters of [A-Za-z0-9_-]")]
    BadRunId(String),
    #[error("environment entry {0:?} is not a valid variable name")]
    BadEnv(String),
    #[error("sandbox config header: length: {0}")]
    HeaderLength(#[source] std::io::Error),
    #[error("sandbox config header: {0} bytes is too long")]
    HeaderTooLong(usize),
    #[error("sandbox config header: body: {0}")]
    HeaderBody(#[source] std::io::Error),
    #[error("sandbox config header: {0}")]
    HeaderJson(#[source] serde_json::Error),
    #[error("sandbox config header: not a run's header")]
    NotARun,
}

/// A path we will create or mount at inside the sandbox: absolute, no `..`,
/// not the root, and not inside the directories init builds itself.
pub fn check_path(what: &'static str, path: &Path) -> Result<(), ConfigError> {
    let bad = || ConfigError::BadPath {
        what,
        path: path.to_path_buf(),
    };
    if !path.is_absolute() || path == Path::new("/") {
        return Err(bad());
    }
    if path
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err(bad());
    }
    if RESERVED.iter().any(|p| path.starts_with(p)) {
        return Err(bad());
    }
    if path.to_str().is_none_or(|s| s.contains('\0')) {
        return Err(bad());
    }
    Ok(())
}

pub fn check_run_id(id: &str) -> Result<(), ConfigError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::BadRunId(id.to_string()))
    }
}

impl InitConfig {
    pub fn from_spec(
        spec: &SandboxSpec,
        exe: &Path,
        parent_pid: i32,
        cgroups: Vec<super::cgroup::Join>,
    ) -> Result<InitConfig, ConfigError> {
        let cfg = InitConfig {
            parent_pid,
            cgroups,
            command: spec.command.clone(),
            env: spec.env.clone(),
            sockets_dir: spec.sockets_dir.clone(),
            exe: exe.to_owned(),
            ro_paths: spec.ro_paths.clone(),
            workspace: spec.workspace.clone(),
            workspace_size_mb: spec.workspace_size_mb,
            ids: HostIds::for_run(&spec.run_id),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checked on both sides: the host before spawning, init before using it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.command.first() {
            Some(p) if p.starts_with('/') && !p.contains('\0') => {}
            other => return Err(ConfigError::BadCommand(other.cloned().unwrap_or_default())),
        }
        if self.command.iter().any(|a| a.contains('\0')) {
            return Err(ConfigError::BadCommand(self.command[0].clone()));
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(ConfigError::BadEnv(k.clone()));
            }
        }
        check_path("sockets_dir", &self.sockets_dir)?;
        if !self.exe.is_absolute() || self.exe.to_str().is_none_or(|s| s.contains('\0')) {
            return Err(ConfigError::BadPath {
                what: "exe",
                path: self.exe.clone(),
            });
        }
        check_path("workspace", &self.workspace)?;
        if self.workspace.starts_with("/tmp") || self.workspace.starts_with("/run") {
            return Err(ConfigError::BadPath {
                what: "workspace",
                path: self.workspace.clone(),
            });
        }
        for p in &self.ro_paths {
            check_path("ro_path", p)?;
        }
        if self.workspace_size_mb == 0 || self.workspace_size_mb > MAX_WORKSPACE_MB {
            return Err(ConfigError::BadSize);
        }
        Ok(())
    }

    /// The run's header ([`Header::Run`]), framed.
    pub fn encode(&self) -> Vec<u8> {
        Header::Run(Box::new(self.clone())).encode()
    }

    /// Reads exactly one header from `r`, which must be the run's (see
    /// [`Header::decode`]).
    pub fn decode(r: impl Read) -> Result<InitConfig, ConfigError> {
        match Header::decode(r)? {
            Header::Run(cfg) => Ok(*cfg),
            Header::Standby { .. } => Err(ConfigError::NotARun),
        }
    }
}

/// What the host writes on init's stdin before the command's bytes: at most
/// one [`Header::Standby`] (to an init started ahead), then the run's.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Header {
    /// Standby cgroups to join while waiting for a run
    /// ([`super::cgroup::RunCgroups::create_standby`]).
    Standby { cgroups: Vec<super::cgroup::Join> },
    /// The run: init joins `cgroups` (empty when its standby ones became
    /// the run's) and goes on.
    Run(Box<InitConfig>),
}

impl Header {
    /// `u32 little-endian length ‖ JSON`.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let mut out = Vec::with_capacity(4 + json.len());
        // A header past 4 GiB is written with a length `decode` refuses.
        let len = u32::try_from(json.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&json);
        out
    }

    /// Reads exactly one header from `r` (which must not buffer beyond it:
    /// the rest of the stream belongs to the command); a run's is validated.
    pub fn decode(mut r: impl Read) -> Result<Header, ConfigError> {
        let mut len = [0u8; 4];
        r.read_exact(&mut len).map_err(ConfigError::HeaderLength)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_HEADER {
            return Err(ConfigError::HeaderTooLong(len));
        }
        let mut buf = vec![0u8; len];
        r.read_exact(&mut buf).map_err(ConfigError::HeaderBody)?;
        let h: Header = serde_json::from_slice(&buf).map_err(ConfigError::HeaderJson)?;
        if let Header::Run(cfg) = &h {
            cfg.validate()?;
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> InitConfig {
        InitConfig {
            parent_pid: 1,
            cgroups: vec![],
            command: vec!["/bin/true".into()],
            env: vec![("A".into(), "b".into())],
            sockets_dir: "/tmp/run/sock".into(),
            exe: "/usr/local/bin/airlock".into(),
            ro_paths: vec!["/opt/agent".into()],
            workspace: "/workspace".into(),
            workspace_size_mb: 8,
            ids: HostIds {
                uid: HOST_ID_BASE + 7,
                gid: HOST_ID_BASE + 7,
                switch: true,
            },
        }
    }

    #[test]
    fn round_trip_leaves_the_rest_of_the_stream() {
        let mut bytes = cfg().encode();
        bytes.extend_from_slice(b"SECRET");
        let mut cur = std::io::Cursor::new(bytes);
        assert_eq!(InitConfig::decode(&mut cur).unwrap(), cfg());
        let mut rest = String::new();
        cur.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "SECRET");
    }

    #[test]
    fn a_standby_header_comes_ahead_of_the_run_and_is_no_run() {
        let standby = Header::Standby {
            cgroups: vec![super::super::cgroup::Join::Thread(
                "/sys/fs/cgroup/memory/airlock/airlock-standby-1-1".into(),
            )],
        };
        let mut bytes = standby.encode();
        bytes.extend(cfg().encode());
        bytes.extend_from_slice(b"SECRET");
        let mut cur = std::io::Cursor::new(bytes);
        assert_eq!(Header::decode(&mut cur).unwrap(), standby);
        assert_eq!(
            Header::decode(&mut cur).unwrap(),
            Header::Run(Box::new(cfg()))
        );
        let mut rest = String::new();
        cur.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "SECRET");
        // Where a run's header must come, a standby one is refused.
        assert!(InitConfig::decode(&standby.encode()[..]).is_err());
        // A run's header is validated whichever way it is read.
        let mut bad = cfg();
        bad.command = vec!["true".into()];
        let framed = Header::Run(Box::new(bad)).encode();
        assert!(Header::decode(&framed[..]).is_err());
    }

    #[test]
    fn refuses_bad_input() {
        for p in [
            "relative",
            "/",
            "/a/../b",
            "/proc/x",
            "/dev",
            "/oldroot/etc",
            "/run/airlock/x",
            "/tmp/ws",
            "/.airlock",
        ] {
            let mut c = cfg();
            c.workspace = p.into();
            assert!(c.validate().is_err(), "{p}");
        }
        let mut c = cfg();
        c.ro_paths = vec!["/.airlock/x".into()];
        assert!(c.validate().is_err(), "nothing over the binary");
        let mut c = cfg();
        c.exe = "airlock".into();
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.command = vec!["true".into()];
        assert!(c.validate().is_err());
        c.command = vec![];
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.env = vec![("A=B".into(), "x".into())];
        assert!(c.validate().is_err());
        assert!(InitConfig::decode(&[0xff, 0xff, 0xff, 0xff][..]).is_err());
        assert!(InitConfig::decode(&[3, 0, 0, 0, b'{', b'}', b'x'][..]).is_err());
        assert!(InitConfig::decode(&[1, 0][..]).is_err());
        for id in ["", "a/b", "..", &"x".repeat(65)] {
            assert!(check_run_id(id).is_err());
        }
        check_run_id("run-123_ab").unwrap();
        let mut c = cfg();
        c.workspace_size_mb = 0;
        assert!(c.validate().is_err());
        c.workspace_size_mb = MAX_WORKSPACE_MB + 1;
        assert!(c.validate().is_err());
    }

    #[test]
    fn a_root_platform_gives_each_run_an_unprivileged_host_id() {
        let a = HostIds::for_run("run_aaaaaaaaaaaa");
        if rustix::process::geteuid().is_root() {
            let b = HostIds::for_run("run_bbbbbbbbbbbb");
            for ids in [a, b] {
                assert!(ids.switch);
                assert!((HOST_ID_BASE..HOST_ID_BASE + HOST_ID_SPAN).contains(&ids.uid));
                assert_eq!(ids.uid, ids.gid);
            }
            assert_ne!(a.uid, b.uid, "two runs, two uids");
            assert_eq!(a, HostIds::for_run("run_aaaaaaaaaaaa"), "stable per run");
        } else {
            assert!(!a.switch);
            assert_eq!(a.uid, rustix::process::getuid().as_raw());
        }
    }
}

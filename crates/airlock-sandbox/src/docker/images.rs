//! The two images of a docker run, and how they are made without a registry.
//!
//! - **sidecar** (`SIDECAR_IMAGE`, also read as `PI_IMAGE`): `FROM scratch`,
//!   the stripped `airlock` binary and the shared libraries it links (from
//!   `ldd`), imported as one layer.
//! - **agent** (`AGENT_IMAGE`): a Debian root filesystem with `python3`
//!   (`AGENT_BASE_IMAGE`, made with `mmdebstrap` and imported when missing)
//!   plus the same binary at `/usr/local/bin/airlock` (it runs `airlock
//!   runtime`).
//!
//! Unset, both default to `airlock-agent:<version>-<build id>` and
//! `airlock-sidecar:<version>-<build id>`: the tag names the binary they
//! hold, so a rebuilt binary gets new images, and boot builds whatever is
//! missing ("kept warm"). The tag contract: the two tags are equal, and
//! when both and the platform version are releases, all three are; a
//! digest-pinned reference (`…@sha256:…`) is exempt.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use bollard::Docker;
use bollard::query_parameters as q;
use futures_util::StreamExt;

use super::ApiError;
use crate::SandboxError;

/// The platform's version (every crate of the workspace has the same).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const DEFAULT_AGENT_REPO: &str = "airlock-agent";
pub const DEFAULT_SIDECAR_REPO: &str = "airlock-sidecar";
pub const DEFAULT_BASE_REPO: &str = "airlock-agent-base";
/// The Debian suite of the default agent base.
pub const BASE_SUITE: &str = "bookworm";
/// What the default agent base holds beyond Debian's essential packages:
/// Python, the CA certificates, and the C++ runtime (Node and other C++
/// programs an agent brings in its directory need it).
pub const BASE_PACKAGES: &str = "python3,ca-certificates,libstdc++6";
/// The default base's tag: the suite, and a revision moved with
/// [`BASE_PACKAGES`] (a base built from another list is another image).
pub const BASE_TAG: &str = "bookworm-2";
/// Labels on the images Airlock builds.
pub const LABEL_IMAGE: &str = "airlock.image";
pub const LABEL_BUILD_ID: &str = "airlock.build-id";

/// `[registry/]name[:tag][@sha256:…]`, checked when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    pub name: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl ImageRef {
    pub fn parse(var: &'static str, s: &str) -> Result<ImageRef, SandboxError> {
        let bad = |why: &str| SandboxError::Config {
            var,
            message: format!("{s:?} is not an image reference ({why})"),
        };
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| bad("digest must be sha256:…"))?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad("the digest is not 64 hex digits"));
                }
                (r, Some(d.to_owned()))
            }
            None => (s, None),
        };
        // A ':' after the last '/' starts the tag (a registry may have a port).
        let slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[slash..].find(':') {
            Some(i) => (&rest[..slash + i], Some(&rest[slash + i + 1..])),
            None => (rest, None),
        };
        let name_ok = !name.is_empty()
            && name.split('/').all(|c| {
                !c.is_empty()
                    && c.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-:".contains(&b)
                    })
            });
        if !name_ok {
            return Err(bad("lowercase [a-z0-9._-] path components"));
        }
        if let Some(t) = tag
            && (t.is_empty()
                || t.len() > 128
                || !t
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
        {
            return Err(bad("a tag is [A-Za-z0-9_.-]{1,128}"));
        }
        Ok(ImageRef {
            name: name.to_owned(),
            tag: tag.map(str::to_owned),
            digest,
        })
    }

    /// The tag (`latest` when none is written).
    pub fn tag(&self) -> &str {
        self.tag.as_deref().unwrap_or("latest")
    }
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// The images of the docker backend.
#[derive(Debug, Clone)]
pub struct ImagesConfig {
    pub agent: ImageRef,
    pub sidecar: ImageRef,
    /// The root filesystem the default agent image is built on.
    pub base: ImageRef,
    /// Whether each is Airlock's own default (then boot builds it when missing).
    pub agent_is_default: bool,
    pub sidecar_is_default: bool,
    /// The binary the images hold.
    pub exe: PathBuf,
}

impl ImagesConfig {
    pub fn from_vars(
        vars: &HashMap<String, String>,
        exe: &Path,
    ) -> Result<ImagesConfig, SandboxError> {
        let get = |k: &str| vars.get(k).map(String::as_str).filter(|v| !v.is_empty());
        let tag = default_tag(exe);
        let sidecar_image = get("SIDECAR_IMAGE");
        let pi_image = get("PI_IMAGE");
        let sidecar_var = match (sidecar_image, pi_image) {
            (Some(a), Some(b)) if a != b => {
                return Err(SandboxError::Config {
                    var: "SIDECAR_IMAGE",
                    message: format!(
                        "{a:?} differs from PI_IMAGE {b:?} (the same image under two names)"
                    ),
                });
            }
            (Some(a), _) => Some(("SIDECAR_IMAGE", a)),
            (None, Some(b)) => Some(("PI_IMAGE", b)),
            (None, None) => None,
        };
        let agent = match get("AGENT_IMAGE") {
            Some(v) => ImageRef::parse("AGENT_IMAGE", v)?,
            None => ImageRef::parse("AGENT_IMAGE", &format!("{DEFAULT_AGENT_REPO}:{tag}"))?,
        };
        let sidecar = match sidecar_var {
            Some((var, v)) => ImageRef::parse(var, v)?,
            None => ImageRef::parse("SIDECAR_IMAGE", &format!("{DEFAULT_SIDECAR_REPO}:{tag}"))?,
        };
        let base = match get("AGENT_BASE_IMAGE") {
            Some(v) => ImageRef::parse("AGENT_BASE_IMAGE", v)?,
            None => ImageRef::parse(
                "AGENT_BASE_IMAGE",
                &format!("{DEFAULT_BASE_REPO}:{BASE_TAG}"),
            )?,
        };
        contract_holds(&agent, &sidecar)?;
        Ok(ImagesConfig {
            agent_is_default: get("AGENT_IMAGE").is_none(),
            sidecar_is_default: sidecar_var.is_none(),
            agent,
            sidecar,
            base,
            exe: exe.to_owned(),
        })
    }
}

/// `X.Y.Z` (a leading `v` allowed), nothing after: a release.
fn is_release(v: &str) -> bool {
    let v = v.strip_prefix('v').unwrap_or(v);
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// How two image references break the version contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagContract {
    #[error(
        "the agent image {agent} and the sidecar image {sidecar} have different tags ({agent_tag} ≠ {sidecar_tag}): build and deploy both at one version"
    )]
    DifferentTags {
        agent: String,
        sidecar: String,
        agent_tag: String,
        sidecar_tag: String,
    },
    #[error(
        "the runtime images are release {images} but the platform is release {platform}: deploy all three at one version"
    )]
    OtherRelease { images: String, platform: String },
}

/// The version contract between the platform and its two runtime images.
pub fn check_tag_contract(
    agent: &ImageRef,
    sidecar: &ImageRef,
    platform: &str,
) -> Result<(), TagContract> {
    if agent.digest.is_some() || sidecar.digest.is_some() {
        return Ok(());
    }
    let (a, s) = (agent.tag(), sidecar.tag());
    if a != s {
        return Err(TagContract::DifferentTags {
            agent: agent.to_string(),
            sidecar: sidecar.to_string(),
            agent_tag: a.to_owned(),
            sidecar_tag: s.to_owned(),
        });
    }
    let norm = |v: &str| v.strip_prefix('v').unwrap_or(v).to_owned();
    if is_release(a) && is_release(platform) && norm(a) != norm(platform) {
        return Err(TagContract::OtherRelease {
            images: a.to_owned(),
            platform: platform.to_owned(),
        });
    }
    Ok(())
}

/// The contract as an operator setting ([`SandboxError::Config`]).
fn contract_holds(agent: &ImageRef, sidecar: &ImageRef) -> Result<(), SandboxError> {
    check_tag_contract(agent, sidecar, VERSION).map_err(|e| SandboxError::Config {
        var: "AGENT_IMAGE",
        message: e.to_string(),
    })
}

/// The GNU build id of an ELF file (`.note.gnu.build-id`), hex.
pub fn build_id(exe: &Path) -> Option<String> {
    use std::io::{Seek, SeekFrom};
    let mut f = std::fs::File::open(exe).ok()?;
    let mut h = [0u8; 64];
    f.read_exact(&mut h).ok()?;
    // ELF64, little endian only (what Airlock builds for).
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |b: &[u8], o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |b: &[u8], o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let phoff = u64_at(&h, 0x20)?;
    let phentsize = u64::from(u16_at(&h, 0x36)?);
    let phnum = u64::from(u16_at(&h, 0x38)?);
    if phnum > 256 || phentsize < 56 {
        return None;
    }
    for i in 0..phnum {
        let mut ph = [0u8; 56];
        f.seek(SeekFrom::Start(phoff + i * phentsize)).ok()?;
        f.read_exact(&mut ph).ok()?;
        if u32_at(&ph, 0)? != 4 {
            continue; // not PT_NOTE
        }
        let (off, size) = (u64_at(&ph, 8)?, u64_at(&ph, 32)?);
        if size > 1 << 16 {
            continue;
        }
        let mut notes = vec![0u8; usize::try_from(size).ok()?];
        f.seek(SeekFrom::Start(off)).ok()?;
        f.read_exact(&mut notes).ok()?;
        let mut at = 0usize;
        while at + 12 <= notes.len() {
            let (nsz, dsz, ty) = (
                u32_at(&notes, at)? as usize,
                u32_at(&notes, at + 4)? as usize,
                u32_at(&notes, at + 8)?,
            );
            let name_at = at + 12;
            let desc_at = name_at + nsz.div_ceil(4) * 4;
            let next = desc_at + dsz.div_ceil(4) * 4;
            if ty == 3 && notes.get(name_at..name_at + nsz) == Some(b"GNU\0") {
                return Some(hex::encode(notes.get(desc_at..desc_at + dsz)?));
            }
            at = next;
        }
    }
    None
}

/// `<version>-<first 12 hex of the binary's build id>` (or of its SHA-256
/// when it has none).
pub fn default_tag(exe: &Path) -> String {
    let id = build_id(exe).or_else(|| {
        use sha2::Digest;
        let mut f = std::fs::File::open(exe).ok()?;
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).ok()?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        Some(hex::encode(h.finalize()))
    });
    match id {
        Some(id) => format!("{VERSION}-{}", &id[..id.len().min(12)]),
        None => VERSION.to_owned(),
    }
}

/// Why an image could not be checked, built or removed: one variant per
/// failing step.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("copying {}: {source}", .path.display())]
    Copy {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("ldd {}: {source} (glibc's ldd is needed to build the sidecar image)", .path.display())]
    NoLdd {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("ldd {}: {stderr}", .path.display())]
    Ldd { path: PathBuf, stderr: String },
    /// The staging directory of a build.
    #[error("{0}")]
    Staging(#[source] std::io::Error),
    /// Writing the build context or the root filesystem's archive.
    #[error("{0}")]
    Archive(#[source] std::io::Error),
    /// Reading the stripped binary.
    #[error("{0}")]
    Binary(#[source] std::io::Error),
    #[error("{}: {source}", .path.display())]
    Library {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot run mmdebstrap ({0}): install it (apt-get install mmdebstrap), or set AGENT_BASE_IMAGE to a local image that has /usr/bin/python3"
    )]
    NoMmdebstrap(#[source] std::io::Error),
    #[error("mmdebstrap: no {0}")]
    MmdebstrapStream(&'static str),
    #[error("{0}")]
    MmdebstrapWait(#[source] std::io::Error),
    #[error("mmdebstrap failed ({status}): {stderr}")]
    Mmdebstrap {
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("building {tag}: {message}")]
    Build { tag: String, message: String },
}

/// Whether `image` is present on the daemon.
pub async fn present(d: &Docker, image: &ImageRef) -> Result<bool, SandboxError> {
    match d.inspect_image(&image.to_string()).await {
        Ok(_) => Ok(true),
        Err(e) if super::not_found(&e) => Ok(false),
        Err(e) => Err(ImageError::from(ApiError::new(format!("inspecting {image}"), e)).into()),
    }
}

/// Boot: the tag contract holds and both images are present; Airlock's own
/// default images are built when missing. Returns what was built.
pub async fn ensure(
    d: &Docker,
    cfg: &ImagesConfig,
    say: &(dyn Fn(&str) + Sync),
) -> Result<Vec<String>, SandboxError> {
    contract_holds(&cfg.agent, &cfg.sidecar)?;
    let mut built = vec![];
    for (image, default, var) in [
        (&cfg.sidecar, cfg.sidecar_is_default, "SIDECAR_IMAGE"),
        (&cfg.agent, cfg.agent_is_default, "AGENT_IMAGE"),
    ] {
        if present(d, image).await? {
            continue;
        }
        if !default {
            return Err(SandboxError::Config {
                var,
                message: format!(
                    "the image {image} is not on the docker daemon: load or pull it there (this platform pulls nothing), or unset {var} to use the images `airlock images build` makes"
                ),
            });
        }
        say(&format!("building {image} (missing)"));
        if var == "SIDECAR_IMAGE" {
            build_sidecar(d, cfg, say).await?;
        } else {
            build_agent(d, cfg, say).await?;
        }
        built.push(image.to_string());
    }
    Ok(built)
}

/// What [`prune`] did.
#[derive(Debug, Default)]
pub struct Pruned {
    /// Tags removed (with their images, once no tag is left).
    pub removed: Vec<String>,
    /// Tags kept because a container (running or not) still uses them.
    pub in_use: Vec<String>,
}

/// `airlock images prune`: every agent and sidecar image Airlock built
/// (its `airlock.image` label) under a tag other than this platform's two is
/// removed, unless a container still uses it (the daemon refuses that, and it
/// is kept). Each build of Airlock tags its images with its own build id, so
/// without this every upgrade leaves two images behind. The agent's base
/// root filesystem is kept (the next build starts from it); images Airlock
/// did not build are never touched.
pub async fn prune(d: &Docker, cfg: &ImagesConfig) -> Result<Pruned, SandboxError> {
    let filters = HashMap::from([("label", vec![LABEL_IMAGE])]);
    let list = d
        .list_images(Some(
            q::ListImagesOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(|e| ImageError::from(ApiError::new("listing images", e)))?;
    // An image a container uses keeps every tag (untagging it would leave
    // the container's image nameless).
    let used: std::collections::HashSet<String> = d
        .list_containers(Some(
            q::ListContainersOptionsBuilder::default().all(true).build(),
        ))
        .await
        .map_err(|e| ImageError::from(ApiError::new("listing containers", e)))?
        .into_iter()
        .filter_map(|c| c.image_id)
        .collect();
    let keep = [cfg.agent.to_string(), cfg.sidecar.to_string()];
    let mut out = Pruned::default();
    for image in list {
        let kind = image.labels.get(LABEL_IMAGE).map(String::as_str);
        if !matches!(kind, Some("agent" | "sidecar")) {
            continue;
        }
        let in_use = used.contains(&image.id);
        for tag in image.repo_tags {
            if keep.contains(&tag) || tag == "<none>:<none>" {
                continue;
            }
            if in_use {
                out.in_use.push(tag);
                continue;
            }
            match d
                .remove_image(&tag, None::<q::RemoveImageOptions>, None)
                .await
            {
                Ok(_) => out.removed.push(tag),
                Err(e) if super::not_found(&e) => {}
                Err(e) if super::conflict(&e) => out.in_use.push(tag),
                Err(e) => {
                    return Err(
                        ImageError::from(ApiError::new(format!("removing {tag}"), e)).into(),
                    );
                }
            }
        }
    }
    Ok(out)
}

/// `airlock images build`: both images (and the agent's base, if missing).
pub async fn build_all(
    d: &Docker,
    cfg: &ImagesConfig,
    say: &(dyn Fn(&str) + Sync),
) -> Result<(), SandboxError> {
    contract_holds(&cfg.agent, &cfg.sidecar)?;
    build_sidecar(d, cfg, say).await?;
    build_agent(d, cfg, say).await
}

/// A copy of the binary with its symbols stripped (`strip`, when installed).
fn stripped_binary(exe: &Path, dir: &Path) -> Result<PathBuf, ImageError> {
    let out = dir.join("airlock");
    std::fs::copy(exe, &out).map_err(|source| ImageError::Copy {
        path: exe.to_owned(),
        source,
    })?;
    match std::process::Command::new("strip")
        .arg("--strip-all")
        .arg(&out)
        .status()
    {
        Ok(s) if s.success() => {}
        _ => tracing::warn!(
            "`strip` is not installed or failed: the images hold the unstripped binary"
        ),
    }
    Ok(out)
}

/// The shared libraries `exe` loads (and its ELF interpreter), as `ldd` lists them.
fn linked_libraries(exe: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let out = std::process::Command::new("ldd")
        .arg(exe)
        .output()
        .map_err(|source| ImageError::NoLdd {
            path: exe.to_owned(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        return Ok(vec![]);
    }
    if !out.status.success() {
        return Err(ImageError::Ldd {
            path: exe.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let mut libs = vec![];
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, rhs)) => rhs.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

struct Staging(PathBuf);

impl Staging {
    fn new() -> Result<Staging, ImageError> {
        let dir = std::env::temp_dir().join(format!(
            "airlock-images-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir).map_err(ImageError::Staging)?;
        Ok(Staging(dir))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tar_file(
    b: &mut tar::Builder<Vec<u8>>,
    at: &str,
    data: &[u8],
    mode: u32,
) -> Result<(), ImageError> {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, at, data).map_err(ImageError::Archive)
}

fn tar_dir(b: &mut tar::Builder<Vec<u8>>, at: &str, mode: u32) -> Result<(), ImageError> {
    let mut h = tar::Header::new_gnu();
    h.set_size(0);
    h.set_mode(mode);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Directory);
    b.append_data(&mut h, at, std::io::empty())
        .map_err(ImageError::Archive)
}

fn labels_changes(kind: &str, exe: &Path) -> Vec<String> {
    let mut v = vec![
        format!("LABEL {LABEL_IMAGE}={kind}"),
        format!("LABEL airlock.version={VERSION}"),
    ];
    if let Some(id) = build_id(exe) {
        v.push(format!("LABEL {LABEL_BUILD_ID}={id}"));
    }
    v
}

async fn import(
    d: &Docker,
    image: &ImageRef,
    changes: Vec<String>,
    body: impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static,
) -> Result<(), ImageError> {
    let opts = q::CreateImageOptions {
        from_src: Some("-".into()),
        repo: Some(image.name.clone()),
        tag: Some(image.tag().to_owned()),
        changes,
        ..Default::default()
    };
    let mut s = d.create_image(Some(opts), Some(bollard::body_try_stream(body)), None);
    while let Some(r) = s.next().await {
        r.map_err(|e| ApiError::new(format!("importing {image}"), e))?;
    }
    Ok(())
}

/// The sidecar image: scratch + the stripped binary + its libraries.
pub async fn build_sidecar(
    d: &Docker,
    cfg: &ImagesConfig,
    say: &(dyn Fn(&str) + Sync),
) -> Result<(), SandboxError> {
    let t0 = std::time::Instant::now();
    let stage = Staging::new()?;
    let bin = stripped_binary(&cfg.exe, &stage.0)?;
    let mut b = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    for dir in [
        "usr",
        "usr/local",
        "usr/local/bin",
        "etc",
        "tmp",
        "run",
        "run/airlock",
    ] {
        dirs.insert(dir.to_owned());
        tar_dir(&mut b, dir, if dir == "tmp" { 0o1777 } else { 0o755 })?;
    }
    tar_file(
        &mut b,
        "usr/local/bin/airlock",
        &std::fs::read(&bin).map_err(ImageError::Binary)?,
        0o755,
    )?;
    for lib in linked_libraries(&cfg.exe)? {
        let data = std::fs::read(&lib).map_err(|source| ImageError::Library {
            path: lib.clone(),
            source,
        })?;
        let at = lib.to_string_lossy().trim_start_matches('/').to_owned();
        let mut parent = String::new();
        for c in Path::new(&at)
            .parent()
            .into_iter()
            .flat_map(|p| p.components())
        {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(&c.as_os_str().to_string_lossy());
            if dirs.insert(parent.clone()) {
                tar_dir(&mut b, &parent, 0o755)?;
            }
        }
        tar_file(&mut b, &at, &data, 0o755)?;
    }
    tar_file(
        &mut b,
        "etc/passwd",
        b"root:x:0:0::/:/nonexistent\nnobody:x:65534:65534::/:/nonexistent\n",
        0o644,
    )?;
    tar_file(&mut b, "etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644)?;
    tar_file(&mut b, "etc/nsswitch.conf", b"hosts: files dns\n", 0o644)?;
    let tar = b.into_inner().map_err(ImageError::Archive)?;
    let mut changes = labels_changes("sidecar", &cfg.exe);
    changes.push(format!(
        "CMD [\"{}\", \"sidecar\"]",
        super::AIRLOCK_IN_IMAGE
    ));
    changes.push("USER 65534:65534".into());
    let one = futures_util::stream::once(async move { Ok(bytes::Bytes::from(tar)) });
    import(d, &cfg.sidecar, changes, one).await?;
    say(&format!(
        "built {} ({:.1} s)",
        cfg.sidecar,
        t0.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// The agent's base: a Debian root filesystem with [`BASE_PACKAGES`], made
/// by `mmdebstrap` from Debian's package archive, imported.
pub async fn build_base(
    d: &Docker,
    cfg: &ImagesConfig,
    say: &(dyn Fn(&str) + Sync),
) -> Result<(), SandboxError> {
    let t0 = std::time::Instant::now();
    say(&format!(
        "making {} with mmdebstrap ({BASE_SUITE}, {BASE_PACKAGES}; a minute or two)",
        cfg.base
    ));
    let mut child = tokio::process::Command::new("mmdebstrap")
        .args([
            "--quiet",
            "--variant=essential",
            &format!("--include={BASE_PACKAGES}"),
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            BASE_SUITE,
            "-",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(ImageError::NoMmdebstrap)?;
    let stdout = child
        .stdout
        .take()
        .ok_or(ImageError::MmdebstrapStream("stdout"))?;
    let mut stderr = child
        .stderr
        .take()
        .ok_or(ImageError::MmdebstrapStream("stderr"))?;
    let errs = tokio::spawn(async move {
        let mut s = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut s).await;
        s
    });
    let chunks = futures_util::stream::unfold(stdout, |mut r| async move {
        let mut buf = vec![0u8; 1 << 20];
        match tokio::io::AsyncReadExt::read(&mut r, &mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(bytes::Bytes::from(buf)), r))
            }
            Err(e) => Some((Err(e), r)),
        }
    });
    let mut changes = labels_changes("agent-base", &cfg.exe);
    changes.retain(|c| !c.contains(LABEL_BUILD_ID));
    let imported = import(d, &cfg.base, changes, chunks).await;
    let status = child.wait().await.map_err(ImageError::MmdebstrapWait)?;
    let errs = errs.await.unwrap_or_default();
    if !status.success() {
        return Err(ImageError::Mmdebstrap {
            status,
            stderr: errs.trim().to_owned(),
        }
        .into());
    }
    imported?;
    say(&format!(
        "built {} ({:.1} s)",
        cfg.base,
        t0.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// The agent image: the base plus the binary.
pub async fn build_agent(
    d: &Docker,
    cfg: &ImagesConfig,
    say: &(dyn Fn(&str) + Sync),
) -> Result<(), SandboxError> {
    if !present(d, &cfg.base).await? {
        build_base(d, cfg, say).await?;
    }
    let t0 = std::time::Instant::now();
    let stage = Staging::new()?;
    let bin = stripped_binary(&cfg.exe, &stage.0)?;
    let mut dockerfile = format!(
        "FROM {}\nCOPY airlock {}\n",
        cfg.base,
        super::AIRLOCK_IN_IMAGE
    );
    for c in labels_changes("agent", &cfg.exe) {
        dockerfile.push_str(&c);
        dockerfile.push('\n');
    }
    let mut b = tar::Builder::new(Vec::new());
    tar_file(&mut b, "Dockerfile", dockerfile.as_bytes(), 0o644)?;
    tar_file(
        &mut b,
        "airlock",
        &std::fs::read(&bin).map_err(ImageError::Binary)?,
        0o755,
    )?;
    let tar = b.into_inner().map_err(ImageError::Archive)?;
    let tag = cfg.agent.to_string();
    let opts = q::BuildImageOptionsBuilder::default()
        .dockerfile("Dockerfile")
        .t(&tag)
        .rm(true)
        .forcerm(true)
        .build();
    let mut s = d.build_image(opts, None, Some(bollard::body_full(tar.into())));
    while let Some(r) = s.next().await {
        let info = r.map_err(|e| ImageError::from(ApiError::new(format!("building {tag}"), e)))?;
        if let Some(message) = info.error_detail.and_then(|e| e.message) {
            return Err(ImageError::Build { tag, message }.into());
        }
    }
    say(&format!(
        "built {tag} ({:.1} s)",
        t0.elapsed().as_secs_f64()
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> ImageRef {
        ImageRef::parse("AGENT_IMAGE", s).unwrap()
    }

    #[test]
    fn references_parse_and_bad_ones_are_refused() {
        assert_eq!(r("airlock-agent:0.1.0").tag(), "0.1.0");
        assert_eq!(r("registry.local:5000/team/agent").tag(), "latest");
        assert_eq!(
            r("registry.local:5000/team/agent:v2").name,
            "registry.local:5000/team/agent"
        );
        let pinned = r(&format!("agent@sha256:{}", "a".repeat(64)));
        assert!(pinned.digest.is_some());
        for bad in [
            "",
            "Agent:1",
            "agent:",
            "agent:a b",
            "agent@sha256:12",
            "a//b",
        ] {
            assert!(ImageRef::parse("AGENT_IMAGE", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_tag_contract() {
        assert!(check_tag_contract(&r("a:1.2.3"), &r("s:1.2.3"), "1.2.3").is_ok());
        assert!(check_tag_contract(&r("a:1.2.3"), &r("s:1.2.4"), "1.2.3").is_err());
        assert!(
            check_tag_contract(&r("a:1.2.4"), &r("s:1.2.4"), "1.2.3").is_err(),
            "three releases that disagree"
        );
        assert!(check_tag_contract(&r("a:v1.2.3"), &r("s:v1.2.3"), "1.2.3").is_ok());
        assert!(
            check_tag_contract(&r("a:dev"), &r("s:dev"), "1.2.3").is_ok(),
            "not releases"
        );
        assert!(check_tag_contract(&r("a:0.1.0-abc"), &r("s:0.1.0-abc"), "0.1.0").is_ok());
        let pinned = r(&format!("a:9.9.9@sha256:{}", "b".repeat(64)));
        assert!(
            check_tag_contract(&pinned, &r("s:1.0.0"), "1.0.0").is_ok(),
            "digest-pinned is exempt"
        );
        assert!(check_tag_contract(&r("a"), &r("s:latest"), "1.0.0").is_ok());
    }

    #[test]
    fn settings_are_checked_before_anything_starts() {
        let exe = std::env::current_exe().unwrap();
        let vars = |p: &[(&str, &str)]| {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>()
        };
        let d = ImagesConfig::from_vars(&vars(&[]), &exe).unwrap();
        assert!(d.agent_is_default && d.sidecar_is_default);
        assert_eq!(d.agent.tag(), d.sidecar.tag());
        assert!(d.agent.tag().starts_with(VERSION));
        let e = ImagesConfig::from_vars(
            &vars(&[
                ("AGENT_IMAGE", "x/agent:1"),
                ("SIDECAR_IMAGE", "x/sidecar:2"),
            ]),
            &exe,
        )
        .unwrap_err();
        assert!(e.to_string().contains("different tags"), "{e}");
        let e = ImagesConfig::from_vars(
            &vars(&[("SIDECAR_IMAGE", "x/s:1"), ("PI_IMAGE", "x/p:1")]),
            &exe,
        )
        .unwrap_err();
        assert!(e.to_string().contains("PI_IMAGE"), "{e}");
        let p = ImagesConfig::from_vars(
            &vars(&[("AGENT_IMAGE", "x/agent:7"), ("PI_IMAGE", "x/pi:7")]),
            &exe,
        )
        .unwrap();
        assert_eq!(p.sidecar.to_string(), "x/pi:7");
        assert!(!p.sidecar_is_default);
        assert!(ImagesConfig::from_vars(&vars(&[("AGENT_IMAGE", "Bad Image")]), &exe).is_err());
    }

    #[test]
    fn the_build_id_of_this_test_binary() {
        let exe = std::env::current_exe().unwrap();
        // Debian's linker adds one; where it does not, the tag falls back to the digest.
        let tag = default_tag(&exe);
        assert!(tag.len() == VERSION.len() + 13, "{tag}");
        assert_eq!(build_id(Path::new("/proc/self/status")), None);
    }
}

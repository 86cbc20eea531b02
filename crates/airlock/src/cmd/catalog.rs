//! `airlock catalog keygen|sign|verify`: the signing tool of the live model
//! catalog (docs/model-catalog.md). The key files are shared with
//! `airlock bundle` (docs/signing.md).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use airlock_platform::catalog::{Catalog, MAX_CATALOG_BYTES};
use airlock_platform::signing::{Purpose, SecretKey, Signature, TrustRoot};
use anyhow::{Context as _, Result, bail};
use clap::Subcommand;

use super::connections::report;

#[derive(Subcommand, Debug)]
pub enum CatalogCommand {
    /// Write a new Ed25519 signing key to FILE (mode 0600) and its public
    /// key to FILE.pub; print the public key.
    Keygen {
        /// The secret key file to create (never overwritten).
        file: PathBuf,
    },
    /// Check CATALOG (strict schema) and write its detached signature to CATALOG.sig.
    Sign {
        /// The secret key file (from `keygen`).
        #[arg(long)]
        key: PathBuf,
        /// The catalog file.
        catalog: PathBuf,
    },
    /// Verify CATALOG against CATALOG.sig as the platform does, and check its schema.
    Verify {
        /// The trusted public keys: a public key file, or a JSON list of them
        /// (the value of MODEL_CATALOG_TRUST_ROOT).
        #[arg(long)]
        trust: PathBuf,
        /// The catalog file.
        catalog: PathBuf,
    },
}

pub fn run(cmd: CatalogCommand) -> ExitCode {
    super::connections::init_logging();
    report(match cmd {
        CatalogCommand::Keygen { file } => keygen(&file),
        CatalogCommand::Sign { key, catalog } => sign(&key, &catalog),
        CatalogCommand::Verify { trust, catalog } => verify(&trust, &catalog),
    })
}

/// `FILE` with `ext` appended (`c.json` → `c.json.sig`).
pub(crate) fn beside(file: &Path, ext: &str) -> PathBuf {
    let mut s = file.as_os_str().to_owned();
    s.push(ext);
    PathBuf::from(s)
}

/// Creates `file` (never overwriting one) with `mode` and `text`.
fn create(file: &Path, mode: u32, text: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(file)
        .with_context(|| format!("creating {}", file.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.write_all(b"\n"))
        .with_context(|| format!("writing {}", file.display()))
}

/// `airlock catalog keygen` and `airlock bundle keygen`.
pub(crate) fn keygen(file: &Path) -> Result<()> {
    let key = SecretKey::generate()?;
    let public = beside(file, ".pub");
    create(file, 0o600, &key.to_file())?;
    create(&public, 0o644, &key.public().to_file())?;
    super::out::outln!("{}", key.public().to_file());
    eprintln!(
        "secret key: {} (keep it private); public key: {}",
        file.display(),
        public.display()
    );
    Ok(())
}

/// Reads a file of at most `max` bytes.
pub(crate) fn read_capped(file: &Path, max: usize) -> Result<Vec<u8>> {
    let len = std::fs::metadata(file)
        .with_context(|| format!("reading {}", file.display()))?
        .len();
    if len > max as u64 {
        bail!("{} is {len} bytes, above the cap of {max}", file.display());
    }
    std::fs::read(file).with_context(|| format!("reading {}", file.display()))
}

pub(crate) fn read_key(file: &Path) -> Result<SecretKey> {
    let text = read_capped(file, 64 << 10)?;
    SecretKey::from_file(&String::from_utf8_lossy(&text))
        .with_context(|| format!("{} is not an airlock secret key file", file.display()))
}

pub(crate) fn read_trust(file: &Path) -> Result<TrustRoot> {
    let text = read_capped(file, 1 << 20)?;
    TrustRoot::parse(&String::from_utf8_lossy(&text))
        .with_context(|| format!("{}: not a trust list", file.display()))
}

fn sign(key: &Path, catalog: &Path) -> Result<()> {
    let key = read_key(key)?;
    let body = read_capped(catalog, MAX_CATALOG_BYTES)?;
    let c = Catalog::parse(&body).with_context(|| format!("{}", catalog.display()))?;
    let sig = beside(catalog, ".sig");
    std::fs::write(
        &sig,
        format!("{}\n", key.sign(Purpose::Catalog, &body).to_file()),
    )
    .with_context(|| format!("writing {}", sig.display()))?;
    super::out::outln!(
        "signed {} (serial {}, {} models) with key {}: {}",
        catalog.display(),
        c.serial,
        c.models.len(),
        key.public().id(),
        sig.display()
    );
    Ok(())
}

fn verify(trust: &Path, catalog: &Path) -> Result<()> {
    let trust = read_trust(trust)?;
    let body = read_capped(catalog, MAX_CATALOG_BYTES)?;
    let sig_file = beside(catalog, ".sig");
    let sig = Signature::from_file(&read_capped(&sig_file, MAX_CATALOG_BYTES)?)
        .with_context(|| format!("{}", sig_file.display()))?;
    let by = trust
        .verify(Purpose::Catalog, &body, &sig)
        .with_context(|| format!("{}", catalog.display()))?;
    let c = Catalog::parse(&body).with_context(|| format!("{}", catalog.display()))?;
    super::out::outln!(
        "{}: signature by {by} verifies; serial {}, {} models",
        catalog.display(),
        c.serial,
        c.models.len()
    );
    Ok(())
}

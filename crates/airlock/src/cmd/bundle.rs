//! `airlock bundle pack|sign|verify|keygen|endorse`: an agent's directory
//! as a signed bundle (docs/bundles.md), verified by the platform before a
//! run starts under `AFPS_SIGNATURE_POLICY`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use airlock_platform::bundle::{BundleManifest, MANIFEST_FILE, MAX_MANIFEST_BYTES, SIGNATURE_FILE};
use airlock_platform::signing::{Endorsement, PublicKey, Purpose, TrustRoot};
use anyhow::{Context as _, Result, anyhow};
use clap::Subcommand;

use super::catalog::{keygen, read_capped, read_key, read_trust};
use super::connections::report;

#[derive(Subcommand, Debug)]
pub enum BundleCommand {
    /// Write DIR/airlock-bundle.json: every file of DIR with its SHA-256 and size, sorted.
    Pack {
        /// The agent's directory.
        dir: PathBuf,
    },
    /// Sign DIR's bundle manifest (DIR/airlock-bundle.json) into DIR/airlock-bundle.sig.
    Sign {
        /// The secret key file (from `airlock bundle keygen`).
        #[arg(long)]
        key: PathBuf,
        /// Endorsements from a trusted key down to this key (from
        /// `airlock bundle endorse`), in order; repeatable.
        #[arg(long)]
        chain: Vec<PathBuf>,
        /// The agent's directory.
        dir: PathBuf,
    },
    /// Verify DIR as the platform does under AFPS_SIGNATURE_POLICY=required.
    Verify {
        /// The trusted public keys: a public key file or a JSON list of them
        /// (the value of AFPS_TRUST_ROOT).
        #[arg(long)]
        trust: PathBuf,
        /// The agent's directory.
        dir: PathBuf,
    },
    /// Write a new Ed25519 signing key to FILE (mode 0600) and FILE.pub.
    Keygen {
        /// The secret key file to create (never overwritten).
        file: PathBuf,
    },
    /// Print KEY's endorsement of the public key SUBJECT (a link of a key chain).
    Endorse {
        /// The endorsing secret key file.
        #[arg(long)]
        key: PathBuf,
        /// The endorsed public key file.
        subject: PathBuf,
    },
}

pub fn run(cmd: BundleCommand) -> ExitCode {
    super::connections::init_logging();
    report(match cmd {
        BundleCommand::Pack { dir } => pack(&dir),
        BundleCommand::Sign { key, chain, dir } => sign(&key, &chain, &dir),
        BundleCommand::Verify { trust, dir } => verify(&trust, &dir),
        BundleCommand::Keygen { file } => keygen(&file),
        BundleCommand::Endorse { key, subject } => endorse(&key, &subject),
    })
}

fn pack(dir: &Path) -> Result<()> {
    let m = BundleManifest::of_dir(dir)
        .map_err(|e| anyhow!("{} ({}): {e}", dir.display(), e.code()))?;
    let file = dir.join(MANIFEST_FILE);
    std::fs::write(&file, m.to_file()).with_context(|| format!("writing {}", file.display()))?;
    let bytes: u64 = m.files.iter().map(|f| f.size).sum();
    super::out::outln!(
        "packed {} files ({bytes} bytes) into {}",
        m.files.len(),
        file.display()
    );
    Ok(())
}

fn sign(key: &Path, chain: &[PathBuf], dir: &Path) -> Result<()> {
    let key = read_key(key)?;
    let file = dir.join(MANIFEST_FILE);
    let manifest = read_capped(&file, MAX_MANIFEST_BYTES)?;
    let parsed = BundleManifest::parse(&manifest)
        .map_err(|e| anyhow!("{} ({}): {e}", file.display(), e.code()))?;
    // What is signed must be what is there: a stale manifest is not signed.
    parsed.check_dir(dir).map_err(|e| {
        anyhow!(
            "{} ({}): {e}; run `airlock bundle pack` again",
            dir.display(),
            e.code()
        )
    })?;
    let mut sig = key.sign(Purpose::Bundle, &manifest);
    for link in chain {
        let text = read_capped(link, 64 << 10)?;
        let e: Endorsement = serde_json::from_slice(&text)
            .with_context(|| format!("{}: not an endorsement", link.display()))?;
        sig.chain.push(e);
    }
    let out = dir.join(SIGNATURE_FILE);
    std::fs::write(&out, format!("{}\n", sig.to_file()))
        .with_context(|| format!("writing {}", out.display()))?;
    super::out::outln!(
        "signed {} ({} files) with key {}: {}",
        file.display(),
        parsed.files.len(),
        key.public().id(),
        out.display()
    );
    Ok(())
}

fn verify(trust: &Path, dir: &Path) -> Result<()> {
    let trust: TrustRoot = read_trust(trust)?;
    match airlock_platform::bundle::verify(dir, &trust) {
        Ok(Some(by)) => {
            super::out::outln!("{}: signed by {by}; every file matches", dir.display());
            Ok(())
        }
        Ok(None) => Err(anyhow!(
            "{} (unsigned_required): no {MANIFEST_FILE} and {SIGNATURE_FILE}",
            dir.display()
        )),
        Err(e) => Err(anyhow!("{} ({}): {e}", dir.display(), e.code())),
    }
}

fn endorse(key: &Path, subject: &Path) -> Result<()> {
    let key = read_key(key)?;
    let text = read_capped(subject, 64 << 10)?;
    let subject: PublicKey = read_public(&text)
        .with_context(|| format!("{}: not a public key file", subject.display()))?;
    let e = key.endorse(&subject);
    super::out::outln!("{}", serde_json::to_string_pretty(&e)?);
    Ok(())
}

/// One public key file.
fn read_public(text: &[u8]) -> Result<PublicKey> {
    let trust = TrustRoot::parse(&String::from_utf8_lossy(text))?;
    trust
        .into_keys()
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no key"))
}

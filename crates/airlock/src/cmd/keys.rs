//! `airlock keys generate|reencrypt`: connection-encryption key management,
//! and identity signing keys (`generate --identity`).

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Instant;

use airlock_store::Store;
use airlock_vault::{ExposeSecret as _, Keyring, generate_key};
use anyhow::{Context as _, Result};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::connections::{init_logging, report, runtime};

#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Print a new random AES-256 key (base64) for CONNECTION_ENCRYPTION_KEY.
    Generate {
        /// Print a new P-256 key (base64 PKCS#8) for IDENTITY_SIGNING_KEYS instead.
        #[arg(long)]
        identity: bool,
    },
    /// Rewrite every stored envelope under the active key (CONNECTION_ENCRYPTION_KEY_ID).
    /// Old keys must be in CONNECTION_ENCRYPTION_KEYS. Each batch is one transaction;
    /// interrupted, it resumes where it stopped when run again.
    Reencrypt {
        /// Envelopes per transaction.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        batch: u64,
    },
}

pub fn run(cmd: KeysCommand) -> ExitCode {
    init_logging();
    match cmd {
        KeysCommand::Generate { identity: false } => report(generate()),
        KeysCommand::Generate { identity: true } => report(generate_identity()),
        KeysCommand::Reencrypt { batch } => {
            let batch = usize::try_from(batch).unwrap_or(1000);
            report(runtime().and_then(|rt| rt.block_on(reencrypt(batch))))
        }
    }
}

fn generate() -> Result<()> {
    let key = generate_key()?;
    super::out::outln!("{}", key.expose_secret());
    if std::io::stdout().is_terminal() {
        eprintln!(
            "set it as CONNECTION_ENCRYPTION_KEY with a new CONNECTION_ENCRYPTION_KEY_ID; move the \
             old key into CONNECTION_ENCRYPTION_KEYS, then run `airlock keys reencrypt`"
        );
    }
    Ok(())
}

fn generate_identity() -> Result<()> {
    let key = airlock_vault::generate_identity_key()?;
    super::out::outln!("{}", key.as_str());
    if std::io::stdout().is_terminal() {
        eprintln!(
            "put it first in IDENTITY_SIGNING_KEYS (comma-separated); keep the old key after it \
             until the tokens it signed have expired (IDENTITY_TOKEN_SECONDS)"
        );
    }
    Ok(())
}

async fn reencrypt(batch: usize) -> Result<()> {
    let ring = Keyring::from_env().context("connection encryption keyring")?;
    let store = Store::open_default().await?;
    let active = ring.active_kid().to_owned();
    let todo = store.count_envelopes_not_under(&active).await?;
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(Some(todo), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "re-encrypting {bar:40} {pos}/{len} envelopes ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = Instant::now();
    let mut done: u64 = 0;
    // Walk the names once with a cursor; then one more pass from the start picks up anything
    // written under an old key meanwhile. A fresh run starts from the start: nothing is lost.
    let mut cursor = String::new();
    let mut passes = 0;
    let result = loop {
        match store.reencrypt_batch_after(&ring, batch, &cursor).await {
            Ok(o) if o.scanned == 0 => {
                passes += 1;
                if passes >= 2 || cursor.is_empty() {
                    break Ok(());
                }
                cursor.clear();
            }
            Ok(o) => {
                done += o.rewritten as u64;
                bar.inc(o.rewritten as u64);
                tracing::debug!(rewritten = o.rewritten, total = done, "batch committed");
                cursor = o.last;
            }
            Err(e) => break Err(e),
        }
    };
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    if let Err(e) = result {
        store.close().await;
        return Err(anyhow::Error::new(e).context(format!(
            "re-encryption stopped after {done} envelopes (committed batches are kept; fix the \
             cause and run it again to resume)"
        )));
    }
    let counts = store.envelope_counts_by_kid().await?;
    store.close().await;
    let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
    super::out::outln!(
        "re-encrypted {done} envelopes under key {active} in {secs:.2}s ({rate:.0}/s)"
    );
    super::out::outln!("envelopes per key id:");
    if counts.is_empty() {
        super::out::outln!("  (none)");
    }
    for (kid, n) in counts {
        super::out::outln!("  {kid}: {n}");
    }
    Ok(())
}

//! The platform's side of a run's egress journal (the sidecar's side and the
//! format: `airlock_sidecar::journal`): the file is created per run in the
//! run's own directory, and read into the store at the run's end and at the
//! boot reclaim of a crashed run.
//!
//! The journal is the platform's own file (its run directory is 0700 and not
//! in the sandbox's view), yet it is read the way every file a run could
//! have touched is: without following symlinks, within a bound. Each line is
//! one egress record; a torn last line (a write cut by a kill or a full
//! disk) is skipped, and so is any other line that does not parse. The
//! records go in with the same upsert by `(run_id, seq)` as the events the
//! sidecar sent: a record already stored is left as it is unless the
//! journal completes it, and a repeated start never undoes a completion.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use airlock_platform_api::wire::EgressOutcome;
use airlock_platform_api::wire::{EGRESS_JOURNAL_FILE, EGRESS_JOURNAL_MAX_BYTES, EgressRecord};
use airlock_store::Store;

#[derive(Debug, thiserror::Error)]
pub enum JournalIngestError {
    #[error("egress journal: {0}")]
    Read(#[from] airlock_sandbox::untrusted::UntrustedFileError),
    #[error("egress journal of {run_id}: {source}")]
    Store {
        run_id: String,
        source: airlock_store::StoreError,
    },
}

/// The journal's path in a run directory.
pub fn path_in(run_dir: &Path) -> PathBuf {
    run_dir.join(EGRESS_JOURNAL_FILE)
}

/// Creates the (empty) journal of a run in its directory, mode 0600.
pub fn create(run_dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = path_in(run_dir);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&path)?;
    Ok(path)
}

/// What a journal held.
#[derive(Debug, Default, PartialEq)]
pub struct Parsed {
    /// One record per `seq` (its last completion, else its start), in the
    /// order they were first seen; records without a `seq` as they came.
    pub records: Vec<EgressRecord>,
    /// Lines that did not parse (a torn last line among them).
    pub skipped: usize,
}

/// Parses a journal's bytes.
pub fn parse(bytes: &[u8]) -> Parsed {
    let mut out = Parsed::default();
    let mut by_seq: HashMap<u64, usize> = HashMap::new();
    for line in bytes.split(|b| *b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let Ok(rec) = serde_json::from_slice::<EgressRecord>(line) else {
            out.skipped += 1;
            continue;
        };
        match rec.seq.and_then(|s| by_seq.get(&s).copied()) {
            Some(i) => {
                if rec.outcome != Some(EgressOutcome::Incomplete) {
                    out.records[i] = rec;
                }
            }
            None => {
                if let Some(s) = rec.seq {
                    by_seq.insert(s, out.records.len());
                }
                out.records.push(rec);
            }
        }
    }
    out
}

/// Reads the journal at `path` (if there is one) into `run_id`'s egress log;
/// returns how many records it held. A missing journal is none.
pub async fn ingest(store: &Store, run_id: &str, path: &Path) -> Result<usize, JournalIngestError> {
    let bytes = match airlock_sandbox::untrusted::read_file(path, EGRESS_JOURNAL_MAX_BYTES) {
        Ok(b) => b,
        Err(airlock_sandbox::untrusted::UntrustedFileError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(0);
        }
        Err(e) => return Err(e.into()),
    };
    let parsed = parse(&bytes);
    if parsed.skipped > 0 {
        tracing::warn!(
            run_id,
            skipped = parsed.skipped,
            "egress journal: skipped lines that do not parse (a torn last line)"
        );
    }
    let records: Vec<_> = parsed
        .records
        .iter()
        .map(|r| crate::internal_api::new_egress(run_id, r))
        .collect();
    store
        .append_egress_batch(&records)
        .await
        .map_err(|source| JournalIngestError::Store {
            run_id: run_id.to_owned(),
            source,
        })?;
    Ok(records.len())
}

/// [`ingest`] of the journal in a run directory, reporting instead of failing
/// (the caller goes on ending or reclaiming the run either way).
pub async fn ingest_run_dir(store: &Store, run_id: &str, run_dir: &Path) {
    match ingest(store, run_id, &path_in(run_dir)).await {
        Ok(0) => {}
        Ok(n) => tracing::debug!(run_id, records = n, "egress journal read into the store"),
        Err(e) => tracing::error!(run_id, "{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, outcome: EgressOutcome, status: Option<u16>) -> EgressRecord {
        EgressRecord {
            at: 1,
            source: "proxy".into(),
            integration: None,
            method: "GET".into(),
            url: "http://h.test/".into(),
            host: "h.test".into(),
            decision: "allowed".into(),
            code: None,
            status,
            bytes_out: 0,
            bytes_in: 0,
            duration_ms: None,
            seq: Some(seq),
            outcome: Some(outcome),
            metering: None,
        }
    }

    fn line(r: &EgressRecord) -> String {
        format!("{}\n", serde_json::to_string(r).unwrap())
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_a_repeated_start_never_undoes_a_completion() {
        let start1 = rec(1, EgressOutcome::Incomplete, None);
        let done1 = rec(1, EgressOutcome::Completed, Some(200));
        let start2 = rec(2, EgressOutcome::Incomplete, None);
        let mut text = line(&start1) + &line(&done1) + &line(&start1) + &line(&start2);
        let torn = line(&rec(3, EgressOutcome::Incomplete, None));
        text.push_str(&torn[..torn.len() / 2]);
        let p = parse(text.as_bytes());
        assert_eq!(p.records, vec![done1, start2]);
        assert_eq!(p.skipped, 1);
    }

    #[test]
    fn create_makes_a_private_new_file_and_never_follows_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = create(dir.path()).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A second create (or a planted file or link) is refused.
        assert!(create(dir.path()).is_err());
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(other.path().join("x"), path_in(other.path())).unwrap();
        assert!(create(other.path()).is_err());
        assert!(!other.path().join("x").exists());
    }
}

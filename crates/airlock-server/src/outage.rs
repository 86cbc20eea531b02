//! What this replica knows of the store's availability, and how it says so.
//!
//! Contract:
//! - A store error is logged with its whole cause chain
//!   ([`airlock_store::Chain`]): refused, authentication, name resolution,
//!   a full disk; never only "database … failed".
//! - An outage is logged when it starts, once more when its first cause
//!   said only that a pooled connection timed out and a later one says why,
//!   then at most every [`REPEAT`] however many calls fail (with their
//!   count), and its end once: a loop that retries every 200 ms does not
//!   flood the operator's log.
//! - [`public_cause`] is the cause in a few words, without the database's
//!   name: what `/readyz` may tell an unauthenticated caller.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use airlock_store::StoreError;

/// How often a continuing outage is logged again.
pub const REPEAT: Duration = Duration::from_secs(30);

#[derive(Default)]
pub struct StoreWatch {
    down: Mutex<Option<Down>>,
}

struct Down {
    since: Instant,
    cause: String,
    /// The last cause logged said only that a pooled connection timed out.
    vague: bool,
    logged_at: Instant,
    failures: u64,
}

impl StoreWatch {
    /// A call reached the store.
    pub fn ok(&self) {
        let Ok(mut d) = self.down.lock() else { return };
        if let Some(down) = d.take() {
            tracing::warn!(
                "the store answers again after {:.1} s ({} failed call(s) meanwhile)",
                down.since.elapsed().as_secs_f64(),
                down.failures
            );
        }
    }

    /// A call failed: `what` says which (a heartbeat, a claim …).
    pub fn failed(&self, what: &str, e: &StoreError) {
        let Ok(mut d) = self.down.lock() else { return };
        let cause = e.chain().to_string();
        let vague = e.is_pool_timeout();
        match d.as_mut() {
            None => {
                tracing::warn!("{what}: the store failed: {cause}");
                *d = Some(Down {
                    since: Instant::now(),
                    cause,
                    vague,
                    logged_at: Instant::now(),
                    failures: 1,
                });
            }
            Some(down) => {
                down.failures += 1;
                if down.logged_at.elapsed() >= REPEAT || (down.vague && !vague) {
                    tracing::warn!(
                        "{what}: the store still fails after {:.0} s ({} failed call(s)): {cause}",
                        down.since.elapsed().as_secs_f64(),
                        down.failures
                    );
                    down.logged_at = Instant::now();
                    down.vague = vague;
                }
                if !vague {
                    down.cause = cause;
                }
            }
        }
    }

    /// The cause of the current outage, if there is one.
    pub fn cause(&self) -> Option<String> {
        self.down
            .lock()
            .ok()
            .and_then(|d| d.as_ref().map(|d| d.cause.clone()))
    }
}

/// The cause of a store error in a few words, naming no database, host or
/// file: what an unauthenticated `/readyz` may say.
pub fn public_cause(e: &StoreError) -> String {
    match e {
        StoreError::Unavailable { detail, .. } => format!("the store is unavailable: {detail}"),
        StoreError::Locked(_) => "the store is locked by another process".into(),
        StoreError::Full { .. } => "the store is out of space (its disk is full)".into(),
        StoreError::Damaged { .. } => "the store is damaged (see the server's log)".into(),
        StoreError::SchemaTooNew { .. } => {
            "the store was migrated by a newer airlock (see the server's log)".into()
        }
        _ => "the store failed (see the server's log)".into(),
    }
}

//! `key_checks`: the key-check value of every key id the store's envelopes
//! were written under, so that a different key given under a known id is
//! refused before it decrypts or writes anything.
//!
//! Contract: a key id's value is written once (the first writer wins, a
//! second that differs is [`StoreError::KeyMismatch`]) and never changed.
//!
//! Bounds: one row per key id, and key ids come only from the operator's
//! keyring.

use airlock_vault::Keyring;

use crate::{Store, StoreError, now_ms};

impl Store {
    /// Checks that `ring`'s key for `kid` is the key this store's `kid`
    /// envelopes were written with: against the key-check value the store
    /// keeps for `kid`, or — for a store written before it kept them — by
    /// decrypting one of its `kid` envelopes (then the value is kept). A key
    /// id the store has never used passes. [`StoreError::KeyMismatch`] when
    /// the key differs.
    pub async fn check_key(&self, ring: &Keyring, kid: &str) -> Result<(), StoreError> {
        let Some(check) = ring.key_check(kid) else {
            return Ok(());
        };
        let known: Option<String> = on_pool!(self, p => sqlx::query_scalar(
            "SELECT check_value FROM key_checks WHERE kid = $1",
        )
        .bind(kid)
        .fetch_optional(p)
        .await
        .map_err(|e| self.err(e))?);
        if let Some(known) = known {
            return if airlock_vault::ct_eq(known.as_bytes(), check.as_bytes()) {
                Ok(())
            } else {
                Err(StoreError::KeyMismatch {
                    kid: kid.to_owned(),
                })
            };
        }
        let sample: Option<String> = on_pool!(self, p => sqlx::query_scalar(
            "SELECT envelope FROM connections WHERE kid = $1 LIMIT 1",
        )
        .bind(kid)
        .fetch_optional(p)
        .await
        .map_err(|e| self.err(e))?);
        let Some(sample) = sample else {
            return Ok(());
        };
        match ring.decrypt(&sample) {
            Ok(_) => self.keep_key_check(kid, &check).await,
            Err(airlock_vault::VaultError::AuthenticationFailed(_)) => {
                Err(StoreError::KeyMismatch {
                    kid: kid.to_owned(),
                })
            }
            Err(e) => Err(StoreError::BadEnvelope(e)),
        }
    }

    /// [`Store::check_key`] for every key of `ring`.
    pub async fn check_keyring(&self, ring: &Keyring) -> Result<(), StoreError> {
        for kid in ring.kids() {
            self.check_key(ring, kid).await?;
        }
        Ok(())
    }

    /// Before writing envelopes under `ring`'s active key: checks it, and
    /// keeps its key-check value so a different key under the same id is
    /// refused from now on.
    pub async fn record_active_key(&self, ring: &Keyring) -> Result<(), StoreError> {
        let kid = ring.active_kid();
        self.check_key(ring, kid).await?;
        match ring.key_check(kid) {
            Some(check) => self.keep_key_check(kid, &check).await,
            None => Ok(()),
        }
    }

    async fn keep_key_check(&self, kid: &str, check: &str) -> Result<(), StoreError> {
        on_pool!(self, p => sqlx::query(
            "INSERT INTO key_checks (kid, check_value, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (kid) DO NOTHING",
        )
        .bind(kid)
        .bind(check)
        .bind(now_ms())
        .execute(p)
        .await
        .map(|_| ())
        .map_err(|e| self.err(e)))?;
        // Two writers at once: whichever value won must be this one.
        let kept: Option<String> = on_pool!(self, p => sqlx::query_scalar(
            "SELECT check_value FROM key_checks WHERE kid = $1",
        )
        .bind(kid)
        .fetch_optional(p)
        .await
        .map_err(|e| self.err(e))?);
        match kept {
            Some(k) if k != check => Err(StoreError::KeyMismatch {
                kid: kid.to_owned(),
            }),
            _ => Ok(()),
        }
    }
}

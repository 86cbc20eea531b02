//! The model key: fetched from the platform, held between calls
//! ([`HeldKey`]), with the redactor of its values ([`ModelKey`]).

use std::time::{Duration, Instant};

use axum::response::Response;
use http::StatusCode;
use secrecy::{ExposeSecret, SecretString};

use super::error::error;
use crate::config::MODEL_CREDENTIAL;
use crate::credential::Redactor;
use crate::state::Sidecar;

/// How long the relay holds the model key after fetching it.
pub const MODEL_KEY_HOLD: Duration = Duration::from_secs(60);

/// The model key between calls. The sidecar "holds, or fetches, the
/// provider credential" (spec, Sandbox and Sidecar): the relay fetches it
/// from the platform on a run's first model call and holds it, in a
/// [`SecretString`] in this process only (never on disk, in a log or in
/// the sandbox), for at most [`MODEL_KEY_HOLD`]; a call after that fetches
/// it again, so a key changed or removed on the platform is in use for at
/// most that long. A provider that refuses the key (401 or 403) makes the
/// relay forget it at once: the next call fetches. Held, the platform's
/// fetch is out of the path of every call but one a minute. `api_call`
/// credentials are not held: they are fetched for each call (spec: "at
/// request time").
#[derive(Default)]
pub(super) struct HeldKey(std::sync::Mutex<Option<(ModelKey, Instant)>>);

/// The model key and the redactor of every value of the model connection
/// the run has seen (the run's [`crate::credential::Credentials`] builds it
/// once per set of values, as for every integration): the provider's
/// answers pass through it, so a provider or a proxy in front of it that
/// reflects the key, in any encoding the redactor knows, does not hand it
/// to the agent.
#[derive(Clone)]
pub(super) struct ModelKey {
    pub(super) secret: SecretString,
    pub(super) redactor: Redactor,
}

impl HeldKey {
    /// The key for a call starting now, and what `work` gives: the held
    /// key, or one fetched from the platform while `work` runs (the fetch
    /// goes out first), then held.
    /// Also returns the fetch's step when the run is traced and the key
    /// was fetched (not held).
    pub(super) async fn with<F: std::future::Future>(
        &self,
        sidecar: &Sidecar,
        work: F,
    ) -> (
        Result<ModelKey, Box<Response>>,
        F::Output,
        Option<airlock_platform_api::wire::Step>,
    ) {
        let started = Instant::now();
        match self.fresh(started) {
            Some(k) => (Ok(k), work.await, None),
            None => {
                let fetch = airlock_platform_api::wire::timed(sidecar.traced, model_key(sidecar));
                let ((key, step), out) = tokio::join!(fetch, work);
                if let Ok(k) = &key {
                    self.keep(k, started);
                }
                (key, out, step)
            }
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(ModelKey, Instant)>> {
        // Nothing that holds this lock can panic; a poisoned lock still
        // holds a whole value.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The held key if it was fetched less than [`MODEL_KEY_HOLD`] before
    /// `now`; a stale one is dropped here.
    fn fresh(&self, now: Instant) -> Option<ModelKey> {
        let mut slot = self.slot();
        match &*slot {
            Some((key, at)) if now.saturating_duration_since(*at) < MODEL_KEY_HOLD => {
                Some(key.clone())
            }
            Some(_) => {
                *slot = None;
                None
            }
            None => None,
        }
    }

    /// Holds `key`, fetched at `at`.
    fn keep(&self, key: &ModelKey, at: Instant) {
        *self.slot() = Some((key.clone(), at));
    }

    /// Forgets `key` if it is the one held (a provider refused it).
    pub(super) fn forget(&self, key: &SecretString) {
        let mut slot = self.slot();
        if slot
            .as_ref()
            .is_some_and(|(held, _)| held.secret.expose_secret() == key.expose_secret())
        {
            *slot = None;
        }
    }
}

/// The model key as the platform serves it now (the relay holds it: see
/// [`HeldKey`]), and the redactor of the connection's values, from the
/// field its connection type keeps a key in (`api_key`: `key`, `bearer`:
/// `token`, `oauth2`: `access_token`; see
/// [`airlock_platform_api::connection_types`]).
async fn model_key(sidecar: &Sidecar) -> Result<ModelKey, Box<Response>> {
    match sidecar.platform.credential(MODEL_CREDENTIAL).await {
        Ok(c) => {
            let Some(field) = c.auth_type.schema().key_field else {
                return Err(Box::new(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not_configured",
                    "model_credential_missing",
                    format!(
                        "the model connection is of type {:?}, which holds no single key: store it \
                         as --type api_key with the field key",
                        c.auth_type.as_str()
                    ),
                )));
            };
            match c
                .fields
                .get(field)
                .filter(|k| !k.expose_secret().is_empty())
            {
                Some(k) => Ok(ModelKey {
                    secret: k.clone(),
                    redactor: sidecar.credentials.redactor(MODEL_CREDENTIAL, &c.fields),
                }),
                None => Err(Box::new(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not_configured",
                    "model_credential_missing",
                    format!(
                        "the model connection ({}) has no {field} field",
                        c.auth_type
                    ),
                ))),
            }
        }
        Err(e) if matches!(e.status(), Some(403 | 404)) => Err(Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_configured",
            "model_credential_missing",
            "no model credential is available to this run",
        ))),
        Err(e) => {
            tracing::warn!("model relay: credential fetch failed: {e}");
            Err(Box::new(error(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                "platform_unavailable",
                "the platform did not provide the model credential",
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_key_is_held_for_a_minute_and_forgotten_when_refused() {
        let held = HeldKey::default();
        let t0 = Instant::now();
        let secret = |k: Option<ModelKey>| k.map(|k| k.secret.expose_secret().to_owned());
        assert_eq!(
            secret(held.fresh(t0)),
            None,
            "nothing is held before a fetch"
        );
        let key = ModelKey {
            secret: SecretString::from("sk-held".to_owned()),
            redactor: Redactor::new(["sk-held"]),
        };
        held.keep(&key, t0);
        let almost = t0 + MODEL_KEY_HOLD - Duration::from_millis(1);
        assert_eq!(secret(held.fresh(almost)).as_deref(), Some("sk-held"));
        assert_eq!(
            secret(held.fresh(t0 + MODEL_KEY_HOLD)),
            None,
            "held too long"
        );
        assert_eq!(
            secret(held.fresh(t0)),
            None,
            "a stale key is dropped, not kept"
        );
        held.keep(&key, t0);
        // A refusal of another key (a call that began before a newer fetch)
        // leaves the held one; a refusal of the held one forgets it.
        held.forget(&SecretString::from("sk-older".to_owned()));
        assert_eq!(secret(held.fresh(t0)).as_deref(), Some("sk-held"));
        held.forget(&key.secret);
        assert_eq!(secret(held.fresh(t0)), None);
    }
}

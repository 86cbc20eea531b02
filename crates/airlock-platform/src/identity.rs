//! Workload identity: the issuer that signs each run's identity token, and
//! the tokens minted for the runs granted one.
//!
//! A token is minted when the sidecar fetches the credential of an
//! integration whose delivery names `${airlock.identity}`, and handed to it
//! as the credential field `airlock.identity`; it never enters the agent's
//! sandbox. It lives at most [`Issuer::lifetime`] and never past the run's
//! timeout; a minted token is handed again until less than half of its
//! life is left, so a run's requests carry one value (one redactor) at a
//! time. The run's tokens are forgotten when its grant is revoked.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use airlock_vault::{IdentityClaims, IdentityKeyError, IdentityKeyring};

/// The wall clock in whole unix seconds (a token's `iat`, `nbf`, `exp`).
pub fn now_secs() -> u64 {
    u64::try_from(airlock_platform_api::clock::now_ms() / 1000).unwrap_or(0)
}

/// The issuer of this instance (`airlock serve`): its URL, its keys and
/// the longest life of a token.
#[derive(Debug)]
pub struct Issuer {
    url: String,
    keys: IdentityKeyring,
    lifetime: Duration,
}

/// Why no identity token could be handed.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// This platform issues no identity (`airlock run`: no one could fetch
    /// its keys to verify a token).
    #[error(
        "this platform issues no workload identity: `${{airlock.identity}}` needs `airlock serve`, \
         which publishes the issuer's keys"
    )]
    NoIssuer,
    /// The run's timeout has passed: a token would be born expired.
    #[error("the run is past its timeout: no identity token is minted for it")]
    PastTimeout,
    /// The integration's delivery does not name the identity.
    #[error("the integration's delivery does not name the run's identity")]
    NotGranted,
    #[error(transparent)]
    Sign(#[from] IdentityKeyError),
}

impl Issuer {
    /// The issuer at `url` (no trailing `/`) signing with `keys`.
    pub fn new(url: &str, keys: IdentityKeyring, lifetime: Duration) -> Issuer {
        Issuer {
            url: url.trim_end_matches('/').to_owned(),
            keys,
            lifetime,
        }
    }

    /// The issuer's URL: a token's `iss`, and where its discovery document is.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The keys it signs with (the first) and publishes (all).
    pub fn keys(&self) -> &IdentityKeyring {
        &self.keys
    }

    /// The longest life of a token.
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }
}

/// What a run's grant holds of identity: the audience of each integration
/// whose delivery names it.
#[derive(Debug, Clone, Default)]
pub struct IdentityGrant {
    /// integration namespace → the token's audience.
    pub audiences: HashMap<String, String>,
    /// The run's timeout: no token outlives it.
    pub timeout: Duration,
}

/// One token handed for an integration of a run.
struct Minted {
    token: String,
    iat: u64,
    exp: u64,
}

/// The tokens minted for the running runs, and each run's deadline (its
/// grant's time plus its timeout).
#[derive(Default)]
pub struct Minter {
    runs: Mutex<HashMap<String, RunTokens>>,
}

struct RunTokens {
    deadline: u64,
    by_integration: HashMap<String, Minted>,
}

/// Who a token is for.
pub struct Subject<'a> {
    pub run_id: &'a str,
    pub org: &'a str,
    pub agent: &'a str,
    pub namespace: &'a str,
}

impl Minter {
    /// A run is granted at `now` (unix seconds) with `grant`.
    pub fn granted(&self, run_id: &str, grant: &IdentityGrant, now: u64) {
        if grant.audiences.is_empty() {
            return;
        }
        let deadline = now.saturating_add(grant.timeout.as_secs());
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.insert(
            run_id.to_owned(),
            RunTokens {
                deadline,
                by_integration: HashMap::new(),
            },
        );
    }

    /// The run's grant is revoked: its tokens are forgotten.
    pub fn revoked(&self, run_id: &str) {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.remove(run_id);
    }

    /// The token of `who` at `now` (unix seconds): the one minted before
    /// while more than half of its life is left, else a new one.
    pub fn token(
        &self,
        issuer: Option<&Issuer>,
        grant: &IdentityGrant,
        who: &Subject<'_>,
        now: u64,
    ) -> Result<String, IdentityError> {
        let issuer = issuer.ok_or(IdentityError::NoIssuer)?;
        let audience = grant
            .audiences
            .get(who.namespace)
            .ok_or(IdentityError::NotGranted)?;
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        let run = runs.get_mut(who.run_id).ok_or(IdentityError::NotGranted)?;
        if let Some(m) = run.by_integration.get(who.namespace)
            && now < m.exp
            && m.exp - now > (m.exp - m.iat) / 2
        {
            return Ok(m.token.clone());
        }
        let exp = now
            .saturating_add(issuer.lifetime.as_secs())
            .min(run.deadline);
        if exp <= now {
            return Err(IdentityError::PastTimeout);
        }
        let jti = airlock_vault::random_hex::<16>()
            .map_err(|_| IdentityError::Sign(IdentityKeyError::RandomUnavailable))?;
        let claims = IdentityClaims {
            iss: issuer.url.clone(),
            sub: who.run_id.to_owned(),
            aud: audience.clone(),
            iat: now,
            nbf: now,
            exp,
            jti,
            org: who.org.to_owned(),
            agent: who.agent.to_owned(),
            run_id: who.run_id.to_owned(),
        };
        let token = issuer.keys.sign(&claims)?;
        run.by_integration.insert(
            who.namespace.to_owned(),
            Minted {
                token: token.clone(),
                iat: now,
                exp,
            },
        );
        Ok(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(timeout: u64) -> IdentityGrant {
        IdentityGrant {
            audiences: HashMap::from([("aws".to_owned(), "sts.amazonaws.com".to_owned())]),
            timeout: Duration::from_secs(timeout),
        }
    }

    const WHO: Subject<'static> = Subject {
        run_id: "r1",
        org: "acme",
        agent: "triage",
        namespace: "aws",
    };

    fn claims(token: &str) -> IdentityClaims {
        let payload = token.split('.').nth(1).unwrap();
        use base64::Engine as _;
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap();
        serde_json::from_slice(&raw).unwrap()
    }

    /// A token never outlives the run's timeout; it is handed again while
    /// more than half of its life is left, then a new one is minted; none
    /// is minted past the timeout, for an integration not granted one, or
    /// without an issuer.
    #[test]
    fn tokens_live_within_the_runs_timeout_and_are_reused_for_half_their_life() {
        let issuer = Issuer::new(
            "https://id.example/",
            IdentityKeyring::generate().unwrap(),
            Duration::from_secs(600),
        );
        let m = Minter::default();
        let g = grant(300);
        m.granted("r1", &g, 1_000);
        let first = m.token(Some(&issuer), &g, &WHO, 1_000).unwrap();
        let c = claims(&first);
        assert_eq!((c.iat, c.nbf, c.exp), (1_000, 1_000, 1_300));
        assert_eq!(c.iss, "https://id.example");
        assert_eq!((c.sub.as_str(), c.run_id.as_str()), ("r1", "r1"));
        assert_eq!((c.org.as_str(), c.agent.as_str()), ("acme", "triage"));
        assert_eq!(c.aud, "sts.amazonaws.com");
        assert_eq!(m.token(Some(&issuer), &g, &WHO, 1_100).unwrap(), first);
        let second = m.token(Some(&issuer), &g, &WHO, 1_160).unwrap();
        assert_ne!(second, first);
        assert_eq!(claims(&second).exp, 1_300);
        assert!(matches!(
            m.token(Some(&issuer), &g, &WHO, 1_300),
            Err(IdentityError::PastTimeout)
        ));
        let other = Subject {
            namespace: "gh",
            ..WHO
        };
        assert!(matches!(
            m.token(Some(&issuer), &g, &other, 1_000),
            Err(IdentityError::NotGranted)
        ));
        assert!(matches!(
            m.token(None, &g, &WHO, 1_000),
            Err(IdentityError::NoIssuer)
        ));
        m.revoked("r1");
        assert!(matches!(
            m.token(Some(&issuer), &g, &WHO, 1_000),
            Err(IdentityError::NotGranted)
        ));
    }
}

//! What `airlock serve` is configured with beside the platform's settings,
//! read from the environment: each setting checked against its bounds, a
//! bad one named with what it should be.

use std::net::SocketAddr;
use std::time::Duration;

use airlock_platform_api::listener_guard;

use crate::{failpoint, ratelimit};

/// What `airlock serve` is configured with (beside the platform's settings).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// A replica silent this long is dead: the leader fails its runs, and a
    /// leader silent this long loses the lease (`AIRLOCK_REPLICA_LEASE_SECONDS`, 15).
    pub replica_lease: Duration,
    pub rate: ratelimit::RateLimit,
    /// Failed authentications per client address (`API_AUTH_FAILURE_BURST`,
    /// 20, then one every two seconds).
    pub auth_failures: ratelimit::RateLimit,
    /// Open event streams per organization on this replica
    /// (`API_MAX_STREAMS`, 64): each polls the store.
    pub max_streams: usize,
    /// At most this many runs at once on this replica
    /// (`AIRLOCK_REPLICA_MAX_RUNS`; unset: only the store-wide limits).
    pub replica_max_runs: Option<usize>,
    /// `WEBHOOK_MAX_ATTEMPTS` (8).
    pub webhook_max_attempts: u32,
    /// `WEBHOOK_RETRY_BASE_MS` (1000): the n-th retry waits base × 2^(n-1), at most an hour.
    pub webhook_retry_base: Duration,
    /// `WEBHOOK_TIMEOUT_SECONDS` (10): one delivery attempt, connect to last byte.
    pub webhook_timeout: Duration,
    /// `WEBHOOK_SLOTS_PER_ORG` (4): of a replica's 16 delivery slots, how
    /// many one organization may hold at once.
    pub webhook_slots_per_org: usize,
    /// `SHUTDOWN_GRACE_SECONDS` (30): on SIGTERM, how long running runs
    /// may go on to their end before they are cancelled ("this replica
    /// shut down").
    pub shutdown_grace: Duration,
    /// What the store keeps and for how long (`RETENTION_*`), swept by the
    /// leader every `retention_sweep`.
    pub retention: airlock_store::Retention,
    /// `RETENTION_SWEEP_SECONDS` (3600).
    pub retention_sweep: Duration,
    /// What one organization may hold (`ORG_MAX_*`).
    pub quotas: airlock_store::OrgQuotas,
    /// The API listener's timeouts and connection caps
    /// (`API_MAX_CONNECTIONS` 1024, `API_MAX_CONNECTIONS_PER_ADDRESS` 256,
    /// `API_HEADER_READ_TIMEOUT_SECONDS` 10, `API_IDLE_TIMEOUT_SECONDS` 60):
    /// [`listener_guard`].
    pub listener: listener_guard::Settings,
    /// `AIRLOCK_TEST_FAIL_POINT`: test-only ([`failpoint`]).
    pub fail_point: Option<failpoint::FailPoint>,
    /// Signs artifact download URLs (`UPLOAD_SIGNING_SECRET`; unset: a
    /// secret of this process's own, so a URL works only on the replica
    /// that made it).
    pub downloads: airlock_vault::UrlSigner,
    /// How long a download URL lasts (`ARTIFACT_URL_SECONDS`, 300; at most 3600).
    pub download_ttl: i64,
    /// The workload identity issuer's settings ([`Identity`]).
    pub identity: Identity,
    /// Where `/metrics` is served, and who may read it (`METRICS_LISTEN`,
    /// `METRICS_TOKEN`; unset: nowhere): [`crate::metrics`].
    pub metrics: Option<crate::metrics::MetricsAccess>,
    /// The console's sessions and the previews' origin
    /// (`CONSOLE_SESSION_SECRET`, `USERCONTENT_URL`, `USERCONTENT_LISTEN`):
    /// [`crate::console`].
    pub console: crate::console::ConsoleConfig,
}

/// The workload identity issuer's settings: `IDENTITY_SIGNING_KEYS` (unset:
/// a key of this process's own), `AIRLOCK_ISSUER_URL` (unset: this
/// server's own `http://<listen address>`), `IDENTITY_TOKEN_SECONDS` (900).
#[derive(Debug, Clone)]
pub struct Identity {
    pub keys: airlock_vault::IdentityKeyring,
    /// The issuer URL, when set (checked: an http(s) URL with a host and
    /// nothing after its path).
    pub issuer_url: Option<String>,
    /// The longest life of a token (never past its run's timeout).
    pub lifetime: Duration,
}

impl Identity {
    /// The issuer URL of a server listening on `listen`.
    pub fn issuer_url(&self, listen: SocketAddr) -> String {
        self.issuer_url
            .clone()
            .unwrap_or_else(|| format!("http://{listen}"))
    }

    fn from_env() -> Result<Identity, ConfigError> {
        use airlock_vault::{ENV_IDENTITY_SIGNING_KEYS as KEYS, IdentityKeyring};
        let bad = |var, e: &dyn std::fmt::Display| ConfigError {
            var,
            message: e.to_string(),
        };
        let keys = match get(KEYS) {
            Some(v) => IdentityKeyring::parse(KEYS, &zeroize::Zeroizing::new(v))
                .map_err(|e| bad(KEYS, &e))?,
            None => IdentityKeyring::generate().map_err(|e| bad(KEYS, &e))?,
        };
        let issuer_url = get(ENV_ISSUER_URL)
            .map(|v| check_issuer_url(v.trim()).map(|()| v.trim().trim_end_matches('/').to_owned()))
            .transpose()
            .map_err(|why| bad(ENV_ISSUER_URL, &why))?;
        let seconds = num("IDENTITY_TOKEN_SECONDS", 900.0, 60.0, 43_200.0)?;
        Ok(Identity {
            keys,
            issuer_url,
            lifetime: Duration::from_secs(u64::from(whole(seconds))),
        })
    }
}

/// The issuer URL's variable.
pub const ENV_ISSUER_URL: &str = "AIRLOCK_ISSUER_URL";

/// An issuer URL as OpenID Connect Discovery takes it: http(s), a host, no
/// query, no fragment, no user info.
fn check_issuer_url(v: &str) -> Result<(), String> {
    let url = url::Url::parse(v).map_err(|e| format!("{v:?} is not a URL: {e}"))?;
    let fine = matches!(url.scheme(), "https" | "http")
        && url.host_str().is_some_and(|h| !h.is_empty())
        && url.query().is_none()
        && url.fragment().is_none()
        && url.username().is_empty()
        && url.password().is_none();
    if fine {
        Ok(())
    } else {
        Err(format!(
            "{v:?} is not an issuer URL: an http(s) URL with a host and no query, fragment or user info, e.g. https://airlock.example.com"
        ))
    }
}

/// The default `--listen` address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8420";

#[derive(Debug, thiserror::Error)]
#[error("{var}: {message}")]
pub struct ConfigError {
    pub var: &'static str,
    pub message: String,
}

/// The variable `var`; set to blanks is unset.
fn get(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}

/// `var` as a number from `min` to `max` (`default` when unset).
fn num(var: &'static str, default: f64, min: f64, max: f64) -> Result<f64, ConfigError> {
    let Some(v) = get(var) else {
        return Ok(default);
    };
    match v.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && (min..=max).contains(&n) => Ok(n),
        _ => Err(ConfigError {
            var,
            message: format!("{v:?} is not a number from {min} to {max}"),
        }),
    }
}

/// The whole part of a count [`num`] read: finite and within bounds of at
/// most 3,600,000, so it fits a u32.
fn whole(n: f64) -> u32 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let w = n.trunc().clamp(0.0, f64::from(u32::MAX)) as u32;
    w
}

/// [`whole`] as a `usize`.
fn size(n: f64) -> usize {
    usize::try_from(whole(n)).unwrap_or(usize::MAX)
}

fn setting(e: airlock_store::SettingError) -> ConfigError {
    ConfigError {
        var: e.var,
        message: format!("{:?} is not {}", e.value, e.expected),
    }
}

impl ServeConfig {
    /// From the environment; `listen` from the command line or `AIRLOCK_LISTEN`.
    pub fn from_env(listen: Option<&str>) -> Result<Self, ConfigError> {
        let listen_s = listen
            .map(str::to_owned)
            .or_else(|| get("AIRLOCK_LISTEN"))
            .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen = listen_s.parse().map_err(|_| ConfigError {
            var: "AIRLOCK_LISTEN",
            message: format!("{listen_s:?} is not an address and port, e.g. 127.0.0.1:8420"),
        })?;
        let replica_max_runs = match get("AIRLOCK_REPLICA_MAX_RUNS") {
            Some(_) => Some(size(num("AIRLOCK_REPLICA_MAX_RUNS", 0.0, 1.0, 1e5)?)),
            None => None,
        };
        let lease = num("AIRLOCK_REPLICA_LEASE_SECONDS", 15.0, 1.0, 3600.0)?;
        let max_streams = num("API_MAX_STREAMS", 64.0, 1.0, 100_000.0)?;
        let auth_failure_burst = num("API_AUTH_FAILURE_BURST", 20.0, 1.0, 1e6)?;
        let per_second = num("API_RATE_PER_SECOND", 100.0, 0.01, 1e6)?;
        let burst = num("API_RATE_BURST", 200.0, 1.0, 1e6)?;
        let grace = num("SHUTDOWN_GRACE_SECONDS", 30.0, 0.0, 86_400.0)?;
        let every = airlock_store::DEFAULT_SWEEP_INTERVAL.as_secs_f64();
        let retention_sweep = num("RETENTION_SWEEP_SECONDS", every, 1.0, 86_400.0)?;
        let webhooks = Webhooks::from_env()?;
        #[allow(clippy::cast_precision_loss)] // a small constant
        let longest = airlock_vault::MAX_SIGNED_URL_SECONDS as f64;
        let url_seconds = num("ARTIFACT_URL_SECONDS", 300.0, 1.0, longest)?;
        Ok(ServeConfig {
            listen,
            replica_lease: Duration::from_secs_f64(lease),
            replica_max_runs,
            max_streams: size(max_streams),
            auth_failures: ratelimit::RateLimit {
                burst: auth_failure_burst,
                ..ratelimit::AUTH_FAILURES
            },
            rate: ratelimit::RateLimit { per_second, burst },
            webhook_max_attempts: webhooks.max_attempts,
            webhook_retry_base: webhooks.retry_base,
            webhook_slots_per_org: webhooks.slots_per_org,
            webhook_timeout: webhooks.timeout,
            shutdown_grace: Duration::from_secs_f64(grace),
            retention: airlock_store::Retention::from_lookup(get).map_err(setting)?,
            retention_sweep: Duration::from_secs_f64(retention_sweep),
            quotas: airlock_store::OrgQuotas::from_lookup(get).map_err(setting)?,
            listener: listener()?,
            fail_point: fail_point()?,
            downloads: downloads()?,
            download_ttl: i64::from(whole(url_seconds)),
            identity: Identity::from_env()?,
            metrics: metrics()?,
            console: console()?,
        })
    }
}

/// The webhook deliverer's settings (`WEBHOOK_*`).
struct Webhooks {
    max_attempts: u32,
    retry_base: Duration,
    slots_per_org: usize,
    timeout: Duration,
}

impl Webhooks {
    fn from_env() -> Result<Webhooks, ConfigError> {
        let attempts = num("WEBHOOK_MAX_ATTEMPTS", 8.0, 1.0, 100.0)?;
        let base_ms = num("WEBHOOK_RETRY_BASE_MS", 1000.0, 1.0, 3_600_000.0)?;
        let slots = num("WEBHOOK_SLOTS_PER_ORG", 4.0, 1.0, 16.0)?;
        let timeout = num("WEBHOOK_TIMEOUT_SECONDS", 10.0, 0.1, 300.0)?;
        Ok(Webhooks {
            max_attempts: whole(attempts),
            retry_base: Duration::from_millis(u64::from(whole(base_ms))),
            slots_per_org: usize::try_from(whole(slots)).unwrap_or(16),
            timeout: Duration::from_secs_f64(timeout),
        })
    }
}

/// The API listener's caps and timeouts (`API_MAX_CONNECTIONS` …).
fn listener() -> Result<listener_guard::Settings, ConfigError> {
    let d = listener_guard::Settings::API;
    let (conns, per_peer) = (d.max_connections as f64, d.max_connections_per_peer as f64);
    let (header, idle) = (
        d.header_read_timeout.as_secs_f64(),
        d.idle_timeout.as_secs_f64(),
    );
    let max_connections = num("API_MAX_CONNECTIONS", conns, 1.0, 1e6)?;
    let per_address = num("API_MAX_CONNECTIONS_PER_ADDRESS", per_peer, 1.0, 1e6)?;
    let header_read = num("API_HEADER_READ_TIMEOUT_SECONDS", header, 0.1, 3600.0)?;
    let idle_timeout = num("API_IDLE_TIMEOUT_SECONDS", idle, 0.1, 86_400.0)?;
    Ok(listener_guard::Settings {
        max_connections: size(max_connections),
        max_connections_per_peer: size(per_address),
        header_read_timeout: Duration::from_secs_f64(header_read),
        idle_timeout: Duration::from_secs_f64(idle_timeout),
    })
}

/// The download URLs' signer: `UPLOAD_SIGNING_SECRET`, or a random
/// secret of this process's own when it is unset.
fn downloads() -> Result<airlock_vault::UrlSigner, ConfigError> {
    use airlock_vault::{ENV_UPLOAD_SIGNING_SECRET as VAR, SigningKeyring};
    let bad = |e: &dyn std::fmt::Display| ConfigError {
        var: VAR,
        message: e.to_string(),
    };
    let ring = match get(VAR) {
        Some(v) => SigningKeyring::parse(VAR, &zeroize::Zeroizing::new(v)).map_err(|e| bad(&e))?,
        None => {
            let own =
                zeroize::Zeroizing::new(airlock_vault::random_hex::<32>().map_err(|e| bad(&e))?);
            SigningKeyring::parse(VAR, &own).map_err(|e| bad(&e))?
        }
    };
    Ok(airlock_vault::UrlSigner::new(ring))
}

/// The console's settings: its sessions' keyring (`CONSOLE_SESSION_SECRET`,
/// or a secret of this process's own, so a session works only on the
/// replica that opened it), and the previews' origin (`USERCONTENT_URL`
/// with `USERCONTENT_LISTEN`, both or neither).
fn console() -> Result<crate::console::ConsoleConfig, ConfigError> {
    use crate::console::session::{ENV_CONSOLE_SESSION_SECRET as VAR, Sessions};
    use crate::console::{ENV_USERCONTENT_LISTEN, ENV_USERCONTENT_URL, Usercontent};
    use airlock_vault::SigningKeyring;
    let bad = |var, e: &dyn std::fmt::Display| ConfigError {
        var,
        message: e.to_string(),
    };
    let ring = match get(VAR) {
        Some(v) => {
            SigningKeyring::parse(VAR, &zeroize::Zeroizing::new(v)).map_err(|e| bad(VAR, &e))?
        }
        None => {
            let own = zeroize::Zeroizing::new(
                airlock_vault::random_hex::<32>().map_err(|e| bad(VAR, &e))?,
            );
            SigningKeyring::parse(VAR, &own).map_err(|e| bad(VAR, &e))?
        }
    };
    let usercontent = match (get(ENV_USERCONTENT_URL), get(ENV_USERCONTENT_LISTEN)) {
        (None, None) => None,
        (Some(url), Some(listen)) => Some(Usercontent {
            origin: crate::console::usercontent_origin(url.trim())
                .map_err(|e| bad(ENV_USERCONTENT_URL, &e))?,
            listen: listen.trim().parse().map_err(|_| {
                bad(
                    ENV_USERCONTENT_LISTEN,
                    &format!("{listen:?} is not an address and port, e.g. 127.0.0.1:8421"),
                )
            })?,
        }),
        (Some(_), None) => {
            return Err(bad(
                ENV_USERCONTENT_LISTEN,
                &"is not set but USERCONTENT_URL is: previews on their own origin are served on USERCONTENT_LISTEN",
            ));
        }
        (None, Some(_)) => {
            return Err(bad(
                ENV_USERCONTENT_URL,
                &"is not set but USERCONTENT_LISTEN is: name the origin the previews are served from",
            ));
        }
    };
    Ok(crate::console::ConsoleConfig {
        sessions: Sessions::new(ring),
        usercontent,
    })
}

/// `METRICS_LISTEN` and `METRICS_TOKEN` (a token without an address is
/// a mistake: it protects nothing).
fn metrics() -> Result<Option<crate::metrics::MetricsAccess>, ConfigError> {
    let token = get("METRICS_TOKEN").map(secrecy::SecretString::from);
    let Some(listen) = get("METRICS_LISTEN") else {
        return match token {
            Some(_) => Err(ConfigError {
                var: "METRICS_TOKEN",
                message:
                    "is set but METRICS_LISTEN is not: /metrics is served only on METRICS_LISTEN"
                        .into(),
            }),
            None => Ok(None),
        };
    };
    let listen = listen.trim().parse().map_err(|_| ConfigError {
        var: "METRICS_LISTEN",
        message: format!("{listen:?} is not an address and port, e.g. 127.0.0.1:9464"),
    })?;
    Ok(Some(crate::metrics::MetricsAccess { listen, token }))
}

/// `AIRLOCK_TEST_FAIL_POINT` (test-only).
fn fail_point() -> Result<Option<failpoint::FailPoint>, ConfigError> {
    get(failpoint::ENV_FAIL_POINT)
        .map(|v| {
            failpoint::FailPoint::parse(v.trim()).ok_or_else(|| ConfigError {
                var: failpoint::ENV_FAIL_POINT,
                message: format!(
                    "{v:?} is not after-run-end or after-delivery-claim (a test-only setting)"
                ),
            })
        })
        .transpose()
}

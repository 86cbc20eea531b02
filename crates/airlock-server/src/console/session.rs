//! The console's sessions: who a browser is, decided from one cookie.
//!
//! Signing in with an organization's API key gives the browser a session
//! cookie ([`COOKIE`]): `<key id>.<nonce>.<expires>.<signature>`, the
//! signature an HMAC under `CONSOLE_SESSION_SECRET` (a keyring like the
//! other signing secrets: the first entry signs, every entry verifies)
//! over the key id, the nonce and the expiry. The cookie never holds the
//! key itself; each request finds the key's row again, so a revoked key
//! ends its sessions at once. A session lasts [`LIFETIME_SECONDS`].
//!
//! Every state-changing form carries the session's CSRF token: an HMAC
//! under the same keyring over the session's key id and nonce, with
//! another purpose than the cookie's, so neither can stand for the other.
//! The sign-in form, made before any session, carries a token equal to a
//! short-lived cookie of its own ([`SIGN_IN_COOKIE`]) instead.

use std::sync::Arc;

use airlock_vault::SigningKeyring;

/// The session cookie's name.
pub const COOKIE: &str = "airlock_console";
/// The sign-in form's own cookie (its CSRF pair).
pub const SIGN_IN_COOKIE: &str = "airlock_console_sign_in";
/// Where the console's cookies are sent: its pages and data, never `/v1`
/// or the previews.
pub const COOKIE_PATH: &str = "/console";
/// How long a session lasts (8 hours).
pub const LIFETIME_SECONDS: i64 = 8 * 3600;
/// How long a sign-in form may wait for its key (10 minutes).
pub const SIGN_IN_SECONDS: i64 = 600;
/// The variable holding the sessions' keyring.
pub const ENV_CONSOLE_SESSION_SECRET: &str = "CONSOLE_SESSION_SECRET";

/// A verified session: the key it was opened with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub key_id: String,
    nonce: String,
    pub expires: i64,
}

/// Makes and checks sessions and their CSRF tokens. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Sessions {
    ring: Arc<SigningKeyring>,
}

/// What one signature covers: its purpose, the key, the nonce, the expiry.
fn message(purpose: &str, key_id: &str, nonce: &str, expires: i64) -> Vec<u8> {
    format!("airlock-console-{purpose}\n{key_id}\n{nonce}\n{expires}").into_bytes()
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Sessions {
    pub fn new(ring: SigningKeyring) -> Self {
        Sessions {
            ring: Arc::new(ring),
        }
    }

    /// A new session for the key `key_id`, from `now` (Unix seconds): the
    /// session and its cookie's value.
    pub fn open(
        &self,
        key_id: &str,
        now: i64,
    ) -> Result<(Session, String), airlock_vault::VaultError> {
        let nonce = airlock_vault::random_hex::<16>()?;
        let expires = now.saturating_add(LIFETIME_SECONDS);
        let sig = self.ring.sign(&message("session", key_id, &nonce, expires));
        let value = format!("{key_id}.{nonce}.{expires}.{sig}");
        Ok((
            Session {
                key_id: key_id.to_owned(),
                nonce,
                expires,
            },
            value,
        ))
    }

    /// The session a cookie's value stands for at `now`, if it is one this
    /// keyring signed and it has not expired.
    pub fn verify(&self, value: &str, now: i64) -> Option<Session> {
        let mut parts = value.split('.');
        let (key_id, nonce, expires, sig) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || !is_hex(key_id, 16) || !is_hex(nonce, 32) {
            return None;
        }
        let expires: i64 = expires.parse().ok()?;
        if expires <= now || expires - now > LIFETIME_SECONDS {
            return None;
        }
        self.ring
            .verify(&message("session", key_id, nonce, expires), sig)
            .then(|| Session {
                key_id: key_id.to_owned(),
                nonce: nonce.to_owned(),
                expires,
            })
    }

    /// The CSRF token of `s`'s forms.
    pub fn csrf(&self, s: &Session) -> String {
        self.ring
            .sign(&message("csrf", &s.key_id, &s.nonce, s.expires))
    }

    /// Whether `token` is `s`'s CSRF token (constant-time).
    pub fn csrf_ok(&self, s: &Session, token: &str) -> bool {
        self.ring
            .verify(&message("csrf", &s.key_id, &s.nonce, s.expires), token)
    }
}

/// The value of the cookie `name` among a request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find_map(|(k, v)| (k == name).then_some(v))
}

/// A `Set-Cookie` value for the console: `HttpOnly`, `SameSite=Strict`,
/// under `path`, for `max_age` seconds (0: removed), `Secure` when the
/// console is served over https.
pub fn set_cookie(name: &str, value: &str, path: &str, max_age: i64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}")
}

/// Whether the request reached the server over https (the console is
/// served behind a TLS proxy that says so in `X-Forwarded-Proto`; a client
/// that claims it falsely only makes its own cookie stricter).
pub fn over_https(headers: &http::HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(s: &str) -> SigningKeyring {
        SigningKeyring::parse(ENV_CONSOLE_SESSION_SECRET, s).unwrap()
    }

    const KEY: &str = "0123456789abcdef";

    #[test]
    fn a_session_verifies_until_it_expires_and_only_under_its_keyring() {
        let s = Sessions::new(ring("console-secret-one-0123"));
        let (session, value) = s.open(KEY, 1000).unwrap();
        assert_eq!(s.verify(&value, 1000), Some(session.clone()));
        assert_eq!(s.verify(&value, 1000 + LIFETIME_SECONDS - 1), Some(session));
        assert_eq!(s.verify(&value, 1000 + LIFETIME_SECONDS), None, "expired");
        let other = Sessions::new(ring("console-secret-two-0123"));
        assert_eq!(other.verify(&value, 1000), None);
        // Rotation: a keyring whose second entry signed it still verifies.
        let rotated = Sessions::new(ring("console-secret-two-0123,console-secret-one-0123"));
        assert!(rotated.verify(&value, 1000).is_some());
    }

    #[test]
    fn a_changed_cookie_is_no_session() {
        let s = Sessions::new(ring("console-secret-one-0123"));
        let (_, value) = s.open(KEY, 1000).unwrap();
        let parts: Vec<&str> = value.split('.').collect();
        let longer = format!(
            "{}.{}.{}.{}",
            parts[0],
            parts[1],
            1000 + 2 * LIFETIME_SECONDS,
            parts[3]
        );
        let other_key = value.replacen(KEY, "fedcba9876543210", 1);
        for bad in [
            longer.as_str(),
            other_key.as_str(),
            "",
            "a.b.c.d",
            &format!("{value}.x"),
            &value.to_uppercase(),
        ] {
            assert_eq!(s.verify(bad, 1000), None, "{bad}");
        }
    }

    #[test]
    fn the_csrf_token_is_the_sessions_own_and_not_its_cookie() {
        let s = Sessions::new(ring("console-secret-one-0123"));
        let (a, value) = s.open(KEY, 1000).unwrap();
        let (b, _) = s.open(KEY, 1000).unwrap();
        let token = s.csrf(&a);
        assert!(s.csrf_ok(&a, &token));
        assert!(!s.csrf_ok(&b, &token), "another session's token");
        assert!(!s.csrf_ok(&a, ""));
        let sig = value.rsplit('.').next().unwrap();
        assert!(!s.csrf_ok(&a, sig), "the cookie's signature is no token");
    }

    #[test]
    fn cookies_are_read_by_name_and_written_strict() {
        let mut h = http::HeaderMap::new();
        h.append(
            http::header::COOKIE,
            "a=1; airlock_console=v1".parse().unwrap(),
        );
        h.append(http::header::COOKIE, "b=2".parse().unwrap());
        assert_eq!(cookie(&h, COOKIE), Some("v1"));
        assert_eq!(cookie(&h, "b"), Some("2"));
        assert_eq!(cookie(&h, "c"), None);
        let c = set_cookie(COOKIE, "v", COOKIE_PATH, 60, true);
        assert_eq!(
            c,
            "airlock_console=v; Path=/console; Max-Age=60; HttpOnly; SameSite=Strict; Secure"
        );
        assert!(!set_cookie(COOKIE, "v", COOKIE_PATH, 60, false).contains("Secure"));
    }
}

//! The sidecar token check. Every route but `GET /health` needs the run's
//! token in `Authorization: Bearer`, `x-api-key` or `x-airlock-sidecar-auth`
//! (`Proxy-Authorization` on the proxy). The comparison is constant-time, and
//! the token headers are removed before anything is forwarded.

use http::header::{AUTHORIZATION, PROXY_AUTHORIZATION};
use http::{HeaderMap, HeaderName};
use secrecy::{ExposeSecret, SecretString};
use subtle::ConstantTimeEq;

pub use airlock_platform_api::sidecar_auth::{API_KEY_HEADER, SIDECAR_AUTH_HEADER};

// The same names as `HeaderName`s: a lookup by `&str` parses the name on
// every request, one by `HeaderName` only hashes it.
static SIDECAR_AUTH: HeaderName = HeaderName::from_static(SIDECAR_AUTH_HEADER);
static API_KEY: HeaderName = HeaderName::from_static(API_KEY_HEADER);

fn eq(a: &str, token: &SecretString) -> bool {
    let t = token.expose_secret().as_bytes();
    // Lengths are not secret (the token length is fixed); the bytes are.
    a.len() == t.len() && bool::from(a.as_bytes().ct_eq(t))
}

fn bearer(v: &str) -> Option<&str> {
    let (scheme, rest) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// True when any of the accepted token headers carries the run's token.
pub fn is_authorized(headers: &HeaderMap, token: &SecretString) -> bool {
    let mut ok = false;
    for v in headers
        .get_all(&SIDECAR_AUTH)
        .iter()
        .chain(headers.get_all(&API_KEY).iter())
    {
        if let Ok(s) = v.to_str() {
            ok |= eq(s.trim(), token);
        }
    }
    for v in headers.get_all(AUTHORIZATION).iter() {
        if let Some(b) = v.to_str().ok().and_then(bearer) {
            ok |= eq(b, token);
        }
    }
    ok
}

/// The proxy's check: `Proxy-Authorization: Bearer <t>` or `Basic` with the
/// token as the password (what `curl -x http://run:TOKEN@…` sends).
pub fn is_proxy_authorized(headers: &HeaderMap, token: &SecretString) -> bool {
    use base64::Engine;
    let mut ok = false;
    for v in headers.get_all(PROXY_AUTHORIZATION).iter() {
        let Ok(s) = v.to_str() else { continue };
        if let Some(b) = bearer(s) {
            ok |= eq(b, token);
        } else if let Some((scheme, rest)) = s.split_once(' ')
            && scheme.eq_ignore_ascii_case("basic")
            && let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(rest.trim())
            && let Ok(pair) = String::from_utf8(raw)
            && let Some((_, pw)) = pair.split_once(':')
        {
            ok |= eq(pw, token);
        }
    }
    ok
}

/// Removes every header that may carry the sidecar token.
pub fn strip_token_headers(headers: &mut HeaderMap) {
    headers.remove(&SIDECAR_AUTH);
    headers.remove(PROXY_AUTHORIZATION);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn token() -> SecretString {
        SecretString::from("a".repeat(64))
    }

    #[test]
    fn accepted_headers() {
        for (name, value) in [
            ("authorization", format!("Bearer {}", "a".repeat(64))),
            ("authorization", format!("bearer {}", "a".repeat(64))),
            ("x-api-key", "a".repeat(64)),
            ("x-airlock-sidecar-auth", "a".repeat(64)),
        ] {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_str(&value).unwrap());
            assert!(is_authorized(&h, &token()), "{name}");
        }
    }

    #[test]
    fn refused_headers() {
        for (name, value) in [
            ("authorization", "a".repeat(64)),
            ("authorization", format!("Basic {}", "a".repeat(64))),
            ("authorization", format!("Bearer {}", "a".repeat(63))),
            ("authorization", format!("Bearer {}b", "a".repeat(63))),
            ("x-api-key", "A".repeat(64)),
            ("x-other", "a".repeat(64)),
        ] {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_str(&value).unwrap());
            assert!(!is_authorized(&h, &token()), "{name}: {value}");
        }
        assert!(!is_authorized(&HeaderMap::new(), &token()));
    }

    #[test]
    fn proxy_headers() {
        use base64::Engine;
        let mut h = HeaderMap::new();
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("run:{}", "a".repeat(64)));
        h.insert(
            "proxy-authorization",
            HeaderValue::from_str(&format!("Basic {basic}")).unwrap(),
        );
        assert!(is_proxy_authorized(&h, &token()));
        h.insert(
            "proxy-authorization",
            HeaderValue::from_str(&format!("Bearer {}", "a".repeat(64))).unwrap(),
        );
        assert!(is_proxy_authorized(&h, &token()));
        h.insert("proxy-authorization", HeaderValue::from_static("Basic !!!"));
        assert!(!is_proxy_authorized(&h, &token()));
        assert!(
            !is_authorized(&h, &token()),
            "the proxy header is not accepted on the API"
        );
    }
}

//! The sidecar token on the wire, one definition for both ends: the
//! in-sandbox runtime (and a local runner's bridge) presents it as
//! [`SidecarAuth`]; the sidecar accepts it in [`SIDECAR_AUTH_HEADER`],
//! [`API_KEY_HEADER`] or `Authorization: Bearer`, and removes those
//! headers before anything is forwarded.

use http::header::{HeaderMap, HeaderName, HeaderValue, InvalidHeaderValue};
use secrecy::{ExposeSecret, SecretString};

/// The header the runtime presents the sidecar token in.
pub const SIDECAR_AUTH_HEADER: &str = "x-airlock-sidecar-auth";
/// The header an agent's model SDK presents a key in (the sidecar token
/// stands in for the model key).
pub const API_KEY_HEADER: &str = "x-api-key";

/// The sidecar token as a request carries it: `x-airlock-sidecar-auth: <token>`.
#[derive(Clone, Copy)]
pub struct SidecarAuth<'a>(pub &'a SecretString);

impl SidecarAuth<'_> {
    pub const HEADER: HeaderName = HeaderName::from_static(SIDECAR_AUTH_HEADER);

    /// The header's value, marked sensitive (no `Debug` of the headers
    /// shows it). An error when the token is not a header value.
    pub fn value(self) -> Result<HeaderValue, InvalidHeaderValue> {
        let mut v = HeaderValue::from_str(self.0.expose_secret())?;
        v.set_sensitive(true);
        Ok(v)
    }

    /// Sets the header on `headers`, replacing any the request carried.
    pub fn set(self, headers: &mut HeaderMap) -> Result<(), InvalidHeaderValue> {
        headers.insert(Self::HEADER, self.value()?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_set_sensitive_and_a_bad_one_refused() {
        let token = SecretString::from("t".repeat(64));
        let mut h = HeaderMap::new();
        h.insert(SIDECAR_AUTH_HEADER, HeaderValue::from_static("agent's"));
        SidecarAuth(&token).set(&mut h).unwrap();
        assert_eq!(h.get_all(SIDECAR_AUTH_HEADER).iter().count(), 1);
        assert_eq!(h[SIDECAR_AUTH_HEADER], "t".repeat(64).as_str());
        assert!(h[SIDECAR_AUTH_HEADER].is_sensitive());
        let bad = SecretString::from("a\nb".to_owned());
        assert!(SidecarAuth(&bad).value().is_err());
    }
}

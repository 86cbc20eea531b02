//! Delivering a credential into a request: the integration's delivery
//! header, a value percent-encoded into a URL (`{{field}}` in a target),
//! and an `inject = "proxy"` placeholder replaced in a header value (also
//! inside the base64 of `Basic`).

use airlock_platform_api::wire::CredentialFields;
use base64::Engine;
use http::header::{HeaderName, HeaderValue};
use secrecy::ExposeSecret;
use secrecy::zeroize::Zeroizing;

use crate::config::Delivery;

/// Percent-encodes everything but RFC 3986 unreserved characters, so a
/// credential value substituted into a URL cannot change its structure.
pub fn percent_encode(v: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if unreserved(b) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        }
    }
    out
}

/// An RFC 3986 unreserved character (kept as it is by [`percent_encode`]).
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

/// Why a credential cannot be delivered as its integration says.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeliveryError {
    #[error("the connection's credential has no field {field:?} for the {header} header")]
    MissingField { field: String, header: String },
    #[error("the credential is not a valid header value")]
    HeaderValue,
}

impl DeliveryError {
    /// The HTTP status an agent sees: the stored credential's fault (502;
    /// the delivery header's name was checked with the configuration).
    pub fn status(&self) -> u16 {
        match self {
            DeliveryError::MissingField { .. } | DeliveryError::HeaderValue => 502,
        }
    }
}

/// The header that carries a connection's credential as the integration's
/// `delivery` says (`api_call` and a remote MCP server's requests alike).
pub fn delivery_header(
    d: &Delivery,
    fields: &CredentialFields,
) -> Result<(HeaderName, HeaderValue), DeliveryError> {
    let name = d.header.http().clone();
    let secret = fields
        .get(d.credential_field())
        .ok_or_else(|| DeliveryError::MissingField {
            field: d.field.clone(),
            header: d.header.to_string(),
        })?;
    let joined = Zeroizing::new(format!("{}{}", d.prefix, secret.expose_secret()));
    let mut value = HeaderValue::from_str(&joined).map_err(|_| DeliveryError::HeaderValue)?;
    // Never shown by a `Debug` of the headers, never indexed by HPACK.
    value.set_sensitive(true);
    Ok((name, value))
}

/// A header value with the secret in it.
pub struct Substituted {
    pub value: HeaderValue,
    /// The base64 made for a `Basic` value: the credential in another form,
    /// for the redactor (an upstream that reflects it gets it redacted).
    pub basic: Option<Zeroizing<String>>,
}

/// Replaces `placeholder` by `secret` in a header value, also inside the
/// base64 of `Basic` credentials. `None` when the value does not hold it.
///
/// Every copy of the secret made on the way is zeroed; the value returned,
/// which carries it, is marked sensitive (no `Debug` shows it).
pub fn substitute(value: &HeaderValue, placeholder: &str, secret: &str) -> Option<Substituted> {
    let text = value.to_str().ok()?;
    let (made, basic) = if text.contains(placeholder) {
        (Zeroizing::new(text.replace(placeholder, secret)), None)
    } else {
        let (scheme, encoded) = text.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let decoded = String::from_utf8(b64.decode(encoded.trim()).ok()?).ok()?;
        if !decoded.contains(placeholder) {
            return None;
        }
        let replaced = Zeroizing::new(decoded.replace(placeholder, secret));
        let encoded = Zeroizing::new(b64.encode(replaced.as_bytes()));
        let made = Zeroizing::new(format!("{scheme} {}", encoded.as_str()));
        (made, Some(encoded))
    };
    let mut value = HeaderValue::from_str(&made).ok()?;
    value.set_sensitive(true);
    Some(Substituted { value, basic })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_replaced_in_plain_and_basic_values_only() {
        let ph = "AIRLOCK_PLACEHOLDER_GH";
        let v = HeaderValue::from_static("Bearer AIRLOCK_PLACEHOLDER_GH");
        let plain = substitute(&v, ph, "s3cret").unwrap();
        assert!(plain.basic.is_none(), "nothing made for the redactor");
        let plain = plain.value;
        assert_eq!(plain, "Bearer s3cret");
        // The value carries the secret: no `Debug` of it shows the secret.
        assert!(plain.is_sensitive());
        assert!(!format!("{plain:?}").contains("s3cret"));
        let b64 = base64::engine::general_purpose::STANDARD;
        let basic = HeaderValue::from_str(&format!(
            "Basic {}",
            b64.encode("x-access-token:AIRLOCK_PLACEHOLDER_GH")
        ))
        .unwrap();
        let Substituted { value: got, basic } = substitute(&basic, ph, "s3cret").unwrap();
        let encoded = got.to_str().unwrap().strip_prefix("Basic ").unwrap();
        assert_eq!(b64.decode(encoded).unwrap(), b"x-access-token:s3cret");
        assert!(got.is_sensitive());
        // The base64 made is handed to the redactor.
        assert_eq!(basic.as_deref().map(String::as_str), Some(encoded));
        for other in [
            "Basic !!!",
            "Bearer nothing",
            "Basic eC1hY2Nlc3MtdG9rZW46b3RoZXI=",
        ] {
            let v = HeaderValue::from_str(other).unwrap();
            assert!(substitute(&v, ph, "s3cret").is_none(), "{other}");
        }
        // A value the secret would make invalid is left alone (None).
        assert!(substitute(&v, ph, "bad\r\nvalue").is_none());
    }

    /// Every byte is encoded as `%XX` with upper-case hex digits, but the
    /// unreserved ones.
    #[test]
    fn percent_encoding_of_every_byte() {
        for b in 0..=u8::MAX {
            let s = String::from_utf8_lossy(&[b]).into_owned();
            let want: String = s
                .bytes()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                        (c as char).to_string()
                    } else {
                        format!("%{c:02X}")
                    }
                })
                .collect();
            assert_eq!(percent_encode(&s), want, "byte {b}");
        }
    }
}

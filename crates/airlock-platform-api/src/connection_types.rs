//! What a stored connection of each type holds: the one type
//! ([`AuthType`]) and the one schema the store, the `/v1` API, the CLI
//! (`airlock connections add` checks and prompts by it), the model relay
//! (it reads the model key from the type's key field), the demo and
//! docs/configuration.md all use. The platform hands a credential out with
//! its type ([`crate::wire::CredentialResponse::auth_type`]), so a reader
//! never guesses a field name.

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// How a connection's credential is presented upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthType {
    /// An API key (a header or a query parameter).
    ApiKey,
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// HTTP basic: `username` and `password`.
    Basic,
    /// OAuth 2 tokens.
    OAuth2,
    /// Any set of fields, used through `{{field}}` placeholders.
    Custom,
}

impl AuthType {
    /// Every type, in the order the CLI lists them.
    pub const ALL: [AuthType; 5] = [
        AuthType::ApiKey,
        AuthType::Bearer,
        AuthType::Basic,
        AuthType::OAuth2,
        AuthType::Custom,
    ];

    /// The one spelling: stored, on the wire, `--type` on the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthType::ApiKey => "api_key",
            AuthType::Bearer => "bearer",
            AuthType::Basic => "basic",
            AuthType::OAuth2 => "oauth2",
            AuthType::Custom => "custom",
        }
    }

    /// Parses the spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The fields a connection of this type holds.
    pub fn schema(self) -> &'static ConnectionType {
        match self {
            AuthType::ApiKey => &CONNECTION_TYPES[0],
            AuthType::Bearer => &CONNECTION_TYPES[1],
            AuthType::Basic => &CONNECTION_TYPES[2],
            AuthType::OAuth2 => &CONNECTION_TYPES[3],
            AuthType::Custom => &CONNECTION_TYPES[4],
        }
    }
}

impl std::fmt::Display for AuthType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for AuthType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for AuthType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        AuthType::parse(&s)
            .ok_or_else(|| de::Error::custom(format!("{s:?} is not a connection type")))
    }
}

/// The fields of one connection type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionType {
    pub auth_type: AuthType,
    /// Fields a connection of this type must have (others may be given too).
    pub required: &'static [&'static str],
    /// The field that holds the secret presented as a key or token: what the
    /// model relay sends to the provider. `None` for types that are not one
    /// key (basic: a pair; custom: any fields through placeholders).
    pub key_field: Option<&'static str>,
    /// Shown in docs/configuration.md after the fields, e.g. `…` for "and any others".
    pub more_fields: bool,
}

/// Every type, in the order the CLI and docs/configuration.md list them.
pub const CONNECTION_TYPES: &[ConnectionType] = &[
    ConnectionType {
        auth_type: AuthType::ApiKey,
        required: &["key"],
        key_field: Some("key"),
        more_fields: false,
    },
    ConnectionType {
        auth_type: AuthType::Bearer,
        required: &["token"],
        key_field: Some("token"),
        more_fields: false,
    },
    ConnectionType {
        auth_type: AuthType::Basic,
        required: &["username", "password"],
        key_field: None,
        more_fields: false,
    },
    ConnectionType {
        auth_type: AuthType::OAuth2,
        required: &["access_token"],
        key_field: Some("access_token"),
        more_fields: true,
    },
    ConnectionType {
        auth_type: AuthType::Custom,
        required: &[],
        key_field: None,
        more_fields: true,
    },
];

impl ConnectionType {
    /// The schema of a type's spelling.
    pub fn named(name: &str) -> Option<&'static ConnectionType> {
        AuthType::parse(name).map(AuthType::schema)
    }

    /// The type's spelling.
    pub fn name(&self) -> &'static str {
        self.auth_type.as_str()
    }

    /// The required fields `has` lacks.
    pub fn missing<'a>(&self, has: impl Fn(&str) -> bool + 'a) -> Vec<&'static str> {
        self.required.iter().copied().filter(|f| !has(f)).collect()
    }
}

/// docs/configuration.md's line listing the types and their fields (a test keeps the
/// doc in step with this schema).
pub fn types_summary() -> String {
    let mut parts = Vec::new();
    for (i, t) in CONNECTION_TYPES.iter().enumerate() {
        let mut fields: Vec<String> = t.required.iter().map(|f| format!("`{f}`")).collect();
        if t.more_fields {
            fields.push(if fields.is_empty() {
                "any fields".to_owned()
            } else {
                "…".to_owned()
            });
        }
        let fields = fields.join(", ");
        let fields = if i == 0 && t.required.len() == 1 {
            format!("field {fields}")
        } else {
            fields
        };
        parts.push(format!("`{}` ({fields})", t.name()));
    }
    let last = parts.pop().unwrap_or_default();
    format!("Types: {}, {last}.", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_field_is_required() {
        for t in CONNECTION_TYPES {
            if let Some(k) = t.key_field {
                assert!(t.required.contains(&k), "{}", t.name());
            }
        }
        assert_eq!(
            ConnectionType::named("api_key").and_then(|t| t.key_field),
            Some("key")
        );
        assert!(ConnectionType::named("nope").is_none());
        // Each type's schema is its own, in the order of `ALL`.
        for (t, schema) in AuthType::ALL.into_iter().zip(CONNECTION_TYPES) {
            assert_eq!(t.schema(), schema);
            assert_eq!(AuthType::parse(t.as_str()), Some(t));
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(json, format!("\"{t}\""));
            assert_eq!(serde_json::from_str::<AuthType>(&json).unwrap(), t);
        }
        assert_eq!(CONNECTION_TYPES.len(), AuthType::ALL.len());
        assert!(serde_json::from_str::<AuthType>("\"o_auth2\"").is_err());
    }

    #[test]
    fn the_summary_line() {
        assert_eq!(
            types_summary(),
            "Types: `api_key` (field `key`), `bearer` (`token`), `basic` (`username`, `password`), \
             `oauth2` (`access_token`, …), `custom` (any fields)."
        );
    }
}

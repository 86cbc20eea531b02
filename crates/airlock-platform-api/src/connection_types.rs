//! What a stored connection of each type holds: the one schema the CLI
//! (`airlock connections add` checks and prompts by it), the model relay (it
//! reads the model key from the type's key field), the demo and docs/configuration.md
//! all use. The platform hands a credential out with its type
//! ([`crate::wire::CredentialResponse::auth_type`]), so a reader never guesses
//! a field name.

/// The fields of one connection type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionType {
    /// The stored spelling (`--type` on the CLI, `auth_type` on the wire).
    pub name: &'static str,
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
        name: "api_key",
        required: &["key"],
        key_field: Some("key"),
        more_fields: false,
    },
    ConnectionType {
        name: "bearer",
        required: &["token"],
        key_field: Some("token"),
        more_fields: false,
    },
    ConnectionType {
        name: "basic",
        required: &["username", "password"],
        key_field: None,
        more_fields: false,
    },
    ConnectionType {
        name: "oauth2",
        required: &["access_token"],
        key_field: Some("access_token"),
        more_fields: true,
    },
    ConnectionType {
        name: "custom",
        required: &[],
        key_field: None,
        more_fields: true,
    },
];

impl ConnectionType {
    /// The schema of a stored type name.
    pub fn named(name: &str) -> Option<&'static ConnectionType> {
        CONNECTION_TYPES.iter().find(|t| t.name == name)
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
        parts.push(format!("`{}` ({fields})", t.name));
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
                assert!(t.required.contains(&k), "{}", t.name);
            }
        }
        assert_eq!(
            ConnectionType::named("api_key").and_then(|t| t.key_field),
            Some("key")
        );
        assert!(ConnectionType::named("nope").is_none());
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

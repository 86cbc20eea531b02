//! The catalog file (`docs/model-catalog.md`): strict JSON, version
//! [`CATALOG_SCHEMA_VERSION`]. A file is read whole or refused whole: an
//! unknown key, a duplicate model, a bad id or price refuses the file.

use airlock_platform_api::types::Provider;
use serde::{Deserialize, Serialize};

/// The version of the catalog file this Airlock reads.
pub const CATALOG_SCHEMA_VERSION: u32 = 1;
/// Largest catalog file read (and largest signature file).
pub const MAX_CATALOG_BYTES: usize = 256 << 10;
/// Most models a catalog may list (each is handed to every run of its
/// provider with its prices).
pub const MAX_CATALOG_MODELS: usize = 1000;
/// Longest model id.
pub const MAX_MODEL_ID_BYTES: usize = 128;
/// Highest price per million tokens (USD): a typo, not a price.
pub const MAX_PRICE_PER_MTOK_USD: f64 = 1e6;

/// One model an organization may bind with its own credentials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogModel {
    pub provider: Provider,
    /// The model's id as its provider names it in a request's `model`.
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_in_per_mtok_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_out_per_mtok_usd: Option<f64>,
}

/// An accepted catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    pub schema_version: u32,
    /// Strictly higher in each newer file: a lower one is a rollback.
    pub serial: u64,
    pub models: Vec<CatalogModel>,
}

/// Why a catalog file is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FormatError {
    #[error("the file is {len} bytes, above the cap of {MAX_CATALOG_BYTES}")]
    TooLarge { len: usize },
    #[error("not a catalog file: {0}")]
    Json(String),
    #[error("schema_version {0} is not supported (this Airlock reads {CATALOG_SCHEMA_VERSION})")]
    SchemaVersion(u32),
    #[error("serial must be at least 1")]
    SerialZero,
    #[error("{0} models, above the cap of {MAX_CATALOG_MODELS}")]
    TooManyModels(usize),
    #[error("models[{index}].id {id:?}: {why}")]
    ModelId {
        index: usize,
        id: String,
        why: &'static str,
    },
    #[error("models[{index}].{key} must be a number from 0 to {MAX_PRICE_PER_MTOK_USD}")]
    Price { index: usize, key: &'static str },
    #[error("models[{index}]: {provider} model {id:?} is listed twice")]
    Duplicate {
        index: usize,
        provider: &'static str,
        id: String,
    },
}

fn check_id(id: &str) -> Result<(), &'static str> {
    if id.is_empty() || id.len() > MAX_MODEL_ID_BYTES {
        return Err("must be 1 to 128 bytes");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._:/@".contains(&b))
    {
        return Err("may hold only ASCII letters, digits and - . _ : / @");
    }
    Ok(())
}

impl Catalog {
    /// Parses and checks a catalog file (its signature is checked before:
    /// only a signed file is parsed).
    pub fn parse(bytes: &[u8]) -> Result<Catalog, FormatError> {
        if bytes.len() > MAX_CATALOG_BYTES {
            return Err(FormatError::TooLarge { len: bytes.len() });
        }
        // From the text: a key given twice is refused ("duplicate field").
        let c: Catalog = serde_json::from_slice(bytes).map_err(|e| {
            #[derive(Deserialize)]
            struct Version {
                schema_version: u32,
            }
            match serde_json::from_slice::<Version>(bytes) {
                Ok(v) if v.schema_version != CATALOG_SCHEMA_VERSION => {
                    FormatError::SchemaVersion(v.schema_version)
                }
                _ => FormatError::Json(e.to_string()),
            }
        })?;
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), FormatError> {
        if self.schema_version != CATALOG_SCHEMA_VERSION {
            return Err(FormatError::SchemaVersion(self.schema_version));
        }
        if self.serial == 0 {
            return Err(FormatError::SerialZero);
        }
        if self.models.len() > MAX_CATALOG_MODELS {
            return Err(FormatError::TooManyModels(self.models.len()));
        }
        let mut seen = std::collections::HashSet::new();
        for (index, m) in self.models.iter().enumerate() {
            check_id(&m.id).map_err(|why| FormatError::ModelId {
                index,
                id: m.id.clone(),
                why,
            })?;
            for (key, p) in [
                ("price_in_per_mtok_usd", m.price_in_per_mtok_usd),
                ("price_out_per_mtok_usd", m.price_out_per_mtok_usd),
            ] {
                if p.is_some_and(|p| {
                    !(p.is_finite() && (0.0..=MAX_PRICE_PER_MTOK_USD).contains(&p))
                }) {
                    return Err(FormatError::Price { index, key });
                }
            }
            if !seen.insert((m.provider.as_str(), m.id.as_str())) {
                return Err(FormatError::Duplicate {
                    index,
                    provider: m.provider.as_str(),
                    id: m.id.clone(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Catalog, FormatError> {
        Catalog::parse(s.as_bytes())
    }

    #[test]
    fn a_strict_file_is_read() {
        let c = parse(
            r#"{"schema_version": 1, "serial": 7, "models": [
                {"provider": "anthropic", "id": "claude-new-2027", "price_in_per_mtok_usd": 3, "price_out_per_mtok_usd": 15},
                {"provider": "openai", "id": "gpt-next"}]}"#,
        )
        .unwrap();
        assert_eq!(c.serial, 7);
        assert_eq!(c.models[0].price_out_per_mtok_usd, Some(15.0));
        assert_eq!(c.models[1].price_in_per_mtok_usd, None);
    }

    #[test]
    fn malformed_files_are_refused_whole() {
        let m =
            |models: &str| format!(r#"{{"schema_version": 1, "serial": 1, "models": [{models}]}}"#);
        for (text, want) in [
            ("[]".to_owned(), "Json"),
            (
                r#"{"schema_version": 2, "serial": 1, "models": [], "new": 1}"#.to_owned(),
                "SchemaVersion",
            ),
            (
                r#"{"schema_version": 1, "serial": 0, "models": []}"#.to_owned(),
                "SerialZero",
            ),
            (
                r#"{"schema_version": 1, "serial": 1, "serial": 2, "models": []}"#.to_owned(),
                "Json",
            ),
            (
                r#"{"schema_version": 1, "serial": 1, "models": [], "extra": true}"#.to_owned(),
                "Json",
            ),
            (
                m(r#"{"provider": "anthropic", "id": "x", "context": 5}"#),
                "Json",
            ),
            (m(r#"{"provider": "mistral", "id": "x"}"#), "Json"),
            (m(r#"{"provider": "openai", "id": ""}"#), "ModelId"),
            (m(r#"{"provider": "openai", "id": "a b"}"#), "ModelId"),
            (
                m(r#"{"provider": "openai", "id": "x", "price_in_per_mtok_usd": -1}"#),
                "Price",
            ),
            (
                m(r#"{"provider": "openai", "id": "x", "price_out_per_mtok_usd": 1e9}"#),
                "Price",
            ),
            (
                m(r#"{"provider": "openai", "id": "x"}, {"provider": "openai", "id": "x"}"#),
                "Duplicate",
            ),
        ] {
            let e = parse(&text).unwrap_err();
            assert!(format!("{e:?}").starts_with(want), "{text}: {e:?}");
        }
        let big = format!(
            r#"{{"schema_version": 1, "serial": 1, "models": [], "pad": "{}"}}"#,
            "x".repeat(MAX_CATALOG_BYTES)
        );
        assert!(matches!(parse(&big), Err(FormatError::TooLarge { .. })));
        let many = m(&(0..=MAX_CATALOG_MODELS)
            .map(|i| format!(r#"{{"provider": "openai", "id": "m{i}"}}"#))
            .collect::<Vec<_>>()
            .join(","));
        assert!(matches!(parse(&many), Err(FormatError::TooManyModels(_))));
    }
}

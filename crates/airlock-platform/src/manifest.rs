//! The agent manifest (`airlock.toml`, DESIGN.md §7).

use std::path::Path;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub agent: Agent,
    #[serde(default)]
    pub model: Option<ModelSection>,
    #[serde(default)]
    pub network: Option<NetworkSection>,
    #[serde(default)]
    pub integrations: Vec<IntegrationSection>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    pub name: String,
    pub command: Vec<String>,
    /// Seconds.
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub memory_mb: Option<u64>,
    #[serde(default)]
    pub cpus: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub provider: String,
    pub base_url: String,
    pub connection: String,
    #[serde(default)]
    pub price_in_per_mtok_usd: Option<f64>,
    #[serde(default)]
    pub price_out_per_mtok_usd: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    pub egress: serde_json::Value,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Delivery {
    pub header: String,
    #[serde(default)]
    pub prefix: String,
    pub field: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntegrationSection {
    pub namespace: String,
    #[serde(default)]
    pub connection: Option<String>,
    #[serde(default)]
    pub authorized_uris: Vec<String>,
    #[serde(default)]
    pub allow_all_uris: bool,
    #[serde(default)]
    pub delivery: Option<Delivery>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a valid manifest: {message}")]
    Parse { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl Manifest {
    pub fn load(path: &Path) -> Result<Manifest, ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let m: Manifest = toml::from_str(&text).map_err(|e| ManifestError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        m.validate()?;
        Ok(m)
    }

    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.agent.command.is_empty() {
            return Err(ManifestError::Invalid("agent.command is empty".into()));
        }
        if let Some(m) = &self.model
            && m.provider != "openai"
            && m.provider != "anthropic"
        {
            return Err(ManifestError::Invalid(format!(
                "model.provider {:?} is not openai or anthropic",
                m.provider
            )));
        }
        Ok(())
    }
}

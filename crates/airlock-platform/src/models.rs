//! The model registry: the one place the platform knows models and their
//! prices. It is the bundled list ([`bundled`]) and, above it, the live
//! catalog last accepted ([`crate::catalog`]), held in memory only.
//!
//! Contracts:
//! - the catalog only adds: a catalog model with the provider and id of a
//!   bundled one is ignored, the bundled entry serves;
//! - a catalog replaces the current one only with a strictly higher serial
//!   ([`ModelRegistry::offer`]): an older or equal file never rolls back;
//! - a run receives its provider's prices from here
//!   ([`ModelRegistry::prices_for`]); the manifest's own price still wins in
//!   the relay's metering.

use std::sync::Arc;

use tokio::sync::watch;

use airlock_platform_api::launch::ModelPrice;
use airlock_platform_api::types::Provider;

use crate::catalog::{Catalog, CatalogModel};

/// The models Airlock ships. Empty: a manifest names its provider, its
/// `base_url` and its prices itself, so Airlock carries no model list of
/// its own to go stale; the live catalog is the only source of more.
pub fn bundled() -> Vec<CatalogModel> {
    Vec::new()
}

/// The outcome of offering a catalog ([`ModelRegistry::offer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// It replaced the current catalog (or was the first).
    Accepted { serial: u64 },
    /// The current catalog has this serial already.
    Unchanged { serial: u64 },
}

/// A catalog whose serial is lower than the current one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("serial {offered} is lower than the current catalog's {current} (no rollback)")]
pub struct Rollback {
    pub offered: u64,
    pub current: u64,
}

/// Bundled models and the live catalog. Cheap to share ([`Arc`]).
#[derive(Debug)]
pub struct ModelRegistry {
    bundled: Vec<CatalogModel>,
    /// The accepted catalog; its watchers are told of each replacement.
    live: watch::Sender<Option<Arc<Catalog>>>,
}

impl Default for ModelRegistry {
    fn default() -> Self {
        ModelRegistry::new()
    }
}

impl ModelRegistry {
    /// The registry of [`bundled`] models, with no catalog yet.
    pub fn new() -> ModelRegistry {
        ModelRegistry::with_bundled(bundled())
    }

    pub fn with_bundled(bundled: Vec<CatalogModel>) -> ModelRegistry {
        ModelRegistry {
            bundled,
            live: watch::Sender::new(None),
        }
    }

    fn live(&self) -> Option<Arc<Catalog>> {
        self.live.borrow().clone()
    }

    /// Told whenever a catalog is accepted.
    pub fn watch(&self) -> watch::Receiver<Option<Arc<Catalog>>> {
        self.live.subscribe()
    }

    /// The accepted catalog's serial, if one was accepted.
    pub fn serial(&self) -> Option<u64> {
        self.live().map(|c| c.serial)
    }

    /// Makes `catalog` (verified and parsed) the live one if its serial is
    /// strictly higher than the current one's.
    pub fn offer(&self, catalog: Catalog) -> Result<Offer, Rollback> {
        let offered = catalog.serial;
        let mut outcome = Ok(Offer::Accepted { serial: offered });
        self.live
            .send_if_modified(|live| match live.as_ref().map(|c| c.serial) {
                Some(current) if offered < current => {
                    outcome = Err(Rollback { offered, current });
                    false
                }
                Some(current) if offered == current => {
                    outcome = Ok(Offer::Unchanged { serial: current });
                    false
                }
                _ => {
                    *live = Some(Arc::new(catalog));
                    true
                }
            });
        outcome
    }

    /// Every model known: the bundled ones, then the catalog's that do not
    /// share a provider and id with a bundled one.
    pub fn models(&self) -> Vec<CatalogModel> {
        let live = self.live();
        let added = live.iter().flat_map(|c| c.models.iter()).filter(|m| {
            !self
                .bundled
                .iter()
                .any(|b| b.provider == m.provider && b.id == m.id)
        });
        self.bundled.iter().chain(added).cloned().collect()
    }

    /// The prices of `provider`'s models that name one, for a run's relay.
    pub fn prices_for(&self, provider: Provider) -> Vec<ModelPrice> {
        self.models()
            .into_iter()
            .filter(|m| m.provider == provider)
            .filter(|m| m.price_in_per_mtok_usd.is_some() || m.price_out_per_mtok_usd.is_some())
            .map(|m| ModelPrice {
                model: m.id,
                price_in_per_mtok_usd: m.price_in_per_mtok_usd,
                price_out_per_mtok_usd: m.price_out_per_mtok_usd,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::CATALOG_SCHEMA_VERSION;

    fn model(provider: Provider, id: &str, price: f64) -> CatalogModel {
        CatalogModel {
            provider,
            id: id.into(),
            price_in_per_mtok_usd: Some(price),
            price_out_per_mtok_usd: None,
        }
    }

    fn catalog(serial: u64, models: Vec<CatalogModel>) -> Catalog {
        Catalog {
            schema_version: CATALOG_SCHEMA_VERSION,
            serial,
            models,
        }
    }

    #[test]
    fn only_a_strictly_higher_serial_replaces_the_catalog() {
        let r = ModelRegistry::new();
        assert_eq!(r.serial(), None);
        assert_eq!(
            r.offer(catalog(5, vec![])),
            Ok(Offer::Accepted { serial: 5 })
        );
        assert_eq!(
            r.offer(catalog(5, vec![model(Provider::Openai, "x", 1.0)])),
            Ok(Offer::Unchanged { serial: 5 })
        );
        assert_eq!(
            r.offer(catalog(4, vec![])),
            Err(Rollback {
                offered: 4,
                current: 5
            })
        );
        assert!(r.models().is_empty());
        assert_eq!(
            r.offer(catalog(6, vec![model(Provider::Openai, "x", 1.0)])),
            Ok(Offer::Accepted { serial: 6 })
        );
        assert_eq!(r.models().len(), 1);
    }

    #[test]
    fn the_catalog_adds_models_and_never_overrides_a_bundled_one() {
        let r = ModelRegistry::with_bundled(vec![model(Provider::Anthropic, "built-in", 3.0)]);
        r.offer(catalog(
            1,
            vec![
                model(Provider::Anthropic, "built-in", 0.0),
                model(Provider::Anthropic, "new", 2.0),
                model(Provider::Openai, "other", 1.0),
            ],
        ))
        .unwrap();
        let prices = r.prices_for(Provider::Anthropic);
        assert_eq!(
            prices
                .iter()
                .map(|p| (p.model.as_str(), p.price_in_per_mtok_usd))
                .collect::<Vec<_>>(),
            [("built-in", Some(3.0)), ("new", Some(2.0))]
        );
        assert_eq!(r.prices_for(Provider::Openai).len(), 1);
    }
}

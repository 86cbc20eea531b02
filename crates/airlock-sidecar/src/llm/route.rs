//! The path table: which agent paths the relay serves for each provider
//! ([`route`]), and the upstream URL each maps to ([`Upstream::url_for`];
//! the table is in the module docs of [`super`]). Any other path or method
//! is not relayed.

use airlock_egress::AuthorizedUris;
use http::Method;

use super::provider_fetch;
use crate::config::{Model, Provider};

/// The run's model provider, as the relay reaches it.
pub(super) struct Upstream {
    pub(super) provider: Provider,
    /// `base_url` without a trailing `/` (and, for anthropic, without `/v1`).
    base: String,
    /// One literal pattern: `base/**`.
    pub(super) authorized: AuthorizedUris,
    /// The manifest's prices: when it names one, every call is priced so.
    manifest_price: Price,
    /// The model registry's prices by model id, for a manifest that names none.
    known_prices: foldhash::HashMap<String, Price>,
    /// What the provider may be asked to reach ([`provider_fetch`]).
    pub(super) fetch: provider_fetch::ProviderFetchPolicy,
}

impl Upstream {
    pub(super) fn new(m: &Model) -> Upstream {
        let mut base = m.base_url.trim_end_matches('/').to_owned();
        if m.provider == Provider::Anthropic
            && let Some(root) = base.strip_suffix("/v1")
        {
            base = root.to_owned();
        }
        let authorized = AuthorizedUris::parse(&[format!("{base}/**")]);
        for d in authorized
            .diagnostics()
            .iter()
            .filter(|d| d.matches_nothing)
        {
            tracing::warn!(entry = %d.entry, "model.base_url cannot be authorized: {}", d.reason);
        }
        Upstream {
            provider: m.provider,
            base,
            authorized,
            manifest_price: Price {
                input: m.price_in_per_mtok_usd,
                output: m.price_out_per_mtok_usd,
            },
            known_prices: m
                .known_prices
                .iter()
                .map(|p| {
                    let price = Price {
                        input: p.price_in_per_mtok_usd,
                        output: p.price_out_per_mtok_usd,
                    };
                    (p.model.clone(), price)
                })
                .collect(),
            fetch: provider_fetch::ProviderFetchPolicy::new(
                &m.provider_tools,
                &m.provider_fetch_uris,
            ),
        }
    }

    /// The price of a call to `model` (the request's `model`): the
    /// manifest's when it names one (it wins), else the registry's entry
    /// for that model, else none (the call is unpriced).
    pub(super) fn price_for(&self, model: Option<&str>) -> Price {
        if self.manifest_price.is_known() {
            return self.manifest_price;
        }
        model
            .and_then(|m| self.known_prices.get(m))
            .copied()
            .unwrap_or_default()
    }

    /// The upstream URL for an allowed agent path (see the module docs).
    pub(super) fn url_for(&self, path: &str, query: Option<&str>) -> String {
        let rest = match self.provider {
            Provider::Openai => path.strip_prefix("/v1").unwrap_or(path),
            Provider::Anthropic => path,
        };
        match query {
            Some(q) => format!("{}{rest}?{q}", self.base),
            None => format!("{}{rest}", self.base),
        }
    }
}

/// Prices per million tokens (USD), input and output.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Price {
    pub(super) input: Option<f64>,
    pub(super) output: Option<f64>,
}

impl Price {
    /// At least one of the two is named: the call's cost is kept.
    pub(super) fn is_known(self) -> bool {
        self.input.is_some() || self.output.is_some()
    }
}

pub(super) fn provider_name(p: Provider) -> &'static str {
    match p {
        Provider::Openai => "openai",
        Provider::Anthropic => "anthropic",
    }
}

/// What an allowed path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    /// A generation call: metered, becomes a cost event.
    Metered { chat_stream_usage: bool },
    /// Listing models, counting tokens: relayed, not metered.
    Plain,
}

/// What `method path` is for `provider`, if the relay serves it.
pub(super) fn route(provider: Provider, method: &Method, path: &str) -> Option<Endpoint> {
    let model_path = path == "/v1/models"
        || path.strip_prefix("/v1/models/").is_some_and(|id| {
            !id.is_empty()
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._:@".contains(&b))
        });
    if *method == Method::GET {
        return model_path.then_some(Endpoint::Plain);
    }
    if *method != Method::POST {
        return None;
    }
    match (provider, path) {
        (Provider::Openai, "/v1/chat/completions" | "/v1/completions") => Some(Endpoint::Metered {
            chat_stream_usage: true,
        }),
        (Provider::Openai, "/v1/responses" | "/v1/embeddings") => Some(Endpoint::Metered {
            chat_stream_usage: false,
        }),
        (Provider::Anthropic, "/v1/messages") => Some(Endpoint::Metered {
            chat_stream_usage: false,
        }),
        (Provider::Anthropic, "/v1/messages/count_tokens") => Some(Endpoint::Plain),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_upstream_urls() {
        let m = |provider, base: &str| Model {
            provider,
            base_url: base.into(),
            price_in_per_mtok_usd: None,
            price_out_per_mtok_usd: None,
            provider_tools: vec![],
            provider_fetch_uris: vec![],
            known_prices: vec![],
        };
        let o = Upstream::new(&m(Provider::Openai, "https://api.openai.com/v1/"));
        assert_eq!(
            o.url_for("/v1/chat/completions", None),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            o.url_for("/v1/models", Some("limit=2")),
            "https://api.openai.com/v1/models?limit=2"
        );
        let a = Upstream::new(&m(Provider::Anthropic, "https://api.anthropic.com"));
        assert_eq!(
            a.url_for("/v1/messages", Some("beta=true")),
            "https://api.anthropic.com/v1/messages?beta=true"
        );
        let a2 = Upstream::new(&m(Provider::Anthropic, "https://api.anthropic.com/v1"));
        assert_eq!(
            a2.url_for("/v1/messages", None),
            "https://api.anthropic.com/v1/messages"
        );

        let mut priced = m(Provider::Openai, "https://api.openai.com/v1/");
        priced.known_prices = vec![airlock_platform_api::launch::ModelPrice {
            model: "gpt-cat".into(),
            price_in_per_mtok_usd: Some(2.0),
            price_out_per_mtok_usd: Some(8.0),
        }];
        let known = Price {
            input: Some(2.0),
            output: Some(8.0),
        };
        assert_eq!(Upstream::new(&priced).price_for(Some("gpt-cat")), known);
        assert_eq!(
            Upstream::new(&priced).price_for(Some("other")),
            Price::default()
        );
        assert_eq!(Upstream::new(&priced).price_for(None), Price::default());
        // The manifest's price wins over the registry's.
        priced.price_out_per_mtok_usd = Some(1.0);
        assert_eq!(
            Upstream::new(&priced).price_for(Some("gpt-cat")),
            Price {
                input: None,
                output: Some(1.0)
            }
        );

        let post = Method::POST;
        assert!(matches!(
            route(Provider::Openai, &post, "/v1/chat/completions"),
            Some(Endpoint::Metered {
                chat_stream_usage: true
            })
        ));
        assert!(matches!(
            route(Provider::Openai, &post, "/v1/responses"),
            Some(Endpoint::Metered {
                chat_stream_usage: false
            })
        ));
        assert_eq!(
            route(Provider::Openai, &Method::GET, "/v1/models"),
            Some(Endpoint::Plain)
        );
        assert_eq!(
            route(Provider::Openai, &Method::GET, "/v1/models/gpt-4o"),
            Some(Endpoint::Plain)
        );
        assert!(matches!(
            route(Provider::Anthropic, &post, "/v1/messages"),
            Some(Endpoint::Metered { .. })
        ));
        assert_eq!(
            route(Provider::Anthropic, &post, "/v1/messages/count_tokens"),
            Some(Endpoint::Plain)
        );
        for (p, method, path) in [
            (Provider::Openai, &post, "/v1/messages"),
            (Provider::Anthropic, &post, "/v1/chat/completions"),
            (Provider::Openai, &post, "/v1/files"),
            (Provider::Openai, &Method::DELETE, "/v1/models/x"),
            (Provider::Openai, &Method::GET, "/v1/models/../../admin"),
            (Provider::Openai, &Method::GET, "/v1/models/"),
            (Provider::Openai, &post, "/chat/completions"),
            (Provider::Openai, &post, "/v1/chat/completions/"),
        ] {
            assert_eq!(route(p, method, path), None, "{method} {path}");
        }
    }
}

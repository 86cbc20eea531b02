//! `/llm/…`: the model relay.
//!
//! The agent's SDK talks to the sidecar as if it were the provider; the
//! relay swaps the agent's placeholder key for the real one (from the
//! platform, held between calls for at most a minute: see [`key`]),
//! sends the call through the
//! egress guard, passes the answer back as it arrives (server-sent events are
//! never buffered), and meters the tokens it reports, here, where the agent
//! cannot forge them. Each call becomes an egress record (`source: "llm"`)
//! and, for a successful generation call, a cost event.
//!
//! # Paths
//!
//! The agent uses `base_url = http://…/llm/v1` (OpenAI SDKs) or
//! `http://…/llm` (Anthropic SDKs); either way the relay sees `/v1/…`, which
//! is mapped the way each provider's own SDK maps it onto `model.base_url`:
//!
//! | provider | agent path | upstream URL |
//! |---|---|---|
//! | openai | `/v1/chat/completions`, `/v1/responses`, `/v1/completions`, `/v1/embeddings`, `GET /v1/models[/{id}]` | `base_url` + the path without `/v1` (`https://api.openai.com/v1` + `/chat/completions`) |
//! | anthropic | `/v1/messages`, `/v1/messages/count_tokens`, `GET /v1/models[/{id}]` | `base_url` + the path (`https://api.anthropic.com` + `/v1/messages`; a `base_url` ending in `/v1` is taken as its root) |
//!
//! The query string is kept. Any other path or method is 404: the relay is
//! an inference relay, not a way to reach the rest of the provider's API
//! with the operator's key.
//!
//! # Headers
//!
//! Towards the provider only `content-type`, `accept`, `user-agent`,
//! `anthropic-version`, `anthropic-beta`, `openai-beta` and
//! `idempotency-key` are taken from the agent; `Authorization` and
//! `x-api-key` (which hold the sidecar token or a placeholder) never are.
//! The key goes out as `Authorization: Bearer` (openai) or `x-api-key`
//! (anthropic), with `accept-encoding: identity` so the stream can be
//! metered. Back towards the agent only a safe list is kept (content type,
//! request ids, rate-limit and retry headers); never `set-cookie` or
//! anything that authenticates.
//!
//! # Redaction
//!
//! The provider holds the key, so a provider (or a proxy in front of it)
//! can reflect it. Every answer, its kept headers included, passes through
//! the redactor of the model connection's values, built by the run's
//! [`crate::credential::Credentials`] once per set of values as for every
//! integration ([`key::ModelKey`]): a stream event by event (each event
//! goes out whole as soon as it ends), any other answer through a
//! [`crate::credential::StreamRedactor`]. The meter reads the provider's
//! bytes as they came; the agent gets them redacted. An answer encoded in a
//! way the relay cannot read is withheld (502 `unredactable_response`).
//!
//! # Metering
//!
//! From `usage` in JSON answers (`prompt_tokens`/`completion_tokens`,
//! `input_tokens`/`output_tokens`; Anthropic's cache read/creation tokens
//! count as input), and from SSE streams: OpenAI chat streams are asked for
//! `stream_options.include_usage` and, when the client had not asked for it,
//! the extra usage-only chunk is dropped before it reaches the client; the
//! Responses API reports usage in `response.completed`; Anthropic in
//! `message_start` and the last `message_delta`. The stream is split into
//! events incrementally (across chunk edges) while its bytes are forwarded
//! unchanged. A client that disconnects early does not escape metering: the
//! rest of the upstream answer is read in the background and metered.
//!
//! # Errors
//!
//! JSON in a shape both SDKs parse: `{"type":"error","error":{"type","code","message"}}`.
//! No model configured or no model credential: 503. Guard refusal: 403
//! `type: "blocked"` with the egress code. Upstream failure or a redirect
//! from the provider (never followed): 502. Request body over
//! `limits.max_request_bytes`: 413.
//!
//! # Where each decision is
//!
//! - [`route`]: which agent paths are relayed, and the upstream URL of each;
//! - [`request_body`]: the request body as sent upstream (usage asked for);
//! - [`provider_fetch`]: what a request asks the provider to reach;
//! - [`key`]: the model key, fetched from the platform and held;
//! - [`headers`]: the headers sent upstream and those passed back;
//! - [`relay`]: one call, step by step, from the agent's request to the
//!   answer's head;
//! - [`answer`]: one answer as it passes: metered by its format and
//!   redacted, then its egress record and cost event;
//! - [`sse`], [`event`], [`json_usage`]: reading a stream's events, an
//!   event's usage, and a whole JSON answer's usage as it streams;
//! - [`meter`]: usage, and what it costs;
//! - [`budget`]: the run's and its organization's budgets: a call's
//!   reservation before it leaves, settled against its usage;
//! - [`body`]: the body handed to the agent;
//! - [`error`]: the relay's own error answers.

use std::sync::Arc;

use axum::Router;

mod answer;
mod body;
mod budget;
mod error;
mod event;
mod headers;
mod json_usage;
mod key;
mod meter;
mod provider_fetch;
mod relay;
mod request_body;
mod route;
mod sse;
#[doc(hidden)]
pub mod twins;

pub use key::MODEL_KEY_HOLD;

use crate::state::Sidecar;

/// The relay's state: the run's sidecar, its model's upstream (none: no
/// model is configured), and the held model key.
struct Llm {
    sidecar: Arc<Sidecar>,
    upstream: Option<route::Upstream>,
    key: key::HeldKey,
    /// The run's model budgets (none: no budget applies).
    budgets: Option<Arc<budget::Budgets>>,
}

pub fn router(sidecar: Arc<Sidecar>) -> Router {
    let upstream = sidecar.model.as_ref().map(route::Upstream::new);
    // Budgets apply to a run with a model only; each call is priced at
    // its own model's price (`Upstream::price_for`).
    let budgets = upstream
        .as_ref()
        .and_then(|_| budget::Budgets::new(&sidecar.budget, &sidecar.platform));
    Router::new()
        .fallback(relay::relay)
        .with_state(Arc::new(Llm {
            sidecar,
            upstream,
            key: key::HeldKey::default(),
            budgets,
        }))
}

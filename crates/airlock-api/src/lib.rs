//! The contract of `airlock serve`'s HTTP API: [`v1`] holds every request
//! and answer body of `/v1` (and of `/healthz`, `/readyz`), each a serde type
//! that also derives its OpenAPI schema. The server builds its answers from
//! these types, the CLI's client reads them into these types, and the
//! OpenAPI document (`GET /v1/openapi.json`) is derived from them: the three
//! cannot disagree.

#![forbid(unsafe_code)]

pub mod audit;
pub mod ocsf;
pub mod report;
pub mod v1;
pub mod webhook;

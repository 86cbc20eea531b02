//! The workload identity issuer's discovery (`/.well-known/openid-configuration`)
//! and its keys (`/.well-known/jwks.json`): public, unauthenticated, as
//! OpenID Connect Discovery has them, so a cloud's STS can verify the
//! identity tokens this instance's runs carry. Every key of the keyring is
//! published, the signing one first: a token signed before a rotation still
//! verifies while the old key stays configured.

use airlock_api::v1;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::AppState;

/// Where the keys are, under the issuer URL.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";

/// The claims every token carries.
const CLAIMS: [&str; 10] = [
    "iss", "sub", "aud", "iat", "nbf", "exp", "jti", "org", "agent", "run_id",
];

fn no_issuer() -> Response {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found",
        "this server issues no workload identity",
    )
    .into_response()
}

/// The issuer's OpenID Connect discovery document.
#[utoipa::path(
    get,
    path = "/.well-known/openid-configuration",
    operation_id = "get_openid_configuration",
    tag = "identity",
    responses(
        (status = 200, description = "the issuer of the runs' identity tokens", body = v1::OpenIdConfiguration),
        (status = 404, description = "this server issues no workload identity", body = v1::Error),
    ),
)]
pub async fn openid_configuration(State(app): State<AppState>) -> Response {
    let Some(issuer) = app.orch().api.issuer() else {
        return no_issuer();
    };
    let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
    axum::Json(v1::OpenIdConfiguration {
        issuer: issuer.url().to_owned(),
        jwks_uri: format!("{}{JWKS_PATH}", issuer.url()),
        response_types_supported: strings(&["id_token"]),
        subject_types_supported: strings(&["public"]),
        id_token_signing_alg_values_supported: strings(&[airlock_vault::IDENTITY_ALG]),
        claims_supported: strings(&CLAIMS),
    })
    .into_response()
}

/// The issuer's public keys, the signing one first.
#[utoipa::path(
    get,
    path = "/.well-known/jwks.json",
    operation_id = "get_jwks",
    tag = "identity",
    responses(
        (status = 200, description = "the keys that verify the runs' identity tokens", body = v1::Jwks),
        (status = 404, description = "this server issues no workload identity", body = v1::Error),
    ),
)]
pub async fn jwks(State(app): State<AppState>) -> Response {
    let Some(issuer) = app.orch().api.issuer() else {
        return no_issuer();
    };
    let keys = issuer
        .keys()
        .public_keys()
        .map(|k| v1::Jwk {
            kty: "EC".to_owned(),
            crv: "P-256".to_owned(),
            x: k.x.clone(),
            y: k.y.clone(),
            kid: k.kid.clone(),
            key_use: "sig".to_owned(),
            alg: airlock_vault::IDENTITY_ALG.to_owned(),
        })
        .collect();
    axum::Json(v1::Jwks { keys }).into_response()
}

//! Bearer-token authentication: the token's SHA-256 is compared with the
//! tenants' stored hashes (tokens are never stored in clear).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::error::{ApiError, ErrorCode};
use crate::state::{AppState, TenantState};

/// Lower-case hex of SHA-256.
pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Equality that does not stop at the first differing byte.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The token of an `Authorization` value in the `Bearer` scheme. The
/// scheme name is case-insensitive (RFC 7235 section 2.1): `bearer x` is
/// `Bearer x`. It is followed by at least one space; the token is what
/// remains, without leading and trailing whitespace, and is compared
/// exactly.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim_start().split_once(' ')?;
    let token = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The tenant the request authenticates as (the anonymous tenant when the
/// server has none configured: loopback only, checked at start-up). The
/// tenant's name is recorded on the current span (the request's).
pub fn tenant<'a>(
    state: &'a AppState,
    headers: &HeaderMap,
) -> Result<&'a Arc<TenantState>, ApiError> {
    let found = authenticate(state, headers)?;
    tracing::Span::current().record("tenant", found.tenant.name.as_str());
    Ok(found)
}

fn authenticate<'a>(
    state: &'a AppState,
    headers: &HeaderMap,
) -> Result<&'a Arc<TenantState>, ApiError> {
    if state.anonymous() {
        return state
            .tenants
            .first()
            .ok_or_else(|| ApiError::internal("no tenant"));
    }
    let value = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::AuthMissing,
                "send `Authorization: Bearer <token>`",
            )
        })?;
    let token = bearer_token(value).ok_or_else(|| {
        ApiError::new(
            ErrorCode::AuthInvalid,
            "the Authorization header must be `Bearer <token>`",
        )
    })?;
    let hash = sha256_hex(token.as_bytes());
    state
        .tenants
        .iter()
        .find(|t| same(&t.tenant.token_sha256, &hash))
        .ok_or_else(|| ApiError::new(ErrorCode::AuthUnknownToken, "unknown token"))
}

/// Extractor: the authenticated tenant of a request, or the 401 answer.
#[derive(Clone)]
pub struct Authed(pub Arc<TenantState>);

impl FromRequestParts<Arc<AppState>> for Authed {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Authed, ApiError> {
        tenant(state, &parts.headers).map(|t| Authed(t.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_and_compares() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_the_token_exact() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER  AbC "), Some("AbC"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearerabc"), None);
        assert_eq!(bearer_token("Bearer "), None);
    }
}

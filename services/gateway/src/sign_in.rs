//! What a browser page needs to sign in and to recover when its token stops working, without the token ever
//! being in a URL a proxy or the browser console logs:
//!
//! - the token carried in the WebSocket handshake's `Sec-WebSocket-Protocol` header, as the offered
//!   subprotocol `ahp-relay.bearer.<token>` next to [`WEB_SUBPROTOCOL`], which the relay selects (a browser
//!   cannot set `Authorization` on a WebSocket);
//! - `GET /v1/auth/check` (token in `Authorization: Bearer`): the page cannot read the HTTP status of a refused
//!   upgrade, so after a failed connection it asks here why — 200 with who the token names, or 401/403 with the
//!   reason;
//! - `GET /v1/web-config`: where the page sends a user to sign in (`--sign-in-url`), if anywhere.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use relay_core::link::HostLink;
use serde::Deserialize;

use crate::state::GatewayState;

/// The subprotocol the relay selects when a page offers its token in `Sec-WebSocket-Protocol`.
pub const WEB_SUBPROTOCOL: &str = "ahp.v1";

/// The prefix of the offered subprotocol that carries the token.
const BEARER_SUBPROTOCOL_PREFIX: &str = "ahp-relay.bearer.";

/// The token a page offered as a subprotocol, if any.
pub fn token_from_subprotocols(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|protocol| protocol.trim().strip_prefix(BEARER_SUBPROTOCOL_PREFIX))
        .filter(|token| !token.is_empty())
        .map(str::to_string)
}

/// The token of `Authorization: Bearer …`.
pub fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))?;
    Some(token.trim().to_string())
}

pub use crate::state::WebSignIn;

/// `GET /v1/web-config`.
pub async fn web_config<L: HostLink>(State(state): State<Arc<GatewayState<L>>>) -> Response {
    Json(serde_json::json!({ "signInUrl": state.web_sign_in.sign_in_url })).into_response()
}

#[derive(Deserialize)]
pub struct CheckQuery {
    host: Option<String>,
}

/// `GET /v1/auth/check[?host=…]`: whether the bearer token opens a connection (to `host`), and if not why —
/// the same token and host rules, in the same order, as the upgrade ([`crate::server`]). Never cached.
pub async fn check<L: HostLink>(
    State(state): State<Arc<GatewayState<L>>>,
    headers: HeaderMap,
    Query(query): Query<CheckQuery>,
) -> Response {
    let mut response = match admit(&state, &headers, query.host.as_deref().unwrap_or("default")).await {
        Ok(claims) => Json(serde_json::json!({
            "subject": claims.sub,
            "tenant": claims.tid,
            "role": claims.role,
            "expiresAt": claims.exp,
        }))
        .into_response(),
        Err(refusal) => refusal,
    };
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    response
}

/// The claims of the bearer token if it may open `host`, else the refusal the upgrade would get.
async fn admit<L: HostLink>(
    state: &GatewayState<L>,
    headers: &HeaderMap,
    host: &str,
) -> Result<crate::auth::Claims, Response> {
    let token = bearer(headers).ok_or_else(|| refuse(StatusCode::UNAUTHORIZED, "no access token"))?;
    let claims = state
        .verifier
        .verify(&token)
        .await
        .map_err(|error| refuse(StatusCode::UNAUTHORIZED, &error.to_string()))?;
    if !crate::state::valid_host_name(host) {
        return Err(refuse(StatusCode::NOT_FOUND, "invalid host name"));
    }
    if !claims.allows_host(host) {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "the token does not grant this host",
        ));
    }
    Ok(claims)
}

/// An error response the page shows as it is.
pub fn refuse(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn the_token_is_taken_from_the_offered_subprotocols() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("ahp.v1, ahp-relay.bearer.a.b-c_d"),
        );
        assert_eq!(token_from_subprotocols(&headers).as_deref(), Some("a.b-c_d"));
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static("ahp.v1"));
        assert_eq!(token_from_subprotocols(&headers), None);
        headers.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("ahp-relay.bearer."),
        );
        assert_eq!(token_from_subprotocols(&headers), None);
    }
}

//! The HTTP surface: `GET /v1/ws`, `GET /v1/hosts/{host}/ws`, `GET /healthz` (the process is up), `GET /readyz`
//! (it is not draining and its shard side answers), `GET /metrics` (this process's Prometheus metrics), and the
//! web client at `GET /` and `GET /assets/{name}` ([`crate::web`]). A WebSocket upgrade at `/` opens the
//! default host, like `/v1/ws`.
//!
//! The token is checked before the upgrade, from `Authorization: Bearer`, the offered subprotocol
//! `ahp-relay.bearer.<token>` (what the web page sends, [`crate::sign_in`]), `?access_token=` or `?tkn=` (what VS
//! Code appends): a missing, malformed, wrongly signed or expired token gets HTTP 401 and never reaches AHP. A
//! browser page whose `Origin` is not allowed gets HTTP 403 ([`crate::origin`]). The host of a connection is the path's host (or `default`) inside the token's
//! tenant, so a token can only ever address its own tenant's hosts (invariant 7).

use std::sync::Arc;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use relay_core::link::HostLink;
use relay_core::HostKey;
use serde::Deserialize;

use crate::auth::AuthError;
use crate::connection::Connection;
use crate::sign_in::{bearer, refuse, token_from_subprotocols, WEB_SUBPROTOCOL};
pub use crate::state::{valid_host_name, GatewayState};

/// A connection's WebSocket read buffer, and the most one read takes from the socket. Client frames are small
/// commands; a large one still arrives whole (the buffer grows to the frame's length, read in steps of this).
/// The buffer lives as long as the connection, so it is the biggest part of an idle connection's memory:
/// 1 KiB instead of 4 KiB took an idle initialized connection from 10.8 to 7.8 KiB (`scripts/bench idle`).
const READ_BUFFER_BYTES: usize = 1024;

/// Frames are gathered up to this many bytes before a write to the socket (a batch is then flushed once).
const WRITE_BUFFER_BYTES: usize = 4 * 1024;

/// The gateway's routes. Those that take a token throttle an address's failed authentications
/// ([`crate::auth_throttle`]; serve with `into_make_service_with_connect_info::<SocketAddr>` so that the peer's
/// address is known).
pub fn router<L: HostLink>(state: Arc<GatewayState<L>>) -> Router {
    let failures = crate::auth_throttle::AuthFailures::new(Default::default());
    Router::new()
        .route("/v1/ws", get(default_host_ws::<L>))
        .route("/v1/hosts/{host}/ws", get(named_host_ws::<L>))
        .route("/v1/auth/check", get(crate::sign_in::check::<L>))
        .route_layer(crate::auth_throttle::AuthThrottleLayer::new(
            failures,
            state.trusted_proxies.clone(),
        ))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz::<L>))
        .route("/v1/web-config", get(crate::sign_in::web_config::<L>))
        .route("/metrics", get(metrics::<L>))
        .route("/", get(root::<L>))
        .route("/assets/{name}", get(crate::web::asset))
        .with_state(state)
}

/// The Prometheus text exposition format.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long `/readyz` waits for the shard side before answering 503.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

async fn metrics<L: HostLink>(State(state): State<Arc<GatewayState<L>>>) -> Response {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        state.link.metrics().await,
    )
        .into_response()
}

/// 200 while the gateway takes connections and its shard side answers; 503 once it drains (SIGTERM) or when
/// the shard side does not answer in time.
async fn readyz<L: HostLink>(State(state): State<Arc<GatewayState<L>>>) -> Response {
    if *state.shutdown.borrow() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    match tokio::time::timeout(READY_TIMEOUT, state.link.ready()).await {
        Ok(Ok(())) => (StatusCode::OK, "ready").into_response(),
        Ok(Err(why)) => (StatusCode::SERVICE_UNAVAILABLE, why.to_string()).into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the shard did not answer in time",
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
struct TokenQuery {
    access_token: Option<String>,
    /// VS Code's name for the connection token.
    tkn: Option<String>,
}

async fn default_host_ws<L: HostLink>(
    State(state): State<Arc<GatewayState<L>>>,
    headers: HeaderMap,
    Query(query): Query<TokenQuery>,
    upgrade: WebSocketUpgrade,
) -> Response {
    open(state, "default".into(), &headers, query, upgrade).await
}

async fn named_host_ws<L: HostLink>(
    State(state): State<Arc<GatewayState<L>>>,
    Path(host): Path<String>,
    headers: HeaderMap,
    Query(query): Query<TokenQuery>,
    upgrade: WebSocketUpgrade,
) -> Response {
    open(state, host, &headers, query, upgrade).await
}

/// `GET /`: a WebSocket upgrade opens the default host (so a client given only `host:port`, as VS Code's
/// remote agent host setting often is, connects); anything else gets the web client's page.
async fn root<L: HostLink>(
    State(state): State<Arc<GatewayState<L>>>,
    request: axum::extract::Request,
) -> Response {
    let (mut parts, _body) = request.into_parts();
    let wants_websocket = parts
        .headers
        .get(header::UPGRADE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.eq_ignore_ascii_case("websocket"));
    if !wants_websocket {
        return crate::web::index().await;
    }
    let query = match Query::<TokenQuery>::from_request_parts(&mut parts, &state).await {
        Ok(Query(query)) => query,
        Err(rejection) => return rejection.into_response(),
    };
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &state).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    open(state, "default".into(), &parts.headers, query, upgrade).await
}

async fn open<L: HostLink>(
    state: Arc<GatewayState<L>>,
    host: String,
    headers: &HeaderMap,
    query: TokenQuery,
    upgrade: WebSocketUpgrade,
) -> Response {
    if !state.allowed_origins.admits(headers) {
        return refuse(
            StatusCode::FORBIDDEN,
            "this page's origin may not connect (see --allowed-origins)",
        );
    }
    let token = match bearer(headers)
        .or_else(|| token_from_subprotocols(headers))
        .or(query.access_token)
        .or(query.tkn)
    {
        Some(token) => token,
        None => return refuse(StatusCode::UNAUTHORIZED, &AuthError::Missing.to_string()),
    };
    let claims = match state.verifier.verify(&token).await {
        Ok(claims) => claims,
        Err(error) => return refuse(StatusCode::UNAUTHORIZED, &error.to_string()),
    };
    if !valid_host_name(&host) {
        return refuse(StatusCode::NOT_FOUND, "invalid host name");
    }
    if !claims.allows_host(&host) {
        return refuse(StatusCode::FORBIDDEN, "the token does not grant this host");
    }
    let viewer = claims.role == relay_core::Role::Viewer;
    let Some(permit) = state.quotas.admit_everywhere(&claims.tid, viewer).await else {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "the tenant has its maximum of open connections",
        );
    };
    let connection = Connection {
        link: state.link.clone(),
        host: HostKey::new(claims.tid.clone(), host),
        identity: claims.identity(),
        limits: state.limits.clone(),
        clock: state.clock.clone(),
        fanout: state.fanout.clone(),
        quotas: state.quotas.clone(),
        permit,
        token_expires_at: std::time::UNIX_EPOCH + std::time::Duration::from_secs(claims.exp),
    };
    upgrade
        .protocols([WEB_SUBPROTOCOL])
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(WRITE_BUFFER_BYTES)
        .max_message_size(state.limits.max_frame_bytes)
        .max_frame_size(state.limits.max_frame_bytes)
        .on_upgrade(move |socket| connection.run(socket))
}

#[cfg(test)]
mod tests {
    use super::valid_host_name;

    #[test]
    fn host_names_are_dns_labels() {
        assert!(valid_host_name("default"));
        assert!(valid_host_name("team-2"));
        assert!(!valid_host_name(""));
        assert!(!valid_host_name("-x"));
        assert!(!valid_host_name("Upper"));
        assert!(!valid_host_name("a/b"));
        assert!(!valid_host_name(&"a".repeat(64)));
    }
}

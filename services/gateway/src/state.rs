//! What every route of the gateway shares ([`GatewayState`]: its host link, token checker, limits and quotas,
//! what the web page is told about signing in) and the rule for host names: the floor the routes
//! ([`crate::server`], [`crate::sign_in`]) stand on. It holds configuration only: nothing here handles a
//! request or names a route.

use std::sync::Arc;

use relay_core::Limits;

use crate::auth::TokenVerifier;
use crate::origin::AllowedOrigins;
use crate::quotas::TenantQuotas;

/// What the gateway is configured with.
pub struct GatewayState<L> {
    pub link: Arc<L>,
    pub verifier: TokenVerifier,
    /// Shared by every connection (one copy, not one per connection's task).
    pub limits: Arc<Limits>,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// Every connection's pings, token expiry and shutdown, on one timer wheel
    /// ([`crate::clock::ConnectionClock::start`] with `limits.ping_interval` and `shutdown`).
    pub clock: crate::clock::ConnectionClock,
    /// The lanes that write every host's batches into its connections' sockets.
    pub fanout: crate::fanout::Fanout,
    /// Per-tenant connection and message quotas.
    pub quotas: Arc<TenantQuotas>,
    /// Web pages (besides the relay's own) that may open WebSockets.
    pub allowed_origins: AllowedOrigins,
    /// Where the web page sends a user to sign in.
    pub web_sign_in: WebSignIn,
    /// Proxies whose `X-Forwarded-For` names the client (for the per-address throttle).
    pub trusted_proxies: crate::auth_throttle::TrustedProxies,
}

/// What the page is told about signing in.
#[derive(Clone, Debug, Default)]
pub struct WebSignIn {
    /// Where a user signs in (an identity provider's login that returns to the page with `#access_token=…`);
    /// the page replaces `{return}` in it by its address and `{state}` by a one-time value it then requires back.
    pub sign_in_url: Option<String>,
}

/// Host names: 1–63 lowercase letters, digits and dashes, starting with a letter or digit.
pub fn valid_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

//! Failed authentications, throttled per client address ([`AuthThrottleLayer`]): a client that presents bad
//! tokens (to the WebSocket upgrade or `/v1/auth/check`) spends a small burst, then one attempt every few
//! seconds; past that it gets `429 Too Many Requests` without its token being looked at. Good tokens cost
//! nothing, and one address's failures never slow another's. The address is the TCP peer's (the relay's
//! listener records it) — unless the peer is a proxy the operator trusts (`--trusted-proxies`), whose
//! `X-Forwarded-For` then names the client: the rightmost address in it that is not a trusted proxy's
//! ([`TrustedProxies::client_of`]; what a client wrote itself further left is never believed).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode};
use axum::response::IntoResponse;
use futures_util::future::BoxFuture;
use parking_lot::Mutex;

use crate::quotas::TokenBucket;

/// The proxies in front of the gateway whose `X-Forwarded-For` is believed; none by default.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<ipnet::IpNet>);

/// A trusted proxy that is neither an address nor a network.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not an IP address or network (e.g. 10.0.0.0/8, 192.0.2.7)")]
pub struct NotANetwork(String);

impl TrustedProxies {
    /// From addresses and networks (`10.0.0.0/8`, `192.0.2.7`, `fd00::/8`).
    pub fn parse(items: &[String]) -> Result<TrustedProxies, NotANetwork> {
        items
            .iter()
            .map(|item| item.trim())
            .filter(|item| !item.is_empty())
            .map(|item| {
                item.parse::<ipnet::IpNet>()
                    .or_else(|_| item.parse::<IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| NotANetwork(item.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(TrustedProxies)
    }

    fn trusts(&self, address: &IpAddr) -> bool {
        self.0.iter().any(|network| network.contains(address))
    }

    /// The client behind `peer`: `peer` itself unless it is a trusted proxy; then, walking `X-Forwarded-For`
    /// from the right (each proxy appends the address it received from), the first address that is not a
    /// trusted proxy's. Anything unparsable ends the walk at the last address believed.
    pub fn client_of(&self, peer: IpAddr, headers: &axum::http::HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.trusts(&peer) {
            return peer;
        }
        // Bytes, not text: one byte a client wrote that is not ASCII must not hide what the proxies appended.
        let forwarded: Vec<&[u8]> = headers
            .get_all("x-forwarded-for")
            .iter()
            .flat_map(|value| value.as_bytes().split(|byte| *byte == b','))
            .collect();
        let mut client = peer;
        for hop in forwarded.iter().rev() {
            match forwarded_address(hop) {
                Some(address) => {
                    client = address;
                    if !self.trusts(&address) {
                        break;
                    }
                }
                None => break,
            }
        }
        client
    }
}

/// One `X-Forwarded-For` entry: an address, or an address with a port (`192.0.2.1:4711`, `[2001:db8::1]:4711`),
/// IPv4-mapped IPv6 taken as the IPv4 address it maps.
fn forwarded_address(hop: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(hop).ok()?.trim();
    text.parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<SocketAddr>().ok().map(|socket| socket.ip()))
        .or_else(|| {
            text.strip_prefix('[')
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|inner| inner.parse::<IpAddr>().ok())
        })
        .map(|address| address.to_canonical())
}

/// Addresses tracked before those that refilled are forgotten at the next failure of a new one.
const PRUNE_AT: usize = 4096;

/// Failures per address: the burst, and the rate after it.
#[derive(Debug, Clone, Copy)]
pub struct AuthThrottleLimits {
    pub burst: f64,
    pub per_second: f64,
}

impl Default for AuthThrottleLimits {
    fn default() -> Self {
        Self {
            burst: 20.0,
            per_second: 0.2,
        }
    }
}

/// The failures of every address that failed lately.
#[derive(Debug)]
pub struct AuthFailures {
    limits: AuthThrottleLimits,
    by_address: Mutex<HashMap<IpAddr, TokenBucket>>,
}

impl AuthFailures {
    pub fn new(limits: AuthThrottleLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            by_address: Mutex::new(HashMap::new()),
        })
    }

    /// Take one attempt of `address` before it is made (so attempts made at once are all counted): `false`
    /// when it has none left. An attempt that did not fail is given back ([`AuthFailures::succeeded`]).
    pub fn attempt(&self, address: IpAddr) -> bool {
        let mut by_address = self.by_address.lock();
        if by_address.len() >= PRUNE_AT && !by_address.contains_key(&address) {
            by_address.retain(|_, bucket| !bucket.is_full());
        }
        let bucket = by_address
            .entry(address)
            .or_insert_with(|| TokenBucket::new(self.limits.per_second, self.limits.burst));
        if bucket.deficit() > self.limits.burst - 1.0 {
            return false;
        }
        bucket.take();
        true
    }

    /// An attempt of `address` did not fail: its token goes back.
    pub fn succeeded(&self, address: IpAddr) {
        if let Some(bucket) = self.by_address.lock().get_mut(&address) {
            bucket.take_n(-1.0);
        }
    }
}

/// A `tower` layer that throttles the failed authentications of the routes it wraps.
#[derive(Clone)]
pub struct AuthThrottleLayer {
    failures: Arc<AuthFailures>,
    proxies: Arc<TrustedProxies>,
}

impl AuthThrottleLayer {
    pub fn new(failures: Arc<AuthFailures>, proxies: TrustedProxies) -> Self {
        Self {
            failures,
            proxies: Arc::new(proxies),
        }
    }
}

impl<S> tower::Layer<S> for AuthThrottleLayer {
    type Service = AuthThrottle<S>;
    fn layer(&self, inner: S) -> Self::Service {
        AuthThrottle {
            inner,
            failures: self.failures.clone(),
            proxies: self.proxies.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AuthThrottle<S> {
    inner: S,
    failures: Arc<AuthFailures>,
    proxies: Arc<TrustedProxies>,
}

impl<S, B> tower::Service<Request<B>> for AuthThrottle<S>
where
    S: tower::Service<Request<B>, Response = Response<axum::body::Body>> + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<axum::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let address = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| self.proxies.client_of(peer.ip(), request.headers()));
        if let Some(address) = address {
            if !self.failures.attempt(address) {
                return Box::pin(async move {
                    Ok((
                        StatusCode::TOO_MANY_REQUESTS,
                        [(axum::http::header::RETRY_AFTER, "5")],
                        "too many failed authentications from this address: wait and retry",
                    )
                        .into_response())
                });
            }
        }
        let failures = self.failures.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            if let Some(address) = address {
                if response.status() != StatusCode::UNAUTHORIZED {
                    failures.succeeded(address);
                }
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarded(values: &[&str]) -> axum::http::HeaderMap {
        let mut headers = axum::http::HeaderMap::new();
        for value in values {
            headers.append("x-forwarded-for", value.parse().expect("a header value"));
        }
        headers
    }

    #[test]
    fn behind_a_trusted_proxy_the_client_is_the_rightmost_untrusted_forwarded_address() {
        let proxies = TrustedProxies::parse(&["10.0.0.0/8".into(), "192.0.2.7".into()]).expect("networks");
        let proxy = IpAddr::from([10, 1, 2, 3]);
        let client = IpAddr::from([198, 51, 100, 9]);
        // A client's own header further left is not believed.
        let headers = forwarded(&["6.6.6.6, 198.51.100.9", "192.0.2.7"]);
        assert_eq!(proxies.client_of(proxy, &headers), client);
        // An untrusted peer is the client, whatever it forwards.
        let stranger = IpAddr::from([203, 0, 113, 5]);
        assert_eq!(proxies.client_of(stranger, &headers), stranger);
        // A trusted proxy that forwards nothing (or garbage) is taken at its word: itself, or the last believed.
        assert_eq!(proxies.client_of(proxy, &forwarded(&[])), proxy);
        assert_eq!(
            proxies.client_of(proxy, &forwarded(&["junk, 192.0.2.7"])),
            IpAddr::from([192, 0, 2, 7])
        );
        assert!(TrustedProxies::parse(&["not-a-network".into()]).is_err());
        // A byte that is not ASCII in what the client wrote does not hide what the proxy appended; ports and
        // IPv4-mapped addresses are read as the addresses they carry.
        let mut headers = axum::http::HeaderMap::new();
        headers.append(
            "x-forwarded-for",
            axum::http::HeaderValue::from_bytes(b"caf\xc3\xa9, 198.51.100.9:4711").expect("bytes"),
        );
        assert_eq!(proxies.client_of(proxy, &headers), client);
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().expect("mapped");
        assert_eq!(
            proxies.client_of(mapped, &forwarded(&["[::ffff:198.51.100.9]:80"])),
            client
        );
        // None trusted (the default): always the peer.
        assert_eq!(TrustedProxies::default().client_of(proxy, &headers), proxy);
    }

    #[test]
    fn an_address_gets_a_burst_of_failures_then_waits_and_others_are_untouched() {
        let failures = AuthFailures::new(AuthThrottleLimits {
            burst: 5.0,
            per_second: 0.001,
        });
        let (bad, good) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        for _ in 0..5 {
            assert!(failures.attempt(bad), "within the burst");
        }
        assert!(!failures.attempt(bad), "past the burst");
        assert!(failures.attempt(good), "another address is not slowed");
        // Attempts that succeed give their token back: a busy good client is never throttled.
        for _ in 0..50 {
            assert!(failures.attempt(good));
            failures.succeeded(good);
        }
    }
}

//! Host placement for gateways in front of several shards: [`ShardRouter`], a [`HostLink`] over one
//! [`RemoteShard`] per shard.
//!
//! A host lives on whichever shard holds its lease in the store (see `relay_shard::ownership`); shards
//! take a free or lapsed lease when first asked for the host. The router decides whom to ask first: the
//! shard it last saw serving the host, else the configured shards in rendezvous-hash order of the host (so
//! hosts spread over the shards and every gateway asks the same one first). A shard that does not serve the
//! host answers with the owner's URL (the router follows it, also to shards it was not configured with) or
//! is unavailable (dead, draining: the router tries the next one). Until some shard serves the host — a
//! dead owner's lease must lapse first — the router retries with backoff, for at most
//! [`ATTACH_PATIENCE`]. Once attached, a connection stays on its shard: `call` and `detach` go there. When
//! the shard stops serving the host its bus closes, the gateway closes the connection with a resumable code,
//! and the client's next connection is placed afresh.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use relay_core::bus::BusReceiver;
use relay_core::link::{CommandReply, HostLink, LinkError, NotReady};
use relay_core::rpc::InboundMessage;
use relay_core::{ConnectionId, HostKey, Identity};

use crate::client::{ClientError, RemoteShard};

/// How long an attach keeps looking for the host's shard: longer than a lease lasts, so a dead owner's
/// hosts are found on their next shard.
pub const ATTACH_PATIENCE: Duration = Duration::from_secs(15);

/// Redirects followed in a row before the router backs off (owners changing under it).
const MAX_REDIRECTS: usize = 4;

/// How a [`RemoteShard`] is made for a shard URL.
#[derive(Clone)]
struct ShardSettings {
    bus_capacity: usize,
    redis_url: Option<String>,
    credential: crate::InternalCredential,
    tls: crate::LinkTls,
    signer: Option<Arc<crate::AssertionSigner>>,
}

/// A [`HostLink`] that places each host on one of several shards and follows ownership as it moves.
pub struct ShardRouter {
    /// The configured shards, in the order given.
    shards: Vec<String>,
    settings: ShardSettings,
    /// A link per shard URL seen (configured, or learned from a redirect).
    links: Mutex<HashMap<String, Arc<RemoteShard>>>,
    /// The shard last seen serving each host.
    routes: Mutex<HashMap<HostKey, String>>,
    /// The shard each attached connection is on.
    attached: Mutex<HashMap<(HostKey, ConnectionId), Arc<RemoteShard>>>,
}

impl ShardRouter {
    /// A router over the shards at `shards` (gRPC URLs; at least one), each reached lazily. With
    /// `redis_url`, hosts are followed over Redis (see [`RemoteShard::with_redis`]); `https://` shards are called
    /// over TLS as `tls` says. Must be created inside a Tokio runtime when `redis_url` is set.
    pub fn new(
        shards: &[String],
        bus_capacity: usize,
        redis_url: Option<&str>,
        credential: crate::InternalCredential,
        tls: crate::LinkTls,
        signer: Option<Arc<crate::AssertionSigner>>,
    ) -> Result<Self, ClientError> {
        let router = Self {
            shards: shards.to_vec(),
            settings: ShardSettings {
                bus_capacity,
                redis_url: redis_url.map(str::to_string),
                credential,
                tls,
                signer,
            },
            links: Mutex::new(HashMap::new()),
            routes: Mutex::new(HashMap::new()),
            attached: Mutex::new(HashMap::new()),
        };
        // Fail fast on a bad URL rather than at the first attach.
        for url in shards {
            router.link(url)?;
        }
        Ok(router)
    }

    /// The link to the shard at `url`, made on first use.
    fn link(&self, url: &str) -> Result<Arc<RemoteShard>, ClientError> {
        if let Some(link) = self.links.lock().get(url) {
            return Ok(link.clone());
        }
        let mut link = RemoteShard::connect_lazy_with(
            url,
            self.settings.bus_capacity,
            self.settings.credential.clone(),
            &self.settings.tls,
        )?
        .with_signer(self.settings.signer.clone());
        if let Some(redis) = &self.settings.redis_url {
            link = link.with_redis(redis)?;
        }
        let link = Arc::new(link);
        Ok(self.links.lock().entry(url.to_string()).or_insert(link).clone())
    }

    /// The shards to ask for `host`, in order: the last one seen serving it, then the configured shards by
    /// rendezvous hash (highest first).
    fn candidates(&self, host: &HostKey) -> Vec<String> {
        let mut ranked: Vec<(u64, &String)> = self.shards.iter().map(|url| (rank(host, url), url)).collect();
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let mut order: Vec<String> = Vec::with_capacity(ranked.len() + 1);
        if let Some(known) = self.routes.lock().get(host) {
            order.push(known.clone());
        }
        for (_, url) in ranked {
            if !order.contains(url) {
                order.push(url.clone());
            }
        }
        order
    }

    /// Attach on the shard at `url`, following up to [`MAX_REDIRECTS`] redirects.
    async fn attach_from(
        &self,
        url: &str,
        host: &HostKey,
        connection: ConnectionId,
        identity: &Identity,
    ) -> Result<BusReceiver, LinkError> {
        let mut url = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let link = self.link(&url).map_err(|error| {
                tracing::warn!(%url, %error, "cannot reach a shard");
                LinkError::HostUnavailable(host.to_string())
            })?;
            match link.attach(host, connection, identity).await {
                Ok(bus) => {
                    self.routes.lock().insert(host.clone(), url);
                    self.attached.lock().insert((host.clone(), connection), link);
                    return Ok(bus);
                }
                Err(LinkError::Moved { owner, .. }) if owner != url => {
                    relay_core::telemetry::redirect_followed();
                    tracing::debug!(host = %host, from = %url, to = %owner, "following a redirect");
                    url = owner;
                }
                Err(error) => return Err(error),
            }
        }
        Err(LinkError::HostUnavailable(host.to_string()))
    }
}

/// The rendezvous (highest random weight) score of `url` for `host`: stable across processes.
fn rank(host: &HostKey, url: &str) -> u64 {
    // FNV-1a: fixed, so every gateway ranks the same way (std's hasher is randomly seeded per process).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in host
        .tenant
        .bytes()
        .chain([0])
        .chain(host.host.bytes())
        .chain([0])
        .chain(url.bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

impl HostLink for ShardRouter {
    async fn attach(
        &self,
        host: &HostKey,
        connection: ConnectionId,
        identity: &Identity,
    ) -> Result<BusReceiver, LinkError> {
        let deadline = tokio::time::Instant::now() + ATTACH_PATIENCE;
        let mut backoff = Duration::from_millis(50);
        loop {
            for url in self.candidates(host) {
                match self.attach_from(&url, host, connection, identity).await {
                    Ok(bus) => return Ok(bus),
                    Err(error @ LinkError::OverQuota(_)) => return Err(error),
                    Err(error) => {
                        tracing::debug!(host = %host, %url, %error, "shard did not take the host");
                        if self.routes.lock().get(host) == Some(&url) {
                            self.routes.lock().remove(host);
                        }
                    }
                }
            }
            if tokio::time::Instant::now() + backoff > deadline {
                tracing::warn!(host = %host, "no shard serves the host");
                return Err(LinkError::HostUnavailable(host.to_string()));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    async fn call(&self, host: &HostKey, connection: ConnectionId, message: InboundMessage) -> CommandReply {
        let link = self.attached.lock().get(&(host.clone(), connection)).cloned();
        match link {
            Some(link) => link.call(host, connection, message).await,
            // Not attached (e.g. the attach raced a move): the client reconnects.
            None => CommandReply::moved(message.id),
        }
    }

    async fn detach(&self, host: &HostKey, connection: ConnectionId) {
        let link = self.attached.lock().remove(&(host.clone(), connection));
        if let Some(link) = link {
            link.detach(host, connection).await;
        }
    }

    async fn metrics(&self) -> String {
        relay_core::telemetry::render()
    }

    /// Ready when any configured shard answers: hosts of the others are found through redirects or move.
    async fn ready(&self) -> Result<(), NotReady> {
        let links: Vec<Arc<RemoteShard>> = {
            let links = self.links.lock();
            self.shards
                .iter()
                .filter_map(|url| links.get(url).cloned())
                .collect()
        };
        let mut why = NotReady("no shard is configured".into());
        for link in links {
            match link.ready().await {
                Ok(()) => return Ok(()),
                Err(error) => why = error,
            }
        }
        Err(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_spreads_hosts_and_is_stable() {
        let shards = ["http://a:1".to_string(), "http://b:1".to_string()];
        let top = |host: &HostKey| {
            shards
                .iter()
                .max_by_key(|url| rank(host, url))
                .cloned()
                .expect("a shard")
        };
        let mut on_a = 0;
        for n in 0..200 {
            let host = HostKey::new("t", format!("h{n}"));
            assert_eq!(top(&host), top(&host));
            if top(&host) == shards[0] {
                on_a += 1;
            }
        }
        assert!(
            (60..=140).contains(&on_a),
            "{on_a} of 200 hosts on one of two shards"
        );
    }
}

//! The in-process [`HostLink`]: the embedded relay's gateway calls its hosts directly. The same hosts serve
//! the gRPC shard, which also reads published ranges back ([`ShardLink::fetch_range`]) for gateways repairing
//! gaps in the Redis bus.

use std::collections::HashMap;
use std::sync::Arc;

use relay_bus::RedisPublisher;
use relay_core::bus::{BusEvent, SharedBusEvent};
use relay_core::link::{CommandReply, HostLink, LinkError, NotReady};
use relay_core::rpc::InboundMessage;
use relay_core::{ConnectionId, HostKey, Identity, Limits};
use relay_runner::ProviderRegistry;
use relay_store::Store;
use tokio::sync::broadcast;

use crate::error::ShardError;
use crate::host::Host;

/// The hosts of this process, opened from the store on first use.
pub struct ShardLink {
    /// Open hosts; looked up on every message, so a plain (never awaited) lock.
    hosts: parking_lot::Mutex<HashMap<HostKey, Arc<Host>>>,
    /// Serializes opening hosts, so one host is never opened twice.
    opening: tokio::sync::Mutex<()>,
    limits: Limits,
    providers: ProviderRegistry,
    store: Store,
    /// When set, every host also publishes its bus to Redis.
    redis: Option<RedisPublisher>,
}

impl ShardLink {
    pub fn new(
        limits: Limits,
        providers: ProviderRegistry,
        store: Store,
        redis: Option<RedisPublisher>,
    ) -> Self {
        Self {
            redis,
            hosts: parking_lot::Mutex::new(HashMap::new()),
            opening: tokio::sync::Mutex::new(()),
            limits,
            providers,
            store,
        }
    }

    /// The host for `key`, opening it on first use.
    pub async fn host(&self, key: &HostKey) -> Result<Arc<Host>, LinkError> {
        if let Some(host) = self.existing(key) {
            return Ok(host);
        }
        let _opening = self.opening.lock().await;
        if let Some(host) = self.existing(key) {
            return Ok(host);
        }
        let host = Host::open(
            key.clone(),
            self.limits.clone(),
            self.providers.clone(),
            self.store.clone(),
            self.redis.clone(),
        )
        .await
        .map_err(|error| {
            tracing::error!(host = %key, %error, "could not open host");
            LinkError::HostUnavailable(key.to_string())
        })?;
        self.hosts.lock().insert(key.clone(), host.clone());
        Ok(host)
    }

    /// The published action events of `key` with `after < seq <= through` (see [`Host::fetch_range`]).
    pub async fn fetch_range(
        &self,
        key: &HostKey,
        after: u64,
        through: u64,
    ) -> Result<Vec<BusEvent>, ShardError> {
        self.host(key).await?.fetch_range(after, through).await
    }

    /// The `serverSeq` of the last action `key` published, opening the host if needed.
    pub async fn published_seq(&self, key: &HostKey) -> Result<u64, LinkError> {
        Ok(self.host(key).await?.published_seq())
    }

    fn existing(&self, key: &HostKey) -> Option<Arc<Host>> {
        self.hosts.lock().get(key).cloned()
    }

    /// Commit everything every open host has queued (graceful shutdown).
    pub async fn flush_all(&self) {
        let hosts: Vec<Arc<Host>> = self.hosts.lock().values().cloned().collect();
        for host in hosts {
            host.flush().await;
        }
    }

    /// Delete log rows older than the retention period (keeping every channel restorable).
    pub async fn compact(&self) -> Result<u64, relay_store::StoreError> {
        let cutoff = jiff::Timestamp::now().as_millisecond()
            - i64::try_from(self.limits.retention.as_millis()).unwrap_or(i64::MAX);
        self.store.compact(cutoff).await
    }
}

impl HostLink for ShardLink {
    async fn attach(
        &self,
        host: &HostKey,
        connection: ConnectionId,
        identity: &Identity,
    ) -> Result<broadcast::Receiver<SharedBusEvent>, LinkError> {
        Ok(self.host(host).await?.attach(connection, identity.clone()))
    }

    async fn call(&self, host: &HostKey, connection: ConnectionId, message: InboundMessage) -> CommandReply {
        match self.existing(host) {
            Some(h) => h.call(connection, message).await,
            None => CommandReply::none(),
        }
    }

    async fn detach(&self, host: &HostKey, connection: ConnectionId) {
        if let Some(h) = self.existing(host) {
            h.detach(connection);
        }
    }

    async fn metrics(&self) -> String {
        let hosts: Vec<Arc<Host>> = self.hosts.lock().values().cloned().collect();
        let (mut sessions, mut chats) = (0usize, 0usize);
        for host in &hosts {
            let (s, c) = host.loaded_counts();
            sessions += s;
            chats += c;
        }
        relay_core::telemetry::set_loaded(relay_core::telemetry::Loaded {
            hosts: hosts.len(),
            sessions,
            chats,
        });
        relay_core::telemetry::render()
    }

    async fn ready(&self) -> Result<(), NotReady> {
        crate::health::store_ready(&self.store).await
    }
}

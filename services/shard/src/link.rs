//! The in-process [`HostLink`]: the embedded relay's gateway calls its hosts directly. The same hosts serve
//! the gRPC shard, which also reads published ranges back ([`ShardLink::fetch_range`]) for gateways repairing
//! gaps in the Redis bus.
//!
//! With [`Ownership`] (the distributed deployment, several shards on one store) a host is opened only under
//! its lease: taken before opening, renewed by [`ShardLink::keep_leases`], and released by
//! [`ShardLink::drain`] at shutdown. A host whose lease another shard holds is answered with
//! [`LinkError::Moved`] naming that shard, and a host whose lease was lost is deposed (its bus closes, its
//! connections are told to reconnect) and forgotten.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use relay_bus::RedisPublisher;
use relay_core::bus::{BusEvent, BusReceiver};
use relay_core::link::{CommandReply, HostLink, LinkError, NotReady};
use relay_core::rpc::InboundMessage;
use relay_core::{ConnectionId, HostKey, Identity, Limits};
use relay_runner::ProviderRegistry;
use relay_store::Store;

use crate::error::ShardError;
use crate::host::ownership::{now_ms, owner_url, Ownership};
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
    /// When set, hosts are served only under their lease (several shards share the store).
    ownership: Option<Ownership>,
    /// Set by [`ShardLink::drain`]: no host is opened any more.
    draining: AtomicBool,
    /// When set, each tenant is held to a storage quota.
    storage: Option<Arc<crate::host::storage::StorageQuota>>,
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
            ownership: None,
            draining: AtomicBool::new(false),
            storage: None,
        }
    }

    /// Serve hosts only under their lease, named and timed by `ownership` (see the module docs). Call
    /// [`ShardLink::keep_leases`] once the link is shared.
    pub fn with_ownership(mut self, ownership: Ownership) -> Self {
        self.ownership = Some(ownership);
        self
    }

    /// Hold every tenant to `quota` (see [`crate::host::storage`]).
    pub fn with_storage_quota(mut self, quota: Arc<crate::host::storage::StorageQuota>) -> Self {
        self.storage = Some(quota);
        self
    }

    /// The host for `key`, opening it on first use (taking its lease first, with [`Ownership`]).
    pub async fn host(&self, key: &HostKey) -> Result<Arc<Host>, LinkError> {
        if let Some(host) = self.existing(key) {
            return Ok(host);
        }
        let _opening = self.opening.lock().await;
        if let Some(host) = self.existing(key) {
            return Ok(host);
        }
        if self.draining.load(Ordering::Acquire) {
            return Err(LinkError::HostUnavailable(key.to_string()));
        }
        let open_of_tenant = self
            .hosts
            .lock()
            .keys()
            .filter(|open| open.tenant == key.tenant)
            .count();
        // Under leases the cap counts the tenant's hosts on every shard (a host is open where it is leased);
        // shards opening hosts of one tenant at the same instant may overshoot it by one each.
        let open_of_tenant = match &self.ownership {
            Some(_) => self
                .store
                .leased_hosts_of_tenant(&key.tenant, &key.host, now_ms())
                .await
                .map_err(|error| {
                    tracing::warn!(host = %key, %error, "could not count the tenant's hosts");
                    LinkError::HostUnavailable(key.to_string())
                })?
                .max(open_of_tenant as u64) as usize,
            None => open_of_tenant,
        };
        if open_of_tenant >= self.limits.max_hosts_per_tenant {
            return Err(LinkError::OverQuota(format!(
                "tenant {} has its maximum of {} open hosts",
                key.tenant, self.limits.max_hosts_per_tenant
            )));
        }
        let lease = match &self.ownership {
            Some(ownership) => Some(self.take_lease(key, ownership).await?),
            None => None,
        };
        let opened = Host::open(
            key.clone(),
            self.limits.clone(),
            self.providers.clone(),
            self.store.clone(),
            self.redis.clone(),
            lease.clone(),
        )
        .await;
        let host = match opened {
            Ok(host) => host,
            Err(error) => {
                tracing::error!(host = %key, %error, "could not open host");
                if let Some(lease) = &lease {
                    let _ = self.store.release_lease(lease).await;
                }
                return Err(LinkError::HostUnavailable(key.to_string()));
            }
        };
        if let Some(lease) = &lease {
            tracing::info!(host = %key, epoch = lease.epoch, "serving the host under its lease");
            // Epoch 1 is the host's first placement; any later epoch is a move from another owner.
            if lease.epoch > 1 {
                relay_core::telemetry::lease_acquired();
            }
        }
        if let Some(quota) = &self.storage {
            host.set_storage_quota(quota.clone()).await;
        }
        self.hosts.lock().insert(key.clone(), host.clone());
        Ok(host)
    }

    /// Take the host's lease for this process, or say which shard holds it.
    async fn take_lease(
        &self,
        key: &HostKey,
        ownership: &Ownership,
    ) -> Result<relay_store::Lease, LinkError> {
        let unavailable = |error: relay_store::StoreError| {
            tracing::warn!(host = %key, %error, "could not take the host's lease");
            LinkError::HostUnavailable(key.to_string())
        };
        let acquired = self
            .store
            .acquire_lease(
                &key.tenant,
                &key.host,
                ownership.owner(),
                ownership.ttl_ms(),
                now_ms(),
            )
            .await
            .map_err(unavailable)?;
        if let Some(lease) = acquired {
            return Ok(lease);
        }
        match self
            .store
            .lease_of(&key.tenant, &key.host)
            .await
            .map_err(unavailable)?
        {
            Some(holder) => Err(LinkError::Moved {
                host: key.to_string(),
                owner: owner_url(&holder.owner).to_string(),
            }),
            // Released in between: the caller tries again.
            None => Err(LinkError::HostUnavailable(key.to_string())),
        }
    }

    /// Renew every held lease each third of its TTL, deposing hosts whose lease was lost, until the link is
    /// dropped. A renewal the store could not take is retried at the next tick: while nobody else takes
    /// the lease it can still be renewed, and once somebody has, fencing keeps this process from committing.
    pub fn keep_leases(self: &Arc<Self>) {
        let Some(ownership) = self.ownership.clone() else {
            return;
        };
        let link: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(ownership.renew_every());
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(link) = link.upgrade() else {
                    return;
                };
                link.renew_leases(&ownership).await;
            }
        });
    }

    /// Renew every lease of this process in one statement, then depose the open hosts whose lease was not
    /// among those renewed (taken by another shard, at another epoch).
    async fn renew_leases(&self, ownership: &Ownership) {
        // Hosts listed before the renewal: their leases were taken before it ran, so a lease missing from
        // what it renewed was lost (a host opened meanwhile is checked at the next tick).
        let hosts: Vec<Arc<Host>> = self.hosts.lock().values().cloned().collect();
        let renewed = match self
            .store
            .renew_leases_of(ownership.owner(), ownership.ttl_ms(), now_ms())
            .await
        {
            Ok(renewed) => renewed,
            Err(error) => {
                tracing::warn!(%error, "could not renew the leases; retrying");
                return;
            }
        };
        let held: std::collections::HashSet<(String, String, u64)> = renewed
            .into_iter()
            .map(|lease| (lease.tenant, lease.host, lease.epoch))
            .collect();
        for host in hosts {
            let Some(lease) = host.lease() else {
                continue;
            };
            let key = (lease.tenant.clone(), lease.host.clone(), lease.epoch);
            if !host.is_deposed() && !held.contains(&key) {
                host.depose("its lease was taken by another shard");
                self.forget(&host);
            }
        }
    }

    /// Evict idle hosts ([`Host::is_idle`]) every so often, until the link is dropped: each is forgotten,
    /// deposed (its bus closes) and its lease released, so its memory and its lease go; the next message
    /// for it opens it again from the store.
    pub fn evict_idle_hosts(self: &Arc<Self>) {
        let idle_for = self.limits.idle_host_after;
        let every = (idle_for / 4).clamp(
            std::time::Duration::from_millis(50),
            std::time::Duration::from_secs(30),
        );
        let link: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(link) = link.upgrade() else {
                    return;
                };
                link.evict_idle(idle_for).await;
            }
        });
    }

    /// One eviction pass; returns how many hosts were evicted.
    pub async fn evict_idle(&self, idle_for: std::time::Duration) -> usize {
        // Under the opening lock: no host is reopened (and no lease re-taken) while one is being let go, so
        // a release below can only ever release the evicted instance's lease.
        let _opening = self.opening.lock().await;
        // Live hosts keep only the sessions something uses.
        let live: Vec<Arc<Host>> = self.hosts.lock().values().cloned().collect();
        for host in live {
            let sessions = host.evict_unused_sessions();
            if sessions > 0 {
                tracing::debug!(host = %host.key, sessions, "unused sessions left memory");
            }
        }
        let evicted: Vec<Arc<Host>> = {
            let mut hosts = self.hosts.lock();
            let idle: Vec<HostKey> = hosts
                .iter()
                .filter(|(_, host)| host.is_idle(idle_for))
                .map(|(key, _)| key.clone())
                .collect();
            idle.iter().filter_map(|key| hosts.remove(key)).collect()
        };
        for host in &evicted {
            host.depose("idle");
            if let Some(lease) = host.lease() {
                if let Err(error) = self.store.release_lease(lease).await {
                    tracing::warn!(host = %lease.host, %error, "could not release an idle host's lease; it will lapse");
                }
            }
        }
        let count = evicted.len();
        if count > 0 {
            tracing::debug!(hosts = count, "evicted idle hosts");
            // Their committers drop the last references as they notice; then the memory is free to give back.
            let gone: Vec<Weak<Host>> = evicted.iter().map(Arc::downgrade).collect();
            drop(evicted);
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
                while gone.iter().any(|host| host.strong_count() > 0)
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                give_back_freed_memory();
            });
        }
        count
    }

    /// Graceful shutdown: open no more hosts, commit what every host has queued, stop serving them (their
    /// buses close, so gateways move their clients) and release their leases, so other shards take them
    /// over at once instead of waiting for expiry.
    pub async fn drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.flush_all().await;
        let hosts: Vec<Arc<Host>> = self.hosts.lock().drain().map(|(_, host)| host).collect();
        for host in &hosts {
            host.depose("the shard is shutting down");
        }
        for host in &hosts {
            if let Some(lease) = host.lease() {
                if let Err(error) = self.store.release_lease(lease).await {
                    tracing::warn!(host = %lease.host, %error, "could not release a lease; it will lapse");
                }
            }
        }
    }

    /// Detach every connection of the gateway whose connection ids carry `gateway` as prefix from `key`.
    /// Detach the connections of the gateway with connection-id prefix `gateway` on `key` that were attached
    /// before `ended` (when its last stream of the host ended): one attached since belongs to a stream that is
    /// coming.
    pub fn detach_gateway(&self, key: &HostKey, gateway: u64, ended: std::time::Instant) {
        if let Some(host) = self.existing(key) {
            let gone = host.detach_where(|connection, state| {
                connection.prefix() == gateway && state.attached_at <= ended
            });
            if gone > 0 {
                tracing::info!(host = %key, gateway, connections = gone, "a gateway's stream ended; detached its connections");
            }
        }
    }

    /// Resolves once this process stops serving `key` (at once if it does not serve it now).
    pub async fn served_until_moved(&self, key: &HostKey) {
        if let Some(host) = self.existing(key) {
            host.deposed().await;
        }
    }

    fn forget(&self, host: &Arc<Host>) {
        let mut hosts = self.hosts.lock();
        if hosts.get(&host.key).is_some_and(|open| Arc::ptr_eq(open, host)) {
            hosts.remove(&host.key);
        }
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

    /// The open host for `key`, unless it was deposed (then it is forgotten).
    fn existing(&self, key: &HostKey) -> Option<Arc<Host>> {
        let mut hosts = self.hosts.lock();
        let host = hosts.get(key)?;
        if host.is_deposed() {
            hosts.remove(key);
            return None;
        }
        Some(host.clone())
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
    ) -> Result<BusReceiver, LinkError> {
        Ok(self.host(host).await?.attach(connection, identity.clone()))
    }

    async fn call(&self, host: &HostKey, connection: ConnectionId, message: InboundMessage) -> CommandReply {
        match self.existing(host) {
            Some(h) => h.call(connection, message).await,
            // Not served here (any more): the connection's state went with the host.
            None => CommandReply::moved(message.id),
        }
    }

    async fn detach(&self, host: &HostKey, connection: ConnectionId) {
        if let Some(h) = self.existing(host) {
            h.detach(connection);
        }
    }

    async fn metrics(&self) -> String {
        let hosts: Vec<Arc<Host>> = self.hosts.lock().values().cloned().collect();
        let (mut sessions, mut chats, mut pending_batch_bytes) = (0usize, 0usize, 0usize);
        for host in &hosts {
            let loaded = host.loaded_counts();
            sessions += loaded.sessions;
            chats += loaded.chats;
            pending_batch_bytes += loaded.pending_batch_bytes;
        }
        relay_core::telemetry::set_loaded(relay_core::telemetry::Loaded {
            hosts: hosts.len(),
            sessions,
            chats,
            pending_batch_bytes,
        });
        relay_core::telemetry::render()
    }

    async fn ready(&self) -> Result<(), NotReady> {
        crate::host::health::store_ready(&self.store).await
    }
}

/// Hand memory freed by evicted hosts back to the operating system. glibc's allocator keeps freed chunks in
/// its per-thread arenas (and, once its dynamic mmap threshold has grown, even large ones), so without this a
/// shard's resident memory would stay at its peak after its hosts went idle.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn give_back_freed_memory() {
    // SAFETY: malloc_trim only walks glibc's own heaps; it takes no pointers and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn give_back_freed_memory() {}

//! The gateway side of the internal gRPC: [`RemoteShard`], a [`HostLink`] that calls a shard over the network.
//!
//! Without Redis, every connection of this gateway to one host shares one `Events` stream: a task per followed host reads it
//! into a local broadcast channel, and each attached connection gets a receiver of that channel. The receiver
//! is subscribed before `Attach` is sent and the stream is established (the shard already subscribed to the
//! host's bus) before that, so no envelope sequenced after a later snapshot is missed. When the stream ends
//! (shard gone, or this gateway fell behind) the channel closes and the gateway closes those connections with
//! a resumable code; the next attach follows the host again. When the last connection detaches, the stream
//! is dropped.
//!
//! With Redis ([`RemoteShard::with_redis`]) a gateway follows hosts through a [`RedisSubscriber`] instead of
//! `Events` streams: the receiver is obtained once Redis has confirmed the host's subscription, before
//! `Attach` is sent, and `Attach`'s reply (the host's last published `serverSeq`) seeds the subscriber's gap
//! detection. Lost Redis messages are fetched back with `FetchRange` ([`ShardRepair`]); every range that
//! brought back at least one event counts in `ahp_relay_gap_repairs_total` on the gateway's `/metrics`. When
//! the last connection of this gateway to a host detaches, the host is unfollowed.
//!
//! `Call` requests carry the current span's trace context ([`crate::trace`]); [`RemoteShard`]'s readiness is
//! the shard answering `Metrics` within [`READY_TIMEOUT`].

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex as SyncMutex;
use relay_bus::{RedisSubscriber, SubscriberOptions};
use relay_core::bus::{BusBatch, BusReceiver, BusSender, DEFAULT_BUS_BYTES};
use relay_core::link::{CommandReply, HostLink, LinkError, NotReady};
use relay_core::rpc::{error_frame, InboundMessage, RpcError};
use relay_core::{ConnectionId, HostKey, Identity};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::Mutex;
use tonic::transport::{Channel, Endpoint};

use crate::convert::{event_from_pb, host_to_pb, identity_to_pb, reply_from_pb};
use crate::credential::InternalCredential;
use crate::pb;
use crate::pb::shard_client::ShardClient;
pub use crate::shard_repair::AuthedChannel;
use crate::shard_repair::{host_request, ShardRepair, Signer};

/// Why a [`RemoteShard`] could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid shard URL {url:?}: {source}")]
    InvalidUrl {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("invalid Redis URL: {0}")]
    Redis(#[from] relay_bus::SubscribeError),
    #[error(transparent)]
    Tls(#[from] crate::TlsError),
}

/// Following hosts over Redis: the subscriber and this gateway's connections per followed host.
struct RedisBus {
    subscriber: Arc<RedisSubscriber>,
    followed: Arc<SyncMutex<HashMap<HostKey, RedisFollow>>>,
}

/// One host followed over Redis: this gateway's connections to it, and the `Watch` of its ownership that
/// ends the follow (closing the connections) when the shard stops serving the host.
#[derive(Default)]
struct RedisFollow {
    connections: HashSet<ConnectionId>,
    watch: Option<tokio::task::AbortHandle>,
}

/// One followed host: its local bus and the connections of this gateway attached to it.
struct Follower {
    bus: Arc<BusSender>,
    connections: HashSet<ConnectionId>,
    /// Tells this follower apart from a later one of the same host.
    generation: u64,
    task: tokio::task::AbortHandle,
}

/// How long the shard may take to answer a readiness probe.
pub const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long one forwarded request may take at the shard (a reply waits for its commit, which retries a
/// failing store with backoff).
pub const CALL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// How long attaching or detaching a connection may take.
pub const ATTACH_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long Redis may take to confirm a host's subscription before an attach fails.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long connecting to a shard may take: short, so a gateway moves on from a dead shard quickly.
const SHARD_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

type Followers = Arc<Mutex<HashMap<HostKey, Follower>>>;

/// A shard reached over gRPC.
pub struct RemoteShard {
    client: ShardClient<AuthedChannel>,
    bus_capacity: usize,
    followers: Followers,
    generations: AtomicU64,
    /// Set when hosts are followed over Redis instead of `Events` streams.
    redis: Option<RedisBus>,
    signer: Signer,
    /// With a signer: each attached connection's key, presented on its `Call`s and `Detach`.
    connection_keys: SyncMutex<HashMap<(HostKey, ConnectionId), String>>,
}

impl RemoteShard {
    /// Sign an identity assertion for each `Attach`, `Events`, `Watch` and `FetchRange` with `signer` (before
    /// [`RemoteShard::with_redis`], whose gap repair uses it too).
    pub fn with_signer(mut self, signer: Signer) -> Self {
        self.signer = signer;
        self
    }

    /// A shard at `url` (e.g. `http://127.0.0.1:7879`), connected on first use and reconnected as needed,
    /// called with `credential`. `bus_capacity` bounds each followed host's local bus (see
    /// `Limits::bus_capacity`).
    pub fn connect_lazy(
        url: &str,
        bus_capacity: usize,
        credential: InternalCredential,
    ) -> Result<Self, ClientError> {
        Self::connect_lazy_with(url, bus_capacity, credential, &crate::LinkTls::default())
    }

    /// [`RemoteShard::connect_lazy`], over TLS as `tls` says for an `https://` URL.
    pub fn connect_lazy_with(
        url: &str,
        bus_capacity: usize,
        credential: InternalCredential,
        tls: &crate::LinkTls,
    ) -> Result<Self, ClientError> {
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|source| ClientError::InvalidUrl {
                url: url.to_string(),
                source,
            })?
            .tcp_nodelay(true)
            // Attaching waits for the shard: a blackholed address must fail, not hang every attach.
            .connect_timeout(SHARD_CONNECT_TIMEOUT)
            // A shard that stops answering (a partition) ends the link, and the streams on it.
            .http2_keep_alive_interval(crate::LINK_KEEPALIVE_INTERVAL)
            .keep_alive_timeout(crate::LINK_KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let endpoint = tls.apply(url, endpoint)?;
        Ok(Self::new(endpoint.connect_lazy(), bus_capacity, credential))
    }

    /// A shard behind an existing channel, called with `credential`.
    pub fn new(channel: Channel, bus_capacity: usize, credential: InternalCredential) -> Self {
        Self {
            client: ShardClient::with_interceptor(channel, credential)
                .max_decoding_message_size(crate::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(crate::MAX_MESSAGE_BYTES),
            bus_capacity: bus_capacity.max(1),
            followers: Arc::new(Mutex::new(HashMap::new())),
            generations: AtomicU64::new(0),
            redis: None,
            signer: None,
            connection_keys: SyncMutex::new(HashMap::new()),
        }
    }

    /// Put `connection`'s key (when it has one) into `metadata`.
    fn present_key(
        &self,
        metadata: &mut tonic::metadata::MetadataMap,
        host: &HostKey,
        connection: ConnectionId,
    ) {
        if let Some(key) = self.connection_keys.lock().get(&(host.clone(), connection)) {
            if let Err(status) = crate::AssertionSigner::present_key(metadata, key) {
                tracing::error!(%status, "cannot present a connection's key");
            }
        }
    }

    /// Follow hosts over the Redis at `url` (with gap repair from the shard) instead of `Events` streams.
    /// Must be called inside a Tokio runtime; the Redis connection is made in the background.
    pub fn with_redis(mut self, url: &str) -> Result<Self, ClientError> {
        let repair = Arc::new(ShardRepair {
            client: self.client.clone(),
            signer: self.signer.clone(),
        });
        let options = SubscriberOptions {
            capacity: self.bus_capacity,
            ..SubscriberOptions::default()
        };
        self.redis = Some(RedisBus {
            subscriber: Arc::new(RedisSubscriber::connect(url, repair, options)?),
            followed: Arc::new(SyncMutex::new(HashMap::new())),
        });
        Ok(self)
    }

    /// Register `connection` on `host` and return a receiver of its Redis bus once the subscription holds.
    async fn follow_redis(
        redis: &RedisBus,
        host: &HostKey,
        connection: ConnectionId,
    ) -> Result<BusReceiver, LinkError> {
        redis
            .followed
            .lock()
            .entry(host.clone())
            .or_default()
            .connections
            .insert(connection);
        match tokio::time::timeout(CONNECT_TIMEOUT, redis.subscriber.follow_subscribed(host)).await {
            Ok(receiver) => Ok(receiver),
            Err(_) => {
                tracing::warn!(host = %host, "redis did not confirm the host's subscription");
                Self::unfollow_redis(redis, host, connection);
                Err(LinkError::HostUnavailable(host.to_string()))
            }
        }
    }

    /// Forget `connection`; stop following the host over Redis when it was the last one.
    fn unfollow_redis(redis: &RedisBus, host: &HostKey, connection: ConnectionId) {
        let mut followed = redis.followed.lock();
        if let Some(follow) = followed.get_mut(host) {
            follow.connections.remove(&connection);
            if follow.connections.is_empty() {
                if let Some(follow) = followed.remove(host) {
                    if let Some(watch) = follow.watch {
                        watch.abort();
                    }
                }
                redis.subscriber.unfollow(host);
            }
        }
    }

    /// Once a connection is attached, watch the shard's ownership of the host (one `Watch` per followed
    /// host): when it ends — the host moved, or the shard is gone — stop following the host, which closes
    /// the bus of every connection to it, and the gateway closes them with a resumable code.
    fn watch_ownership(&self, redis: &RedisBus, host: &HostKey) {
        let mut followed = redis.followed.lock();
        let Some(follow) = followed.get_mut(host) else {
            return;
        };
        if follow.watch.as_ref().is_some_and(|watch| !watch.is_finished()) {
            return;
        }
        let (client, all, subscriber, key, signer) = (
            self.client.clone(),
            redis.followed.clone(),
            redis.subscriber.clone(),
            host.clone(),
            self.signer.clone(),
        );
        let (ready, started) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            // Wait until the handle is stored, so the clean-up below finds this watch.
            let _ = started.await;
            let request = host_request(
                &signer,
                pb::WatchRequest {
                    host: Some(host_to_pb(&key)),
                    gateway: ConnectionId::process_prefix(),
                },
                "watch",
                &key,
            );
            let watched = match request {
                Ok(request) => client.clone().watch(request).await,
                Err(status) => Err(status),
            };
            if let Ok(stream) = watched {
                let mut stream = stream.into_inner();
                while let Ok(Some(_)) = stream.message().await {}
            }
            tracing::info!(host = %key, "the shard stopped serving the host; moving its connections");
            let mut followed = all.lock();
            let current = followed
                .get(&key)
                .and_then(|follow| follow.watch.as_ref())
                .is_some_and(|watch| watch.id() == tokio::task::id());
            if current {
                followed.remove(&key);
                subscriber.unfollow(&key);
            }
        });
        follow.watch = Some(task.abort_handle());
        let _ = ready.send(());
    }

    /// Register `connection` with the host's follower (starting one if needed) and return its bus receiver.
    async fn follow(&self, host: &HostKey, connection: ConnectionId) -> Result<BusReceiver, LinkError> {
        let mut followers = self.followers.lock().await;
        if let Some(follower) = followers.get_mut(host) {
            if !follower.task.is_finished() {
                follower.connections.insert(connection);
                return Ok(follower.bus.subscribe());
            }
        }
        let request = host_request(
            &self.signer,
            pb::EventsRequest {
                host: Some(host_to_pb(host)),
                gateway: ConnectionId::process_prefix(),
            },
            "events",
            host,
        )
        .map_err(|status| link_error(host, &status))?;
        let mut stream = self
            .client
            .clone()
            .events(request)
            .await
            .map_err(|status| link_error(host, &status))?
            .into_inner();
        let bus = Arc::new(BusSender::new(self.bus_capacity, DEFAULT_BUS_BYTES));
        let receiver = bus.subscribe();
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let task = {
            let bus = bus.clone();
            let followers = self.followers.clone();
            let host = host.clone();
            tokio::spawn(async move {
                loop {
                    match stream.message().await {
                        Ok(Some(batch)) => match batch
                            .events
                            .into_iter()
                            .map(|event| event_from_pb(event).map(Arc::new))
                            .collect::<Result<BusBatch, _>>()
                        {
                            // An empty batch is never sent; no receivers is fine: every connection may have
                            // gone since.
                            Ok(batch) if batch.is_empty() => {}
                            Ok(batch) => drop(bus.send(batch)),
                            Err(error) => {
                                tracing::warn!(host = %host, %error, "bad bus event; unfollowing the host");
                                break;
                            }
                        },
                        Ok(None) => break,
                        Err(status) => {
                            tracing::warn!(host = %host, %status, "bus stream ended");
                            break;
                        }
                    }
                }
                // Drop both senders so every receiver sees the bus close.
                let mut followers = followers.lock().await;
                if followers.get(&host).is_some_and(|f| f.generation == generation) {
                    followers.remove(&host);
                }
            })
            .abort_handle()
        };
        followers.insert(
            host.clone(),
            Follower {
                bus,
                connections: HashSet::from([connection]),
                generation,
                task,
            },
        );
        Ok(receiver)
    }

    /// Forget `connection`; stop following the host when it was the last one.
    async fn unfollow(&self, host: &HostKey, connection: ConnectionId) {
        let mut followers = self.followers.lock().await;
        if let Some(follower) = followers.get_mut(host) {
            follower.connections.remove(&connection);
            if follower.connections.is_empty() {
                if let Some(follower) = followers.remove(host) {
                    follower.task.abort();
                }
            }
        }
    }
}

/// What a failed `Attach` or `Events` means for the gateway: a redirect to the shard named in
/// [`crate::OWNER_METADATA`], the tenant's connection quota, or an unavailable host.
fn link_error(host: &HostKey, status: &tonic::Status) -> LinkError {
    match status.code() {
        tonic::Code::ResourceExhausted => LinkError::OverQuota(status.message().to_string()),
        tonic::Code::FailedPrecondition => match status
            .metadata()
            .get(crate::OWNER_METADATA)
            .and_then(|owner| owner.to_str().ok())
        {
            Some(owner) => LinkError::Moved {
                host: host.to_string(),
                owner: owner.to_string(),
            },
            None => LinkError::HostUnavailable(host.to_string()),
        },
        _ => {
            tracing::debug!(host = %host, %status, "attach failed");
            LinkError::HostUnavailable(host.to_string())
        }
    }
}

/// The raw JSON-RPC frame of an inbound message, rebuilt from its envelope for the shard to read again.
fn frame_of(message: &InboundMessage) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(Serialize)]
    struct Out<'a> {
        jsonrpc: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
        method: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        params: Option<&'a RawValue>,
    }
    serde_json::to_vec(&Out {
        jsonrpc: "2.0",
        id: message.id,
        method: &message.method,
        params: message.params.as_deref(),
    })
}

/// What the gateway answers when the shard could not: an internal error for requests, nothing otherwise.
fn failed(id: Option<u64>, why: &str) -> CommandReply {
    match id {
        Some(id) => CommandReply::frame(error_frame(Some(id), &RpcError::internal(why))),
        None => CommandReply::none(),
    }
}

impl HostLink for RemoteShard {
    async fn attach(
        &self,
        host: &HostKey,
        connection: ConnectionId,
        identity: &Identity,
    ) -> Result<BusReceiver, LinkError> {
        let receiver = match &self.redis {
            Some(redis) => Self::follow_redis(redis, host, connection).await?,
            None => self.follow(host, connection).await?,
        };
        let mut request = tonic::Request::new(pb::AttachRequest {
            host: Some(host_to_pb(host)),
            connection: connection.0,
            identity: Some(identity_to_pb(identity)),
        });
        request.set_timeout(ATTACH_DEADLINE);
        if let Some(signer) = &self.signer {
            let key = crate::AssertionSigner::connection_key();
            signer
                .attach(request.metadata_mut(), host, connection, identity, &key)
                .map_err(|status| link_error(host, &status))?;
            self.connection_keys
                .lock()
                .insert((host.clone(), connection), key);
        }
        let attached = tokio::time::timeout(ATTACH_DEADLINE, self.client.clone().attach(request))
            .await
            .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("attach timed out")));
        match attached {
            Ok(reply) => {
                if let Some(redis) = &self.redis {
                    redis.subscriber.seed(host, reply.into_inner().published_seq);
                    self.watch_ownership(redis, host);
                }
                Ok(receiver)
            }
            Err(status) => {
                drop(receiver);
                self.connection_keys.lock().remove(&(host.clone(), connection));
                match &self.redis {
                    Some(redis) => Self::unfollow_redis(redis, host, connection),
                    None => self.unfollow(host, connection).await,
                }
                Err(link_error(host, &status))
            }
        }
    }

    async fn call(&self, host: &HostKey, connection: ConnectionId, message: InboundMessage) -> CommandReply {
        let frame = match frame_of(&message) {
            Ok(frame) => frame,
            Err(error) => return failed(message.id, &format!("could not forward the message: {error}")),
        };
        let mut request = crate::trace::traced(pb::CallRequest {
            host: Some(host_to_pb(host)),
            connection: connection.0,
            frame,
        });
        // The shard gives up at the deadline too (grpc-timeout), so no call holds either side forever.
        request.set_timeout(CALL_DEADLINE);
        self.present_key(request.metadata_mut(), host, connection);
        let reply = match tokio::time::timeout(CALL_DEADLINE, self.client.clone().call(request)).await {
            Ok(reply) => reply,
            Err(_) => {
                tracing::warn!(host = %host, "call timed out");
                return failed(message.id, "the shard did not answer in time");
            }
        };
        match reply {
            Ok(reply) => match reply_from_pb(reply.into_inner()) {
                Ok(reply) => reply,
                Err(error) => {
                    tracing::warn!(host = %host, %error, "bad reply from the shard");
                    failed(message.id, "the shard sent a malformed reply")
                }
            },
            Err(status) => {
                tracing::warn!(host = %host, %status, "call failed");
                failed(message.id, "the shard is unavailable")
            }
        }
    }

    async fn detach(&self, host: &HostKey, connection: ConnectionId) {
        match &self.redis {
            Some(redis) => Self::unfollow_redis(redis, host, connection),
            None => self.unfollow(host, connection).await,
        }
        let mut request = tonic::Request::new(pb::DetachRequest {
            host: Some(host_to_pb(host)),
            connection: connection.0,
        });
        request.set_timeout(ATTACH_DEADLINE);
        self.present_key(request.metadata_mut(), host, connection);
        self.connection_keys.lock().remove(&(host.clone(), connection));
        let detached = tokio::time::timeout(ATTACH_DEADLINE, self.client.clone().detach(request))
            .await
            .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("detach timed out")));
        if let Err(status) = detached {
            tracing::debug!(host = %host, %status, "detach failed (the shard may be gone)");
        }
    }

    async fn metrics(&self) -> String {
        relay_core::telemetry::render()
    }

    async fn ready(&self) -> Result<(), NotReady> {
        let mut client = self.client.clone();
        match tokio::time::timeout(READY_TIMEOUT, client.metrics(pb::MetricsRequest {})).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(NotReady(format!("the shard does not answer: {status}"))),
            Err(_) => Err(NotReady("the shard did not answer in time".into())),
        }
    }
}

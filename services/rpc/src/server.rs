//! The shard side of the internal gRPC: [`ShardService`] serves any [`HostLink`] that is also a
//! [`BusHistory`] (in practice `relay_shard::ShardLink`) as `ahp_relay.v1.Shard`, to callers presenting the
//! deployment's internal credential ([`crate::credential`]); `Attach` refuses an identity of another tenant
//! than the host's.
//!
//! `FetchRange` reads published action events back from the [`BusHistory`] for gateways repairing gaps in
//! the Redis bus; `Attach` answers with the host's last published `serverSeq` so a gateway following over
//! Redis knows where it follows from.
//!
//! `Attach`, `Call` and `Detach` forward to the link, which keeps each connection's protocol state. A
//! gateway's connections live no longer than its `Events` or `Watch` streams of their host: when the last one
//! ends (the gateway was killed, or unfollowed the host) and none opened within [`GATEWAY_STREAM_GRACE`], they
//! are detached, so their active-client slots and client tool calls are released after the usual grace
//! instead of never. `Events`
//! follows a host's bus: it attaches an internal connection (id counted down from `u64::MAX`, identity
//! [`INTERNAL_SUBJECT`], role viewer) only to obtain the bus receiver, streams every event in order, and
//! detaches when the stream ends. That internal connection never sends a frame, so it never initializes or
//! subscribes and the shard never addresses anything to it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use relay_core::bus::batch_bytes;
use relay_core::link::LinkError;
use relay_core::rpc::{error_frame, read_frame};
use relay_core::HostKey;
use relay_core::{CommandReply, ConnectionId, HostLink, Identity, Limits, Role};
use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::bus_history::*;
use crate::convert::{event_to_pb, host_from_pb, identity_from_pb, reply_to_pb};
use crate::credential::{CredentialCheck, InternalCredential};
use crate::gateway_streams::*;
use crate::pb;
use crate::pb::shard_server::{Shard, ShardServer};
use tonic::service::interceptor::InterceptedService;

/// The subject of the internal connections `Events` attaches to obtain a host's bus.
pub const INTERNAL_SUBJECT: &str = "relay-internal:events";

/// Subjects reserved for the relay's own connections: `Attach` refuses them.
pub const INTERNAL_SUBJECT_PREFIX: &str = "relay-internal:";

/// Batches buffered per `Events` stream before the bus receiver itself starts to fill (and may lag)…
const EVENTS_BUFFER: usize = 1024;
/// …and at most this many bytes of bus frames: a gateway that reads slower holds its host's bus back, whose
/// own byte bound then ends the stream (`DATA_LOSS`; the gateway's connections resync).
const EVENTS_BUFFER_BYTES: usize = 16 * 1024 * 1024;

/// Why [`serve`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The `Shard` gRPC service over a [`HostLink`].
pub struct ShardService<L: HostLink + BusHistory> {
    link: Arc<L>,
    /// Deepest JSON nesting accepted in a forwarded frame (the gateway has already checked it too).
    max_json_depth: usize,
    /// Internal `Events` connections so far; their ids are `u64::MAX - n`.
    internal: AtomicU64,
    /// The gateways' open `Events`/`Watch` streams per host.
    gateway_streams: GatewayStreams,
    /// Checks the gateways' identity assertions (see [`crate::assertion`]); without it the identity an
    /// `Attach` names is taken as it is.
    assertions: Option<Arc<crate::AssertionVerifier>>,
}

impl<L: HostLink + BusHistory> ShardService<L> {
    pub fn new(link: Arc<L>) -> Self {
        Self {
            link,
            max_json_depth: Limits::default().max_json_depth,
            internal: AtomicU64::new(0),
            gateway_streams: GatewayStreams::default(),
            assertions: None,
        }
    }

    /// Require an identity assertion signed by the gateways' key on `Attach`, `Events`, `Watch` and
    /// `FetchRange`; an `Attach` acts as the identity asserted.
    pub fn with_assertions(mut self, verifier: Option<Arc<crate::AssertionVerifier>>) -> Self {
        self.assertions = verifier;
        self
    }

    fn check_host_rpc(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        rpc: &str,
        host: &HostKey,
    ) -> Result<(), Status> {
        match &self.assertions {
            Some(verifier) => verifier.host_rpc(metadata, rpc, host),
            None => Ok(()),
        }
    }

    /// Accept forwarded frames nested up to `depth` levels.
    pub fn with_max_json_depth(mut self, depth: usize) -> Self {
        self.max_json_depth = depth;
        self
    }

    /// This service as a tonic service that refuses every call without `credential`, with message limits
    /// raised to [`crate::MAX_MESSAGE_BYTES`].
    pub fn into_server(
        self,
        credential: &InternalCredential,
    ) -> InterceptedService<ShardServer<Self>, CredentialCheck> {
        let server = ShardServer::new(self)
            .max_decoding_message_size(crate::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(crate::MAX_MESSAGE_BYTES);
        InterceptedService::new(server, credential.check())
    }
}

/// Serve `link` on `listener` to callers presenting `credential`, until `shutdown` completes.
pub async fn serve<L: HostLink + BusHistory>(
    listener: tokio::net::TcpListener,
    link: Arc<L>,
    credential: &InternalCredential,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    serve_with_runners(
        listener,
        link,
        crate::RunnerPool::new(),
        credential,
        None,
        shutdown,
    )
    .await
}

/// [`serve`], with the `Runners` service where agent runners presenting `runner_credential` register into
/// `runners` (without it, no runner can register).
pub async fn serve_with_runners<L: HostLink + BusHistory>(
    listener: tokio::net::TcpListener,
    link: Arc<L>,
    runners: Arc<crate::RunnerPool>,
    credential: &InternalCredential,
    runner_credential: Option<&InternalCredential>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    serve_secured(
        listener,
        link,
        runners,
        credential,
        runner_credential,
        ShardSecurity::default(),
        shutdown,
    )
    .await
}

/// How a shard secures its gRPC endpoint beyond the credentials.
#[derive(Clone, Default)]
pub struct ShardSecurity {
    /// TLS (plaintext when it has no server identity; mutual TLS when it names a client CA).
    pub tls: crate::LinkTls,
    /// The gateways' identity assertions to require (see [`crate::assertion`]).
    pub assertions: Option<Arc<crate::AssertionVerifier>>,
}

/// [`serve_with_runners`], secured as `security` says.
pub async fn serve_secured<L: HostLink + BusHistory>(
    listener: tokio::net::TcpListener,
    link: Arc<L>,
    runners: Arc<crate::RunnerPool>,
    credential: &InternalCredential,
    runner_credential: Option<&InternalCredential>,
    security: ShardSecurity,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let ShardSecurity { tls, assertions } = security;
    // Frames are small and latency matters more than packing: no Nagle delay.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut server = tonic::transport::Server::builder();
    if let Some(config) = tls.server_config() {
        server = server.tls_config(config)?;
    }
    server
        // A gateway (or runner) that stops answering pings — partitioned, not closed — is let go: its streams
        // end, and its connections are detached after the grace.
        .http2_keepalive_interval(Some(crate::LINK_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(crate::LINK_KEEPALIVE_TIMEOUT))
        .add_service(
            ShardService::new(link)
                .with_assertions(assertions)
                .into_server(credential),
        )
        .add_optional_service(
            runner_credential.map(|runner| crate::RunnersService::new(runners).into_server(runner)),
        )
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

fn link_status(error: LinkError) -> Status {
    match error {
        LinkError::HostUnavailable(_) => Status::unavailable(error.to_string()),
        LinkError::OverQuota(_) => Status::resource_exhausted(error.to_string()),
        LinkError::Moved { owner, .. } => moved_status(&owner),
    }
}

type EventStream = Pin<Box<dyn tokio_stream::Stream<Item = EventsItem> + Send>>;

/// One item of an `Events` stream.
type EventsItem = Result<pb::BusEventBatch, Status>;

#[tonic::async_trait]
impl<L: HostLink + BusHistory> Shard for ShardService<L> {
    async fn attach(&self, request: Request<pb::AttachRequest>) -> Result<Response<pb::AttachReply>, Status> {
        let (metadata, _, request) = request.into_parts();
        let host = host_from_pb(request.host)?;
        let connection = ConnectionId(request.connection);
        let (identity, key) = match &self.assertions {
            // Who the connection is comes from the gateway's signed assertion, not from the request.
            Some(verifier) => {
                let (identity, key) = verifier.attach(&metadata, &host, connection)?;
                (identity, Some(key))
            }
            None => (identity_from_pb(request.identity)?, None),
        };
        // The gateway vouches for the identity (it verified the client's token), but never across tenants,
        // and never as this service's own internal connections.
        if identity.tenant != host.tenant {
            return Err(Status::permission_denied(
                "the identity's tenant is not the host's tenant",
            ));
        }
        if identity.subject.starts_with(INTERNAL_SUBJECT_PREFIX) {
            return Err(Status::permission_denied("reserved subject"));
        }
        // The shard tracks the connection; its bus reaches the gateway through `Events`, not this receiver.
        let _bus = self
            .link
            .attach(&host, connection, &identity)
            .await
            .map_err(link_status)?;
        if let Some(key) = key {
            self.gateway_streams.keys.set(&host, connection, key);
        }
        self.gateway_streams.expect_stream(&self.link, &host, connection);
        let published_seq = self.link.published_seq(&host).await?;
        Ok(Response::new(pb::AttachReply { published_seq }))
    }

    async fn fetch_range(
        &self,
        request: Request<pb::FetchRangeRequest>,
    ) -> Result<Response<pb::FetchRangeReply>, Status> {
        let (metadata, _, request) = request.into_parts();
        let host = host_from_pb(request.host)?;
        self.check_host_rpc(&metadata, "fetch_range", &host)?;
        let events = self
            .link
            .fetch_range(&host, request.after, request.through)
            .await?;
        Ok(Response::new(pb::FetchRangeReply {
            events: events.iter().map(event_to_pb).collect(),
        }))
    }

    async fn call(&self, request: Request<pb::CallRequest>) -> Result<Response<pb::CallReply>, Status> {
        let span = crate::trace::call_span(&request);
        let (metadata, _, request) = request.into_parts();
        let host = host_from_pb(request.host)?;
        if self.assertions.is_some() {
            self.gateway_streams
                .keys
                .check(&metadata, &host, ConnectionId(request.connection))?;
        }
        let reply = match read_frame(&request.frame, self.max_json_depth) {
            Ok(message) => {
                span.record("method", message.method.as_str())
                    .record("host", tracing::field::display(&host));
                self.link
                    .call(&host, ConnectionId(request.connection), message)
                    .instrument(span)
                    .await
            }
            Err(rejection) => CommandReply::frame(error_frame(rejection.id, &rejection.error)),
        };
        Ok(Response::new(reply_to_pb(reply)))
    }

    async fn detach(&self, request: Request<pb::DetachRequest>) -> Result<Response<pb::DetachReply>, Status> {
        let (metadata, _, request) = request.into_parts();
        let host = host_from_pb(request.host)?;
        let connection = ConnectionId(request.connection);
        if self.assertions.is_some() {
            self.gateway_streams.keys.check(&metadata, &host, connection)?;
            self.gateway_streams.keys.remove(&host, connection);
        }
        self.link.detach(&host, connection).await;
        Ok(Response::new(pb::DetachReply {}))
    }

    type EventsStream = EventStream;

    async fn events(
        &self,
        request: Request<pb::EventsRequest>,
    ) -> Result<Response<Self::EventsStream>, Status> {
        let (metadata, _, request) = request.into_parts();
        let gateway = request.gateway;
        let host = host_from_pb(request.host)?;
        self.check_host_rpc(&metadata, "events", &host)?;
        let id = ConnectionId(u64::MAX - self.internal.fetch_add(1, Ordering::Relaxed));
        let identity = Identity {
            subject: INTERNAL_SUBJECT.into(),
            tenant: host.tenant.clone(),
            role: Role::Viewer,
            hosts: None,
        };
        // Subscribed before the response headers go out: once the caller has the stream, it misses nothing
        // the host publishes afterwards.
        let mut bus = self
            .link
            .attach(&host, id, &identity)
            .await
            .map_err(link_status)?;
        let (tx, rx) =
            mpsc::channel::<(Option<tokio::sync::OwnedSemaphorePermit>, EventsItem)>(EVENTS_BUFFER);
        let buffered_bytes = Arc::new(Semaphore::new(EVENTS_BUFFER_BYTES));
        let link = self.link.clone();
        let stream = self.gateway_streams.open(&self.link, &host, gateway);
        tokio::spawn(async move {
            // Whatever ends this task ends the gateway's stream: its connections to the host go after the
            // grace unless it follows the host again.
            let _stream = stream;
            loop {
                let received = tokio::select! {
                    () = tx.closed() => break,
                    received = bus.recv() => received,
                };
                match received {
                    Ok(batch) => {
                        // The batch's bytes stay counted until the stream hands it to the transport.
                        let bytes =
                            u32::try_from(batch_bytes(&batch).min(EVENTS_BUFFER_BYTES)).unwrap_or(u32::MAX);
                        let permit = tokio::select! {
                            () = tx.closed() => break,
                            permit = buffered_bytes.clone().acquire_many_owned(bytes) => permit.ok(),
                        };
                        let batch = pb::BusEventBatch {
                            events: batch.iter().map(|event| event_to_pb(event)).collect(),
                        };
                        if tx.send((permit, Ok(batch))).await.is_err() {
                            break;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(host = %host, missed, "bus follower fell behind; ending its stream");
                        let status =
                            Status::data_loss(format!("bus follower fell behind by {missed} batches"));
                        let _ = tx.send((None, Err(status))).await;
                        break;
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        let _ = tx.send((None, Err(Status::unavailable("host closed")))).await;
                        break;
                    }
                }
            }
            drop(bus);
            link.detach(&host, id).await;
        });
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::map(
            ReceiverStream::new(rx),
            |(permit, item)| {
                drop(permit);
                item
            },
        ))))
    }

    type WatchStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let (metadata, _, request) = request.into_parts();
        let gateway = request.gateway;
        let host = host_from_pb(request.host)?;
        self.check_host_rpc(&metadata, "watch", &host)?;
        let link = self.link.clone();
        let stream = self.gateway_streams.open(&self.link, &host, gateway);
        // Nothing is ever sent: the stream only ends, when the host moves.
        let (tx, rx) = mpsc::channel::<Result<pb::WatchEvent, Status>>(1);
        tokio::spawn(async move {
            let _stream = stream;
            tokio::select! {
                // The gateway let go of the watch (it died, or follows the host no more).
                () = tx.closed() => {}
                () = link.served_until_moved(&host) => {
                    let _ = tx.send(Err(Status::unavailable("the host moved"))).await;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn metrics(
        &self,
        _request: Request<pb::MetricsRequest>,
    ) -> Result<Response<pb::MetricsReply>, Status> {
        Ok(Response::new(pb::MetricsReply {
            text: self.link.metrics().await,
        }))
    }
}

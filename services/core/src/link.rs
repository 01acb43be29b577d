//! The narrow interface between the gateway and the shard.
//!
//! A gateway connection attaches to its host (receiving the host's bus), forwards each inbound JSON-RPC frame
//! with [`HostLink::call`], applies the [`SubscriptionChange`]s of the reply to its delivery filter, and then
//! writes the reply frame. Because the bus receiver exists before the call and is read only after the reply is
//! applied, every envelope sequenced after a snapshot reaches the connection exactly once (design §5).

use std::future::Future;

use bytes::Bytes;

use crate::bus::BusReceiver;
use crate::identity::{ConnectionId, HostKey, Identity};
use crate::rpc::InboundMessage;

/// A change to which channels a connection receives, and from which `serverSeq` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriptionChange {
    /// Deliver envelopes on `channel` with `serverSeq > after_seq`.
    Add { channel: String, after_seq: u64 },
    /// Stop delivering `channel`.
    Remove { channel: String },
    /// Stop delivering every channel (before a `reconnect` re-establishes them).
    Clear,
}

/// The gateway should close the connection after writing the reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseRequest {
    pub code: u16,
    pub reason: String,
}

/// The shard's answer to one inbound frame.
#[derive(Debug, Default)]
pub struct CommandReply {
    /// The response frame; `None` for notifications.
    pub frame: Option<Bytes>,
    /// Applied to the connection's delivery filter before `frame` is written.
    pub subscriptions: Vec<SubscriptionChange>,
    /// The connection completed `initialize` or `reconnect`: host-wide notifications may now flow to it.
    pub session_started: bool,
    pub close: Option<CloseRequest>,
    /// The bus event numbered this (addressed to this connection) is written before `frame`: a reply the
    /// protocol says comes after an action (`fetchTurns` after its `chat/turnsLoaded`) names that action.
    pub deliver_first: Option<u64>,
}

impl CommandReply {
    pub fn frame(frame: Bytes) -> Self {
        Self {
            frame: Some(frame),
            ..Self::default()
        }
    }
    pub fn none() -> Self {
        Self::default()
    }

    /// The answer to anything sent for a host whose shard no longer serves it (or never attached the
    /// connection): an error for a request, and a close with 1012 (service restart) either way, so the
    /// client reconnects and lands on the host's current owner.
    pub fn moved(id: Option<u64>) -> Self {
        let mut reply = match id {
            Some(_) => Self::frame(crate::rpc::error_frame(
                id,
                &crate::rpc::RpcError::internal("the host moved to another shard; reconnect"),
            )),
            None => Self::none(),
        };
        reply.close = Some(CloseRequest {
            code: 1012,
            reason: "host moved; reconnect".into(),
        });
        reply
    }
}

/// Why a connection could not be attached to a host.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("host {0} is not available")]
    HostUnavailable(String),
    /// A quota of the tenant is used up (e.g. its open hosts): the reason says which.
    #[error("{0}")]
    OverQuota(String),
    /// Another shard serves the host: ask the one at `owner` (its gRPC URL).
    #[error("host {host} is served by {owner}")]
    Moved { host: String, owner: String },
}

/// Why the shard side cannot take traffic right now (`/readyz` answers 503 with it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

/// The shard as the gateway sees it.
pub trait HostLink: Send + Sync + 'static {
    /// Register a connection on a host and return the host's bus.
    fn attach(
        &self,
        host: &HostKey,
        connection: ConnectionId,
        identity: &Identity,
    ) -> impl Future<Output = Result<BusReceiver, LinkError>> + Send;

    /// Handle one inbound request or notification.
    fn call(
        &self,
        host: &HostKey,
        connection: ConnectionId,
        message: InboundMessage,
    ) -> impl Future<Output = CommandReply> + Send;

    /// The connection is gone (closed, dropped, or evicted).
    fn detach(&self, host: &HostKey, connection: ConnectionId) -> impl Future<Output = ()> + Send;

    /// This process's Prometheus text ([`crate::telemetry::render`]), with the shard side's scrape-time
    /// gauges brought up to date first when the shard side runs in this process. A shard in another process
    /// records into its own recorder and serves it on its own `/metrics`.
    fn metrics(&self) -> impl Future<Output = String> + Send;

    /// Whether the shard side can take traffic: an in-process shard reaches its store; a remote shard answers
    /// a cheap call in time. Callers bound the wait themselves too.
    fn ready(&self) -> impl Future<Output = Result<(), NotReady>> + Send;
}

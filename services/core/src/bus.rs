//! What a host publishes to the gateways: sequenced action envelopes and unsequenced notifications.
//!
//! Every event carries its frame already serialized, so a gateway writes the same bytes to each connection
//! that should receive it. Events of one host are published in `serverSeq` order by the host's single writer;
//! `prev_seq` lets a receiver that may lose messages (Redis pub/sub) detect a gap.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use crate::identity::ConnectionId;

/// Who receives a [`BusEvent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Audience {
    /// Connections subscribed to the event's channel.
    Subscribers,
    /// Only this connection (a rejected action goes back to its dispatcher alone).
    Connection(ConnectionId),
    /// The channel's subscribers and this connection, which dispatched the action without being subscribed
    /// to its channel: the dispatcher always gets its echo.
    SubscribersAnd(ConnectionId),
    /// Every initialized connection of the host.
    Everyone,
}

/// What a [`BusEvent`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusEventKind {
    /// An `action` notification carrying an envelope with `serverSeq`.
    Action,
    /// A protocol notification (not sequenced, never replayed).
    Notification,
    /// The channel was disposed: subscriptions to it end. Carries no frame for clients.
    ChannelDisposed,
}

/// One event on a host's bus.
#[derive(Debug, Clone)]
pub struct BusEvent {
    pub kind: BusEventKind,
    pub channel: Arc<str>,
    /// The envelope's `serverSeq` for [`BusEventKind::Action`], otherwise the host's current `serverSeq`.
    pub seq: u64,
    /// The `serverSeq` of the previous action this host published (0 for none).
    pub prev_seq: u64,
    pub audience: Audience,
    /// The complete JSON-RPC frame, serialized once.
    pub frame: Bytes,
    /// When this process got the event: the shard publishing it (in-process bus) or the gateway receiving it
    /// (gRPC, Redis). Never carried between processes; `None` for events read back from history. Only for
    /// `ahp_relay_fanout_latency_seconds` (see [`crate::telemetry`]).
    pub published_at: Option<Instant>,
}

/// A shared, immutable bus event.
pub type SharedBusEvent = Arc<BusEvent>;

//! What a host publishes to the gateways: sequenced action envelopes and unsequenced notifications.
//!
//! Every event carries its frame already serialized, so a gateway writes the same bytes to each connection
//! that should receive it. Events of one host are published in `serverSeq` order by the host's single writer;
//! `prev_seq` lets a receiver that may lose messages (Redis pub/sub) detect a gap.
//!
//! The unit the bus carries is a [`BusBatch`]: the events of one commit, in order. A batch is one message on
//! every bus (in-process broadcast, Redis, the gRPC `Events` stream), so a gateway wakes once per commit, and
//! each connection filters the whole batch and writes what it admits with one flush. A commit of one action
//! is a batch of one: nothing waits for a batch to fill.

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

/// The events of one commit, in publication order; never empty.
pub type BusBatch = Arc<[SharedBusEvent]>;

/// The frame bytes a batch carries.
pub fn batch_bytes(batch: &[SharedBusEvent]) -> usize {
    batch.iter().map(|event| event.frame.len()).sum()
}

/// A host's bus read event by event rather than batch by batch (for consumers that look at one event at a
/// time, such as tests; the gateway's connections take whole batches).
pub struct EventReceiver {
    batches: tokio::sync::broadcast::Receiver<BusBatch>,
    pending: std::collections::VecDeque<SharedBusEvent>,
}

impl EventReceiver {
    pub fn new(batches: tokio::sync::broadcast::Receiver<BusBatch>) -> Self {
        Self {
            batches,
            pending: std::collections::VecDeque::new(),
        }
    }

    /// The next event; errors as the underlying broadcast reports them (`Lagged` counts batches).
    pub async fn recv(&mut self) -> Result<SharedBusEvent, tokio::sync::broadcast::error::RecvError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(event);
            }
            let batch = self.batches.recv().await?;
            self.pending.extend(batch.iter().cloned());
        }
    }

    /// The next event if one has arrived.
    pub fn try_recv(&mut self) -> Result<SharedBusEvent, tokio::sync::broadcast::error::TryRecvError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(event);
            }
            let batch = self.batches.try_recv()?;
            self.pending.extend(batch.iter().cloned());
        }
    }
}

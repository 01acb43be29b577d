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

/// Bytes of batches a bus keeps for its slowest reader, unless configured otherwise (`Limits::bus_bytes`).
pub const DEFAULT_BUS_BYTES: usize = 64 * 1024 * 1024;

/// Batches a bus keeps beyond the unread ones (see [`BusSender::send`]).
pub const RECENT_BATCHES: usize = 32;

/// A host's bus ring: a broadcast of commit batches bounded in batches (the ring's slots) *and in bytes*.
///
/// The ring carries weak references; the sender keeps alive the newest batches some reader has yet to read,
/// up to `max_bytes` of frames and the ring's slot count (always at least the newest batch). A reader that falls further behind finds its
/// next batch gone and sees [`RecvError::Lagged`](tokio::sync::broadcast::error::RecvError::Lagged), as it
/// would past the ring's slots; it resyncs like any lagging reader. So what a bus holds for its slowest reader
/// is bounded in bytes, however large the batches.
pub struct BusSender {
    ring: tokio::sync::broadcast::Sender<std::sync::Weak<[SharedBusEvent]>>,
    kept: std::sync::Mutex<KeptBatches>,
}

/// The batches a [`BusSender`] keeps alive, oldest first.
struct KeptBatches {
    batches: std::collections::VecDeque<(BusBatch, usize)>,
    bytes: usize,
    max_bytes: usize,
    max_batches: usize,
}

impl BusSender {
    /// A ring of `batches` slots keeping at most `max_bytes` of frames for its slowest reader.
    pub fn new(batches: usize, max_bytes: usize) -> Self {
        let batches = batches.max(1);
        Self {
            ring: tokio::sync::broadcast::channel(batches).0,
            kept: std::sync::Mutex::new(KeptBatches {
                batches: std::collections::VecDeque::new(),
                bytes: 0,
                max_bytes,
                max_batches: batches,
            }),
        }
    }

    /// A new reader, which receives what is sent from now on.
    pub fn subscribe(&self) -> BusReceiver {
        BusReceiver {
            ring: self.ring.subscribe(),
        }
    }

    /// How many readers there are.
    pub fn receiver_count(&self) -> usize {
        self.ring.receiver_count()
    }

    /// Send `batch` to every reader; `Err` (with nothing kept) when there is none.
    pub fn send(&self, batch: BusBatch) -> Result<usize, BusBatch> {
        let bytes = batch_bytes(&batch);
        let mut kept = match self.kept.lock() {
            Ok(kept) => kept,
            Err(poisoned) => poisoned.into_inner(),
        };
        let receivers = match self.ring.send(std::sync::Arc::downgrade(&batch)) {
            Ok(receivers) => receivers,
            Err(_) => {
                kept.batches.clear();
                kept.bytes = 0;
                return Err(batch);
            }
        };
        kept.batches.push_back((batch, bytes));
        kept.bytes += bytes;
        // Only batches some reader has yet to read are kept (as a broadcast ring drops a value every reader
        // has seen), plus the newest few: a reader takes a batch's reference from the ring a moment before it
        // upgrades it, and must not find it dropped in between. Of those, at most the byte bound.
        let unread = self.ring.len().max(1) + RECENT_BATCHES;
        while kept.batches.len() > 1
            && (kept.bytes > kept.max_bytes
                || kept.batches.len() > kept.max_batches
                || kept.batches.len() > unread)
        {
            if let Some((_, oldest)) = kept.batches.pop_front() {
                kept.bytes -= oldest;
            }
        }
        Ok(receivers)
    }

    /// The frame bytes kept for readers now.
    pub fn kept_bytes(&self) -> usize {
        match self.kept.lock() {
            Ok(kept) => kept.bytes,
            Err(poisoned) => poisoned.into_inner().bytes,
        }
    }
}

/// A reader of a [`BusSender`].
pub struct BusReceiver {
    ring: tokio::sync::broadcast::Receiver<std::sync::Weak<[SharedBusEvent]>>,
}

impl BusReceiver {
    /// A reader of a bus that has ended (it reports `Closed`).
    pub fn closed() -> Self {
        Self {
            ring: tokio::sync::broadcast::channel(1).1,
        }
    }

    /// The next batch. `Lagged` when the reader fell behind the ring's slots or its byte bound (then the
    /// count is a lower bound), `Closed` when the bus ended.
    pub async fn recv(&mut self) -> Result<BusBatch, tokio::sync::broadcast::error::RecvError> {
        let batch = self.ring.recv().await?;
        batch
            .upgrade()
            .ok_or(tokio::sync::broadcast::error::RecvError::Lagged(1))
    }

    /// The next batch if one has arrived.
    pub fn try_recv(&mut self) -> Result<BusBatch, tokio::sync::broadcast::error::TryRecvError> {
        let batch = self.ring.try_recv()?;
        batch
            .upgrade()
            .ok_or(tokio::sync::broadcast::error::TryRecvError::Lagged(1))
    }

    /// Whether nothing has arrived that this reader has not read.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Whether `other` reads the same bus.
    pub fn same_bus(&self, other: &BusReceiver) -> bool {
        self.ring.same_channel(&other.ring)
    }

    /// Another reader of the same bus, receiving what is sent from now on.
    pub fn resubscribe(&self) -> Self {
        Self {
            ring: self.ring.resubscribe(),
        }
    }
}

/// A host's bus read event by event rather than batch by batch (for consumers that look at one event at a
/// time, such as tests; the gateway's connections take whole batches).
pub struct EventReceiver {
    batches: BusReceiver,
    pending: std::collections::VecDeque<SharedBusEvent>,
}

impl EventReceiver {
    pub fn new(batches: BusReceiver) -> Self {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(seq: u64, bytes: usize) -> BusBatch {
        Arc::from(vec![Arc::new(BusEvent {
            kind: BusEventKind::Action,
            channel: Arc::from("ahp-chat:/c"),
            seq,
            prev_seq: seq.saturating_sub(1),
            audience: Audience::Subscribers,
            frame: Bytes::from(vec![b'x'; bytes]),
            published_at: None,
        })])
    }

    #[tokio::test]
    async fn a_reader_behind_the_byte_bound_lags_and_a_current_one_gets_everything() {
        use tokio::sync::broadcast::error::RecvError;
        let bus = BusSender::new(1_000, 1_000);
        let mut behind = bus.subscribe();
        let mut current = bus.subscribe();
        let mut sent = Vec::new();
        for seq in 1..=10 {
            let sent_batch = batch(seq, 400);
            sent.push(Arc::downgrade(&sent_batch));
            assert_eq!(bus.send(sent_batch).ok(), Some(2));
            let received = current.recv().await.expect("the current reader's batch");
            assert_eq!(received[0].seq, seq);
        }
        // At most the byte bound (plus the newest batch) is kept alive for the reader that read nothing.
        assert!(bus.kept_bytes() <= 1_000, "{}", bus.kept_bytes());
        assert_eq!(sent.iter().filter(|batch| batch.upgrade().is_some()).count(), 2);
        assert!(matches!(behind.recv().await, Err(RecvError::Lagged(_))));
        // A batch larger than the bound alone is still delivered to a reader that keeps up.
        bus.send(batch(11, 5_000)).expect("send");
        assert_eq!(current.recv().await.expect("large batch")[0].seq, 11);
    }

    #[tokio::test]
    async fn batches_every_reader_has_read_are_not_kept() {
        let bus = BusSender::new(1_000, 1_000_000);
        let mut current = bus.subscribe();
        for seq in 1..=100 {
            bus.send(batch(seq, 400)).expect("send");
            current.recv().await.expect("batch");
        }
        // Only the newest few are kept (the bounds would allow all 100): the others were read by everyone.
        bus.send(batch(101, 400)).expect("send");
        assert!(
            bus.kept_bytes() <= (RECENT_BATCHES + 2) * 400,
            "{}",
            bus.kept_bytes()
        );
    }

    #[test]
    fn a_bus_nobody_reads_keeps_nothing() {
        let bus = BusSender::new(16, 1_000);
        assert!(bus.send(batch(1, 10)).is_err());
        assert_eq!(bus.kept_bytes(), 0);
    }
}

//! The host's single `serverSeq` counter, and the batch of what it has numbered but not yet committed.
//!
//! Every envelope of every channel of a host takes the next number here (design §3) and is serialized once.
//! Nothing is published directly: numbered envelopes, notifications and store writes wait in the
//! [`PendingBatch`] until the host's committer has written them to the store in one transaction; only then are
//! they published, in order (invariant 2, durable before visible).

use std::sync::Arc;

use ahp_types::actions::{ActionEnvelope, ActionOrigin, StateAction};
use bytes::{BufMut, Bytes, BytesMut};
use relay_core::bus::{Audience, BusBatch, BusEvent, BusEventKind};
use relay_core::rpc;
use relay_core::ConnectionId;
use relay_store::{CatalogChange, ClientBinding, CommitBatch, LogEntry, SnapshotEntry};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::replay::{ReplayBuffer, StoredEnvelope};

/// Something numbered or announced, waiting for its batch to commit before it is published.
pub struct Publication {
    pub kind: BusEventKind,
    pub channel: Arc<str>,
    pub seq: u64,
    pub audience: Audience,
    pub frame: Bytes,
}

/// What the committer takes in one go: the store writes and the publications they make visible.
#[derive(Default)]
pub struct PendingBatch {
    /// The batch's number: batches commit in this order, and a reply waits for the number it depends on.
    pub number: u64,
    pub last_seq: u64,
    pub log: Vec<LogEntry>,
    pub snapshots: Vec<SnapshotEntry>,
    pub catalog: Vec<CatalogChange>,
    pub disposed: Vec<String>,
    pub bindings: Vec<ClientBinding>,
    pub publications: Vec<Publication>,
}

impl PendingBatch {
    pub fn is_empty(&self) -> bool {
        self.publications.is_empty()
            && self.log.is_empty()
            && self.snapshots.is_empty()
            && self.catalog.is_empty()
            && self.disposed.is_empty()
            && self.bindings.is_empty()
    }

    /// The envelopes numbered in this batch (accepted, rejected and per-connection ones): what its commit makes
    /// visible, counted in `ahp_relay_actions_total`.
    pub fn envelope_count(&self) -> usize {
        self.publications
            .iter()
            .filter(|p| p.kind == BusEventKind::Action)
            .count()
    }

    /// Split into the store's batch and the publications to make after it commits.
    pub fn into_parts(self) -> (CommitBatch, Vec<Publication>) {
        (
            CommitBatch {
                last_seq: self.last_seq,
                log: self.log,
                snapshots: self.snapshots,
                catalog: self.catalog,
                disposed: self.disposed,
                bindings: self.bindings,
            },
            self.publications,
        )
    }
}

/// Numbers a host's envelopes and collects them for the committer.
pub struct Sequencer {
    seq: u64,
    replay: ReplayBuffer,
    pending: PendingBatch,
}

/// The number of the batch that must be committed before something is visible (0: nothing to wait for).
pub type CommitBarrier = u64;

impl Sequencer {
    /// Continue after `last_seq`, the highest number the store says was ever committed for this host,
    /// keeping up to `replay_capacity` envelopes of up to `replay_bytes` for replay.
    pub fn new(last_seq: u64, replay_capacity: usize, replay_bytes: usize) -> Self {
        Self {
            seq: last_seq,
            replay: ReplayBuffer::new(replay_capacity, replay_bytes, last_seq),
            pending: PendingBatch {
                number: 1,
                last_seq,
                ..PendingBatch::default()
            },
        }
    }

    /// The last `serverSeq` assigned (committed or not).
    pub fn current(&self) -> u64 {
        self.seq
    }

    pub fn replay(&self) -> &ReplayBuffer {
        &self.replay
    }

    /// Publications waiting for the next commit.
    pub fn pending_len(&self) -> usize {
        self.pending.publications.len()
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Hand the pending batch to the committer (empty batches are not handed out and keep their number).
    pub fn take_pending(&mut self) -> PendingBatch {
        if self.pending.is_empty() {
            return PendingBatch::default();
        }
        let next = self.pending.number + 1;
        std::mem::replace(
            &mut self.pending,
            PendingBatch {
                number: next,
                last_seq: self.seq,
                ..PendingBatch::default()
            },
        )
    }

    /// What a reply given now must wait for: everything queued so far committed.
    pub fn barrier(&self) -> CommitBarrier {
        if self.pending.is_empty() {
            self.pending.number - 1
        } else {
            self.pending.number
        }
    }

    /// Sequence an accepted action: logged, kept for replay, and published to the channel's subscribers.
    pub fn accept(&mut self, channel: &str, action: &StateAction, origin: Option<ActionOrigin>) -> u64 {
        self.accept_for(channel, action, origin, Audience::Subscribers)
            .map_or(self.seq, |stored| stored.seq)
    }

    /// Sequence an accepted action for `audience` (its channel's subscribers, and maybe its dispatcher);
    /// returns the stored envelope (`None` only if it could not be serialized).
    pub fn accept_for(
        &mut self,
        channel: &str,
        action: &StateAction,
        origin: Option<ActionOrigin>,
        audience: Audience,
    ) -> Option<Arc<StoredEnvelope>> {
        let seq = self.next();
        let (envelope, frame) = encode(channel, action, seq, origin, None)?;
        self.pending.log.push(LogEntry {
            seq,
            channel: channel.to_string(),
            envelope: envelope.get().to_string(),
            at_ms: now_ms(),
        });
        let stored = Arc::new(StoredEnvelope {
            seq,
            channel: channel.into(),
            envelope,
            frame: frame.clone(),
        });
        self.replay.push(stored.clone());
        self.publish(BusEventKind::Action, channel, seq, audience, frame);
        Some(stored)
    }

    /// Sequence an envelope for one connection only (a rejection, or a `chat/turnsLoaded` page). It is not
    /// logged, so no replay ever contains it, but its number is committed so it is never reused. Returns it
    /// (`None` only if it could not be serialized).
    pub fn private(
        &mut self,
        connection: ConnectionId,
        channel: &str,
        action: &StateAction,
        origin: Option<ActionOrigin>,
        rejection_reason: Option<String>,
    ) -> Option<Arc<StoredEnvelope>> {
        let seq = self.next();
        let (envelope, frame) = encode(channel, action, seq, origin, rejection_reason)?;
        self.publish(
            BusEventKind::Action,
            channel,
            seq,
            Audience::Connection(connection),
            frame.clone(),
        );
        Some(Arc::new(StoredEnvelope {
            seq,
            channel: channel.into(),
            envelope,
            frame,
        }))
    }

    /// An unsequenced protocol notification to the subscribers of `channel` (`root/session*` go to the root
    /// channel's subscribers).
    pub fn notify<P: Serialize>(&mut self, channel: &str, method: &str, params: &P) {
        match rpc::notification_frame(method, params) {
            Ok(frame) => {
                let seq = self.seq;
                self.publish(
                    BusEventKind::Notification,
                    channel,
                    seq,
                    Audience::Subscribers,
                    frame,
                )
            }
            Err(error) => tracing::error!(%error, method, "could not serialize notification"),
        }
    }

    /// `channel` is gone: its stored state is deleted and gateways drop subscriptions to it.
    pub fn dispose(&mut self, channel: &str) {
        self.forget(channel);
        let seq = self.seq;
        self.publish(
            BusEventKind::ChannelDisposed,
            channel,
            seq,
            Audience::Subscribers,
            Bytes::new(),
        );
    }

    /// Delete stored state that is not a channel of its own (a chat's turn archive). A snapshot of `key`
    /// queued earlier in this batch is dropped: the store applies a batch's deletions before its snapshots,
    /// so the batch must say only what the channel's last fate in it is.
    pub fn forget(&mut self, key: &str) {
        self.pending.snapshots.retain(|snapshot| snapshot.channel != key);
        if !self.pending.disposed.iter().any(|disposed| disposed == key) {
            self.pending.disposed.push(key.to_string());
        }
    }

    /// Store a snapshot of a channel at the current `serverSeq` (after any deletion of it queued earlier in
    /// this batch: a channel disposed and created again keeps its new snapshot).
    pub fn snapshot(&mut self, channel: &str, parent: Option<&str>, state: String) {
        self.pending.snapshots.push(SnapshotEntry {
            channel: channel.to_string(),
            parent: parent.map(str::to_string),
            seq: self.seq,
            state,
        });
    }

    /// Record that `client_id` belongs to `subject` (durably, with the next batch).
    pub fn bind_client(&mut self, client_id: &str, subject: &str) {
        self.pending.bindings.push(ClientBinding {
            client_id: client_id.to_string(),
            subject: subject.to_string(),
        });
    }

    pub fn catalog(&mut self, change: CatalogChange) {
        self.pending.catalog.push(change);
    }

    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.pending.last_seq = self.seq;
        self.seq
    }

    fn publish(&mut self, kind: BusEventKind, channel: &str, seq: u64, audience: Audience, frame: Bytes) {
        self.pending.publications.push(Publication {
            kind,
            channel: channel.into(),
            seq,
            audience,
            frame,
        });
    }
}

/// Turns committed publications into bus events, tracking `prev_seq` for gap detection.
///
/// The bus's ring (a broadcast channel of `bus_capacity` slots) exists only while someone listens: it is made
/// at the first subscribe and dropped at the first publish that finds no receiver, so a host nobody is
/// connected to holds no ring.
pub struct Publisher {
    last_published: u64,
    bus_capacity: usize,
    bus: Bus,
}

enum Bus {
    /// Nobody listens: no ring is allocated.
    Idle,
    Open(tokio::sync::broadcast::Sender<BusBatch>),
    /// Closed for good (the host was deposed): receivers see the bus end.
    Closed,
}

impl Publisher {
    pub fn new(last_seq: u64, bus_capacity: usize) -> Self {
        Self {
            last_published: last_seq,
            bus_capacity: bus_capacity.max(16),
            bus: Bus::Idle,
        }
    }

    /// A receiver of the bus; once the bus is closed, one that reports it closed.
    pub fn subscribe(&mut self) -> tokio::sync::broadcast::Receiver<BusBatch> {
        match &self.bus {
            Bus::Open(bus) => bus.subscribe(),
            Bus::Idle => {
                let (bus, receiver) = tokio::sync::broadcast::channel(self.bus_capacity);
                self.bus = Bus::Open(bus);
                receiver
            }
            Bus::Closed => tokio::sync::broadcast::channel(1).1,
        }
    }

    /// Close the bus: every receiver sees it end after the events it already holds.
    pub fn close(&mut self) {
        self.bus = Bus::Closed;
    }

    /// The `serverSeq` of the last action published (what the next event's `prev_seq` will be).
    pub fn last_published(&self) -> u64 {
        self.last_published
    }

    /// Publish one commit's publications on the local bus as one batch; returns the batch, for other buses
    /// (Redis) to carry too. `None` when there is nothing to publish.
    pub fn publish(&mut self, publications: Vec<Publication>) -> Option<BusBatch> {
        if publications.is_empty() {
            return None;
        }
        let now = std::time::Instant::now();
        let batch: BusBatch = publications
            .into_iter()
            .map(|publication| {
                let prev_seq = self.last_published;
                if publication.kind == BusEventKind::Action {
                    self.last_published = publication.seq;
                }
                Arc::new(BusEvent {
                    kind: publication.kind,
                    channel: publication.channel,
                    seq: publication.seq,
                    prev_seq,
                    audience: publication.audience,
                    frame: publication.frame,
                    published_at: Some(now),
                })
            })
            .collect();
        // No receivers means no connection is attached right now: the ring is freed until the next one.
        if let Bus::Open(bus) = &self.bus {
            if bus.send(batch.clone()).is_err() {
                self.bus = Bus::Idle;
            }
        }
        Some(batch)
    }
}

pub fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// Serialize an envelope once: its JSON and the `action` notification frame around it.
fn encode(
    channel: &str,
    action: &StateAction,
    seq: u64,
    origin: Option<ActionOrigin>,
    rejection_reason: Option<String>,
) -> Option<(Box<RawValue>, Bytes)> {
    let envelope = ActionEnvelope {
        channel: channel.to_string(),
        action: action.clone(),
        server_seq: seq,
        origin,
        rejection_reason,
    };
    let json = match serde_json::to_string(&envelope) {
        Ok(json) => json,
        Err(error) => {
            tracing::error!(%error, seq, "could not serialize envelope");
            return None;
        }
    };
    Some(frame_around(json))
}

/// The `action` notification frame for an envelope's JSON.
pub fn frame_around(json: String) -> (Box<RawValue>, Bytes) {
    const HEAD: &[u8] = br#"{"jsonrpc":"2.0","method":"action","params":"#;
    let mut frame = BytesMut::with_capacity(HEAD.len() + json.len() + 1);
    frame.put_slice(HEAD);
    frame.put_slice(json.as_bytes());
    frame.put_u8(b'}');
    let frame = frame.freeze();
    // `json` came from serde_json, so it is valid JSON.
    let raw = RawValue::from_string(json).unwrap_or_else(|_| Box::<RawValue>::default());
    (raw, frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channels(batch: &PendingBatch) -> (Vec<&str>, Vec<&str>) {
        (
            batch.snapshots.iter().map(|s| s.channel.as_str()).collect(),
            batch.disposed.iter().map(String::as_str).collect(),
        )
    }

    #[test]
    fn a_batch_keeps_only_the_last_fate_of_each_channel() {
        let mut seq = Sequencer::new(0, 16, usize::MAX);
        // created, then disposed in the same batch: nothing of it may be stored
        seq.snapshot("ahp-session:/a", None, "{}".into());
        seq.dispose("ahp-session:/a");
        // disposed, then created again: the new snapshot is stored after the deletion
        seq.dispose("ahp-session:/b");
        seq.snapshot("ahp-session:/b", None, "{}".into());
        let batch = seq.take_pending();
        let (snapshots, disposed) = channels(&batch);
        assert_eq!(snapshots, ["ahp-session:/b"]);
        assert_eq!(disposed, ["ahp-session:/a", "ahp-session:/b"]);
    }
}

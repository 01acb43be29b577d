//! The host's single `serverSeq` counter, and the batch of what it has numbered but not yet committed.
//!
//! Every envelope of every channel of a host takes the next number here (design §3) and is serialized once.
//! Nothing is published directly: numbered envelopes, notifications and store writes wait in the
//! [`PendingBatch`] until the host's committer has written them to the store in one transaction; only then are
//! they published, in order (invariant 2, durable before visible).
//!
//! Everything queued is tagged with the *unit* that queued it: one message of one connection (or one piece of
//! the host's own work). A batch the store refuses for good is split into its units ([`UnitTags::split`]), so
//! the committer can write the others and fail only the unit at fault.

use std::collections::HashSet;
use std::sync::Arc;

use ahp_types::actions::{ActionEnvelope, ActionOrigin, StateAction};
use bytes::{BufMut, Bytes, BytesMut};
use relay_core::bus::{Audience, BusEventKind};
use relay_core::rpc;
use relay_core::ConnectionId;
use relay_store::{ArchivedTurn, CatalogChange, ClientBinding, LogEntry, SnapshotEntry, StoredContent};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::host::replay_buffer::{ReplayBuffer, StoredEnvelope};

pub use super::pending_batch::{PendingBatch, Publication, Unit, UnitId, UnitTags};
pub use super::publisher::Publisher;

/// Numbers a host's envelopes and collects them for the committer.
pub struct Sequencer {
    seq: u64,
    replay: ReplayBuffer,
    pending: PendingBatch,
    /// The unit queuing now, and the next unit's id.
    unit: UnitId,
    next_unit: UnitId,
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
            unit: 0,
            next_unit: 1,
        }
    }

    /// What is queued from now on is one unit: `owner`'s message (or, `None`, the host's own work). Returns
    /// the unit's id.
    pub fn begin_unit(&mut self, owner: Option<ConnectionId>) -> UnitId {
        self.unit = self.next_unit;
        self.next_unit += 1;
        if let Some(owner) = owner {
            self.pending.owners.insert(self.unit, owner);
        }
        self.unit
    }

    /// The replay buffer, to drop what a failed unit numbered.
    pub fn replay_mut(&mut self) -> &mut ReplayBuffer {
        &mut self.replay
    }

    /// Take out the queued units that touched `channels` (see [`PendingBatch::take_units_touching`]).
    pub fn take_units_touching(&mut self, channels: &HashSet<String>) -> Vec<Unit> {
        self.pending.take_units_touching(channels)
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

    /// About how many bytes the pending batch holds.
    pub fn pending_bytes(&self) -> usize {
        self.pending.bytes
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
        self.pending.bytes += envelope.get().len() + frame.len();
        self.pending.log.push((
            self.unit,
            LogEntry {
                seq,
                channel: channel.to_string(),
                envelope: envelope.get().to_string(),
                at_ms: now_ms(),
            },
        ));
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
        self.pending
            .snapshots
            .retain(|(_, snapshot)| snapshot.channel != key);
        self.pending.turns.retain(|(_, turn)| turn.archive != key);
        if !self.pending.disposed.iter().any(|(_, disposed)| disposed == key) {
            self.pending.disposed.push((self.unit, key.to_string()));
        }
    }

    /// Store a snapshot of a channel at the current `serverSeq` (after any deletion of it queued earlier in
    /// this batch: a channel disposed and created again keeps its new snapshot).
    pub fn snapshot(&mut self, channel: &str, parent: Option<&str>, state: String) {
        self.pending.bytes += state.len();
        self.pending.snapshots.push((
            self.unit,
            SnapshotEntry {
                channel: channel.to_string(),
                parent: parent.map(str::to_string),
                seq: self.seq,
                state,
            },
        ));
    }

    /// Store a content an action of this batch names by reference (`ahp-content:/<id>`), owned by `owner` (a
    /// session).
    pub fn content(&mut self, content: StoredContent) {
        self.pending.bytes += content.data.len();
        self.pending.contents.push((self.unit, content));
    }

    /// Move a turn into the archive `archive` (a chat's archive key) at absolute index `turn_no` (after any
    /// deletion of that archive queued earlier in this batch).
    pub fn archive_turn(&mut self, archive: String, turn_no: u64, turn_id: String, turn: String) {
        self.pending.bytes += turn.len();
        self.pending.turns.push((
            self.unit,
            ArchivedTurn {
                archive,
                turn_no,
                turn_id,
                turn,
            },
        ));
    }

    /// Record that `client_id` belongs to `subject` and was used now (durably, with the next batch).
    pub fn bind_client(&mut self, client_id: &str, subject: &str) {
        self.pending.bindings.push((
            self.unit,
            ClientBinding {
                client_id: client_id.to_string(),
                subject: subject.to_string(),
                used_at_ms: now_ms(),
            },
        ));
    }

    pub fn catalog(&mut self, change: CatalogChange) {
        self.pending.catalog.push((self.unit, change));
    }

    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.pending.last_seq = self.seq;
        self.seq
    }

    fn publish(&mut self, kind: BusEventKind, channel: &str, seq: u64, audience: Audience, frame: Bytes) {
        self.pending.publications.push((
            self.unit,
            Publication {
                kind,
                channel: relay_core::channel_names::shared(channel),
                seq,
                audience,
                frame,
            },
        ));
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

    const ROOT: &str = ahp_types::ROOT_RESOURCE_URI;

    fn channels(batch: &PendingBatch) -> (Vec<&str>, Vec<&str>) {
        (
            batch.snapshots.iter().map(|(_, s)| s.channel.as_str()).collect(),
            batch.disposed.iter().map(|(_, d)| d.as_str()).collect(),
        )
    }

    fn draft(text: &str) -> StateAction {
        serde_json::from_value(serde_json::json!({
            "type": "chat/draftChanged",
            "draft": {"text": text}
        }))
        .expect("an action")
    }

    #[test]
    fn a_batch_splits_into_its_units_and_takes_out_those_touching_a_channel() {
        let mut seq = Sequencer::new(0, 16, usize::MAX);
        let a = seq.begin_unit(Some(ConnectionId(1)));
        seq.accept("ahp-chat:/x", &draft("a"), None);
        seq.snapshot("ahp-chat:/x", Some("ahp-session:/s"), "{}".into());
        let host_work = seq.begin_unit(None);
        seq.accept("ahp-chat:/y", &draft("agent"), None);
        let b = seq.begin_unit(Some(ConnectionId(2)));
        seq.accept("ahp-chat:/x", &draft("b"), None);
        seq.notify(ROOT, "root/sessionSummaryChanged", &serde_json::json!({}));
        let c = seq.begin_unit(Some(ConnectionId(3)));
        seq.accept("ahp-chat:/z", &draft("c"), None);

        // Units touching x (the notification on root is no state change) come out; the rest stay queued.
        let taken = seq.take_units_touching(&HashSet::from(["ahp-chat:/x".to_string()]));
        assert_eq!(taken.iter().map(|u| u.id).collect::<Vec<_>>(), [a, b]);
        assert_eq!(taken[0].owner, Some(ConnectionId(1)));
        assert_eq!(taken[0].commit.log.len(), 1);
        assert_eq!(taken[0].commit.snapshots.len(), 1);
        assert_eq!(taken[0].commit.last_seq, 1);
        assert_eq!(taken[1].publications.len(), 2, "its action and its notification");

        let (commit, publications, tags) = seq.take_pending().into_parts();
        let units = tags.split(commit, publications);
        assert_eq!(units.iter().map(|u| u.id).collect::<Vec<_>>(), [host_work, c]);
        assert_eq!(units[0].owner, None);
        assert_eq!(units[1].owner, Some(ConnectionId(3)));
        assert_eq!(units[1].commit.log[0].channel, "ahp-chat:/z");
        assert_eq!(units[1].seqs(), HashSet::from([4]));
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

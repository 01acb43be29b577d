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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use ahp_types::actions::{ActionEnvelope, ActionOrigin, StateAction};
use bytes::{BufMut, Bytes, BytesMut};
use relay_core::bus::{Audience, BusBatch, BusEvent, BusEventKind, BusReceiver, BusSender};
use relay_core::rpc;
use relay_core::ConnectionId;
use relay_store::{
    ArchivedTurn, CatalogChange, ClientBinding, CommitBatch, LogEntry, SnapshotEntry, StoredContent,
};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::replay::buffer::{ReplayBuffer, StoredEnvelope};

/// Something numbered or announced, waiting for its batch to commit before it is published.
pub struct Publication {
    pub kind: BusEventKind,
    pub channel: Arc<str>,
    pub seq: u64,
    pub audience: Audience,
    pub frame: Bytes,
}

/// The unit something in a batch was queued by.
pub type UnitId = u64;

/// What the committer takes in one go: the store writes and the publications they make visible, each tagged
/// with its unit.
#[derive(Default)]
pub struct PendingBatch {
    /// The batch's number: batches commit in this order, and a reply waits for the number it depends on.
    pub number: u64,
    pub last_seq: u64,
    pub log: Vec<(UnitId, LogEntry)>,
    pub snapshots: Vec<(UnitId, SnapshotEntry)>,
    pub catalog: Vec<(UnitId, CatalogChange)>,
    pub disposed: Vec<(UnitId, String)>,
    pub bindings: Vec<(UnitId, ClientBinding)>,
    pub turns: Vec<(UnitId, ArchivedTurn)>,
    pub contents: Vec<(UnitId, StoredContent)>,
    pub publications: Vec<(UnitId, Publication)>,
    /// The connection whose message each unit handled (units of the host's own work have none).
    pub owners: HashMap<UnitId, ConnectionId>,
    /// About how many bytes it holds (envelopes and their frames, snapshots, archived turns, contents).
    pub bytes: usize,
}

/// Which unit queued each part of a batch split by [`PendingBatch::into_parts`], to split it again.
#[derive(Default)]
pub struct UnitTags {
    log: Vec<UnitId>,
    snapshots: Vec<UnitId>,
    catalog: Vec<UnitId>,
    disposed: Vec<UnitId>,
    bindings: Vec<UnitId>,
    turns: Vec<UnitId>,
    contents: Vec<UnitId>,
    publications: Vec<UnitId>,
    owners: HashMap<UnitId, ConnectionId>,
}

/// One unit of a batch: its store writes and publications, and whose message it was.
pub struct Unit {
    pub id: UnitId,
    pub owner: Option<ConnectionId>,
    pub commit: CommitBatch,
    pub publications: Vec<Publication>,
}

impl Unit {
    /// Every channel (or stored key) the unit wrote or published to.
    pub fn channels(&self) -> HashSet<String> {
        let mut channels: HashSet<String> = self.commit.log.iter().map(|e| e.channel.clone()).collect();
        channels.extend(self.commit.snapshots.iter().map(|s| s.channel.clone()));
        channels.extend(self.commit.snapshots.iter().filter_map(|s| s.parent.clone()));
        channels.extend(self.commit.disposed.iter().cloned());
        channels.extend(self.commit.turns.iter().map(|t| t.archive.clone()));
        // Actions only: notifications (a session's summary announced on the root channel) change no state.
        channels.extend(
            self.publications
                .iter()
                .filter(|p| p.kind == BusEventKind::Action)
                .map(|p| p.channel.to_string()),
        );
        channels
    }

    /// Every `serverSeq` the unit numbered.
    pub fn seqs(&self) -> HashSet<u64> {
        let mut seqs: HashSet<u64> = self.commit.log.iter().map(|e| e.seq).collect();
        seqs.extend(
            self.publications
                .iter()
                .filter(|p| p.kind == BusEventKind::Action)
                .map(|p| p.seq),
        );
        seqs
    }
}

impl UnitTags {
    /// Split `commit` and `publications` (as [`PendingBatch::into_parts`] made them) into their units, in the
    /// order they were queued. Each unit's commit carries the highest `serverSeq` it numbered.
    pub fn split(self, commit: CommitBatch, publications: Vec<Publication>) -> Vec<Unit> {
        let mut units: BTreeMap<UnitId, Unit> = BTreeMap::new();
        let owners = self.owners;
        fn unit<'a>(
            units: &'a mut BTreeMap<UnitId, Unit>,
            owners: &HashMap<UnitId, ConnectionId>,
            id: UnitId,
        ) -> &'a mut Unit {
            units.entry(id).or_insert_with(|| Unit {
                id,
                owner: owners.get(&id).copied(),
                commit: CommitBatch::default(),
                publications: Vec::new(),
            })
        }
        for (id, entry) in self.log.into_iter().zip(commit.log) {
            unit(&mut units, &owners, id).commit.log.push(entry);
        }
        for (id, entry) in self.snapshots.into_iter().zip(commit.snapshots) {
            unit(&mut units, &owners, id).commit.snapshots.push(entry);
        }
        for (id, entry) in self.catalog.into_iter().zip(commit.catalog) {
            unit(&mut units, &owners, id).commit.catalog.push(entry);
        }
        for (id, entry) in self.disposed.into_iter().zip(commit.disposed) {
            unit(&mut units, &owners, id).commit.disposed.push(entry);
        }
        for (id, entry) in self.bindings.into_iter().zip(commit.bindings) {
            unit(&mut units, &owners, id).commit.bindings.push(entry);
        }
        for (id, entry) in self.turns.into_iter().zip(commit.turns) {
            unit(&mut units, &owners, id).commit.turns.push(entry);
        }
        for (id, entry) in self.contents.into_iter().zip(commit.contents) {
            unit(&mut units, &owners, id).commit.contents.push(entry);
        }
        for (id, publication) in self.publications.into_iter().zip(publications) {
            unit(&mut units, &owners, id).publications.push(publication);
        }
        let mut units: Vec<Unit> = units.into_values().collect();
        for unit in &mut units {
            unit.commit.last_seq = unit.seqs().into_iter().max().unwrap_or(0);
        }
        units
    }
}

impl PendingBatch {
    pub fn is_empty(&self) -> bool {
        self.publications.is_empty()
            && self.log.is_empty()
            && self.snapshots.is_empty()
            && self.catalog.is_empty()
            && self.disposed.is_empty()
            && self.bindings.is_empty()
            && self.turns.is_empty()
            && self.contents.is_empty()
    }

    /// The envelopes numbered in this batch (accepted, rejected and per-connection ones): what its commit makes
    /// visible, counted in `ahp_relay_actions_total`.
    pub fn envelope_count(&self) -> usize {
        self.publications
            .iter()
            .filter(|(_, p)| p.kind == BusEventKind::Action)
            .count()
    }

    /// Split into the store's batch, the publications to make after it commits, and which unit queued what.
    pub fn into_parts(self) -> (CommitBatch, Vec<Publication>, UnitTags) {
        let (log_units, log) = self.log.into_iter().unzip();
        let (snapshot_units, snapshots) = self.snapshots.into_iter().unzip();
        let (catalog_units, catalog) = self.catalog.into_iter().unzip();
        let (disposed_units, disposed) = self.disposed.into_iter().unzip();
        let (binding_units, bindings) = self.bindings.into_iter().unzip();
        let (turn_units, turns) = self.turns.into_iter().unzip();
        let (content_units, contents) = self.contents.into_iter().unzip();
        let (publication_units, publications) = self.publications.into_iter().unzip();
        (
            CommitBatch {
                last_seq: self.last_seq,
                log,
                snapshots,
                catalog,
                disposed,
                bindings,
                turns,
                contents,
            },
            publications,
            UnitTags {
                log: log_units,
                snapshots: snapshot_units,
                catalog: catalog_units,
                disposed: disposed_units,
                bindings: binding_units,
                turns: turn_units,
                contents: content_units,
                publications: publication_units,
                owners: self.owners,
            },
        )
    }

    /// Take out every unit that touched one of `channels` (it was reduced against state that is being
    /// reloaded), leaving the rest queued; the units taken, split.
    pub fn take_units_touching(&mut self, channels: &HashSet<String>) -> Vec<Unit> {
        let mut touching: HashSet<UnitId> = HashSet::new();
        touching.extend(
            self.log
                .iter()
                .filter(|(_, e)| channels.contains(&e.channel))
                .map(|(u, _)| *u),
        );
        touching.extend(
            self.snapshots
                .iter()
                .filter(|(_, s)| {
                    channels.contains(&s.channel) || s.parent.as_ref().is_some_and(|p| channels.contains(p))
                })
                .map(|(u, _)| *u),
        );
        touching.extend(
            self.disposed
                .iter()
                .filter(|(_, d)| channels.contains(d))
                .map(|(u, _)| *u),
        );
        touching.extend(
            self.publications
                .iter()
                .filter(|(_, p)| p.kind == BusEventKind::Action && channels.contains(p.channel.as_ref()))
                .map(|(u, _)| *u),
        );
        // A chat's archive is its chat's: a unit that moved turns out of a reloaded chat goes with it.
        let archives: HashSet<String> = channels.iter().map(|c| crate::model::archive::key(c)).collect();
        touching.extend(
            self.turns
                .iter()
                .filter(|(_, t)| archives.contains(&t.archive))
                .map(|(u, _)| *u),
        );
        if touching.is_empty() {
            return Vec::new();
        }
        let mut taken = PendingBatch::default();
        fn part<T>(from: &mut Vec<(UnitId, T)>, to: &mut Vec<(UnitId, T)>, units: &HashSet<UnitId>) {
            let (out, keep): (Vec<_>, Vec<_>) = std::mem::take(from)
                .into_iter()
                .partition(|(u, _)| units.contains(u));
            *from = keep;
            *to = out;
        }
        part(&mut self.log, &mut taken.log, &touching);
        part(&mut self.snapshots, &mut taken.snapshots, &touching);
        part(&mut self.catalog, &mut taken.catalog, &touching);
        part(&mut self.disposed, &mut taken.disposed, &touching);
        part(&mut self.bindings, &mut taken.bindings, &touching);
        part(&mut self.turns, &mut taken.turns, &touching);
        part(&mut self.contents, &mut taken.contents, &touching);
        part(&mut self.publications, &mut taken.publications, &touching);
        taken.owners = touching
            .iter()
            .filter_map(|u| self.owners.get(u).map(|owner| (*u, *owner)))
            .collect();
        let (commit, publications, tags) = taken.into_parts();
        tags.split(commit, publications)
    }
}

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
                channel: channel.into(),
                seq,
                audience,
                frame,
            },
        ));
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
    bus_bytes: usize,
    bus: Bus,
}

enum Bus {
    /// Nobody listens: no ring is allocated.
    Idle,
    Open(BusSender),
    /// Closed for good (the host was deposed): receivers see the bus end.
    Closed,
}

impl Publisher {
    /// A publisher whose ring holds `bus_capacity` batches and at most `bus_bytes` of them for its slowest
    /// reader (see [`BusSender`]).
    pub fn new(last_seq: u64, bus_capacity: usize, bus_bytes: usize) -> Self {
        Self {
            last_published: last_seq,
            bus_capacity: bus_capacity.max(16),
            bus_bytes,
            bus: Bus::Idle,
        }
    }

    /// A receiver of the bus; once the bus is closed, one that reports it closed.
    pub fn subscribe(&mut self) -> BusReceiver {
        match &self.bus {
            Bus::Open(bus) => bus.subscribe(),
            Bus::Idle => {
                let bus = BusSender::new(self.bus_capacity, self.bus_bytes);
                let receiver = bus.subscribe();
                self.bus = Bus::Open(bus);
                receiver
            }
            Bus::Closed => BusReceiver::closed(),
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

//! What a host has numbered but not yet committed: the pending batch, the publications it will make once
//! committed, and its units of work (one connection's message, or one piece of the host's own work), which
//! salvage writes one by one when the store refuses the batch.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use relay_core::bus::{Audience, BusEventKind};
use relay_core::ConnectionId;
use relay_store::{
    ArchivedTurn, CatalogChange, ClientBinding, CommitBatch, LogEntry, SnapshotEntry, StoredContent,
};

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

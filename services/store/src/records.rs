//! The plain values that go in and out of the store: what one commit writes (`CommitBatch` and its parts) and
//! what the read operations return. JSON travels as raw text, exactly as the shard serialized it.

/// A host's durable counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRecord {
    /// The highest serverSeq ever committed for the host, logged or not: a new owner starts after it.
    pub last_seq: u64,
    /// The highest serverSeq removed from the log by compaction (0 if none): replay from the store is exact
    /// only for a resume point at or above it.
    pub log_floor: u64,
    /// The catalogue number the next new session gets: 1 + the highest ever used, never reused.
    pub next_catalog_no: u64,
}

/// A host's ownership lease: who may write the host, under which fencing epoch, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The host's tenant.
    pub tenant: String,
    /// The host.
    pub host: String,
    /// Who holds it (a shard; the name must be unique per process, see [`crate::Store::acquire_lease`]).
    pub owner: String,
    /// The fencing epoch: 1 for the host's first owner, one more at every change of owner, never reused.
    /// [`crate::Store::commit_fenced`] accepts a batch only under the host's current epoch.
    pub epoch: u64,
    /// Unix ms at which the lease lapses unless renewed: it is held while `now < expires_at_ms`.
    pub expires_at_ms: i64,
}

/// Everything one group commit writes, atomically.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitBatch {
    /// The highest serverSeq assigned in this batch, including envelopes that are not logged (rejections).
    pub last_seq: u64,
    /// Envelopes to append to the log.
    pub log: Vec<LogEntry>,
    /// Snapshots to store; for a channel named more than once the highest `seq` wins (the later on a tie).
    pub snapshots: Vec<SnapshotEntry>,
    /// Catalogue changes, applied in order.
    pub catalog: Vec<CatalogChange>,
    /// Channels whose snapshot rows must be deleted. Applied *before* `snapshots`: a channel disposed and
    /// re-created under the same URI in one batch keeps the new snapshot. A writer that disposes a channel
    /// after snapshotting it in the same batch must drop that snapshot from the batch (the shard's sequencer
    /// does).
    pub disposed: Vec<String>,
    /// New clientId bindings to record; a clientId already bound keeps its first subject.
    pub bindings: Vec<ClientBinding>,
    /// Turns moved out of their chats' live state into their archives. Written after `disposed` (which
    /// deletes archives by key): an archive dropped and written again in one batch keeps the new turns.
    pub turns: Vec<ArchivedTurn>,
    /// Content the batch's actions name by reference. Written after `disposed` (which deletes a disposed
    /// session's contents).
    pub contents: Vec<StoredContent>,
}

impl CommitBatch {
    /// Whether the batch records nothing but the highest serverSeq it used: it carries envelopes that are not
    /// logged (rejections, a connection's own replies) and no change of state.
    pub fn records_only_last_seq(&self) -> bool {
        self.log.is_empty()
            && self.snapshots.is_empty()
            && self.catalog.is_empty()
            && self.disposed.is_empty()
            && self.bindings.is_empty()
            && self.turns.is_empty()
            && self.contents.is_empty()
    }
}

/// Content an action names by reference (`ahp-content:/<id>`), owned by a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredContent {
    pub id: String,
    /// The session it belongs to (it goes with it).
    pub owner: String,
    pub content_type: String,
    /// The bytes, base64.
    pub data: String,
}

/// One turn of a chat's archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedTurn {
    /// The chat's archive key (the shard names it; deleting the key in `disposed` deletes the archive).
    pub archive: String,
    /// The turn's absolute index in its chat (0: the chat's first turn).
    pub turn_no: u64,
    /// The turn's id, to find it by.
    pub turn_id: String,
    /// The turn, raw JSON text.
    pub turn: String,
}

/// An AHP clientId of a host and the user it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientBinding {
    pub client_id: String,
    /// The token subject that first used the clientId.
    pub subject: String,
    /// When it was used (unix ms): recorded again on every use, so a binding in use is never pruned.
    pub used_at_ms: i64,
}

/// One envelope in a host's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Its serverSeq.
    pub seq: u64,
    /// The channel URI it belongs to.
    pub channel: String,
    /// The envelope, raw JSON text.
    pub envelope: String,
    /// When it was committed, unix milliseconds (retention compares against it).
    pub at_ms: i64,
}

/// The state of one channel as of one serverSeq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// The channel URI.
    pub channel: String,
    /// For a chat, the URI of its session; `None` otherwise.
    pub parent: Option<String>,
    /// The serverSeq the state includes every envelope up to.
    pub seq: u64,
    /// The channel state, raw JSON text.
    pub state: String,
}

/// A change to the sessions catalogue behind `listSessions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogChange {
    /// Add a session, or replace its entry.
    Upsert {
        /// The session URI.
        uri: String,
        /// Its place in the newest-first order; also raises the host's `next_catalog_no` past it.
        catalog_no: u64,
        /// When it was created, as the shard formats it.
        created_at: String,
        /// When it was last modified, formatted like `created_at` (text order is time order): `listSessions`
        /// lists the most recently modified first.
        modified_at: String,
        /// The session summary, raw JSON text.
        summary: String,
    },
    /// Drop a session from the catalogue (its number is not given out again).
    Remove {
        /// The session URI.
        uri: String,
    },
}

/// What restoring a channel needs: its latest snapshot and every logged envelope after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelRecord {
    /// The serverSeq of the snapshot.
    pub snapshot_seq: u64,
    /// The snapshot, raw JSON text.
    pub state: String,
    /// The channel's log rows with seq > `snapshot_seq`, in seq order.
    pub tail: Vec<LogEntry>,
}

/// One session in the catalogue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// The session URI.
    pub uri: String,
    /// Its catalogue number (breaks ties between equal `modified_at`).
    pub catalog_no: u64,
    /// When it was created.
    pub created_at: String,
    /// When it was last modified (the list's order).
    pub modified_at: String,
    /// The session summary, raw JSON text.
    pub summary: String,
}

impl CatalogEntry {
    /// The cursor of the page after this entry.
    pub fn cursor(&self) -> CatalogCursor {
        CatalogCursor {
            modified_at: self.modified_at.clone(),
            catalog_no: self.catalog_no,
        }
    }
}

/// A place in the catalogue's most-recently-modified-first order: a page lists the entries after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogCursor {
    pub modified_at: String,
    pub catalog_no: u64,
}

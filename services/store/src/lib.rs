//! `relay-store`: the relay's durable store — the action log of every host, the latest snapshot of each
//! channel, the sessions catalogue behind `listSessions`, each host's counters and its ownership lease —
//! with one API over two backends: Postgres for the distributed deployment, SQLite (a file in the data
//! directory) for the embedded one. Both run through sqlx's `Any` driver with runtime-built SQL, so there is
//! one code path and no database at build time.
//!
//! Every row is keyed by (tenant, host, …): tenants are isolated by construction (design invariant 7).
//! Counters are `u64` in the API and BIGINT in the database; values above `i64::MAX` are refused with
//! [`StoreError::OutOfRange`], never wrapped.
//!
//! Host ownership (design §3, invariant 6 "one writer per host") is a lease with a fencing epoch: a shard
//! takes a host with [`Store::acquire_lease`], keeps it with [`Store::renew_lease`], and writes it with
//! [`Store::commit_fenced`], which checks the epoch in the same transaction as the writes, so a deposed owner
//! cannot commit. The embedded single-process relay, the only writer of its store, uses [`Store::commit`].
//!
//! Modules, one concern each: `connect` (URL → pool and per-backend settings), `schema` (embedded
//! migrations), `commit` (the group-commit transaction, plain and fenced), `commits` (the connections commits
//! are written through, a commit thread's own on Postgres), `hosts`, `log`, `snapshots`, `catalog`, `leases`, `bindings` (one table each),
//! `retention` (compaction), `usage` (a tenant's stored bytes), `transaction` (a failed transaction's
//! connection is closed), `sql` (placeholder numbering and conversions), `records` (the values in and out),
//! `error`.

mod bindings;
mod catalog;
mod commit;
mod commits;
mod connect;
mod contents;
mod error;
mod hosts;
mod leases;
mod log;
mod records;
mod retention;
mod schema;
mod snapshots;
mod sql;
mod transaction;
mod turns;
mod usage;

use std::sync::Arc;

use sqlx::AnyPool;

pub use commits::mark_commit_thread;
pub use error::StoreError;
pub use records::{
    ArchivedTurn, CatalogChange, CatalogCursor, CatalogEntry, ChannelRecord, ClientBinding, CommitBatch,
    HostRecord, Lease, LogEntry, SnapshotEntry, StoredContent,
};

/// Which database a [`Store`] is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Postgres: the distributed deployment.
    Postgres,
    /// SQLite: the embedded default.
    Sqlite,
}

/// A handle on the durable store: a connection pool and the backend it speaks to. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    /// What commits are written through: for a SQLite file a connection of its own, otherwise `pool`
    /// ([`commits`]).
    commits: commits::Commits,
    backend: Backend,
    /// SQLite has one writer at a time: this process's writes (commits, compaction a host or a batch of
    /// bindings at a time, leases, a host's first load) take turns here, in arrival order, rather than
    /// meeting SQLite's lock, whose busy handler sleeps 1, 2, 5 … 100 ms between tries (a busy host's commits
    /// added 45 ms to a quiet host's p99, `scripts/bench hosts`). `None` on Postgres, which writes hosts in
    /// parallel.
    writer: Option<Arc<tokio::sync::Mutex<()>>>,
    /// Whether a connection whose write transaction failed is closed ([`transaction`]).
    failed: transaction::FailedConnections,
}

/// This process's writes to a SQLite file, held ([`Store::hold_writes`]) until this is dropped.
#[must_use = "writes are held only while this is kept"]
pub struct WritesHeld<'a> {
    _turn: Option<tokio::sync::MutexGuard<'a, ()>>,
}

impl Store {
    /// Connects to `postgres://…`, `sqlite://PATH` or `sqlite::memory:`. A SQLite file (and its directory)
    /// is created if missing, and is used in WAL mode with `synchronous = FULL`. Does not migrate.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        let backend = connect::backend_of(url)?;
        let pool = connect::open_pool(url, backend).await?;
        let writer = (backend == Backend::Sqlite).then(|| Arc::new(tokio::sync::Mutex::new(())));
        let failed = if connect::is_in_memory(url, backend) {
            transaction::FailedConnections::Keep
        } else {
            transaction::FailedConnections::Close
        };
        let commits = commits::Commits::open(url, backend, &pool, failed).await?;
        Ok(Store {
            pool,
            commits,
            backend,
            writer,
            failed,
        })
    }

    /// The backend this store is on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Runs the embedded migrations for the backend; running them again changes nothing.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        schema::migrate(&self.pool, self.backend).await
    }

    /// The host's durable counters, creating its row if missing.
    pub async fn load_host(&self, tenant: &str, host: &str) -> Result<HostRecord, StoreError> {
        if let Some(record) = hosts::read(&self.pool, tenant, host).await? {
            return Ok(record);
        }
        let _turn = self.writer_turn().await;
        hosts::create(&self.pool, tenant, host).await
    }

    /// Writes a batch in one transaction: appends its log rows, stores its snapshots (the latest per channel
    /// wins), applies its catalogue changes, deletes disposed channels' snapshots, and raises the host's
    /// `last_seq` to `batch.last_seq` (and to its highest logged seq) and `next_catalog_no` past every
    /// catalogue number it uses.
    pub async fn commit(&self, tenant: &str, host: &str, batch: &CommitBatch) -> Result<(), StoreError> {
        let _turn = self.writer_turn().await;
        commit::commit(&self.commits, self.backend, tenant, host, batch).await
    }

    /// Holds this process's writes to a SQLite file (commits, leases, compaction) until the guard is dropped,
    /// e.g. while the file is copied; writes that wait meanwhile then go in arrival order. Reads go on. On
    /// Postgres it holds nothing. A write awaited by the holder itself while it holds them never ends.
    pub async fn hold_writes(&self) -> WritesHeld<'_> {
        WritesHeld {
            _turn: self.writer_turn().await,
        }
    }

    /// [`Store::writer_turn`] for a write that reads the clock at `now_ms` (unix ms, passed in so tests control
    /// time): with the turn, `now_ms` moved on by how long the turn took to come, so a lease renewed after
    /// waiting behind commits lasts its full time from when it is written.
    async fn writer_turn_at(&self, now_ms: i64) -> (Option<tokio::sync::MutexGuard<'_, ()>>, i64) {
        let asked = std::time::Instant::now();
        let turn = self.writer_turn().await;
        let waited = i64::try_from(asked.elapsed().as_millis()).unwrap_or(i64::MAX);
        (turn, now_ms.saturating_add(waited))
    }

    /// This process's turn to write a SQLite file (nothing to wait for on Postgres). Every write after
    /// migration takes it: one that met another's transaction in SQLite instead would sleep in its busy
    /// handler.
    async fn writer_turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match &self.writer {
            Some(writer) => Some(writer.lock().await),
            None => None,
        }
    }

    /// [`Store::commit`], fenced: in the same transaction as the batch, first checks that the host's lease is
    /// at `epoch` and held by `owner`, and keeps the lease row locked until the batch is written, so no other
    /// owner can take the host in between. Expiry is not checked — only the epoch: a slow owner whose lease
    /// lapsed but was not taken yet may still commit; one whose epoch was superseded (or who released the
    /// lease) may not. On a mismatch nothing is written and it fails with [`StoreError::Fenced`].
    pub async fn commit_fenced(
        &self,
        tenant: &str,
        host: &str,
        owner: &str,
        epoch: u64,
        batch: &CommitBatch,
    ) -> Result<(), StoreError> {
        let _turn = self.writer_turn().await;
        commit::commit_fenced(
            &self.commits,
            self.backend,
            tenant,
            host,
            commit::Fence { owner, epoch },
            batch,
        )
        .await
    }

    /// Takes the host's lease for `owner` until `now_ms + ttl_ms` (unix ms; passed in so tests control time)
    /// if it is free, expired at `now_ms` (held while `now_ms < expires_at_ms`), or already held by `owner` —
    /// then it is renewed and keeps its epoch. Taking it from anyone else (released or expired) increments
    /// the epoch; a host's first lease has epoch 1. Returns `None` when another owner holds an unexpired
    /// lease. Concurrent acquirers of one host: exactly one wins.
    ///
    /// `owner` must be unique per process incarnation (e.g. shard name + a per-start UUID): an owner
    /// re-acquiring its own lease keeps the epoch, so two processes sharing a name would not fence each
    /// other.
    /// Load the host's counters ([`Store::load_host`]) only *after* acquiring: then they include every commit
    /// of the previous owner, which can commit no more.
    pub async fn acquire_lease(
        &self,
        tenant: &str,
        host: &str,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>, StoreError> {
        let (_turn, now_ms) = self.writer_turn_at(now_ms).await;
        leases::acquire(&self.pool, tenant, host, owner, ttl_ms, now_ms).await
    }

    /// Extends a lease still held by (`lease.owner`, `lease.epoch`) to `now_ms + ttl_ms` — also when it had
    /// expired, as long as nobody took it. `None` if it was lost (expired and taken, or released): the owner
    /// must stop serving the host.
    pub async fn renew_lease(
        &self,
        lease: &Lease,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Option<Lease>, StoreError> {
        let (_turn, now_ms) = self.writer_turn_at(now_ms).await;
        leases::renew(&self.pool, lease, ttl_ms, now_ms).await
    }

    /// Renews every lease `owner` holds, in one statement (a shard's lease keeper): each one's expiry moves
    /// to `now_ms + ttl_ms`, also when it had expired and nobody took it. Returns the leases renewed; one the
    /// owner held and that is missing was lost, and its host must no longer be served.
    pub async fn renew_leases_of(
        &self,
        owner: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<Vec<Lease>, StoreError> {
        let (_turn, now_ms) = self.writer_turn_at(now_ms).await;
        leases::renew_all(&self.pool, owner, ttl_ms, now_ms).await
    }

    /// How many of `tenant`'s hosts other than `except` some owner holds a lease on at `now_ms`: what a
    /// per-tenant host cap counts across every shard.
    pub async fn leased_hosts_of_tenant(
        &self,
        tenant: &str,
        except: &str,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        leases::held_of_tenant(&self.pool, tenant, except, now_ms).await
    }

    /// Gives the lease up at once (graceful shutdown), so another owner can take it without waiting for
    /// expiry; it keeps its epoch, and the next acquire increments it. Does nothing if the lease was already
    /// lost.
    pub async fn release_lease(&self, lease: &Lease) -> Result<(), StoreError> {
        let _turn = self.writer_turn().await;
        leases::release(&self.pool, lease).await
    }

    /// The host's current lease, for routing (who owns it, until when): `None` if the host was never leased
    /// or its lease was released. An expired lease nobody took yet is returned as it is — compare
    /// `expires_at_ms` with the clock.
    pub async fn lease_of(&self, tenant: &str, host: &str) -> Result<Option<Lease>, StoreError> {
        leases::current(&self.pool, tenant, host).await
    }

    /// Up to `limit` (tenant, host) pairs whose lease is released, or expired at `now_ms`, most overdue
    /// first: work for a shard doing placement (then [`Store::acquire_lease`]; losing that race is normal).
    /// Hosts that were never leased are not listed — they have no owner to lose and get one when a client
    /// asks.
    pub async fn orphaned_hosts(
        &self,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        leases::orphaned(&self.pool, now_ms, limit).await
    }

    /// The channel's latest snapshot and every log row of the channel after it, in seq order; `None` if it
    /// has no snapshot (unknown or disposed).
    pub async fn load_channel(
        &self,
        tenant: &str,
        host: &str,
        channel: &str,
    ) -> Result<Option<ChannelRecord>, StoreError> {
        snapshots::restore(&self.pool, tenant, host, channel).await
    }

    /// A content an action named by reference (`ahp-content:/<id>`): its type and data (base64).
    pub async fn load_content(
        &self,
        tenant: &str,
        host: &str,
        id: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        contents::load(&self.pool, tenant, host, id).await
    }

    /// The bytes `tenant` keeps in the store (its log rows and snapshots, every host).
    pub async fn stored_bytes(&self, tenant: &str) -> Result<u64, StoreError> {
        usage::stored_bytes(&self.pool, self.backend, tenant).await
    }

    /// The subject (user) `client_id` is bound to on the host, if it was ever used there.
    pub async fn client_binding(
        &self,
        tenant: &str,
        host: &str,
        client_id: &str,
    ) -> Result<Option<String>, StoreError> {
        bindings::subject_of(&self.pool, tenant, host, client_id).await
    }

    /// The turns of the archive `archive` with indexes in `[start, end)`, ascending, as (index, turn JSON).
    pub async fn archived_turns(
        &self,
        tenant: &str,
        host: &str,
        archive: &str,
        start: u64,
        end: u64,
    ) -> Result<Vec<(u64, String)>, StoreError> {
        turns::range(&self.pool, tenant, host, archive, start, end).await
    }

    /// Whether an archived turn of one of the `archives` holds `needle` (lowercase; ASCII case ignored).
    pub async fn archived_turns_contain(
        &self,
        tenant: &str,
        host: &str,
        archives: &[String],
        needle: &str,
    ) -> Result<bool, StoreError> {
        turns::any_contains(&self.pool, tenant, host, archives, needle).await
    }

    /// The newest archived turns of `[start, end)` within `max_bytes` (always the newest), ascending.
    pub async fn archived_turns_within(
        &self,
        tenant: &str,
        host: &str,
        archive: &str,
        start: u64,
        end: u64,
        max_bytes: u64,
    ) -> Result<Vec<(u64, String)>, StoreError> {
        turns::newest_within(&self.pool, tenant, host, archive, start, end, max_bytes).await
    }

    /// How long the archived turns of `[start, end)` are together, without reading them.
    pub async fn archived_turns_length(
        &self,
        tenant: &str,
        host: &str,
        archive: &str,
        start: u64,
        end: u64,
    ) -> Result<u64, StoreError> {
        turns::length(&self.pool, tenant, host, archive, start, end).await
    }

    /// The index of the archived turn `turn_id` below `before` in the archive `archive`, if it has one.
    pub async fn archived_turn_position(
        &self,
        tenant: &str,
        host: &str,
        archive: &str,
        turn_id: &str,
        before: u64,
    ) -> Result<Option<u64>, StoreError> {
        turns::position(&self.pool, tenant, host, archive, turn_id, before).await
    }

    /// The chat channels whose snapshots name `session` as their parent, in URI order.
    pub async fn chats_of(&self, tenant: &str, host: &str, session: &str) -> Result<Vec<String>, StoreError> {
        snapshots::chats_of(&self.pool, tenant, host, session).await
    }

    /// Up to `limit` log rows with seq > `after_seq` on any of `channels`, ascending seq.
    pub async fn log_after(
        &self,
        tenant: &str,
        host: &str,
        after_seq: u64,
        channels: &[String],
        limit: usize,
    ) -> Result<Vec<LogEntry>, StoreError> {
        log::after(&self.pool, tenant, host, after_seq, channels, limit).await
    }

    /// Up to `limit` log rows of the host with `after_seq < seq <= through_seq` on any channel, ascending seq
    /// (the gateways' bus gap repair).
    pub async fn log_range(
        &self,
        tenant: &str,
        host: &str,
        after_seq: u64,
        through_seq: u64,
        limit: usize,
    ) -> Result<Vec<LogEntry>, StoreError> {
        log::range(&self.pool, tenant, host, after_seq, through_seq, limit).await
    }

    /// A page of the catalogue, most recently modified first: at most `limit` sessions after `after` (`None`:
    /// from the first). The next page's cursor is the last entry's [`CatalogEntry::cursor`].
    pub async fn list_sessions(
        &self,
        tenant: &str,
        host: &str,
        after: Option<&CatalogCursor>,
        limit: usize,
    ) -> Result<Vec<CatalogEntry>, StoreError> {
        catalog::page(&self.pool, tenant, host, after, limit).await
    }

    /// How many sessions the host has (loaded or not): its catalogue's size.
    pub async fn session_count(&self, tenant: &str, host: &str) -> Result<u64, StoreError> {
        catalog::count(&self.pool, tenant, host).await
    }

    /// Retention, over every host: deletes log rows older than `older_than_ms` (unix ms) whose seq is at most
    /// their channel's snapshot seq — every channel stays restorable — or whose channel has no snapshot any
    /// more (disposed), raises each affected host's `log_floor` to the highest seq deleted, and deletes the
    /// clientId bindings not used since. Returns the number of rows deleted.
    pub async fn compact(&self, older_than_ms: i64) -> Result<u64, StoreError> {
        let mut removed = 0;
        for (tenant, host) in retention::hosts_to_compact(&self.pool, older_than_ms).await? {
            // One host's transaction per turn: commits waiting meanwhile go next, in arrival order, rather
            // than into SQLite's busy handler, and a long compaction lets them in between hosts.
            let _turn = self.writer_turn().await;
            removed += retention::compact_host(
                &self.pool,
                self.backend,
                self.failed,
                &tenant,
                &host,
                older_than_ms,
            )
            .await?;
        }
        Ok(removed + self.prune_bindings(older_than_ms).await?)
    }

    /// Removes every clientId binding not used since `older_than_ms`, after stamping never-used ones as used
    /// now ([`bindings::stamp_unused`]), a batch per writer's turn, so commits and leases go in between.
    async fn prune_bindings(&self, older_than_ms: i64) -> Result<u64, StoreError> {
        let now_ms = bindings::now_ms();
        loop {
            let _turn = self.writer_turn().await;
            if bindings::stamp_unused(&self.pool, now_ms).await? < bindings::PRUNE_BATCH {
                break;
            }
        }
        let mut removed = 0;
        loop {
            let _turn = self.writer_turn().await;
            let batch = bindings::remove_stale(&self.pool, older_than_ms).await?;
            removed += batch;
            if batch < bindings::PRUNE_BATCH {
                return Ok(removed);
            }
        }
    }

    /// Benchmark baseline only: appends `log` to the host's log exactly as [`Store::commit`] does (same
    /// multi-row INSERTs, one transaction) and writes nothing else — no counters, snapshots or catalogue. The
    /// relay's durable throughput is measured against it (design §8).
    pub async fn insert_log_raw(
        &self,
        tenant: &str,
        host: &str,
        log: Vec<LogEntry>,
    ) -> Result<(), StoreError> {
        let _turn = self.writer_turn().await;
        self.commits
            .in_transaction(async |tx| log::append(tx, tenant, host, &log).await)
            .await
    }

    /// A trivial round trip to the database (`SELECT 1`): whether the store is reachable right now.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Closes the pools, waiting for connections in use to be returned.
    pub async fn close(&self) {
        self.commits.close().await;
        self.pool.close().await;
    }
}

//! `relay-store`: the relay's durable store — the action log of every host, the latest snapshot of each
//! channel, the sessions catalogue behind `listSessions`, and each host's counters — with one API over two
//! backends: Postgres for the distributed deployment, SQLite (a file in the data directory) for the embedded
//! one. Both run through sqlx's `Any` driver with runtime-built SQL, so there is one code path and no
//! database at build time.
//!
//! Every row is keyed by (tenant, host, …): tenants are isolated by construction (design invariant 7).
//! Counters are `u64` in the API and BIGINT in the database; values above `i64::MAX` are refused with
//! [`StoreError::OutOfRange`], never wrapped.
//!
//! Modules, one concern each: `connect` (URL → pool and per-backend settings), `schema` (embedded
//! migrations), `commit` (the group-commit transaction), `hosts`, `log`, `snapshots`, `catalog` (one table
//! each), `retention` (compaction), `sql` (placeholder numbering and conversions), `records` (the values in
//! and out), `error`.

mod catalog;
mod commit;
mod connect;
mod error;
mod hosts;
mod log;
mod records;
mod retention;
mod schema;
mod snapshots;
mod sql;

use sqlx::AnyPool;

pub use error::StoreError;
pub use records::{
    CatalogChange, CatalogEntry, ChannelRecord, CommitBatch, HostRecord, LogEntry, SnapshotEntry,
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
    backend: Backend,
}

impl Store {
    /// Connects to `postgres://…`, `sqlite://PATH` or `sqlite::memory:`. A SQLite file (and its directory)
    /// is created if missing, and is used in WAL mode with `synchronous = FULL`. Does not migrate.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        let backend = connect::backend_of(url)?;
        let pool = connect::open_pool(url, backend).await?;
        Ok(Store { pool, backend })
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
        hosts::load(&self.pool, tenant, host).await
    }

    /// Writes a batch in one transaction: appends its log rows, stores its snapshots (the latest per channel
    /// wins), applies its catalogue changes, deletes disposed channels' snapshots, and raises the host's
    /// `last_seq` to `batch.last_seq` (and to its highest logged seq) and `next_catalog_no` past every
    /// catalogue number it uses.
    pub async fn commit(&self, tenant: &str, host: &str, batch: &CommitBatch) -> Result<(), StoreError> {
        commit::commit(&self.pool, self.backend, tenant, host, batch).await
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

    /// A newest-first page of the catalogue: at most `limit` sessions with catalog_no < `before` (`None`:
    /// from the newest). The next page's cursor is the last entry's `catalog_no`.
    pub async fn list_sessions(
        &self,
        tenant: &str,
        host: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<CatalogEntry>, StoreError> {
        catalog::page(&self.pool, tenant, host, before, limit).await
    }

    /// Retention, over every host: deletes log rows older than `older_than_ms` (unix ms) whose seq is at most
    /// their channel's snapshot seq — every channel stays restorable — or whose channel has no snapshot any
    /// more (disposed), and raises each affected host's `log_floor` to the highest seq deleted. Returns the
    /// number of rows deleted.
    pub async fn compact(&self, older_than_ms: i64) -> Result<u64, StoreError> {
        retention::compact(&self.pool, self.backend, older_than_ms).await
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
        let mut tx = self.pool.begin().await?;
        log::append(&mut tx, tenant, host, &log).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Closes the pool, waiting for connections in use to be returned.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

//! One group commit: everything a shard's batch writes, in one transaction, so a batch is either wholly
//! durable or not at all (the shard publishes envelopes only after this returns). Two entry points share the
//! writing: [`commit`] for the embedded single-process relay, where nothing else can write the host, and
//! [`commit_fenced`], which first checks (and locks) the writer's lease in the same transaction.

use sqlx::AnyConnection;

use crate::commits::Commits;
use crate::{
    bindings, catalog, contents, hosts, leases, log, snapshots, turns, Backend, CommitBatch, StoreError,
};

/// Writes `batch` for the host atomically.
pub(crate) async fn commit(
    commits: &Commits,
    backend: Backend,
    tenant: &str,
    host: &str,
    batch: &CommitBatch,
) -> Result<(), StoreError> {
    commits
        .in_transaction(async |tx| write(tx, backend, tenant, host, batch).await)
        .await
}

/// Who may write the host: the lease's owner at its epoch.
pub(crate) struct Fence<'a> {
    pub(crate) owner: &'a str,
    pub(crate) epoch: u64,
}

/// Writes `batch` for the host atomically if, in the same transaction, the host's lease is at `epoch` and
/// held by `owner`; otherwise writes nothing and fails with [`StoreError::Fenced`].
pub(crate) async fn commit_fenced(
    commits: &Commits,
    backend: Backend,
    tenant: &str,
    host: &str,
    fence: Fence<'_>,
    batch: &CommitBatch,
) -> Result<(), StoreError> {
    commits
        .in_transaction(async |tx| {
            // First, and it keeps the lease row locked to the end: no new owner can take the host between this
            // check and the writes below. On failure the transaction is rolled back.
            leases::fence(tx, tenant, host, fence.owner, fence.epoch).await?;
            write(tx, backend, tenant, host, batch).await
        })
        .await
}

/// The writes of one batch, inside the caller's transaction.
async fn write(
    conn: &mut AnyConnection,
    backend: Backend,
    tenant: &str,
    host: &str,
    batch: &CommitBatch,
) -> Result<(), StoreError> {
    let logged_max = batch.log.iter().map(|entry| entry.seq).max().unwrap_or(0);
    // First of the writes, so the host's lock is held for all of them: a compaction of this host waits for
    // the whole batch.
    hosts::raise_counters(
        &mut *conn,
        backend,
        tenant,
        host,
        batch.last_seq.max(logged_max),
        catalog::next_number_after(&batch.catalog),
    )
    .await?;
    log::append(&mut *conn, tenant, host, &batch.log).await?;
    // Disposals before snapshots: a channel disposed and then created again under the same URI within one
    // batch must end up with the new channel's snapshot. (The shard never leaves a snapshot of a channel in a
    // batch that disposes it afterwards: its sequencer drops that snapshot when the disposal is queued.)
    snapshots::remove(&mut *conn, tenant, host, &batch.disposed).await?;
    turns::remove(&mut *conn, tenant, host, &batch.disposed).await?;
    contents::remove(&mut *conn, tenant, host, &batch.disposed).await?;
    snapshots::store(&mut *conn, tenant, host, &batch.snapshots).await?;
    turns::store(&mut *conn, tenant, host, &batch.turns).await?;
    contents::store(&mut *conn, tenant, host, &batch.contents).await?;
    catalog::apply(&mut *conn, tenant, host, &batch.catalog).await?;
    bindings::store(&mut *conn, tenant, host, &batch.bindings).await?;
    Ok(())
}

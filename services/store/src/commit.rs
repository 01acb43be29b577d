//! One group commit: everything a shard's batch writes, in one transaction, so a batch is either wholly
//! durable or not at all (the shard publishes envelopes only after this returns).

use sqlx::AnyPool;

use crate::{catalog, hosts, log, snapshots, Backend, CommitBatch, StoreError};

/// Writes `batch` for the host atomically.
pub(crate) async fn commit(
    pool: &AnyPool,
    backend: Backend,
    tenant: &str,
    host: &str,
    batch: &CommitBatch,
) -> Result<(), StoreError> {
    let logged_max = batch.log.iter().map(|entry| entry.seq).max().unwrap_or(0);
    let mut tx = pool.begin().await?;
    // First, so the host's lock is held from the start: a compaction of this host waits for the whole batch.
    hosts::raise_counters(
        &mut tx,
        backend,
        tenant,
        host,
        batch.last_seq.max(logged_max),
        catalog::next_number_after(&batch.catalog),
    )
    .await?;
    log::append(&mut tx, tenant, host, &batch.log).await?;
    snapshots::store(&mut tx, tenant, host, &batch.snapshots).await?;
    catalog::apply(&mut tx, tenant, host, &batch.catalog).await?;
    snapshots::remove(&mut tx, tenant, host, &batch.disposed).await?;
    tx.commit().await?;
    Ok(())
}

//! Writing a host's batches to the store (fenced by its lease, retried with backoff, never twice) and
//! publishing them to its bus once committed.

use std::time::Duration;

use relay_bus::RedisPublisher;
use relay_core::bus::SharedBusEvent;
use relay_core::HostKey;
use relay_store::{CommitBatch, Store, StoreError};
use tracing::Instrument;

use crate::host::{Host, REDIS_PUBLISH_TIMEOUT};

/// How writing a batch ended.
pub(crate) enum Written {
    Committed,
    /// The store refuses it for good (and it had not gone through).
    Refused(StoreError),
    /// The host is no longer this process's to write.
    Deposed,
}

impl Host {
    /// Write `commit` in one transaction (fenced by the host's lease, when it has one), retrying with backoff
    /// what may succeed later. A failed attempt that went through all the same (its answer was lost) is not
    /// written again.
    pub(crate) async fn write(&self, commit: &CommitBatch, span: &tracing::Span) -> Written {
        let mut backoff = Duration::from_millis(10);
        // After a full store: a pause first, growing while it stays full (up to 10 s).
        let full = *self.full_backoff.lock();
        if !full.is_zero() {
            tokio::time::sleep(full).await;
        }
        loop {
            let committed = match &self.lease {
                Some(lease) => {
                    self.store
                        .commit_fenced(&lease.tenant, &lease.host, &lease.owner, lease.epoch, commit)
                        .instrument(span.clone())
                        .await
                }
                None => {
                    self.store
                        .commit(&self.key.tenant, &self.key.host, commit)
                        .instrument(span.clone())
                        .await
                }
            };
            match committed {
                Ok(()) => {
                    *self.full_backoff.lock() = Duration::ZERO;
                    return Written::Committed;
                }
                Err(error @ StoreError::Fenced { .. }) => {
                    self.depose(&error.to_string());
                    return Written::Deposed;
                }
                // A full store and a batch that only records the numbers it used: refusing it would lose the
                // envelopes it carries — the rejections that tell senders their change was refused — and nobody
                // would learn of them. It changes no state, so it waits for space (at the full store's pace)
                // and is then published.
                Err(error) if error.is_storage_full() && commit.records_only_last_seq() => {
                    tracing::error!(host = %self.key, %error, "the store is full: waiting for space to record rejections");
                    relay_core::telemetry::store_full();
                    if self.is_deposed() {
                        return Written::Deposed;
                    }
                    let pause = {
                        let mut full = self.full_backoff.lock();
                        *full = (*full * 2).clamp(Duration::from_millis(100), Duration::from_secs(10));
                        *full
                    };
                    let mut deposed = self.deposed.subscribe();
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = deposed.wait_for(|deposed| *deposed) => return Written::Deposed,
                    }
                }
                // Not a retry of an attempt that went through after all (its log rows would break the
                // primary key).
                Err(error)
                    if error.is_permanent() && !committed_anyway(&self.store, &self.key, commit).await =>
                {
                    if error.is_storage_full() {
                        tracing::error!(host = %self.key, %error, "the store is full: this batch is refused");
                        relay_core::telemetry::store_full();
                        let mut full = self.full_backoff.lock();
                        *full = (*full * 2).clamp(Duration::from_millis(100), Duration::from_secs(10));
                    }
                    return Written::Refused(error);
                }
                Err(error) => {
                    tracing::warn!(host = %self.key, %error, "commit failed; retrying");
                    if self.is_deposed() {
                        return Written::Deposed;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    if committed_anyway(&self.store, &self.key, commit).await {
                        tracing::warn!(host = %self.key, "the failed commit had gone through; not writing it again");
                        return Written::Committed;
                    }
                }
            }
        }
    }

    /// Publish committed publications on the local bus, then Redis.
    pub(crate) async fn publish(&self, publications: Vec<crate::host::sequencer::Publication>) {
        let batch = self.publisher.lock().publish(publications);
        if let (Some(redis), Some(batch)) = (&self.redis, batch) {
            publish_to_redis(redis, &self.key, &batch).await;
        }
    }
}

/// Whether a batch whose commit reported an error was committed all the same: the connection can break after
/// the database committed but before it said so. Writing it again would fail on the log's primary key forever.
/// The transaction is atomic, so the batch is in if its first log row is, as this batch wrote it; a batch that
/// logs nothing only upserts and deletes, and is safe to write again.
async fn committed_anyway(store: &Store, key: &HostKey, commit: &CommitBatch) -> bool {
    let Some(first) = commit.log.first() else {
        return false;
    };
    let after = first.seq.saturating_sub(1);
    match store.log_range(&key.tenant, &key.host, after, first.seq, 1).await {
        Ok(rows) => rows
            .first()
            .is_some_and(|row| row.seq == first.seq && row.envelope == first.envelope),
        Err(_) => false,
    }
}

/// Publish one commit's batch to Redis as one message. Failures are logged and skipped: gateways repair the
/// gap.
async fn publish_to_redis(redis: &RedisPublisher, key: &HostKey, events: &[SharedBusEvent]) {
    match tokio::time::timeout(REDIS_PUBLISH_TIMEOUT, redis.publish_batch(key, events)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(host = %key, events = events.len(), %error, "redis publish failed; gateways will repair the gap");
        }
        Err(_) => tracing::warn!(host = %key, "redis publish timed out; gateways will repair the gap"),
    }
}

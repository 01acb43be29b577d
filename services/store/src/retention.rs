//! Retention: removing old log rows that no reader needs any more, one host per transaction, and recording
//! in the host's `log_floor` how far the log is no longer complete. Each host's is a write:
//! [`crate::Store::compact`] runs each in this process's turn to write a SQLite file (as it does each batch of
//! the clientId bindings' pruning, `bindings`).

use sqlx::AnyPool;

use crate::transaction::FailedConnections;
use crate::{hosts, log, Backend, StoreError};

/// The hosts with log rows older than `older_than_ms`: what [`compact_host`] is to be run for.
pub(crate) async fn hosts_to_compact(
    pool: &AnyPool,
    older_than_ms: i64,
) -> Result<Vec<(String, String)>, StoreError> {
    log::hosts_with_rows_older_than(pool, older_than_ms).await
}

/// Removes the host's log rows older than `older_than_ms` that a snapshot covers (or whose channel has no
/// snapshot any more), and raises its `log_floor` to the highest seq removed, in one transaction. Returns the
/// rows removed.
pub(crate) async fn compact_host(
    pool: &AnyPool,
    backend: Backend,
    failed: FailedConnections,
    tenant: &str,
    host: &str,
    older_than_ms: i64,
) -> Result<u64, StoreError> {
    failed
        .in_transaction(pool, async |tx| {
            // Under the host's lock no commit can move a snapshot between the two statements below, so the
            // floor recorded is exactly the highest seq deleted.
            hosts::lock(tx, tenant, host).await?;
            let highest = log::highest_compactable(tx, tenant, host, older_than_ms).await?;
            let mut rows = 0;
            if highest > 0 {
                rows = log::remove_compactable(tx, tenant, host, older_than_ms).await?;
                hosts::raise_log_floor(tx, backend, tenant, host, highest).await?;
            }
            Ok(rows)
        })
        .await
}
